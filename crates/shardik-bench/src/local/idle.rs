//! Memory of idle actors, measured in fresh child processes.
//!
//! The suite re-runs its own binary as `shardik-bench probe-idle --kind shardik|baseline
//! --count N`. The probe reads its resident set size from `/proc/self/statm` (pages of
//! 4 KiB), creates `N` actors, sends each exactly one message and waits until every message
//! has been handled and the actors have gone idle, reads the RSS again and prints
//! `(after - before) / N` in bytes.
//!
//! Choice of "idle": **spawned, one message handled, then idle**, for both sides. That is
//! the state of a typical entity between messages, and it is the fairer choice: an actor
//! runtime may defer allocations (shardik allocates mailbox buffers on first use) and a
//! never-messaged actor would hide them. The figure includes the handle the caller keeps
//! (a 16-byte `ActorRef` for shardik, an 8-byte `UnboundedSender` for the baseline) and
//! everything the runtime keeps per actor (shardik's top-level registry entry, the baseline's
//! parked task and channel).
//!
//! The baseline actor is a tokio task looping on `recv()` over its own unbounded mpsc channel.
//! Actors are created in chunks, each chunk started before the next, so that a burst of queued
//! first turns does not leave freed task memory in the allocator's caches and inflate RSS.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::{Args, ValueEnum};
use shardik::prelude::*;
use tokio::sync::mpsc;

use super::{Ctx, SUITE};
use crate::harness::{runtime, Contender};
use crate::report::{Better, Record};

/// RSS growth per idle actor.
pub const NAME: &str = "idle_bytes_per_actor";

/// Page size assumed when reading `/proc/self/statm` (Linux on x86_64 and common aarch64).
const PAGE: u64 = 4096;
/// Actors created (or messaged) before the probe waits for them to catch up.
const CHUNK: usize = 4_096;

/// Which kind of actor a probe creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// shardik actors.
    Shardik,
    /// A tokio task plus an unbounded mpsc channel per actor.
    Baseline,
}

/// Arguments of the hidden `probe-idle` subcommand.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// What to create.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// How many.
    #[arg(long)]
    pub count: usize,
}

/// `idle_bytes_per_actor`: alternates shardik and baseline probes, each a fresh process.
pub fn idle_memory(ctx: &Ctx) -> Vec<Record> {
    let n = ctx.sizes.idle;
    let mut contenders = [
        Contender::new("shardik", || vec![run_probe(Kind::Shardik, n)]),
        Contender::new("task+mpsc", || vec![run_probe(Kind::Baseline, n)]),
    ];
    // Memory is deterministic enough that a warm-up round would only cost time.
    let m = crate::harness::alternate(&mut contenders, 0, ctx.opts.rounds());
    vec![Record::new(
        SUITE,
        NAME,
        m[0][0],
        m[1][0],
        "B",
        Better::Lower,
    )]
}

/// Runs one probe in a child process and returns its bytes per actor.
fn run_probe(kind: Kind, count: usize) -> f64 {
    let exe = std::env::current_exe().expect("the benchmark binary knows its path");
    let kind_arg = match kind {
        Kind::Shardik => "shardik",
        Kind::Baseline => "baseline",
    };
    let out = Command::new(exe)
        .args(["probe-idle", "--kind", kind_arg, "--count"])
        .arg(count.to_string())
        .output()
        .expect("the idle probe process starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        panic!(
            "idle probe ({kind_arg}) failed with {}: {}{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("idle probe printed {stdout:?}, not a number: {e}"))
}

/// Resident set size of this process in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm is readable");
    let resident: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm has a resident field");
    resident * PAGE
}

static STARTED: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicUsize = AtomicUsize::new(0);

/// Waits (sleeping, so the actors get the cores) until `counter` reaches `target`.
async fn until(counter: &AtomicUsize, target: usize) {
    while counter.load(Ordering::Acquire) < target {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The idle actor: counts its start and its messages in process-wide counters, holds nothing.
struct Idle;

impl Actor for Idle {
    type Msg = u64;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        STARTED.fetch_add(1, Ordering::Release);
        Ok(())
    }

    async fn handle(&mut self, _msg: u64, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        HANDLED.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

/// The `probe-idle` subcommand: prints the RSS growth per idle actor in bytes.
pub fn probe(args: &ProbeArgs) {
    let (kind, count) = (args.kind, args.count.max(1));
    let rt = runtime();
    let per_actor = rt.block_on(async move {
        tokio::spawn(async move {
            match kind {
                Kind::Shardik => probe_shardik(count).await,
                Kind::Baseline => probe_baseline(count).await,
            }
        })
        .await
        .expect("the probe task panicked")
    });
    println!("{per_actor:.1}");
    // The actors are still alive on purpose; exit without tearing them all down.
    std::process::exit(0);
}

async fn probe_shardik(n: usize) -> f64 {
    let system = ActorSystem::new("bench-idle");
    // Warm the runtime and the system's lazy parts before the first reading.
    let warm = system.spawn(Idle);
    warm.tell(0);
    until(&HANDLED, 1).await;
    let (started0, handled0) = (
        STARTED.load(Ordering::Acquire),
        HANDLED.load(Ordering::Acquire),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut refs = Vec::with_capacity(n);
    let before = rss_bytes();
    while refs.len() < n {
        let chunk = CHUNK.min(n - refs.len());
        for _ in 0..chunk {
            refs.push(system.spawn(Idle));
        }
        until(&STARTED, started0 + refs.len()).await;
    }
    for (i, r) in refs.iter().enumerate() {
        r.tell(i as u64);
        if (i + 1) % CHUNK == 0 {
            until(&HANDLED, handled0 + i + 1).await;
        }
    }
    until(&HANDLED, handled0 + n).await;
    // Let the last turns end (and give their buffers back) before reading.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = rss_bytes();
    std::hint::black_box(&refs);
    after.saturating_sub(before) as f64 / n as f64
}

async fn probe_baseline(n: usize) -> f64 {
    fn spawn_one() -> mpsc::UnboundedSender<u64> {
        let (tx, mut rx) = mpsc::unbounded_channel::<u64>();
        tokio::spawn(async move {
            STARTED.fetch_add(1, Ordering::Release);
            while rx.recv().await.is_some() {
                HANDLED.fetch_add(1, Ordering::Release);
            }
        });
        tx
    }
    let warm = spawn_one();
    let _ = warm.send(0);
    until(&HANDLED, 1).await;
    let (started0, handled0) = (
        STARTED.load(Ordering::Acquire),
        HANDLED.load(Ordering::Acquire),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut senders = Vec::with_capacity(n);
    let before = rss_bytes();
    while senders.len() < n {
        let chunk = CHUNK.min(n - senders.len());
        for _ in 0..chunk {
            senders.push(spawn_one());
        }
        until(&STARTED, started0 + senders.len()).await;
    }
    for (i, tx) in senders.iter().enumerate() {
        let _ = tx.send(i as u64);
        if (i + 1) % CHUNK == 0 {
            until(&HANDLED, handled0 + i + 1).await;
        }
    }
    until(&HANDLED, handled0 + n).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = rss_bytes();
    std::hint::black_box(&senders);
    after.saturating_sub(before) as f64 / n as f64
}
