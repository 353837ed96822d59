//! Crashes: a node that hosts shards crashes (its entities die with it) — asks in flight fail
//! within their timeout, and once the node is `Down` its shards are reallocated and its
//! entities start on survivors on their next message. The coordinator's node crashes — the
//! next oldest node recovers the replicated state with a new epoch, and no allocation is lost.

mod cluster_util;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_util::*;
use shardik_cluster::member::MemberStatus;

const ENTITIES: usize = 30;

fn ids() -> Vec<String> {
    (0..ENTITIES).map(|i| format!("e{i}")).collect()
}

async fn placement(node: &Node, ids: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(id.clone(), where_is(node, id).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_node_shards_move_to_survivors() {
    let reg = Arc::new(Registry::default());
    let nodes = cluster_of(3, 12, &reg).await;
    let ids = ids();
    let before = placement(&nodes[0], &ids).await;
    let victim = before
        .iter()
        .find(|(_, n)| *n == "n2")
        .map(|(id, _)| id.clone())
        .expect("n2 hosts some entity");
    nodes[2].crash().await;
    // An ask to an entity of the crashed node fails (typed) within its timeout.
    let t = Instant::now();
    let res = nodes[0]
        .region
        .entity_ref(victim.as_str())
        .ask(Msg::Where, Duration::from_secs(1))
        .await;
    assert!(res.is_err(), "no answer from a crashed node: {res:?}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "ask ended late: {:?}",
        t.elapsed()
    );
    // Once n2 is Down (or removed) everywhere, its entities answer from survivors.
    let n2 = nodes[2].id().clone();
    for n in &nodes[..2] {
        wait_state(&n.cluster, "n2 down", |s| {
            s.member(&n2).is_none_or(|m| m.status == MemberStatus::Down)
        })
        .await;
    }
    region_dropped(&nodes[0], "n2").await;
    for n in &nodes[..2] {
        let after = placement(n, &ids).await;
        for (id, home) in &after {
            assert_ne!(home, "n2");
            if before[id] != "n2" {
                assert_eq!(home, &before[id], "{id} on a survivor stayed where it was");
            }
        }
    }
    reg.assert_single_writer();
    stop_all(&nodes[..2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_crash_recovers_replicated_state() {
    let reg = Arc::new(Registry::default());
    let nodes = cluster_of(3, 12, &reg).await;
    let ids = ids();
    let before = placement(&nodes[1], &ids).await;
    let old = nodes[0].sharding.coordinator(TYPE).expect("n0 coordinates");
    assert_eq!(shardik_sharding::coordination::epoch_round(old.epoch), 1);
    nodes[0].crash().await;
    let n0 = nodes[0].id().clone();
    wait_state(&nodes[1].cluster, "n0 down", |s| {
        s.member(&n0).is_none_or(|m| m.status == MemberStatus::Down)
    })
    .await;
    // n1 is now the oldest: it recovers from the majority's copy with a higher epoch.
    poll("n1 coordinates", Duration::from_secs(20), || {
        nodes[1]
            .sharding
            .coordinator(TYPE)
            .is_some_and(|c| c.epoch > old.epoch)
    })
    .await;
    region_dropped(&nodes[1], "n0").await;
    let after = placement(&nodes[2], &ids).await;
    for (id, home) in &after {
        assert_ne!(home, "n0");
        if before[id] != "n0" {
            assert_eq!(
                home, &before[id],
                "{id} kept its home across the coordinator crash"
            );
        }
    }
    let snap = nodes[1].sharding.coordinator(TYPE).unwrap();
    for (shard, region) in &old.state.shards {
        if !region.0.contains("#n0#") {
            assert_eq!(
                snap.state.shards.get(shard),
                Some(region),
                "shard {shard} kept its home"
            );
        }
    }
    reg.assert_single_writer();
    stop_all(&nodes[1..]).await;
}

/// Two senders stream to 20 entities while a node crashes. Entities on survivors lose
/// nothing; entities of the crashed node lose what was sent to it (at most once across a
/// crash) but never see a number twice or out of order, and run again on survivors; never two
/// live incarnations of one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_under_load_keeps_order_and_single_writer() {
    let reg = Arc::new(Registry::default());
    let nodes = cluster_of(3, 12, &reg).await;
    let ids: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
    let before = placement(&nodes[0], &ids).await;
    let streams = Streams::start(&nodes, &[(0, 0), (1, 1)], &ids);
    nodes[2].crash().await;
    let n2 = nodes[2].id().clone();
    for n in &nodes[..2] {
        wait_state(&n.cluster, "n2 down", |s| {
            s.member(&n2).is_none_or(|m| m.status == MemberStatus::Down)
        })
        .await;
    }
    // The crashed node's entities run again on survivors, while the stream goes on.
    let moved: Vec<&String> = before
        .iter()
        .filter(|(_, n)| *n == "n2")
        .map(|(id, _)| id)
        .collect();
    assert!(!moved.is_empty());
    poll("moved entities run again", Duration::from_secs(20), || {
        let homes = reg.homes.lock();
        moved.iter().all(|id| homes[id.as_str()].len() == 2)
    })
    .await;
    let counts = streams.stop().await;
    // Survivors' entities: everything, in order (a final ask per sender flushes the stream).
    for (i, n) in nodes[..2].iter().enumerate() {
        for id in &ids {
            let got = n.region.entity_ref(id.as_str()).ask(Msg::Where, ASK).await;
            assert!(got.is_ok(), "{id} answers through n{i}");
        }
    }
    {
        let journal = reg.journal.lock();
        for id in &ids {
            for (s, n) in counts.iter().enumerate() {
                let seqs: Vec<u64> = journal[id]
                    .iter()
                    .filter(|(x, _)| *x == s as u32)
                    .map(|(_, q)| *q)
                    .collect();
                assert!(
                    seqs.windows(2).all(|w| w[0] < w[1]),
                    "{id} from sender {s}: duplicated or out of order"
                );
                if before[id] != "n2" {
                    assert_eq!(seqs, (0..*n).collect::<Vec<_>>(), "{id} from sender {s}");
                } else {
                    assert_eq!(seqs.last(), Some(&(n - 1)), "{id} gets the stream again");
                }
            }
        }
    }
    reg.assert_single_writer();
    stop_all(&nodes[..2]).await;
}
