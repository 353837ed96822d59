//! SQLite across a restart: drop the store and the system, reopen the file, state is back.

mod common;

use std::sync::Arc;

use shardik_actor::ActorSystem;
use shardik_persistence::{
    Journal, PersistSettings, Persistence, SnapshotStore, SqliteStore, StateStore,
};
use shardik_sharding::ShardingExt;

use common::{persistence, AccountCmd, Bank, Counter, CounterCmd, T};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_sourced_and_durable_state_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let settings = PersistSettings::default().snapshot_every(4);

    {
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        let system = ActorSystem::new("before");
        let p = persistence(store.clone());
        let account = system.spawn_props(p.event_sourced_props("acc", settings.clone(), || Bank));
        let counter =
            system.spawn_props(p.durable_state_props("cnt", settings.clone(), || Counter));
        for n in 1..=10 {
            account.ask(|r| AccountCmd::Deposit(n, r), T).await.unwrap();
            counter.ask(|r| CounterCmd::Add(n, r), T).await.unwrap();
        }
        system.shutdown().await;
    } // store and system dropped

    let store = Arc::new(SqliteStore::open(&path).unwrap());
    assert_eq!(store.highest_seq_nr("acc").await, Ok(10));
    assert_eq!(store.load_latest("acc").await.unwrap().unwrap().seq_nr, 8);
    assert_eq!(store.get("cnt").await.unwrap().unwrap().revision, 10);

    let system = ActorSystem::new("after");
    let p = persistence(store.clone()).with_incarnation(2);
    let account = system.spawn_props(p.event_sourced_props("acc", settings.clone(), || Bank));
    let counter = system.spawn_props(p.durable_state_props("cnt", settings, || Counter));
    assert_eq!(account.ask(AccountCmd::Inspect, T).await, Ok((55, 10)));
    assert_eq!(counter.ask(CounterCmd::Get, T).await, Ok(55));
    assert_eq!(
        account.ask(|r| AccountCmd::Deposit(45, r), T).await,
        Ok(100)
    );
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_keep_streams_consistent() {
    // Two handles on one file stand in for two processes on one machine.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = Arc::new(SqliteStore::open(&path).unwrap());
    let b = Arc::new(SqliteStore::open(&path).unwrap());
    let system = ActorSystem::new("shared");
    let on_a = system.spawn_props(persistence(a.clone()).event_sourced_props(
        "acc",
        PersistSettings::default(),
        || Bank,
    ));
    let on_b = system.spawn_props(persistence(b.clone()).event_sourced_props(
        "acc",
        PersistSettings::default(),
        || Bank,
    ));
    assert_eq!(on_a.ask(AccountCmd::Balance, T).await, Ok(0));
    assert_eq!(on_b.ask(AccountCmd::Balance, T).await, Ok(0));
    assert_eq!(on_a.ask(|r| AccountCmd::Deposit(3, r), T).await, Ok(3));
    // b's writer is behind: refused, not acknowledged; after its restart it writes after a's.
    assert!(on_b.ask(|r| AccountCmd::Deposit(4, r), T).await.is_err());
    assert_eq!(on_b.ask(|r| AccountCmd::Deposit(4, r), T).await, Ok(7));
    assert_eq!(a.highest_seq_nr("acc").await, Ok(2));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_durable_state_survives_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counters.db");
    for round in 1..=2u64 {
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        let persistence = Persistence::new(store.clone()).with_incarnation(round);
        let system = ActorSystem::new("counters");
        let counters = system
            .sharding()
            .start(persistence.durable_state("counter", PersistSettings::default(), |_| Counter))
            .unwrap();
        for id in ["a", "b", "c"] {
            let before = (round - 1) * 10;
            assert_eq!(counters.ask(id, CounterCmd::Get, T).await, Ok(before));
            assert_eq!(
                counters.ask(id, |r| CounterCmd::Add(10, r), T).await,
                Ok(before + 10)
            );
        }
        assert_eq!(
            store.get("counter|b").await.unwrap().unwrap().revision,
            round
        );
        system.shutdown().await;
    }
}
