//! The `sharding` suite: cluster sharding on the seed systems' workload, two processes on
//! loopback (this one and a child node), an account entity (deposit, get balance), 100
//! entities on 100 shards (one entity per shard, [`account::one_id_per_shard`]).
//!
//! | module | records |
//! |---|---|
//! | [`traffic`] | `sharding_tell_{local,remote}_msgs_per_s`, `sharding_ask_seq_{local,remote}_{per_s,p50_us,p99_us}`, `sharding_ask_concurrent_{local,remote}_per_s` |
//! | [`failover`] | `sharding_failover_after_sigkill_s` (3 nodes: this one and two children) |
//! | [`rebalance`] | `sharding_rebalance_after_join_1000shards_s` |
//! | [`activation`] | `sharding_activation_per_s` (one node in this process), `sharding_activation_remembered_per_s` (two nodes in this process) |
//!
//! The child is this binary re-run as the hidden `sharding-peer` subcommand ([`peer`]). After
//! both nodes are `Up` and every entity answered once (which allocates every shard: the
//! coordinator, on this node as the oldest, spreads them least-shards-first, about 50 per
//! node), the entities whose shard this node hosts are the *local* ones and the others the
//! *remote* ones; every driver runs in this process.
//!
//! Baselines, in the same run: the local suite's channel-owner pattern
//! ([`crate::local::shard::owners`]) for local entities, and the remote suite's raw TCP lane
//! ([`crate::remote::raw`], served by the child) for remote ones. Failover is compared with
//! the membership's own time from SIGKILL to `Down` in the same round, rebalance with Akka's
//! default rebalance interval (10 s; its current algorithm balances in one or two rounds),
//! activation with spawning plain shardik actors ([`crate::local::spawn`]).
//!
//! Every record is the median over the rounds (failover and rebalance: rounds of their own,
//! 3 by default and 1 with `--quick`).

pub mod account;
pub mod activation;
pub mod failover;
pub mod peer;
pub mod rebalance;
pub mod traffic;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use shardik::prelude::*;
use shardik::sharding::cluster::ClusterSharding;
use shardik_cluster::member::UniqueAddress;
use shardik_cluster::runtime::Cluster;

use account::{AccountMsg, ACCOUNT};

use crate::report::Record;
use crate::SuiteOptions;

/// The suite's name in every record.
pub const SUITE: &str = "sharding";
/// Shards (and entities) of the traffic benchmarks.
pub const SHARDS: u32 = 100;

/// Problem sizes: the full run, or small ones for `--quick`.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Tells per round to local entities.
    pub tell_local: u64,
    /// Tells per round to remote entities.
    pub tell_remote: u64,
    /// Sequential asks per round to local entities.
    pub ask_seq_local: usize,
    /// Sequential asks per round to remote entities.
    pub ask_seq_remote: usize,
    /// Asks per round with 100 in flight, local entities.
    pub ask_concurrent_local: u64,
    /// Asks per round with 100 in flight, remote entities.
    pub ask_concurrent_remote: u64,
    /// New entities per activation round.
    pub activation: usize,
    /// New entities per remembered activation round.
    pub activation_remembered: usize,
    /// Rounds of the failover and rebalance benchmarks.
    pub cluster_rounds: usize,
}

impl Sizes {
    /// The sizes for `opts`.
    pub fn for_options(opts: &SuiteOptions) -> Sizes {
        if opts.quick {
            Sizes {
                tell_local: 20_000,
                tell_remote: 20_000,
                ask_seq_local: 1_000,
                ask_seq_remote: 300,
                ask_concurrent_local: 5_000,
                ask_concurrent_remote: 2_000,
                activation: 10_000,
                activation_remembered: 10_000,
                cluster_rounds: opts.rounds.unwrap_or(1).max(1),
            }
        } else {
            Sizes {
                tell_local: 2_000_000,
                tell_remote: 1_000_000,
                ask_seq_local: 100_000,
                ask_seq_remote: 20_000,
                ask_concurrent_local: 500_000,
                ask_concurrent_remote: 200_000,
                activation: 1_000_000,
                activation_remembered: 200_000,
                cluster_rounds: opts.rounds.unwrap_or(3).max(1),
            }
        }
    }
}

/// A child node process; closing its stdin (on drop) makes it leave and exit.
pub struct PeerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The child's cluster identity.
    pub id: UniqueAddress,
    /// The child's raw TCP server.
    pub raw_addr: String,
}

impl PeerProcess {
    /// Starts `sharding-peer` joining through `seed` with `shards` account shards; returns once
    /// it is `Up` (in its own view) and printed its addresses.
    pub fn start(seed: &str, node_id: &str, shards: u32) -> PeerProcess {
        let exe = std::env::current_exe().expect("the benchmark binary knows its path");
        let mut child = Command::new(exe)
            .args(["sharding-peer", "--seed", seed, "--node-id", node_id])
            .args(["--shards", &shards.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the sharding peer process starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the peer prints READY");
        let mut parts = line
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("the peer printed {line:?} instead of READY"))
            .split_whitespace();
        let addr = parts.next().expect("address").to_string();
        let incarnation = parts
            .next()
            .and_then(|s| s.parse().ok())
            .expect("incarnation");
        let raw_addr = parts.next().expect("raw address").to_string();
        PeerProcess {
            child,
            stdin,
            id: UniqueAddress::new(addr, node_id, incarnation),
            raw_addr,
        }
    }

    /// Kills the child with SIGKILL and returns when it was sent.
    pub fn sigkill(&mut self) -> Instant {
        let at = Instant::now();
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
        at
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
    }
}

/// Waits until `pred` holds on `node`, or panics after `timeout`.
pub async fn wait_cluster(
    node: &Cluster,
    what: &str,
    timeout: Duration,
    pred: impl FnMut(&shardik_cluster::runtime::ClusterState) -> bool,
) {
    if tokio::time::timeout(timeout, node.wait_until(pred))
        .await
        .is_err()
    {
        panic!("{what}: not within {timeout:?} on {}", node.self_node());
    }
}

/// This process's node, the child, and which entities live where.
pub struct Net {
    /// The child node (stops when dropped).
    pub peer: PeerProcess,
    /// This node's actor system.
    pub system: ActorSystem,
    /// This node.
    pub cluster: Cluster,
    /// The account region on this node.
    pub region: Region<AccountMsg>,
    /// Entities hosted on this node.
    pub local_ids: Vec<&'static str>,
    /// Entities hosted on the child.
    pub remote_ids: Vec<&'static str>,
}

/// What a benchmark gets: options, sizes, the runtime and the two-process set-up.
pub type Ctx = crate::harness::SuiteCtx<Sizes, Net>;

/// Waits until the coordinator of the account type on `cluster`'s node (the oldest) has `n`
/// regions registered, so the first allocations spread over every node.
pub async fn wait_regions(cluster: &Cluster, n: usize) {
    let sharding = ClusterSharding::get(cluster);
    let start = Instant::now();
    while sharding
        .coordinator(ACCOUNT)
        .is_none_or(|s| s.state.regions.len() < n)
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{n} regions not registered within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Allocates every shard by asking each of `ids` once (retrying while the coordinator starts).
pub async fn touch_all(region: &Region<AccountMsg>, ids: &[&'static str]) {
    let mut pending = futures_util::stream::FuturesUnordered::new();
    for &id in ids {
        let region = region.clone();
        pending.push(async move {
            account::balance(&region, id, Duration::from_secs(1), Duration::from_secs(60)).await
        });
    }
    use futures_util::StreamExt;
    while pending.next().await.is_some() {}
}

fn start_net(rt: &tokio::runtime::Runtime) -> Net {
    let (system, cluster, region) = rt.block_on(account::start_node("main", None, SHARDS));
    let peer = PeerProcess::start(&cluster.self_node().address, "peer-1", SHARDS);
    let ids = account::one_id_per_shard(SHARDS);
    let (local_ids, remote_ids) = rt.block_on(async {
        let all = [cluster.self_node().clone(), peer.id.clone()];
        wait_cluster(&cluster, "both up", Duration::from_secs(30), |s| {
            s.all_up(&all)
        })
        .await;
        wait_regions(&cluster, 2).await;
        touch_all(&region, &ids).await;
        let hosted = ClusterSharding::get(&cluster)
            .hosted_shards(ACCOUNT)
            .expect("the account type runs here");
        let (local, remote): (Vec<&'static str>, Vec<&'static str>) = ids
            .iter()
            .partition(|id| hosted.contains(&region.shard_of(id)));
        (local, remote)
    });
    eprintln!(
        "[sharding] {} entities on this node, {} on the child",
        local_ids.len(),
        remote_ids.len()
    );
    assert!(
        !local_ids.is_empty() && !remote_ids.is_empty(),
        "the coordinator placed every shard on one node"
    );
    Net {
        peer,
        system,
        cluster,
        region,
        local_ids,
        remote_ids,
    }
}

/// One benchmark: the records it can produce (for `--filter`) and how to run it.
pub struct Bench {
    /// Names of the records it produces.
    pub records: &'static [&'static str],
    /// Runs it and returns its records.
    pub run: fn(&Ctx) -> Vec<Record>,
}

fn benches() -> Vec<Bench> {
    vec![
        Bench {
            records: &[traffic::TELL_LOCAL],
            run: traffic::tell_local,
        },
        Bench {
            records: &[traffic::TELL_REMOTE],
            run: traffic::tell_remote,
        },
        Bench {
            records: traffic::ASK_SEQ_LOCAL,
            run: traffic::ask_seq_local,
        },
        Bench {
            records: traffic::ASK_SEQ_REMOTE,
            run: traffic::ask_seq_remote,
        },
        Bench {
            records: &[traffic::ASK_CONCURRENT_LOCAL],
            run: traffic::ask_concurrent_local,
        },
        Bench {
            records: &[traffic::ASK_CONCURRENT_REMOTE],
            run: traffic::ask_concurrent_remote,
        },
        Bench {
            records: &[activation::NAME],
            run: activation::activation,
        },
        Bench {
            records: &[activation::REMEMBERED],
            run: activation::activation_remembered,
        },
        Bench {
            records: &[failover::NAME],
            run: failover::failover,
        },
        Bench {
            records: &[rebalance::NAME],
            run: rebalance::rebalance,
        },
    ]
}

/// The targets: record, bound, and whether the value must be at least (true) or at
/// most (false) the bound. Tell and concurrent-ask rows: 10x actor-ts's best figure in
/// `../shared/reference/numbers.md` (tell local 210 000/s, tell remote 103 000/s,
/// concurrent ask 27 000/s).
pub const TARGETS: &[(&str, f64, bool)] = &[
    (traffic::TELL_LOCAL, 2_100_000.0, true),
    (traffic::TELL_REMOTE, 1_030_000.0, true),
    (traffic::ASK_CONCURRENT_LOCAL, 270_000.0, true),
    (traffic::ASK_CONCURRENT_REMOTE, 270_000.0, true),
    ("sharding_ask_seq_local_p50_us", 2.0, false),
    ("sharding_ask_seq_remote_p50_us", 50.0, false),
    (failover::NAME, 5.0, false),
    (rebalance::NAME, 3.0, false),
];

/// Runs the selected benchmarks of the suite, handing each record to `emit` as it is ready.
pub fn run(opts: &SuiteOptions, emit: &mut dyn FnMut(Record)) {
    let ctx = Ctx::new(opts, Sizes::for_options(opts), start_net);
    let suite_start = Instant::now();
    let mut targets = Vec::new();
    for bench in benches() {
        if !bench.records.iter().any(|name| opts.selects(name)) {
            continue;
        }
        let start = Instant::now();
        eprintln!("[sharding] {} ...", bench.records.join(", "));
        let records = (bench.run)(&ctx);
        eprintln!(
            "[sharding]   done in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        for record in records {
            if opts.selects(&record.bench) {
                if let Some(&(_, bound, at_least)) =
                    TARGETS.iter().find(|(name, _, _)| *name == record.bench)
                {
                    let met = if at_least {
                        record.value >= bound
                    } else {
                        record.value <= bound
                    };
                    targets.push(format!(
                        "[sharding] target {}: {} {} {bound} {}: {}",
                        record.bench,
                        record.value,
                        if at_least { ">=" } else { "<=" },
                        record.unit,
                        if met { "met" } else { "NOT met" }
                    ));
                }
                emit(record);
            }
        }
    }
    let (net, rt) = ctx.into_parts();
    if let Some(net) = net {
        let Net {
            peer,
            system,
            cluster,
            region,
            ..
        } = net;
        drop(region);
        drop(peer);
        rt.block_on(async {
            cluster.shutdown().await;
            system.shutdown().await;
        });
    }
    for t in targets {
        eprintln!("{t}");
    }
    eprintln!(
        "[sharding] suite finished in {:.1} s",
        suite_start.elapsed().as_secs_f64()
    );
}
