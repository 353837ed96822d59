//! The cluster demo: sensor entities sharded over several nodes, each node its own OS process
//! on loopback, one command.
//!
//! ```text
//! cargo run --release -p shardik --example cluster_sensors
//! cargo run --release -p shardik --example cluster_sensors -- --nodes 4 --sensors 20000
//! ```
//!
//! This process is the first node (the seed) and starts the others as child processes of the
//! same program. Then:
//! 1. it reports readings to every sensor (an entity per id, started on its first reading,
//!    wherever its shard lives), follows the readings the nodes have *processed* with a progress
//!    bar and checks that not one was lost;
//! 2. it shows how the shards are spread over the nodes;
//! 3. it kills one node with SIGKILL and measures how long until the sensors that lived there
//!    answer again from the survivors (their in-memory state is gone with the node; persist it
//!    with shardik-persistence when it matters);
//! 4. it starts a new node and measures how long until the shards are balanced again;
//! 5. it reports one more round of readings and checks that each was processed exactly once.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::future::join_all;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use shardik::cluster::member::MemberStatus;
use shardik::cluster::runtime::{Cluster, ClusterConfig};
use shardik::prelude::*;
use shardik::remote::RemoteRef;
use shardik::sharding::cluster::ClusterSharding;
use shardik::sharding::shard_of;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line options.
#[derive(Parser, Debug, Clone)]
#[command(about = "Sensor entities sharded over a cluster of processes on loopback")]
struct Args {
    /// Nodes at the start, this process included (at least 3, so that a majority survives
    /// the kill).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Number of sensor entities.
    #[arg(long, default_value_t = 100_000)]
    sensors: usize,
    /// Readings each sensor reports before the kill.
    #[arg(long, default_value_t = 5)]
    readings: u32,
    /// Shards the sensor ids hash to.
    #[arg(long, default_value_t = 256)]
    shards: u32,
    /// Internal: run as a child node with this node id.
    #[arg(long, hide = true)]
    child: Option<String>,
    /// Internal: the seed node a child joins.
    #[arg(long, hide = true)]
    seed: Option<String>,
}

const CLUSTER: &str = "sensors";
const SECRET: &[u8] = b"demo secret: use your own, at least 32 bytes";
const TYPE: &str = "sensor";
const NODE_STATS: &str = "/user/node-stats";

/// What a sensor entity understands.
#[derive(Serialize, Deserialize)]
enum SensorMsg {
    /// A temperature reading in degrees Celsius.
    Reading { celsius: f64 },
    /// Asks how many readings this incarnation has processed.
    Count(ReplyTo<u64>),
}

/// One sensor: counts its readings and keeps their sum.
struct Sensor {
    count: u64,
    sum: f64,
    processed: Arc<AtomicU64>,
}

impl Actor for Sensor {
    type Msg = SensorMsg;
    async fn handle(&mut self, msg: SensorMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            SensorMsg::Reading { celsius } => {
                self.count += 1;
                self.sum += celsius;
                self.processed.fetch_add(1, Ordering::Relaxed);
            }
            SensorMsg::Count(reply) => reply.reply(self.count),
        }
        Ok(())
    }
}

/// Asks a node for its figures; every node registers one at [`NODE_STATS`].
#[derive(Serialize, Deserialize)]
enum NodeMsg {
    Stats(ReplyTo<NodeStats>),
}

/// A node's figures: readings its sensors processed and the shards it hosts.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NodeStats {
    node: String,
    processed: u64,
    shards: Vec<u32>,
}

struct NodeStatsActor {
    node: String,
    cluster: Cluster,
    processed: Arc<AtomicU64>,
}

impl Actor for NodeStatsActor {
    type Msg = NodeMsg;
    async fn handle(&mut self, msg: NodeMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let NodeMsg::Stats(reply) = msg;
        let shards = ClusterSharding::get(&self.cluster)
            .hosted_shards(TYPE)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default();
        reply.reply(NodeStats {
            node: self.node.clone(),
            processed: self.processed.load(Ordering::Relaxed),
            shards,
        });
        Ok(())
    }
}

/// A running node: its cluster membership and the sensor region.
struct Node {
    system: ActorSystem,
    cluster: Cluster,
    sensors: Region<SensorMsg>,
}

async fn start_node(id: &str, seed: Option<&str>, shards: u32) -> Result<Node, BoxError> {
    let system = ActorSystem::new(id);
    let mut config = ClusterConfig::new(CLUSTER, id)
        .bind("127.0.0.1:0")
        .secret(SECRET.to_vec());
    if let Some(seed) = seed {
        config = config.seed_nodes([seed.to_string()]);
    }
    let cluster = Cluster::start(&system, config).await?;
    cluster.when_up().await?;
    let processed = Arc::new(AtomicU64::new(0));
    let counter = processed.clone();
    let sensors = ClusterSharding::get(&cluster).start(
        EntityType::new(TYPE, move |_id: &str| Sensor {
            count: 0,
            sum: 0.0,
            processed: counter.clone(),
        })
        .shards(shards),
    )?;
    let stats = system.spawn(NodeStatsActor {
        node: id.to_string(),
        cluster: cluster.clone(),
        processed,
    });
    cluster.remote().register(NODE_STATS, stats);
    Ok(Node {
        system,
        cluster,
        sensors,
    })
}

/// A child node: joins the seed and serves until it is killed or its parent goes away.
async fn run_child(id: &str, seed: &str, shards: u32) -> Result<(), BoxError> {
    let node = start_node(id, Some(seed), shards).await?;
    // The parent holds our stdin: end of input means it is gone, so leave with it.
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while stdin.read(&mut buf).await? > 0 {}
    let left = ClusterSharding::get(&node.cluster)
        .leave(Duration::from_secs(5))
        .await;
    if !left.handed_off() {
        eprintln!(
            "{id} left before handing off {:?}: readings sent to those shards were lost",
            left.not_handed_off
        );
    }
    node.system.shutdown().await;
    Ok(())
}

fn spawn_child(args: &Args, id: &str, seed: &str) -> Result<Child, BoxError> {
    let child = Command::new(std::env::current_exe()?)
        .args(["--child", id, "--seed", seed])
        .args(["--shards", &args.shards.to_string()])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    Ok(child)
}

/// The figures of every `Up` member, by node id (members that do not answer are left out).
async fn cluster_stats(node: &Node) -> BTreeMap<String, NodeStats> {
    let state = node.cluster.state();
    let asks = state.with_status(MemberStatus::Up).map(|m| {
        let target: RemoteRef<NodeMsg> = node.cluster.remote().lookup(NODE_STATS, &m.node.address);
        async move {
            target
                .ask(NodeMsg::Stats, Duration::from_secs(2))
                .await
                .ok()
        }
    });
    let mut out = BTreeMap::new();
    for stats in join_all(asks).await.into_iter().flatten() {
        out.insert(stats.node.clone(), stats);
    }
    out
}

fn processed(stats: &BTreeMap<String, NodeStats>) -> u64 {
    stats.values().map(|s| s.processed).sum()
}

/// The coordinator's view (it runs on the seed, the oldest member): shards allocated per
/// registered region, by node id (a region id is `address#node id#incarnation`), and the
/// number of hand-offs running.
struct Allocation {
    per_node: BTreeMap<String, Vec<u32>>,
    handoffs: usize,
}

impl Allocation {
    fn of(seed: &Node) -> Option<Allocation> {
        let snapshot = ClusterSharding::get(&seed.cluster).coordinator(TYPE)?;
        let node_of = |region: &str| region.split('#').nth(1).unwrap_or(region).to_string();
        let mut per_node: BTreeMap<String, Vec<u32>> = snapshot
            .state
            .regions
            .iter()
            .filter(|(_, info)| !info.proxy)
            .map(|(r, _)| (node_of(&r.0), Vec::new()))
            .collect();
        for (shard, region) in &snapshot.state.shards {
            per_node.entry(node_of(&region.0)).or_default().push(*shard);
        }
        Some(Allocation {
            per_node,
            handoffs: snapshot.handoffs,
        })
    }

    fn allocated(&self) -> usize {
        self.per_node.values().map(Vec::len).sum()
    }

    /// Every region within one shard of every other, and no hand-off running.
    fn balanced(&self) -> bool {
        let min = self.per_node.values().map(Vec::len).min().unwrap_or(0);
        let max = self.per_node.values().map(Vec::len).max().unwrap_or(0);
        self.handoffs == 0 && max - min <= 1
    }

    fn print(&self, title: &str, shards: u32) {
        println!("\n{title}");
        let widest = self
            .per_node
            .values()
            .map(Vec::len)
            .max()
            .unwrap_or(1)
            .max(1);
        for (node, s) in &self.per_node {
            let bar = "#".repeat(s.len() * 40 / widest);
            println!("  {node:<10} {:>4} shards  {bar}", s.len());
        }
        println!(
            "  {:<10} {:>4} of {shards} shards allocated (a shard is allocated on its first message)",
            "total",
            self.allocated()
        );
    }
}

/// Polls the coordinator's view every 50 ms until `done` holds, for at most `limit`.
async fn wait_allocation(
    seed: &Node,
    limit: Duration,
    what: &str,
    mut done: impl FnMut(&Allocation) -> bool,
) -> Result<Allocation, BoxError> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(a) = Allocation::of(seed) {
            if done(&a) {
                return Ok(a);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reports `rounds` readings to every sensor, keeping at most `window` readings unprocessed,
/// with a progress bar over the processed count. Returns the processed count at the end.
async fn report_readings(
    seed: &Node,
    ids: &[String],
    rounds: std::ops::Range<u32>,
    base: u64,
) -> Result<u64, BoxError> {
    const WINDOW: u64 = 50_000;
    const CHUNK: usize = 10_000;
    const STALL: Duration = Duration::from_secs(30);
    let total = ids.len() as u64 * u64::from(rounds.end - rounds.start);
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner:.green} [{elapsed_precise}] [{wide_bar:.cyan/blue}] {human_pos}/{human_len} readings processed ({per_sec})",
        )?
        .progress_chars("=> "),
    );
    let mut sent = 0u64;
    let mut done = 0u64;
    for r in rounds {
        for chunk in ids.chunks(CHUNK) {
            for (i, id) in chunk.iter().enumerate() {
                let celsius = 15.0 + ((i as u32 + r) % 200) as f64 / 10.0;
                seed.sensors.tell(id, SensorMsg::Reading { celsius });
            }
            sent += chunk.len() as u64;
            // `done` may pass `sent` (a node that did not answer when `base` was taken), so
            // subtract saturating; and give up on a count that stops moving instead of
            // waiting for it forever (a node died, readings were lost).
            let mut stalled_since = (done, Instant::now());
            while sent.saturating_sub(done) > WINDOW {
                done = processed(&cluster_stats(seed).await).saturating_sub(base);
                bar.set_position(done.min(total));
                if done != stalled_since.0 {
                    stalled_since = (done, Instant::now());
                } else if stalled_since.1.elapsed() > STALL {
                    bar.abandon();
                    return Err(format!(
                        "readings stopped being processed: {done} of {sent} sent, none more in {} s",
                        STALL.as_secs()
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < total && Instant::now() < deadline {
        done = processed(&cluster_stats(seed).await).saturating_sub(base);
        bar.set_position(done.min(total));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bar.finish();
    Ok(done)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    let args = Args::parse();
    if let Some(id) = &args.child {
        let seed = args.seed.as_deref().ok_or("--child needs --seed")?;
        return run_child(id, seed, args.shards).await;
    }
    if args.nodes < 3 || args.sensors == 0 || args.readings == 0 || args.shards == 0 {
        return Err(
            "--nodes must be at least 3; --sensors, --readings, --shards at least 1".into(),
        );
    }

    println!(
        "shardik cluster demo: {} nodes (processes on 127.0.0.1), {} sensors in {} shards",
        args.nodes, args.sensors, args.shards
    );
    let seed = start_node("node-0", None, args.shards).await?;
    let seed_addr = seed.cluster.self_node().address.clone();
    let mut children: BTreeMap<String, Child> = BTreeMap::new();
    for i in 1..args.nodes {
        let id = format!("node-{i}");
        children.insert(id.clone(), spawn_child(&args, &id, &seed_addr)?);
    }
    let want = args.nodes;
    let formed = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(30),
        seed.cluster
            .wait_until(|s| s.with_status(MemberStatus::Up).count() == want),
    )
    .await
    .map_err(|_| "the child nodes did not join within 30 s")?;
    println!(
        "{} nodes up in {:.2} s",
        args.nodes,
        formed.elapsed().as_secs_f64()
    );

    // Every node's region registered with the coordinator before the first message.
    wait_allocation(&seed, Duration::from_secs(30), "regions registered", |a| {
        a.per_node.len() == want
    })
    .await?;

    // 1. Readings.
    let ids: Vec<String> = (0..args.sensors)
        .map(|i| format!("sensor-{i:06}"))
        .collect();
    let total = ids.len() as u64 * u64::from(args.readings);
    println!("\n1. {} readings to {} sensors", total, args.sensors);
    let started = Instant::now();
    let done = report_readings(&seed, &ids, 0..args.readings, 0).await?;
    let elapsed = started.elapsed();
    if done != total {
        return Err(format!("lost readings: {done} of {total} processed").into());
    }
    println!(
        "   all {total} processed in {:.2} s ({:.0} readings/s), none lost",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );

    // 2. Where the shards are (after a rebalance round if a region registered late).
    let before =
        wait_allocation(&seed, Duration::from_secs(30), "balance", |a| a.balanced()).await?;
    before.print("2. shards per node", args.shards);

    // 3. Kill one node.
    let victim = format!("node-{}", args.nodes - 1);
    let victim_shards = before.per_node.get(&victim).cloned().unwrap_or_default();
    let orphans: Vec<&String> = ids
        .iter()
        .filter(|id| victim_shards.contains(&shard_of(id, args.shards)))
        .take(200)
        .collect();
    println!(
        "\n3. SIGKILL {victim} ({} shards); waiting for {} of its sensors to answer again",
        victim_shards.len(),
        orphans.len()
    );
    let killed = Instant::now();
    if let Some(mut child) = children.remove(&victim) {
        child.kill().await?;
    }
    let answered = join_all(orphans.iter().map(|id| {
        let sensors = seed.sensors.clone();
        async move {
            loop {
                match sensors
                    .ask(id, SensorMsg::Count, Duration::from_millis(500))
                    .await
                {
                    Ok(_) => return killed.elapsed(),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }));
    let answered = tokio::time::timeout(Duration::from_secs(60), answered)
        .await
        .map_err(|_| "the killed node's sensors did not come back within 60 s")?;
    let failover = answered.into_iter().max().unwrap_or_default();
    let down = seed
        .cluster
        .state()
        .members
        .iter()
        .all(|m| m.node.node_id != victim || m.status == MemberStatus::Down);
    println!(
        "   {victim} {}; its sensors answer again from the survivors {:.2} s after the kill \
         (failure detection, split brain resolver, 500 ms safety margin)",
        if down { "is Down" } else { "was removed" },
        failover.as_secs_f64()
    );
    let after_kill = wait_allocation(&seed, Duration::from_secs(30), "failover", |a| {
        !a.per_node.contains_key(&victim) && a.handoffs == 0
    })
    .await?;
    after_kill.print("   shards per node after the failover", args.shards);

    // 4. A new node joins.
    let newcomer = format!("node-{}", args.nodes);
    println!("\n4. {newcomer} joins; waiting until the shards are balanced");
    let joined = Instant::now();
    children.insert(newcomer.clone(), spawn_child(&args, &newcomer, &seed_addr)?);
    let balanced = wait_allocation(
        &seed,
        Duration::from_secs(60),
        "balance after the join",
        |a| a.per_node.get(&newcomer).is_some_and(|s| !s.is_empty()) && a.balanced(),
    )
    .await?;
    let rebalance = joined.elapsed();
    println!(
        "   balanced {:.2} s after the new process started",
        rebalance.as_secs_f64()
    );
    balanced.print("   shards per node after the join", args.shards);

    // 5. One more round.
    println!("\n5. one more reading to every sensor");
    let base = processed(&cluster_stats(&seed).await);
    let more = report_readings(&seed, &ids, args.readings..args.readings + 1, base).await?;
    let round = ids.len() as u64;
    if more != round {
        return Err(format!("lost readings after the moves: {more} of {round} processed").into());
    }
    println!("   all {round} processed exactly once");

    println!("\nsummary");
    println!("{}", "-".repeat(63));
    row(
        "nodes (processes)",
        format!("{} + 1 joined, 1 killed", args.nodes),
    );
    row("sensor entities", args.sensors.to_string());
    row("readings processed", (total + round).to_string());
    row("readings lost", "0".into());
    row(
        "throughput (phase 1)",
        format!("{:.0} readings/s", total as f64 / elapsed.as_secs_f64()),
    );
    row(
        "SIGKILL to sensors answering",
        format!("{:.2} s", failover.as_secs_f64()),
    );
    row(
        "join to balanced shards",
        format!("{:.2} s", rebalance.as_secs_f64()),
    );

    for child in children.values_mut() {
        // Closing stdin asks the child to hand its shards off and leave.
        drop(child.stdin.take());
    }
    for (_, mut child) in children {
        let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    }
    seed.system.shutdown().await;
    Ok(())
}

fn row(label: &str, value: String) {
    println!("{label:<32} {value:>30}");
}
