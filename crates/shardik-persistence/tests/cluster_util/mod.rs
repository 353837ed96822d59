//! Cluster nodes for the sharding-on-persistence tests: nodes on 127.0.0.1 with OS-assigned
//! ports, each in its own actor system in this process, with cluster sharding over a
//! per-node `ShardingStateStore`; plus waits with deadlines.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardik_actor::ActorSystem;
use shardik_cluster::member::UniqueAddress;
use shardik_cluster::runtime::{Cluster, ClusterConfig, ClusterState};
use shardik_sharding::cluster::{ClusterSharding, CoordinatorSnapshot, ShardingStateStore};

pub const SECRET: &[u8] = b"persistence test secret, 32 bytes or more";

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// One member: its actor system, cluster and cluster sharding (over its state store).
pub struct Member {
    pub system: ActorSystem,
    pub cluster: Cluster,
    pub sharding: ClusterSharding,
}

impl Member {
    pub fn id(&self) -> &UniqueAddress {
        self.cluster.self_node()
    }

    /// Crash: the cluster layer stops without leaving, then the actor system (its entities).
    pub async fn crash(&self) {
        self.cluster.shutdown().await;
        self.system.shutdown().await;
    }
}

/// Starts node `id` (joining through `seed`, or forming the cluster), waits until it is up,
/// and starts its cluster sharding over `store`.
pub async fn start_member(
    id: &str,
    seed: Option<&str>,
    store: Arc<dyn ShardingStateStore>,
) -> Member {
    start_member_with(id, seed, store, |c| c).await
}

/// [`start_member`] with its cluster configuration changed by `configure`.
pub async fn start_member_with(
    id: &str,
    seed: Option<&str>,
    store: Arc<dyn ShardingStateStore>,
    configure: impl FnOnce(ClusterConfig) -> ClusterConfig,
) -> Member {
    init_tracing();
    let system = ActorSystem::new(id.to_string());
    let mut c = ClusterConfig::new("durable", id).secret(SECRET.to_vec());
    c.remote = c
        .remote
        .backoff(Duration::from_millis(10), Duration::from_millis(500));
    if let Some(seed) = seed {
        c = c.seed_nodes([seed.to_string()]);
    }
    let c = configure(c);
    let cluster = Cluster::start(&system, c).await.expect("cluster starts");
    tokio::time::timeout(Duration::from_secs(15), cluster.when_up())
        .await
        .expect("up in time")
        .expect("up");
    let sharding = ClusterSharding::with_state_store(&cluster, store)
        .await
        .expect("sharding state loads");
    Member {
        system,
        cluster,
        sharding,
    }
}

/// Nodes `n0..` over `stores` (one each): `n0` forms the cluster, the others join through
/// it; returns once every node sees all of them `Up`.
pub async fn members(stores: &[Arc<dyn ShardingStateStore>]) -> Vec<Member> {
    let first = start_member("n0", None, stores[0].clone()).await;
    let seed = first.id().address.clone();
    let mut all = vec![first];
    for (i, store) in stores.iter().enumerate().skip(1) {
        all.push(start_member(&format!("n{i}"), Some(&seed), store.clone()).await);
    }
    let ids: Vec<UniqueAddress> = all.iter().map(|m| m.id().clone()).collect();
    for m in &all {
        wait_state(&m.cluster, "all up", |s| s.all_up(&ids)).await;
    }
    all
}

pub async fn wait_state(
    node: &Cluster,
    what: &str,
    pred: impl FnMut(&ClusterState) -> bool,
) -> ClusterState {
    match tokio::time::timeout(Duration::from_secs(20), node.wait_until(pred)).await {
        Ok(s) => s,
        Err(_) => panic!("{what}: not in time on {}", node.self_node()),
    }
}

/// Polls `pred` every 20 ms until it holds (for conditions no event reports), or panics.
pub async fn poll(what: &str, timeout: Duration, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The coordinator snapshot of `type_name` on whichever member runs it, once one does and
/// `pred` holds for it (polled: no event reports it).
pub async fn coordinator_where(
    members: &[Member],
    type_name: &str,
    what: &str,
    mut pred: impl FnMut(&CoordinatorSnapshot) -> bool,
) -> CoordinatorSnapshot {
    let mut found = None;
    poll(what, Duration::from_secs(30), || {
        found = members
            .iter()
            .filter(|m| m.cluster.stopped().is_none())
            .find_map(|m| m.sharding.coordinator(type_name))
            .filter(&mut pred);
        found.is_some()
    })
    .await;
    found.expect("found")
}

/// Stops every member (cluster layer first, without leaving: a whole-cluster stop).
pub async fn stop_all(members: &[Member]) {
    for m in members {
        if m.cluster.stopped().is_none() {
            m.cluster.shutdown().await;
        }
    }
    for m in members {
        m.system.shutdown().await;
    }
}

/// Whether the region id `region` (`address#node_id#incarnation`) is one of `members`'.
pub fn region_of_member(region: &str, members: &[Member]) -> bool {
    members.iter().any(|m| {
        let id = m.id();
        region == format!("{}#{}#{}", id.address, id.node_id, id.incarnation)
    })
}
