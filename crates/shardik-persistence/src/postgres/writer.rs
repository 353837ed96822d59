//! The PostgreSQL writer task: whatever is queued is written in one transaction (each write
//! in its own savepoint), committed once, then every caller is answered.

use deadpool_postgres::{Pool, Transaction};
use tokio::sync::mpsc::UnboundedReceiver;

use super::sql::Sql;
use super::{backend, to_i64, to_u64};
use crate::batch::{Counters, Done, Op};
use crate::error::StoreError;
use crate::record::{AppendRequest, SnapshotRecord, StateWrite};
use crate::rules::check_write;

/// Runs until every sender is gone.
pub(super) async fn run(
    pool: Pool,
    sql: std::sync::Arc<Sql>,
    mut ops: UnboundedReceiver<Op>,
    max_batch: usize,
    counters: std::sync::Arc<Counters>,
) {
    let mut batch = Vec::with_capacity(max_batch);
    while let Some(first) = ops.recv().await {
        batch.push(first);
        while batch.len() < max_batch {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        // Row locks are taken in persistence-id order, so two nodes' batches cannot
        // deadlock; the sort is stable, so one id's writes keep their order.
        batch.sort_by(|a, b| a.persistence_id().cmp(b.persistence_id()));
        let results = write_batch(&pool, &sql, std::mem::take(&mut batch)).await;
        counters.batch(results.len(), "postgres");
        for done in results {
            done.send();
        }
    }
}

async fn write_batch(pool: &Pool, sql: &Sql, batch: Vec<Op>) -> Vec<Done> {
    let mut client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            let e = StoreError::Backend(format!("postgres pool: {e}"));
            return batch.into_iter().map(|op| op.refuse(e.clone())).collect();
        }
    };
    let mut tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => {
            let e = backend(e);
            return batch.into_iter().map(|op| op.refuse(e.clone())).collect();
        }
    };
    let mut results = Vec::with_capacity(batch.len());
    for op in batch {
        let sp = match tx.savepoint("op").await {
            Ok(sp) => sp,
            Err(e) => {
                results.push(op.refuse(backend(e)));
                continue;
            }
        };
        let mut done = apply(&sp, sql, op).await;
        if done.is_ok() {
            if let Err(e) = sp.commit().await {
                done.fail_if_ok(&backend(e));
            }
        } else if let Err(e) = sp.rollback().await {
            tracing::error!(error = %e, "PostgreSQL savepoint rollback failed");
        }
        results.push(done);
    }
    if let Err(e) = tx.commit().await {
        let e = backend(e);
        tracing::error!(error = %e, "PostgreSQL batch commit failed; every write in it is refused");
        for done in &mut results {
            done.fail_if_ok(&e);
        }
    }
    results
}

async fn apply(tx: &Transaction<'_>, sql: &Sql, op: Op) -> Done {
    match op {
        Op::Append(req, reply) => Done::Number(reply, append(tx, sql, req).await),
        Op::Upsert(write, reply) => Done::Number(reply, upsert(tx, sql, write).await),
        Op::DeleteEvents(pid, to, reply) => {
            let r = tx.execute(&sql.delete_events, &[&pid, &to_i64(to)]).await;
            Done::Unit(reply, r.map(drop).map_err(backend))
        }
        Op::DeleteSnapshots(pid, to, reply) => {
            let r = tx
                .execute(&sql.delete_snapshots, &[&pid, &to_i64(to)])
                .await;
            Done::Unit(reply, r.map(drop).map_err(backend))
        }
        Op::SaveSnapshot(s, reply) => Done::Unit(reply, save_snapshot(tx, sql, s).await),
        Op::DeleteState(pid, expected, reply) => {
            Done::Unit(reply, delete_state(tx, sql, &pid, expected).await)
        }
    }
}

async fn append(tx: &Transaction<'_>, sql: &Sql, req: AppendRequest) -> Result<u64, StoreError> {
    let pid = &req.persistence_id;
    let ensure = tx.prepare_cached(&sql.meta_ensure).await.map_err(backend)?;
    tx.execute(&ensure, &[pid]).await.map_err(backend)?;
    let lock = tx.prepare_cached(&sql.meta_lock).await.map_err(backend)?;
    let row = tx.query_one(&lock, &[pid]).await.map_err(backend)?;
    let (highest, writer) = (to_u64(row.get(0)), to_u64(row.get(1)));
    check_write(pid, highest, writer, req.expected_seq_nr, req.writer)?;
    let n = req.events.len() as u64;
    if n > 0 {
        let seqs: Vec<i64> = (highest + 1..=highest + n).map(to_i64).collect();
        let types: Vec<&str> = req.events.iter().map(|p| p.type_name.as_str()).collect();
        let versions: Vec<i64> = req.events.iter().map(|p| i64::from(p.version)).collect();
        let payloads: Vec<&[u8]> = req.events.iter().map(|p| p.bytes.as_slice()).collect();
        let insert = tx
            .prepare_cached(&sql.insert_events)
            .await
            .map_err(backend)?;
        tx.execute(
            &insert,
            &[
                pid,
                &to_i64(req.writer),
                &seqs,
                &types,
                &versions,
                &payloads,
            ],
        )
        .await
        .map_err(backend)?;
    }
    let update = tx.prepare_cached(&sql.meta_update).await.map_err(backend)?;
    tx.execute(&update, &[pid, &to_i64(highest + n), &to_i64(req.writer)])
        .await
        .map_err(backend)?;
    Ok(highest + n)
}

async fn save_snapshot(
    tx: &Transaction<'_>,
    sql: &Sql,
    s: SnapshotRecord,
) -> Result<(), StoreError> {
    let stmt = tx
        .prepare_cached(&sql.save_snapshot)
        .await
        .map_err(backend)?;
    tx.execute(
        &stmt,
        &[
            &s.persistence_id,
            &to_i64(s.seq_nr),
            &s.payload.type_name,
            &i64::from(s.payload.version),
            &s.payload.bytes,
        ],
    )
    .await
    .map(drop)
    .map_err(backend)
}

async fn upsert(tx: &Transaction<'_>, sql: &Sql, w: StateWrite) -> Result<u64, StoreError> {
    let pid = &w.persistence_id;
    let version = i64::from(w.payload.version);
    if w.expected_revision == 0 {
        let insert = tx
            .prepare_cached(&sql.state_insert)
            .await
            .map_err(backend)?;
        let inserted = tx
            .execute(
                &insert,
                &[
                    pid,
                    &to_i64(w.writer),
                    &w.payload.type_name,
                    &version,
                    &w.payload.bytes,
                ],
            )
            .await
            .map_err(backend)?;
        if inserted == 1 {
            return Ok(1);
        }
    }
    let lock = tx.prepare_cached(&sql.state_lock).await.map_err(backend)?;
    let (revision, writer) = match tx.query_opt(&lock, &[pid]).await.map_err(backend)? {
        Some(row) => (to_u64(row.get(0)), to_u64(row.get(1))),
        None => (0, 0),
    };
    check_write(pid, revision, writer, w.expected_revision, w.writer)?;
    let update = tx
        .prepare_cached(&sql.state_update)
        .await
        .map_err(backend)?;
    tx.execute(
        &update,
        &[
            pid,
            &to_i64(revision + 1),
            &to_i64(w.writer),
            &w.payload.type_name,
            &version,
            &w.payload.bytes,
        ],
    )
    .await
    .map_err(backend)?;
    Ok(revision + 1)
}

async fn delete_state(
    tx: &Transaction<'_>,
    sql: &Sql,
    pid: &str,
    expected: u64,
) -> Result<(), StoreError> {
    let delete = tx
        .prepare_cached(&sql.state_delete)
        .await
        .map_err(backend)?;
    if tx
        .execute(&delete, &[&pid, &to_i64(expected)])
        .await
        .map_err(backend)?
        == 1
    {
        return Ok(());
    }
    let read = tx
        .prepare_cached(&sql.state_revision)
        .await
        .map_err(backend)?;
    let actual = tx
        .query_opt(&read, &[&pid])
        .await
        .map_err(backend)?
        .map_or(0, |r| to_u64(r.get(0)));
    Err(StoreError::Conflict {
        persistence_id: pid.to_string(),
        expected,
        actual,
    })
}
