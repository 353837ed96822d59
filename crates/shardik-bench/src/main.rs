//! shardik's benchmarks, each against a baseline measured in the same process run.
//!
//! ```text
//! cargo run --release -p shardik-bench -- local            # human table
//! cargo run --release -p shardik-bench -- local --json     # one JSON record per line
//! cargo run --release -p shardik-bench -- local --quick --filter ask
//! cargo run --release -p shardik-bench -- remote           # two processes on loopback
//! cargo run --release -p shardik-bench -- cluster          # failure detection, convergence
//! cargo run --release -p shardik-bench -- persistence      # SQLite and PostgreSQL stores
//! cargo run --release -p shardik-bench -- sharding         # cluster sharding, two processes
//! ```
//!
//! Every suite is a subcommand with its own module (`local`, `remote`, `cluster`,
//! `persistence` and `sharding`) and prints [`report::Record`]s, whose JSON form is the contract that
//! tooling reads. Hidden subcommands (`probe-idle`, `remote-peer`, `cluster-peer`,
//! `sharding-peer`) are helpers
//! that a suite runs in a child process.
#![warn(missing_docs)]

mod cluster;
mod harness;
mod local;
mod persistence;
mod remote;
mod report;
mod sharding;

use clap::{Args, Parser, Subcommand};

/// Command line of the benchmark binary.
#[derive(Parser, Debug)]
#[command(about = "shardik benchmarks against same-run baselines")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The suites, plus hidden helpers.
#[derive(Subcommand, Debug)]
enum Command {
    /// Single-process benchmarks: tell, ask, spawn, idle memory, sharded entities.
    Local(SuiteOptions),
    /// Measures the memory of idle actors in this (fresh) process; run by the `local` suite.
    #[command(hide = true)]
    ProbeIdle(local::idle::ProbeArgs),
    /// Two processes on loopback: remote tell throughput, ask latency, encode/decode, TLS.
    Remote(SuiteOptions),
    /// The receiving node of the `remote` suite; run by the suite in a child process.
    #[command(hide = true)]
    RemotePeer(remote::peer::PeerArgs),
    /// Cluster membership over loopback: time from SIGKILL to Down, time to converge.
    Cluster(SuiteOptions),
    /// The killed node of the `cluster` suite; run by the suite in a child process.
    #[command(hide = true)]
    ClusterPeer(cluster::peer::PeerArgs),
    /// Event-sourced entities on SQLite and PostgreSQL: persisted events/s, recovery time.
    Persistence(SuiteOptions),
    /// Cluster sharding over two processes: tell, ask, failover, rebalance, activation.
    Sharding(SuiteOptions),
    /// A child node of the `sharding` suite; run by the suite in a child process.
    #[command(hide = true)]
    ShardingPeer(sharding::peer::PeerArgs),
}

/// Options every suite takes.
#[derive(Args, Debug, Clone)]
pub struct SuiteOptions {
    /// Print one JSON record per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Small sizes and few rounds: a smoke run that checks the plumbing, not performance.
    #[arg(long)]
    pub quick: bool,
    /// Run only benchmarks whose name contains this substring.
    #[arg(long)]
    pub filter: Option<String>,
    /// Measured rounds per benchmark (default 5, or 3 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
}

impl SuiteOptions {
    /// True if a record called `bench` is selected by `--filter`.
    pub fn selects(&self, bench: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| bench.contains(f))
    }

    /// Measured rounds per benchmark.
    pub fn rounds(&self) -> usize {
        self.rounds.unwrap_or(if self.quick { 3 } else { 5 }).max(1)
    }

    /// Discarded warm-up rounds per benchmark.
    pub fn warmup(&self) -> usize {
        usize::from(!self.quick)
    }
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Local(opts) => run_suite(&opts, local::run),
        Command::ProbeIdle(args) => local::idle::probe(&args),
        Command::Remote(opts) => run_suite(&opts, remote::run),
        Command::RemotePeer(args) => remote::peer::serve(&args),
        Command::Cluster(opts) => run_suite(&opts, cluster::run),
        Command::ClusterPeer(args) => cluster::peer::serve(&args),
        Command::Persistence(opts) => run_suite(&opts, persistence::run),
        Command::Sharding(opts) => run_suite(&opts, sharding::run),
        Command::ShardingPeer(args) => sharding::peer::serve(&args),
    }
}

/// Runs a suite and prints its records: JSON lines as they come, or a table at the end.
fn run_suite(
    opts: &SuiteOptions,
    suite: impl FnOnce(&SuiteOptions, &mut dyn FnMut(report::Record)),
) {
    let mut records = Vec::new();
    suite(opts, &mut |record| {
        if opts.json {
            report::print_json(&record);
        }
        records.push(record);
    });
    if records.is_empty() {
        eprintln!("no benchmark matched the filter");
        std::process::exit(2);
    }
    if !opts.json {
        report::print_table(&records);
    }
}
