//! After a full restart the first node up does not start from its own copy of the sharding
//! state alone when `ClusterShardingSettings::min_quorum` asks for a majority: its store
//! missed writes the others acknowledged (SQLite files, one per node).

mod cluster_util;
mod probe;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use shardik_persistence::{FaultyStore, SqliteStore};
use shardik_sharding::cluster::{RecordKey, ShardingStateStore};
use shardik_sharding::coordination::CoordinatorState;
use shardik_sharding::{shard_of, ShardId, ShardingError};

use cluster_util::{members, poll, start_member, stop_all};
use probe::{ids, settings, start_type_with, Msg, Registry, SHARDS, TYPE};

/// The coordinator state and the remembered entities `store` holds for `node`.
async fn stored(store: &dyn ShardingStateStore, node: &str) -> (Option<CoordinatorState>, usize) {
    let records = store.load_records(node).await.unwrap();
    let mut state = None;
    let mut sets = 0;
    for r in records {
        match r.key {
            RecordKey::Coordinator { .. } => {
                state = Some(rmp_serde::from_slice(&r.bytes).expect("decodes"));
            }
            RecordKey::Entities { .. } => sets += 1,
            RecordKey::Promise { .. } => {}
        }
    }
    (state, sets)
}

/// After a full restart the first node up does not start from its own copy alone when
/// `min_quorum` asks for two: n0's store missed the second half of the entities (its writes
/// failed), and the coordinator waits for n1, whose copy has them, so every remembered
/// entity comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_node_up_waits_for_min_quorum_instead_of_its_stale_copy() {
    let dir = tempfile::tempdir().unwrap();
    let file = |i: usize| dir.path().join(format!("n{i}.db"));
    let settings = || settings().min_quorum(2);
    let ids = ids();
    let (first, second): (Vec<String>, Vec<String>) = {
        // Two halves on disjoint shards.
        let first_shards: BTreeSet<ShardId> = (0..SHARDS / 2).collect();
        ids.iter()
            .cloned()
            .partition(|id| first_shards.contains(&shard_of(id, SHARDS)))
    };
    assert!(!first.is_empty() && !second.is_empty());

    // ---- First life; n0's store stops taking writes half-way.
    let reg = Arc::new(Registry::default());
    let n0 = Arc::new(FaultyStore::new(Arc::new(
        SqliteStore::open(file(0)).unwrap(),
    )));
    let stores: Vec<Arc<dyn ShardingStateStore>> = vec![
        n0.clone(),
        Arc::new(SqliteStore::open(file(1)).unwrap()),
        Arc::new(SqliteStore::open(file(2)).unwrap()),
    ];
    let nodes = members(&stores).await;
    let regions: Vec<_> = nodes
        .iter()
        .map(|m| start_type_with(m, &reg, settings()))
        .collect();
    let ask_all = |which: Vec<String>| {
        let regions = regions.clone();
        async move {
            for (i, id) in which.iter().enumerate() {
                regions[i % 3]
                    .entity_ref(id.as_str())
                    .ask(Msg::Where, Duration::from_secs(10))
                    .await
                    .unwrap_or_else(|e| panic!("{id}: {e}"));
            }
        }
    };
    ask_all(first.clone()).await;
    // n0's store holds the first half (entity sets and the allocation), then fails.
    let first_shards: BTreeSet<ShardId> = first.iter().map(|id| shard_of(id, SHARDS)).collect();
    let mut held = false;
    while !held {
        let (state, sets) = stored(n0.inner().as_ref(), "n0").await;
        held = sets == first_shards.len()
            && state
                .is_some_and(|s| s.shards.keys().copied().collect::<BTreeSet<_>>() == first_shards);
        if !held {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    n0.fail_writes(true);
    ask_all(second.clone()).await;
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    poll(
        "every id remembered by n1 and n2",
        Duration::from_secs(20),
        || {
            nodes[1..]
                .iter()
                .all(|m| m.sharding.remembered_entities(TYPE) == all)
        },
    )
    .await;
    stop_all(&nodes).await;
    drop((regions, nodes, stores));
    let (state, sets) = stored(n0.inner().as_ref(), "n0").await;
    assert_eq!(sets, first_shards.len(), "n0's copy is stale");
    assert!(state.is_some());

    // ---- Second life: n0 comes up alone first, on its stale copy.
    let reg = Arc::new(Registry::default());
    let n0 = start_member("n0", None, Arc::new(SqliteStore::open(file(0)).unwrap())).await;
    let _r0 = start_type_with(&n0, &reg, settings());
    assert!(
        matches!(
            n0.sharding
                .wait_registered(TYPE, Duration::from_secs(1))
                .await,
            Err(ShardingError::NotRegistered { .. })
        ),
        "a coordinator started with one member of three"
    );
    assert!(n0.sharding.coordinator(TYPE).is_none());
    assert!(reg.running().is_empty());
    let seed = n0.id().address.clone();
    let mut nodes = vec![n0];
    for i in 1..3 {
        let m = start_member(
            &format!("n{i}"),
            Some(&seed),
            Arc::new(SqliteStore::open(file(i)).unwrap()),
        )
        .await;
        start_type_with(&m, &reg, settings());
        nodes.push(m);
    }
    poll(
        "every remembered entity running again",
        Duration::from_secs(30),
        || reg.running() == all,
    )
    .await;
    reg.assert_single_writer();
    stop_all(&nodes).await;
}
