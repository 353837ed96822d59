//! The PostgreSQL writer task: whatever is queued is written in one transaction, committed
//! once, then every caller is answered.
//!
//! A batch's statements are set-based (one statement for all streams, states or events of
//! the batch, with array parameters) and pipelined (sent together on one connection, answers
//! read afterwards), so a batch costs one or two round trips however many writes it holds:
//!
//! 1. Only if needed: `BEGIN`; read the position (highest row and its writer) of every
//!    stream whose position the lane does not know ([`Known`]), and lock and read every
//!    durable state the batch writes, in persistence-id order
//!    (`… = ANY($1) ORDER BY persistence_id FOR UPDATE`).
//! 2. In Rust, check every write in batch order with the rules every backend uses
//!    ([`crate::batch::plan`]); refused writes get their own error and write nothing.
//! 3. Event deletions; all accepted events (one `INSERT … SELECT FROM UNNEST`); snapshot
//!    operations; durable-state rows; `COMMIT`. A batch that comes down to one statement
//!    (typically appends whose positions the lane knows) is sent alone, without `BEGIN` and
//!    `COMMIT`: PostgreSQL runs a lone statement as a transaction of its own.
//!
//! Stream positions are not locked: the journal's primary key refuses a second row at one
//! position, so a batch that raced with another writer (or trusted a position that another
//! node has since moved on) fails on the key as a whole. The lane then forgets the batch's
//! positions and writes it again with positions read inside the new transaction, which
//! refuses the stale append with a precise conflict or fencing error; after
//! [`MAX_ATTEMPTS`] such races every write of the batch gets the error.
//!
//! A batch whose connection turns out to be gone (the server restarted, failed over or
//! ended it) is written again on another connection, at most once per pooled connection;
//! that is safe even if its commit had reached the server, as the position check then
//! refuses its appends instead of writing them twice. If the connection was lost while the
//! batch committed, a write that attempt had accepted and that then fails is reported as
//! unknown, whatever the next attempt ran into ([`settle`]).
//!
//! Any other database error fails the whole batch: every write in it gets the error (none
//! is acknowledged) and the connection is dropped rather than returned to the pool.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use deadpool_postgres::{Object, Pool};
use futures_util::FutureExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::{Client, Row, Statement};

use super::known::Known;
use super::sql::Sql;
use super::{backend, connection_lost, pool_error, to_i64, to_u64};
use crate::batch::{
    plan, sql_bound, AnswerAsPanicked, Counters, Done, Op, Plan, Position, SnapshotStep,
    StateChange,
};
use crate::error::StoreError;
use crate::rules::check_write;

/// How often a batch is written before a race on the journal's primary key fails it.
pub(super) const MAX_ATTEMPTS: usize = 3;

/// Bytes of ids and payloads above which a lane starts a new batch (a write larger than
/// this goes alone). PostgreSQL refuses a protocol message over 1 GiB, and a statement
/// carries a whole batch's payloads in one array.
pub(super) const MAX_BATCH_BYTES: usize = 64 << 20;

/// Most bytes of ids and payloads in one write: a larger one is refused alone (see
/// [`MAX_BATCH_BYTES`]).
pub(super) const MAX_WRITE_BYTES: usize = 256 << 20;

/// Longest persistence id, in bytes: the journal's primary-key index holds entries of at
/// most about 2.7 KB, and a longer id would fail its whole batch.
pub(super) const MAX_ID_BYTES: usize = 2048;

/// What a write puts into a batch's statements: its id and payload bytes.
fn op_bytes(op: &Op) -> usize {
    let id = op.persistence_id().len();
    id + match op {
        Op::Append(r, _) => r
            .events
            .iter()
            .map(|p| p.bytes.len() + p.type_name.len() + id)
            .sum(),
        Op::SaveSnapshot(s, _) => s.payload.bytes.len() + s.payload.type_name.len(),
        Op::Upsert(w, _) => w.payload.bytes.len() + w.payload.type_name.len(),
        Op::DeleteEvents(..) | Op::DeleteSnapshots(..) | Op::DeleteState(..) => 0,
    }
}

/// Runs until every sender is gone.
pub(super) async fn run(
    pool: Pool,
    sql: std::sync::Arc<Sql>,
    mut ops: UnboundedReceiver<Op>,
    max_batch: usize,
    known_positions: usize,
    counters: std::sync::Arc<Counters>,
) {
    let mut known = Known::new(known_positions);
    let mut batch = Vec::with_capacity(max_batch);
    // A write taken from the queue that did not fit in the last batch's bytes: it starts
    // the next one.
    let mut carried: Option<Op> = None;
    loop {
        let first = match carried.take() {
            Some(op) => op,
            None => match ops.recv().await {
                Some(op) => op,
                None => break,
            },
        };
        let mut bytes = op_bytes(&first);
        batch.push(first);
        while batch.len() < max_batch && bytes < MAX_BATCH_BYTES {
            match ops.try_recv() {
                Ok(op) => {
                    let size = op_bytes(&op);
                    if bytes + size > MAX_BATCH_BYTES {
                        carried = Some(op);
                        break;
                    }
                    bytes += size;
                    batch.push(op);
                }
                Err(_) => break,
            }
        }
        // Durable-state rows are locked in persistence-id order, so two nodes' batches
        // cannot deadlock; the sort is stable, so one id's writes keep their order.
        batch.sort_by(|a, b| a.persistence_id().cmp(b.persistence_id()));
        // Drained, not moved: the buffer keeps its capacity for the next batch.
        let written = {
            // Boxed, so that it can be dropped here: the unwinding of a panic drops the live
            // locals of the batch's async fns (reply slots among them, which answer that
            // their batch panicked); whatever the future still holds is dropped below, and
            // answers likewise.
            let mut write = Box::pin(
                std::panic::AssertUnwindSafe(write_batch(
                    &pool, &sql, &mut known, &counters, &mut batch,
                ))
                .catch_unwind(),
            );
            let written = write.as_mut().await;
            if written.is_err() {
                // Those callers learn that their batch panicked.
                let _answer = AnswerAsPanicked::enter();
                drop(write);
            }
            written
        };
        let results = match written {
            Ok(results) => results,
            Err(panic) => {
                tracing::error!(
                    panic = %shardik_actor::panic_message(&*panic),
                    "the PostgreSQL writer panicked while writing a batch: its writes failed, whether they were written is unknown; it serves on"
                );
                // What it knew of the streams may be half true now.
                known = Known::new(known_positions);
                let error = crate::batch::panicked("PostgreSQL");
                batch.drain(..).map(|op| op.refuse(error.clone())).collect()
            }
        };
        debug_assert!(batch.is_empty(), "every write of a batch is answered");
        counters.batch(results.len(), "postgres");
        for done in results {
            done.send();
        }
    }
}

async fn write_batch(
    pool: &Pool,
    sql: &Sql,
    known: &mut Known,
    counters: &Counters,
    batch: &mut Vec<Op>,
) -> Vec<Done> {
    let mut results: Vec<Done> = Vec::with_capacity(batch.len());
    // A write PostgreSQL would refuse (NUL in text, an id too long for the journal's index,
    // too many bytes) is refused alone instead of failing the statement that carries the
    // whole batch.
    if batch.iter().any(|op| unstorable(op).is_some()) {
        let (unstorable_ops, storable): (Vec<Op>, Vec<Op>) = std::mem::take(batch)
            .into_iter()
            .partition(|op| unstorable(op).is_some());
        *batch = storable;
        results.extend(unstorable_ops.into_iter().map(|op| {
            let why = unstorable(&op).expect("partitioned");
            op.refuse(StoreError::Backend(format!("postgres: {why}")))
        }));
    }
    if batch.is_empty() {
        return results;
    }
    // Per write of the batch: accepted by an attempt whose connection was lost while it
    // committed, so possibly stored (empty until such a loss).
    let mut maybe_stored: Vec<bool> = Vec::new();
    let mut client = match pool.get().await {
        Ok(c) => {
            known.connection(Object::id(&c));
            Lent(Some(c))
        }
        Err(e) => {
            let e = pool_error(e);
            results.extend(batch.drain(..).map(|op| op.refuse(e.clone())));
            return results;
        }
    };
    let mut attempt = 1;
    // Connections the server dropped are found out by using them: at most the whole pool.
    let mut lost_left = pool.status().max_size + 1;
    let outcomes = loop {
        let failed = match write(&client, sql, batch, known, attempt == 1).await {
            Ok(outcomes) => break outcomes,
            Err(failed) => failed,
        };
        // What the batch's streams hold is unknown now.
        for op in batch.iter() {
            known.forget(op.persistence_id());
        }
        if failed.unsure {
            note_maybe_stored(&mut maybe_stored, failed.plan.as_deref(), batch.len());
        }
        let lost = connection_lost(&failed.error);
        if (failed.raced && attempt < MAX_ATTEMPTS) || (lost && lost_left > 1) {
            if lost {
                tracing::warn!(
                    error = %failed.error,
                    "PostgreSQL connection lost; writing the batch again on another"
                );
                lost_left -= 1;
            } else {
                tracing::debug!(
                    attempt,
                    "PostgreSQL batch raced with another writer; writing it again"
                );
                attempt += 1;
            }
            counters.retry("postgres");
            if lost || !failed.closed {
                drop(Object::take(client.give_up()));
                client = match pool.get().await {
                    Ok(c) => {
                        known.connection(Object::id(&c));
                        Lent(Some(c))
                    }
                    Err(e) => {
                        let e = pool_error(e);
                        results.extend(batch.drain(..).enumerate().map(|(i, op)| {
                            op.refuse(settle(&maybe_stored, i, Err(e.clone())).unwrap_err())
                        }));
                        return results;
                    }
                };
            }
            continue;
        }
        let error = backend(failed.error);
        tracing::error!(error = %error, "PostgreSQL batch failed; every write in it is refused");
        if !failed.closed {
            // The transaction may still be open: never hand this connection out again.
            drop(Object::take(client.give_up()));
        }
        break match failed.plan {
            Some(mut outcomes) => {
                for outcome in &mut outcomes {
                    if outcome.is_ok() {
                        *outcome = Err(error.clone());
                    }
                }
                outcomes
            }
            None => vec![Err(error); batch.len()],
        };
    };
    results.extend(
        batch
            .drain(..)
            .zip(outcomes)
            .enumerate()
            .map(|(i, (op, outcome))| op.complete(settle(&maybe_stored, i, outcome))),
    );
    results
}

/// Tests: a batch holding a write of this id commits, then loses the answer to its commit
/// with its connection, on every attempt.
#[cfg(test)]
pub(super) const LOSE_ANSWER_ID: &str = "lose-the-commit-answer";

/// Ids whose next batch loses the answer to its commit ([`lose_answer_once`]).
#[cfg(test)]
static LOSE_ONCE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Tests: the next batch holding a write of `id` commits, then loses the answer to its
/// commit with its connection.
#[cfg(test)]
pub(super) fn lose_answer_once(id: &str) {
    LOSE_ONCE.lock().unwrap().push(id.to_string());
}

#[cfg(test)]
fn lose_answer_on_demand(batch: &[Op]) -> bool {
    let holds = |id: &str| batch.iter().any(|op| op.persistence_id() == id);
    let mut once = LOSE_ONCE.lock().unwrap();
    let armed = once.iter().position(|id| holds(id));
    armed.map(|at| once.swap_remove(at)).is_some() || holds(LOSE_ANSWER_ID)
}

#[cfg(not(test))]
fn lose_answer_on_demand(_: &[Op]) -> bool {
    false
}

/// Marks the writes that an attempt whose commit may have happened had accepted (all of
/// them if it has no plan, which cannot happen today: only the last round trip commits).
fn note_maybe_stored(
    maybe_stored: &mut Vec<bool>,
    plan: Option<&[Result<u64, StoreError>]>,
    writes: usize,
) {
    maybe_stored.resize(writes, false);
    for (i, stored) in maybe_stored.iter_mut().enumerate() {
        *stored |= plan.is_none_or(|p| p[i].is_ok());
    }
}

/// The outcome to report for write `i`: a refusal of a write that an earlier attempt may
/// have committed (its connection was lost while it committed) says that whether it was
/// stored is unknown. A conflict found on the next attempt is no exception: the lost commit
/// itself may be what moved the stream on.
fn settle(
    maybe_stored: &[bool],
    i: usize,
    outcome: Result<u64, StoreError>,
) -> Result<u64, StoreError> {
    match outcome {
        Err(e) if maybe_stored.get(i).copied().unwrap_or(false) => {
            let then = match e {
                StoreError::Backend(text) => text,
                other => other.to_string(),
            };
            Err(StoreError::Backend(format!(
                "postgres: whether this write was stored is unknown: its batch's commit went \
                 unanswered (the connection was lost), or committed after one of the batch's \
                 statements failed on the client; last error: {then}"
            )))
        }
        outcome => outcome,
    }
}

/// Why PostgreSQL would refuse `op` (and with it every write of its batch), if it would.
fn unstorable(op: &Op) -> Option<String> {
    let ok = |s: &str| !s.contains('\0');
    let texts_ok = ok(op.persistence_id())
        && match op {
            Op::Append(r, _) => r.events.iter().all(|p| ok(&p.type_name)),
            Op::SaveSnapshot(s, _) => ok(&s.payload.type_name),
            Op::Upsert(w, _) => ok(&w.payload.type_name),
            Op::DeleteEvents(..) | Op::DeleteSnapshots(..) | Op::DeleteState(..) => true,
        };
    if !texts_ok {
        return Some("text (persistence id or type name) must not contain NUL".into());
    }
    let id = op.persistence_id().len();
    let indexed = matches!(op, Op::Append(..) | Op::SaveSnapshot(..) | Op::Upsert(..));
    if indexed && id > MAX_ID_BYTES {
        return Some(format!(
            "a persistence id of {id} bytes is longer than the {MAX_ID_BYTES} the journal's index holds"
        ));
    }
    let bytes = op_bytes(op);
    (bytes > MAX_WRITE_BYTES).then(|| {
        format!("a write of {bytes} bytes is larger than the {MAX_WRITE_BYTES} one write may carry")
    })
}

/// A batch that failed on a database error, with the checked outcomes if it got that far.
struct Failed {
    error: tokio_postgres::Error,
    plan: Option<Vec<Result<u64, StoreError>>>,
    /// The error is the journal's primary key refusing a row: another writer got there first.
    raced: bool,
    /// The transaction is known to be over (its `COMMIT` was answered, as a rollback).
    closed: bool,
    /// The connection was lost while the batch was committing: it may have been committed.
    unsure: bool,
}

impl From<tokio_postgres::Error> for Failed {
    fn from(error: tokio_postgres::Error) -> Self {
        Failed {
            error,
            plan: None,
            raced: false,
            closed: false,
            unsure: false,
        }
    }
}

/// True if `error` is the journal's primary key refusing a second row at one position, or
/// an append's probe finding that its stream already holds a later row (a row without a
/// position, which the journal refuses: see `sql::ahead`).
fn is_journal_race(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    let Some(db) = error.as_db_error() else {
        return false;
    };
    match db.code() {
        c if *c == SqlState::UNIQUE_VIOLATION => db.constraint() == Some("journal_pkey"),
        c if *c == SqlState::NOT_NULL_VIOLATION => {
            db.table() == Some("journal") && db.column() == Some("seq_nr")
        }
        _ => false,
    }
}

/// Read committed, whatever the server's or role's default: the stale-writer probe and the
/// primary key's wait rely on each statement seeing what committed before it (under
/// repeatable read the probe would read the first statement's snapshot). And a transaction
/// left open by a frozen or cut-off client (holding durable-state row locks or uncommitted
/// journal keys, which stall other nodes' lanes) is ended by the server after 30 s: set for
/// the transaction only, so it needs no startup option (which poolers such as PgBouncer
/// refuse) and leaves the role's and database's settings alone otherwise.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; \
                     SET LOCAL idle_in_transaction_session_timeout = 30000";

type Rows = Vec<Row>;
type Request<'a> = Pin<Box<dyn Future<Output = Result<Rows, tokio_postgres::Error>> + Send + 'a>>;

/// Sends every request before awaiting any answer: tokio-postgres sends a request when its
/// future is first polled, and the server answers in order.
async fn pipeline(mut requests: Vec<Request<'_>>) -> Vec<Result<Rows, tokio_postgres::Error>> {
    let mut early: Vec<Option<Result<Rows, tokio_postgres::Error>>> =
        Vec::with_capacity(requests.len());
    std::future::poll_fn(|cx| {
        for request in &mut requests {
            early.push(match request.as_mut().poll(cx) {
                Poll::Ready(result) => Some(result),
                Poll::Pending => None,
            });
        }
        Poll::Ready(())
    })
    .await;
    let mut results = Vec::with_capacity(requests.len());
    for (request, early) in requests.into_iter().zip(early) {
        results.push(match early {
            Some(result) => result,
            None => request.await,
        });
    }
    results
}

fn simple<'a>(client: &'a Client, command: &'static str) -> Request<'a> {
    Box::pin(async move { client.batch_execute(command).await.map(|()| Vec::new()) })
}

/// Ids in a batch sorted by id, once each.
fn distinct<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut ids: Vec<&str> = ids.collect();
    ids.dedup();
    ids
}

/// Stream positions by id, for one batch.
type Positions<'a> = HashMap<&'a str, Position, foldhash::fast::RandomState>;

/// The positions `rows` (`persistence_id, number, writer`) hold, by id.
fn positions(rows: &[Row]) -> Positions<'_> {
    rows.iter()
        .map(|r| {
            (
                r.get::<_, &str>(0),
                Position {
                    seq_nr: to_u64(r.get(1)),
                    writer: to_u64(r.get(2)),
                },
            )
        })
        .collect()
}

/// A pooled connection lent to one batch. If a panic unwinds the batch, the connection may
/// be inside a transaction (`BEGIN` is a plain statement, which nothing rolls back when the
/// batch's future goes away): it is then taken out of the pool and closed, so the server
/// rolls the transaction back, instead of going back to the pool, where the next batch's
/// writes would run inside it and be answered without ever being committed.
struct Lent(Option<Object>);

impl Lent {
    /// The connection, to take out of the pool.
    fn give_up(&mut self) -> Object {
        self.0.take().expect("a lent connection is given up once")
    }
}

impl std::ops::Deref for Lent {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.0
            .as_ref()
            .expect("a lent connection is used before it is given up")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(client) = self.0.take() {
                drop(Object::take(client));
            }
        }
    }
}

/// Writes `batch` (sorted by persistence id) in one transaction; returns each operation's
/// outcome once committed. Positions the lane remembers are trusted if `trust_known`.
async fn write(
    client: &deadpool_postgres::ClientWrapper,
    sql: &Sql,
    batch: &[Op],
    known: &mut Known,
    trust_known: bool,
) -> Result<Vec<Result<u64, StoreError>>, Failed> {
    // The position of each stream, taken at its first append: remembered by the lane, or
    // read below.
    let mut remembered = Positions::default();
    let mut unknown: Vec<&str> = Vec::new();
    for op in batch {
        if let Op::Append(r, _) = op {
            let pid = r.persistence_id.as_str();
            if remembered.contains_key(pid) || unknown.last() == Some(&pid) {
                continue;
            }
            match known
                .confirms(pid, r.expected_seq_nr, r.writer)
                .filter(|_| trust_known)
            {
                Some(position) => {
                    remembered.insert(pid, position);
                }
                None => unknown.push(pid),
            }
        }
    }
    let stated = distinct(batch.iter().filter_map(|op| match op {
        Op::Upsert(w, _) => Some(w.persistence_id.as_str()),
        Op::DeleteState(pid, _, _) => Some(pid.as_str()),
        _ => None,
    }));

    // Round trip 1, if anything must be read: begin, read the unknown positions, lock and
    // read the durable states.
    let read_streams = prepare_if(client, &sql.positions, !unknown.is_empty()).await?;
    let lock_states = prepare_if(client, &sql.state_lock, !stated.is_empty()).await?;
    let mut pending = vec![simple(client, BEGIN)];
    let (mut stream_rows, mut state_rows) = (Vec::new(), Vec::new());
    if read_streams.is_some() || lock_states.is_some() {
        if let Some(stmt) = &read_streams {
            pending.push(query(client, stmt, vec![Box::new(&unknown)]));
        }
        if let Some(stmt) = &lock_states {
            pending.push(query(client, stmt, vec![Box::new(&stated)]));
        }
        let mut answers = pipeline(std::mem::take(&mut pending)).await.into_iter();
        answers.next().expect("an answer per request")?;
        if read_streams.is_some() {
            stream_rows = answers.next().expect("an answer per request")?;
        }
        if lock_states.is_some() {
            state_rows = answers.next().expect("an answer per request")?;
        }
    }

    #[cfg(test)]
    crate::batch::panic_on_demand(batch);
    // Check every write in Rust.
    let (streams, states) = (positions(&stream_rows), positions(&state_rows));
    let mut plan = match plan::<Infallible>(
        batch,
        |pid| {
            Ok(remembered
                .get(pid)
                .or_else(|| streams.get(pid))
                .copied()
                .unwrap_or_default())
        },
        |pid| Ok(states.get(pid).copied()),
    ) {
        Ok(plan) => plan,
        Err(never) => match never {},
    };

    // The last round trip: write the accepted rows and commit.
    match write_plan(client, sql, &plan, pending, lose_answer_on_demand(batch)).await {
        Ok(lost) => {
            for (pid, position) in &plan.streams {
                known.committed(pid, *position);
            }
            let mut outcomes = std::mem::take(&mut plan.outcomes);
            if !lost.is_empty() {
                refuse_lost_inserts(client, sql, batch, &plan.states, &lost, &mut outcomes).await;
            }
            Ok(outcomes)
        }
        Err(Unfinished {
            error,
            closed,
            unsure,
        }) => Err(Failed {
            raced: is_journal_race(&error),
            error,
            plan: Some(plan.outcomes),
            closed,
            unsure,
        }),
    }
}

/// A boxed statement parameter.
type Param<'a> = Box<dyn tokio_postgres::types::ToSql + Sync + Send + 'a>;

fn query<'a>(client: &'a Client, stmt: &'a Statement, params: Vec<Param<'a>>) -> Request<'a> {
    Box::pin(async move {
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| &**p as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        client.query(stmt, &refs).await
    })
}

/// Why the last round trip of a batch failed.
struct Unfinished {
    error: tokio_postgres::Error,
    /// The transaction is known to be over (its `COMMIT` was answered, as a rollback).
    closed: bool,
    /// The connection was lost while the statements that commit were under way (`COMMIT`,
    /// or a lone statement): the server may have committed them before the answer was lost.
    unsure: bool,
}

impl Unfinished {
    /// `error` before anything that commits was sent.
    fn before_commit(error: tokio_postgres::Error) -> Self {
        Unfinished {
            error,
            closed: false,
            unsure: false,
        }
    }
}

/// Sends `pending` (a `BEGIN` not sent yet, if any) and the statements of `plan`, then
/// `COMMIT`; returns the durable states whose first row another transaction inserted first.
async fn write_plan<'p, 'a: 'p>(
    client: &'p deadpool_postgres::ClientWrapper,
    sql: &Sql,
    plan: &'p Plan<'a>,
    pending: Vec<Request<'p>>,
    lose_answer: bool,
) -> Result<Vec<&'a str>, Unfinished> {
    // The final position of every stream whose last accepted event a deletion in the same
    // batch covered is written as a deleted row, so the stream keeps its position.
    write_rows(client, sql, plan, &plan.covered_ends, pending, lose_answer).await
}

async fn write_rows<'p, 'a: 'p>(
    client: &'p deadpool_postgres::ClientWrapper,
    sql: &Sql,
    plan: &'p Plan<'a>,
    tombstones: &'p [(&'a str, Position)],
    pending: Vec<Request<'p>>,
    lose_answer: bool,
) -> Result<Vec<&'a str>, Unfinished> {
    let unclosed = Unfinished::before_commit;
    let delete_events = prepare_if(client, &sql.delete_events, !plan.event_deletes.is_empty());
    // Events of one type and version by one writer (the usual batch) carry them once.
    let uniform = plan.events.windows(2).all(|w| {
        w[0].writer == w[1].writer
            && w[0].payload.type_name == w[1].payload.type_name
            && w[0].payload.version == w[1].payload.version
    });
    let insert_events = prepare_if(
        client,
        if uniform {
            &sql.insert_uniform_events
        } else {
            &sql.insert_events
        },
        !plan.events.is_empty(),
    );
    let insert_tombstones = prepare_if(client, &sql.insert_tombstones, !tombstones.is_empty());
    let has_save = plan
        .snapshots
        .iter()
        .any(|s| matches!(s, SnapshotStep::Save(_)));
    let has_delete = plan
        .snapshots
        .iter()
        .any(|s| matches!(s, SnapshotStep::DeleteUpTo(..)));
    let save_snapshot = prepare_if(client, &sql.save_snapshot, has_save);
    let delete_snapshots = prepare_if(client, &sql.delete_snapshots, has_delete);
    let updated: Vec<&StateChange<'a>> = plan
        .states
        .iter()
        .filter(|s| s.existed && s.payload.is_some())
        .collect();
    let inserted: Vec<&StateChange<'a>> = plan
        .states
        .iter()
        .filter(|s| !s.existed && s.payload.is_some())
        .collect();
    let deleted: Vec<&'a str> = plan
        .states
        .iter()
        .filter(|s| s.existed && s.payload.is_none())
        .map(|s| s.persistence_id)
        .collect();
    let state_update = prepare_if(client, &sql.state_update, !updated.is_empty());
    let state_insert = prepare_if(client, &sql.state_insert, !inserted.is_empty());
    let state_delete = prepare_if(client, &sql.state_delete, !deleted.is_empty());
    let (
        delete_events,
        insert_events,
        insert_tombstones,
        save_snapshot,
        delete_snapshots,
        state_update,
        state_insert,
        state_delete,
    ) = (
        delete_events.await.map_err(unclosed)?,
        insert_events.await.map_err(unclosed)?,
        insert_tombstones.await.map_err(unclosed)?,
        save_snapshot.await.map_err(unclosed)?,
        delete_snapshots.await.map_err(unclosed)?,
        state_update.await.map_err(unclosed)?,
        state_insert.await.map_err(unclosed)?,
        state_delete.await.map_err(unclosed)?,
    );
    // The statements below borrow the locals above.
    let mut pending: Vec<Request<'_>> = pending;
    // 1 if `BEGIN` is still to be sent (nothing was read first), else 0.
    let unsent_begin = pending.len();

    if let Some(stmt) = &delete_events {
        for (pid, to) in &plan.event_deletes {
            pending.push(query(
                client,
                stmt,
                vec![Box::new(*pid), Box::new(sql_bound(*to))],
            ));
        }
    }
    if let Some(stmt) = &insert_events {
        let events = &plan.events;
        let (writer, type_name, version): (Param<'_>, Param<'_>, Param<'_>) = if uniform {
            let first = &events[0];
            (
                Box::new(to_i64(first.writer)),
                Box::new(first.payload.type_name.as_str()),
                Box::new(i64::from(first.payload.version)),
            )
        } else {
            (
                Box::new(events.iter().map(|e| to_i64(e.writer)).collect::<Vec<_>>()),
                Box::new(
                    events
                        .iter()
                        .map(|e| e.payload.type_name.as_str())
                        .collect::<Vec<_>>(),
                ),
                Box::new(
                    events
                        .iter()
                        .map(|e| i64::from(e.payload.version))
                        .collect::<Vec<_>>(),
                ),
            )
        };
        pending.push(query(
            client,
            stmt,
            vec![
                Box::new(events.iter().map(|e| e.persistence_id).collect::<Vec<_>>()),
                Box::new(events.iter().map(|e| to_i64(e.seq_nr)).collect::<Vec<_>>()),
                writer,
                type_name,
                version,
                Box::new(
                    events
                        .iter()
                        .map(|e| e.payload.bytes.as_slice())
                        .collect::<Vec<_>>(),
                ),
            ],
        ));
    }
    if let Some(stmt) = &insert_tombstones {
        pending.push(query(
            client,
            stmt,
            vec![
                Box::new(tombstones.iter().map(|(pid, _)| *pid).collect::<Vec<_>>()),
                Box::new(
                    tombstones
                        .iter()
                        .map(|(_, p)| to_i64(p.seq_nr))
                        .collect::<Vec<_>>(),
                ),
                Box::new(
                    tombstones
                        .iter()
                        .map(|(_, p)| to_i64(p.writer))
                        .collect::<Vec<_>>(),
                ),
            ],
        ));
    }
    for step in &plan.snapshots {
        pending.push(match step {
            SnapshotStep::Save(s) => query(
                client,
                save_snapshot.as_ref().expect("prepared"),
                vec![
                    Box::new(s.persistence_id.as_str()),
                    Box::new(to_i64(s.seq_nr)),
                    Box::new(s.payload.type_name.as_str()),
                    Box::new(i64::from(s.payload.version)),
                    Box::new(s.payload.bytes.as_slice()),
                ],
            ),
            SnapshotStep::DeleteUpTo(pid, to) => query(
                client,
                delete_snapshots.as_ref().expect("prepared"),
                vec![Box::new(*pid), Box::new(sql_bound(*to))],
            ),
        });
    }
    if let Some(stmt) = &state_update {
        pending.push(query(client, stmt, state_params(&updated)));
    }
    let insert_at = pending.len();
    if let Some(stmt) = &state_insert {
        pending.push(query(client, stmt, state_params(&inserted)));
    }
    if let Some(stmt) = &state_delete {
        pending.push(query(client, stmt, vec![Box::new(deleted)]));
    }
    // A batch that is one statement (typically: appends whose positions the lane knows)
    // needs no explicit transaction: PostgreSQL runs a lone statement as one.
    let alone = unsent_begin == 1 && pending.len() == 2;
    if alone {
        drop(pending.remove(0));
    } else {
        pending.push(simple(client, "COMMIT"));
    }
    let insert_at = insert_at - usize::from(alone);
    let commit_at = pending.len() - 1;
    if lose_answer {
        // Tests: the server commits, then ends the connection (read below as the answer to
        // the commit, which is then lost).
        pending.push(simple(
            client,
            "SELECT pg_terminate_backend(pg_backend_pid())",
        ));
    }
    // A connection found closed before anything is sent commits nothing.
    let sent = !client.is_closed();
    let mut answers = pipeline(pending).await;
    if lose_answer {
        let ended = answers.pop().expect("an answer per request");
        answers[commit_at] = Err(ended.expect_err("the server ended the connection"));
    }
    // After a failed statement the server refuses the rest and `COMMIT` rolls back: report
    // the first error.
    if let Some(i) = answers.iter().position(Result::is_err) {
        let committed = answers[commit_at].is_ok();
        let error = answers.swap_remove(i).expect_err("an error");
        // A server error aborts the transaction (its `COMMIT` then answers as a rollback);
        // an error of the client's own (a statement it could not send) does not, and the
        // `COMMIT` after it committed the rest: what was stored is then unknown.
        let unsent = committed && i < commit_at && error.as_db_error().is_none();
        return Err(Unfinished {
            closed: alone || committed,
            unsure: unsent || (!committed && sent && commit_unsure(&error, i >= commit_at)),
            error,
        });
    }
    let mut lost = Vec::new();
    if state_insert.is_some() {
        let rows = answers.swap_remove(insert_at).expect("checked");
        let done: std::collections::HashSet<&str> = rows.iter().map(|r| r.get(0)).collect();
        lost = inserted
            .iter()
            .map(|s| s.persistence_id)
            .filter(|pid| !done.contains(pid))
            .collect();
    }
    Ok(lost)
}

/// True if a batch whose first error is `error` may have committed, its commit not having
/// answered. `at_commit`: the error is the answer to `COMMIT` (or to the lone statement).
///
/// A server error before that aborted the transaction, and an ordinary error answered to
/// the commit rolled it back. A session the server ended while committing (`FATAL`,
/// `PANIC`), or no answer at all (the connection broke, and answers already on their way
/// were lost with it), leaves it open.
fn commit_unsure(error: &tokio_postgres::Error, at_commit: bool) -> bool {
    use tokio_postgres::error::Severity;
    match error.as_db_error() {
        Some(db) => {
            at_commit
                && !matches!(
                    db.parsed_severity(),
                    Some(Severity::Error | Severity::Warning | Severity::Notice)
                )
        }
        None => true,
    }
}

async fn prepare_if(
    client: &deadpool_postgres::ClientWrapper,
    sql: &str,
    needed: bool,
) -> Result<Option<Statement>, tokio_postgres::Error> {
    if needed {
        client.prepare_cached(sql).await.map(Some)
    } else {
        Ok(None)
    }
}

/// The array parameters of durable-state rows: id, revision, writer, type, version, payload.
fn state_params<'a>(states: &[&StateChange<'a>]) -> Vec<Param<'a>> {
    let payload = |s: &StateChange<'a>| s.payload.expect("a state row to write");
    vec![
        Box::new(states.iter().map(|s| s.persistence_id).collect::<Vec<_>>()),
        Box::new(
            states
                .iter()
                .map(|s| to_i64(s.position.seq_nr))
                .collect::<Vec<_>>(),
        ),
        Box::new(
            states
                .iter()
                .map(|s| to_i64(s.position.writer))
                .collect::<Vec<_>>(),
        ),
        Box::new(
            states
                .iter()
                .map(|s| payload(s).type_name.as_str())
                .collect::<Vec<_>>(),
        ),
        Box::new(
            states
                .iter()
                .map(|s| i64::from(payload(s).version))
                .collect::<Vec<_>>(),
        ),
        Box::new(
            states
                .iter()
                .map(|s| payload(s).bytes.as_slice())
                .collect::<Vec<_>>(),
        ),
    ]
}

/// Refuses the writes to durable states whose first row another transaction inserted
/// between this batch's read and its insert (the insert did nothing), with the error the
/// stored row gives them.
async fn refuse_lost_inserts(
    client: &deadpool_postgres::ClientWrapper,
    sql: &Sql,
    batch: &[Op],
    states: &[StateChange<'_>],
    lost: &[&str],
    outcomes: &mut [Result<u64, StoreError>],
) {
    let stored: HashMap<String, Position> = match client.prepare_cached(&sql.state_read).await {
        Ok(stmt) => client
            .query(&stmt, &[&lost])
            .await
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            Position {
                                seq_nr: to_u64(r.get(1)),
                                writer: to_u64(r.get(2)),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        Err(_) => HashMap::new(),
    };
    for s in states.iter().filter(|s| lost.contains(&s.persistence_id)) {
        let pid = s.persistence_id;
        let actual = stored.get(pid).copied().unwrap_or_default();
        let mut first: Option<StoreError> = None;
        for &i in &s.ops {
            let own = match &batch[i] {
                Op::Upsert(w, _) => check_write(
                    pid,
                    actual.seq_nr,
                    actual.writer,
                    w.expected_revision,
                    w.writer,
                )
                .err(),
                Op::DeleteState(_, expected, _) => {
                    (*expected != actual.seq_nr).then(|| StoreError::Conflict {
                        persistence_id: pid.to_string(),
                        expected: *expected,
                        actual: actual.seq_nr,
                    })
                }
                _ => None,
            };
            // A later write of the same chain was refused because the first one was.
            let error = own
                .or_else(|| first.clone())
                .unwrap_or_else(|| StoreError::Conflict {
                    persistence_id: pid.to_string(),
                    expected: 0,
                    actual: actual.seq_nr,
                });
            first.get_or_insert_with(|| error.clone());
            outcomes[i] = Err(error);
        }
    }
}
