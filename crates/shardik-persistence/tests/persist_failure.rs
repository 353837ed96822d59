//! A failed persist never acknowledges its command; the entity restarts or stops by policy.

mod common;

use std::sync::Arc;

use shardik_actor::{ActorSystem, AskError};
use shardik_persistence::{FaultyStore, InMemoryStore, Journal, OnPersistFailure, PersistSettings};
use shardik_sharding::ShardingExt;

use common::{persistence, AccountCmd, Bank, Counter, CounterCmd, T};

fn faulty() -> Arc<FaultyStore<InMemoryStore>> {
    Arc::new(FaultyStore::new(Arc::new(InMemoryStore::new())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policy_recovers_and_never_acknowledges_the_failed_command() {
    let store = faulty();
    let system = ActorSystem::new("failure");
    let props =
        persistence(store.clone()).event_sourced_props("acc", PersistSettings::default(), || Bank);
    let account = system.spawn_props(props);
    assert_eq!(account.ask(|r| AccountCmd::Deposit(10, r), T).await, Ok(10));

    store.fail_writes(true);
    assert_eq!(
        account.ask(|r| AccountCmd::Deposit(5, r), T).await,
        Err(AskError::NoReply),
        "a command whose events were not stored is not acknowledged"
    );
    assert_eq!(store.refused(), 1);
    store.fail_writes(false);

    // Restarted with state recovered from the store: the failed deposit left no trace.
    assert_eq!(account.ask(AccountCmd::Inspect, T).await, Ok((10, 1)));
    assert_eq!(account.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(11));
    assert_eq!(store.highest_seq_nr("acc").await, Ok(2));
    assert!(!account.is_terminated());
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_policy_stops_the_entity_without_acknowledging() {
    let store = faulty();
    let system = ActorSystem::new("failure");
    let settings = PersistSettings::default().on_persist_failure(OnPersistFailure::Stop);
    let account =
        system
            .spawn_props(persistence(store.clone()).event_sourced_props("acc", settings, || Bank));
    assert_eq!(account.ask(|r| AccountCmd::Deposit(10, r), T).await, Ok(10));
    store.fail_writes(true);
    assert_eq!(
        account.ask(|r| AccountCmd::Deposit(5, r), T).await,
        Err(AskError::NoReply)
    );
    account.terminated().await;
    assert_eq!(store.highest_seq_nr("acc").await, Ok(1));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sharded_entity_comes_back_recovered() {
    let store = faulty();
    let system = ActorSystem::new("failure");
    let settings = PersistSettings::default().on_persist_failure(OnPersistFailure::Stop);
    let accounts = system
        .sharding()
        .start(persistence(store.clone()).event_sourced("account", settings, |_| Bank))
        .unwrap();
    assert_eq!(
        accounts.ask("a", |r| AccountCmd::Deposit(10, r), T).await,
        Ok(10)
    );
    store.fail_writes(true);
    assert_eq!(
        accounts.ask("a", |r| AccountCmd::Deposit(5, r), T).await,
        Err(AskError::NoReply)
    );
    store.fail_writes(false);
    // The next message starts a new incarnation, which recovers from the journal.
    assert_eq!(accounts.ask("a", AccountCmd::Inspect, T).await, Ok((10, 1)));
    assert_eq!(
        accounts.ask("a", |r| AccountCmd::Deposit(5, r), T).await,
        Ok(15)
    );
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_state_write_failure_keeps_the_old_state() {
    let store = faulty();
    let system = ActorSystem::new("failure");
    let props =
        persistence(store.clone()).durable_state_props("c", PersistSettings::default(), || Counter);
    let counter = system.spawn_props(props);
    assert_eq!(counter.ask(|r| CounterCmd::Add(2, r), T).await, Ok(2));
    store.fail_writes(true);
    assert_eq!(
        counter.ask(|r| CounterCmd::Add(3, r), T).await,
        Err(AskError::NoReply)
    );
    store.fail_writes(false);
    assert_eq!(counter.ask(CounterCmd::Get, T).await, Ok(2));
    assert_eq!(counter.ask(|r| CounterCmd::Add(3, r), T).await, Ok(5));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_that_cannot_recover_never_answers() {
    let store = faulty();
    {
        let system = ActorSystem::new("failure");
        let props = persistence(store.clone()).event_sourced_props(
            "acc",
            PersistSettings::default(),
            || Bank,
        );
        let account = system.spawn_props(props);
        assert_eq!(account.ask(|r| AccountCmd::Deposit(7, r), T).await, Ok(7));
        system.shutdown().await;
    }
    // Recovery fails while reads fail: the start counts as a failure (here the strategy is
    // Stop), and the entity never answers from a blank state.
    store.fail_reads(true);
    let system = ActorSystem::new("failure");
    let props = persistence(store.clone())
        .event_sourced_props("acc", PersistSettings::default(), || Bank)
        .supervisor(shardik_actor::SupervisorStrategy::Stop);
    let account = system.spawn_props(props);
    let reply = account.ask(AccountCmd::Balance, T).await;
    assert!(
        matches!(reply, Err(AskError::NoReply | AskError::Stopped)),
        "no answer from an unrecovered entity: {reply:?}"
    );
    account.terminated().await;
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_entity_recovers_before_its_next_command() {
    let store = faulty();
    let system = ActorSystem::new("failure");
    let props = persistence(store.clone())
        .event_sourced_props("acc", PersistSettings::default(), || Bank)
        .supervisor(shardik_actor::SupervisorStrategy::Resume);
    let account = system.spawn_props(props);
    assert_eq!(account.ask(|r| AccountCmd::Deposit(10, r), T).await, Ok(10));
    store.fail_writes(true);
    assert_eq!(
        account.ask(|r| AccountCmd::Deposit(5, r), T).await,
        Err(AskError::NoReply)
    );
    store.fail_writes(false);
    // Meanwhile another writer appended to the stream: the resumed instance must see it.
    let other = persistence(store.clone())
        .event_sourced_props("acc", PersistSettings::default(), || Bank)
        .supervisor(shardik_actor::SupervisorStrategy::Resume);
    let other = system.spawn_props(other);
    assert_eq!(other.ask(|r| AccountCmd::Deposit(100, r), T).await, Ok(110));
    assert_eq!(account.ask(|r| AccountCmd::Deposit(1, r), T).await, Ok(111));
    assert_eq!(store.highest_seq_nr("acc").await, Ok(3));
    system.shutdown().await;
}

/// Two deposits persisted by one command, and an `apply` that panics on the first 13 it
/// applies (once: the replay after it applies it).
struct Flaky;

static PANIC_ON_13: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

impl shardik_persistence::EventSourced for Flaky {
    type Command = (u64, u64, shardik_actor::ReplyTo<u64>);
    type Event = common::AccountEvent;
    type State = common::Account;

    fn handle_command(
        &self,
        _state: &common::Account,
        (a, b, reply): Self::Command,
    ) -> shardik_persistence::Effect<common::AccountEvent, common::Account> {
        let deposit = |amount| common::AccountEvent::Deposited { amount };
        shardik_persistence::Effect::persist_all([deposit(a), deposit(b)])
            .then_reply(reply, |s: &common::Account| s.balance)
    }

    fn apply(state: &mut common::Account, event: &common::AccountEvent) {
        if let common::AccountEvent::Deposited { amount } = event {
            if *amount == 13 && PANIC_ON_13.swap(false, std::sync::atomic::Ordering::SeqCst) {
                panic!("apply panics on 13");
            }
            state.balance += amount;
        }
    }
}

/// Under `Resume`, an `apply` that panics after the append (on the second of two events)
/// leaves the state half applied: the next command recovers first instead of deciding on
/// it. Before, it decided on the half-applied state (a query answered from it) and, its
/// position left behind too, its append conflicted: not answered either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_entity_whose_apply_panicked_recovers_before_its_next_command() {
    let store = faulty();
    let system = ActorSystem::new("failure");
    let props = persistence(store.clone())
        .event_sourced_props("flaky", PersistSettings::default(), || Flaky)
        .supervisor(shardik_actor::SupervisorStrategy::Resume);
    let entity = system.spawn_props(props);
    assert_eq!(
        entity.ask(|r| (1, 13, r), T).await,
        Err(AskError::NoReply),
        "the command whose apply panicked is not answered"
    );
    assert_eq!(entity.ask(|r| (2, 0, r), T).await, Ok(16));
    system.shutdown().await;
}
