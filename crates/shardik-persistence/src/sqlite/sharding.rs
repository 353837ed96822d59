//! The cluster sharding replica of a node in the `sharding_state` table.
//!
//! These writes are rare (a coordinator state per allocation change, an entity set per new
//! remembered entity, coalesced per shard) and must not wait behind a batch of events, so
//! each is one statement on a connection of the read pool, committed on its own; SQLite's
//! file lock serializes it with the writer thread's batches (the busy timeout waits for it).

use rusqlite::params;
use shardik_sharding::cluster::{
    RecordKey, ShardingRecord, ShardingStateStore, StateStoreError, StateStoreFuture,
};

use super::schema::{now_millis, to_i64, to_u64};
use super::SqliteStore;

/// Replaces the stored record only with an equal or higher rank (no change otherwise).
const SAVE: &str = "INSERT INTO sharding_state
    (node_id, type_name, shard, rank_major, rank_minor, payload, written_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (node_id, type_name, shard) DO UPDATE
    SET rank_major = excluded.rank_major, rank_minor = excluded.rank_minor,
        payload = excluded.payload, written_at = excluded.written_at
    WHERE (excluded.rank_major, excluded.rank_minor)
        >= (sharding_state.rank_major, sharding_state.rank_minor)";
const LOAD: &str = "SELECT type_name, shard, rank_major, rank_minor, payload FROM sharding_state
    WHERE node_id = ?1";

fn failed(e: crate::error::StoreError) -> StateStoreError {
    StateStoreError(e.to_string())
}

impl ShardingStateStore for SqliteStore {
    fn save_record<'a>(
        &'a self,
        node: &'a str,
        record: &'a ShardingRecord,
    ) -> StateStoreFuture<'a, bool> {
        let node = node.to_string();
        let record = record.clone();
        Box::pin(async move {
            self.read(move |c| {
                c.prepare_cached(SAVE)?
                    .execute(params![
                        node,
                        record.key.type_name(),
                        record.key.shard_column(),
                        to_i64(record.rank.0),
                        to_i64(record.rank.1),
                        record.bytes,
                        now_millis()
                    ])
                    .map(|changed| changed > 0)
            })
            .await
            .map_err(failed)
        })
    }

    fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>> {
        let node = node.to_string();
        Box::pin(async move {
            let rows = self
                .read(move |c| {
                    let mut s = c.prepare_cached(LOAD)?;
                    let rows = s.query_map([node], |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            (to_u64(r.get(2)?), to_u64(r.get(3)?)),
                            r.get::<_, Vec<u8>>(4)?,
                        ))
                    })?;
                    rows.collect::<rusqlite::Result<Vec<_>>>()
                })
                .await
                .map_err(failed)?;
            rows.into_iter()
                .map(|(type_name, shard, rank, bytes)| {
                    let key = RecordKey::from_columns(type_name, shard).ok_or_else(|| {
                        StateStoreError(format!("sharding_state row with shard {shard}"))
                    })?;
                    Ok(ShardingRecord { key, rank, bytes })
                })
                .collect()
        })
    }
}
