//! The `local` suite: one process, shardik against plain tokio written the obvious way.
//!
//! | module | benchmarks |
//! |---|---|
//! | [`pingpong`] | `tell_pingpong_1pair_msgs_per_s`, `tell_pingpong_4pairs_100inflight_msgs_per_s` |
//! | [`ask`] | `ask_seq_p50_us`, `ask_seq_p99_us` |
//! | [`spawn`] | `spawn_per_s` |
//! | [`idle`] | `idle_bytes_per_actor` (in fresh child processes) |
//! | [`shard`] | `shard_{tell,ask}_{uniform,skewed}_msgs_per_s` and their `_vs_mutex_` twins |
//! | `peers` (feature `peers`) | `peer_{kameo,ractor,actix}_*`: the same shapes against other actor crates |
//!
//! Every benchmark alternates shardik and its baseline(s) over several rounds in this one
//! process and reports the medians (see [`crate::harness::alternate`]).

pub mod ask;
pub mod idle;
#[cfg(feature = "peers")]
pub mod peers;
pub mod pingpong;
pub mod shard;
pub mod spawn;

use std::time::Instant;

use crate::report::Record;
use crate::SuiteOptions;

/// The suite's name in every record.
pub const SUITE: &str = "local";

/// Problem sizes: the full run, or small ones for `--quick`.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Messages of the one-pair ping-pong.
    pub pingpong_1pair_msgs: u32,
    /// Bounces of each ball in the four-pair ping-pong (100 balls per pair).
    pub pingpong_4pairs_hops: u32,
    /// Sequential asks per round.
    pub ask_seq: usize,
    /// Actors spawned per round.
    pub spawn: usize,
    /// Idle actors per probe process.
    pub idle: usize,
    /// Distinct entities (keys) of the sharded benchmarks.
    pub shard_entities: usize,
    /// Tells per round of the sharded tell benchmarks.
    pub shard_tells: usize,
    /// Asks per round of the sharded ask benchmarks.
    pub shard_asks: usize,
}

impl Sizes {
    /// The sizes for `opts`.
    pub fn for_options(opts: &SuiteOptions) -> Sizes {
        if opts.quick {
            Sizes {
                pingpong_1pair_msgs: 5_000,
                pingpong_4pairs_hops: 20,
                ask_seq: 2_000,
                spawn: 5_000,
                idle: 5_000,
                shard_entities: 1_000,
                shard_tells: 10_000,
                shard_asks: 5_000,
            }
        } else {
            Sizes {
                pingpong_1pair_msgs: 2_000_000,
                pingpong_4pairs_hops: 10_000,
                ask_seq: 200_000,
                spawn: 1_000_000,
                idle: 1_000_000,
                shard_entities: 100_000,
                shard_tells: 2_000_000,
                shard_asks: 500_000,
            }
        }
    }
}

/// What a benchmark gets: options, sizes and the runtime.
pub struct Ctx {
    /// The suite options.
    pub opts: SuiteOptions,
    /// Problem sizes.
    pub sizes: Sizes,
    /// The multi-threaded runtime (2 workers) everything runs on.
    pub rt: tokio::runtime::Runtime,
}

impl Ctx {
    /// Alternates the contenders with the suite's warm-up and rounds.
    pub fn alternate(&self, contenders: &mut [crate::harness::Contender<'_>]) -> Vec<Vec<f64>> {
        crate::harness::alternate(contenders, self.opts.warmup(), self.opts.rounds())
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
    #[allow(unused_mut)]
    let mut all = vec![
        Bench {
            records: &[pingpong::ONE_PAIR],
            run: pingpong::one_pair,
        },
        Bench {
            records: &[pingpong::FOUR_PAIRS],
            run: pingpong::four_pairs,
        },
        Bench {
            records: &[ask::P50, ask::P99],
            run: ask::sequential,
        },
        Bench {
            records: &[spawn::NAME],
            run: spawn::spawn_rate,
        },
        Bench {
            records: &[idle::NAME],
            run: idle::idle_memory,
        },
        Bench {
            records: shard::TELL_UNIFORM,
            run: shard::tell_uniform,
        },
        Bench {
            records: shard::TELL_SKEWED,
            run: shard::tell_skewed,
        },
        Bench {
            records: shard::ASK_UNIFORM,
            run: shard::ask_uniform,
        },
        Bench {
            records: shard::ASK_SKEWED,
            run: shard::ask_skewed,
        },
    ];
    #[cfg(feature = "peers")]
    all.extend(peers::benches());
    all
}

/// Runs the selected benchmarks of the suite, handing each record to `emit` as it is ready.
pub fn run(opts: &SuiteOptions, emit: &mut dyn FnMut(Record)) {
    let ctx = Ctx {
        opts: opts.clone(),
        sizes: Sizes::for_options(opts),
        rt: crate::harness::runtime(),
    };
    let suite_start = Instant::now();
    for bench in benches() {
        if !bench.records.iter().any(|name| opts.selects(name)) {
            continue;
        }
        let start = Instant::now();
        eprintln!("[local] {} ...", bench.records.join(", "));
        let records = (bench.run)(&ctx);
        eprintln!("[local]   done in {:.1} s", start.elapsed().as_secs_f64());
        for record in records {
            if opts.selects(&record.bench) {
                emit(record);
            }
        }
    }
    eprintln!(
        "[local] suite finished in {:.1} s",
        suite_start.elapsed().as_secs_f64()
    );
}
