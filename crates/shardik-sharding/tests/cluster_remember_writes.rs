//! How remembered entity ids reach the replicas: a burst of 20 000 new entities ends up on
//! every replica as deltas batched by the round trip (not a copy of the whole set per id),
//! and a replica that missed writes gets the whole set again. (Its own test binary: it
//! installs a global metrics recorder; its tests run one at a time.)

mod cluster_util;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cluster_util::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use shardik_remote::FaultInjector;

/// The tests of this binary run one at a time: they read the same global counters.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The global recorder, installed by the first test that asks.
fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

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

/// Starts entities `e0 .. e{n-1}` through the first node, one at a time, and waits until
/// every replica holds them: every shard has its home, and each home has written its set to
/// every replica. Returns their ids.
async fn start_first(nodes: &[Node], n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("e{i}")).collect();
    for id in &ids {
        where_is(&nodes[0], id).await;
    }
    poll(
        "the first ids on every replica",
        Duration::from_secs(30),
        || {
            nodes
                .iter()
                .all(|node| node.sharding.remembered_entity_count(TYPE) == n)
        },
    )
    .await;
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_entities_reaches_every_replica_as_few_writes() {
    let _serial = SERIAL.lock().await;
    let snapshotter = recorder();
    snapshot(snapshotter);

    let reg = Arc::new(Registry::default());
    let nodes = remembering_cluster(NODES, SHARDS, &reg).await;

    const FIRST: usize = 100;
    start_first(&nodes, FIRST).await;
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
    let snap = snapshot(snapshotter);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_missed_writes_gets_the_whole_set_again() {
    let _serial = SERIAL.lock().await;
    let snapshotter = recorder();
    snapshot(snapshotter);
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    // Replica writes that get no answer within 300 ms count as failed.
    let mut s = settings();
    s.replication_timeout = Duration::from_millis(300);
    let nodes = remembering_cluster_with(NODES, SHARDS, &reg, Some(&faults), s).await;
    let first_ids = start_first(&nodes, 100).await;

    // Everything n0 sends n2 is dropped while new entities start on n0's shards.
    let hosted = nodes[0].hosted();
    let more: Vec<String> = (100..2_000)
        .map(|i| format!("e{i}"))
        .filter(|id| hosted.contains(&nodes[0].region.shard_of(id)))
        .take(200)
        .collect();
    assert_eq!(more.len(), 200, "n0 hosts some of the 12 shards");
    let total = first_ids.len() + more.len();
    faults.cut("n0", "n2");
    for id in &more {
        nodes[0].region.tell(id, Msg::Add { sender: 0, seq: 0 });
    }
    poll("n1 holds the new ids", Duration::from_secs(30), || {
        nodes[1].sharding.remembered_entity_count(TYPE) == total
    })
    .await;
    let mut failed = 0;
    poll("n0's writes to n2 failed", Duration::from_secs(30), || {
        failed += counter(
            &snapshot(snapshotter),
            "shardik_sharding_remember_write_failures_total",
            None,
        );
        failed > 0
    })
    .await;
    assert_eq!(
        nodes[2].sharding.remembered_entity_count(TYPE),
        first_ids.len(),
        "n2 got none of n0's new ids through the cut"
    );
    faults.heal("n0", "n2");
    // Retried whole after the backoff: n2 holds every id again without a new entity.
    poll("n2 holds every id", Duration::from_secs(30), || {
        nodes[2].sharding.remembered_entity_count(TYPE) == total
    })
    .await;
    let all: std::collections::BTreeSet<String> = first_ids.iter().chain(&more).cloned().collect();
    assert_eq!(nodes[2].sharding.remembered_entities(TYPE), all);
    stop_all(&nodes).await;
}
