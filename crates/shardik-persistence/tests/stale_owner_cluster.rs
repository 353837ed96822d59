//! The case fencing tokens exist for, end to end on a three-node cluster: a node is cut off
//! and, with a failure detector far more tolerant than the others' (standing in for a node
//! that does not notice, e.g. one that was paused), never fences itself. The majority downs
//! it and moves its shards; the new owner of an account writes. The isolated node still
//! believes it owns the account and takes deposits for it locally: each is refused by the
//! store, also after the stale entity restarts and recovers, so none is acknowledged and the
//! journal holds only the new owner's writes after the move.

mod cluster_util;
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardik_actor::AskError;
use shardik_persistence::{persistence_id, InMemoryStore, Journal, PersistSettings, Persistence};
use shardik_remote::FaultInjector;
use shardik_sharding::cluster::{ClusterShardingSettings, ShardingStateStore};
use shardik_sharding::{shard_of, Region};

use cluster_util::{start_member_with, wait_state, Member};
use common::{AccountCmd, AccountEvent, Bank};

const TYPE: &str = "account";
const SHARDS: u32 = 12;
const ASK: Duration = Duration::from_secs(1);

fn start_bank(m: &Member, journal: &Arc<InMemoryStore>) -> Region<AccountCmd> {
    m.sharding
        .start_with(
            Persistence::new(journal.clone())
                .event_sourced(TYPE, PersistSettings::default(), |_| Bank)
                .shards(SHARDS),
            ClusterShardingSettings::default(),
        )
        .expect("bank starts")
}

async fn deposit(region: &Region<AccountCmd>, account: &str, n: u64) -> Result<u64, AskError> {
    region
        .ask(account, |r| AccountCmd::Deposit(n, r), ASK)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_that_never_fences_itself_cannot_write_after_its_shard_moved() {
    let faults = FaultInjector::new();
    let journal = Arc::new(InMemoryStore::new());
    let state = || -> Arc<dyn ShardingStateStore> { Arc::new(InMemoryStore::new()) };
    let f = faults.clone();
    let n0 = start_member_with("n0", None, state(), move |c| c.faults(f)).await;
    let seed = n0.id().address.clone();
    let f = faults.clone();
    let n1 = start_member_with("n1", Some(&seed), state(), move |c| c.faults(f)).await;
    let f = faults.clone();
    let n2 = start_member_with("n2", Some(&seed), state(), move |c| {
        c.faults(f)
            .acceptable_heartbeat_pause(Duration::from_secs(120))
    })
    .await;
    let nodes = [n0, n1, n2];
    let ids: Vec<_> = nodes.iter().map(|m| m.id().clone()).collect();
    for m in &nodes {
        wait_state(&m.cluster, "all up", |s| s.all_up(&ids)).await;
    }
    let regions: Vec<_> = nodes.iter().map(|m| start_bank(m, &journal)).collect();
    for m in &nodes {
        m.sharding
            .wait_registered(TYPE, Duration::from_secs(20))
            .await
            .expect("registered");
    }
    // An account whose shard n2 hosts, with one deposit written there.
    let mut account = None;
    for i in 0..100 {
        let name = format!("acct-{i}");
        assert_eq!(deposit(&regions[0], &name, 1).await, Ok(1), "{name}");
        let hosted = nodes[2].sharding.hosted_shards(TYPE).unwrap_or_default();
        if hosted.contains(&shard_of(&name, SHARDS)) {
            account = Some(name);
            break;
        }
    }
    let account = account.expect("n2 hosts some account");
    assert_eq!(deposit(&regions[2], &account, 1).await, Ok(2));
    let pid = persistence_id(TYPE, &account);
    let old_writer = journal.read(&pid, 1, 10).await.unwrap()[1].writer;

    // Cut n2 off. The majority downs it and the account moves; n0 keeps depositing until
    // the new owner acknowledges.
    for other in ["n0", "n1"] {
        faults.cut_both("n2", other);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let moved = loop {
        assert!(Instant::now() < deadline, "the account never moved");
        if let Ok(balance) = deposit(&regions[0], &account, 1).await {
            break balance;
        }
    };
    // (A deposit whose answer was lost to the cut or a timeout may be in it too.)
    assert!(moved >= 3, "{moved}");
    assert!(
        !nodes[2].cluster.state().fenced,
        "the isolated node does not know (the premise of the test)"
    );
    assert!(
        nodes[2]
            .sharding
            .hosted_shards(TYPE)
            .unwrap_or_default()
            .contains(&shard_of(&account, SHARDS)),
        "it still hosts the account's shard"
    );

    // The stale owner: refused, restarts and recovers the new owner's deposit, refused again.
    for attempt in 0..3 {
        assert_eq!(
            deposit(&regions[2], &account, 100).await,
            Err(AskError::NoReply),
            "stale deposit {attempt} is never acknowledged"
        );
    }
    // The journal: n2's two deposits, then only the new owner's, none of the stale ones.
    let events = journal.read(&pid, 1, 1_000).await.unwrap();
    assert_eq!(events.len() as u64, moved, "{events:?}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.payload.decode::<AccountEvent>().unwrap(),
            AccountEvent::Deposited { amount: 1 },
            "event {i}: no stale deposit was stored"
        );
        if i >= 2 {
            assert!(e.writer > old_writer, "event {i} by the new owner's token");
        }
    }
    assert_eq!(deposit(&regions[0], &account, 1).await, Ok(moved + 1));

    faults.heal_all();
    for m in &nodes {
        m.crash().await;
    }
}
