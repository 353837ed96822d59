//! A node that crashes (its remoting shut down abruptly, no leave) is unreachable, then
//! `Down`, then removed on every survivor, within the default detection and downing times.

mod netutil;

use std::time::{Duration, Instant};

use netutil::*;
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use shardik_cluster::runtime::{Event, NodeStopReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_node_is_downed_then_removed_on_the_survivors() {
    let (nodes, _) = cluster_of(3, None).await;
    let dead = nodes[2].id().clone();
    let mut subs: Vec<_> = nodes[..2].iter().map(|n| n.cluster.subscribe()).collect();
    let crashed_at = Instant::now();
    nodes[2].cluster.remote().shutdown().await;
    let mut down_after = Duration::ZERO;
    for n in &nodes[..2] {
        wait(
            &n.cluster,
            "crashed node Down",
            Duration::from_secs(5),
            |s| {
                s.member(&dead)
                    .is_none_or(|m| m.status == MemberStatus::Down)
            },
        )
        .await;
        down_after = down_after.max(crashed_at.elapsed());
    }
    let mut removed_after = Duration::ZERO;
    for n in &nodes[..2] {
        wait(
            &n.cluster,
            "crashed node removed",
            Duration::from_secs(5),
            |s| s.member(&dead).is_none(),
        )
        .await;
        removed_after = removed_after.max(crashed_at.elapsed());
    }
    eprintln!("crash: Down on all survivors after {down_after:?}, removed after {removed_after:?}");
    assert!(down_after < Duration::from_secs(5), "{down_after:?}");
    assert!(removed_after < Duration::from_secs(5), "{removed_after:?}");
    let ids = [nodes[0].id().clone(), nodes[1].id().clone()];
    for n in &nodes[..2] {
        wait(&n.cluster, "survivors up", Duration::from_secs(5), |s| {
            s.all_up(&ids)
        })
        .await;
    }
    // Each survivor saw unreachable, then down, then removed, and downed nobody else.
    for sub in &mut subs {
        let mut seen = Vec::new();
        while let Ok(e) = sub.try_recv() {
            seen.push(e);
        }
        let pos = |f: &dyn Fn(&Event) -> bool| seen.iter().position(f);
        let u = pos(&|e| *e == Event::Cluster(ClusterEvent::Unreachable(dead.clone())));
        let d =
            pos(&|e| matches!(e, Event::Cluster(ClusterEvent::MemberDowned(m)) if m.node == dead));
        let r = pos(
            &|e| matches!(e, Event::Cluster(ClusterEvent::MemberRemoved { node, .. }) if *node == dead),
        );
        assert!(
            u.is_some() && d.is_some() && r.is_some() && u < d && d < r,
            "{seen:?}"
        );
        let downs = seen
            .iter()
            .filter(|e| matches!(e, Event::Cluster(ClusterEvent::MemberDowned(_))))
            .count();
        assert_eq!(downs, 1, "{seen:?}");
    }
    // The crashed node's own cluster layer noticed that its remoting is gone.
    let why = tokio::time::timeout(Duration::from_secs(5), nodes[2].cluster.shutdown())
        .await
        .map(|_| nodes[2].cluster.stopped());
    assert_eq!(why.unwrap(), Some(NodeStopReason::RemoteStopped));
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced() {
    let (nodes, _) = cluster_of(3, None).await;
    let old = nodes[0].cluster.leader().unwrap();
    let i = nodes.iter().position(|n| *n.id() == old).unwrap();
    nodes[i].cluster.shutdown().await;
    let survivors: Vec<_> = nodes.iter().filter(|n| *n.id() != old).collect();
    let ids: Vec<_> = survivors.iter().map(|n| n.id().clone()).collect();
    for n in &survivors {
        let s = wait(
            &n.cluster,
            "old leader removed",
            Duration::from_secs(10),
            |s| s.all_up(&ids),
        )
        .await;
        assert!(s.leader.is_some_and(|l| l != old));
    }
    stop_all(&nodes).await;
}
