//! The cluster sharding replica of a node in the `sharding_state` table: one statement per
//! write on a connection of the reads' pool, not through a writer lane (these writes are rare
//! and must not queue behind event batches); the newer-wins rule is part of the statement,
//! so concurrent writers of one key cannot step back.

use shardik_sharding::cluster::{
    RecordKey, ShardingRecord, ShardingStateStore, StateStoreError, StateStoreFuture,
};

use super::{to_i64, to_u64, PostgresStore};

fn failed(e: crate::error::StoreError) -> StateStoreError {
    StateStoreError(match e {
        crate::error::StoreError::Backend(text) => text,
        other => other.to_string(),
    })
}

impl ShardingStateStore for PostgresStore {
    fn save_record<'a>(
        &'a self,
        node: &'a str,
        record: &'a ShardingRecord,
    ) -> StateStoreFuture<'a, bool> {
        Box::pin(async move {
            // The statement returns a row if it inserted or replaced the record.
            let changed = self
                .query(
                    &self.sql.sharding_save,
                    &[
                        &node,
                        &record.key.type_name(),
                        &record.key.shard_column(),
                        &to_i64(record.rank.0),
                        &to_i64(record.rank.1),
                        &record.bytes,
                    ],
                )
                .await
                .map_err(failed)?;
            Ok(!changed.is_empty())
        })
    }

    fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>> {
        Box::pin(async move {
            let rows = self
                .query(&self.sql.sharding_load, &[&node])
                .await
                .map_err(failed)?;
            rows.iter()
                .map(|r| {
                    let shard: i64 = r.get(1);
                    let key = RecordKey::from_columns(r.get(0), shard).ok_or_else(|| {
                        StateStoreError(format!("sharding_state row with shard {shard}"))
                    })?;
                    Ok(ShardingRecord {
                        key,
                        rank: (to_u64(r.get(2)), to_u64(r.get(3))),
                        bytes: r.get(4),
                    })
                })
                .collect()
        })
    }
}
