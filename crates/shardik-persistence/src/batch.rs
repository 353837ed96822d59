//! The write queue shared by the batching backends: queued operations, their reply slots
//! and the writer's counters.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use crate::error::StoreError;
use crate::record::{AppendRequest, SnapshotRecord, StateWrite};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

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
        match self {
            Op::Append(_, tx) | Op::Upsert(_, tx) => Done::Number(tx, Err(error)),
            Op::DeleteEvents(_, _, tx)
            | Op::SaveSnapshot(_, tx)
            | Op::DeleteSnapshots(_, _, tx)
            | Op::DeleteState(_, _, tx) => Done::Unit(tx, Err(error)),
        }
    }
}

/// An operation's outcome, held until its batch's transaction has committed.
pub(crate) enum Done {
    Number(Reply<u64>, Result<u64, StoreError>),
    Unit(Reply<()>, Result<(), StoreError>),
}

impl Done {
    pub(crate) fn is_ok(&self) -> bool {
        matches!(self, Done::Number(_, Ok(_)) | Done::Unit(_, Ok(_)))
    }

    /// Replaces a success with `error` (the batch did not commit).
    pub(crate) fn fail_if_ok(&mut self, error: &StoreError) {
        match self {
            Done::Number(_, r @ Ok(_)) => *r = Err(error.clone()),
            Done::Unit(_, r @ Ok(_)) => *r = Err(error.clone()),
            _ => {}
        }
    }

    /// Answers the caller (who may have stopped waiting).
    pub(crate) fn send(self) {
        match self {
            Done::Number(tx, r) => drop(tx.send(r)),
            Done::Unit(tx, r) => drop(tx.send(r)),
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
}

#[derive(Default)]
pub(crate) struct Counters {
    writes: AtomicU64,
    transactions: AtomicU64,
}

impl Counters {
    /// Counts one transaction of `writes` writes, before its callers are answered.
    pub(crate) fn batch(&self, writes: usize, backend: &'static str) {
        metrics::histogram!("shardik_persistence_batch_size", "backend" => backend)
            .record(writes as f64);
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            writes: self.writes.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
        }
    }
}
