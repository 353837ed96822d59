//! A partition 2|3 cut with shardik-remote's `FaultInjector`: the minority downs itself and
//! stops, the majority downs and removes the minority and goes on; after the heal, the
//! minority's processes restart as new incarnations and join again.

mod netutil;

use std::time::{Duration, Instant};

use netutil::*;
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::runtime::{Event, NodeStopReason};
use shardik_remote::FaultInjector;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_2_3_minority_stops_majority_continues_then_heal() {
    let faults = FaultInjector::new();
    let (nodes, _) = cluster_of(5, Some(&faults)).await;
    let (minority, majority) = nodes.split_at(2);
    let mut subs: Vec<_> = majority.iter().map(|n| n.cluster.subscribe()).collect();
    let cut_at = Instant::now();
    for a in minority {
        for b in majority {
            faults.cut_both(&a.id().node_id, &b.id().node_id);
        }
    }
    for n in minority {
        let s = wait(
            &n.cluster,
            "minority stops itself",
            Duration::from_secs(10),
            |s| s.stopped.is_some(),
        )
        .await;
        assert_eq!(s.stopped, Some(NodeStopReason::Downed));
    }
    let majority_ids: Vec<_> = majority.iter().map(|n| n.id().clone()).collect();
    for n in majority {
        wait(
            &n.cluster,
            "majority alone and up",
            Duration::from_secs(10),
            |s| s.all_up(&majority_ids) && s.stopped.is_none(),
        )
        .await;
    }
    eprintln!("partition resolved after {:?}", cut_at.elapsed());
    // Nobody on the majority side was downed.
    for sub in &mut subs {
        while let Ok(e) = sub.try_recv() {
            if let Event::Cluster(ClusterEvent::MemberDowned(m)) = &e {
                assert!(
                    !majority_ids.contains(&m.node),
                    "majority member downed: {e:?}"
                );
            }
        }
    }

    // Heal; the stopped minority processes restart (new incarnations) and join again.
    faults.heal_all();
    let seed = majority[0].id().address.clone();
    let mut restarted = Vec::new();
    for old in minority {
        let id = old.id().node_id.clone();
        restarted.push(
            start(
                config(&id)
                    .faults(faults.clone())
                    .seed_nodes([seed.clone()]),
            )
            .await,
        );
    }
    let all: Vec<_> = majority
        .iter()
        .chain(restarted.iter())
        .map(|n| n.id().clone())
        .collect();
    for n in majority.iter().chain(restarted.iter()) {
        wait(
            &n.cluster,
            "all five up again",
            Duration::from_secs(15),
            |s| s.all_up(&all),
        )
        .await;
    }
    stop_all(&nodes).await;
    stop_all(&restarted).await;
}
