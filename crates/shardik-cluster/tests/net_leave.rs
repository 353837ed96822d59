//! Graceful leave over real TCP: `Leaving`, `Exiting`, removed; the leaver stops; nobody is
//! downed.

mod netutil;

use std::time::Duration;

use netutil::*;
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use shardik_cluster::runtime::{ClusterError, Event, NodeStopReason};

fn drain(sub: &mut shardik_cluster::runtime::Subscription) -> Vec<Event> {
    let mut v = Vec::new();
    while let Ok(e) = sub.try_recv() {
        v.push(e);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_leaves_gracefully_and_stops() {
    let (nodes, _) = cluster_of(3, None).await;
    let leaver = nodes[2].id().clone();
    let mut sub0 = nodes[0].cluster.subscribe();
    let mut own = nodes[2].cluster.subscribe();
    let why = tokio::time::timeout(Duration::from_secs(10), nodes[2].cluster.leave())
        .await
        .expect("leave completes");
    assert_eq!(why, NodeStopReason::Left);
    assert_eq!(nodes[2].cluster.stopped(), Some(NodeStopReason::Left));
    assert!(matches!(
        nodes[2].cluster.when_up().await,
        Err(ClusterError::Stopped(NodeStopReason::Left))
    ));
    // The leaver's last event says it stopped.
    let mine = drain(&mut own);
    assert_eq!(
        mine.last(),
        Some(&Event::Stopped(NodeStopReason::Left)),
        "{mine:?}"
    );
    // After it the subscription is closed (a `while let Ok(e) = sub.recv().await` loop
    // ends), and so is one taken now.
    assert_eq!(
        own.recv().await,
        Err(tokio::sync::broadcast::error::RecvError::Closed)
    );
    assert_eq!(
        nodes[2].cluster.subscribe().recv().await,
        Err(tokio::sync::broadcast::error::RecvError::Closed)
    );
    let ids = [nodes[0].id().clone(), nodes[1].id().clone()];
    for n in &nodes[..2] {
        wait(&n.cluster, "leaver removed", Duration::from_secs(10), |s| {
            s.all_up(&ids)
        })
        .await;
    }
    let ev = drain(&mut sub0);
    let pos = |f: &dyn Fn(&Event) -> bool| ev.iter().position(f);
    let left =
        pos(&|e| matches!(e, Event::Cluster(ClusterEvent::MemberLeft(m)) if m.node == leaver));
    let exited =
        pos(&|e| matches!(e, Event::Cluster(ClusterEvent::MemberExited(m)) if m.node == leaver));
    let removed = pos(
        &|e| matches!(e, Event::Cluster(ClusterEvent::MemberRemoved { node, previous: MemberStatus::Exiting }) if *node == leaver),
    );
    assert!(
        left.is_some()
            && exited.is_some()
            && removed.is_some()
            && left < exited
            && exited < removed,
        "{ev:?}"
    );
    assert!(
        !ev.iter()
            .any(|e| matches!(e, Event::Cluster(ClusterEvent::MemberDowned(_)))),
        "{ev:?}"
    );
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_leaves_and_the_next_one_takes_over() {
    let (nodes, _) = cluster_of(3, None).await;
    let leader = nodes[0].cluster.leader().unwrap();
    let i = nodes.iter().position(|n| *n.id() == leader).unwrap();
    let why = tokio::time::timeout(Duration::from_secs(10), nodes[i].cluster.leave())
        .await
        .expect("leave completes");
    assert_eq!(why, NodeStopReason::Left);
    let rest: Vec<_> = nodes.iter().filter(|n| *n.id() != leader).collect();
    let ids: Vec<_> = rest.iter().map(|n| n.id().clone()).collect();
    for n in &rest {
        let s = wait(
            &n.cluster,
            "old leader removed",
            Duration::from_secs(10),
            |s| s.all_up(&ids),
        )
        .await;
        assert!(s.leader.is_some_and(|l| l != leader));
    }
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_down_removes_a_member_and_it_stops_itself() {
    let (nodes, _) = cluster_of(3, None).await;
    let victim = nodes[1].id().clone();
    nodes[0].cluster.down(&victim);
    let ids = [nodes[0].id().clone(), nodes[2].id().clone()];
    for n in [&nodes[0], &nodes[2]] {
        wait(
            &n.cluster,
            "downed member removed",
            Duration::from_secs(10),
            |s| s.all_up(&ids),
        )
        .await;
    }
    let s = wait(
        &nodes[1].cluster,
        "victim stopped",
        Duration::from_secs(10),
        |s| s.stopped.is_some(),
    )
    .await;
    assert_eq!(s.stopped, Some(NodeStopReason::Downed));
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_leaves_and_a_stopped_node_stays_stopped() {
    let node = start(config("alone")).await;
    node.cluster.when_up().await.unwrap();
    let mut sub = node.cluster.subscribe();
    let why = tokio::time::timeout(Duration::from_secs(10), node.cluster.leave())
        .await
        .expect("leave completes");
    assert_eq!(why, NodeStopReason::Left);
    let ev = drain(&mut sub);
    assert_eq!(
        ev.last(),
        Some(&Event::Stopped(NodeStopReason::Left)),
        "{ev:?}"
    );
    // Further calls return at once.
    assert_eq!(node.cluster.leave().await, NodeStopReason::Left);
    node.cluster.shutdown().await;
    node.system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_the_actor_system_down_stops_the_cluster_node() {
    // Three nodes: with two, keep-majority would keep only the side with the lowest address.
    let (nodes, _) = cluster_of(3, None).await;
    nodes[2].system.shutdown().await;
    let s = wait(&nodes[2].cluster, "stopped", Duration::from_secs(5), |s| {
        s.stopped.is_some()
    })
    .await;
    assert_eq!(s.stopped, Some(NodeStopReason::SystemShutdown));
    // Without a leave, the others see a crash: down and removed.
    let ids = [nodes[0].id().clone(), nodes[1].id().clone()];
    for n in &nodes[..2] {
        wait(
            &n.cluster,
            "crashed node removed",
            Duration::from_secs(10),
            |s| s.all_up(&ids),
        )
        .await;
    }
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_system_on_exit_shuts_the_actor_system_down_after_leaving() {
    let first = start(config("a")).await;
    let second = start(
        config("b")
            .seed_nodes([first.id().address.clone()])
            .stop_system_on_exit(true),
    )
    .await;
    second.cluster.when_up().await.unwrap();
    let why = tokio::time::timeout(Duration::from_secs(10), second.cluster.leave())
        .await
        .expect("leave completes");
    assert_eq!(why, NodeStopReason::Left);
    assert!(second.system.is_shutting_down());
    stop_all(&[first, second]).await;
}
