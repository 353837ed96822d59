//! A fourth node joins while two senders stream sequence numbers to 20 entities: the
//! coordinator rebalances shards to it with hand-offs, and every entity sees every number of
//! every sender exactly once, in order, with never two live incarnations of one id.

mod cluster_util;

use std::sync::Arc;
use std::time::Duration;

use cluster_util::*;

const ENTITIES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_rebalances_without_loss_or_reordering() {
    let reg = Arc::new(Registry::default());
    let mut nodes = cluster_of(3, 12, &reg).await;
    let ids: Vec<String> = (0..ENTITIES).map(|i| format!("e{i}")).collect();
    // Allocate every entity's shard first.
    for id in &ids {
        where_is(&nodes[0], id).await;
    }
    let streams = Streams::start(&nodes, &[(0, 0), (1, 1)], &ids);
    let seed = nodes[0].id().address.clone();
    nodes.push(start_node("n3", Some(&seed), 12, &reg).await);
    all_up(&nodes).await;
    // Balanced: no node over ceil(allocated / 4) (rebalance rounds every 500 ms), the new
    // node hosts some, and no hand-off is running.
    poll("balanced", Duration::from_secs(30), || {
        let counts: Vec<usize> = nodes.iter().map(|n| n.hosted().len()).collect();
        let total: usize = counts.iter().sum();
        let snap = nodes[0].sharding.coordinator(TYPE);
        counts[3] > 0
            && counts.iter().all(|c| *c <= total.div_ceil(4))
            && snap.is_some_and(|s| s.handoffs == 0 && s.state.shards.len() == total)
    })
    .await;
    let counts = streams.stop().await;
    await_streams(&reg, &ids, &counts).await;
    reg.assert_single_writer();
    let moved = reg.homes.lock().values().filter(|h| h.len() > 1).count();
    assert!(moved > 0, "some entity moved to the new node");
    let snap = nodes[0].sharding.coordinator(TYPE).unwrap();
    assert_eq!(snap.state.regions.len(), 4);
    stop_all(&nodes).await;
}
