//! Failover: seconds from SIGKILL of the child process hosting an entity until that entity
//! answers again, from a survivor.
//!
//! Three nodes, so that a majority survives: this process (the oldest member, so the
//! coordinator) and two children. Every one of the 100 entities answers once (allocating
//! every shard, about a third per node); an entity whose shard the coordinator placed on the
//! second child is picked; the second child is killed with SIGKILL; from then on this node
//! asks that entity `Balance` (100 ms per try, 5 ms between tries) until it answers. Its
//! balance starts at zero again on the new node (entity state does not move; the seed systems
//! lose it too).
//!
//! Baseline: the membership's own time from the same SIGKILL to `Down` on this node, in the
//! same round. Failover cannot beat it: after `Down` the coordinator waits `down_margin`
//! (2 s by default) before reallocating the crashed node's shards. (Akka's documented
//! failover with its defaults is about 45 s, about 25 s tuned.)

use std::time::Duration;

use shardik::sharding::cluster::ClusterSharding;
use shardik_cluster::member::MemberStatus;

use super::account::{self, ACCOUNT};
use super::{touch_all, wait_cluster, wait_regions, Ctx, PeerProcess, SHARDS, SUITE};
use crate::harness::median;
use crate::report::{Better, Record};

/// Seconds from SIGKILL to the entity answering again.
pub const NAME: &str = "sharding_failover_after_sigkill_s";

/// `sharding_failover_after_sigkill_s`.
pub fn failover(ctx: &Ctx) -> Vec<Record> {
    let (mut values, mut downs) = (Vec::new(), Vec::new());
    for _ in 0..ctx.sizes.cluster_rounds {
        let (f, d) = round(&ctx.rt);
        eprintln!("[sharding]   entity answers again after {f:.2} s (Down after {d:.2} s)");
        values.push(f);
        downs.push(d);
    }
    vec![Record::new(
        SUITE,
        NAME,
        median(values),
        median(downs),
        "s",
        Better::Lower,
    )]
}

fn round(rt: &tokio::runtime::Runtime) -> (f64, f64) {
    let (system, cluster, region) = rt.block_on(account::start_node("fo-main", None, SHARDS));
    let seed = cluster.self_node().address.clone();
    let survivor = PeerProcess::start(&seed, "fo-survivor", SHARDS);
    let mut victim = PeerProcess::start(&seed, "fo-victim", SHARDS);
    let ids = account::one_id_per_shard(SHARDS);
    let victim_id = victim.id.clone();
    let entity = rt.block_on(async {
        let all = [
            cluster.self_node().clone(),
            survivor.id.clone(),
            victim.id.clone(),
        ];
        wait_cluster(&cluster, "three up", Duration::from_secs(30), |s| {
            s.all_up(&all)
        })
        .await;
        wait_regions(&cluster, 3).await;
        touch_all(&region, &ids).await;
        let snapshot = ClusterSharding::get(&cluster)
            .coordinator(ACCOUNT)
            .expect("the coordinator runs on the oldest node, this one");
        let prefix = format!("{}#", victim_id.address);
        let on_victim = |id: &&&'static str| {
            snapshot
                .state
                .shards
                .get(&region.shard_of(id))
                .is_some_and(|r| r.0.starts_with(&prefix))
        };
        *ids.iter()
            .find(on_victim)
            .expect("the victim hosts at least one shard")
    });
    let killed = victim.sigkill();
    let (failover, down) = rt.block_on(async {
        let down = {
            let cluster = cluster.clone();
            let v = victim_id.clone();
            tokio::spawn(async move {
                wait_cluster(&cluster, "victim down", Duration::from_secs(60), |s| {
                    s.member(&v).is_none_or(|m| m.status == MemberStatus::Down)
                })
                .await;
                killed.elapsed()
            })
        };
        let _ = account::balance(
            &region,
            entity,
            Duration::from_millis(100),
            Duration::from_secs(60),
        )
        .await;
        let failover = killed.elapsed();
        let down = down.await.expect("the Down waiter");
        (failover.as_secs_f64(), down.as_secs_f64())
    });
    let hosted = ClusterSharding::get(&cluster)
        .coordinator(ACCOUNT)
        .and_then(|s| s.state.shards.get(&region.shard_of(entity)).cloned());
    if let Some(home) = hosted {
        assert!(
            !home.0.starts_with(&format!("{}#", victim_id.address)),
            "the entity answered but its shard is still placed on the killed node"
        );
    }
    drop(region);
    drop(victim);
    drop(survivor);
    rt.block_on(async {
        cluster.shutdown().await;
        system.shutdown().await;
    });
    (failover, down)
}
