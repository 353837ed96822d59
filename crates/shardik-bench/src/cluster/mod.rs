//! The `cluster` suite: failure detection and membership convergence of `shardik-cluster`
//! over real TCP on loopback, with its default timing.
//!
//! | record | what |
//! |---|---|
//! | `cluster_unreachable_after_sigkill_{3,5}nodes_s` | seconds from SIGKILL of one node (a child process) until every survivor (in this process) sees it unreachable |
//! | `cluster_down_after_sigkill_{3,5}nodes_s` | seconds from that SIGKILL until every survivor sees it `Down` (or already removed) |
//! | `cluster_converge_{3,5,10,20}nodes_s` | seconds from starting N nodes (in this process) until every one sees all N `Up` |
//! | `cluster_busy_5nodes_min_without_false_down` | minutes that 5 live nodes ran with both cores saturated by two spinning threads before any node was flagged unreachable, downed or stopped (the whole window, 1 min, if none) |
//! | `cluster_busy_5nodes_max_heartbeat_gap_s` | the longest gap between two heartbeats of one node seen during that minute |
//!
//! The killed node is this binary re-run as the hidden `cluster-peer` subcommand (module
//! [`peer`]): it joins through the seed it is given, prints `READY <addr> <incarnation>` once it
//! is `Up`, and serves until it is killed or its stdin closes.
//!
//! Baselines. There is no same-run peer for a failure detector, so the detection records are
//! compared with Akka's documented defaults (1 s heartbeats, 3 s acceptable pause: a crashed
//! node is unreachable after about 5.5 s; the split brain resolver's 20 s `stable-after` then
//! downs it after about 25.5 s). The target is under 5 s to `Down`. The convergence
//! records are compared with the same membership protocol (the same `MembershipNode`s and
//! timing) run on an in-memory network with instant delivery, stepped in 10 ms of simulated
//! time ([`sim`]): the time the protocol itself needs, so the ratio shows what the real
//! transport and the tokio driver add (or save: the simulation only acts on whole steps).
//!
//! The busy records compare with the target: the whole window without a false down, and the
//! silence after which the default detector suspects a node (about 2.3 s: phi 8 with the
//! heartbeat interval, the acceptable pause and the minimum standard deviation).
//!
//! Each SIGKILL and convergence record is the median over the rounds (default 5, 1 with
//! `--quick`); the busy window is one minute (5 s with `--quick`).

pub mod peer;
pub mod sim;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardik::prelude::*;
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::{Cluster, ClusterConfig, ClusterState, Event};

use crate::report::{Better, Record};
use crate::SuiteOptions;

/// The suite's name in every record.
pub const SUITE: &str = "cluster";
/// Cluster name of the benchmark nodes.
pub const CLUSTER: &str = "bench-cluster";
/// Shared secret of the benchmark nodes.
pub const SECRET: &[u8] = b"shardik-bench cluster suite secret, 32+ bytes";
/// Akka: seconds from a crash to unreachable with its defaults (documented ~5.5 s).
pub const AKKA_UNREACHABLE_S: f64 = 5.5;
/// Akka: seconds from a crash to `Down` with its defaults (5.5 s + 20 s stable-after).
pub const AKKA_DOWN_S: f64 = 25.5;

/// A node configuration of the suite: default cluster timing, loopback port 0.
pub fn node_config(node_id: &str) -> ClusterConfig {
    let mut c = ClusterConfig::new(CLUSTER, node_id).secret(SECRET.to_vec());
    c.remote = c
        .remote
        .backoff(Duration::from_millis(10), Duration::from_millis(500));
    c
}

/// Waits until `pred` holds on `node`, or panics after `timeout`.
async fn wait(
    node: &Cluster,
    what: &str,
    timeout: Duration,
    pred: impl FnMut(&ClusterState) -> bool,
) {
    if tokio::time::timeout(timeout, node.wait_until(pred))
        .await
        .is_err()
    {
        panic!("{what}: not within {timeout:?} on {}", node.self_node());
    }
}

/// `n` in-process nodes, `n0` forming the cluster and the others joining it; returns once
/// every node sees all of them `Up`.
async fn in_process(n: usize, prefix: &str) -> Vec<(ActorSystem, Cluster)> {
    let mut nodes: Vec<(ActorSystem, Cluster)> = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}{i}");
        let system = ActorSystem::new(id.clone());
        let mut cfg = node_config(&id);
        if let Some((_, first)) = nodes.first() {
            cfg = cfg.seed_nodes([first.self_node().address.clone()]);
        }
        let cluster = Cluster::start(&system, cfg)
            .await
            .expect("a benchmark node starts");
        nodes.push((system, cluster));
    }
    let ids: Vec<UniqueAddress> = nodes.iter().map(|(_, c)| c.self_node().clone()).collect();
    for (_, c) in &nodes {
        wait(c, "all up", Duration::from_secs(60), |s| s.all_up(&ids)).await;
    }
    nodes
}

async fn stop_nodes(nodes: Vec<(ActorSystem, Cluster)>) {
    for (system, cluster) in nodes {
        cluster.shutdown().await;
        system.shutdown().await;
    }
}

/// The killed node: a child process running `cluster-peer`.
struct PeerProcess {
    child: Child,
    _stdin: ChildStdin,
    id: UniqueAddress,
}

fn start_peer(seed: &str) -> PeerProcess {
    let exe = std::env::current_exe().expect("the benchmark binary knows its path");
    let mut child = Command::new(exe)
        .args(["cluster-peer", "--seed", seed, "--node-id", "victim"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the cluster peer process starts");
    let stdin = child.stdin.take().expect("piped stdin");
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
    PeerProcess {
        child,
        _stdin: stdin,
        id: UniqueAddress::new(addr, "victim", incarnation),
    }
}

/// One SIGKILL round with `n` nodes: seconds to unreachable and to `Down` on every survivor.
fn sigkill_round(rt: &tokio::runtime::Runtime, n: usize) -> (f64, f64) {
    let survivors = rt.block_on(in_process(n - 1, "s"));
    let seed = survivors[0].1.self_node().address.clone();
    let mut peer = start_peer(&seed);
    let victim = peer.id.clone();
    let mut ids: Vec<UniqueAddress> = survivors
        .iter()
        .map(|(_, c)| c.self_node().clone())
        .collect();
    ids.push(victim.clone());
    rt.block_on(async {
        for (_, c) in &survivors {
            wait(c, "victim up", Duration::from_secs(30), |s| s.all_up(&ids)).await;
        }
    });
    let clusters: Vec<Cluster> = survivors.iter().map(|(_, c)| c.clone()).collect();
    let (unreachable, down) = rt.block_on(async move {
        let killed = Instant::now();
        peer.child.kill().expect("SIGKILL");
        let unreachable = {
            let clusters = clusters.clone();
            let victim = victim.clone();
            tokio::spawn(async move {
                for c in &clusters {
                    let v = victim.clone();
                    wait(c, "unreachable", Duration::from_secs(60), move |s| {
                        s.unreachable.contains(&v)
                            || s.member(&v).is_none_or(|m| m.status == MemberStatus::Down)
                    })
                    .await;
                }
                killed.elapsed()
            })
        };
        for c in &clusters {
            let v = victim.clone();
            wait(c, "down", Duration::from_secs(60), move |s| {
                s.member(&v).is_none_or(|m| m.status == MemberStatus::Down)
            })
            .await;
        }
        let down = killed.elapsed();
        let unreachable = unreachable.await.expect("the unreachable waiter");
        let _ = peer.child.wait();
        (unreachable.as_secs_f64(), down.as_secs_f64())
    });
    rt.block_on(stop_nodes(survivors));
    (unreachable, down)
}

/// The silence after which the default detector suspects a node that sent heartbeats
/// regularly: the smallest gap with phi at the threshold.
fn suspicion_gap_s(cfg: &ClusterConfig) -> f64 {
    let mean = (cfg.heartbeat_interval + cfg.phi.acceptable_heartbeat_pause).as_secs_f64() * 1e3;
    let sd = cfg.phi.min_std_deviation.as_secs_f64() * 1e3;
    let mut ms = 0.0;
    while shardik_cluster::phi::phi(ms, mean, sd) < cfg.phi.threshold && ms < 600_000.0 {
        ms += 1.0;
    }
    ms / 1e3
}

/// Five live nodes while two spinning threads saturate both cores for `window`: how long
/// until the first false failure (or the whole window), and the largest heartbeat gap.
fn busy_round(rt: &tokio::runtime::Runtime, window: Duration) -> (Duration, Duration) {
    let nodes = rt.block_on(in_process(5, "b"));
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..crate::harness::WORKERS)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let started = Instant::now();
    let watchers: Vec<_> = nodes
        .iter()
        .map(|(_, c)| {
            let mut sub = c.subscribe();
            rt.spawn(async move {
                loop {
                    match sub.recv().await {
                        Ok(Event::Cluster(
                            ClusterEvent::Unreachable(_) | ClusterEvent::MemberDowned(_),
                        ))
                        | Ok(Event::Stopped(_))
                        | Err(_) => return started.elapsed(),
                        Ok(_) => {}
                    }
                }
            })
        })
        .collect();
    let first_failure = rt.block_on(async move {
        let mut first = window;
        for w in watchers {
            if let Ok(Ok(t)) = tokio::time::timeout_at((started + window).into(), w).await {
                first = first.min(t);
            }
        }
        first
    });
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        let _ = s.join();
    }
    let gap = nodes
        .iter()
        .map(|(_, c)| c.stats().max_heartbeat_gap)
        .max()
        .unwrap_or_default();
    rt.block_on(stop_nodes(nodes));
    (first_failure, gap)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn rounds(opts: &SuiteOptions) -> usize {
    if opts.quick {
        opts.rounds.unwrap_or(1).max(1)
    } else {
        opts.rounds()
    }
}

/// Runs the selected benchmarks of the suite, handing each record to `emit` as it is ready.
pub fn run(opts: &SuiteOptions, emit: &mut dyn FnMut(Record)) {
    let rt = crate::harness::runtime();
    let rounds = rounds(opts);
    for n in [3usize, 5] {
        let unreachable_name = format!("cluster_unreachable_after_sigkill_{n}nodes_s");
        let down_name = format!("cluster_down_after_sigkill_{n}nodes_s");
        if !opts.selects(&unreachable_name) && !opts.selects(&down_name) {
            continue;
        }
        eprintln!("[cluster] SIGKILL with {n} nodes, {rounds} rounds ...");
        let (mut u, mut d) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (a, b) = sigkill_round(&rt, n);
            eprintln!("[cluster]   unreachable after {a:.2} s, Down after {b:.2} s");
            u.push(a);
            d.push(b);
        }
        for (name, v, base) in [
            (unreachable_name, u, AKKA_UNREACHABLE_S),
            (down_name, d, AKKA_DOWN_S),
        ] {
            if opts.selects(&name) {
                emit(Record::new(
                    SUITE,
                    name,
                    median(v),
                    base,
                    "s",
                    Better::Lower,
                ));
            }
        }
    }
    let sizes: &[usize] = if opts.quick { &[3, 5] } else { &[3, 5, 10, 20] };
    for &n in sizes {
        let name = format!("cluster_converge_{n}nodes_s");
        if !opts.selects(&name) {
            continue;
        }
        eprintln!("[cluster] {n} nodes converge, {rounds} rounds ...");
        let mut real = Vec::new();
        let mut simulated = Vec::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let nodes = rt.block_on(in_process(n, "c"));
            let took = started.elapsed().as_secs_f64();
            rt.block_on(stop_nodes(nodes));
            let base = sim::converge_ms(n, &node_config("sim")) as f64 / 1000.0;
            eprintln!("[cluster]   all Up after {took:.3} s (in-memory protocol: {base:.3} s)");
            real.push(took);
            simulated.push(base);
        }
        emit(Record::new(
            SUITE,
            name,
            median(real),
            median(simulated),
            "s",
            Better::Lower,
        ));
    }
    let false_down = "cluster_busy_5nodes_min_without_false_down";
    let gap = "cluster_busy_5nodes_max_heartbeat_gap_s";
    if opts.selects(false_down) || opts.selects(gap) {
        let window = if opts.quick {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(60)
        };
        eprintln!("[cluster] 5 nodes, both cores saturated, {window:?} ...");
        let (first_failure, max_gap) = busy_round(&rt, window);
        eprintln!(
            "[cluster]   first false failure after {first_failure:?} (window {window:?}), largest heartbeat gap {max_gap:?}"
        );
        let minutes = |d: Duration| d.as_secs_f64() / 60.0;
        if opts.selects(false_down) {
            emit(Record::new(
                SUITE,
                false_down,
                minutes(first_failure),
                minutes(window),
                "min",
                Better::Higher,
            ));
        }
        if opts.selects(gap) {
            emit(Record::new(
                SUITE,
                gap,
                max_gap.as_secs_f64(),
                suspicion_gap_s(&node_config("gap")),
                "s",
                Better::Lower,
            ));
        }
    }
}
