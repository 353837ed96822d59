//! [`ShardingStateStore`]: where a node keeps its replica of the cluster sharding state (the
//! coordinator state of every entity type and the remembered entities of every shard), so
//! that a full cluster restart finds them again.
//!
//! The sharding layer encodes the values itself (named-field MessagePack) and hands a store
//! opaque [`ShardingRecord`]s: a key, a rank and the bytes. A store keeps, per node and key,
//! the record with the highest rank (a record with an equal rank replaces the stored one, so
//! a retried write succeeds). Implementations for the in-memory, SQLite and PostgreSQL
//! backends are in `shardik-persistence`.

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::hash::ShardId;

/// The future a [`ShardingStateStore`] operation returns.
pub type StateStoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, StateStoreError>> + Send + 'a>>;

/// Why a [`ShardingStateStore`] operation failed (the backend's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sharding state store failed: {0}")]
pub struct StateStoreError(pub String);

/// What a [`ShardingRecord`] holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKey {
    /// The coordinator state of an entity type; ranked by (epoch, version).
    Coordinator {
        /// The entity type's name.
        type_name: String,
    },
    /// The highest epoch this node's replica promised to a coordinator taking over the
    /// entity type; ranked by (epoch, 0).
    Promise {
        /// The entity type's name.
        type_name: String,
    },
    /// The remembered entity ids of one shard of an entity type; ranked by the set's stamp
    /// (owner generation, write number).
    Entities {
        /// The entity type's name.
        type_name: String,
        /// The shard.
        shard: ShardId,
    },
}

impl RecordKey {
    /// The entity type the record belongs to.
    pub fn type_name(&self) -> &str {
        match self {
            RecordKey::Coordinator { type_name }
            | RecordKey::Promise { type_name }
            | RecordKey::Entities { type_name, .. } => type_name,
        }
    }

    /// The key as one integer column next to the type name, for SQL tables: `-1` for the
    /// coordinator state, `-2` for the promise, the shard number for a shard's entities.
    pub fn shard_column(&self) -> i64 {
        match self {
            RecordKey::Coordinator { .. } => -1,
            RecordKey::Promise { .. } => -2,
            RecordKey::Entities { shard, .. } => i64::from(*shard),
        }
    }

    /// The key back from its [`type_name`](Self::type_name) and
    /// [`shard_column`](Self::shard_column); `None` for a column value no key produces.
    pub fn from_columns(type_name: String, shard: i64) -> Option<RecordKey> {
        match shard {
            -1 => return Some(RecordKey::Coordinator { type_name }),
            -2 => return Some(RecordKey::Promise { type_name }),
            _ => {}
        }
        let shard = ShardId::try_from(shard).ok()?;
        Some(RecordKey::Entities { type_name, shard })
    }
}

/// One stored value of a node's sharding replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingRecord {
    /// What it is.
    pub key: RecordKey,
    /// Its rank: a store keeps the record with the highest rank per node and key, compared
    /// as a pair (first element first). Both stay far below `i64::MAX`, so SQL backends may
    /// store them as signed 64-bit integers.
    pub rank: (u64, u64),
    /// The value, named-field MessagePack written and read by the sharding layer.
    pub bytes: Vec<u8>,
}

/// Durable storage of a node's sharding replica: the coordinator state of every entity
/// type and the remembered entities of every shard, so that a full cluster restart finds
/// them again.
///
/// The sharding layer encodes the values itself (named-field MessagePack) and hands the store
/// opaque [`ShardingRecord`]s: a key, a rank and the bytes. A store keeps, per node and key,
/// the record with the highest rank ([`replaces`]: an equal rank replaces the stored record,
/// so a retried write succeeds), atomically with respect to concurrent saves of that key.
///
/// Records are keyed by the node's **node id** (`ClusterConfig`'s human-readable id, stable
/// across restarts; the incarnation is not), so several nodes can share one database (one
/// PostgreSQL schema) while each sees only its own records, or each node has its own file.
/// Only one process per node id may use a store at a time.
///
/// Set it per node with
/// [`ClusterSharding::with_state_store`](super::ClusterSharding::with_state_store).
pub trait ShardingStateStore: Send + Sync + 'static {
    /// Stores `record` for `node` unless the stored record of the same key has a higher
    /// rank. Returns `Ok(true)` if `record` is stored now (durably, when the future
    /// completes), `Ok(false)` if a higher-ranked record was kept.
    fn save_record<'a>(
        &'a self,
        node: &'a str,
        record: &'a ShardingRecord,
    ) -> StateStoreFuture<'a, bool>;

    /// Every record stored for `node`, in any order.
    fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>>;
}

/// Whether a record of rank `new` replaces a stored record of rank `stored` (the rule every
/// [`ShardingStateStore`] applies): equal or higher.
pub fn replaces(new: (u64, u64), stored: (u64, u64)) -> bool {
    new >= stored
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StateStoreError> {
    rmp_serde::to_vec_named(value).map_err(|e| StateStoreError(format!("cannot encode: {e}")))
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StateStoreError> {
    rmp_serde::from_slice(bytes).map_err(|e| StateStoreError(format!("cannot decode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_their_columns() {
        for key in [
            RecordKey::Coordinator {
                type_name: "t".into(),
            },
            RecordKey::Promise {
                type_name: "t".into(),
            },
            RecordKey::Entities {
                type_name: "t".into(),
                shard: 0,
            },
            RecordKey::Entities {
                type_name: "t".into(),
                shard: u32::MAX,
            },
        ] {
            let back = RecordKey::from_columns(key.type_name().to_string(), key.shard_column());
            assert_eq!(back, Some(key));
        }
        assert_eq!(RecordKey::from_columns("t".into(), -3), None);
    }

    #[test]
    fn equal_or_higher_rank_replaces() {
        assert!(replaces((1, 5), (1, 5)));
        assert!(replaces((2, 0), (1, 9)));
        assert!(!replaces((1, 4), (1, 5)));
        assert!(!replaces((0, 9), (1, 0)));
    }
}
