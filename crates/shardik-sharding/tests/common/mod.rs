//! Shared entity definitions for the sharding behaviour tests.
//!
//! [`Recorder`] is an entity that records what it handles in two places: in its own state
//! (lost with the incarnation, reported by [`Msg::Get`]) and in a [`Probe`] that the test owns
//! and that every incarnation of every entity shares (the "journal", which survives
//! passivation and restarts). The probe also counts factory calls and `stopped` hooks per
//! entity id, checks that two incarnations of one entity never overlap, and reports lifecycle
//! events the tests await instead of sleeping.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{
    Actor, ActorError, ActorId, ActorSystem, AskError, Context, ReplyTo, TellError,
};
use shardik_sharding::{EntityType, Region, ShardingExt};
use tokio::sync::{mpsc, watch};

/// The `sender` recorded in the journal for a finished [`Msg::Block`].
pub const BLOCK: u32 = u32::MAX;

/// Generous bound for asks and event waits; a correct run takes milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Messages of [`Recorder`].
#[derive(Serialize, Deserialize)]
pub enum Msg {
    /// Record `(sender, seq)` in this incarnation's state and in the journal.
    Item { sender: u32, seq: u64 },
    /// Report [`Event::Entered`], wait until gate `gate` opens, then record `(BLOCK, gate)`.
    Block { gate: u32 },
    /// Stop this incarnation (`ctx.stop()`) once the handler returns.
    StopSelf,
    /// Panic in the handler.
    Panic,
    /// Return an error from the handler.
    Fail,
    /// Reply with this incarnation's [`Snapshot`].
    Get(ReplyTo<Snapshot>),
    /// Keep the reply handle and never answer.
    Hoard(ReplyTo<()>),
    /// Drop the reply handle unanswered.
    Ignore(ReplyTo<()>),
}

/// What one incarnation has seen.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Which factory call of this entity id made the instance (1 for the first).
    pub incarnation: u32,
    /// The items this instance handled, in order.
    pub handled: Vec<(u32, u64)>,
}

/// Lifecycle events, in the order they happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A `Block` handler started and is waiting for its gate.
    Entered { id: String, gate: u32 },
    /// A `stopped` hook started and waits for the stop gate (see [`Probe::hold_stops`]).
    Stopping { id: String, incarnation: u32 },
    /// A `stopped` hook ran. `at` is tokio's (possibly paused) clock; `handled` is what this
    /// instance handled.
    Stopped {
        id: String,
        incarnation: u32,
        handled: Vec<(u32, u64)>,
        at: tokio::time::Instant,
    },
}

impl Event {
    pub fn id(&self) -> &str {
        match self {
            Event::Entered { id, .. } | Event::Stopping { id, .. } | Event::Stopped { id, .. } => {
                id
            }
        }
    }
}

/// A one-way gate: waiters pass once it is open; opening before anyone waits is fine.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    fn new() -> Self {
        Gate(Arc::new(watch::channel(false).0))
    }

    pub fn open(&self) {
        self.0.send_replace(true);
    }

    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        rx.wait_for(|open| *open)
            .await
            .expect("the gate keeps its sender");
    }
}

/// The test's view of every [`Recorder`] of one entity type.
pub struct Probe {
    journal: Mutex<HashMap<String, Vec<(u32, u64)>>>,
    created: Mutex<HashMap<String, u32>>,
    stopped: Mutex<HashMap<String, u32>>,
    /// The actor currently running each entity id (between `started` and `stopped`).
    live: Mutex<HashMap<String, ActorId>>,
    violations: Mutex<Vec<String>>,
    gates: Mutex<HashMap<u32, Gate>>,
    stop_gate: Mutex<Option<u32>>,
    events_tx: mpsc::UnboundedSender<Event>,
    events_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Event>>,
}

impl Probe {
    pub fn new() -> Arc<Probe> {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Arc::new(Probe {
            journal: Mutex::default(),
            created: Mutex::default(),
            stopped: Mutex::default(),
            live: Mutex::default(),
            violations: Mutex::default(),
            gates: Mutex::default(),
            stop_gate: Mutex::default(),
            events_tx,
            events_rx: tokio::sync::Mutex::new(events_rx),
        })
    }

    /// An entity type `name` of [`Recorder`]s reporting to this probe.
    pub fn entity_type(self: &Arc<Self>, name: &str) -> EntityType<Recorder> {
        let probe = self.clone();
        EntityType::new(name, move |id: &str| {
            let incarnation = {
                let mut created = probe.created.lock();
                let n = created.entry(id.to_string()).or_default();
                *n += 1;
                *n
            };
            Recorder {
                id: id.to_string(),
                incarnation,
                handled: Vec::new(),
                hoarded: Vec::new(),
                probe: probe.clone(),
            }
        })
    }

    /// Gate number `n` (created closed on first use).
    pub fn gate(&self, n: u32) -> Gate {
        self.gates.lock().entry(n).or_insert_with(Gate::new).clone()
    }

    /// From now on every `stopped` hook reports [`Event::Stopping`] and then waits for gate
    /// `n`, so a test can act while an entity is half-way through stopping.
    pub fn hold_stops(&self, n: u32) {
        *self.stop_gate.lock() = Some(n);
    }

    /// Everything entity `id` handled, over all its incarnations.
    pub fn journal(&self, id: &str) -> Vec<(u32, u64)> {
        self.journal.lock().get(id).cloned().unwrap_or_default()
    }

    /// The items of `sender` in entity `id`'s journal, in handling order.
    pub fn journal_of(&self, id: &str, sender: u32) -> Vec<u64> {
        self.journal(id)
            .into_iter()
            .filter(|(s, _)| *s == sender)
            .map(|(_, seq)| seq)
            .collect()
    }

    /// How often the factory made entity `id`.
    pub fn created(&self, id: &str) -> u32 {
        self.created.lock().get(id).copied().unwrap_or(0)
    }

    /// Factory calls over all ids.
    pub fn created_total(&self) -> u32 {
        self.created.lock().values().sum()
    }

    /// How often a `stopped` hook of entity `id` ran.
    pub fn stopped(&self, id: &str) -> u32 {
        self.stopped.lock().get(id).copied().unwrap_or(0)
    }

    /// `stopped` hooks over all ids.
    pub fn stopped_total(&self) -> u32 {
        self.stopped.lock().values().sum()
    }

    /// Breaches of "one live incarnation per entity id" seen so far (should stay empty).
    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().clone()
    }

    /// Waits for the next lifecycle event.
    pub async fn next_event(&self) -> Event {
        self.next_event_within(PATIENCE).await
    }

    /// Waits up to `limit` for the next lifecycle event. On a paused clock the wait itself
    /// lets time jump ahead, so `limit` must lie beyond every timer the test waits for.
    pub async fn next_event_within(&self, limit: Duration) -> Event {
        let mut rx = self.events_rx.lock().await;
        tokio::time::timeout(limit, rx.recv())
            .await
            .expect("no lifecycle event within the patience bound")
            .expect("the probe keeps a sender")
    }

    /// The next event if one is already queued.
    pub fn try_event(&self) -> Option<Event> {
        self.events_rx
            .try_lock()
            .expect("events are read by one task")
            .try_recv()
            .ok()
    }

    fn emit(&self, event: Event) {
        let _ = self.events_tx.send(event);
    }
}

/// The entity. See the module docs.
pub struct Recorder {
    id: String,
    incarnation: u32,
    handled: Vec<(u32, u64)>,
    hoarded: Vec<ReplyTo<()>>,
    probe: Arc<Probe>,
}

impl Recorder {
    fn record(&mut self, sender: u32, seq: u64) {
        self.handled.push((sender, seq));
        self.probe
            .journal
            .lock()
            .entry(self.id.clone())
            .or_default()
            .push((sender, seq));
    }
}

impl Actor for Recorder {
    type Msg = Msg;

    async fn started(&mut self, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        // A restart keeps the actor (same id) and runs `started` again; a different actor
        // still registered for this id means two incarnations overlap.
        if let Some(other) = self.probe.live.lock().insert(self.id.clone(), ctx.id()) {
            if other != ctx.id() {
                self.probe.violations.lock().push(format!(
                    "entity {} incarnation {} started while actor {other} still ran",
                    self.id, self.incarnation
                ));
            }
        }
        Ok(())
    }

    async fn handle(&mut self, msg: Msg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Item { sender, seq } => self.record(sender, seq),
            Msg::Block { gate } => {
                self.probe.emit(Event::Entered {
                    id: self.id.clone(),
                    gate,
                });
                self.probe.gate(gate).wait().await;
                self.record(BLOCK, u64::from(gate));
            }
            Msg::StopSelf => ctx.stop(),
            Msg::Panic => panic!("entity {} told to panic", self.id),
            Msg::Fail => return Err(format!("entity {} told to fail", self.id).into()),
            Msg::Get(reply) => reply.reply(Snapshot {
                incarnation: self.incarnation,
                handled: self.handled.clone(),
            }),
            Msg::Hoard(reply) => self.hoarded.push(reply),
            Msg::Ignore(reply) => drop(reply),
        }
        Ok(())
    }

    async fn stopped(&mut self, ctx: &mut Context<Self>) {
        let hold = *self.probe.stop_gate.lock();
        if let Some(gate) = hold {
            self.probe.emit(Event::Stopping {
                id: self.id.clone(),
                incarnation: self.incarnation,
            });
            self.probe.gate(gate).wait().await;
        }
        {
            let mut live = self.probe.live.lock();
            if live.get(&self.id) == Some(&ctx.id()) {
                live.remove(&self.id);
            }
        }
        *self
            .probe
            .stopped
            .lock()
            .entry(self.id.clone())
            .or_default() += 1;
        self.probe.emit(Event::Stopped {
            id: self.id.clone(),
            incarnation: self.incarnation,
            handled: self.handled.clone(),
            at: tokio::time::Instant::now(),
        });
    }
}

/// Asks entity `id` for its [`Snapshot`].
pub async fn snapshot(region: &Region<Msg>, id: &str) -> Snapshot {
    region
        .ask(id, Msg::Get, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("ask to {id} failed: {e}"))
}

/// Like [`snapshot`], retrying while a bounded mailbox is full.
pub async fn snapshot_retry(region: &Region<Msg>, id: &str) -> Snapshot {
    loop {
        match region.ask(id, Msg::Get, PATIENCE).await {
            Ok(s) => return s,
            Err(AskError::MailboxFull) => tokio::task::yield_now().await,
            Err(e) => panic!("ask to {id} failed: {e}"),
        }
    }
}

/// Tells `msg` to entity `id`, retrying while the entity's mailbox or buffer is full
/// (back-pressure by hand; order is kept because the same message is retried). Returns how
/// often it was refused.
pub async fn tell_retry(region: &Region<Msg>, id: &str, msg: Msg) -> u64 {
    let mut msg = msg;
    let mut refused = 0;
    loop {
        match region.try_tell(id, msg) {
            Ok(()) => return refused,
            Err(TellError::MailboxFull(back)) => {
                refused += 1;
                msg = back;
                tokio::task::yield_now().await;
            }
            Err(TellError::Stopped(_)) => panic!("entity {id} refused a message: stopped"),
        }
    }
}

/// The item message of `sender` number `seq`.
pub fn item(sender: u32, seq: u64) -> Msg {
    Msg::Item { sender, seq }
}

/// A system named `system_name` with a region of [`Recorder`]s (entity type `"recorder"`,
/// configured by `configure`) and the [`Probe`] they report to: every test's set-up.
pub fn recorders(
    system_name: &str,
    configure: impl FnOnce(EntityType<Recorder>) -> EntityType<Recorder>,
) -> (ActorSystem, Arc<Probe>, Region<Msg>) {
    let system = ActorSystem::new(system_name);
    let probe = Probe::new();
    let region = system
        .sharding()
        .start(configure(probe.entity_type("recorder")))
        .expect("the recorder entity type starts");
    (system, probe, region)
}
