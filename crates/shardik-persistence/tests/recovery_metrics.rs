//! Recovery and snapshots are visible in the metrics: how long recoveries take per kind of
//! entity, how many events they replay (what snapshots save), and recoveries that fail. One
//! test per binary: the recorder is global to the process.

mod common;

use std::sync::Arc;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use shardik_actor::{ActorSystem, AskError};
use shardik_persistence::{FaultyStore, InMemoryStore, PersistSettings};

use common::{persistence, AccountCmd, Bank, Counter, CounterCmd, T};

type Snapshot = Vec<(CompositeKey, DebugValue)>;

fn labelled(k: &CompositeKey, name: &str, kind: Option<&str>) -> bool {
    k.key().name() == name
        && kind.is_none_or(|kind| {
            k.key()
                .labels()
                .any(|l| l.key() == "kind" && l.value() == kind)
        })
}

/// The counter's value (0 if never incremented).
fn counter(snapshot: &Snapshot, name: &str, kind: Option<&str>) -> u64 {
    snapshot
        .iter()
        .filter(|(k, _)| k.kind() == MetricKind::Counter && labelled(k, name, kind))
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("not a counter: {other:?}"),
        })
        .sum()
}

/// How many samples the histogram holds.
fn samples(snapshot: &Snapshot, name: &str, kind: &str) -> usize {
    snapshot
        .iter()
        .filter(|(k, _)| k.kind() == MetricKind::Histogram && labelled(k, name, Some(kind)))
        .map(|(_, v)| match v {
            DebugValue::Histogram(values) => values.len(),
            other => panic!("not a histogram: {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoveries_replays_and_snapshots_are_measured() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this process");
    let store = Arc::new(FaultyStore::new(Arc::new(InMemoryStore::new())));
    let persistence = persistence(store.clone());
    let system = ActorSystem::new("recovery-metrics");

    // Five events, a snapshot after the third; the second incarnation replays the two after
    // it.
    let settings = || PersistSettings::default().snapshot_every(3);
    let first =
        system.spawn_props(persistence.event_sourced_props("account|r", settings(), || Bank));
    for n in 1..=5 {
        assert_eq!(first.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(n));
    }
    first.stop();
    first.terminated().await;
    let second =
        system.spawn_props(persistence.event_sourced_props("account|r", settings(), || Bank));
    assert_eq!(second.ask(AccountCmd::Balance, T).await, Ok(5));

    // A durable-state counter, started twice.
    for expected in [1, 2] {
        let counter = system.spawn_props(persistence.durable_state_props(
            "count|r",
            PersistSettings::default(),
            || Counter,
        ));
        assert_eq!(
            counter.ask(|r| CounterCmd::Add(1, r), T).await,
            Ok(expected)
        );
        counter.stop();
        counter.terminated().await;
    }

    // A store that cannot be read: the recovery fails (and the actor with it).
    store.fail_reads(true);
    let broken =
        system.spawn_props(persistence.event_sourced_props("account|x", settings(), || Bank));
    assert!(matches!(
        broken.ask(AccountCmd::Balance, T).await,
        Err(AskError::NoReply | AskError::Stopped)
    ));
    broken.terminated().await;

    let snapshot: Snapshot = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    let seconds = "shardik_persistence_recovery_seconds";
    assert_eq!(samples(&snapshot, seconds, "event_sourced"), 2);
    assert_eq!(samples(&snapshot, seconds, "durable_state"), 2);
    assert_eq!(
        counter(&snapshot, "shardik_persistence_events_replayed_total", None),
        2
    );
    assert_eq!(
        counter(&snapshot, "shardik_persistence_snapshots_saved_total", None),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "shardik_persistence_snapshot_failures_total",
            None
        ),
        0
    );
    assert!(
        counter(
            &snapshot,
            "shardik_persistence_recovery_failures_total",
            Some("event_sourced")
        ) >= 1
    );
    system.shutdown().await;
}
