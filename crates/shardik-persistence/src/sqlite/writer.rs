//! The SQLite writer thread: every write goes through it, and whatever is queued when it
//! wakes up is written in one transaction (one fsync) before each caller is answered.
//!
//! A batch is planned first ([`crate::batch::plan`]): the positions of the streams and
//! states it touches are read once each, every write is checked in Rust in batch order, and
//! only the accepted writes' rows are then written, with prepared statements kept for the
//! whole batch. A refused write therefore writes nothing and needs no savepoint; an
//! unexpected SQLite error rolls the whole batch back and every write in it gets the error.
//!
//! The writer remembers the stream positions it read or committed, and does not read them
//! again while no other connection has committed since its last batch (SQLite's
//! `PRAGMA data_version`, read inside each batch's write transaction; another process, or
//! the sharding store's writes on a read connection, make it forget them all). With many
//! entities that spares one of the three statements per event: about 15-25% more events/s
//! with 10 000 entities.

use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};

use std::sync::atomic::{AtomicBool, Ordering};

use std::sync::Arc;

use compact_str::CompactString;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::schema::{backend, now_millis, to_i64, to_u64};
use crate::batch::{
    plan, sql_bound, Counters, Done, Op, Plan, Position, RememberedPositions, SnapshotStep,
};

const SELECT_STREAM: &str =
    "SELECT highest_seq_nr, writer FROM journal_meta WHERE persistence_id = ?1";
const SELECT_STATE: &str = "SELECT revision, writer FROM durable_state WHERE persistence_id = ?1";
const DELETE_EVENTS: &str = "DELETE FROM journal WHERE persistence_id = ?1 AND seq_nr <= ?2";
const INSERT_EVENT: &str = "INSERT INTO journal
    (persistence_id, seq_nr, writer, type_name, version, payload, written_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const UPSERT_STREAM: &str =
    "INSERT INTO journal_meta (persistence_id, highest_seq_nr, writer) VALUES (?1, ?2, ?3)
     ON CONFLICT (persistence_id) DO UPDATE
     SET highest_seq_nr = excluded.highest_seq_nr, writer = excluded.writer";
const SAVE_SNAPSHOT: &str = "INSERT OR REPLACE INTO snapshots
    (persistence_id, seq_nr, type_name, version, payload, written_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const DELETE_SNAPSHOTS: &str = "DELETE FROM snapshots WHERE persistence_id = ?1 AND seq_nr <= ?2";
const WRITE_STATE: &str = "INSERT OR REPLACE INTO durable_state
    (persistence_id, revision, writer, type_name, version, payload, written_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const DELETE_STATE: &str = "DELETE FROM durable_state WHERE persistence_id = ?1";

/// WAL frames after which the writer asks the checkpointer for a (passive) checkpoint
/// (SQLite's default `wal_autocheckpoint`).
const CHECKPOINT_FRAMES: i32 = 1000;

/// WAL frames beyond which the writer finishes a checkpoint itself, between two batches.
///
/// SQLite starts the WAL over (writes from the start of the file again) only once a
/// checkpoint has copied all of it, and the checkpointer's passive checkpoints, beside a
/// writer that commits all the time, seldom do: the WAL then grew without bound (hundreds of
/// megabytes to gigabytes in the benchmark). A checkpoint run by the writer while no write
/// is in progress copies the rest (only the frames the checkpointer has not copied yet), so
/// the next transaction starts the WAL over. The checkpointer still does most of the
/// copying, beside the writer: checkpointing only in the writer (tried on 2026-11-25) kept
/// the WAL at a few megabytes but cost 10-25% of the benchmark's throughput with 10 000
/// entities.
const RESTART_FRAMES: i32 = 8 * CHECKPOINT_FRAMES;

/// The writer's side of the checkpointer.
pub(super) struct Checkpoints {
    /// Asks for a passive checkpoint (full: one is pending already).
    pub(super) requests: SyncSender<()>,
    /// Held while either checkpoints: the writer does not start one while the checkpointer
    /// runs (SQLite would refuse it), it tries again after its next batch.
    pub(super) running: Arc<Mutex<()>>,
}

/// Runs until every sender is gone, writing batches of at most `max_batch` operations.
/// Asks `checkpoints` for a checkpoint when the WAL has grown by [`CHECKPOINT_FRAMES`], and
/// finishes one itself after a batch that left [`RESTART_FRAMES`] or more in it.
pub(super) fn run(
    mut conn: Connection,
    ops: Receiver<Op>,
    max_batch: usize,
    counters: &Counters,
    checkpoints: Checkpoints,
    replier: &Replier,
) {
    conn.wal_hook(Some(wal_grew));
    // The hook cannot capture: it reaches the checkpointer through this thread's slot.
    CHECKPOINTER.with(|c| *c.borrow_mut() = Some(checkpoints.requests));
    let mut batch = Vec::with_capacity(max_batch);
    let mut positions = Positions::default();
    while let Ok(first) = ops.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        counters.batch(batch.len(), "sqlite");
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            write_batch(&mut conn, std::mem::take(&mut batch), &mut positions)
        }));
        match written {
            Ok(done) => replier.answer(done),
            Err(panic) => {
                // The batch's callers were answered with an error as it unwound (their
                // reply slots were dropped: see `Reply`); the writer serves on, and it forgets what it knew of the
                // streams, which the failed batch may have left half true.
                tracing::error!(
                    panic = %shardik_actor::panic_message(&*panic),
                    "the SQLite writer panicked while writing a batch: its writes failed, whether they were written is unknown; it serves on"
                );
                positions = Positions::default();
                if !conn.is_autocommit() {
                    // Dropping the transaction rolled it back; make sure of it.
                    if let Err(e) = conn.execute_batch("ROLLBACK") {
                        tracing::warn!(error = %e, "SQLite rollback after a panic failed");
                    }
                }
            }
        }
        if RESTART_DUE.with(std::cell::Cell::get) {
            if let Some(_running) = checkpoints.running.try_lock() {
                RESTART_DUE.with(|due| due.set(false));
                passive_checkpoint(&conn);
            }
        }
    }
}

/// A passive checkpoint: it never waits for readers (or another process's writer); whatever
/// they still need stays in the WAL for a later one.
fn passive_checkpoint(conn: &Connection) {
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "SQLite checkpoint failed");
    }
}

/// Answers callers from a task on their runtime when there is one: waking a task from
/// inside the runtime is much cheaper than from this thread, and the writer can start its
/// next batch meanwhile.
///
/// Only a multi-thread runtime gets the reply task: its workers run it whatever the caller
/// does. A current-thread runtime runs tasks only while something drives it (`block_on`),
/// so a reply task there would leave the callers on every other runtime unanswered for as
/// long as nobody drives it (a runtime kept after a `block_on` that wrote, a test's
/// runtime beside the application's). Callers on such runtimes are answered from the
/// writer's thread.
#[derive(Default)]
pub(super) struct Replier {
    route: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Vec<Done>>>>,
    live: AtomicBool,
}

impl Replier {
    /// Makes sure a reply task runs, on the current tokio runtime if there is one.
    pub(super) fn ensure(&self) {
        if self.live.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return;
        }
        let mut route = self.route.lock();
        if route.as_ref().is_some_and(|r| !r.is_closed()) {
            self.live.store(true, Ordering::Release);
            return;
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Done>>();
        runtime.spawn(async move {
            let mut rx = AnswerOnDrop(rx);
            while let Some(batch) = rx.0.recv().await {
                for done in batch {
                    done.send();
                }
            }
        });
        *route = Some(tx);
        self.live.store(true, Ordering::Release);
    }

    /// Answers a batch's callers, through the reply task if it runs, else from here.
    fn answer(&self, batch: Vec<Done>) {
        let batch = match &*self.route.lock() {
            Some(route) => match route.send(batch) {
                Ok(()) => return,
                Err(back) => {
                    // Its runtime has shut down: the next write starts another.
                    self.live.store(false, Ordering::Release);
                    back.0
                }
            },
            None => batch,
        };
        for done in batch {
            done.send();
        }
    }
}

/// The reply task's queue. If the task is dropped with batches still queued (its runtime
/// shut down), they are answered from there: they were committed, and their callers (on
/// other runtimes) must not read a closed store. Closed first, so a batch sent meanwhile is
/// refused and answered by the writer itself.
struct AnswerOnDrop(tokio::sync::mpsc::UnboundedReceiver<Vec<Done>>);

impl Drop for AnswerOnDrop {
    fn drop(&mut self) {
        self.0.close();
        while let Ok(batch) = self.0.try_recv() {
            for done in batch {
                done.send();
            }
        }
    }
}

thread_local! {
    static CHECKPOINTER: std::cell::RefCell<Option<SyncSender<()>>> =
        const { std::cell::RefCell::new(None) };
    /// Set by [`wal_grew`] on the writer's thread, cleared by the writer's own checkpoint.
    static RESTART_DUE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The WAL's size in frames when the writer last asked the checkpointer.
    static ASKED_AT: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Called by SQLite after each commit with the WAL's size in frames.
fn wal_grew(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    if frames >= RESTART_FRAMES {
        RESTART_DUE.with(|due| due.set(true));
    }
    // Once per CHECKPOINT_FRAMES new frames, not after every commit: with small batches the
    // checkpointer would otherwise wake after each one to copy a few frames.
    let asked = ASKED_AT.with(std::cell::Cell::get);
    if frames < asked {
        // The WAL was started over.
        ASKED_AT.with(|a| a.set(0));
    } else if frames >= asked + CHECKPOINT_FRAMES {
        CHECKPOINTER.with(|c| {
            if let Some(c) = &*c.borrow() {
                // Full: a checkpoint is already pending, it will cover these frames too.
                let _ = c.try_send(());
            }
        });
        ASKED_AT.with(|a| a.set(frames));
    }
    Ok(())
}

/// The checkpointer thread: a passive checkpoint (it never blocks the writer or readers)
/// whenever the writer asks, until the writer stops.
pub(super) fn checkpoint(conn: Connection, requests: Receiver<()>, running: &Mutex<()>) {
    while requests.recv().is_ok() {
        let _running = running.lock();
        passive_checkpoint(&conn);
    }
}

/// Stream positions the writer has read or written, valid while no other connection has
/// committed (SQLite's `data_version` of the writer's connection is unchanged): the writer
/// then needs no read per stream.
#[derive(Default)]
struct Positions {
    version: Option<i64>,
    known: RememberedPositions,
}

/// Most positions kept (forgotten all at once beyond).
const MAX_POSITIONS: usize = 100_000;

impl Positions {
    /// Forgets everything if another connection committed since the last batch.
    fn check(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let version: i64 = conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
        if self.version != Some(version) || self.known.len() > MAX_POSITIONS {
            self.known.clear();
            self.version = Some(version);
        }
        Ok(())
    }

    fn remember(&mut self, pid: &str, position: Position) {
        match self.known.get_mut(pid) {
            Some(known) => *known = position,
            None => {
                self.known.insert(CompactString::from(pid), position);
            }
        }
    }
}

/// One transaction for the whole batch: read the positions, check every write, write the
/// accepted ones, commit.
fn write_batch(conn: &mut Connection, batch: Vec<Op>, positions: &mut Positions) -> Vec<Done> {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let e = backend(e);
            return batch.into_iter().map(|op| op.refuse(e.clone())).collect();
        }
    };
    if let Err(e) = positions.check(&tx) {
        let e = backend(e);
        return batch.into_iter().map(|op| op.refuse(e.clone())).collect();
    }
    // Inside the write transaction, with the positions checked: what a panic must undo.
    #[cfg(test)]
    crate::batch::panic_on_demand(&batch);
    let mut read: Vec<(String, Position)> = Vec::new();
    let planned = {
        let (mut streams, mut states) = match (
            tx.prepare_cached(SELECT_STREAM),
            tx.prepare_cached(SELECT_STATE),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                let e = backend(e);
                return batch.into_iter().map(|op| op.refuse(e.clone())).collect();
            }
        };
        let known = &positions.known;
        plan(
            &batch,
            |pid| {
                if let Some(p) = known.get(pid) {
                    return Ok(*p);
                }
                let p = streams
                    .query_row([pid], position)
                    .optional()
                    .map(Option::unwrap_or_default)?;
                read.push((pid.to_string(), p));
                Ok(p)
            },
            |pid| states.query_row([pid], position).optional(),
        )
    };
    let mut planned = match planned {
        Ok(p) => p,
        Err(e) => {
            let e = backend(e);
            return batch.into_iter().map(|op| op.refuse(e.clone())).collect();
        }
    };
    if let Err(e) = execute(&tx, &planned) {
        let e = backend(e);
        tracing::error!(error = %e, "SQLite batch failed; every write in it is refused");
        planned.fail(&e);
    }
    let mut outcomes = std::mem::take(&mut planned.outcomes);
    if outcomes.iter().any(Result::is_ok) {
        if let Err(e) = tx.commit() {
            let e = backend(e);
            tracing::error!(error = %e, "SQLite batch commit failed; every write in it is refused");
            for outcome in &mut outcomes {
                if outcome.is_ok() {
                    *outcome = Err(e.clone());
                }
            }
            // Whether it reached the disk is unknown: read every position again.
            positions.known.clear();
        } else {
            for (pid, p) in &read {
                positions.remember(pid, *p);
            }
            for (pid, p) in &planned.streams {
                positions.remember(pid, *p);
            }
        }
    } else {
        // Nothing to keep: dropping the transaction rolls it back, and what was read holds.
        for (pid, p) in &read {
            positions.remember(pid, *p);
        }
    }
    drop(planned);
    batch
        .into_iter()
        .zip(outcomes)
        .map(|(op, outcome)| op.complete(outcome))
        .collect()
}

fn position(row: &rusqlite::Row<'_>) -> rusqlite::Result<Position> {
    Ok(Position {
        seq_nr: to_u64(row.get(0)?),
        writer: to_u64(row.get(1)?),
    })
}

/// Writes the rows of `plan`.
fn execute(c: &Connection, plan: &Plan<'_>) -> rusqlite::Result<()> {
    let now = now_millis();
    if !plan.event_deletes.is_empty() {
        let mut delete = c.prepare_cached(DELETE_EVENTS)?;
        for (pid, to) in &plan.event_deletes {
            delete.execute(params![pid, sql_bound(*to)])?;
        }
    }
    if !plan.events.is_empty() {
        let mut insert = c.prepare_cached(INSERT_EVENT)?;
        for e in &plan.events {
            insert.execute(params![
                e.persistence_id,
                to_i64(e.seq_nr),
                to_i64(e.writer),
                e.payload.type_name,
                e.payload.version,
                e.payload.bytes,
                now
            ])?;
        }
    }
    if !plan.streams.is_empty() {
        let mut upsert = c.prepare_cached(UPSERT_STREAM)?;
        for (pid, p) in &plan.streams {
            upsert.execute(params![pid, to_i64(p.seq_nr), to_i64(p.writer)])?;
        }
    }
    for step in &plan.snapshots {
        match step {
            SnapshotStep::Save(s) => c.prepare_cached(SAVE_SNAPSHOT)?.execute(params![
                s.persistence_id,
                to_i64(s.seq_nr),
                s.payload.type_name,
                s.payload.version,
                s.payload.bytes,
                now
            ])?,
            SnapshotStep::DeleteUpTo(pid, to) => c
                .prepare_cached(DELETE_SNAPSHOTS)?
                .execute(params![pid, sql_bound(*to)])?,
        };
    }
    for s in &plan.states {
        match (s.payload, s.existed) {
            (Some(p), _) => {
                c.prepare_cached(WRITE_STATE)?.execute(params![
                    s.persistence_id,
                    to_i64(s.position.seq_nr),
                    to_i64(s.position.writer),
                    p.type_name,
                    p.version,
                    p.bytes,
                    now
                ])?;
            }
            (None, true) => {
                c.prepare_cached(DELETE_STATE)?
                    .execute([s.persistence_id])?;
            }
            (None, false) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::codec::Payload;
    use crate::error::StoreError;
    use crate::record::AppendRequest;
    use crate::sqlite::SqliteStore;
    use crate::store::Journal;

    fn append(expected_seq_nr: u64, writer: u64) -> AppendRequest {
        AppendRequest {
            persistence_id: "cached|1".into(),
            expected_seq_nr,
            writer,
            events: vec![Payload::encode_as("n", 1, &expected_seq_nr).unwrap()],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn known_positions_are_forgotten_when_another_connection_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("positions.db");
        let a = SqliteStore::open(&path).unwrap();
        let b = SqliteStore::open(&path).unwrap();
        assert_eq!(a.append(append(0, 1)).await.unwrap(), 1);
        assert_eq!(
            a.append(append(1, 1)).await.unwrap(),
            2,
            "from a's known position"
        );
        // Another writer (here another store on the file) moves the stream on.
        assert_eq!(b.append(append(2, 2)).await.unwrap(), 3);
        // a must not trust the position it knows (2, writer 1).
        assert!(matches!(
            a.append(append(2, 2)).await,
            Err(StoreError::Conflict {
                expected: 2,
                actual: 3,
                ..
            })
        ));
        assert!(matches!(
            a.append(append(3, 1)).await,
            Err(StoreError::Fenced {
                writer: 1,
                current: 2,
                ..
            })
        ));
        assert_eq!(a.append(append(3, 2)).await.unwrap(), 4);
        assert_eq!(b.highest_seq_nr("cached|1").await.unwrap(), 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_is_started_over_while_writes_keep_coming() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.db");
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        // 200 streams appending one event at a time: the writer commits all the time.
        let mut tasks = tokio::task::JoinSet::new();
        for s in 0..200 {
            let store = store.clone();
            tasks.spawn(async move {
                let payload = Payload::encode_as("n", 1, &s).unwrap();
                for seq in 0..400 {
                    store
                        .append(AppendRequest {
                            persistence_id: format!("wal|{s}"),
                            expected_seq_nr: seq,
                            writer: 1,
                            events: vec![payload.clone()],
                        })
                        .await
                        .unwrap();
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let stats = store.writer_stats();
        assert_eq!(stats.writes, 200 * 400);
        // Started over once RESTART_FRAMES were reached: the file never held much more
        // (plus a few batches' frames while the checkpointer was busy).
        let wal = std::fs::metadata(dir.path().join("wal.db-wal"))
            .unwrap()
            .len();
        let page = 4096 + 24;
        assert!(
            wal < 2 * super::RESTART_FRAMES as u64 * page,
            "WAL of {wal} bytes after {} transactions",
            stats.transactions
        );
    }
}
