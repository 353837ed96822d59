//! Recovery and snapshots are visible in the metrics: how long recoveries take per kind of
//! entity, how many events they replay (what snapshots save), and recoveries that fail. One
//! test per binary: the recorder is global to the process.

mod common;

use std::sync::Arc;

use shardik_actor::{ActorSystem, AskError};
use shardik_persistence::{FaultyStore, InMemoryStore, PersistSettings};

use common::{
    counter_total, histogram_samples, install_recorder, persistence, take_metrics, AccountCmd,
    Bank, Counter, CounterCmd, T,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoveries_replays_and_snapshots_are_measured() {
    let snapshotter = install_recorder();
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

    let snapshot = take_metrics(&snapshotter);
    let seconds = "shardik_persistence_recovery_seconds";
    assert_eq!(
        histogram_samples(&snapshot, seconds, Some(("kind", "event_sourced"))),
        2
    );
    assert_eq!(
        histogram_samples(&snapshot, seconds, Some(("kind", "durable_state"))),
        2
    );
    assert_eq!(
        counter_total(&snapshot, "shardik_persistence_events_replayed_total", None),
        2
    );
    assert_eq!(
        counter_total(&snapshot, "shardik_persistence_snapshots_saved_total", None),
        1
    );
    assert_eq!(
        counter_total(
            &snapshot,
            "shardik_persistence_snapshot_failures_total",
            None
        ),
        0
    );
    assert!(
        counter_total(
            &snapshot,
            "shardik_persistence_recovery_failures_total",
            Some(("kind", "event_sourced"))
        ) >= 1
    );
    system.shutdown().await;
}
