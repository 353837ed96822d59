//! The cluster sharding replica store (`ShardingStateStore`): round trip, the newer-wins
//! rule, one node's records apart from another's.

use std::sync::Arc;

use shardik_sharding::cluster::{RecordKey, ShardingRecord, ShardingStateStore};

use super::Store;

fn coordinator(type_name: &str, rank: (u64, u64), bytes: &[u8]) -> ShardingRecord {
    ShardingRecord {
        key: RecordKey::Coordinator {
            type_name: type_name.into(),
        },
        rank,
        bytes: bytes.to_vec(),
    }
}

fn entities(type_name: &str, shard: u32, rank: (u64, u64), bytes: &[u8]) -> ShardingRecord {
    ShardingRecord {
        key: RecordKey::Entities {
            type_name: type_name.into(),
            shard,
        },
        rank,
        bytes: bytes.to_vec(),
    }
}

async fn sorted<S: Store>(store: &S, node: &str) -> Vec<ShardingRecord> {
    let mut records = ShardingStateStore::load_records(store, node).await.unwrap();
    records.sort_by(|a, b| a.key.cmp(&b.key));
    records
}

pub async fn sharding_state_newer_wins<S: Store>(store: Arc<S>) {
    let s = &*store;
    assert!(sorted(s, "n1").await.is_empty());
    // First writes of every key are stored.
    assert_eq!(
        s.save_record("n1", &coordinator("a", (1, 3), b"a13")).await,
        Ok(true)
    );
    assert_eq!(
        s.save_record("n1", &entities("a", 0, (1, 1), b"e0")).await,
        Ok(true)
    );
    assert_eq!(
        s.save_record("n1", &entities("a", 7, (2, 5), b"e7")).await,
        Ok(true)
    );
    assert_eq!(
        s.save_record("n1", &coordinator("b", (4, 0), b"b40")).await,
        Ok(true)
    );
    // Older ranks are refused and change nothing; equal ranks (a retry) and newer ones win.
    assert_eq!(
        s.save_record("n1", &coordinator("a", (1, 2), b"old")).await,
        Ok(false)
    );
    assert_eq!(
        s.save_record("n1", &coordinator("a", (0, 9), b"old")).await,
        Ok(false)
    );
    assert_eq!(
        s.save_record("n1", &coordinator("a", (1, 3), b"a13")).await,
        Ok(true)
    );
    assert_eq!(
        s.save_record("n1", &coordinator("a", (2, 0), b"a20")).await,
        Ok(true)
    );
    assert_eq!(
        s.save_record("n1", &entities("a", 7, (1, 9), b"old")).await,
        Ok(false)
    );
    assert_eq!(
        s.save_record("n1", &entities("a", 0, (1, 2), b"e0b")).await,
        Ok(true)
    );
    // Another node id in the same store has its own records.
    assert_eq!(
        s.save_record("n2", &coordinator("a", (1, 1), b"n2")).await,
        Ok(true)
    );
    assert_eq!(
        sorted(s, "n1").await,
        vec![
            coordinator("a", (2, 0), b"a20"),
            coordinator("b", (4, 0), b"b40"),
            entities("a", 0, (1, 2), b"e0b"),
            entities("a", 7, (2, 5), b"e7"),
        ]
    );
    assert_eq!(sorted(s, "n2").await, vec![coordinator("a", (1, 1), b"n2")]);
    assert!(sorted(s, "n3").await.is_empty());
}

/// Many concurrent writers of one key: whatever the order they land in, the highest rank
/// is what stays.
pub async fn sharding_state_concurrent_writers_keep_the_highest<S: Store>(store: Arc<S>) {
    let mut writers = tokio::task::JoinSet::new();
    for v in 1..=40u64 {
        let store = store.clone();
        writers.spawn(async move {
            let bytes = v.to_be_bytes();
            store
                .save_record("n1", &entities("t", 3, (1, v), &bytes))
                .await
                .unwrap()
        });
    }
    let mut stored = 0;
    while let Some(done) = writers.join_next().await {
        stored += usize::from(done.unwrap());
    }
    assert!(stored >= 1);
    assert_eq!(
        sorted(&*store, "n1").await,
        vec![entities("t", 3, (1, 40), &40u64.to_be_bytes())]
    );
}
