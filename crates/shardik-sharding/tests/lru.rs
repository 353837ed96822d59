//! The live-entity cap: with `max_live_entities(k)`, starting entity `k + 1` passivates
//! exactly the least recently used live entity (by message arrival), and every message
//! refreshes its entity.

mod common;

use std::sync::Arc;

use common::{item, snapshot, Event, Msg, Probe};
use shardik_actor::ActorSystem;
use shardik_sharding::{Region, ShardingExt};

fn start(system: &ActorSystem, probe: &Arc<Probe>, cap: usize) -> Region<Msg> {
    system
        .sharding()
        .start(probe.entity_type("recorder").max_live_entities(cap))
        .unwrap()
}

/// Waits for the `stopped` hook of the next passivated entity and returns its id and
/// incarnation.
async fn next_stop(probe: &Probe) -> (String, u32) {
    match probe.next_event().await {
        Event::Stopped {
            id, incarnation, ..
        } => (id, incarnation),
        other => panic!("expected a stop, got {other:?}"),
    }
}

#[tokio::test]
async fn the_least_recently_used_entity_is_passivated_and_touching_refreshes() {
    let system = ActorSystem::new("lru");
    let probe = Probe::new();
    let region = start(&system, &probe, 3);

    for id in ["a", "b", "c"] {
        assert_eq!(snapshot(&region, id).await.incarnation, 1);
    }
    assert_eq!(region.stats().active_entities, 3);
    // A tell refreshes "a": the order from least to most recent is now b, c, a.
    region.tell("a", item(0, 1));

    // The fourth entity pushes out "b", not "a" (the oldest start) nor anyone else.
    assert_eq!(snapshot(&region, "d").await.incarnation, 1);
    assert_eq!(next_stop(&probe).await, ("b".to_string(), 1));
    let stats = region.stats();
    assert_eq!(stats.passivated_lru_total, 1);
    assert_eq!(stats.active_entities, 3);
    assert_eq!(stats.spawned_total, 4);
    // Order now c, a, d; these asks refresh in that order, so it stays c, a, d.
    for id in ["c", "a", "d"] {
        assert_eq!(snapshot(&region, id).await.incarnation, 1, "{id} survived");
    }
    assert_eq!(probe.stopped("b"), 1);

    // "b" comes back as a new incarnation and pushes out "c".
    let b = snapshot(&region, "b").await;
    assert_eq!((b.incarnation, b.handled), (2, vec![]));
    assert_eq!(next_stop(&probe).await, ("c".to_string(), 1));
    assert_eq!(region.stats().passivated_lru_total, 2);
    assert_eq!(probe.try_event(), None);
    assert_eq!(probe.journal_of("a", 0), vec![1], "a kept its incarnation");
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// A tiny deterministic generator, so the touch sequence is fixed and replayable.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// A long, irregular touch sequence checked against a model LRU list: after every touch the
/// touched entity has the modelled incarnation, and each eviction stops exactly the modelled
/// victim.
#[tokio::test]
async fn evictions_follow_a_model_lru_over_a_long_sequence() {
    const CAP: usize = 4;
    let system = ActorSystem::new("lru-model");
    let probe = Probe::new();
    let region = start(&system, &probe, CAP);
    let ids: Vec<String> = (0..9).map(|i| format!("e{i}")).collect();

    let mut lru: Vec<&str> = Vec::new(); // least recent first
    let mut incarnations = std::collections::HashMap::<&str, u32>::new();
    let mut evictions = 0u64;
    let mut rng = Lcg(42);
    for step in 0..400 {
        // The first three entities are picked twice as often: hits and evictions both happen.
        let pick = rng.below(ids.len() as u64 + 3) as usize;
        let id = ids[pick % ids.len()].as_str();
        let mut victim = None;
        if let Some(pos) = lru.iter().position(|x| *x == id) {
            lru.remove(pos);
        } else {
            *incarnations.entry(id).or_default() += 1;
            if lru.len() == CAP {
                victim = Some(lru.remove(0));
            }
        }
        lru.push(id);

        if step % 3 == 0 {
            region.tell(id, item(0, step));
        }
        let snap = snapshot(&region, id).await;
        assert_eq!(snap.incarnation, incarnations[id], "step {step}: {id}");
        if let Some(victim) = victim {
            evictions += 1;
            let stopped = next_stop(&probe).await;
            assert_eq!(
                stopped,
                (victim.to_string(), incarnations[victim]),
                "step {step}"
            );
        }
        assert_eq!(region.stats().active_entities, lru.len(), "step {step}");
    }
    assert!(evictions > 50, "the sequence evicts often ({evictions})");
    assert_eq!(probe.try_event(), None);
    let stats = region.stats();
    assert_eq!(stats.passivated_lru_total, evictions);
    assert_eq!(stats.spawned_total, u64::from(probe.created_total()));
    assert_eq!(probe.violations(), Vec::<String>::new());
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// An entity that is stopping does not count against the cap, and the messages it buffers
/// bring it back as the most recently used entity.
#[tokio::test]
async fn a_stopping_entity_does_not_count_and_returns_most_recent() {
    let system = ActorSystem::new("lru-stopping");
    let probe = Probe::new();
    probe.hold_stops(1);
    let region = start(&system, &probe, 2);

    snapshot(&region, "a").await;
    snapshot(&region, "b").await;
    region.tell("a", Msg::StopSelf);
    assert_eq!(
        probe.next_event().await,
        Event::Stopping {
            id: "a".into(),
            incarnation: 1
        }
    );
    region.tell("a", item(0, 1)); // buffered: "a" is stopping and leaves the LRU
                                  // Room for "c" without evicting anyone.
    snapshot(&region, "c").await;
    assert_eq!(region.stats().passivated_lru_total, 0);
    assert_eq!(region.stats().stopping_entities, 1);

    // Once "a" has stopped its buffer starts incarnation 2, the most recent entity; the cap
    // then pushes out "b", the least recent.
    probe.gate(1).open();
    let a = snapshot(&region, "a").await;
    assert_eq!((a.incarnation, a.handled), (2, vec![(0, 1)]));
    assert_eq!(
        next_stop(&probe).await,
        ("a".to_string(), 1),
        "the self-stop completes first"
    );
    assert!(matches!(probe.next_event().await, Event::Stopping { ref id, .. } if id == "b"));
    assert_eq!(next_stop(&probe).await, ("b".to_string(), 1));
    assert_eq!(region.stats().passivated_lru_total, 1);
    assert_eq!(snapshot(&region, "c").await.incarnation, 1);
    system.shutdown().await;
}
