//! Helpers of the `net_*` tests: cluster nodes on 127.0.0.1 with OS-assigned ports, each in
//! its own actor system, and waiting for states with a timeout (never sleeping).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use shardik_actor::ActorSystem;
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::{Cluster, ClusterConfig, ClusterState};
use shardik_remote::FaultInjector;

pub const SECRET: &[u8] = b"cluster test secret, 32 bytes or more";

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A node of cluster "net" with the default cluster timing, the test secret and quick
/// reconnects.
pub fn config(node_id: &str) -> ClusterConfig {
    let mut c = ClusterConfig::new("net", node_id).secret(SECRET.to_vec());
    c.remote = c
        .remote
        .backoff(Duration::from_millis(10), Duration::from_millis(500));
    c
}

pub struct Node {
    pub system: ActorSystem,
    pub cluster: Cluster,
}

impl Node {
    pub fn id(&self) -> &UniqueAddress {
        self.cluster.self_node()
    }
}

pub async fn start(config: ClusterConfig) -> Node {
    init_tracing();
    let system = ActorSystem::new(config.node_id().to_string());
    let cluster = Cluster::start(&system, config)
        .await
        .expect("cluster starts");
    Node { system, cluster }
}

/// Waits until `pred` holds on `node`, or panics after `timeout` with `what` and the state.
pub async fn wait(
    node: &Cluster,
    what: &str,
    timeout: Duration,
    pred: impl FnMut(&ClusterState) -> bool,
) -> ClusterState {
    match tokio::time::timeout(timeout, node.wait_until(pred)).await {
        Ok(s) => s,
        Err(_) => panic!(
            "{what}: not within {timeout:?} on {}; state: {:#?}",
            node.self_node(),
            node.state()
        ),
    }
}

/// Waits until each of `nodes` sees every one of `ids` `Up` (`what` names the wait).
pub async fn wait_all_up<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    ids: &[UniqueAddress],
    what: &str,
) {
    for n in nodes {
        wait(&n.cluster, what, Duration::from_secs(15), |s| s.all_up(ids)).await;
    }
}

/// Starts `n` nodes `n0..`: `n0` forms the cluster, the others join through it. Returns
/// once every node sees all of them `Up`, with the time that took.
pub async fn cluster_of(n: usize, faults: Option<&FaultInjector>) -> (Vec<Node>, Duration) {
    cluster_with(n, |i| {
        let c = config(&format!("n{i}"));
        match faults {
            Some(f) => c.faults(f.clone()),
            None => c,
        }
    })
    .await
}

pub async fn cluster_with(
    n: usize,
    make: impl Fn(usize) -> ClusterConfig,
) -> (Vec<Node>, Duration) {
    let started = Instant::now();
    let first = start(make(0)).await;
    let seed = first.id().address.clone();
    let mut nodes = vec![first];
    for i in 1..n {
        nodes.push(start(make(i).seed_nodes([seed.clone()])).await);
    }
    let ids: Vec<UniqueAddress> = nodes.iter().map(|n| n.id().clone()).collect();
    for node in &nodes {
        wait(&node.cluster, "all up", Duration::from_secs(15), |s| {
            s.all_up(&ids)
        })
        .await;
    }
    (nodes, started.elapsed())
}

pub fn status(node: &Cluster, of: &UniqueAddress) -> Option<MemberStatus> {
    node.state().member(of).map(|m| m.status)
}

/// Shuts every node that is still running down (end of a test).
pub async fn stop_all(nodes: &[Node]) {
    for n in nodes {
        if n.cluster.stopped().is_none() {
            n.cluster.shutdown().await;
        }
        n.system.shutdown().await;
    }
}
