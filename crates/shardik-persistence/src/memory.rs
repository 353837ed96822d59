//! [`InMemoryStore`]: all three stores in one process's memory, for tests and examples.

use std::collections::{BTreeMap, HashMap};
use std::future::ready;

use parking_lot::Mutex;
use shardik_sharding::cluster::{
    replaces, RecordKey, ShardingRecord, ShardingStateStore, StateStoreFuture,
};

use crate::error::StoreError;
use crate::record::{
    AppendRequest, Incarnation, PersistedEvent, SnapshotRecord, StateRecord, StateWrite,
};
use crate::rules::check_write;
use crate::store::{Journal, SnapshotStore, StateStore, StoreFuture};

#[derive(Default)]
struct Stream {
    highest: u64,
    writer: Incarnation,
    events: BTreeMap<u64, PersistedEvent>,
}

#[derive(Default)]
struct Inner {
    streams: HashMap<String, Stream>,
    snapshots: HashMap<String, BTreeMap<u64, SnapshotRecord>>,
    states: HashMap<String, (StateRecord, Incarnation)>,
    sharding: HashMap<(String, RecordKey), ShardingRecord>,
}

/// A [`Journal`], [`SnapshotStore`], [`StateStore`] and [`ShardingStateStore`] in memory,
/// with the same checks as the durable backends. Nothing survives the process; share one
/// `Arc` to share the data (a test's "full restart" keeps the `Arc`).
#[derive(Default)]
pub struct InMemoryStore {
    inner: Mutex<Inner>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("InMemoryStore")
            .field("streams", &inner.streams.len())
            .field("states", &inner.states.len())
            .finish()
    }
}

impl Journal for InMemoryStore {
    fn append(&self, request: AppendRequest) -> StoreFuture<'_, u64> {
        let mut inner = self.inner.lock();
        let stream = inner
            .streams
            .entry(request.persistence_id.clone())
            .or_default();
        let result = check_write(
            &request.persistence_id,
            stream.highest,
            stream.writer,
            request.expected_seq_nr,
            request.writer,
        )
        .map(|()| {
            stream.writer = request.writer;
            for payload in request.events {
                stream.highest += 1;
                let event = PersistedEvent {
                    persistence_id: request.persistence_id.clone(),
                    seq_nr: stream.highest,
                    writer: request.writer,
                    payload,
                };
                stream.events.insert(stream.highest, event);
            }
            stream.highest
        });
        Box::pin(ready(result))
    }

    fn read<'a>(
        &'a self,
        persistence_id: &'a str,
        from_seq_nr: u64,
        max: usize,
    ) -> StoreFuture<'a, Vec<PersistedEvent>> {
        let inner = self.inner.lock();
        let events = inner
            .streams
            .get(persistence_id)
            .map_or_else(Vec::new, |s| {
                s.events
                    .range(from_seq_nr..)
                    .take(max)
                    .map(|(_, e)| e.clone())
                    .collect()
            });
        Box::pin(ready(Ok(events)))
    }

    fn highest_seq_nr<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, u64> {
        let highest = self
            .inner
            .lock()
            .streams
            .get(persistence_id)
            .map_or(0, |s| s.highest);
        Box::pin(ready(Ok(highest)))
    }

    fn delete_up_to<'a>(&'a self, persistence_id: &'a str, to_seq_nr: u64) -> StoreFuture<'a, ()> {
        if let Some(s) = self.inner.lock().streams.get_mut(persistence_id) {
            s.events = s.events.split_off(&to_seq_nr.saturating_add(1));
        }
        Box::pin(ready(Ok(())))
    }
}

impl SnapshotStore for InMemoryStore {
    fn save(&self, snapshot: SnapshotRecord) -> StoreFuture<'_, ()> {
        self.inner
            .lock()
            .snapshots
            .entry(snapshot.persistence_id.clone())
            .or_default()
            .insert(snapshot.seq_nr, snapshot);
        Box::pin(ready(Ok(())))
    }

    fn load_at_most<'a>(
        &'a self,
        persistence_id: &'a str,
        max_seq_nr: u64,
    ) -> StoreFuture<'a, Option<SnapshotRecord>> {
        let latest = self
            .inner
            .lock()
            .snapshots
            .get(persistence_id)
            .and_then(|m| m.range(..=max_seq_nr).next_back().map(|(_, s)| s.clone()));
        Box::pin(ready(Ok(latest)))
    }

    fn delete_snapshots_up_to<'a>(
        &'a self,
        persistence_id: &'a str,
        to_seq_nr: u64,
    ) -> StoreFuture<'a, ()> {
        if let Some(m) = self.inner.lock().snapshots.get_mut(persistence_id) {
            *m = m.split_off(&to_seq_nr.saturating_add(1));
        }
        Box::pin(ready(Ok(())))
    }
}

impl StateStore for InMemoryStore {
    fn upsert(&self, write: StateWrite) -> StoreFuture<'_, u64> {
        let mut inner = self.inner.lock();
        let (revision, writer) = inner
            .states
            .get(&write.persistence_id)
            .map_or((0, 0), |(r, w)| (r.revision, *w));
        let result = check_write(
            &write.persistence_id,
            revision,
            writer,
            write.expected_revision,
            write.writer,
        )
        .map(|()| {
            let record = StateRecord {
                persistence_id: write.persistence_id.clone(),
                revision: revision + 1,
                payload: write.payload,
            };
            inner
                .states
                .insert(write.persistence_id, (record, write.writer));
            revision + 1
        });
        Box::pin(ready(result))
    }

    fn get<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, Option<StateRecord>> {
        let record = self
            .inner
            .lock()
            .states
            .get(persistence_id)
            .map(|(r, _)| r.clone());
        Box::pin(ready(Ok(record)))
    }

    fn delete<'a>(
        &'a self,
        persistence_id: &'a str,
        expected_revision: u64,
    ) -> StoreFuture<'a, ()> {
        let mut inner = self.inner.lock();
        let revision = inner
            .states
            .get(persistence_id)
            .map_or(0, |(r, _)| r.revision);
        let result = if revision == expected_revision {
            inner.states.remove(persistence_id);
            Ok(())
        } else {
            Err(StoreError::Conflict {
                persistence_id: persistence_id.to_string(),
                expected: expected_revision,
                actual: revision,
            })
        };
        Box::pin(ready(result))
    }
}

impl ShardingStateStore for InMemoryStore {
    fn save_record<'a>(
        &'a self,
        node: &'a str,
        record: &'a ShardingRecord,
    ) -> StateStoreFuture<'a, bool> {
        let mut inner = self.inner.lock();
        let key = (node.to_string(), record.key.clone());
        let stored = match inner.sharding.get(&key) {
            Some(cur) if !replaces(record.rank, cur.rank) => false,
            _ => {
                inner.sharding.insert(key, record.clone());
                true
            }
        };
        Box::pin(ready(Ok(stored)))
    }

    fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>> {
        let records = self
            .inner
            .lock()
            .sharding
            .iter()
            .filter(|((n, _), _)| n == node)
            .map(|(_, r)| r.clone())
            .collect();
        Box::pin(ready(Ok(records)))
    }
}
