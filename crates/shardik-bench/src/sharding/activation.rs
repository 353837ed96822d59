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

/// New entities started per second with remember entities on, two nodes.
pub const REMEMBERED: &str = "sharding_activation_remembered_per_s";

/// `sharding_activation_remembered_per_s`: two cluster nodes in this process, the activated
/// type on both with `remember_entities(true)` (in-memory replicas); one task `tell`s one
/// message to each of `n` new ids of shards the first node hosts (so every id is written to
/// the replica of the other node over the network, and no message is forwarded) and the
/// clock stops when every id is remembered by both replicas (a majority of two) and every
/// entity has started. Baseline: the same two nodes and ids without remember entities, the
/// clock stopping when every entity has started.
pub fn activation_remembered(ctx: &Ctx) -> Vec<Record> {
    let rt = &ctx.rt;
    let n = ctx.sizes.activation_remembered;
    // Candidates: about half land on shards the first node hosts.
    let ids: std::sync::Arc<[String]> = (0..4 * n).map(|i| format!("new-{i}")).collect();
    let mut contenders = [
        Contender::new("shardik, remembered", || {
            vec![block_on_task(rt, activate_pair(ids.clone(), n, true))]
        }),
        Contender::new("shardik, not remembered", || {
            vec![block_on_task(rt, activate_pair(ids.clone(), n, false))]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        REMEMBERED,
        m[0][0],
        m[1][0],
        "entity/s",
        Better::Higher,
    )]
}

async fn activate_pair(candidates: std::sync::Arc<[String]>, n: usize, remember: bool) -> f64 {
    use shardik::sharding::cluster::ClusterShardingSettings;
    let settings = ClusterShardingSettings::default().remember_entities(remember);
    let warm = account::one_id_per_shard(SHARDS);
    let started = Countdown::new(n + warm.len());
    let mut nodes = Vec::new();
    let mut seed: Option<String> = None;
    for name in ["act-rem-a", "act-rem-b"] {
        let system = shardik::prelude::ActorSystem::new(name);
        let mut cfg = account::node_config(name);
        if let Some(seed) = &seed {
            cfg = cfg.seed_nodes([seed.clone()]);
        }
        let cluster = Cluster::start(&system, cfg)
            .await
            .expect("an activation node starts");
        cluster.when_up().await.expect("an activation node is up");
        seed.get_or_insert_with(|| cluster.self_node().address.to_string());
        let region = ClusterSharding::get(&cluster)
            .start_with(
                account::activated_type(SHARDS, started.clone()),
                settings.clone(),
            )
            .expect("the activation type starts");
        nodes.push((system, cluster, region));
    }
    // Both regions registered before any shard is allocated: the shards are spread evenly
    // and no rebalance moves one during the run (a moved shard's remembered entities start
    // again on the other node, and each start counts).
    let coordinator = ClusterSharding::get(&nodes[0].1);
    while coordinator
        .coordinator("activated")
        .is_none_or(|c| c.state.regions.len() < nodes.len())
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let region = nodes[0].2.clone();
    touch_all(&region, &warm).await;
    // `n` of the candidates on shards this node hosts (about half of the shards).
    let hosted = ClusterSharding::get(&nodes[0].1)
        .hosted_shards("activated")
        .expect("the activated type runs here");
    let ids: Vec<&String> = candidates
        .iter()
        .filter(|id| hosted.contains(&shardik::shard_of(id, SHARDS)))
        .take(n)
        .collect();
    assert_eq!(ids.len(), n, "too few candidate ids on this node's shards");
    let start = Instant::now();
    for id in &ids {
        region.tell(id, AccountMsg::Deposit(1));
    }

    started.wait().await;
    if remember {
        let all = n + warm.len();
        for (_, cluster, _) in &nodes {
            let sharding = ClusterSharding::get(cluster);
            while sharding.remembered_entity_count("activated") < all {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    for (system, cluster, region) in nodes {
        assert_eq!(
            system.dead_letters().total(),
            0,
            "remembered activation had dead letters"
        );
        drop(region);
        cluster.shutdown().await;
        system.shutdown().await;
    }
    rate
}
