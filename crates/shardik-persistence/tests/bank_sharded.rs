//! A sharded bank: deposits from many concurrent callers, balances survive passivation and
//! a full restart (system and store dropped, the SQLite file reopened or the PostgreSQL
//! schema connected again).

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use shardik_actor::ActorSystem;
use shardik_persistence::{
    PersistSettings, Persistence, PostgresOptions, PostgresStore, SqliteStore,
};
use shardik_sharding::{Region, ShardingExt};

use common::{AccountCmd, Bank, T};

const ACCOUNTS: u64 = 50;
const DEPOSITS: u64 = 20;

fn start(system: &ActorSystem, persistence: &Persistence) -> Region<AccountCmd> {
    let settings = PersistSettings::default()
        .snapshot_every(8)
        .keep_snapshots(2)
        .delete_events_on_snapshot();
    system
        .sharding()
        .start(
            persistence
                .event_sourced("account", settings, |_| Bank)
                .shards(16),
        )
        .unwrap()
}

/// Runs the bank twice over what `open(incarnation)` connects to.
async fn balances_survive_a_full_restart<F, Fut>(open: F)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Persistence>,
{
    let mut acknowledged = HashMap::new();
    {
        let persistence = open(1).await;
        let system = ActorSystem::new("bank-1");
        let accounts = start(&system, &persistence);
        let mut callers = tokio::task::JoinSet::new();
        for id in 0..ACCOUNTS {
            let accounts = accounts.clone();
            callers.spawn(async move {
                let name = format!("acct-{id}");
                let mut last = 0;
                for n in 1..=DEPOSITS {
                    last = accounts
                        .ask(&name, |r| AccountCmd::Deposit(id + n, r), T)
                        .await
                        .unwrap();
                }
                (name, last)
            });
        }
        while let Some(done) = callers.join_next().await {
            let (name, balance) = done.unwrap();
            acknowledged.insert(name, balance);
        }
        // Passivated accounts come back from snapshot + events.
        for id in 0..5 {
            assert!(accounts.passivate(&format!("acct-{id}")));
        }
        for (name, balance) in &acknowledged {
            assert_eq!(
                accounts.ask(name, AccountCmd::Balance, T).await,
                Ok(*balance)
            );
        }
        system.shutdown().await;
    } // system, region and store dropped

    let persistence = open(2).await;
    let system = ActorSystem::new("bank-2");
    let accounts = start(&system, &persistence);
    for id in 0..ACCOUNTS {
        let name = format!("acct-{id}");
        let balance = DEPOSITS * id + DEPOSITS * (DEPOSITS + 1) / 2;
        assert_eq!(acknowledged[&name], balance);
        assert_eq!(
            accounts.ask(&name, AccountCmd::Inspect, T).await,
            Ok((balance, DEPOSITS))
        );
    }
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bank_survives_a_full_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank.db");
    balances_survive_a_full_restart(|incarnation| {
        let store = SqliteStore::open(&path).unwrap();
        async move { Persistence::new(Arc::new(store)).with_incarnation(incarnation) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bank_survives_a_full_restart() {
    let Some(url) = common::pg_env("SHARDIK_PG_URL", "PostgreSQL bank test") else {
        return;
    };
    let schema = format!("bank_{}", std::process::id());
    balances_survive_a_full_restart(|incarnation| {
        let (url, schema) = (url.clone(), schema.clone());
        async move {
            let options = PostgresOptions {
                schema,
                ..PostgresOptions::default()
            };
            let store = PostgresStore::connect_with(&url, options).await.unwrap();
            Persistence::new(Arc::new(store)).with_incarnation(incarnation)
        }
    })
    .await;
}
