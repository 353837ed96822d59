//! The SQLite writer thread: every write goes through it, and whatever is queued when it
//! wakes up is written in one transaction (one fsync) before each caller is answered.

use std::sync::mpsc::{Receiver, TryRecvError};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::schema::{backend, now_millis, to_i64, to_u64};
use crate::batch::{Counters, Done, Op, Reply};
use crate::error::StoreError;
use crate::record::{AppendRequest, StateWrite};
use crate::rules::check_write;

/// Runs until every sender is gone, writing batches of at most `max_batch` operations.
pub(super) fn run(mut conn: Connection, ops: Receiver<Op>, max_batch: usize, counters: &Counters) {
    let mut batch = Vec::with_capacity(max_batch);
    while let Ok(first) = ops.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        counters.batch(batch.len(), "sqlite");
        for done in write_batch(&mut conn, batch.drain(..)) {
            done.send();
        }
    }
}

/// One transaction for the whole batch; each operation inside its own savepoint so that a
/// refused write (a conflict) leaves the others in the batch untouched.
fn write_batch(conn: &mut Connection, batch: impl Iterator<Item = Op>) -> Vec<Done> {
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let e = backend(e);
            return batch.map(|op| op.refuse(e.clone())).collect();
        }
    };
    let mut results = Vec::new();
    for op in batch {
        results.push(match tx.savepoint() {
            Ok(sp) => apply(sp, op),
            Err(e) => op.refuse(backend(e)),
        });
    }
    if let Err(e) = tx.commit() {
        let e = backend(e);
        tracing::error!(error = %e, "SQLite batch commit failed; every write in it is refused");
        for done in &mut results {
            done.fail_if_ok(&e);
        }
    }
    results
}

/// Releases the savepoint on success; dropping it on failure rolls it back.
fn finish(sp: rusqlite::Savepoint<'_>, ok: bool) -> Result<(), StoreError> {
    if ok {
        sp.commit().map_err(backend)
    } else {
        Ok(())
    }
}

/// Applies `op` inside savepoint `sp`.
fn apply(sp: rusqlite::Savepoint<'_>, op: Op) -> Done {
    match op {
        Op::Append(req, tx) => {
            let r = append(&sp, req);
            let r = finish(sp, r.is_ok()).and(r);
            Done::Number(tx, r)
        }
        Op::Upsert(write, tx) => {
            let r = upsert(&sp, write);
            let r = finish(sp, r.is_ok()).and(r);
            Done::Number(tx, r)
        }
        Op::DeleteEvents(pid, to, tx) => unit(sp, tx, |c| {
            c.prepare_cached("DELETE FROM journal WHERE persistence_id = ?1 AND seq_nr <= ?2")?
                .execute(params![pid, to_i64(to)])
                .map(drop)
        }),
        Op::DeleteSnapshots(pid, to, tx) => unit(sp, tx, |c| {
            c.prepare_cached("DELETE FROM snapshots WHERE persistence_id = ?1 AND seq_nr <= ?2")?
                .execute(params![pid, to_i64(to)])
                .map(drop)
        }),
        Op::SaveSnapshot(s, tx) => unit(sp, tx, |c| {
            c.prepare_cached(
                "INSERT OR REPLACE INTO snapshots
                 (persistence_id, seq_nr, type_name, version, payload, written_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                s.persistence_id,
                to_i64(s.seq_nr),
                s.payload.type_name,
                s.payload.version,
                s.payload.bytes,
                now_millis()
            ])
            .map(drop)
        }),
        Op::DeleteState(pid, expected, tx) => {
            let r = delete_state(&sp, &pid, expected);
            let r = finish(sp, r.is_ok()).and(r);
            Done::Unit(tx, r)
        }
    }
}

fn unit(
    sp: rusqlite::Savepoint<'_>,
    tx: Reply<()>,
    body: impl FnOnce(&Connection) -> rusqlite::Result<()>,
) -> Done {
    let r = body(&sp).map_err(backend);
    let r = finish(sp, r.is_ok()).and(r);
    Done::Unit(tx, r)
}

fn append(c: &Connection, req: AppendRequest) -> Result<u64, StoreError> {
    let pid = &req.persistence_id;
    let (highest, writer) = c
        .prepare_cached("SELECT highest_seq_nr, writer FROM journal_meta WHERE persistence_id = ?1")
        .and_then(|mut s| {
            s.query_row([pid], |r| Ok((to_u64(r.get(0)?), to_u64(r.get(1)?))))
                .optional()
        })
        .map_err(backend)?
        .unwrap_or((0, 0));
    check_write(pid, highest, writer, req.expected_seq_nr, req.writer)?;
    let now = now_millis();
    let mut seq = highest;
    {
        let mut insert = c
            .prepare_cached(
                "INSERT INTO journal
                 (persistence_id, seq_nr, writer, type_name, version, payload, written_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .map_err(backend)?;
        for p in &req.events {
            seq += 1;
            insert
                .execute(params![
                    pid,
                    to_i64(seq),
                    to_i64(req.writer),
                    p.type_name,
                    p.version,
                    p.bytes,
                    now
                ])
                .map_err(backend)?;
        }
    }
    c.prepare_cached(
        "INSERT INTO journal_meta (persistence_id, highest_seq_nr, writer) VALUES (?1, ?2, ?3)
         ON CONFLICT (persistence_id) DO UPDATE
         SET highest_seq_nr = excluded.highest_seq_nr, writer = excluded.writer",
    )
    .and_then(|mut s| s.execute(params![pid, to_i64(seq), to_i64(req.writer)]))
    .map_err(backend)?;
    Ok(seq)
}

fn upsert(c: &Connection, w: StateWrite) -> Result<u64, StoreError> {
    let pid = &w.persistence_id;
    let (revision, writer) = c
        .prepare_cached("SELECT revision, writer FROM durable_state WHERE persistence_id = ?1")
        .and_then(|mut s| {
            s.query_row([pid], |r| Ok((to_u64(r.get(0)?), to_u64(r.get(1)?))))
                .optional()
        })
        .map_err(backend)?
        .unwrap_or((0, 0));
    check_write(pid, revision, writer, w.expected_revision, w.writer)?;
    c.prepare_cached(
        "INSERT OR REPLACE INTO durable_state
         (persistence_id, revision, writer, type_name, version, payload, written_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![
            pid,
            to_i64(revision + 1),
            to_i64(w.writer),
            w.payload.type_name,
            w.payload.version,
            w.payload.bytes,
            now_millis()
        ])
    })
    .map_err(backend)?;
    Ok(revision + 1)
}

fn delete_state(c: &Connection, pid: &str, expected: u64) -> Result<(), StoreError> {
    let revision = c
        .prepare_cached("SELECT revision FROM durable_state WHERE persistence_id = ?1")
        .and_then(|mut s| s.query_row([pid], |r| r.get::<_, i64>(0)).optional())
        .map_err(backend)?
        .map_or(0, to_u64);
    if revision != expected {
        return Err(StoreError::Conflict {
            persistence_id: pid.to_string(),
            expected,
            actual: revision,
        });
    }
    c.prepare_cached("DELETE FROM durable_state WHERE persistence_id = ?1")
        .and_then(|mut s| s.execute([pid]))
        .map_err(backend)?;
    Ok(())
}
