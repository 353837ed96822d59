//! SQLite: shardik's [`SqliteStore`] and the same database file format driven directly with
//! rusqlite. Both use WAL mode with `synchronous=FULL` (the store's default: a commit is
//! fsynced before it is acknowledged) in a temporary directory on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use shardik_persistence::{Payload, Persistence, SqliteStore};

use super::entity::State;
use super::{decode_state, event_payload, fold, Direct, HAND_BATCH};

const INSERT: &str = "INSERT INTO journal
    (persistence_id, seq_nr, writer, type_name, version, payload, written_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory under the system's temporary directory.
    pub fn new() -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("shardik-pbench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create the temporary directory");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Opens the shardik store (`shardik.db`) and the baseline database (`direct.db`, its tables
/// created by opening a store on it once, so the table shape is the store's).
pub fn setup(dir: &TempDir) -> (Persistence, SqliteDirect) {
    let shardik = dir.path().join("shardik.db");
    let store = SqliteStore::open(&shardik).expect("open the shardik SQLite store");
    let direct = dir.path().join("direct.db");
    drop(SqliteStore::open(&direct).expect("create the baseline tables"));
    let write = connect(&direct);
    let read = connect(&shardik);
    (
        Persistence::new(Arc::new(store)),
        SqliteDirect {
            write,
            read,
            next_seq: 0,
            payload: event_payload(),
        },
    )
}

fn connect(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open a SQLite connection");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("set the busy timeout");
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .expect("WAL mode");
    assert!(mode.eq_ignore_ascii_case("wal"), "SQLite refused WAL mode");
    conn.execute_batch("PRAGMA synchronous=FULL;")
        .expect("synchronous=FULL");
    conn
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The SQLite baselines.
pub struct SqliteDirect {
    write: Connection,
    read: Connection,
    next_seq: i64,
    payload: Payload,
}

/// Inserts one journal row of `payload` at `seq` in stream `pid`.
fn insert(conn: &Connection, pid: &str, seq: i64, payload: &Payload) {
    conn.prepare_cached(INSERT)
        .and_then(|mut s| {
            s.execute(params![
                pid,
                seq,
                1i64,
                payload.type_name,
                payload.version,
                payload.bytes,
                now_millis()
            ])
        })
        .expect("insert an event row");
}

impl Direct for SqliteDirect {
    fn one_tx_per_event(&mut self, entities: usize, slot: Duration) -> f64 {
        let start = Instant::now();
        let mut done = 0usize;
        while start.elapsed() < slot {
            let tx = self
                .write
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
            self.next_seq += 1;
            let pid = format!("tx{entities}|{}", done % entities);
            insert(&tx, &pid, self.next_seq, &self.payload);
            tx.commit().expect("commit");
            done += 1;
        }
        done as f64 / start.elapsed().as_secs_f64()
    }

    fn hand_batched(&mut self, entities: usize, slot: Duration) -> f64 {
        let start = Instant::now();
        let mut done = 0usize;
        while start.elapsed() < slot {
            let tx = self
                .write
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
            for _ in 0..HAND_BATCH {
                self.next_seq += 1;
                let pid = format!("batch{entities}|{}", done % entities);
                insert(&tx, &pid, self.next_seq, &self.payload);
                done += 1;
            }
            tx.commit().expect("commit");
        }
        done as f64 / start.elapsed().as_secs_f64()
    }

    fn recover(&mut self, pid: &str, snapshot: bool) -> u64 {
        let mut state = State::default();
        let mut from = 1i64;
        if snapshot {
            let row = self
                .read
                .prepare_cached(
                    "SELECT seq_nr, type_name, version, payload FROM snapshots
                     WHERE persistence_id = ?1 ORDER BY seq_nr DESC LIMIT 1",
                )
                .and_then(|mut s| {
                    s.query_row([pid], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            Payload {
                                type_name: r.get(1)?,
                                version: r.get(2)?,
                                bytes: r.get(3)?,
                            },
                        ))
                    })
                    .optional()
                })
                .expect("read the snapshot");
            if let Some((seq, payload)) = row {
                state = decode_state(&payload);
                from = seq + 1;
            }
        }
        let mut s = self
            .read
            .prepare_cached(
                "SELECT type_name, version, payload FROM journal
                 WHERE persistence_id = ?1 AND seq_nr >= ?2 ORDER BY seq_nr",
            )
            .expect("prepare the event query");
        let mut rows = s.query(params![pid, from]).expect("read events");
        while let Some(r) = rows.next().expect("read an event row") {
            let payload = Payload {
                type_name: r.get(0).expect("type_name"),
                version: r.get(1).expect("version"),
                bytes: r.get(2).expect("payload"),
            };
            fold(&mut state, &payload);
        }
        state.events
    }
}
