//! [`EventSourced`] behaviours and the [`EventSourcedEntity`] actor that runs them.

use std::sync::Arc;

use shardik_actor::{Actor, ActorError, Context};
use shardik_sharding::FencingToken;

use crate::codec::{Payload, Versioned};
use crate::effect::Effect;
use crate::error::{PersistenceError, StoreError};
use crate::persistence::Persistence;
use crate::record::{AppendRequest, Incarnation, SnapshotRecord};
use crate::settings::{OnPersistFailure, PersistSettings};

/// An entity whose state is the fold of the events it persisted.
///
/// The command handler looks at the state and decides an [`Effect`]: events to persist and
/// what to do afterwards (usually a reply). The runtime persists the events, applies them
/// with [`apply`](EventSourced::apply), and only then runs the follow-ups. On start, state
/// is the latest snapshot (or [`Default`]) with the later events applied in order.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use shardik_actor::ReplyTo;
/// use shardik_persistence::{Effect, EventSourced, Versioned};
///
/// #[derive(Serialize, Deserialize)]
/// enum CounterEvent { Added(u64) }
/// impl Versioned for CounterEvent { const TYPE_NAME: &'static str = "counter.Event"; }
///
/// #[derive(Default, Serialize, Deserialize)]
/// struct Count(u64);
/// impl Versioned for Count { const TYPE_NAME: &'static str = "counter.State"; }
///
/// enum CounterCmd { Add(u64, ReplyTo<u64>), Get(ReplyTo<u64>) }
///
/// struct Counter;
/// impl EventSourced for Counter {
///     type Command = CounterCmd;
///     type Event = CounterEvent;
///     type State = Count;
///     fn handle_command(&self, state: &Count, cmd: CounterCmd) -> Effect<CounterEvent, Count> {
///         match cmd {
///             CounterCmd::Add(n, reply) => Effect::persist(CounterEvent::Added(n)).then_reply(reply, |s: &Count| s.0),
///             CounterCmd::Get(reply) => Effect::reply(reply, state.0),
///         }
///     }
///     fn apply(state: &mut Count, event: &CounterEvent) {
///         match event { CounterEvent::Added(n) => state.0 += n }
///     }
/// }
/// ```
pub trait EventSourced: Send + 'static {
    /// The commands (the actor's message type).
    type Command: Send + 'static;
    /// The events; stored self-described, see [`Versioned`].
    type Event: Versioned;
    /// The state; its [`Default`] is the state before the first event. Snapshots store it.
    type State: Versioned + Default;

    /// Decides what a command does. Must not change anything itself: changes are events.
    fn handle_command(
        &self,
        state: &Self::State,
        command: Self::Command,
    ) -> Effect<Self::Event, Self::State>;

    /// Applies one event to the state; used both after persisting and during recovery, so
    /// it must be deterministic and must not fail.
    fn apply(state: &mut Self::State, event: &Self::Event);
}

/// The actor that runs an [`EventSourced`] behaviour against a [`Persistence`].
///
/// Spawn it as a plain actor with [`Persistence::event_sourced_props`] (so a restart makes a
/// fresh instance that recovers) or as an entity type with [`Persistence::event_sourced`].
pub struct EventSourcedEntity<B: EventSourced> {
    behavior: B,
    persistence_id: String,
    persistence: Persistence,
    settings: Arc<PersistSettings>,
    state: B::State,
    seq_nr: u64,
    recovered: bool,
    /// The writer incarnation this incarnation of the entity writes with: its shard's fencing
    /// token from the start, or fixed by its first successful write (see `persist`).
    writer: Option<Incarnation>,
}

impl<B: EventSourced> EventSourcedEntity<B> {
    /// An entity writing stream `persistence_id`; it recovers when it starts.
    pub fn new(
        behavior: B,
        persistence_id: impl Into<String>,
        persistence: Persistence,
        settings: Arc<PersistSettings>,
    ) -> Self {
        EventSourcedEntity {
            behavior,
            persistence_id: persistence_id.into(),
            persistence,
            settings,
            state: B::State::default(),
            seq_nr: 0,
            recovered: false,
            writer: None,
        }
    }

    /// Makes the entity write with `token` (if `Some`) instead of its node's incarnation: the
    /// [`FencingToken`] of its shard's allocation, which
    /// [`Persistence::event_sourced`](crate::Persistence::event_sourced) entity types pass in.
    /// A write is then refused with [`StoreError::Fenced`] once an owner with a higher token
    /// (the shard's next home) has written the stream, in every later incarnation too: unlike
    /// a node incarnation, a token never takes a stream over.
    pub fn with_fencing_token(mut self, token: Option<FencingToken>) -> Self {
        if let Some(token) = token {
            self.writer = Some(token);
        }
        self
    }

    /// The entity's stream.
    pub fn persistence_id(&self) -> &str {
        &self.persistence_id
    }

    async fn recover(&mut self) -> Result<(), PersistenceError> {
        crate::metrics::timed_recovery(crate::metrics::Kind::EventSourced, self.replay()).await
    }

    /// Loads the latest snapshot and applies the events after it.
    async fn replay(&mut self) -> Result<(), PersistenceError> {
        let pid = self.persistence_id.as_str();
        let mut state = B::State::default();
        let mut seq_nr = 0;
        if let Some(snapshot) = self.persistence.snapshots().load_latest(pid).await? {
            state = snapshot.payload.decode()?;
            seq_nr = snapshot.seq_nr;
        }
        let snapshot_seq_nr = seq_nr;
        let journal = self.persistence.journal();
        loop {
            let next = after(pid, seq_nr)?;
            let events = journal
                .read(pid, next, self.settings.recovery_batch)
                .await?;
            if events.is_empty() {
                let highest = journal.highest_seq_nr(pid).await?;
                if corrupt_number(highest) {
                    return Err(corrupt_seq_nr(pid, highest));
                }
                if highest < snapshot_seq_nr {
                    // The snapshot covers events the journal never had: the two stores hold
                    // different histories (one restored from an older backup, say). Ending
                    // here would leave every write refused as a conflict, for good.
                    return Err(snapshot_ahead(pid, snapshot_seq_nr, highest));
                }
                if highest <= seq_nr {
                    break;
                }
                // Written after our last read, or missing: read once more to tell.
                if journal.read(pid, next, 1).await?.is_empty() {
                    return Err(gap(pid, next, highest));
                }
                continue;
            }
            for event in events {
                let next = after(pid, seq_nr)?;
                if event.seq_nr != next {
                    return Err(gap(pid, next, event.seq_nr));
                }
                B::apply(&mut state, &event.payload.decode()?);
                seq_nr = event.seq_nr;
            }
        }
        tracing::debug!(
            persistence_id = pid,
            snapshot_seq_nr,
            seq_nr,
            "event-sourced entity recovered"
        );
        crate::metrics::replayed(seq_nr - snapshot_seq_nr);
        self.state = state;
        self.seq_nr = seq_nr;
        self.recovered = true;
        Ok(())
    }

    /// True if the events persisted after position `before` crossed a multiple of the
    /// snapshot interval.
    fn snapshot_due(&self, before: u64) -> bool {
        self.settings
            .snapshot_every
            .is_some_and(|every| before / every != self.seq_nr / every)
    }

    /// Saves a snapshot of the current state, then applies the retention settings.
    async fn snapshot(&mut self) {
        let pid = self.persistence_id.as_str();
        let saved = match Payload::encode(&self.state) {
            Ok(payload) => {
                let record = SnapshotRecord {
                    persistence_id: pid.to_string(),
                    seq_nr: self.seq_nr,
                    payload,
                };
                self.persistence
                    .snapshots()
                    .save(record)
                    .await
                    .map_err(PersistenceError::from)
            }
            Err(e) => Err(e.into()),
        };
        crate::metrics::snapshot(saved.is_ok());
        if let Err(e) = saved {
            // The events are stored; a missing snapshot only makes recovery longer.
            tracing::warn!(persistence_id = pid, error = %e, "snapshot failed");
            return;
        }
        let floor = self.settings.retention_floor(self.seq_nr);
        if self.settings.keep_snapshots.is_some() && floor > 0 {
            let deleted = self
                .persistence
                .snapshots()
                .delete_snapshots_up_to(pid, floor - 1);
            if let Err(e) = deleted.await {
                tracing::warn!(persistence_id = pid, error = %e, "deleting old snapshots failed");
            }
        }
        if self.settings.delete_events {
            if let Err(e) = self.persistence.journal().delete_up_to(pid, floor).await {
                tracing::warn!(persistence_id = pid, error = %e, "deleting old events failed");
            }
        }
    }

    async fn persist(&mut self, events: Vec<B::Event>) -> Result<(), PersistenceError> {
        let payloads = events
            .iter()
            .map(Payload::encode)
            .collect::<Result<Vec<_>, _>>()?;
        let mut request = AppendRequest {
            persistence_id: self.persistence_id.clone(),
            expected_seq_nr: self.seq_nr,
            writer: self.writer.unwrap_or(self.persistence.incarnation()),
            events: payloads,
        };
        let mut writer = request.writer;
        let highest = match self.writer {
            Some(_) => self.persistence.journal().append(request).await?,
            None => {
                let journal = self.persistence.journal();
                match journal.append(request.clone()).await {
                    // The first write of this incarnation of the entity, and the stream was
                    // last written from a node whose `Persistence` is newer (its shard moved
                    // here from a younger node): this entity owns the stream now, so it writes
                    // above that writer, which fences the previous owner out. The position
                    // check still refuses the write if anyone appended after the recovery.
                    Err(StoreError::Fenced { current, .. }) => {
                        writer = writer_above(&request.persistence_id, current)?;
                        request.writer = writer;
                        journal.append(request).await?
                    }
                    r => r?,
                }
            }
        };
        self.writer = Some(writer);
        let before = self.seq_nr;
        metrics::counter!("shardik_persistence_events_persisted_total")
            .increment(events.len() as u64);
        // An `apply` that panics halfway leaves a state that is neither before nor after the
        // events: under `Resume` the next command then recovers first, instead of deciding
        // (and answering queries) on it.
        self.recovered = false;
        for event in &events {
            B::apply(&mut self.state, event);
        }
        self.recovered = true;
        self.seq_nr = highest;
        if self.snapshot_due(before) {
            Box::pin(self.snapshot()).await;
        }
        Ok(())
    }
}

/// Whether a number read from a store is corrupt: above `i64::MAX`, as SQLite and PostgreSQL
/// read back a negative one (which nothing here writes). Such a number cannot be followed:
/// the next is not storable, or is stored as another negative one (-1 after -2). Before
/// 2026-12-01 only `u64::MAX` (a stored -1) was caught, so a stored -2 loaded and the next
/// write stored -1.
pub(crate) fn corrupt_number(n: u64) -> bool {
    n > i64::MAX as u64
}

/// The sequence number after `seq_nr`, or an error if a stored number is corrupt (see
/// [`corrupt_number`]) and has none.
fn after(pid: &str, seq_nr: u64) -> Result<u64, PersistenceError> {
    match seq_nr.checked_add(1) {
        Some(next) if !corrupt_number(seq_nr) => Ok(next),
        _ => Err(corrupt_seq_nr(pid, seq_nr)),
    }
}

fn corrupt_seq_nr(pid: &str, seq_nr: u64) -> PersistenceError {
    PersistenceError::Recovery {
        persistence_id: pid.to_string(),
        reason: format!("the stored sequence number {seq_nr} is corrupt: no event can follow it"),
    }
}

fn snapshot_ahead(pid: &str, snapshot: u64, highest: u64) -> PersistenceError {
    PersistenceError::Recovery {
        persistence_id: pid.to_string(),
        reason: format!(
            "the latest snapshot is at sequence number {snapshot} but the journal's highest is \
             {highest}: the snapshot store and the journal do not hold the same history (was \
             one restored from an older backup?)"
        ),
    }
}

/// The writer incarnation above `current` (the newest that wrote a stream or state), or an
/// error if `current` is corrupt (see [`corrupt_number`]) or the highest a store keeps
/// ([`MAX_INCARNATION`](crate::rules::MAX_INCARNATION)), and has none.
pub(crate) fn writer_above(pid: &str, current: Incarnation) -> Result<Incarnation, StoreError> {
    match current.checked_add(1) {
        Some(next) if !corrupt_number(next) => Ok(next),
        _ if corrupt_number(current) => Err(StoreError::Backend(format!(
            "the stored writer incarnation {current} of {pid} is corrupt: no writer can follow it"
        ))),
        _ => Err(StoreError::Backend(format!(
            "the stored writer incarnation {current} of {pid} is the highest a store keeps \
             (i64::MAX): no writer can follow it"
        ))),
    }
}

fn gap(pid: &str, wanted: u64, found: u64) -> PersistenceError {
    PersistenceError::Recovery {
        persistence_id: pid.to_string(),
        reason: format!(
            "event {wanted} is missing (next stored: {found}); was it deleted without a snapshot?"
        ),
    }
}

/// Reports a failed write and decides by policy; the command's follow-ups are dropped.
pub(crate) fn persist_failed<A: Actor>(
    pid: &str,
    error: PersistenceError,
    policy: OnPersistFailure,
    ctx: &mut Context<A>,
) -> Result<(), ActorError> {
    let reason = match &error {
        PersistenceError::Store(StoreError::Fenced { .. }) => "fenced",
        PersistenceError::Store(StoreError::Conflict { .. }) => "conflict",
        PersistenceError::Store(_) => "store",
        PersistenceError::Codec(_) => "codec",
        _ => "other",
    };
    metrics::counter!("shardik_persistence_persist_failures_total", "reason" => reason)
        .increment(1);
    tracing::error!(
        persistence_id = pid,
        error = %error,
        ?policy,
        "persist failed; the command is not acknowledged"
    );
    match policy {
        OnPersistFailure::Restart => Err(Box::new(error)),
        OnPersistFailure::Stop => {
            ctx.stop();
            Ok(())
        }
    }
}

impl<B: EventSourced> Actor for EventSourcedEntity<B> {
    type Msg = B::Command;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.recover().await?;
        Ok(())
    }

    async fn handle(
        &mut self,
        command: B::Command,
        ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        if !self.recovered {
            // A failed write left the position unknown (the supervisor resumed us). Boxed, as
            // the snapshot path below: the actor runtime allocates a turn's future per turn,
            // and inline, this rare path's future would be part of every command's turn.
            Box::pin(self.recover()).await?;
        }
        let Effect { events, after } = self.behavior.handle_command(&self.state, command);
        if !events.is_empty() {
            if let Err(e) = self.persist(events).await {
                self.recovered = false;
                return persist_failed(&self.persistence_id, e, self.settings.on_failure, ctx);
            }
        }
        let stop = after.stop;
        after.run(&self.state);
        if stop {
            ctx.stop();
        }
        Ok(())
    }
}

impl<B: EventSourced> std::fmt::Debug for EventSourcedEntity<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSourcedEntity")
            .field("persistence_id", &self.persistence_id)
            .field("seq_nr", &self.seq_nr)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored writer no writer can follow fails the takeover with an error naming it: a
    /// corrupt one (a stored negative number, read back above `i64::MAX`) and `i64::MAX`, the
    /// highest a store keeps (its follower would be stored negative; until 2026-11-30 it was
    /// returned).
    #[test]
    fn writer_above_stays_within_what_a_store_keeps() {
        assert_eq!(writer_above("p", 5), Ok(6));
        assert_eq!(writer_above("p", i64::MAX as u64 - 1), Ok(i64::MAX as u64));
        let why = |current| match writer_above("p", current) {
            Err(StoreError::Backend(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(why(i64::MAX as u64).contains("is the highest a store keeps"));
        for corrupt in [i64::MAX as u64 + 1, u64::MAX - 1, u64::MAX] {
            assert!(why(corrupt).contains(&format!("{corrupt} of p is corrupt")));
        }
    }
}
