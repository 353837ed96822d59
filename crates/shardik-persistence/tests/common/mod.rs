//! Entities and helpers shared by the scenario tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik_actor::ReplyTo;
use shardik_persistence::{
    DurableState, Effect, EventSourced, Persistence, StateEffect, Versioned,
};

pub const T: Duration = Duration::from_secs(5);

/// Bank account commands.
#[derive(Serialize, Deserialize)]
pub enum AccountCmd {
    Deposit(u64, ReplyTo<u64>),
    Withdraw(u64, ReplyTo<Result<u64, String>>),
    Balance(ReplyTo<u64>),
    /// Replies with (balance, number of events applied) to check recovery.
    Inspect(ReplyTo<(u64, u64)>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AccountEvent {
    Deposited { amount: u64 },
    Withdrawn { amount: u64 },
}

impl Versioned for AccountEvent {
    const TYPE_NAME: &'static str = "test.AccountEvent";
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub balance: u64,
    pub applied: u64,
}

impl Versioned for Account {
    const TYPE_NAME: &'static str = "test.Account";
}

pub struct Bank;

impl EventSourced for Bank {
    type Command = AccountCmd;
    type Event = AccountEvent;
    type State = Account;

    fn handle_command(&self, state: &Account, cmd: AccountCmd) -> Effect<AccountEvent, Account> {
        match cmd {
            AccountCmd::Deposit(amount, reply) => {
                Effect::persist(AccountEvent::Deposited { amount })
                    .then_reply(reply, |s: &Account| s.balance)
            }
            AccountCmd::Withdraw(amount, reply) if amount > state.balance => {
                Effect::reply(reply, Err(format!("balance {} too low", state.balance)))
            }
            AccountCmd::Withdraw(amount, reply) => {
                Effect::persist(AccountEvent::Withdrawn { amount })
                    .then_reply(reply, |s: &Account| Ok(s.balance))
            }
            AccountCmd::Balance(reply) => Effect::reply(reply, state.balance),
            AccountCmd::Inspect(reply) => Effect::reply(reply, (state.balance, state.applied)),
        }
    }

    fn apply(state: &mut Account, event: &AccountEvent) {
        state.applied += 1;
        match event {
            AccountEvent::Deposited { amount } => state.balance += amount,
            AccountEvent::Withdrawn { amount } => state.balance -= amount,
        }
    }
}

/// A durable-state counter.
#[derive(Serialize, Deserialize)]
pub enum CounterCmd {
    Add(u64, ReplyTo<u64>),
    Get(ReplyTo<u64>),
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Count {
    pub value: u64,
}

impl Versioned for Count {
    const TYPE_NAME: &'static str = "test.Count";
}

pub struct Counter;

impl DurableState for Counter {
    type Command = CounterCmd;
    type State = Count;

    fn handle_command(&self, state: &Count, cmd: CounterCmd) -> StateEffect<Count> {
        match cmd {
            CounterCmd::Add(n, reply) => StateEffect::persist(Count {
                value: state.value + n,
            })
            .then_reply(reply, |s: &Count| s.value),
            CounterCmd::Get(reply) => StateEffect::reply(reply, state.value),
        }
    }
}

/// A plain event-sourced bank account writing `pid` with fencing token `token`, as a sharded
/// entity whose shard was allocated with that token does.
pub fn fenced_bank(
    persistence: Persistence,
    pid: &str,
    token: u64,
) -> shardik_actor::Props<shardik_persistence::EventSourcedEntity<Bank>> {
    let pid = pid.to_string();
    shardik_actor::Props::new(move || {
        shardik_persistence::EventSourcedEntity::new(
            Bank,
            pid.clone(),
            persistence.clone(),
            Arc::new(shardik_persistence::PersistSettings::default()),
        )
        .with_fencing_token(Some(token))
    })
}

/// Persistence over `store` with a fixed incarnation.
pub fn persistence<S>(store: Arc<S>) -> Persistence
where
    S: shardik_persistence::Journal
        + shardik_persistence::SnapshotStore
        + shardik_persistence::StateStore,
{
    Persistence::new(store).with_incarnation(1)
}

/// The value of `var`, which PostgreSQL tests need, or `None` after saying once per variable
/// on stderr that `what` is skipped (straight to stderr: libtest captures only the print
/// macros). With `SHARDIK_REQUIRE_PG` set, as in CI, a missing variable fails the test.
pub fn pg_env(var: &str, what: &str) -> Option<String> {
    if let Ok(value) = std::env::var(var) {
        return Some(value);
    }
    assert!(
        std::env::var("SHARDIK_REQUIRE_PG").is_err(),
        "SHARDIK_REQUIRE_PG is set but {var} is not: {what} cannot run"
    );
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|v| v == var) {
        said.push(var.to_string());
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n*** {what} SKIPPED: {var} is not set \
             (crates/shardik-persistence/scripts/start-test-postgres.sh starts a server) ***\n"
        );
    }
    None
}

/// What a `metrics_util` debugging recorder held when its snapshot was taken.
pub type Metrics = Vec<(
    metrics_util::CompositeKey,
    metrics_util::debugging::DebugValue,
)>;

/// Installs a debugging recorder as this test binary's metrics recorder (a process has one;
/// each metrics test is a binary of its own) and returns the handle that reads it.
pub fn install_recorder() -> metrics_util::debugging::Snapshotter {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this process");
    snapshotter
}

/// Takes a snapshot of `snapshotter`'s recorder (which resets its counters).
pub fn take_metrics(snapshotter: &metrics_util::debugging::Snapshotter) -> Metrics {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect()
}

/// True if `key` is metric `name` of `kind` with label `label` (any labels if `None`).
fn metric_matches(
    key: &metrics_util::CompositeKey,
    kind: metrics_util::MetricKind,
    name: &str,
    label: Option<(&str, &str)>,
) -> bool {
    key.kind() == kind
        && key.key().name() == name
        && label.is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
}

/// The sum of counter `name` over its series with `label` (0 if never incremented).
pub fn counter_total(metrics: &Metrics, name: &str, label: Option<(&str, &str)>) -> u64 {
    use metrics_util::debugging::DebugValue;
    metrics
        .iter()
        .filter(|(k, _)| metric_matches(k, metrics_util::MetricKind::Counter, name, label))
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

/// How many samples histogram `name` holds over its series with `label`.
pub fn histogram_samples(metrics: &Metrics, name: &str, label: Option<(&str, &str)>) -> usize {
    use metrics_util::debugging::DebugValue;
    metrics
        .iter()
        .filter(|(k, _)| metric_matches(k, metrics_util::MetricKind::Histogram, name, label))
        .map(|(_, v)| match v {
            DebugValue::Histogram(values) => values.len(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}
