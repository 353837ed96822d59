//! `shardik_persistence_persist_failures_total` says why a persist failed, so an operator can
//! tell an owner fenced out by its shard's next home from a store that fails. One test per
//! binary: the recorder is global to the process.

mod common;

use std::sync::Arc;

use shardik_actor::{ActorSystem, AskError};
use shardik_persistence::{FaultyStore, InMemoryStore, Persistence};

use common::{counter_total, fenced_bank, install_recorder, take_metrics, AccountCmd, T};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persist_failures_are_counted_by_reason() {
    let snapshotter = install_recorder();
    let store = Arc::new(FaultyStore::new(Arc::new(InMemoryStore::new())));
    let system = ActorSystem::new("metrics");
    let persistence = Persistence::new(store.clone());
    let old = system.spawn_props(fenced_bank(persistence.clone(), "account|a", 100));
    assert_eq!(old.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(1));
    let new = system.spawn_props(fenced_bank(persistence, "account|a", 200));
    assert_eq!(new.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(2));
    // The old owner recovered before the new one wrote: its position is stale too, but the
    // newer writer is what refuses it. Refused again after its restart.
    for _ in 0..2 {
        assert_eq!(
            old.ask(|r| AccountCmd::Deposit(1, r), T).await,
            Err(AskError::NoReply)
        );
    }
    // A store that fails counts as such.
    store.fail_writes(true);
    assert_eq!(
        new.ask(|r| AccountCmd::Deposit(1, r), T).await,
        Err(AskError::NoReply)
    );
    let metrics = take_metrics(&snapshotter);
    let failures = |reason: &str| {
        counter_total(
            &metrics,
            "shardik_persistence_persist_failures_total",
            Some(("reason", reason)),
        )
    };
    assert_eq!(failures("fenced"), 2);
    assert_eq!(failures("store"), 1);
    assert_eq!(failures("conflict"), 0);
    system.shutdown().await;
}
