//! The write queue shared by the batching backends: queued operations, their reply slots,
//! the batch planner and the writer's counters.
//!
//! A backend's writer takes a batch of queued operations, reads the current position of
//! every stream (and revision of every durable state) they touch, and hands both to
//! [`plan`]. The planner applies the same checks as every backend ([`check_write`]) to each
//! write in order, as if they ran one after another, and returns what each caller gets and
//! the set of rows to write. The backend then writes those rows with a few set-based
//! statements in one transaction, and answers the callers once it has committed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use crate::codec::Payload;
use crate::error::StoreError;
use crate::record::{AppendRequest, Incarnation, SnapshotRecord, StateWrite};
use crate::rules::check_write;

/// A write's reply slot. Answered by the writer; dropped unanswered while a batch that holds
/// it panics in the writer (while its thread unwinds, or inside [`AnswerAsPanicked`]), it
/// answers itself that the outcome is unknown. Dropped unanswered otherwise, its caller
/// reads a closed store: each slot says what happened to its own write, so a panic does not
/// colour what later callers are told.
pub(crate) struct Reply<T> {
    tx: Option<oneshot::Sender<Result<T, StoreError>>>,
    backend: &'static str,
}

impl<T> Reply<T> {
    /// A slot for a write to `backend` (named in the panic's error) and its receiving end.
    pub(crate) fn channel(
        backend: &'static str,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        let (tx, rx) = oneshot::channel();
        (
            Reply {
                tx: Some(tx),
                backend,
            },
            rx,
        )
    }

    /// Answers the caller (who may have stopped waiting).
    pub(crate) fn send(mut self, outcome: Result<T, StoreError>) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(outcome);
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        let Some(tx) = self.tx.take() else { return };
        if std::thread::panicking() || DROPPING_PANICKED.with(std::cell::Cell::get) {
            let _ = tx.send(Err(panicked(self.backend)));
        }
    }
}

/// The error of a write whose batch panicked in `backend`'s writer.
pub(crate) fn panicked(backend: &str) -> StoreError {
    StoreError::Backend(format!(
        "the {backend} writer panicked while writing this batch (see the log): \
         whether this write was stored is unknown"
    ))
}

thread_local! {
    /// Set while [`AnswerAsPanicked`] lives on this thread.
    static DROPPING_PANICKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While it lives, reply slots dropped unanswered on this thread answer that their batch
/// panicked: what drops a batch's future after `catch_unwind` caught its panic (the future,
/// and the slots it took, outlive the unwinding).
pub(crate) struct AnswerAsPanicked {
    /// The flag before this scope (restored after it, so scopes nest).
    outer: bool,
}

impl AnswerAsPanicked {
    pub(crate) fn enter() -> Self {
        AnswerAsPanicked {
            outer: DROPPING_PANICKED.with(|d| d.replace(true)),
        }
    }
}

impl Drop for AnswerAsPanicked {
    fn drop(&mut self) {
        DROPPING_PANICKED.with(|d| d.set(self.outer));
    }
}

/// A write queued for a backend's writer.
pub(crate) enum Op {
    Append(AppendRequest, Reply<u64>),
    DeleteEvents(String, u64, Reply<()>),
    SaveSnapshot(SnapshotRecord, Reply<()>),
    DeleteSnapshots(String, u64, Reply<()>),
    Upsert(StateWrite, Reply<u64>),
    DeleteState(String, u64, Reply<()>),
}

impl Op {
    /// The persistence id the operation writes.
    pub(crate) fn persistence_id(&self) -> &str {
        match self {
            Op::Append(r, _) => &r.persistence_id,
            Op::SaveSnapshot(s, _) => &s.persistence_id,
            Op::Upsert(w, _) => &w.persistence_id,
            Op::DeleteEvents(p, _, _) | Op::DeleteSnapshots(p, _, _) | Op::DeleteState(p, _, _) => {
                p
            }
        }
    }

    /// The reply slot of an operation that could not run, holding `error`.
    pub(crate) fn refuse(self, error: StoreError) -> Done {
        self.complete(Err(error))
    }

    /// The reply slot of the operation holding `outcome` (a number for appends and state
    /// writes; ignored on success for the others).
    pub(crate) fn complete(self, outcome: Result<u64, StoreError>) -> Done {
        match self {
            Op::Append(_, tx) | Op::Upsert(_, tx) => Done(Some(Answer::Number(tx, outcome))),
            Op::DeleteEvents(_, _, tx)
            | Op::SaveSnapshot(_, tx)
            | Op::DeleteSnapshots(_, _, tx)
            | Op::DeleteState(_, _, tx) => Done(Some(Answer::Unit(tx, outcome.map(drop)))),
        }
    }
}

/// A stream's highest sequence number (or a durable state's revision) and the newest writer
/// incarnation that wrote it, as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) seq_nr: u64,
    pub(crate) writer: Incarnation,
}

/// Positions a writer remembers between batches, by persistence id. Ids of up to 24 bytes
/// live inline in the map's bucket, so a lookup compares bytes already in cache (keyed by
/// `String`, every lookup followed a pointer to the key's bytes: a cache miss per append with
/// many streams, about 7% of the benchmark process's CPU with 10 000 entities on PostgreSQL).
pub(crate) type RememberedPositions =
    std::collections::HashMap<compact_str::CompactString, Position, foldhash::fast::RandomState>;

/// An event an accepted append writes.
#[derive(Debug)]
pub(crate) struct NewEvent<'a> {
    pub(crate) persistence_id: &'a str,
    pub(crate) seq_nr: u64,
    pub(crate) writer: Incarnation,
    pub(crate) payload: &'a Payload,
}

/// A snapshot operation, kept in batch order.
#[derive(Debug)]
pub(crate) enum SnapshotStep<'a> {
    Save(&'a SnapshotRecord),
    DeleteUpTo(&'a str, u64),
}

/// The state a durable-state row ends the batch in.
#[derive(Debug)]
pub(crate) struct StateChange<'a> {
    pub(crate) persistence_id: &'a str,
    /// Whether the row existed when the batch read it.
    pub(crate) existed: bool,
    /// The final revision and writer (0 and 0 once deleted).
    pub(crate) position: Position,
    /// The final state, or `None` if the batch deleted it.
    pub(crate) payload: Option<&'a Payload>,
    /// The batch's accepted operations on this row (indexes into the batch).
    pub(crate) ops: Vec<usize>,
}

/// What a batch writes, and what each of its operations answers if the transaction commits.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// Per operation, in batch order.
    pub(crate) outcomes: Vec<Result<u64, StoreError>>,
    /// `(persistence_id, to_seq_nr)` event deletions: run before the events are written
    /// (events of this batch a later deletion covers are left out of [`Plan::events`]).
    pub(crate) event_deletes: Vec<(&'a str, u64)>,
    /// Events of accepted appends, in batch order.
    pub(crate) events: Vec<NewEvent<'a>>,
    /// The final position of every stream an accepted append wrote, in order of first write.
    pub(crate) streams: Vec<(&'a str, Position)>,
    /// The final position of every stream that accepted appends of this batch moved on, but
    /// whose last event a later deletion of the batch covered (so no event row is written
    /// there). Empty unless the batch deletes events.
    pub(crate) covered_ends: Vec<(&'a str, Position)>,
    /// Snapshot saves and deletions, in batch order.
    pub(crate) snapshots: Vec<SnapshotStep<'a>>,
    /// Durable-state rows the batch changed, in order of first change.
    pub(crate) states: Vec<StateChange<'a>>,
}

impl Plan<'_> {
    /// Replaces every success with `error` (the batch did not commit).
    pub(crate) fn fail(&mut self, error: &StoreError) {
        for outcome in &mut self.outcomes {
            if outcome.is_ok() {
                *outcome = Err(error.clone());
            }
        }
    }
}

struct Tracked<'a, T> {
    index: HashMap<&'a str, usize, foldhash::fast::RandomState>,
    items: Vec<T>,
}

impl<'a, T> Tracked<'a, T> {
    fn new() -> Self {
        Tracked {
            index: HashMap::default(),
            items: Vec::new(),
        }
    }

    /// The item of `key`, made with `make` the first time.
    fn get<E>(
        &mut self,
        key: &'a str,
        make: impl FnOnce(&'a str) -> Result<T, E>,
    ) -> Result<&mut T, E> {
        let i = match self.index.get(key) {
            Some(&i) => i,
            None => {
                let i = self.items.len();
                self.items.push(make(key)?);
                self.index.insert(key, i);
                i
            }
        };
        Ok(&mut self.items[i])
    }
}

/// `stored` moved on by `count`, or an error (the write is refused, nothing written) if a
/// corrupt stored number (a negative one read back as `u64`, above `i64::MAX`) leaves no room
/// for it, or the result could not be stored (above `i64::MAX`: it would be stored as a
/// negative number; before 2026-12-01 a write after a stored -2 stored -1). A `count` of 0
/// stores nothing and is not refused.
fn past(pid: &str, what: &str, stored: u64, count: usize) -> Result<u64, StoreError> {
    u64::try_from(count)
        .ok()
        .and_then(|count| stored.checked_add(count))
        // An empty write only checks (it stores no number).
        .filter(|n| count == 0 || !crate::event_sourced::corrupt_number(*n))
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "the stored {what} {stored} of {pid} is corrupt: no write can follow it"
            ))
        })
}

/// Plans `batch`: checks every write in order against the stored positions, with each
/// accepted write moving its stream on for the next one, exactly as if they ran one after
/// another. `stream` gives a stream's stored position ((0, 0) if it has none); `state` a
/// durable state's stored revision and writer (`None` if there is none). Each is asked once
/// per id.
pub(crate) fn plan<'a, E>(
    batch: &'a [Op],
    mut stream: impl FnMut(&str) -> Result<Position, E>,
    mut state: impl FnMut(&str) -> Result<Option<Position>, E>,
) -> Result<Plan<'a>, E> {
    struct Stream {
        position: Position,
        /// The position before the batch.
        stored: u64,
        written: bool,
    }
    let mut streams: Tracked<'a, (&'a str, Stream)> = Tracked::new();
    let mut states: Tracked<'a, StateChange<'a>> = Tracked::new();
    let mut plan = Plan {
        outcomes: Vec::with_capacity(batch.len()),
        event_deletes: Vec::new(),
        events: Vec::with_capacity(batch.len()),
        streams: Vec::new(),
        covered_ends: Vec::new(),
        snapshots: Vec::new(),
        states: Vec::new(),
    };
    for (i, op) in batch.iter().enumerate() {
        let outcome = match op {
            Op::Append(req, _) => {
                let pid = req.persistence_id.as_str();
                let (_, s) = streams.get(pid, |pid| {
                    stream(pid).map(|position| {
                        (
                            pid,
                            Stream {
                                position,
                                stored: position.seq_nr,
                                written: false,
                            },
                        )
                    })
                })?;
                check_write(
                    pid,
                    s.position.seq_nr,
                    s.position.writer,
                    req.expected_seq_nr,
                    req.writer,
                )
                .and_then(|()| {
                    past(pid, "sequence number", s.position.seq_nr, req.events.len())?;
                    for payload in &req.events {
                        s.position.seq_nr += 1;
                        plan.events.push(NewEvent {
                            persistence_id: pid,
                            seq_nr: s.position.seq_nr,
                            writer: req.writer,
                            payload,
                        });
                    }
                    s.position.writer = req.writer;
                    s.written = true;
                    Ok(s.position.seq_nr)
                })
            }
            Op::DeleteEvents(pid, to, _) => {
                let pid = pid.as_str();
                if plan.events.iter().any(|e| e.persistence_id == pid) {
                    plan.events
                        .retain(|e| e.persistence_id != pid || e.seq_nr > *to);
                }
                plan.event_deletes.push((pid, *to));
                Ok(0)
            }
            Op::SaveSnapshot(s, _) => {
                plan.snapshots.push(SnapshotStep::Save(s));
                Ok(0)
            }
            Op::DeleteSnapshots(pid, to, _) => {
                plan.snapshots
                    .push(SnapshotStep::DeleteUpTo(pid.as_str(), *to));
                Ok(0)
            }
            Op::Upsert(w, _) => {
                let pid = w.persistence_id.as_str();
                let s = states.get(pid, |pid| state(pid).map(|stored| new_state(pid, stored)))?;
                check_write(
                    pid,
                    s.position.seq_nr,
                    s.position.writer,
                    w.expected_revision,
                    w.writer,
                )
                .and_then(|()| {
                    s.position = Position {
                        seq_nr: past(pid, "revision", s.position.seq_nr, 1)?,
                        writer: w.writer,
                    };
                    s.payload = Some(&w.payload);
                    s.ops.push(i);
                    Ok(s.position.seq_nr)
                })
            }
            Op::DeleteState(pid, expected, _) => {
                let pid = pid.as_str();
                let s = states.get(pid, |pid| state(pid).map(|stored| new_state(pid, stored)))?;
                if s.position.seq_nr == *expected {
                    s.position = Position::default();
                    s.payload = None;
                    s.ops.push(i);
                    Ok(0)
                } else {
                    Err(StoreError::Conflict {
                        persistence_id: pid.to_string(),
                        expected: *expected,
                        actual: s.position.seq_nr,
                    })
                }
            }
        };
        plan.outcomes.push(outcome);
    }
    if !plan.event_deletes.is_empty() {
        let written: std::collections::HashSet<(&str, u64)> = plan
            .events
            .iter()
            .map(|e| (e.persistence_id, e.seq_nr))
            .collect();
        plan.covered_ends = streams
            .items
            .iter()
            .filter(|(pid, s)| {
                s.position.seq_nr > s.stored && !written.contains(&(*pid, s.position.seq_nr))
            })
            .map(|(pid, s)| (*pid, s.position))
            .collect();
    }
    plan.streams = streams
        .items
        .into_iter()
        .filter(|(_, s)| s.written)
        .map(|(pid, s)| (pid, s.position))
        .collect();
    plan.states = states
        .items
        .into_iter()
        .filter(|s| !s.ops.is_empty())
        .collect();
    Ok(plan)
}

fn new_state(persistence_id: &str, stored: Option<Position>) -> StateChange<'_> {
    StateChange {
        persistence_id,
        existed: stored.is_some(),
        position: stored.unwrap_or_default(),
        payload: None,
        ops: Vec::new(),
    }
}

/// An operation's outcome, held until its batch's transaction has committed.
///
/// Dropped unsent (its batch panicked after deciding it), an error is still sent: it is the
/// answer the writer had decided on. The one such path today: the PostgreSQL lane refuses
/// text it cannot store before it writes anything, so a later panic of the batch changes
/// nothing for that write. (Writers build every other `Done` only once the batch's outcome
/// is known, after its commit or its failure.) A success dropped unsent is not sent: whether
/// it was committed is unknown, which its reply slot says if the batch panicked (see
/// [`Reply`]).
pub(crate) struct Done(Option<Answer>);

enum Answer {
    Number(Reply<u64>, Result<u64, StoreError>),
    Unit(Reply<()>, Result<(), StoreError>),
}

impl Done {
    /// Answers the caller (who may have stopped waiting).
    pub(crate) fn send(mut self) {
        match self.0.take() {
            Some(Answer::Number(tx, r)) => tx.send(r),
            Some(Answer::Unit(tx, r)) => tx.send(r),
            None => {}
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        match self.0.take() {
            Some(Answer::Number(tx, Err(e))) => tx.send(Err(e)),
            Some(Answer::Unit(tx, Err(e))) => tx.send(Err(e)),
            // A success not sent: the slot's own drop says what is known.
            Some(Answer::Number(..) | Answer::Unit(..)) | None => {}
        }
    }
}

/// Counters of a batching writer: how many writes it did in how many transactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Writes (appends, snapshot and state writes, deletes) answered.
    pub writes: u64,
    /// Transactions they were grouped into.
    pub transactions: u64,
    /// Batches written again because another writer appended to one of their streams
    /// first, or because their connection was lost (PostgreSQL; see
    /// [`PostgresStore`](crate::PostgresStore)). Each retry is a transaction of its own;
    /// `transactions` counts the batch once, when it is answered.
    pub retries: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    writes: AtomicU64,
    transactions: AtomicU64,
    retries: AtomicU64,
}

/// A sequence-number bound (`seq_nr <= to`, `seq_nr >= from`) as SQL's signed 64-bit
/// integer. Stored numbers go through a bit-cast that round-trips every `u64`, but a bound
/// above `i64::MAX` (`u64::MAX` for "all of them") would turn negative that way and compare
/// below every stored number. Events never reach such numbers (a stream would need 2^63
/// appends), so it clamps.
pub(crate) fn sql_bound(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A persistence id that makes a writer panic on the batch holding it (tests only).
#[cfg(test)]
pub(crate) const PANIC_ID: &str = "panic-in-the-writer";

/// Panics if `batch` holds a write of [`PANIC_ID`] (tests only).
#[cfg(test)]
pub(crate) fn panic_on_demand(batch: &[Op]) {
    if batch.iter().any(|op| op.persistence_id() == PANIC_ID) {
        panic!("a test made the writer panic");
    }
}

impl Counters {
    /// Counts one transaction of `writes` writes, before its callers are answered.
    pub(crate) fn batch(&self, writes: usize, backend: &'static str) {
        metrics::histogram!("shardik_persistence_batch_size", "backend" => backend)
            .record(writes as f64);
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
    }

    /// Counts a batch written again after losing a race on a stream position.
    pub(crate) fn retry(&self, backend: &'static str) {
        metrics::counter!("shardik_persistence_batch_retries_total", "backend" => backend)
            .increment(1);
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            writes: self.writes.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reply slot's caller reads.
    fn outcome<T: std::fmt::Debug>(mut rx: oneshot::Receiver<Result<T, StoreError>>) -> String {
        match rx.try_recv() {
            Ok(Ok(n)) => format!("answered {n:?}"),
            Ok(Err(StoreError::Backend(m))) => m,
            Ok(Err(e)) => format!("{e:?}"),
            Err(oneshot::error::TryRecvError::Closed) => "closed".into(),
            Err(oneshot::error::TryRecvError::Empty) => "waiting".into(),
        }
    }

    /// An append of one event to `pid` and its caller's end.
    fn append_with_reply(pid: &str) -> (Op, oneshot::Receiver<Result<u64, StoreError>>) {
        let (tx, rx) = Reply::channel("PostgreSQL");
        let op = Op::Append(
            AppendRequest {
                persistence_id: pid.into(),
                expected_seq_nr: 0,
                writer: 1,
                events: vec![payload(1)],
            },
            tx,
        );
        (op, rx)
    }

    #[test]
    fn a_reply_slot_says_its_batch_panicked_only_if_it_did() {
        let (answered, rx_answered) = Reply::<u64>::channel("SQLite");
        answered.send(Ok(7));
        assert_eq!(outcome(rx_answered), "answered 7");
        // Dropped while a panic unwinds (the SQLite writer's batch).
        let (slot, rx_unwound) = Reply::<u64>::channel("SQLite");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = slot;
            panic!("a test made the batch panic");
        }));
        assert!(caught.is_err());
        let m = outcome(rx_unwound);
        assert!(m.contains("SQLite writer panicked"), "{m}");
        // Dropped after the unwinding, as a caught future is (the PostgreSQL lane's).
        let (slot, rx_after) = Reply::<u64>::channel("PostgreSQL");
        {
            let _answer = AnswerAsPanicked::enter();
            drop(slot);
        }
        let m = outcome(rx_after);
        assert!(m.contains("PostgreSQL writer panicked"), "{m}");
        // A slot dropped later for another reason (a writer gone at shutdown) is not
        // coloured by the earlier panics: its caller reads a closed store.
        let (slot, rx_closed) = Reply::<u64>::channel("PostgreSQL");
        drop(slot);
        assert_eq!(outcome(rx_closed), "closed");
    }

    /// A batch that panics after deciding some outcomes: its refusals still reach their
    /// callers as they were decided (nothing of those writes was written), its successes
    /// say that whether they were stored is unknown.
    #[test]
    fn a_decided_refusal_survives_its_batchs_panic() {
        let op = |pid: &str| {
            let (tx, rx) = Reply::channel("PostgreSQL");
            (Op::DeleteEvents(pid.into(), 1, tx), rx)
        };
        let (refused, rx_refused) = append_with_reply("a");
        let (accepted, rx_accepted) = append_with_reply("b");
        let (unit_refused, rx_unit_refused) = op("c");
        let (unit_accepted, rx_unit_accepted) = op("d");
        let decided = vec![
            refused.refuse(StoreError::Backend(
                "postgres: text must not contain NUL".into(),
            )),
            accepted.complete(Ok(3)),
            unit_refused.complete(Err(StoreError::Conflict {
                persistence_id: "c".into(),
                expected: 1,
                actual: 2,
            })),
            unit_accepted.complete(Ok(0)),
        ];
        {
            let _answer = AnswerAsPanicked::enter();
            drop(decided);
        }
        assert_eq!(outcome(rx_refused), "postgres: text must not contain NUL");
        let m = outcome(rx_accepted);
        assert!(m.contains("PostgreSQL writer panicked"), "{m}");
        let m = outcome(rx_unit_refused);
        assert!(m.starts_with("Conflict"), "{m}");
        let m = outcome(rx_unit_accepted);
        assert!(m.contains("PostgreSQL writer panicked"), "{m}");
        // A `Done` sent normally still answers its caller once, with its outcome (its drop,
        // after the send, finds nothing left to send: a oneshot could not show a second).
        let (op, rx) = append_with_reply("e");
        op.complete(Ok(1)).send();
        assert_eq!(outcome(rx), "answered 1");
    }

    fn payload(n: u64) -> Payload {
        Payload::encode_as("n", 1, &n).unwrap()
    }

    fn append(pid: &str, expected: u64, writer: u64, events: &[u64]) -> Op {
        let (tx, _) = Reply::channel("test");
        Op::Append(
            AppendRequest {
                persistence_id: pid.into(),
                expected_seq_nr: expected,
                writer,
                events: events.iter().map(|n| payload(*n)).collect(),
            },
            tx,
        )
    }

    fn upsert(pid: &str, expected: u64, writer: u64) -> Op {
        let (tx, _) = Reply::channel("test");
        Op::Upsert(
            StateWrite {
                persistence_id: pid.into(),
                expected_revision: expected,
                writer,
                payload: payload(expected),
            },
            tx,
        )
    }

    fn delete_events(pid: &str, to: u64) -> Op {
        Op::DeleteEvents(pid.into(), to, Reply::channel("test").0)
    }

    fn delete_state(pid: &str, expected: u64) -> Op {
        Op::DeleteState(pid.into(), expected, Reply::channel("test").0)
    }

    fn stored(pid: &str) -> Result<Position, ()> {
        Ok(match pid {
            "at2" => Position {
                seq_nr: 2,
                writer: 5,
            },
            _ => Position::default(),
        })
    }

    fn stored_state(pid: &str) -> Result<Option<Position>, ()> {
        Ok((pid == "s1").then_some(Position {
            seq_nr: 1,
            writer: 5,
        }))
    }

    #[test]
    fn a_batch_checks_each_write_in_order_and_refuses_alone() {
        let batch = vec![
            append("at2", 2, 5, &[1, 2]),
            append("at2", 2, 5, &[9]),
            append("at2", 4, 4, &[9]),
            append("at2", 4, 6, &[3]),
            append("new", 0, 1, &[]),
            append("new", 0, 1, &[7]),
            append("gone", 3, 1, &[7]),
        ];
        let mut asked = Vec::new();
        let plan = plan(
            &batch,
            |pid| {
                asked.push(pid.to_string());
                stored(pid)
            },
            stored_state,
        )
        .unwrap();
        assert_eq!(asked, ["at2", "new", "gone"], "each stream read once");
        assert_eq!(plan.outcomes[0], Ok(4));
        assert!(matches!(
            plan.outcomes[1],
            Err(StoreError::Conflict {
                expected: 2,
                actual: 4,
                ..
            })
        ));
        assert!(matches!(
            plan.outcomes[2],
            Err(StoreError::Fenced {
                writer: 4,
                current: 5,
                ..
            })
        ));
        assert_eq!(plan.outcomes[3], Ok(5));
        assert_eq!(plan.outcomes[4], Ok(0));
        assert_eq!(plan.outcomes[5], Ok(1));
        assert!(matches!(
            plan.outcomes[6],
            Err(StoreError::Conflict {
                expected: 3,
                actual: 0,
                ..
            })
        ));
        let events: Vec<_> = plan
            .events
            .iter()
            .map(|e| (e.persistence_id, e.seq_nr, e.writer))
            .collect();
        assert_eq!(
            events,
            [("at2", 3, 5), ("at2", 4, 5), ("at2", 5, 6), ("new", 1, 1)]
        );
        assert_eq!(
            plan.streams,
            [
                (
                    "at2",
                    Position {
                        seq_nr: 5,
                        writer: 6
                    }
                ),
                (
                    "new",
                    Position {
                        seq_nr: 1,
                        writer: 1
                    }
                )
            ]
        );
    }

    /// A stored position or revision no write can follow (a -1 read back as `u64`) refuses
    /// the writes on it with an error naming it, alone; it used to overflow (a panic that
    /// failed the whole batch, or a wrapped number in a release build).
    #[test]
    fn a_corrupt_stored_number_refuses_its_writes_alone() {
        let corrupt = Position {
            seq_nr: u64::MAX,
            writer: 1,
        };
        let batch = vec![
            append("corrupt", u64::MAX, 1, &[1]),
            append("corrupt", u64::MAX, 1, &[]),
            append("new", 0, 1, &[2]),
            upsert("corrupt", u64::MAX, 1),
            upsert("s2", 0, 1),
        ];
        let plan = plan(
            &batch,
            |pid| {
                Ok::<_, ()>(if pid == "corrupt" {
                    corrupt
                } else {
                    Position::default()
                })
            },
            |pid| Ok((pid == "corrupt").then_some(corrupt)),
        )
        .unwrap();
        let refused = |what: &str| {
            Err(StoreError::Backend(format!(
                "the stored {what} 18446744073709551615 of corrupt is corrupt: no write can \
                 follow it"
            )))
        };
        assert_eq!(plan.outcomes[0], refused("sequence number"));
        assert_eq!(
            plan.outcomes[1],
            Ok(u64::MAX),
            "an empty append only checks"
        );
        assert_eq!(plan.outcomes[2], Ok(1));
        assert_eq!(plan.outcomes[3], refused("revision"));
        assert_eq!(plan.outcomes[4], Ok(1));
        let events: Vec<_> = plan.events.iter().map(|e| e.persistence_id).collect();
        assert_eq!(events, ["new"]);
        let states: Vec<_> = plan.states.iter().map(|s| s.persistence_id).collect();
        assert_eq!(states, ["s2"]);
    }

    /// A stored -2 (read back as `u64::MAX - 1`) is corrupt too: the write after it would be
    /// stored as -1 (until 2026-12-01 it was).
    #[test]
    fn a_stored_number_above_i64_max_refuses_its_writes() {
        let corrupt = Position {
            seq_nr: u64::MAX - 1,
            writer: 1,
        };
        let batch = vec![
            append("corrupt", u64::MAX - 1, 1, &[1]),
            upsert("corrupt", u64::MAX - 1, 1),
            append("top", i64::MAX as u64, 1, &[1]),
        ];
        let plan = plan(
            &batch,
            |pid| {
                Ok::<_, ()>(match pid {
                    "corrupt" => corrupt,
                    _ => Position {
                        seq_nr: i64::MAX as u64,
                        writer: 1,
                    },
                })
            },
            |pid| Ok((pid == "corrupt").then_some(corrupt)),
        )
        .unwrap();
        let refused = |what: &str, pid: &str, n: u64| {
            Err(StoreError::Backend(format!(
                "the stored {what} {n} of {pid} is corrupt: no write can follow it"
            )))
        };
        assert_eq!(
            plan.outcomes[0],
            refused("sequence number", "corrupt", u64::MAX - 1)
        );
        assert_eq!(
            plan.outcomes[1],
            refused("revision", "corrupt", u64::MAX - 1)
        );
        // The largest storable number: nothing storable follows it either.
        assert_eq!(
            plan.outcomes[2],
            refused("sequence number", "top", i64::MAX as u64)
        );
        assert!(plan.events.is_empty() && plan.states.is_empty());
    }

    #[test]
    fn a_deletion_covers_only_the_events_queued_before_it() {
        let batch = vec![
            append("a", 0, 1, &[1, 2]),
            delete_events("a", 1),
            append("a", 2, 1, &[3]),
        ];
        let plan = plan(&batch, stored, stored_state).unwrap();
        let seqs: Vec<_> = plan.events.iter().map(|e| e.seq_nr).collect();
        assert_eq!(seqs, [2, 3]);
        assert_eq!(plan.event_deletes, [("a", 1)]);
        assert_eq!(
            plan.streams,
            [(
                "a",
                Position {
                    seq_nr: 3,
                    writer: 1
                }
            )]
        );
    }

    #[test]
    fn durable_state_chains_end_in_one_row_change() {
        let batch = vec![
            upsert("s1", 1, 5),
            upsert("s1", 1, 5),
            delete_state("s1", 2),
            upsert("s1", 0, 6),
            upsert("s2", 0, 1),
            delete_state("s2", 1),
            delete_state("s3", 0),
            upsert("s4", 0, 4),
        ];
        let plan = plan(&batch, stored, stored_state).unwrap();
        assert_eq!(plan.outcomes[0], Ok(2));
        assert!(matches!(
            plan.outcomes[1],
            Err(StoreError::Conflict {
                expected: 1,
                actual: 2,
                ..
            })
        ));
        assert_eq!(
            plan.outcomes[2..],
            [Ok(0), Ok(1), Ok(1), Ok(0), Ok(0), Ok(1)]
        );
        let changes: Vec<_> = plan
            .states
            .iter()
            .map(|s| {
                (
                    s.persistence_id,
                    s.existed,
                    s.position,
                    s.payload.is_some(),
                    s.ops.clone(),
                )
            })
            .collect();
        let at = |seq_nr, writer| Position { seq_nr, writer };
        assert_eq!(
            changes,
            [
                ("s1", true, at(1, 6), true, vec![0, 2, 3]),
                ("s2", false, at(0, 0), false, vec![4, 5]),
                ("s3", false, at(0, 0), false, vec![6]),
                ("s4", false, at(1, 4), true, vec![7]),
            ]
        );
    }
}
