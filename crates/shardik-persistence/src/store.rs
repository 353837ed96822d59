//! The storage traits: [`Journal`], [`SnapshotStore`] and [`StateStore`].
//!
//! They are object safe (`Arc<dyn Journal>`) and return boxed futures, so entities do not
//! carry the backend in their type.

use std::future::Future;
use std::pin::Pin;

use crate::error::StoreError;
use crate::record::{AppendRequest, PersistedEvent, SnapshotRecord, StateRecord, StateWrite};

/// The future a store operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// An append-only log of events per persistence id, with optimistic concurrency.
pub trait Journal: Send + Sync + 'static {
    /// Appends `request.events` atomically after `request.expected_seq_nr` and returns the
    /// new highest sequence number.
    ///
    /// Fails with [`StoreError::Fenced`] if a newer incarnation has written the stream, and
    /// with [`StoreError::Conflict`] if the stream's highest sequence number is not
    /// `expected_seq_nr`; in both cases nothing is written. An empty append checks and
    /// writes no event; whether it records a newer writer (fencing older ones from then on)
    /// depends on the backend: SQLite and the in-memory store do, PostgreSQL does not (it
    /// keeps no position apart from the stream's rows). Fencing that must hold on every
    /// backend comes with the writer's first event.
    fn append(&self, request: AppendRequest) -> StoreFuture<'_, u64>;

    /// Up to `max` events of the stream with `seq_nr >= from_seq_nr`, in order.
    fn read<'a>(
        &'a self,
        persistence_id: &'a str,
        from_seq_nr: u64,
        max: usize,
    ) -> StoreFuture<'a, Vec<PersistedEvent>>;

    /// The highest sequence number ever written to the stream (0 if none); deleting events
    /// does not lower it.
    fn highest_seq_nr<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, u64>;

    /// Deletes the stream's events with `seq_nr <= to_seq_nr`.
    fn delete_up_to<'a>(&'a self, persistence_id: &'a str, to_seq_nr: u64) -> StoreFuture<'a, ()>;
}

/// Snapshots of entity state, several per persistence id.
pub trait SnapshotStore: Send + Sync + 'static {
    /// Stores a snapshot (replacing one with the same sequence number).
    fn save(&self, snapshot: SnapshotRecord) -> StoreFuture<'_, ()>;

    /// The snapshot with the highest sequence number, if any.
    fn load_latest<'a>(
        &'a self,
        persistence_id: &'a str,
    ) -> StoreFuture<'a, Option<SnapshotRecord>> {
        self.load_at_most(persistence_id, u64::MAX)
    }

    /// The snapshot with the highest sequence number not above `max_seq_nr`, if any.
    fn load_at_most<'a>(
        &'a self,
        persistence_id: &'a str,
        max_seq_nr: u64,
    ) -> StoreFuture<'a, Option<SnapshotRecord>>;

    /// Deletes the snapshots with `seq_nr <= to_seq_nr`.
    fn delete_snapshots_up_to<'a>(
        &'a self,
        persistence_id: &'a str,
        to_seq_nr: u64,
    ) -> StoreFuture<'a, ()>;
}

/// The latest state per persistence id, with a revision check.
pub trait StateStore: Send + Sync + 'static {
    /// Replaces the state if its revision is `write.expected_revision` and returns the new
    /// revision; fails with [`StoreError::Conflict`] or [`StoreError::Fenced`] otherwise.
    fn upsert(&self, write: StateWrite) -> StoreFuture<'_, u64>;

    /// The stored state, if any.
    fn get<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, Option<StateRecord>>;

    /// Deletes the state if its revision is `expected_revision` (else a
    /// [`StoreError::Conflict`]). The next write then starts again from revision 0.
    fn delete<'a>(&'a self, persistence_id: &'a str, expected_revision: u64)
        -> StoreFuture<'a, ()>;
}
