//! A full cluster restart with the sharding state on the stores: three nodes with remember
//! entities start entities, every node stops, three new processes (same node ids, new ports
//! and incarnations) start on the same storage; without any message, the coordinator
//! recovers the shard allocation of the old cluster and the remembered entities run again,
//! on live members, one incarnation each.
//!
//! SQLite: one file per node. PostgreSQL: all nodes in one schema (records keyed by node
//! id); runs when `SHARDIK_PG_URL` names a server, like `backends.rs`.

mod cluster_util;
mod common;
mod probe;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shardik_persistence::{PostgresOptions, PostgresStore, SqliteStore};
use shardik_sharding::cluster::{RecordKey, ShardingStateStore};
use shardik_sharding::coordination::CoordinatorState;
use shardik_sharding::{shard_of, Region, ShardId};

use cluster_util::{coordinator_where, members, poll, region_of_member, stop_all};
use probe::{ids, start_type, Msg, Registry, SHARDS, TYPE};

/// Two lives of a three-node cluster over what `open(node index)` gives.
async fn remembered_entities_survive_a_full_restart<F, Fut>(open: F)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Arc<dyn ShardingStateStore>>,
{
    let ids = ids();
    // ---- First life: start every entity with a message.
    let reg = Arc::new(Registry::default());
    let mut stores = Vec::new();
    for i in 0..3 {
        stores.push(open(i).await);
    }
    let nodes = members(&stores).await;
    let regions: Vec<Region<Msg>> = nodes.iter().map(|m| start_type(m, &reg)).collect();
    for m in &nodes {
        m.sharding
            .wait_registered(TYPE, Duration::from_secs(20))
            .await
            .expect("registered");
    }
    for (i, id) in ids.iter().enumerate() {
        // Through every node in turn.
        let at = regions[i % 3]
            .entity_ref(id.as_str())
            .ask(Msg::Where, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert!(at.starts_with('n'));
    }
    // Remembering is asynchronous: wait until a majority of replicas hold every id.
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    poll(
        "every id remembered by a majority",
        Duration::from_secs(20),
        || {
            all.iter().all(|id| {
                nodes
                    .iter()
                    .filter(|m| m.sharding.remembered_entities(TYPE).contains(id))
                    .count()
                    >= 2
            })
        },
    )
    .await;
    let used: BTreeSet<ShardId> = ids.iter().map(|id| shard_of(id, SHARDS)).collect();
    let before = coordinator_where(&nodes, TYPE, "coordinator of the first life", |c| {
        c.state.shards.keys().copied().collect::<BTreeSet<_>>() == used
    })
    .await;
    assert_eq!(reg.running(), all);
    stop_all(&nodes).await;
    drop(regions);
    drop(nodes);
    assert!(
        reg.running().is_empty(),
        "every entity stopped with its node"
    );
    reg.assert_single_writer();
    // A majority of the stores holds the allocation the coordinator acted on (or a newer
    // state of it).
    let mut holding = 0;
    for (i, store) in stores.iter().enumerate() {
        let records = store.load_records(&format!("n{i}")).await.unwrap();
        let state = records.iter().find_map(|r| match &r.key {
            RecordKey::Coordinator { type_name } if type_name == TYPE => {
                let s: CoordinatorState = rmp_serde::from_slice(&r.bytes).expect("decodes");
                Some(s)
            }
            _ => None,
        });
        let newer =
            |s: &CoordinatorState| (s.epoch, s.version) >= (before.epoch, before.state.version);
        if let Some(s) = state.filter(newer) {
            assert_eq!(s.shards.keys().copied().collect::<BTreeSet<_>>(), used);
            holding += 1;
        }
    }
    assert!(
        holding >= 2,
        "{holding} stores hold the last acted-on allocation"
    );
    drop(stores);

    // ---- Second life: new processes, same node ids, same storage, no message at all.
    let reg = Arc::new(Registry::default());
    let mut stores = Vec::new();
    for i in 0..3 {
        stores.push(open(i).await);
    }
    let nodes = members(&stores).await;
    let _regions: Vec<Region<Msg>> = nodes.iter().map(|m| start_type(m, &reg)).collect();
    // The new coordinator starts from the old cluster's allocation, with a higher epoch.
    let recovered = coordinator_where(&nodes, TYPE, "recovered coordinator", |_| true).await;
    assert!(
        recovered.epoch > before.epoch,
        "epoch {} after {}",
        recovered.epoch,
        before.epoch
    );
    assert!(recovered.state.epoch >= before.state.epoch);
    assert_eq!(recovered.state.remembered, before.state.remembered);
    // Every shard of the old allocation is homed again, on a live member (the old regions
    // are of processes that no longer exist).
    let now = coordinator_where(&nodes, TYPE, "old shards reallocated", |c| {
        used.iter().all(|s| {
            c.state
                .shards
                .get(s)
                .is_some_and(|r| region_of_member(&r.0, &nodes))
        })
    })
    .await;
    assert!(now
        .state
        .regions
        .keys()
        .all(|r| region_of_member(&r.0, &nodes)));
    // ...and the remembered entities run again without a message, once each.
    poll(
        "remembered entities running again",
        Duration::from_secs(30),
        || reg.running() == all,
    )
    .await;
    reg.assert_single_writer();
    // Each runs where its shard's home is.
    let now = coordinator_where(&nodes, TYPE, "coordinator", |_| true).await;
    let started = reg.started.lock().clone();
    for id in &ids {
        let home = &now.state.shards[&shard_of(id, SHARDS)].0;
        let ran = &started[id];
        assert_eq!(ran.len(), 1, "{id} started once: {ran:?}");
        assert!(
            home.contains(&format!("#{}#", ran[0])),
            "{id} runs on {} but its shard lives on {home}",
            ran[0]
        );
    }
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_remembered_entities_survive_a_full_cluster_restart() {
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().to_path_buf();
    remembered_entities_survive_a_full_restart(|i| {
        let path = dir_path.join(format!("n{i}.db"));
        async move {
            let store: Arc<dyn ShardingStateStore> = Arc::new(SqliteStore::open(path).unwrap());
            store
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_remembered_entities_survive_a_full_cluster_restart() {
    let Some(url) = common::pg_env("SHARDIK_PG_URL", "PostgreSQL sharding restart test") else {
        return;
    };
    // One schema for the three nodes: each reads back only its own records.
    let schema = format!("shard_restart_{}", std::process::id());
    remembered_entities_survive_a_full_restart(|_| {
        let (url, schema) = (url.clone(), schema.clone());
        async move {
            let options = PostgresOptions {
                schema,
                pool_size: 2,
                ..PostgresOptions::default()
            };
            let store: Arc<dyn ShardingStateStore> =
                Arc::new(PostgresStore::connect_with(&url, options).await.unwrap());
            store
        }
    })
    .await;
}
