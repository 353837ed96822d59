//! Entity-level cases: recovery, snapshots and retention, conflicts, durable state.

use std::sync::Arc;

use shardik_actor::{ActorSystem, AskError, StopReason, SupervisorStrategy};
use shardik_persistence::{
    persistence_id, DurableStateEntity, Payload, PersistSettings, SnapshotRecord, StateWrite,
};
use shardik_sharding::{ShardingError, ShardingExt};

use super::{amounts, append, Store};
use crate::common::{
    fenced_bank, persistence, Account, AccountCmd, Bank, Count, Counter, CounterCmd, T,
};

/// Spawns a plain event-sourced bank account, runs `f` on it, then stops it and waits.
async fn with_account<S: Store, F, Fut>(store: &Arc<S>, pid: &str, settings: PersistSettings, f: F)
where
    F: FnOnce(shardik_actor::ActorRef<AccountCmd>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let system = ActorSystem::new("suite");
    let props = persistence(store.clone()).event_sourced_props(pid, settings, || Bank);
    let account = system.spawn_props(props);
    f(account.clone()).await;
    system.shutdown().await;
}

pub async fn entity_recovers_from_events<S: Store>(store: Arc<S>) {
    with_account(
        &store,
        "acc-1",
        PersistSettings::default(),
        |a| async move {
            for n in 1..=5 {
                a.ask(|r| AccountCmd::Deposit(n, r), T).await.unwrap();
            }
            assert_eq!(
                a.ask(|r| AccountCmd::Withdraw(100, r), T).await,
                Ok(Err("balance 15 too low".into()))
            );
        },
    )
    .await;
    assert_eq!(store.highest_seq_nr("acc-1").await, Ok(5));
    assert_eq!(store.load_latest("acc-1").await, Ok(None));
    with_account(
        &store,
        "acc-1",
        PersistSettings::default(),
        |a| async move {
            assert_eq!(a.ask(AccountCmd::Inspect, T).await, Ok((15, 5)));
            assert_eq!(a.ask(|r| AccountCmd::Withdraw(5, r), T).await, Ok(Ok(10)));
        },
    )
    .await;
    assert_eq!(store.highest_seq_nr("acc-1").await, Ok(6));
}

pub async fn entity_recovers_from_snapshot_and_events<S: Store>(store: Arc<S>) {
    let settings = PersistSettings::default().snapshot_every(3);
    with_account(&store, "acc-2", settings.clone(), |a| async move {
        for _ in 0..7 {
            a.ask(|r| AccountCmd::Deposit(10, r), T).await.unwrap();
        }
    })
    .await;
    let snapshot = store.load_latest("acc-2").await.unwrap().unwrap();
    assert_eq!(snapshot.seq_nr, 6);
    // Remove the events the snapshot covers: recovery can only succeed from the snapshot.
    store.delete_up_to("acc-2", 6).await.unwrap();
    with_account(&store, "acc-2", settings, |a| async move {
        assert_eq!(a.ask(AccountCmd::Inspect, T).await, Ok((70, 7)));
    })
    .await;
}

/// An entity whose stream lost events it needs (deleted without a snapshot to stand in for
/// them) does not recover from what is left: it never answers from a wrong state.
pub async fn entity_with_missing_events_does_not_recover<S: Store>(store: Arc<S>) {
    with_account(
        &store,
        "acc-gap",
        PersistSettings::default(),
        |a| async move {
            for _ in 0..5 {
                a.ask(|r| AccountCmd::Deposit(1, r), T).await.unwrap();
            }
        },
    )
    .await;
    store.delete_up_to("acc-gap", 2).await.unwrap();
    let system = ActorSystem::new("suite");
    let props = persistence(store.clone())
        .event_sourced_props("acc-gap", PersistSettings::default(), || Bank)
        .supervisor(shardik_actor::SupervisorStrategy::Stop);
    let account = system.spawn_props(props);
    let reply = account.ask(AccountCmd::Balance, T).await;
    assert!(
        matches!(reply, Err(AskError::NoReply | AskError::Stopped)),
        "no answer from an entity missing events 1 and 2: {reply:?}"
    );
    account.terminated().await;
    system.shutdown().await;
}

/// Why an entity spawned from `props` (whose supervisor must stop it at its first failure)
/// stopped, after it gets `command` without answering it.
async fn first_failure<M, A, R>(
    props: shardik_actor::Props<A>,
    command: impl FnOnce(shardik_actor::ReplyTo<R>) -> M,
) -> String
where
    A: shardik_actor::Actor<Msg = M>,
    M: Send + 'static,
    R: Send + std::fmt::Debug + 'static,
{
    let system = ActorSystem::new("suite");
    let entity = system.spawn_props(props.supervisor(SupervisorStrategy::Stop));
    let reply = entity.ask(command, T).await;
    assert!(
        matches!(reply, Err(AskError::NoReply | AskError::Stopped)),
        "no answer from the entity: {reply:?}"
    );
    let why = match entity.terminated().await.reason {
        StopReason::Failed(why) => why,
        other => panic!("the entity stopped without failing: {other:?}"),
    };
    system.shutdown().await;
    why
}

/// The journal ends below the latest snapshot (here the snapshot is saved by hand; in
/// production, with the journal and the snapshots in different stores and one of them
/// restored from an older backup). Recovery fails and says so, instead of ending at the
/// snapshot with every write refused as a conflict from then on.
pub async fn entity_with_a_snapshot_ahead_of_the_journal_does_not_recover<S: Store>(store: Arc<S>) {
    let pid = "acc-ahead";
    store.append(append(pid, 0, 1, &[1, 1, 1])).await.unwrap();
    let state = Account {
        balance: 5,
        applied: 5,
    };
    store
        .save(SnapshotRecord {
            persistence_id: pid.into(),
            seq_nr: 5,
            payload: Payload::encode(&state).unwrap(),
        })
        .await
        .unwrap();
    let props =
        persistence(store.clone()).event_sourced_props(pid, PersistSettings::default(), || Bank);
    let why = first_failure(props, AccountCmd::Inspect).await;
    assert!(
        why.contains("recovery of acc-ahead failed")
            && why.contains("snapshot is at sequence number 5")
            && why.contains("journal's highest is 3"),
        "{why}"
    );
    assert_eq!(store.highest_seq_nr(pid).await, Ok(3));
}

/// Numbers that no write can follow, as a stored -1 or -2 reads on SQLite and PostgreSQL
/// (here written through the store as `u64::MAX` and `u64::MAX - 1`): a snapshot's sequence
/// number fails recovery with an error naming the value, instead of an overflow (a panic, or
/// a wrapped number in a release build). A stream's or a durable state's newest writer at
/// `i64::MAX`, the highest a store keeps, fails the next owner's takeover with an error
/// naming it, instead of a write as `i64::MAX + 1` (which SQLite and PostgreSQL would store
/// as a negative, corrupt number; until 2026-11-30).
pub async fn corrupt_stored_numbers_fail_with_an_error<S: Store>(store: Arc<S>) {
    let settings = PersistSettings::default;
    let p = persistence(store.clone());
    for (n, corrupt) in [u64::MAX, u64::MAX - 1].into_iter().enumerate() {
        let pid = format!("acc-corrupt-snapshot-{n}");
        store
            .save(SnapshotRecord {
                persistence_id: pid.clone(),
                seq_nr: corrupt,
                payload: Payload::encode(&Account::default()).unwrap(),
            })
            .await
            .unwrap();
        let props = p.event_sourced_props(&pid, settings(), || Bank);
        let why = first_failure(props, AccountCmd::Inspect).await;
        assert!(
            why.contains(&format!("sequence number {corrupt} is corrupt")),
            "{why}"
        );
    }

    let top = i64::MAX as u64;
    let highest =
        |pid: &str| format!("writer incarnation {top} of {pid} is the highest a store keeps");
    let pid = "acc-top-writer";
    store.append(append(pid, 0, top, &[4])).await.unwrap();
    let props = p.event_sourced_props(pid, settings(), || Bank);
    let why = first_failure(props, |r| AccountCmd::Deposit(1, r)).await;
    assert!(why.contains(&highest(pid)), "{why}");
    assert_eq!(amounts(&*store, pid, 1).await, [(1, 4)]);

    let pid = "counter-top-writer";
    let write = StateWrite {
        persistence_id: pid.to_string(),
        expected_revision: 0,
        writer: top,
        payload: Payload::encode(&Count { value: 4 }).unwrap(),
    };
    assert_eq!(store.upsert(write).await, Ok(1));
    let props = p.durable_state_props(pid, settings(), || Counter);
    let why = first_failure(props, |r| CounterCmd::Add(1, r)).await;
    assert!(why.contains(&highest(pid)), "{why}");
    assert_eq!(store.get(pid).await.unwrap().unwrap().revision, 1);
}

/// A writer incarnation above `i64::MAX` (a `Persistence::with_incarnation` of any `u64`)
/// is refused at write time with an error naming it, on every write path, and nothing is
/// stored. Found by a review on 2026-11-30: it was stored (negative in SQLite and
/// PostgreSQL), read back as corrupt, and the next owner's takeover of the stream failed.
pub async fn writers_above_i64_max_are_refused<S: Store>(store: Arc<S>) {
    let settings = PersistSettings::default;
    for (n, writer) in [i64::MAX as u64 + 1, u64::MAX].into_iter().enumerate() {
        let above = |pid: &str| format!("writer incarnation {writer} of {pid} is above");
        let pid = format!("acc-big-writer-{n}");
        let why = store
            .append(append(&pid, 0, writer, &[4]))
            .await
            .unwrap_err();
        assert!(why.to_string().contains(&above(&pid)), "{why}");
        assert_eq!(store.highest_seq_nr(&pid).await, Ok(0));

        let pid = format!("counter-big-writer-{n}");
        let write = StateWrite {
            persistence_id: pid.clone(),
            expected_revision: 0,
            writer,
            payload: Payload::encode(&Count { value: 4 }).unwrap(),
        };
        let why = store.upsert(write).await.unwrap_err();
        assert!(why.to_string().contains(&above(&pid)), "{why}");
        assert_eq!(store.get(&pid).await.unwrap(), None);

        // Entities of a node whose incarnation is that high.
        let p = persistence(store.clone()).with_incarnation(writer);
        let pid = format!("acc-big-incarnation-{n}");
        let props = p.event_sourced_props(&pid, settings(), || Bank);
        let why = first_failure(props, |r| AccountCmd::Deposit(1, r)).await;
        assert!(why.contains(&above(&pid)), "{why}");
        assert_eq!(store.highest_seq_nr(&pid).await, Ok(0));

        let pid = format!("counter-big-incarnation-{n}");
        let props = p.durable_state_props(&pid, settings(), || Counter);
        let why = first_failure(props, |r| CounterCmd::Add(1, r)).await;
        assert!(why.contains(&above(&pid)), "{why}");
        assert_eq!(store.get(&pid).await.unwrap(), None);
    }
}

/// A durable state whose stored revision no write can follow (a -1 or -2 in SQLite or
/// PostgreSQL, read back above `i64::MAX`; `corrupt` stores the given value, behind the
/// store's back) fails to load with an error naming the value, as a journal's such sequence
/// number fails recovery: the entity answers nothing from it. (Before, a -1 loaded, answered
/// queries, and failed only at its next write; until 2026-12-01 a -2 loaded and its next
/// write stored -1.) `persistence` must read from `store`'s states.
pub async fn a_durable_state_with_a_corrupt_revision_does_not_load<S, F, Fut>(
    store: Arc<S>,
    persistence: shardik_persistence::Persistence,
    corrupt: F,
) where
    S: shardik_persistence::StateStore,
    F: Fn(Arc<S>, &'static str, i64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for (pid, stored) in [
        ("counter-corrupt-revision", -1i64),
        ("counter-corrupt-revision-2", -2),
    ] {
        let write = StateWrite {
            persistence_id: pid.into(),
            expected_revision: 0,
            writer: 1,
            payload: Payload::encode(&Count { value: 4 }).unwrap(),
        };
        assert_eq!(store.upsert(write).await, Ok(1));
        corrupt(store.clone(), pid, stored).await;
        let props = persistence.durable_state_props(pid, PersistSettings::default(), || Counter);
        let why = first_failure(props, CounterCmd::Get).await;
        assert!(
            why.contains(&format!(
                "recovery of {pid} failed: the stored revision {} is corrupt: \
                 no write can follow it",
                stored as u64
            )),
            "{why}"
        );
    }
}

/// An event-sourced stream whose position and latest snapshot are at a number no event can
/// follow (a -1 or -2 in SQLite or PostgreSQL, read back above `i64::MAX`; `corrupt` puts
/// the stream's rows, its position and its snapshot at the given value, behind the store's
/// back) fails recovery with an error naming the value. (Until 2026-12-01 only a -1 did: at
/// -2 the entity recovered, answered, and its next write stored an event at -1.)
pub async fn an_event_sourced_entity_with_a_corrupt_position_does_not_recover<S, F, Fut>(
    store: Arc<S>,
    corrupt: F,
) where
    S: Store,
    F: Fn(Arc<S>, String, i64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let p = persistence(store.clone());
    for stored in [-1i64, -2] {
        let pid = format!("acc-corrupt-position{stored}");
        store.append(append(&pid, 0, 1, &[4])).await.unwrap();
        store
            .save(SnapshotRecord {
                persistence_id: pid.clone(),
                seq_nr: 1,
                payload: Payload::encode(&Account::default()).unwrap(),
            })
            .await
            .unwrap();
        corrupt(store.clone(), pid.clone(), stored).await;
        assert_eq!(store.highest_seq_nr(&pid).await, Ok(stored as u64));
        let props = p.event_sourced_props(&pid, PersistSettings::default(), || Bank);
        let why = first_failure(props, AccountCmd::Inspect).await;
        assert!(
            why.contains(&format!(
                "recovery of {pid} failed: the stored sequence number {} is corrupt",
                stored as u64
            )),
            "{why}"
        );
    }
}

/// A type name containing `|` could share persistence ids with another type (`"a|b"` with
/// entity `"c"` and `"a"` with entity `"b|c"` both map to `"a|b|c"`): its entities refuse to
/// start and write nothing, while the other type's entity owns its stream alone.
pub async fn a_type_name_with_the_separator_is_refused<S: Store>(store: Arc<S>) {
    let system = ActorSystem::new("suite");
    let p = persistence(store.clone());
    let settings = PersistSettings::default;
    let sharding = system.sharding();
    let fine = sharding
        .start(p.event_sourced("a", settings(), |_| Bank))
        .unwrap();
    // Type "a|b" with entity "c" would write "a|b|c", as type "a" with entity "b|c" does.
    for refused in [
        sharding
            .start(p.event_sourced("a|b", settings(), |_| Bank))
            .map(|_| ()),
        sharding
            .start(p.durable_state("c|d", settings(), |_| Counter))
            .map(|_| ()),
    ] {
        match refused {
            Err(ShardingError::InvalidSettings { problem, .. }) => {
                assert!(problem.contains("contains '|'"), "{problem}")
            }
            other => panic!("a type name with '|' was not refused: {other:?}"),
        }
    }
    assert_eq!(
        fine.ask("b|c", |r| AccountCmd::Deposit(5, r), T).await,
        Ok(5)
    );
    assert_eq!(amounts(&*store, "a|b|c", 1).await, [(1, 5)]);
    system.shutdown().await;
}

pub async fn entity_snapshot_retention<S: Store>(store: Arc<S>) {
    let settings = PersistSettings::default()
        .snapshot_every(2)
        .keep_snapshots(2)
        .delete_events_on_snapshot();
    with_account(&store, "acc-3", settings.clone(), |a| async move {
        for _ in 0..10 {
            a.ask(|r| AccountCmd::Deposit(1, r), T).await.unwrap();
        }
    })
    .await;
    // Snapshots at 8 and 10 are kept; events up to 8 (the oldest kept snapshot) are gone.
    assert_eq!(amounts(&*store, "acc-3", 1).await, [(9, 1), (10, 1)]);
    assert_eq!(store.highest_seq_nr("acc-3").await, Ok(10));
    assert_eq!(
        store.load_latest("acc-3").await.unwrap().unwrap().seq_nr,
        10
    );
    assert_eq!(
        store
            .load_at_most("acc-3", 9)
            .await
            .unwrap()
            .unwrap()
            .seq_nr,
        8
    );
    assert_eq!(
        store.load_at_most("acc-3", 7).await,
        Ok(None),
        "snapshots before 8 deleted"
    );
    with_account(&store, "acc-3", settings, |a| async move {
        assert_eq!(a.ask(AccountCmd::Inspect, T).await, Ok((10, 10)));
    })
    .await;
}

pub async fn entity_conflict_is_not_acknowledged<S: Store>(store: Arc<S>) {
    let system = ActorSystem::new("suite");
    let pid = persistence_id("account", "shared");
    let p = persistence(store.clone());
    let first =
        system.spawn_props(p.event_sourced_props(&pid, PersistSettings::default(), || Bank));
    let second =
        system.spawn_props(p.event_sourced_props(&pid, PersistSettings::default(), || Bank));
    // Both have recovered the empty stream.
    assert_eq!(first.ask(AccountCmd::Balance, T).await, Ok(0));
    assert_eq!(second.ask(AccountCmd::Balance, T).await, Ok(0));
    assert_eq!(first.ask(|r| AccountCmd::Deposit(10, r), T).await, Ok(10));
    // The second writer's position is stale: its write is refused and never acknowledged.
    assert_eq!(
        second.ask(|r| AccountCmd::Deposit(5, r), T).await,
        Err(AskError::NoReply)
    );
    assert_eq!(amounts(&*store, &pid, 1).await, [(1, 10)]);
    // It restarted and recovered: it now sees the first writer's deposit and writes after it.
    assert_eq!(second.ask(|r| AccountCmd::Deposit(5, r), T).await, Ok(15));
    assert_eq!(amounts(&*store, &pid, 1).await, [(1, 10), (2, 5)]);
    system.shutdown().await;
}

/// A stream moves to a node whose `Persistence` is older than the one that last wrote it
/// (a shard failing over to an older node): the entity's first write there takes over above
/// that writer, and the previous owner, should it still run, is fenced out from then on.
pub async fn older_node_takes_a_stream_over_and_fences_the_previous_owner<S: Store>(store: Arc<S>) {
    let system = ActorSystem::new("suite");
    let pid = persistence_id("account", "moved");
    let young = persistence(store.clone()).with_incarnation(1_000);
    let old = persistence(store.clone()).with_incarnation(10);
    let settings = PersistSettings::default;
    let first = system.spawn_props(young.event_sourced_props(&pid, settings(), || Bank));
    assert_eq!(first.ask(|r| AccountCmd::Deposit(10, r), T).await, Ok(10));
    // The shard moves to the node with the older incarnation: it recovers and writes.
    let second = system.spawn_props(old.event_sourced_props(&pid, settings(), || Bank));
    assert_eq!(second.ask(|r| AccountCmd::Deposit(5, r), T).await, Ok(15));
    assert_eq!(second.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(16));
    // The previous owner (still running, it wrote before) is fenced: never acknowledged.
    assert_eq!(
        first.ask(|r| AccountCmd::Deposit(100, r), T).await,
        Err(AskError::NoReply)
    );
    assert_eq!(amounts(&*store, &pid, 1).await, [(1, 10), (2, 5), (3, 1)]);
    system.shutdown().await;
}

/// The split-brain case fencing tokens exist for: a shard moved to a new owner (a higher
/// token) while the old owner still runs the entity. Once the new owner has written, the
/// old one can never append again, not even after its entity restarts and recovers (a node
/// incarnation would take the stream back then), so its commands are never acknowledged.
pub async fn stale_owner_stays_fenced_out_after_restarts<S: Store>(store: Arc<S>) {
    let system = ActorSystem::new("suite");
    let pid = persistence_id("account", "split");
    // A node incarnation far above both tokens: a token writer ignores it.
    let persistence = persistence(store.clone()).with_incarnation(u64::MAX / 4);
    let old = system.spawn_props(fenced_bank(persistence.clone(), &pid, 100));
    assert_eq!(old.ask(|r| AccountCmd::Deposit(10, r), T).await, Ok(10));
    // The shard's next home recovers and writes above the old owner.
    let new = system.spawn_props(fenced_bank(persistence, &pid, 200));
    assert_eq!(new.ask(|r| AccountCmd::Deposit(5, r), T).await, Ok(15));
    // The old owner is refused, then restarts (the default policy), recovers both deposits
    // and is refused again: three attempts, none acknowledged, none stored.
    for amount in [100, 1, 2] {
        assert_eq!(
            old.ask(|r| AccountCmd::Deposit(amount, r), T).await,
            Err(AskError::NoReply),
            "deposit of {amount} by the stale owner"
        );
    }
    assert_eq!(
        old.ask(AccountCmd::Inspect, T).await,
        Ok((15, 2)),
        "it did recover"
    );
    assert_eq!(new.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(16));
    assert_eq!(amounts(&*store, &pid, 1).await, [(1, 10), (2, 5), (3, 1)]);
    system.shutdown().await;
}

/// The same for durable state: a stale owner's saves stay refused after restarts.
pub async fn stale_state_owner_stays_fenced_out_after_restarts<S: Store>(store: Arc<S>) {
    let system = ActorSystem::new("suite");
    let owner = |token: u64| {
        let persistence = persistence(store.clone()).with_incarnation(u64::MAX / 4);
        shardik_actor::Props::new(move || {
            DurableStateEntity::new(
                Counter,
                "counter-split",
                persistence.clone(),
                Arc::new(PersistSettings::default()),
            )
            .with_fencing_token(Some(token))
        })
    };
    let old = system.spawn_props(owner(100));
    assert_eq!(old.ask(|r| CounterCmd::Add(10, r), T).await, Ok(10));
    let new = system.spawn_props(owner(200));
    assert_eq!(new.ask(|r| CounterCmd::Add(5, r), T).await, Ok(15));
    for n in [100, 1] {
        assert_eq!(
            old.ask(|r| CounterCmd::Add(n, r), T).await,
            Err(AskError::NoReply),
            "add of {n} by the stale owner"
        );
    }
    assert_eq!(old.ask(CounterCmd::Get, T).await, Ok(15), "it did recover");
    assert_eq!(new.ask(|r| CounterCmd::Add(1, r), T).await, Ok(16));
    assert_eq!(
        store.get("counter-split").await.unwrap().unwrap().revision,
        3
    );
    system.shutdown().await;
}

pub async fn durable_state_restored<S: Store>(store: Arc<S>) {
    for round in 1..=2u64 {
        let system = ActorSystem::new("suite");
        let props = persistence(store.clone()).durable_state_props(
            "counter-1",
            PersistSettings::default(),
            || Counter,
        );
        let counter = system.spawn_props(props);
        assert_eq!(counter.ask(CounterCmd::Get, T).await, Ok((round - 1) * 6));
        for n in 1..=3 {
            counter.ask(|r| CounterCmd::Add(n, r), T).await.unwrap();
        }
        assert_eq!(counter.ask(CounterCmd::Get, T).await, Ok(round * 6));
        system.shutdown().await;
    }
    assert_eq!(store.get("counter-1").await.unwrap().unwrap().revision, 6);
}
