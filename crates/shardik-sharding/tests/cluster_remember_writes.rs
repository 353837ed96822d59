//! Remember entities under a burst of 20 000 new entities: every replica ends up with every id, and
//! the ids travel as deltas batched by the round trip, not as a copy of the whole set per id.
//! (Its own test binary: it installs a global metrics recorder.)

mod cluster_util;

use std::sync::Arc;
use std::time::Duration;

use cluster_util::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const SHARDS: u32 = 12;
const NODES: usize = 3;
const IDS: usize = 20_000;

/// A snapshot of the counters (taking one resets them).
type Snapshot = Vec<(metrics_util::CompositeKey, DebugValue)>;

fn snapshot(snapshotter: &Snapshotter) -> Snapshot {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect()
}

fn counter(snapshot: &Snapshot, name: &str, kind: Option<&str>) -> u64 {
    snapshot
        .iter()
        .filter(|(k, _)| {
            let key = k.key();
            key.name() == name
                && kind
                    .is_none_or(|kind| key.labels().any(|l| l.key() == "kind" && l.value() == kind))
        })
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_entities_reaches_every_replica_as_few_writes() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let reg = Arc::new(Registry::default());
    let nodes = remembering_cluster(NODES, SHARDS, &reg).await;

    // First a few entities, until every replica holds them: every shard has its home and
    // each home has written its set to every replica once.
    const FIRST: usize = 100;
    for i in 0..FIRST {
        where_is(&nodes[0], &format!("e{i}")).await;
    }
    poll(
        "the first ids on every replica",
        Duration::from_secs(30),
        || {
            nodes
                .iter()
                .all(|n| n.sharding.remembered_entity_count(TYPE) == FIRST)
        },
    )
    .await;
    assert_eq!(
        nodes[0]
            .sharding
            .coordinator(TYPE)
            .unwrap()
            .state
            .shards
            .len(),
        SHARDS as usize
    );

    // Then a burst: the other 19 900 new entities as fast as one task can send.
    for i in FIRST..IDS {
        nodes[0]
            .region
            .tell(&format!("e{i}"), Msg::Add { sender: 0, seq: 0 });
    }
    // Every replica holds every id (no event reports it: polled). Before, each new id sent
    // the whole set of its shard to each peer, fire and forget on the control lane: with
    // this burst the replicas did not hold every id 30 s later.
    poll("every id on every replica", Duration::from_secs(30), || {
        nodes
            .iter()
            .all(|n| n.sharding.remembered_entity_count(TYPE) == IDS)
    })
    .await;
    let all: std::collections::BTreeSet<String> = (0..IDS).map(|i| format!("e{i}")).collect();
    for n in &nodes {
        assert_eq!(n.sharding.remembered_entities(TYPE), all, "{}", n.name());
    }

    // Each hosting node sends each peer its shard's whole set once (more only after a write
    // went unanswered, retried whole), then deltas of the ids added meanwhile.
    let snap = snapshot(&snapshotter);
    let full = counter(
        &snap,
        "shardik_sharding_remember_writes_total",
        Some("full"),
    );
    let delta = counter(
        &snap,
        "shardik_sharding_remember_writes_total",
        Some("delta"),
    );
    let failed = counter(
        &snap,
        "shardik_sharding_remember_write_failures_total",
        None,
    );

    assert!(delta > 0, "the burst's ids travel as deltas");
    let pipes = SHARDS as u64 * (NODES as u64 - 1);
    assert!(
        full <= pipes + failed,
        "{full} whole sets for {pipes} (shard, peer) pairs and {failed} failed writes"
    );
    // One write per id and peer was the old cost; batching by the round trip sends far fewer.
    let per_id = IDS as u64 * (NODES as u64 - 1);
    assert!(
        full + delta < per_id / 2,
        "{full} whole sets and {delta} deltas for {IDS} ids"
    );
    stop_all(&nodes).await;
}
