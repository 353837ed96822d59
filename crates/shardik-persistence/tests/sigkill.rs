//! A bank node killed with SIGKILL loses no acknowledged deposit.
//!
//! The test re-runs its own binary as a child "node" (the ignored test `bank_node`), which
//! deposits into SQLite-backed sharded accounts without end and prints every acknowledged
//! balance. The parent kills it with SIGKILL after enough acknowledgements, reopens the file
//! and checks that every account holds at least what was acknowledged (and at most one more
//! deposit: the one in flight when the node died).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use shardik_actor::ActorSystem;
use shardik_persistence::{PersistSettings, Persistence, SqliteStore};
use shardik_sharding::{Region, ShardingExt};

use common::{AccountCmd, Bank, T};

const ACCOUNTS: usize = 20;
const ACKS_BEFORE_KILL: usize = 400;
const DB_ENV: &str = "SHARDIK_SIGKILL_DB";

fn start(system: &ActorSystem, persistence: &Persistence) -> Region<AccountCmd> {
    let settings = PersistSettings::default().snapshot_every(16);
    let bank = persistence.event_sourced("account", settings, |_| Bank);
    system.sharding().start(bank).unwrap()
}

#[test]
fn no_acknowledged_deposit_is_lost_when_the_node_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bank.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "bank_node", "--nocapture"])
        .env(DB_ENV, &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the node process");

    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut count = 0;
    let mut record = |line: &str| {
        if let Some(rest) = line.strip_prefix("ack ") {
            let (account, balance) = rest.split_once(' ').unwrap();
            let balance: u64 = balance.parse().unwrap();
            let best = acked.entry(account.to_string()).or_default();
            *best = (*best).max(balance);
            return true;
        }
        false
    };
    while count < ACKS_BEFORE_KILL {
        let line = lines
            .next()
            .expect("the node stopped before enough deposits")
            .unwrap();
        if record(&line) {
            count += 1;
        }
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    // Acknowledgements the node printed before it died but this side had not read yet.
    for line in lines {
        let Ok(line) = line else { break };
        record(&line);
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let system = ActorSystem::new("after-kill");
        let accounts = start(&system, &Persistence::new(store));
        for (account, acknowledged) in &acked {
            let balance = accounts.ask(account, AccountCmd::Balance, T).await.unwrap();
            assert!(
                (*acknowledged..=acknowledged + 1).contains(&balance),
                "{account}: acknowledged {acknowledged}, recovered {balance}"
            );
        }
        system.shutdown().await;
    });
}

/// The node process of the test above; does nothing unless started by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by no_acknowledged_deposit_is_lost_when_the_node_is_killed"]
async fn bank_node() {
    let Some(db) = std::env::var_os(DB_ENV) else {
        return;
    };
    let store = Arc::new(SqliteStore::open(db).unwrap());
    let system = ActorSystem::new("node");
    let accounts = start(&system, &Persistence::new(store));
    let mut depositors = tokio::task::JoinSet::new();
    for id in 0..ACCOUNTS {
        let accounts = accounts.clone();
        depositors.spawn(async move {
            let account = format!("acct-{id}");
            loop {
                let balance = accounts
                    .ask(&account, |r| AccountCmd::Deposit(1, r), T)
                    .await
                    .unwrap();
                println!("ack {account} {balance}");
            }
        });
    }
    while depositors.join_next().await.is_some() {}
}
