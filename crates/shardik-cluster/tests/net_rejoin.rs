//! A process restarted on the same address is a new incarnation: it joins again, its previous
//! incarnation is downed and removed, and messages meant for the old one are not taken by the
//! new one.

mod netutil;

use std::time::Duration;

use netutil::*;
use shardik_cluster::member::MemberStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_on_the_same_address_replaces_its_old_incarnation() {
    let (nodes, _) = cluster_of(3, None).await;
    let old = nodes[2].id().clone();
    // Crash-like stop (no leave), then a new process on the same address and node id.
    nodes[2].cluster.shutdown().await;
    nodes[2].system.shutdown().await;
    let new = start(
        config(&old.node_id)
            .bind(old.address.clone())
            .seed_nodes([nodes[0].id().address.clone()]),
    )
    .await;
    assert_eq!(new.id().address, old.address);
    assert_ne!(new.id().incarnation, old.incarnation);
    let ids = [
        nodes[0].id().clone(),
        nodes[1].id().clone(),
        new.id().clone(),
    ];
    for n in [&nodes[0], &nodes[1], &new] {
        let s = wait(
            &n.cluster,
            "new incarnation up, old one gone",
            Duration::from_secs(10),
            |s| s.all_up(&ids),
        )
        .await;
        assert!(s.member(&old).is_none());
    }
    // lookup by node id now means the new incarnation's address (the same one).
    let m = nodes[0]
        .cluster
        .state()
        .member_by_id(&old.node_id)
        .cloned()
        .unwrap();
    assert_eq!(m.node, *new.id());
    assert_eq!(m.status, MemberStatus::Up);
    stop_all(&nodes[..2]).await;
    stop_all(std::slice::from_ref(&new)).await;
}
