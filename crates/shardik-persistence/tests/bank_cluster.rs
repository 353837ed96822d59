//! The bank on a three-node cluster: event-sourced accounts sharded over the nodes, the
//! journal and each node's sharding state on the stores. Deposits go through every node;
//! the youngest node crashes while they run; its accounts fail over to the others (their
//! shards are allocated again, with higher fencing tokens, which the accounts write with
//! there); then the whole cluster stops and a new one starts on the same storage. No
//! acknowledged deposit is lost, nothing that was not attempted appears, and the deposits of
//! the new cluster are stored with their shard's fencing token.
//!
//! SQLite: one file shared by the three nodes (as processes on one machine would share
//! it). PostgreSQL: one schema; runs when `SHARDIK_PG_URL` names a server.
//! Rebalancing runs (shards move between the nodes whichever their age).

mod cluster_util;
mod common;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shardik_persistence::{
    persistence_id, PersistSettings, Persistence, PostgresOptions, PostgresStore, SqliteStore,
};
use shardik_sharding::cluster::{ClusterShardingSettings, ShardingStateStore};
use shardik_sharding::{shard_of, Region};
use tokio::sync::watch;

use cluster_util::{coordinator_where, members, stop_all, wait_state, Member};
use common::{AccountCmd, Bank};

const TYPE: &str = "account";
const ACCOUNTS: usize = 24;
const SHARDS: u32 = 12;
const ASK: Duration = Duration::from_secs(3);

fn start_bank(m: &Member, persistence: &Persistence) -> Region<AccountCmd> {
    let settings = PersistSettings::default().snapshot_every(10);
    let sharding = ClusterShardingSettings::default().rebalance_interval(Duration::from_secs(1));
    m.sharding
        .start_with(
            persistence
                .event_sourced(TYPE, settings, |_| Bank)
                .shards(SHARDS),
            sharding,
        )
        .expect("bank starts")
}

fn account(i: usize) -> String {
    format!("acct-{i}")
}

/// Per account: deposits of 1 attempted, acknowledged, acknowledged after the crash.
#[derive(Default)]
struct Ledger {
    attempted: Mutex<HashMap<String, u64>>,
    acked: Mutex<HashMap<String, u64>>,
    acked_after_crash: Mutex<HashMap<String, u64>>,
    crashed: AtomicBool,
    /// Total acknowledgements, for the test to await.
    total: watch::Sender<u64>,
}

/// Deposits 1 into every account in turn through `region` until `stop`.
fn caller(
    region: Region<AccountCmd>,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    offset: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = offset;
        while !stop.load(Ordering::SeqCst) {
            let name = account(i % ACCOUNTS);
            i += 1;
            *ledger.attempted.lock().entry(name.clone()).or_default() += 1;
            let crashed = ledger.crashed.load(Ordering::SeqCst);
            if region
                .ask(&name, |r| AccountCmd::Deposit(1, r), ASK)
                .await
                .is_ok()
            {
                *ledger.acked.lock().entry(name.clone()).or_default() += 1;
                if crashed {
                    *ledger.acked_after_crash.lock().entry(name).or_default() += 1;
                }
                ledger.total.send_modify(|n| *n += 1);
            }
        }
    })
}

async fn until_acked(ledger: &Ledger, n: u64) {
    let mut rx = ledger.total.subscribe();
    tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|t| *t >= n))
        .await
        .expect("deposits acknowledged in time")
        .expect("ledger open");
}

/// The balance of every account, asked through `regions` in turn (retried while a shard
/// finds its new home: the ask may time out, a balance read changes nothing).
async fn balances(regions: &[&Region<AccountCmd>]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for i in 0..ACCOUNTS {
        let name = account(i);
        let region = regions[i % regions.len()];
        let mut tries = 0;
        let balance = loop {
            match region.ask(&name, AccountCmd::Balance, ASK).await {
                Ok(b) => break b,
                Err(e) => {
                    tries += 1;
                    assert!(tries < 10, "balance of {name}: {e}");
                }
            }
        };
        out.insert(name, balance);
    }
    out
}

/// Life `n` of the bank: three members on what `open(node, n)` gives, the bank started and
/// registered on each.
async fn life<F, Fut>(
    open: &F,
    n: u64,
) -> (
    Vec<Member>,
    Vec<Region<AccountCmd>>,
    Vec<Arc<dyn ShardingStateStore>>,
    Vec<Persistence>,
)
where
    F: Fn(usize, u64) -> Fut,
    Fut: Future<Output = (Persistence, Arc<dyn ShardingStateStore>)>,
{
    let (mut persistences, mut stores) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let (p, s) = open(i, n).await;
        persistences.push(p);
        stores.push(s);
    }
    let nodes = members(&stores).await;
    let regions: Vec<_> = nodes
        .iter()
        .zip(&persistences)
        .map(|(m, p)| start_bank(m, p))
        .collect();
    for m in &nodes {
        m.sharding
            .wait_registered(TYPE, Duration::from_secs(20))
            .await
            .expect("registered");
    }
    (nodes, regions, stores, persistences)
}

/// Two lives of the bank over what `open(node, life)` gives (the journal and the node's
/// sharding state store).
async fn bank_survives_failover_and_full_restart<F, Fut>(open: F)
where
    F: Fn(usize, u64) -> Fut,
    Fut: Future<Output = (Persistence, Arc<dyn ShardingStateStore>)>,
{
    let ledger = Arc::new(Ledger::default());
    let (nodes, regions, stores, persistences) = life(&open, 1).await;
    // Deposits through every node, one caller each.
    let stops: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let callers: Vec<_> = (0..3)
        .map(|i| caller(regions[i].clone(), ledger.clone(), stops[i].clone(), i * 7))
        .collect();
    until_acked(&ledger, 150).await;
    // The youngest node (with node incarnations instead of fencing tokens, its streams would
    // carry a writer above the survivors').
    const VICTIM: usize = 2;
    let on_victim = nodes[VICTIM]
        .sharding
        .hosted_shards(TYPE)
        .unwrap_or_default();
    assert!(
        !on_victim.is_empty(),
        "the victim hosts accounts before it crashes"
    );

    // It crashes (no leave) while the callers run; its caller stops with it.
    ledger.crashed.store(true, Ordering::SeqCst);
    stops[VICTIM].store(true, Ordering::SeqCst);
    nodes[VICTIM].crash().await;
    let gone = nodes[VICTIM].id().clone();
    for m in &nodes[..VICTIM] {
        wait_state(&m.cluster, "victim removed", |s| {
            s.member(&gone).is_none_or(|x| {
                matches!(
                    x.status,
                    shardik_cluster::member::MemberStatus::Down
                        | shardik_cluster::member::MemberStatus::Removed
                )
            })
        })
        .await;
    }
    // Every account, those that lived on the victim too, takes deposits again on the
    // survivors.
    let mut rx = ledger.total.subscribe();
    tokio::time::timeout(
        Duration::from_secs(60),
        rx.wait_for(|_| {
            let after = ledger.acked_after_crash.lock();
            (0..ACCOUNTS).all(|i| after.get(&account(i)).copied().unwrap_or(0) >= 2)
        }),
    )
    .await
    .expect("every account failed over in time")
    .expect("ledger open");
    for s in &stops {
        s.store(true, Ordering::SeqCst);
    }
    for c in callers {
        c.await.expect("caller");
    }
    let after_failover = balances(&[&regions[0], &regions[1]]).await;
    {
        let attempted = ledger.attempted.lock();
        let acked = ledger.acked.lock();
        for (name, balance) in &after_failover {
            let (lo, hi) = (acked[name], attempted[name]);
            assert!(
                lo <= *balance && *balance <= hi,
                "{name}: balance {balance}, acknowledged {lo}, attempted {hi}"
            );
        }
    }

    // The whole cluster stops; a new one starts on the same storage.
    stop_all(&nodes).await;
    drop((regions, nodes, stores, persistences));
    let (nodes, regions, _stores, persistences) = life(&open, 2).await;
    let refs: Vec<&Region<AccountCmd>> = regions.iter().collect();
    assert_eq!(balances(&refs).await, after_failover);
    let before = coordinator_where(&nodes, TYPE, "coordinator", |_| true).await;
    // And they keep taking deposits.
    for (i, region) in regions.iter().enumerate() {
        let name = account(i);
        assert_eq!(
            region
                .ask(
                    &name,
                    |r| AccountCmd::Deposit(1, r),
                    Duration::from_secs(10)
                )
                .await,
            Ok(after_failover[&name] + 1)
        );
    }
    // Each deposit was written with the fencing token of its shard's allocation (where the
    // shard did not move meanwhile), not with the node's incarnation.
    let after = coordinator_where(&nodes, TYPE, "coordinator", |_| true).await;
    let journal = persistences[0].journal();
    let mut checked = 0;
    for i in 0..regions.len() {
        let name = account(i);
        let shard = shard_of(&name, SHARDS);
        let token = after.state.token(shard);
        assert_ne!(token, 0, "{name}: shard {shard} has a token");
        if before.state.token(shard) != token {
            continue; // Allocated or moved while we deposited.
        }
        let pid = persistence_id(TYPE, &name);
        let last = journal.highest_seq_nr(&pid).await.unwrap();
        let events = journal.read(&pid, last, 1).await.unwrap();
        assert_eq!(
            events[0].writer, token,
            "{name}: written with its shard's token"
        );
        checked += 1;
    }
    assert!(
        checked > 0,
        "some shard kept its home while it took a deposit"
    );
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bank_survives_failover_and_full_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank.db");
    bank_survives_failover_and_full_restart(|_, _| {
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        async move {
            let sharding: Arc<dyn ShardingStateStore> = store.clone();
            (Persistence::new(store), sharding)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bank_survives_failover_and_full_restart() {
    let Some(url) = common::pg_env("SHARDIK_PG_URL", "PostgreSQL bank cluster test") else {
        return;
    };
    let schema = format!("bank_cluster_{}", std::process::id());
    bank_survives_failover_and_full_restart(|_, _| {
        let (url, schema) = (url.clone(), schema.clone());
        async move {
            let options = PostgresOptions {
                schema,
                pool_size: 4,
                ..PostgresOptions::default()
            };
            let store = Arc::new(PostgresStore::connect_with(&url, options).await.unwrap());
            let sharding: Arc<dyn ShardingStateStore> = store.clone();
            (Persistence::new(store), sharding)
        }
    })
    .await;
}
