//! Store-level cases: positions, conflicts, fencing, deletion, snapshots, durable state,
//! batching.

use std::sync::Arc;

use shardik_persistence::{Payload, SnapshotRecord, StateWrite, StoreError, Versioned};

use super::{amounts, append, Store};
use crate::common::AccountEvent;

pub async fn append_and_read_in_order<S: Store>(store: Arc<S>) {
    assert_eq!(store.append(append("a", 0, 1, &[10, 20])).await, Ok(2));
    assert_eq!(store.append(append("a", 2, 1, &[30])).await, Ok(3));
    assert_eq!(store.append(append("b", 0, 1, &[99])).await, Ok(1));
    assert_eq!(amounts(&*store, "a", 1).await, [(1, 10), (2, 20), (3, 30)]);
    let page = store.read("a", 2, 1).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!((page[0].seq_nr, page[0].writer), (2, 1));
    assert_eq!(page[0].payload.type_name, AccountEvent::TYPE_NAME);
    assert_eq!(store.highest_seq_nr("a").await, Ok(3));
    assert_eq!(store.highest_seq_nr("nobody").await, Ok(0));
    assert!(store.read("nobody", 1, 10).await.unwrap().is_empty());
}

/// Events of several types and versions, or of several writers, in one batch (PostgreSQL
/// sends a batch of one type, version and writer with them once, any other with them per
/// row), and batches of one type next to them: every event is read back with its own type,
/// version, writer and bytes.
pub async fn events_keep_their_own_type_and_version<S: Store>(store: Arc<S>) {
    let payload = |type_name: &str, version: u32, bytes: &[u8]| Payload {
        type_name: type_name.into(),
        version,
        bytes: bytes.to_vec(),
    };
    let mixed = vec![
        payload("shop.Ordered", 1, b"o1"),
        payload("shop.Paid", 1, b"p1"),
        payload("shop.Ordered", 2, b"o2"),
    ];
    let uniform = vec![
        payload("shop.Paid", 3, b"p3"),
        payload("shop.Paid", 3, b"p4"),
    ];
    let request =
        |pid: &str, writer: u64, events: Vec<Payload>| shardik_persistence::AppendRequest {
            persistence_id: pid.into(),
            expected_seq_nr: 0,
            writer,
            events,
        };
    // Sent together, so that a batching store may put them in one batch.
    let (m, u, w) = tokio::join!(
        store.append(request("mixed", 1, mixed.clone())),
        store.append(request("uniform", 1, uniform.clone())),
        store.append(request("other-writer", 2, uniform.clone())),
    );
    assert_eq!((m, u, w), (Ok(3), Ok(2), Ok(2)));
    // Alone: one type, one writer, but several events.
    assert_eq!(
        store.append(request("alone", 5, uniform.clone())).await,
        Ok(2)
    );
    // Many streams of one type by two writers at once: batches hold both writers.
    let both = futures_util::future::join_all(
        (0..32u64).map(|i| store.append(request(&format!("by-{i}"), 1 + i % 2, uniform.clone()))),
    )
    .await;
    assert!(both.iter().all(|r| *r == Ok(2)), "{both:?}");
    for i in 0..32u64 {
        let read = store.read(&format!("by-{i}"), 1, usize::MAX).await.unwrap();
        let writers: Vec<u64> = read.iter().map(|e| e.writer).collect();
        assert_eq!(writers, [1 + i % 2; 2], "stream by-{i}");
    }
    for (pid, writer, written) in [
        ("mixed", 1, mixed),
        ("uniform", 1, uniform.clone()),
        ("other-writer", 2, uniform.clone()),
        ("alone", 5, uniform),
    ] {
        let read = store.read(pid, 1, usize::MAX).await.unwrap();
        assert!(
            read.iter().all(|e| e.writer == writer),
            "stream {pid}: {read:?}"
        );
        let payloads: Vec<Payload> = read.into_iter().map(|e| e.payload).collect();
        assert_eq!(payloads, written, "stream {pid}");
    }
}

pub async fn append_conflict_writes_nothing<S: Store>(store: Arc<S>) {
    store.append(append("a", 0, 1, &[1, 2])).await.unwrap();
    let err = store.append(append("a", 1, 1, &[3, 4])).await.unwrap_err();
    assert_eq!(
        err,
        StoreError::Conflict {
            persistence_id: "a".into(),
            expected: 1,
            actual: 2
        }
    );
    assert_eq!(amounts(&*store, "a", 1).await, [(1, 1), (2, 2)]);
    assert_eq!(store.highest_seq_nr("a").await, Ok(2));
}

pub async fn two_writers_one_id<S: Store>(store: Arc<S>) {
    // Both writers saw an empty stream and write at once: exactly one wins.
    let (a, b) = tokio::join!(
        store.append(append("x", 0, 5, &[1])),
        store.append(append("x", 0, 5, &[2]))
    );
    let (won, lost) = match (a, b) {
        (Ok(1), Err(e)) => (1, e),
        (Err(e), Ok(1)) => (2, e),
        other => panic!("exactly one append must win: {other:?}"),
    };
    assert!(matches!(
        lost,
        StoreError::Conflict {
            expected: 0,
            actual: 1,
            ..
        }
    ));
    assert_eq!(amounts(&*store, "x", 1).await, [(1, won)]);
    // A newer incarnation writes; the older one is fenced out even at the right position.
    store.append(append("x", 1, 6, &[3])).await.unwrap();
    let fenced = store.append(append("x", 2, 5, &[4])).await.unwrap_err();
    assert_eq!(
        fenced,
        StoreError::Fenced {
            persistence_id: "x".into(),
            writer: 5,
            current: 6
        }
    );
    assert_eq!(store.highest_seq_nr("x").await, Ok(2));
}

pub async fn delete_keeps_the_position<S: Store>(store: Arc<S>) {
    store
        .append(append("d", 0, 1, &[1, 2, 3, 4, 5]))
        .await
        .unwrap();
    store.delete_up_to("d", 3).await.unwrap();
    assert_eq!(amounts(&*store, "d", 1).await, [(4, 4), (5, 5)]);
    assert_eq!(store.highest_seq_nr("d").await, Ok(5));
    store.delete_up_to("d", 5).await.unwrap();
    assert!(amounts(&*store, "d", 1).await.is_empty());
    assert_eq!(store.highest_seq_nr("d").await, Ok(5));
    assert!(matches!(
        store.append(append("d", 0, 1, &[9])).await,
        Err(StoreError::Conflict { actual: 5, .. })
    ));
    assert_eq!(store.append(append("d", 5, 1, &[6])).await, Ok(6));
}

/// Bounds above `i64::MAX` (`u64::MAX` for "all of them") mean what they say on every
/// backend: SQL backends used to bit-cast them to a negative number, so deleting up to
/// `u64::MAX` deleted nothing (and was acknowledged) and reading from it read everything.
pub async fn bounds_beyond_i64_mean_all_or_nothing<S: Store>(store: Arc<S>) {
    store.append(append("big", 0, 1, &[1, 2, 3])).await.unwrap();
    assert!(amounts(&*store, "big", u64::MAX).await.is_empty());
    assert!(amounts(&*store, "big", 1 << 63).await.is_empty());
    store.delete_up_to("big", u64::MAX).await.unwrap();
    assert!(amounts(&*store, "big", 1).await.is_empty());
    assert_eq!(store.highest_seq_nr("big").await, Ok(3));
    for seq_nr in [1, 3] {
        let payload = Payload::encode_as("snap", 1, &seq_nr).unwrap();
        let snapshot = SnapshotRecord {
            persistence_id: "big".into(),
            seq_nr,
            payload,
        };
        store.save(snapshot).await.unwrap();
    }
    assert_eq!(
        store
            .load_at_most("big", u64::MAX)
            .await
            .unwrap()
            .unwrap()
            .seq_nr,
        3
    );
    store.delete_snapshots_up_to("big", u64::MAX).await.unwrap();
    assert_eq!(store.load_latest("big").await, Ok(None));
}

pub async fn snapshots_latest_and_deletion<S: Store>(store: Arc<S>) {
    assert_eq!(store.load_latest("s").await, Ok(None));
    for seq_nr in [10, 30, 20] {
        let payload = Payload::encode_as("snap", 1, &seq_nr).unwrap();
        store
            .save(SnapshotRecord {
                persistence_id: "s".into(),
                seq_nr,
                payload,
            })
            .await
            .unwrap();
    }
    let latest = store.load_latest("s").await.unwrap().unwrap();
    assert_eq!(latest.seq_nr, 30);
    assert_eq!(
        latest.payload,
        Payload::encode_as("snap", 1, &30u64).unwrap()
    );
    assert_eq!(
        store.load_at_most("s", 25).await.unwrap().unwrap().seq_nr,
        20
    );
    assert_eq!(
        store.load_at_most("s", 30).await.unwrap().unwrap().seq_nr,
        30
    );
    assert_eq!(store.load_at_most("s", 9).await, Ok(None));
    store.delete_snapshots_up_to("s", 29).await.unwrap();
    assert_eq!(store.load_latest("s").await.unwrap().unwrap().seq_nr, 30);
    assert_eq!(store.load_at_most("s", 29).await, Ok(None));
    store.delete_snapshots_up_to("s", 30).await.unwrap();
    assert_eq!(store.load_latest("s").await, Ok(None));
}

pub async fn state_store_revisions<S: Store>(store: Arc<S>) {
    let write = |expected, writer, v: u64| StateWrite {
        persistence_id: "st".into(),
        expected_revision: expected,
        writer,
        payload: Payload::encode_as("n", 1, &v).unwrap(),
    };
    assert_eq!(store.get("st").await, Ok(None));
    assert_eq!(store.upsert(write(0, 1, 10)).await, Ok(1));
    assert!(matches!(
        store.upsert(write(0, 1, 11)).await,
        Err(StoreError::Conflict {
            expected: 0,
            actual: 1,
            ..
        })
    ));
    assert_eq!(store.upsert(write(1, 2, 12)).await, Ok(2));
    assert!(matches!(
        store.upsert(write(2, 1, 13)).await,
        Err(StoreError::Fenced {
            writer: 1,
            current: 2,
            ..
        })
    ));
    let got = store.get("st").await.unwrap().unwrap();
    assert_eq!(
        (got.revision, got.payload.bytes.clone()),
        (2, write(0, 0, 12).payload.bytes)
    );
    assert!(matches!(
        store.delete("st", 1).await,
        Err(StoreError::Conflict { actual: 2, .. })
    ));
    store.delete("st", 2).await.unwrap();
    assert_eq!(store.get("st").await, Ok(None));
}

pub async fn batching_many_concurrent_writers<S: Store>(store: Arc<S>) {
    const IDS: u64 = 100;
    const PER_ID: u64 = 20;
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..IDS {
        let store = store.clone();
        tasks.spawn(async move {
            let pid = format!("w-{id}");
            for n in 0..PER_ID {
                let seq = store
                    .append(append(&pid, n, 1, &[id * 1000 + n]))
                    .await
                    .unwrap();
                assert_eq!(seq, n + 1);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    for id in 0..IDS {
        let pid = format!("w-{id}");
        let expected: Vec<_> = (0..PER_ID).map(|n| (n + 1, id * 1000 + n)).collect();
        assert_eq!(amounts(&*store, &pid, 1).await, expected, "stream {pid}");
        assert_eq!(store.highest_seq_nr(&pid).await, Ok(PER_ID));
    }
}

/// Two stores on the same data (two processes on one SQLite file, two nodes on one
/// PostgreSQL schema) race on one stream many times: each round exactly one append wins.
pub async fn two_stores_one_stream<A: Store, B: Store>(a: Arc<A>, b: Arc<B>) {
    for round in 0..20u64 {
        let pid = format!("race-{round}");
        let (ra, rb) = tokio::join!(
            a.append(append(&pid, 0, 1, &[1])),
            b.append(append(&pid, 0, 1, &[2]))
        );
        match (&ra, &rb) {
            (Ok(1), Err(StoreError::Conflict { actual: 1, .. }))
            | (Err(StoreError::Conflict { actual: 1, .. }), Ok(1)) => {}
            other => panic!("round {round}: exactly one append must win: {other:?}"),
        }
        let winner = if ra.is_ok() { 1 } else { 2 };
        assert_eq!(amounts(&*a, &pid, 1).await, [(1, winner)]);
        assert_eq!(amounts(&*b, &pid, 1).await, [(1, winner)]);
    }
}

/// Two stores on the same data take turns on one stream, so each one's idea of where the
/// stream ends goes stale (a PostgreSQL lane remembers the positions it committed): a
/// stale append is refused with the stream's true position or newest writer, never
/// written, and each store goes on from the true position.
pub async fn two_stores_take_turns_on_one_stream<A: Store, B: Store>(a: Arc<A>, b: Arc<B>) {
    assert_eq!(a.append(append("turns", 0, 1, &[1])).await, Ok(1));
    assert_eq!(a.append(append("turns", 1, 1, &[2])).await, Ok(2));
    // The other store moves the stream on behind the first one's back.
    assert_eq!(b.append(append("turns", 2, 1, &[3])).await, Ok(3));
    assert_eq!(
        a.append(append("turns", 2, 1, &[30])).await,
        Err(StoreError::Conflict {
            persistence_id: "turns".into(),
            expected: 2,
            actual: 3
        })
    );
    assert_eq!(a.append(append("turns", 3, 1, &[4])).await, Ok(4));
    // A newer incarnation on the other store: the first store's writer is fenced out even
    // at the right position, and again after the other store deleted every event.
    assert_eq!(b.append(append("turns", 4, 2, &[5])).await, Ok(5));
    assert_eq!(
        a.append(append("turns", 5, 1, &[50])).await,
        Err(StoreError::Fenced {
            persistence_id: "turns".into(),
            writer: 1,
            current: 2
        })
    );
    b.delete_up_to("turns", 5).await.unwrap();
    assert!(amounts(&*a, "turns", 1).await.is_empty());
    assert_eq!(a.highest_seq_nr("turns").await, Ok(5));
    assert!(matches!(
        a.append(append("turns", 5, 1, &[50])).await,
        Err(StoreError::Fenced { current: 2, .. })
    ));
    assert!(matches!(
        a.append(append("turns", 0, 3, &[50])).await,
        Err(StoreError::Conflict { actual: 5, .. })
    ));
    // The first store's newer incarnation takes over where the stream really ends.
    assert_eq!(a.append(append("turns", 5, 3, &[6])).await, Ok(6));
    assert_eq!(a.append(append("turns", 6, 3, &[7])).await, Ok(7));
    assert!(matches!(
        b.append(append("turns", 7, 2, &[70])).await,
        Err(StoreError::Fenced { current: 3, .. })
    ));
    assert_eq!(amounts(&*b, "turns", 1).await, [(6, 6), (7, 7)]);
    assert_eq!(b.highest_seq_nr("turns").await, Ok(7));
}

/// A writer that fell behind is refused even after the other store deleted the events
/// between its position and the stream's end: it is behind the stream's position, not at a
/// gap, and (with an older incarnation) fenced. A store that remembers the positions it
/// committed must not take the missing rows for a stream nobody moved on.
pub async fn a_stale_writer_behind_deleted_events_is_refused<A: Store, B: Store>(
    a: Arc<A>,
    b: Arc<B>,
) {
    // A newer incarnation moves the stream on, then retention deletes what it passed.
    assert_eq!(a.append(append("gone", 0, 1, &[1])).await, Ok(1));
    assert_eq!(b.append(append("gone", 1, 2, &[2])).await, Ok(2));
    assert_eq!(b.append(append("gone", 2, 2, &[3])).await, Ok(3));
    b.delete_up_to("gone", 3).await.unwrap();
    assert_eq!(
        a.append(append("gone", 1, 1, &[20])).await,
        Err(StoreError::Fenced {
            persistence_id: "gone".into(),
            writer: 1,
            current: 2
        })
    );
    // The same incarnation on both stores (two writers of one id): a conflict.
    assert_eq!(a.append(append("same", 0, 1, &[1])).await, Ok(1));
    assert_eq!(b.append(append("same", 1, 1, &[2])).await, Ok(2));
    assert_eq!(b.append(append("same", 2, 1, &[3])).await, Ok(3));
    b.delete_up_to("same", 2).await.unwrap();
    assert_eq!(
        a.append(append("same", 1, 1, &[20])).await,
        Err(StoreError::Conflict {
            persistence_id: "same".into(),
            expected: 1,
            actual: 3
        })
    );
    // Nothing of the refused appends was written; the stream goes on where it ends.
    assert_eq!(amounts(&*b, "same", 1).await, [(3, 3)]);
    assert_eq!(a.append(append("same", 3, 1, &[4])).await, Ok(4));
    assert_eq!(b.highest_seq_nr("gone").await, Ok(3));
    assert!(amounts(&*a, "gone", 1).await.is_empty());
}

/// Writes queued together (a batching store takes them into one transaction) are accepted
/// or refused one by one, in queue order: a conflict or a fenced writer refuses only its own
/// write, and a later write of the same stream sees the earlier accepted one.
pub async fn mixed_batch_refuses_writes_one_by_one<S: Store>(store: Arc<S>) {
    let state = |pid: &str, expected, writer, v: u64| StateWrite {
        persistence_id: pid.into(),
        expected_revision: expected,
        writer,
        payload: Payload::encode_as("n", 1, &v).unwrap(),
    };
    store
        .append(append("m-conflict", 0, 1, &[1, 2]))
        .await
        .unwrap();
    store.append(append("m-fenced", 0, 7, &[1])).await.unwrap();
    assert_eq!(store.upsert(state("m-state", 0, 7, 1)).await, Ok(1));
    let snapshot = SnapshotRecord {
        persistence_id: "m-new".into(),
        seq_nr: 2,
        payload: Payload::encode_as("snap", 1, &2u64).unwrap(),
    };
    let (new1, conflict, accepted, fenced, new2, state_fenced, state_new, state_conflict, snap) = tokio::join!(
        store.append(append("m-new", 0, 1, &[10, 11])),
        store.append(append("m-conflict", 1, 1, &[30])),
        store.append(append("m-conflict", 2, 1, &[3])),
        store.append(append("m-fenced", 1, 6, &[2])),
        store.append(append("m-new", 2, 1, &[12])),
        store.upsert(state("m-state", 1, 6, 2)),
        store.upsert(state("m-state-2", 0, 1, 5)),
        store.upsert(state("m-state-2", 0, 1, 6)),
        store.save(snapshot),
    );
    assert_eq!(new1, Ok(2));
    assert_eq!(
        conflict,
        Err(StoreError::Conflict {
            persistence_id: "m-conflict".into(),
            expected: 1,
            actual: 2
        })
    );
    assert_eq!(accepted, Ok(3));
    assert_eq!(
        fenced,
        Err(StoreError::Fenced {
            persistence_id: "m-fenced".into(),
            writer: 6,
            current: 7
        })
    );
    assert_eq!(new2, Ok(3));
    assert!(matches!(
        state_fenced,
        Err(StoreError::Fenced {
            writer: 6,
            current: 7,
            ..
        })
    ));
    assert_eq!(state_new, Ok(1));
    assert!(matches!(
        state_conflict,
        Err(StoreError::Conflict {
            expected: 0,
            actual: 1,
            ..
        })
    ));
    assert_eq!(snap, Ok(()));
    assert_eq!(
        amounts(&*store, "m-new", 1).await,
        [(1, 10), (2, 11), (3, 12)]
    );
    assert_eq!(
        amounts(&*store, "m-conflict", 1).await,
        [(1, 1), (2, 2), (3, 3)]
    );
    assert_eq!(amounts(&*store, "m-fenced", 1).await, [(1, 1)]);
    assert_eq!(store.highest_seq_nr("m-fenced").await, Ok(1));
    let kept = store.get("m-state").await.unwrap().unwrap();
    assert_eq!(
        (kept.revision, kept.payload),
        (1, state("", 0, 0, 1).payload)
    );
    let created = store.get("m-state-2").await.unwrap().unwrap();
    assert_eq!(
        (created.revision, created.payload),
        (1, state("", 0, 0, 5).payload)
    );
    assert_eq!(
        store.load_latest("m-new").await.unwrap().map(|s| s.seq_nr),
        Some(2)
    );
    // The fenced-out writer stays fenced; the newest one goes on.
    assert!(matches!(
        store.append(append("m-fenced", 1, 6, &[2])).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(store.append(append("m-fenced", 1, 7, &[2])).await, Ok(2));
}

/// Deletions queued with appends and saves apply in queue order: a deletion removes what
/// was written before it (in the same batch too), never what is written after it.
pub async fn deletes_apply_in_queue_order<S: Store>(store: Arc<S>) {
    let snap = |seq_nr: u64| SnapshotRecord {
        persistence_id: "q".into(),
        seq_nr,
        payload: Payload::encode_as("snap", 1, &seq_nr).unwrap(),
    };
    store.append(append("q", 0, 1, &[1, 2])).await.unwrap();
    store.save(snap(2)).await.unwrap();
    let (a, b, c, d, e, f) = tokio::join!(
        store.append(append("q", 2, 1, &[3, 4])),
        store.delete_up_to("q", 3),
        store.append(append("q", 4, 1, &[5])),
        store.save(snap(4)),
        store.delete_snapshots_up_to("q", 4),
        store.save(snap(3)),
    );
    assert_eq!((a, b, c), (Ok(4), Ok(()), Ok(5)));
    assert_eq!((d, e, f), (Ok(()), Ok(()), Ok(())));
    assert_eq!(amounts(&*store, "q", 1).await, [(4, 4), (5, 5)]);
    assert_eq!(store.highest_seq_nr("q").await, Ok(5));
    assert_eq!(
        store.load_latest("q").await.unwrap().map(|s| s.seq_nr),
        Some(3)
    );
}

/// Two stores on the same data create the same durable state at once, many times: each
/// round exactly one write wins and the other is refused (a conflict, or fenced when the
/// winner is the newer writer), never both stored.
pub async fn two_stores_one_state<A: Store, B: Store>(a: Arc<A>, b: Arc<B>) {
    let write = |pid: &str, writer, v: u64| StateWrite {
        persistence_id: pid.into(),
        expected_revision: 0,
        writer,
        payload: Payload::encode_as("n", 1, &v).unwrap(),
    };
    for round in 0..20u64 {
        let pid = format!("state-race-{round}");
        let (ra, rb) = tokio::join!(a.upsert(write(&pid, 1, 1)), b.upsert(write(&pid, 1, 2)));
        let winner = match (&ra, &rb) {
            (Ok(1), Err(StoreError::Conflict { actual: 1, .. })) => 1,
            (Err(StoreError::Conflict { actual: 1, .. }), Ok(1)) => 2,
            other => panic!("round {round}: exactly one write must win: {other:?}"),
        };
        let stored = a.get(&pid).await.unwrap().unwrap();
        assert_eq!(
            (stored.revision, stored.payload),
            (1, write("", 0, winner).payload)
        );
    }
}
