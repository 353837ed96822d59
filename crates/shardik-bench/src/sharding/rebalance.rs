//! Rebalance: seconds from starting a joining node until 1 000 shards are balanced.
//!
//! This process runs one node with the account type on [`SHARDS_1000`] shards and one entity
//! per shard (each answered once, so every shard is allocated here). Then a child node joins;
//! the clock runs from spawning its process until the coordinator's snapshot (on this node,
//! the oldest) shows both regions registered, every shard allocated, 500 shards on each
//! node and no hand-off running. Polled every 5 ms.
//!
//! Baseline: Akka's default `rebalance-interval` of 10 s, the earliest its coordinator starts
//! moving shards after a join (its current allocation strategy then balances in one or two
//! rounds; shardik's default interval is 2 s).

use std::time::{Duration, Instant};

use shardik::sharding::cluster::ClusterSharding;

use super::account::{self, ACCOUNT};
use super::{touch_all, Ctx, PeerProcess, SUITE};
use crate::harness::median;
use crate::report::{Better, Record};

/// Seconds from a node joining to balanced shards.
pub const NAME: &str = "sharding_rebalance_after_join_1000shards_s";
/// Shards of the rebalance benchmark.
pub const SHARDS_1000: u32 = 1_000;
/// Akka's default `rebalance-interval`.
pub const AKKA_REBALANCE_INTERVAL_S: f64 = 10.0;

/// `sharding_rebalance_after_join_1000shards_s`.
pub fn rebalance(ctx: &Ctx) -> Vec<Record> {
    let mut values = Vec::new();
    for _ in 0..ctx.sizes.cluster_rounds {
        let s = round(&ctx.rt);
        eprintln!("[sharding]   balanced {s:.2} s after the join started");
        values.push(s);
    }
    vec![Record::new(
        SUITE,
        NAME,
        median(values),
        AKKA_REBALANCE_INTERVAL_S,
        "s",
        Better::Lower,
    )]
}

fn round(rt: &tokio::runtime::Runtime) -> f64 {
    let (system, cluster, region) = rt.block_on(account::start_node("rb-main", None, SHARDS_1000));
    let sharding = ClusterSharding::get(&cluster);
    let ids = account::one_id_per_shard(SHARDS_1000);
    rt.block_on(touch_all(&region, &ids));
    // The snapshot is published by the coordinator task, shortly after the allocations.
    let waited = Instant::now();
    while sharding
        .coordinator(ACCOUNT)
        .is_none_or(|s| s.state.shards.len() < SHARDS_1000 as usize)
    {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "not every shard allocated within 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = Instant::now();
    let joiner = PeerProcess::start(&cluster.self_node().address, "rb-joiner", SHARDS_1000);
    let took = rt.block_on(async {
        loop {
            if let Some(s) = sharding.coordinator(ACCOUNT) {
                let per_region = s.state.shards_per_region();
                let balanced = s.handoffs == 0
                    && s.state.shards.len() == SHARDS_1000 as usize
                    && per_region.len() == 2
                    && per_region
                        .values()
                        .all(|v| v.len() == SHARDS_1000 as usize / 2);
                if balanced {
                    return started.elapsed();
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "shards not balanced within 120 s: {:?}",
                sharding.coordinator(ACCOUNT).map(|s| s
                    .state
                    .shards_per_region()
                    .into_iter()
                    .map(|(r, v)| (r, v.len()))
                    .collect::<Vec<_>>())
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    drop(region);
    drop(joiner);
    rt.block_on(async {
        cluster.shutdown().await;
        system.shutdown().await;
    });
    took.as_secs_f64()
}
