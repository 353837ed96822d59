//! A full cluster restart with the sharding state on the stores: three nodes with remember
//! entities start entities, every node stops, three new processes (same node ids, new ports
//! and incarnations) start on the same storage; without any message, the coordinator
//! recovers the shard allocation of the old cluster and the remembered entities run again,
//! on live members, one incarnation each.
//!
//! SQLite: one file per node. PostgreSQL: all nodes in one schema (records keyed by node
//! id); runs when `SHARDIK_PG_URL` names a server, like `backends.rs`.

mod cluster_util;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use shardik_persistence::{FaultyStore, PostgresOptions, PostgresStore, SqliteStore};
use shardik_sharding::cluster::{ClusterShardingSettings, RecordKey, ShardingStateStore};
use shardik_sharding::coordination::CoordinatorState;
use shardik_sharding::{shard_of, EntityType, Region, ShardId, ShardingError};

use cluster_util::{
    coordinator_where, members, poll, region_of_member, start_member, stop_all, Member,
};

const TYPE: &str = "remembered";
const SHARDS: u32 = 12;
const ENTITIES: usize = 30;

#[derive(Serialize, Deserialize)]
enum Msg {
    /// The node the entity runs on.
    Where(ReplyTo<String>),
}

/// Live incarnations per entity id (and the most ever at once), across every node.
#[derive(Default)]
struct Registry {
    live: Mutex<HashMap<String, usize>>,
    max_live: AtomicUsize,
    started: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Registry {
    fn running(&self) -> BTreeSet<String> {
        let live = self.live.lock();
        live.iter()
            .filter(|(_, n)| **n > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

struct Probe {
    id: String,
    node: String,
    reg: Arc<Registry>,
}

impl Actor for Probe {
    type Msg = Msg;
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let mut live = self.reg.live.lock();
        let n = live.entry(self.id.clone()).or_default();
        *n += 1;
        self.reg.max_live.fetch_max(*n, Ordering::SeqCst);
        self.reg
            .started
            .lock()
            .entry(self.id.clone())
            .or_default()
            .push(self.node.clone());
        Ok(())
    }
    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if let Some(n) = self.reg.live.lock().get_mut(&self.id) {
            *n -= 1;
        }
    }
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Where(r) => r.reply(self.node.clone()),
        }
        Ok(())
    }
}

fn settings() -> ClusterShardingSettings {
    ClusterShardingSettings::default()
        .remember_entities(true)
        .down_margin(Duration::from_secs(2))
}

fn start_type(m: &Member, reg: &Arc<Registry>) -> Region<Msg> {
    start_type_with(m, reg, settings())
}

fn start_type_with(
    m: &Member,
    reg: &Arc<Registry>,
    settings: ClusterShardingSettings,
) -> Region<Msg> {
    let node = m.id().node_id.clone();
    let reg = reg.clone();
    m.sharding
        .start_with(
            EntityType::new(TYPE, move |id: &str| Probe {
                id: id.to_string(),
                node: node.clone(),
                reg: reg.clone(),
            })
            .shards(SHARDS),
            settings,
        )
        .expect("type starts")
}

fn ids() -> Vec<String> {
    (0..ENTITIES).map(|i| format!("e{i}")).collect()
}

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

impl Registry {
    fn assert_single_writer(&self) {
        assert!(
            self.max_live.load(Ordering::SeqCst) <= 1,
            "two live incarnations of one entity id at once"
        );
    }
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
    let Ok(url) = std::env::var("SHARDIK_PG_URL") else {
        assert!(
            std::env::var("SHARDIK_REQUIRE_PG").is_err(),
            "SHARDIK_REQUIRE_PG is set but SHARDIK_PG_URL is not: PostgreSQL tests cannot run"
        );
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "*** PostgreSQL sharding restart test SKIPPED: SHARDIK_PG_URL is not set ***"
        );
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
