//! Passivation under load on a cluster: entities with a short idle timeout and a cap of live
//! entities on each node, streams from every node, and entities passivating (idle and by the
//! cap) and restarting again and again meanwhile: every number is handled exactly once and in
//! per-sender order, and never two live incarnations of one id.

mod cluster_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cluster_util::*;

const IDS: usize = 24;
/// The ids are in `GROUPS` groups (`i % GROUPS`); the senders stream to one group at a time,
/// `BURST` rounds each, so an entity gets a burst and then stays idle for three bursts.
const GROUPS: usize = 4;
const BURST: u64 = 10;
/// Rounds are 3 ms apart: a burst lasts about 30 ms, the silence after it about 90 ms.
const ROUND: Duration = Duration::from_millis(3);
const IDLE: Duration = Duration::from_millis(30);
/// Live entities per node: a group has 6 ids over 3 nodes and the previous group's entities
/// are still live (not idle long enough), so the cap passivates entities that are receiving.
const CAP: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passivation_under_load_loses_nothing() {
    let reg = Arc::new(Registry::default());
    let nodes = cluster_configured(3, 12, &reg, None, &|t| {
        t.idle_timeout(IDLE).max_live_entities(CAP)
    })
    .await;
    let ids: Vec<String> = (0..IDS).map(|i| format!("p{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // One sender per node, through that node's region; per-id sequence numbers.
    let senders: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(s, n)| {
            let (region, ids, stop) = (n.region.clone(), ids.clone(), stop.clone());
            tokio::spawn(async move {
                let mut next = vec![0u64; IDS];
                let mut round = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let group = (round / BURST) as usize % GROUPS;
                    for (i, id) in ids.iter().enumerate() {
                        if i % GROUPS == group {
                            let seq = next[i];
                            next[i] += 1;
                            region.tell(
                                id,
                                Msg::Add {
                                    sender: s as u32,
                                    seq,
                                },
                            );
                        }
                    }
                    round += 1;
                    // Pacing of the stream, not a wait.
                    tokio::time::sleep(ROUND).await;
                }
                next
            })
        })
        .collect();
    // Streams run until every entity was started at least 4 times and both kinds of
    // passivation happened (no event reports it: polled).
    let passivated = |nodes: &[Node]| {
        nodes.iter().fold((0, 0), |(idle, lru), n| {
            let st = n.region.stats();
            (
                idle + st.passivated_idle_total,
                lru + st.passivated_lru_total,
            )
        })
    };
    poll(
        "entities passivate and restart repeatedly",
        Duration::from_secs(20),
        || {
            let homes = reg.homes.lock();
            let (idle, lru) = passivated(&nodes);
            idle > 0
                && lru > 0
                && ids
                    .iter()
                    .all(|id| homes.get(id).is_some_and(|h| h.len() >= 4))
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let mut counts: HashMap<String, Vec<u64>> = HashMap::new();
    for task in senders {
        let next = task.await.expect("sender");
        for (i, n) in next.into_iter().enumerate() {
            counts.entry(ids[i].clone()).or_default().push(n);
        }
    }
    await_counts(&reg, &counts).await;
    reg.assert_single_writer();
    let (idle, lru) = passivated(&nodes);
    let starts: usize = reg.homes.lock().values().map(Vec::len).sum();
    let sent: u64 = counts.values().flatten().sum();
    eprintln!("{sent} messages, {starts} incarnations, passivated: {idle} idle, {lru} by the cap");
    // Every entity stayed on its node (no rebalance: the shards were balanced from the start).
    for (id, homes) in reg.homes.lock().iter() {
        assert!(
            homes.iter().all(|h| h == &homes[0]),
            "{id} moved: {homes:?}"
        );
    }
    stop_all(&nodes).await;
}
