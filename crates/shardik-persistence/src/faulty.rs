//! [`FaultyStore`]: a store wrapper that fails on demand, for testing failure handling.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use shardik_sharding::cluster::{
    ShardingRecord, ShardingStateStore, StateStoreError, StateStoreFuture,
};

use crate::error::StoreError;
use crate::record::{AppendRequest, PersistedEvent, SnapshotRecord, StateRecord, StateWrite};
use crate::store::{Journal, SnapshotStore, StateStore, StoreFuture};

/// Wraps a store and refuses writes (and, if asked, reads) while a switch is on, with
/// [`StoreError::Backend`]. Refused operations do not reach the inner store.
///
/// ```
/// # use std::sync::Arc;
/// use shardik_persistence::{FaultyStore, InMemoryStore};
/// let store = Arc::new(FaultyStore::new(Arc::new(InMemoryStore::new())));
/// store.fail_writes(true); // every append, snapshot and state write now fails
/// # assert_eq!(store.refused(), 0);
/// ```
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: Arc<S>,
    fail_writes: AtomicBool,
    fail_reads: AtomicBool,
    refused: AtomicU64,
}

impl<S> FaultyStore<S> {
    /// Wraps `inner`; nothing fails until switched on.
    pub fn new(inner: Arc<S>) -> Self {
        FaultyStore {
            inner,
            fail_writes: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
            refused: AtomicU64::new(0),
        }
    }

    /// Makes every write fail (`true`) or pass (`false`).
    pub fn fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::SeqCst);
    }

    /// Makes every read fail (`true`) or pass (`false`).
    pub fn fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }

    /// How many operations were refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    fn gate(&self, switch: &AtomicBool, what: &str) -> Result<(), StoreError> {
        if switch.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Backend(format!("injected {what} failure")))
        } else {
            Ok(())
        }
    }

    fn gated_write<'a, T: Send + 'a>(
        &'a self,
        op: impl FnOnce() -> StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        match self.gate(&self.fail_writes, "write") {
            Ok(()) => op(),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    fn gated_read<'a, T: Send + 'a>(
        &'a self,
        op: impl FnOnce() -> StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        match self.gate(&self.fail_reads, "read") {
            Ok(()) => op(),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }
}

impl<S: Journal> Journal for FaultyStore<S> {
    fn append(&self, request: AppendRequest) -> StoreFuture<'_, u64> {
        self.gated_write(|| self.inner.append(request))
    }

    fn read<'a>(
        &'a self,
        persistence_id: &'a str,
        from_seq_nr: u64,
        max: usize,
    ) -> StoreFuture<'a, Vec<PersistedEvent>> {
        self.gated_read(|| self.inner.read(persistence_id, from_seq_nr, max))
    }

    fn highest_seq_nr<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, u64> {
        self.gated_read(|| self.inner.highest_seq_nr(persistence_id))
    }

    fn delete_up_to<'a>(&'a self, persistence_id: &'a str, to_seq_nr: u64) -> StoreFuture<'a, ()> {
        self.gated_write(|| self.inner.delete_up_to(persistence_id, to_seq_nr))
    }
}

impl<S: SnapshotStore> SnapshotStore for FaultyStore<S> {
    fn save(&self, snapshot: SnapshotRecord) -> StoreFuture<'_, ()> {
        self.gated_write(|| self.inner.save(snapshot))
    }

    fn load_at_most<'a>(
        &'a self,
        persistence_id: &'a str,
        max_seq_nr: u64,
    ) -> StoreFuture<'a, Option<SnapshotRecord>> {
        self.gated_read(|| self.inner.load_at_most(persistence_id, max_seq_nr))
    }

    fn delete_snapshots_up_to<'a>(
        &'a self,
        persistence_id: &'a str,
        to_seq_nr: u64,
    ) -> StoreFuture<'a, ()> {
        self.gated_write(|| self.inner.delete_snapshots_up_to(persistence_id, to_seq_nr))
    }
}

impl<S: StateStore> StateStore for FaultyStore<S> {
    fn upsert(&self, write: StateWrite) -> StoreFuture<'_, u64> {
        self.gated_write(|| self.inner.upsert(write))
    }

    fn get<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, Option<StateRecord>> {
        self.gated_read(|| self.inner.get(persistence_id))
    }

    fn delete<'a>(
        &'a self,
        persistence_id: &'a str,
        expected_revision: u64,
    ) -> StoreFuture<'a, ()> {
        self.gated_write(|| self.inner.delete(persistence_id, expected_revision))
    }
}

/// Writes are refused while [`fail_writes`](FaultyStore::fail_writes) is on, loads while
/// [`fail_reads`](FaultyStore::fail_reads) is.
impl<S: ShardingStateStore> ShardingStateStore for FaultyStore<S> {
    fn save_record<'a>(
        &'a self,
        node: &'a str,
        record: &'a ShardingRecord,
    ) -> StateStoreFuture<'a, bool> {
        match self.gate(&self.fail_writes, "write") {
            Ok(()) => self.inner.save_record(node, record),
            Err(e) => Box::pin(std::future::ready(Err(StateStoreError(e.to_string())))),
        }
    }

    fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>> {
        match self.gate(&self.fail_reads, "read") {
            Ok(()) => self.inner.load_records(node),
            Err(e) => Box::pin(std::future::ready(Err(StateStoreError(e.to_string())))),
        }
    }
}
