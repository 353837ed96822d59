//! Helpers of the `cluster_*` tests: cluster nodes on 127.0.0.1 with OS-assigned ports, each
//! in its own actor system in this process, an entity that reports its incarnations to a
//! shared [`Registry`] (the single-writer check), and waits with deadlines.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
use shardik_cluster::member::UniqueAddress;
use shardik_cluster::runtime::{Cluster, ClusterConfig, ClusterState};
use shardik_remote::FaultInjector;
use shardik_sharding::cluster::{ClusterSharding, ClusterShardingSettings};
use shardik_sharding::{EntityType, FencingToken, Region, ShardId};

pub const SECRET: &[u8] = b"sharding test secret, 32 bytes or more";
pub const TYPE: &str = "probe";

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// What the probe entity understands.
#[derive(Serialize, Deserialize)]
pub enum Msg {
    /// Sequence number `seq` from sender `sender`.
    Add { sender: u32, seq: u64 },
    /// As `Add`, after working for `ms` milliseconds (a busy entity with a backlog).
    Slow { sender: u32, seq: u64, ms: u64 },
    /// The node it runs on.
    Where(ReplyTo<String>),
    /// What this incarnation received.
    Get(ReplyTo<Vec<(u32, u64)>>),
}

/// Shared by every node of a test (they run in one process): live incarnations per entity id,
/// the worst count ever seen, a journal of every `Add` handled (which survives moves), and
/// the nodes each entity ever ran on.
#[derive(Default)]
pub struct Registry {
    live: Mutex<HashMap<String, usize>>,
    pub max_live: AtomicUsize,
    pub journal: Mutex<HashMap<String, Vec<(u32, u64)>>>,
    pub homes: Mutex<HashMap<String, Vec<String>>>,
    /// Per id: the fencing token each incarnation was started with (same order as `homes`).
    pub tokens: Mutex<HashMap<String, Vec<Option<FencingToken>>>>,
    pub adds: AtomicUsize,
    /// Ids whose entity has started working on a `Slow` message.
    pub slow_started: Mutex<std::collections::BTreeSet<String>>,
    /// What a `Slow` message of `ms: u64::MAX` waits for instead of a time: one permit each.
    pub gate: Gate,
}

/// A closed gate: [`Gate::open`] lets one waiting (or later) `Slow { ms: u64::MAX }` through.
pub struct Gate(tokio::sync::Semaphore);

impl Default for Gate {
    fn default() -> Self {
        Gate(tokio::sync::Semaphore::new(0))
    }
}

impl Gate {
    /// Lets one gated handler go on.
    pub fn open(&self) {
        self.0.add_permits(1);
    }

    async fn pass(&self) {
        self.0
            .acquire()
            .await
            .expect("the gate is never closed")
            .forget();
    }
}

impl Registry {
    fn started(&self, id: &str, node: &str, token: Option<FencingToken>) {
        self.tokens
            .lock()
            .entry(id.to_string())
            .or_default()
            .push(token);
        let mut live = self.live.lock();
        let n = live.entry(id.to_string()).or_default();
        *n += 1;
        self.max_live.fetch_max(*n, Ordering::SeqCst);
        self.homes
            .lock()
            .entry(id.to_string())
            .or_default()
            .push(node.to_string());
    }

    fn stopped(&self, id: &str) {
        let mut live = self.live.lock();
        if let Some(n) = live.get_mut(id) {
            *n -= 1;
        }
    }

    /// The single-writer invariant: never two live incarnations of one id.
    pub fn assert_single_writer(&self) {
        assert!(
            self.max_live.load(Ordering::SeqCst) <= 1,
            "two live incarnations of one entity id at once"
        );
    }

    /// Live incarnations of `id` now.
    pub fn live_of(&self, id: &str) -> usize {
        self.live.lock().get(id).copied().unwrap_or(0)
    }

    /// Live incarnations now, over all ids.
    pub fn live_total(&self) -> usize {
        self.live.lock().values().sum()
    }

    /// Checks that what `id` handled from each sender in `senders` is in order without
    /// duplicates (a prefix may be missing where messages died with a node).
    pub fn assert_ordered(&self, id: &str, senders: &[u32]) {
        let journal = self.journal.lock();
        let got = journal.get(id).cloned().unwrap_or_default();
        for s in senders {
            let seqs: Vec<u64> = got
                .iter()
                .filter(|(x, _)| x == s)
                .map(|(_, q)| *q)
                .collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "{id} from sender {s}: duplicated or out of order"
            );
        }
    }

    /// Checks that `id` handled exactly `0..n` from each sender in `senders`, in order.
    pub fn assert_stream(&self, id: &str, senders: &[u32], n: u64) {
        let journal = self.journal.lock();
        let got = journal.get(id).cloned().unwrap_or_default();
        for s in senders {
            let seqs: Vec<u64> = got
                .iter()
                .filter(|(x, _)| x == s)
                .map(|(_, q)| *q)
                .collect();
            let want: Vec<u64> = (0..n).collect();
            assert_eq!(
                seqs, want,
                "entity {id}: sender {s} out of order, lost or duplicated"
            );
        }
    }
}

pub struct Probe {
    id: String,
    node: String,
    reg: Arc<Registry>,
    token: Option<FencingToken>,
    got: Vec<(u32, u64)>,
}

impl Probe {
    pub fn new(id: &str, node: &str, reg: &Arc<Registry>) -> Self {
        Self::fenced(id, node, None, reg)
    }

    /// A probe that records the fencing token it was started with.
    pub fn fenced(id: &str, node: &str, token: Option<FencingToken>, reg: &Arc<Registry>) -> Self {
        Probe {
            id: id.to_string(),
            node: node.to_string(),
            reg: reg.clone(),
            token,
            got: Vec::new(),
        }
    }
}

impl Actor for Probe {
    type Msg = Msg;
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.reg.started(&self.id, &self.node, self.token);
        Ok(())
    }
    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.reg.stopped(&self.id);
    }
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Add { sender, seq } | Msg::Slow { sender, seq, .. } => {
                if let Msg::Slow { ms, .. } = msg {
                    self.reg.slow_started.lock().insert(self.id.clone());
                    if ms == u64::MAX {
                        self.reg.gate.pass().await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                }
                self.got.push((sender, seq));
                self.reg
                    .journal
                    .lock()
                    .entry(self.id.clone())
                    .or_default()
                    .push((sender, seq));
                self.reg.adds.fetch_add(1, Ordering::SeqCst);
            }
            Msg::Where(r) => r.reply(self.node.clone()),
            Msg::Get(r) => r.reply(self.got.clone()),
        }
        Ok(())
    }
}

pub fn settings() -> ClusterShardingSettings {
    ClusterShardingSettings::default().rebalance_interval(Duration::from_millis(500))
}

pub struct Node {
    pub system: ActorSystem,
    pub cluster: Cluster,
    pub sharding: ClusterSharding,
    pub region: Region<Msg>,
}

impl Node {
    pub fn id(&self) -> &UniqueAddress {
        self.cluster.self_node()
    }

    pub fn name(&self) -> String {
        self.id().node_id.clone()
    }

    pub fn hosted(&self) -> BTreeSet<ShardId> {
        self.sharding.hosted_shards(TYPE).unwrap_or_default()
    }

    /// Crash: the cluster layer stops without leaving, then the actor system (its entities).
    pub async fn crash(&self) {
        self.cluster.shutdown().await;
        self.system.shutdown().await;
    }
}

pub fn config(node_id: &str) -> ClusterConfig {
    let mut c = ClusterConfig::new("shard", node_id).secret(SECRET.to_vec());
    c.remote = c
        .remote
        .backoff(Duration::from_millis(10), Duration::from_millis(500));
    c
}

/// Starts an actor system `id` and its cluster layer with `c`, and waits until it is `Up`.
pub async fn up(id: &str, c: ClusterConfig) -> (ActorSystem, Cluster) {
    init_tracing();
    let system = ActorSystem::new(id.to_string());
    let cluster = Cluster::start(&system, c).await.expect("cluster starts");
    tokio::time::timeout(Duration::from_secs(15), cluster.when_up())
        .await
        .expect("up in time")
        .expect("up");
    (system, cluster)
}

/// Starts a node (joining through `seed`, or forming the cluster), waits until it is up and
/// starts the probe type with `shards` shards on it.
pub async fn start_node(id: &str, seed: Option<&str>, shards: u32, reg: &Arc<Registry>) -> Node {
    start_node_with(id, seed, shards, reg, None).await
}

/// [`start_node`] with links cut or delayed by `faults`.
pub async fn start_node_with(
    id: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
) -> Node {
    start_node_configured(id, seed, shards, reg, faults, &|t| t).await
}

/// How a test changes the probe entity type (idle timeout, live-entity cap, ...).
pub type Configure = dyn Fn(EntityType<Probe>) -> EntityType<Probe> + Sync;

/// A member `id` with `faults` (if any), joining through `seed` (or forming the cluster),
/// up, with its cluster sharding extension and no entity type started.
async fn faulty_member(
    id: &str,
    seed: Option<&str>,
    faults: Option<&FaultInjector>,
) -> (ActorSystem, Cluster, ClusterSharding) {
    faulty_member_tuned(id, seed, faults, &|c| c).await
}

/// How a test changes the cluster configuration of its nodes.
pub type Tune = dyn Fn(ClusterConfig) -> ClusterConfig + Sync;

async fn faulty_member_tuned(
    id: &str,
    seed: Option<&str>,
    faults: Option<&FaultInjector>,
    tune: &Tune,
) -> (ActorSystem, Cluster, ClusterSharding) {
    let mut c = tune(config(id));
    if let Some(f) = faults {
        c = c.faults(f.clone());
    }
    if let Some(seed) = seed {
        c = c.seed_nodes([seed.to_string()]);
    }
    let (system, cluster) = up(id, c).await;
    let sharding = ClusterSharding::get(&cluster);
    (system, cluster, sharding)
}

/// [`start_node_with`] with the probe type changed by `configure` (applied after the shard
/// count).
pub async fn start_node_configured(
    id: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    configure: &Configure,
) -> Node {
    start_node_tuned(id, seed, shards, reg, faults, configure, &|c| c).await
}

/// [`start_node_configured`] with the cluster configuration changed by `tune`.
pub async fn start_node_tuned(
    id: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    configure: &Configure,
    tune: &Tune,
) -> Node {
    start_node_set(id, seed, shards, reg, faults, configure, tune, &settings()).await
}

/// [`start_node_tuned`] with the type's cluster sharding settings `set`.
#[allow(clippy::too_many_arguments)]
pub async fn start_node_set(
    id: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    configure: &Configure,
    tune: &Tune,
    set: &ClusterShardingSettings,
) -> Node {
    let (system, cluster, sharding) = faulty_member_tuned(id, seed, faults, tune).await;
    let node = id.to_string();
    let r = reg.clone();
    let region = sharding
        .start_with(
            configure(
                EntityType::new_fenced(TYPE, move |eid: &str, token| {
                    Probe::fenced(eid, &node, token, &r)
                })
                .shards(shards),
            ),
            set.clone(),
        )
        .expect("type starts");
    Node {
        system,
        cluster,
        sharding,
        region,
    }
}

/// A member without any entity type started yet: joins through `seed` (or forms the
/// cluster) with `roles`, waits until it is up, and gets its cluster sharding extension.
pub async fn start_member(
    id: &str,
    seed: Option<&str>,
    roles: &[&str],
) -> (ActorSystem, Cluster, ClusterSharding) {
    let mut c = config(id);
    for r in roles {
        c = c.role(*r);
    }
    if let Some(seed) = seed {
        c = c.seed_nodes([seed.to_string()]);
    }
    let (system, cluster) = up(id, c).await;
    let sharding = ClusterSharding::get(&cluster);
    (system, cluster, sharding)
}

/// Starts the probe type (hosting) on `sharding` with `settings`.
pub fn start_probe(
    sharding: &ClusterSharding,
    node: &str,
    shards: u32,
    reg: &Arc<Registry>,
    settings: ClusterShardingSettings,
) -> Region<Msg> {
    let node = node.to_string();
    let r = reg.clone();
    sharding
        .start_with(
            EntityType::new_fenced(TYPE, move |eid: &str, token| {
                Probe::fenced(eid, &node, token, &r)
            })
            .shards(shards),
            settings,
        )
        .expect("type starts")
}

/// Waits until the coordinator on `coord` has `n` regions registered, `proxies` of them
/// proxy-only (no event reports it: polled).
pub async fn registered_with_proxies(coord: &Node, n: usize, proxies: usize) {
    poll("regions registered", Duration::from_secs(20), || {
        coord.sharding.coordinator(TYPE).is_some_and(|c| {
            c.state.regions.len() == n
                && c.state.regions.values().filter(|i| i.proxy).count() == proxies
        })
    })
    .await;
}

/// `n` nodes `n0..`: `n0` forms the cluster, the others join through it; returns once every
/// node sees all of them `Up`.
pub async fn cluster_of(n: usize, shards: u32, reg: &Arc<Registry>) -> Vec<Node> {
    cluster_with(n, shards, reg, None).await
}

/// [`cluster_of`] with `faults` on every node.
pub async fn cluster_with(
    n: usize,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
) -> Vec<Node> {
    cluster_configured(n, shards, reg, faults, &|t| t).await
}

/// [`cluster_with`] with the probe type changed by `configure` on every node.
pub async fn cluster_configured(
    n: usize,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    configure: &Configure,
) -> Vec<Node> {
    cluster_tuned(n, shards, reg, faults, configure, &|c| c).await
}

/// [`cluster_configured`] with every node's cluster configuration changed by `tune`.
pub async fn cluster_tuned(
    n: usize,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    configure: &Configure,
    tune: &Tune,
) -> Vec<Node> {
    cluster_set(n, shards, reg, faults, configure, tune, &settings()).await
}

/// [`cluster_tuned`] with the type's cluster sharding settings `set` on every node.
pub async fn cluster_set(
    n: usize,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    configure: &Configure,
    tune: &Tune,
    set: &ClusterShardingSettings,
) -> Vec<Node> {
    let first = start_node_set("n0", None, shards, reg, faults, configure, tune, set).await;
    let seed = first.id().address.clone();
    let mut nodes = vec![first];
    for i in 1..n {
        let id = format!("n{i}");
        let node = start_node_set(&id, Some(&seed), shards, reg, faults, configure, tune, set);
        nodes.push(node.await);
    }
    all_up(&nodes).await;
    registered(&nodes[0], n).await;
    nodes
}

/// A member `name` (joining through `seed`, or forming the cluster) with the probe type of
/// `shards` shards started with remember entities.
pub async fn remembering_node(
    name: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
) -> Node {
    remembering_node_with(name, seed, shards, reg, None, settings()).await
}

/// [`remembering_node`] with `faults` and `settings` (remember entities turned on in them).
pub async fn remembering_node_with(
    name: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    settings: ClusterShardingSettings,
) -> Node {
    remembering_node_tuned(name, seed, shards, reg, faults, settings, &|c| c).await
}

/// [`remembering_node_with`] with the cluster configuration changed by `tune`.
pub async fn remembering_node_tuned(
    name: &str,
    seed: Option<&str>,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    settings: ClusterShardingSettings,
    tune: &Tune,
) -> Node {
    let (system, cluster, sharding) = faulty_member_tuned(name, seed, faults, tune).await;
    let region = start_probe(
        &sharding,
        name,
        shards,
        reg,
        settings.remember_entities(true),
    );
    Node {
        system,
        cluster,
        sharding,
        region,
    }
}

/// `n` [`remembering_node`]s `n0..`: `n0` forms the cluster, the others join through it;
/// returns once every node sees all of them `Up` and `n0` coordinates all `n` regions.
pub async fn remembering_cluster(n: usize, shards: u32, reg: &Arc<Registry>) -> Vec<Node> {
    remembering_cluster_with(n, shards, reg, None, settings()).await
}

/// [`remembering_cluster`] with `faults` and `settings` on every node.
pub async fn remembering_cluster_with(
    n: usize,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    settings: ClusterShardingSettings,
) -> Vec<Node> {
    remembering_cluster_tuned(n, shards, reg, faults, settings, &|c| c).await
}

/// [`remembering_cluster_with`] with the cluster configuration changed by `tune`.
pub async fn remembering_cluster_tuned(
    n: usize,
    shards: u32,
    reg: &Arc<Registry>,
    faults: Option<&FaultInjector>,
    settings: ClusterShardingSettings,
    tune: &Tune,
) -> Vec<Node> {
    let first =
        remembering_node_tuned("n0", None, shards, reg, faults, settings.clone(), tune).await;
    let seed = first.id().address.clone();
    let mut nodes = vec![first];
    for i in 1..n {
        let name = format!("n{i}");
        let node = remembering_node_tuned(
            &name,
            Some(&seed),
            shards,
            reg,
            faults,
            settings.clone(),
            tune,
        )
        .await;
        nodes.push(node);
    }
    all_up(&nodes).await;
    registered(&nodes[0], n).await;
    nodes
}

/// Waits until the coordinator on `coord` has `n` regions registered (no event reports it).
pub async fn registered(coord: &Node, n: usize) {
    poll("regions registered", Duration::from_secs(20), || {
        coord
            .sharding
            .coordinator(TYPE)
            .is_some_and(|c| c.state.regions.len() == n)
    })
    .await;
}

pub async fn all_up(nodes: &[Node]) {
    let ids: Vec<UniqueAddress> = nodes.iter().map(|n| n.id().clone()).collect();
    for node in nodes {
        wait_state(&node.cluster, "all up", |s| s.all_up(&ids)).await;
    }
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

/// Waits until the coordinator (on `coord`) dropped the region of node `node_id` from its
/// state: a downed node's shards are reallocated only `down_margin` after `Down`, and by then
/// every region has forgotten it as a home (no event reports it: polled).
pub async fn region_dropped(coord: &Node, node_id: &str) {
    let tag = format!("#{node_id}#");
    poll("region dropped", Duration::from_secs(20), || {
        coord
            .sharding
            .coordinator(TYPE)
            .is_some_and(|c| c.state.regions.keys().all(|r| !r.0.contains(&tag)))
    })
    .await;
}

/// Polls `pred` every 20 ms until it holds (for conditions no event reports), or panics.
pub async fn poll(what: &str, timeout: Duration, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every entity of `ids` handled `0..counts[s]` from each sender `s` (no event
/// reports it: polled), then checks exactly once each and in order; on timeout prints what is
/// missing.
pub async fn await_streams(reg: &Registry, ids: &[String], counts: &[u64]) {
    let expected: usize = counts.iter().map(|c| *c as usize * ids.len()).sum();
    let deadline = Instant::now() + Duration::from_secs(20);
    while reg.adds.load(Ordering::SeqCst) < expected {
        if Instant::now() > deadline {
            let journal = reg.journal.lock();
            for id in ids {
                for (s, n) in counts.iter().enumerate() {
                    let got = journal.get(id).cloned().unwrap_or_default();
                    let seqs: Vec<u64> = got
                        .iter()
                        .filter(|(x, _)| *x == s as u32)
                        .map(|(_, q)| *q)
                        .collect();
                    let missing: Vec<u64> = (0..*n).filter(|q| !seqs.contains(q)).collect();
                    if !missing.is_empty() {
                        eprintln!(
                            "{id} sender {s}: {} missing, first {:?}; homes {:?}",
                            missing.len(),
                            missing.first(),
                            reg.homes.lock().get(id)
                        );
                    }
                }
            }
            panic!("not every number handled within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reg.adds.load(Ordering::SeqCst), expected, "duplicates");
    let senders: Vec<u32> = (0..counts.len() as u32).collect();
    for id in ids {
        for (s, n) in counts.iter().enumerate() {
            reg.assert_stream(id, &senders[s..=s], *n);
        }
    }
}

pub const ASK: Duration = Duration::from_secs(10);

/// Where entity `id` runs, asked through `node`.
pub async fn where_is(node: &Node, id: &str) -> String {
    node.region
        .entity_ref(id)
        .ask(Msg::Where, ASK)
        .await
        .unwrap_or_else(|e| panic!("ask {id} through {}: {e}", node.name()))
}

pub async fn stop_all(nodes: &[Node]) {
    for n in nodes {
        if n.cluster.stopped().is_none() {
            n.cluster.shutdown().await;
        }
        n.system.shutdown().await;
    }
}

/// Senders streaming `Msg::Add { sender, seq }` (seq 0, 1, ...) to every id, each through the
/// region of its node, until [`stop`](Streams::stop).
pub struct Streams {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Streams {
    /// Starts one sender per `(sender, node index)`.
    pub fn start(nodes: &[Node], senders: &[(u32, usize)], ids: &[String]) -> Streams {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = senders
            .iter()
            .map(|&(sender, node)| {
                let region = nodes[node].region.clone();
                let ids = ids.to_vec();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        for id in &ids {
                            region.tell(id, Msg::Add { sender, seq });
                        }
                        seq += 1;
                        // Pacing of the stream, not a wait.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    seq
                })
            })
            .collect();
        Streams { stop, tasks }
    }

    /// Stops the senders; returns how many messages each sent per id, in start order.
    pub async fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::SeqCst);
        let mut counts = Vec::new();
        for t in self.tasks {
            counts.push(t.await.expect("sender task"));
        }
        counts
    }
}

/// Like [`await_streams`] with a count per entity: waits until every id of `counts` handled
/// `0..counts[id][s]` from each sender `s` (polled), then checks exactly once each and in
/// order.
pub async fn await_counts(reg: &Registry, counts: &HashMap<String, Vec<u64>>) {
    let expected: usize = counts.values().flatten().map(|n| *n as usize).sum();
    let deadline = Instant::now() + Duration::from_secs(20);
    while reg.adds.load(Ordering::SeqCst) < expected {
        if Instant::now() > deadline {
            let journal = reg.journal.lock();
            for (id, per_sender) in counts {
                let got = journal.get(id).cloned().unwrap_or_default();
                for (s, n) in per_sender.iter().enumerate() {
                    let have = got.iter().filter(|(x, _)| *x == s as u32).count();
                    if have as u64 != *n {
                        eprintln!("{id} sender {s}: {have} of {n}");
                    }
                }
            }
            panic!(
                "{} of {expected} numbers handled within 20 s",
                reg.adds.load(Ordering::SeqCst)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reg.adds.load(Ordering::SeqCst), expected, "duplicates");
    for (id, per_sender) in counts {
        for (s, n) in per_sender.iter().enumerate() {
            reg.assert_stream(id, &[s as u32], *n);
        }
    }
}
