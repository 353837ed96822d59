//! Remember entities: the ids of started entities are replicated, and when a node crashes
//! its shards are reallocated at once and their entities restart on the survivors without
//! waiting for a message.

mod cluster_util;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_util::*;
use shardik_sharding::cluster::{
    replaces, ClusterSharding, RecordKey, RememberedStart, ShardingRecord, ShardingStateStore,
    StateStoreFuture,
};
use shardik_sharding::ShardId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_restart_on_survivors_after_a_crash() {
    let reg = Arc::new(Registry::default());
    let nodes = remembering_cluster(3, 12, &reg).await;

    let ids: Vec<String> = (0..30).map(|i| format!("e{i}")).collect();
    let mut victims = Vec::new();
    for id in &ids {
        nodes[0].region.tell(id, Msg::Add { sender: 0, seq: 0 });
        if where_is(&nodes[0], id).await == "n2" {
            victims.push(id.clone());
        }
    }
    assert!(!victims.is_empty(), "some entities on n2");
    // The survivors' replicas hold every started id (no event reports it: polled).
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    poll("ids remembered", Duration::from_secs(20), || {
        nodes[..2]
            .iter()
            .all(|n| n.sharding.remembered_entities(TYPE).is_superset(&all))
    })
    .await;

    nodes[2].crash().await;
    region_dropped(&nodes[0], "n2").await;
    // No message is sent: the crashed node's entities start again on the survivors.
    poll(
        "remembered entities restarted",
        Duration::from_secs(20),
        || {
            let homes = reg.homes.lock();
            victims.iter().all(|id| homes[id].len() == 2)
        },
    )
    .await;
    {
        let homes = reg.homes.lock();
        for id in &ids {
            let h = &homes[id];
            if victims.contains(id) {
                assert!(h[1] == "n0" || h[1] == "n1", "{id} restarted on {}", h[1]);
            } else {
                assert_eq!(h.len(), 1, "{id} of a survivor moved: {h:?}");
            }
        }
    }
    // They answer where they now run, and the survivors host every shard.
    for id in &victims {
        let home = where_is(&nodes[1], id).await;
        assert_ne!(home, "n2");
    }
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// A node joins: rebalance moves shards to it, and their remembered entities start there at
/// once (after their old incarnations stopped), without a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_follow_their_shard_on_rebalance() {
    let reg = Arc::new(Registry::default());
    let mut nodes = remembering_cluster(2, 12, &reg).await;
    let ids: Vec<String> = (0..30).map(|i| format!("e{i}")).collect();
    for id in &ids {
        nodes[0].region.tell(id, Msg::Add { sender: 0, seq: 0 });
        where_is(&nodes[0], id).await;
    }
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    poll("ids remembered", Duration::from_secs(20), || {
        nodes
            .iter()
            .all(|n| n.sharding.remembered_entities(TYPE).is_superset(&all))
    })
    .await;

    let seed = nodes[0].id().address.clone();
    nodes.push(remembering_node("n2", Some(&seed), 12, &reg).await);
    all_up(&nodes).await;
    // Balanced, no hand-off running (polled).
    poll("balanced", Duration::from_secs(20), || {
        let counts: Vec<usize> = nodes.iter().map(|n| n.hosted().len()).collect();
        let total: usize = counts.iter().sum();
        counts[2] > 0
            && counts.iter().all(|c| *c <= total.div_ceil(3))
            && nodes[0]
                .sharding
                .coordinator(TYPE)
                .is_some_and(|c| c.handoffs == 0 && c.state.shards.len() == total)
    })
    .await;
    let moved: Vec<&String> = ids
        .iter()
        .filter(|id| nodes[2].hosted().contains(&nodes[2].region.shard_of(id)))
        .collect();
    assert!(!moved.is_empty(), "some entities in shards moved to n2");
    // Without a message, each of them runs on n2 (after its old incarnation stopped).
    poll("moved entities restarted", Duration::from_secs(20), || {
        let homes = reg.homes.lock();
        moved
            .iter()
            .all(|id| homes[*id].len() == 2 && homes[*id][1] == "n2")
    })
    .await;
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// A replica store that takes [`SLOW_SAVE`] to store remembered entities (and stores the
/// coordinator state at once): a replica answers a write of remembered ids only once it
/// stored them, and reads see only stored sets.
#[derive(Default)]
struct SlowEntityStore {
    records: parking_lot::Mutex<HashMap<(String, RecordKey), ShardingRecord>>,
}

const SLOW_SAVE: Duration = Duration::from_millis(400);

impl ShardingStateStore for SlowEntityStore {
    fn save_record<'a>(
        &'a self,
        node: &'a str,
        record: &'a ShardingRecord,
    ) -> StateStoreFuture<'a, bool> {
        Box::pin(async move {
            if matches!(record.key, RecordKey::Entities { .. }) {
                tokio::time::sleep(SLOW_SAVE).await;
            }
            let mut records = self.records.lock();
            let key = (node.to_string(), record.key.clone());
            if records
                .get(&key)
                .is_some_and(|cur| !replaces(record.rank, cur.rank))
            {
                return Ok(false);
            }
            records.insert(key, record.clone());
            Ok(true)
        })
    }

    fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>> {
        Box::pin(async move {
            Ok(self
                .records
                .lock()
                .iter()
                .filter(|((n, _), _)| n == node)
                .map(|(_, r)| r.clone())
                .collect())
        })
    }
}

/// A member `name` with a [`SlowEntityStore`] and the probe type with remember entities.
async fn slow_storing_node(name: &str, seed: Option<&str>, reg: &Arc<Registry>) -> Node {
    let mut config = config(name);
    if let Some(seed) = seed {
        config = config.seed_nodes([seed.to_string()]);
    }
    let (system, cluster) = up(name, config).await;
    let sharding =
        ClusterSharding::with_state_store(&cluster, Arc::new(SlowEntityStore::default()))
            .await
            .expect("the store loads");
    let region = start_probe(&sharding, name, 12, reg, settings().remember_entities(true));
    Node {
        system,
        cluster,
        sharding,
        region,
    }
}

/// Entities started right up to a hand-off are remembered by the shard's next home: the
/// old home reports the shard stopped only once a majority of replicas hold every id it
/// delivered to. Here every replica takes 400 ms to store remembered ids while the hand-off
/// itself is quick: the ids delivered while a write was being stored used to be written
/// after the hand-off, too late for the new home's majority read, and those entities then
/// stayed stopped (checked: this test fails without the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_started_just_before_a_rebalance_follow_their_shard() {
    let reg = Arc::new(Registry::default());
    let mut nodes = vec![slow_storing_node("n0", None, &reg).await];
    let seed = nodes[0].id().address.clone();
    nodes.push(slow_storing_node("n1", Some(&seed), &reg).await);
    all_up(&nodes).await;
    registered(&nodes[0], 2).await;

    // New entities all along, while n2 joins and shards move to it.
    let sending = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sender = {
        let (region, sending) = (nodes[0].region.clone(), sending.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while sending.load(std::sync::atomic::Ordering::Relaxed) {
                region.tell(&format!("b{n}"), Msg::Add { sender: 0, seq: 0 });
                n += 1;
                // Paces the sender (a few hundred ids a second); nothing waits on it.
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            n
        })
    };
    nodes.push(slow_storing_node("n2", Some(&seed), &reg).await);
    all_up(&nodes).await;
    poll("balanced", Duration::from_secs(30), || {
        let counts: Vec<usize> = nodes.iter().map(|n| n.hosted().len()).collect();
        counts[2] > 0
            && counts.iter().all(|c| *c <= 4)
            && nodes[0]
                .sharding
                .coordinator(TYPE)
                .is_some_and(|c| c.handoffs == 0 && c.state.shards.len() == 12)
    })
    .await;
    sending.store(false, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.await.expect("the sender ran");
    let ids: Vec<String> = (0..sent).map(|i| format!("b{i}")).collect();

    // Every entity runs where its shard is now: started there by a message, or moved there
    // and restarted as a remembered entity.
    poll(
        "every entity at its shard's home",
        Duration::from_secs(20),
        || {
            let home: HashMap<ShardId, String> = nodes
                .iter()
                .flat_map(|n| n.hosted().into_iter().map(|s| (s, n.name())))
                .collect();
            let homes = reg.homes.lock();
            ids.iter().all(|id| {
                homes.get(id).and_then(|h| h.last()) == home.get(&nodes[0].region.shard_of(id))
            })
        },
    )
    .await;
    let moved = reg.homes.lock().values().filter(|h| h.len() > 1).count();
    assert!(moved > 0, "some entities started before their shard moved");
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// With `RememberedStart::Constant`, a shard's new home starts its remembered entities a
/// few at a time: after a crash, the entities of each moved shard restart spread over time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_start_at_the_configured_rate() {
    const STEP: usize = 2;
    const EVERY: Duration = Duration::from_millis(400);
    let reg = Arc::new(Registry::default());
    let paced = settings().remembered_start(RememberedStart::Constant {
        entities: NonZeroUsize::new(STEP).unwrap(),
        every: EVERY,
    });
    let nodes = remembering_cluster_with(3, 12, &reg, None, paced).await;
    let ids: Vec<String> = (0..60).map(|i| format!("e{i}")).collect();
    let mut victims: BTreeMap<ShardId, Vec<String>> = BTreeMap::new();
    for id in &ids {
        if where_is(&nodes[0], id).await == "n2" {
            let shard = nodes[0].region.shard_of(id);
            victims.entry(shard).or_default().push(id.clone());
        }
    }
    let (&big, group) = victims
        .iter()
        .max_by_key(|(_, v)| v.len())
        .expect("some entities on n2");
    assert!(
        group.len() > 2 * STEP,
        "shard {big} has {} entities",
        group.len()
    );
    poll("ids remembered", Duration::from_secs(20), || {
        nodes[..2]
            .iter()
            .all(|n| n.sharding.remembered_entity_count(TYPE) == ids.len())
    })
    .await;

    nodes[2].crash().await;
    // When each of the crashed node's entities started again (polled: within 20 ms).
    let mut restarted: HashMap<String, Instant> = HashMap::new();
    let all: Vec<&String> = victims.values().flatten().collect();
    poll(
        "remembered entities restarted",
        Duration::from_secs(30),
        || {
            let homes = reg.homes.lock();
            for id in &all {
                if homes[*id].len() == 2 {
                    restarted.entry((*id).clone()).or_insert_with(Instant::now);
                }
            }
            restarted.len() == all.len()
        },
    )
    .await;
    // Each shard's entities: STEP at a time, EVERY apart, so the last of a shard's group
    // starts at least (steps - 1) * EVERY after its first (less the 20 ms of polling).
    for (shard, group) in &victims {
        let times: Vec<Instant> = group.iter().map(|id| restarted[id]).collect();
        let first = *times.iter().min().unwrap();
        let last = *times.iter().max().unwrap();
        let steps = group.len().div_ceil(STEP) as u32;
        let least = EVERY * (steps - 1);
        assert!(
            last - first + Duration::from_millis(40) >= least,
            "shard {shard}: {} entities restarted within {:?}, paced they take at least {least:?}",
            group.len(),
            last - first
        );
    }
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// `tell` works from a thread outside the runtime for a remembered type too: the new id is
/// recorded and written to the replicas without a tokio context on the caller's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_entity_started_from_a_plain_thread_is_remembered() {
    let reg = Arc::new(Registry::default());
    let nodes = remembering_cluster(2, 12, &reg).await;
    let region = nodes[0].region.clone();
    std::thread::spawn(move || {
        for i in 0..20 {
            region.tell(&format!("t{i}"), Msg::Add { sender: 0, seq: 0 });
        }
    })
    .join()
    .expect("telling from a plain thread does not panic");
    poll(
        "remembered on both replicas",
        Duration::from_secs(20),
        || {
            nodes
                .iter()
                .all(|n| n.sharding.remembered_entity_count(TYPE) == 20)
        },
    )
    .await;
    stop_all(&nodes).await;
}
