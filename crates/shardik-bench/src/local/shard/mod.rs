//! Sharded entities: keyed counters over many keys, shardik's [`Region`](shardik::Region)
//! against the Go seed's two plain patterns written with tokio.
//!
//! - **shardik** ([`entities`]): one counter entity per key, 256 shards.
//! - **channel owners** ([`owners`]): a few owner tasks, each the only one touching its map;
//!   this is the baseline of the ratio.
//! - **mutex-sharded map** ([`mutex_map`]): maps behind locks, updated in place; reported as
//!   the `_vs_mutex_` records so both comparisons are visible.
//!
//! Keys are `entity-0 .. entity-{N-1}` (N = 100 000 in the full run), drawn uniformly or
//! skewed (80% of the messages to 1% of the keys) by a seeded generator, so every variant
//! sees the very same sequence ([`workload`]). Every run starts warm (each key already holds
//! state; shardik's entities are spawned) and ends by checking that the counters add up
//! ([`driver`]).
//!
//! - `shard_tell_*`: fire-and-forget increments from 4 tasks, timed until every one has been
//!   handled (counted by [`progress`]).
//! - `shard_ask_*`: increment-and-get asks from 4 tasks with 100 in flight each.

pub mod driver;
pub mod entities;
pub mod mutex_map;
pub mod owners;
pub mod progress;
pub mod workload;

use driver::Op;
use workload::{Dist, Workload};

use super::{Ctx, SUITE};
use crate::harness::{block_on_task, Contender};
use crate::report::{Better, Record};

/// Records of the uniform tell benchmark: against channel owners, then against the mutex map.
pub const TELL_UNIFORM: &[&str] = &[
    "shard_tell_uniform_msgs_per_s",
    "shard_tell_uniform_vs_mutex_msgs_per_s",
];
/// Records of the skewed tell benchmark.
pub const TELL_SKEWED: &[&str] = &[
    "shard_tell_skewed_msgs_per_s",
    "shard_tell_skewed_vs_mutex_msgs_per_s",
];
/// Records of the uniform ask benchmark.
pub const ASK_UNIFORM: &[&str] = &[
    "shard_ask_uniform_msgs_per_s",
    "shard_ask_uniform_vs_mutex_msgs_per_s",
];
/// Records of the skewed ask benchmark.
pub const ASK_SKEWED: &[&str] = &[
    "shard_ask_skewed_msgs_per_s",
    "shard_ask_skewed_vs_mutex_msgs_per_s",
];

/// `shard_tell_uniform_msgs_per_s` (+ `_vs_mutex_`): tells, uniform keys.
pub fn tell_uniform(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, TELL_UNIFORM, Op::Tell, Dist::Uniform)
}

/// `shard_tell_skewed_msgs_per_s` (+ `_vs_mutex_`): tells, 80% to 1% of the keys.
pub fn tell_skewed(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, TELL_SKEWED, Op::Tell, Dist::Skewed)
}

/// `shard_ask_uniform_msgs_per_s` (+ `_vs_mutex_`): asks, uniform keys.
pub fn ask_uniform(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, ASK_UNIFORM, Op::Ask, Dist::Uniform)
}

/// `shard_ask_skewed_msgs_per_s` (+ `_vs_mutex_`): asks, 80% to 1% of the keys.
pub fn ask_skewed(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, ASK_SKEWED, Op::Ask, Dist::Skewed)
}

fn compare(ctx: &Ctx, names: &[&str], op: Op, dist: Dist) -> Vec<Record> {
    let messages = match op {
        Op::Tell => ctx.sizes.shard_tells,
        Op::Ask => ctx.sizes.shard_asks,
    };
    let work = Workload::new(ctx.sizes.shard_entities, messages, dist);
    let rt = &ctx.rt;
    let mut contenders = [
        Contender::new("shardik", || {
            let w = work.clone();
            vec![block_on_task(rt, async move {
                driver::run::<entities::Entities>("shardik", op, w).await
            })]
        }),
        Contender::new("channel owners", || {
            let w = work.clone();
            vec![block_on_task(rt, async move {
                driver::run::<owners::Owners>("channel owners", op, w).await
            })]
        }),
        Contender::new("mutex map", || {
            let w = work.clone();
            vec![block_on_task(rt, async move {
                driver::run::<mutex_map::MutexMap>("mutex map", op, w).await
            })]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![
        Record::new(SUITE, names[0], m[0][0], m[1][0], "msg/s", Better::Higher),
        Record::new(SUITE, names[1], m[0][0], m[2][0], "msg/s", Better::Higher),
    ]
}
