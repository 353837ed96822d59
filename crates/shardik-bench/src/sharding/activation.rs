//! Activation: new entities started per second through cluster sharding.
//!
//! One node in this process (a fresh single-node cluster per run) with an entity type of
//! [`SHARDS`] (1 000) shards whose entities record their `started` hook in a countdown. Every shard is
//! allocated first (one entity each, untimed); then one task `tell`s one message to each of
//! `n` new entity ids (1 000 000 in the full run) and the clock stops when all `n` have
//! started. Baseline: spawning `n` plain shardik actors ([`crate::local::spawn`]), the same
//! hook and countdown. Tear-down is not timed.

use std::time::Instant;

use shardik::sharding::cluster::ClusterSharding;
use shardik_cluster::runtime::Cluster;

use super::account::{self, AccountMsg};
use super::{touch_all, Ctx, SUITE};
use crate::harness::{block_on_task, Contender, Countdown};
use crate::report::{Better, Record};

/// Shards of the activation type: 1 000 rather than the workload's 100. Stopping a shard used
/// to cost time quadratic in its entities, which made tearing down 1 M entities on 100 shards
/// take minutes; that is fixed (`LocalRegion::passivate_shard` only rescans a stopping shard
/// when an entity restarted), and 1 000 is kept so that figures stay comparable. Activation
/// itself does not depend on the shard count.
pub const SHARDS: u32 = 1_000;

/// New entities started per second.
pub const NAME: &str = "sharding_activation_per_s";

/// `sharding_activation_per_s`.
pub fn activation(ctx: &Ctx) -> Vec<Record> {
    let rt = &ctx.rt;
    let n = ctx.sizes.activation;
    let ids: std::sync::Arc<[String]> = (0..n).map(|i| format!("new-{i}")).collect();
    let mut contenders = [
        Contender::new("shardik", || vec![block_on_task(rt, activate(ids.clone()))]),
        Contender::new("plain actors", || {
            vec![block_on_task(rt, crate::local::spawn::shardik_spawn(n))]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        NAME,
        m[0][0],
        m[1][0],
        "entity/s",
        Better::Higher,
    )]
}

async fn activate(ids: std::sync::Arc<[String]>) -> f64 {
    let system = shardik::prelude::ActorSystem::new("act-main");
    let cluster = Cluster::start(&system, account::node_config("act-main"))
        .await
        .expect("the activation node starts");
    cluster.when_up().await.expect("the activation node is up");
    let warm = account::one_id_per_shard(SHARDS);
    let started = Countdown::new(ids.len() + warm.len());
    let region = ClusterSharding::get(&cluster)
        .start(account::activated_type(SHARDS, started.clone()))
        .expect("the activation type starts");
    touch_all(&region, &warm).await;
    let start = Instant::now();
    for id in ids.iter() {
        region.tell(id, AccountMsg::Deposit(1));
    }
    started.wait().await;
    let rate = ids.len() as f64 / start.elapsed().as_secs_f64();
    let dead = system.dead_letters().total();
    assert_eq!(dead, 0, "activation had dead letters");
    drop(region);
    cluster.shutdown().await;
    system.shutdown().await;
    rate
}
