//! The `remote` suite: two OS processes on loopback, shardik-remote against raw tokio TCP.
//!
//! The suite re-runs its own binary as `shardik-bench remote-peer` (module [`peer`]): the
//! child starts the receiving shardik nodes (plain and TLS) and the raw TCP servers, prints
//! one `READY {json}` line with their addresses on stdout, and serves until its stdin closes.
//! This process is the sending side of every benchmark.
//!
//! | module | benchmarks |
//! |---|---|
//! | [`tell`] | `remote_tell_1pair_msgs_per_s`, `remote_tell_4pairs_msgs_per_s`, `remote_tell_tls_1pair_msgs_per_s` |
//! | [`ask`] | `remote_ask_seq_p50_us`, `remote_ask_seq_p99_us`, `remote_ask_{1k,10k,100k}_per_s_{p50,p99}_us` |
//! | [`codec`] | `remote_encode_ns`, `remote_decode_ns` (in process) |
//!
//! Baselines ([`raw`]): length-prefixed frames over a plain tokio `TcpStream` (or tokio-rustls
//! with the same certificates), written by a writer task that batches up to 1 024 frames per
//! `write_all` from a bounded queue, exactly like shardik's writer, but with no
//! serialization, no envelope and no actor at either end: the server counts or echoes frames
//! on its reader task. Every benchmark alternates shardik and its baseline over several rounds
//! in this one run and reports the medians (see [`crate::harness::alternate`]).

pub mod ask;
pub mod codec;
pub mod peer;
pub mod raw;
pub mod tell;
pub mod tls;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shardik::prelude::*;
use shardik::remote::{Remote, RemoteConfig};

use crate::report::Record;
use crate::SuiteOptions;

/// The suite's name in every record.
pub const SUITE: &str = "remote";
/// Cluster name of the benchmark nodes.
pub const CLUSTER: &str = "bench";
/// Shared secret of the benchmark nodes (the handshake is authenticated, as in production).
pub const SECRET: &[u8] = b"shardik-bench remote suite secret, 32+ bytes";
/// Size of the payload of a throughput message.
pub const PAYLOAD: usize = 100;
/// Sinks registered on the peer (one per sender of the four-pair benchmark).
pub const SINKS: usize = 4;
/// Path of the echo actor on the peer.
pub const ECHO_PATH: &str = "/user/echo";
/// Time allowed to any one ask of the suite.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// Path of sink `i` on the peer.
pub fn sink_path(i: usize) -> String {
    format!("/user/sink{i}")
}

/// The message of every shardik benchmark of the suite.
#[derive(Debug, Serialize, Deserialize)]
pub enum BenchMsg {
    /// Counted by a sink.
    Data {
        /// [`PAYLOAD`] bytes.
        payload: Bytes,
    },
    /// A sink answers how many `Data` it handled since the last `Count`, and starts over.
    Count {
        /// Where the count goes.
        reply: ReplyTo<u64>,
    },
    /// The echo actor answers `n`.
    Echo {
        /// Echoed back.
        n: u64,
        /// Where the answer goes.
        reply: ReplyTo<u64>,
    },
}

/// The 100-byte payload every throughput message carries.
pub fn payload() -> Bytes {
    Bytes::from((0..PAYLOAD).map(|i| i as u8).collect::<Vec<u8>>())
}

/// A node configuration of the suite: cluster, secret, loopback port 0, defaults otherwise.
pub fn node_config(node_id: &str) -> RemoteConfig {
    RemoteConfig::new(CLUSTER, node_id).secret(SECRET.to_vec())
}

/// Problem sizes: the full run, or small ones for `--quick`.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Tells of the one-pair throughput benchmark (plain TCP).
    pub tell_1pair: u64,
    /// Tells per pair of the four-pair throughput benchmark.
    pub tell_4pairs: u64,
    /// Tells of the one-pair TLS throughput benchmark.
    pub tell_tls: u64,
    /// Sequential asks per round.
    pub ask_seq: usize,
    /// How long each open-loop rate runs per round.
    pub open_loop: Duration,
    /// Messages encoded and decoded per round of the codec benchmarks.
    pub codec: usize,
}

impl Sizes {
    /// The sizes for `opts`.
    pub fn for_options(opts: &SuiteOptions) -> Sizes {
        if opts.quick {
            Sizes {
                tell_1pair: 20_000,
                tell_4pairs: 5_000,
                tell_tls: 10_000,
                ask_seq: 300,
                open_loop: Duration::from_millis(100),
                codec: 10_000,
            }
        } else {
            Sizes {
                tell_1pair: 1_000_000,
                tell_4pairs: 500_000,
                tell_tls: 500_000,
                ask_seq: 20_000,
                open_loop: Duration::from_secs(1),
                codec: 1_000_000,
            }
        }
    }
}

/// The receiving process and this process's nodes, set up on first use.
pub struct Net {
    /// The child process (stops when dropped).
    _peer: PeerProcess,
    /// Addresses the child listens on.
    pub addrs: peer::PeerAddrs,
    /// This process's plain node.
    pub node: Remote,
    /// This process's TLS node.
    pub tls_node: Remote,
    /// Client side of the raw TLS lane.
    pub raw_tls: tls::RawTls,
    /// The actor systems of the two nodes (kept alive).
    _systems: Vec<ActorSystem>,
}

/// What a benchmark gets: options, sizes, the runtime and the two-process set-up.
pub type Ctx = crate::harness::SuiteCtx<Sizes, Net>;

/// The receiving child process; closing its stdin (on drop) makes it exit.
pub struct PeerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    tls_dir: PathBuf,
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
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
        let _ = std::fs::remove_dir_all(&self.tls_dir);
    }
}

fn start_net(rt: &tokio::runtime::Runtime) -> Net {
    let tls_dir = tls::write_certificates().expect("test certificates are written");
    let exe = std::env::current_exe().expect("the benchmark binary knows its path");
    let mut child = Command::new(exe)
        .arg("remote-peer")
        .arg("--tls-dir")
        .arg(&tls_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the remote peer process starts");
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the peer prints its addresses");
    let addrs: peer::PeerAddrs = line
        .strip_prefix("READY ")
        .and_then(|json| serde_json::from_str(json.trim()).ok())
        .unwrap_or_else(|| panic!("the peer printed {line:?} instead of READY {{addresses}}"));
    let peer = PeerProcess {
        child,
        stdin,
        tls_dir: tls_dir.clone(),
    };
    let tls_config = tls::node_tls(&tls_dir).expect("TLS configuration loads");
    let raw_tls = tls::RawTls::load(&tls_dir).expect("raw TLS configuration loads");
    let (node, tls_node, systems) = rt.block_on(async {
        let sys = ActorSystem::new("bench-remote-a");
        let node = Remote::start(&sys, node_config("bench-a"))
            .await
            .expect("the plain node starts");
        node.connect(&addrs.node)
            .await
            .expect("the plain node connects to the peer");
        let sys_tls = ActorSystem::new("bench-remote-a-tls");
        let tls_node = Remote::start(&sys_tls, node_config("bench-a-tls").tls(tls_config))
            .await
            .expect("the TLS node starts");
        tls_node
            .connect(&addrs.tls_node)
            .await
            .expect("the TLS node connects to the peer");
        (node, tls_node, vec![sys, sys_tls])
    });
    Net {
        _peer: peer,
        addrs,
        node,
        tls_node,
        raw_tls,
        _systems: systems,
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
            records: &[tell::ONE_PAIR],
            run: tell::one_pair,
        },
        Bench {
            records: &[tell::FOUR_PAIRS],
            run: tell::four_pairs,
        },
        Bench {
            records: &[tell::TLS_ONE_PAIR],
            run: tell::tls_one_pair,
        },
        Bench {
            records: &[ask::SEQ_P50, ask::SEQ_P99],
            run: ask::sequential,
        },
        Bench {
            records: ask::OPEN_LOOP,
            run: ask::open_loop,
        },
        Bench {
            records: &[codec::ENCODE],
            run: codec::encode,
        },
        Bench {
            records: &[codec::DECODE],
            run: codec::decode,
        },
    ]
}

/// Runs the selected benchmarks of the suite, handing each record to `emit` as it is ready.
pub fn run(opts: &SuiteOptions, emit: &mut dyn FnMut(Record)) {
    let ctx = Ctx::new(opts, Sizes::for_options(opts), start_net);
    let suite_start = Instant::now();
    for bench in benches() {
        if !bench.records.iter().any(|name| opts.selects(name)) {
            continue;
        }
        let start = Instant::now();
        eprintln!("[remote] {} ...", bench.records.join(", "));
        let records = (bench.run)(&ctx);
        eprintln!("[remote]   done in {:.1} s", start.elapsed().as_secs_f64());
        for record in records {
            if opts.selects(&record.bench) {
                emit(record);
            }
        }
    }
    let (net, rt) = ctx.into_parts();
    if let Some(net) = net {
        rt.block_on(async {
            net.node.shutdown().await;
            net.tls_node.shutdown().await;
        });
        drop(net);
    }
    eprintln!(
        "[remote] suite finished in {:.1} s",
        suite_start.elapsed().as_secs_f64()
    );
}
