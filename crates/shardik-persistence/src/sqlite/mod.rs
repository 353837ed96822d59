//! [`SqliteStore`]: journal, snapshots and durable state in one SQLite file (WAL mode).
//!
//! Writes go to one writer thread that groups whatever is queued into one transaction, so
//! many entities persisting at once share an fsync; a task on the callers' runtime answers
//! them, and a checkpointer thread copies the WAL into the database file, both off the
//! writer's path (the writer only finishes a checkpoint when the WAL has grown long, so that
//! SQLite starts it over). Reads run on a small pool of read connections inside
//! `spawn_blocking`; in WAL mode they do not wait for the writer.

mod schema;
mod sharding;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use crate::batch::{Counters, Op, Reply, WriterStats};
use crate::error::StoreError;
use crate::record::{AppendRequest, PersistedEvent, SnapshotRecord, StateRecord, StateWrite};
use crate::store::{Journal, SnapshotStore, StateStore, StoreFuture};
use schema::{backend, connect, to_i64, to_u64};

/// How hard SQLite flushes a commit to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `synchronous=FULL`: a commit survives a power loss (the default).
    #[default]
    Full,
    /// `synchronous=NORMAL`: a commit survives a crash of the process but the last commits
    /// may be lost on power loss; faster.
    Normal,
}

/// Settings of a [`SqliteStore`].
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// Flush level (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
    /// Most writes grouped into one transaction (default 1024).
    pub max_batch: usize,
    /// Read connections (default 4).
    pub readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            max_batch: 1024,
            readers: 4,
        }
    }
}

struct Readers {
    conns: Vec<Mutex<Connection>>,
    next: AtomicUsize,
}

/// A [`Journal`], [`SnapshotStore`], [`StateStore`] and
/// [`ShardingStateStore`](shardik_sharding::cluster::ShardingStateStore) in one SQLite
/// database file.
///
/// Several processes on one machine may open the same file: SQLite's locking serializes
/// their writers and the sequence-number checks keep each stream consistent.
pub struct SqliteStore {
    path: PathBuf,
    writes: mpsc::Sender<Op>,
    readers: Arc<Readers>,
    stats: Arc<Counters>,
    replier: Arc<writer::Replier>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with default options.
    ///
    /// Opening does blocking file IO; do it at start-up.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens the database at `path` with `options`.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let sync = match options.synchronous {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        };
        let conn = connect(&path, sync)?;
        // One transaction that takes the write lock first (waiting under the busy timeout):
        // created statement by statement, a process opening the same fresh file could commit
        // a table between one statement's read and its write, which SQLite refuses at once.
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {} COMMIT;", schema::DDL))
            .map_err(|e| {
                StoreError::Backend(format!(
                    "sqlite: creating the tables in {}: {e}",
                    path.display()
                ))
            })?;
        let conns = (0..options.readers.max(1))
            .map(|_| connect(&path, sync).map(Mutex::new))
            .collect::<Result<_, _>>()?;
        // Checkpoints (copying the WAL into the database file) run on their own thread and
        // connection, so the writer does not pay for them inside its batches; the writer only
        // finishes one when the WAL has grown long (see `writer`).
        conn.execute_batch("PRAGMA wal_autocheckpoint=0;")
            .map_err(backend)?;
        let checkpointer = connect(&path, sync)?;
        let (requests, checkpoints) = mpsc::sync_channel(1);
        let running = Arc::new(Mutex::new(()));
        let checkpoint = writer::Checkpoints {
            requests,
            running: running.clone(),
        };
        std::thread::Builder::new()
            .name("shardik-sqlite-checkpoint".into())
            .spawn(move || writer::checkpoint(checkpointer, checkpoints, &running))
            .map_err(|e| {
                StoreError::Backend(format!("cannot start the SQLite checkpointer: {e}"))
            })?;
        let (writes, ops) = mpsc::channel();
        let max_batch = options.max_batch.max(1);
        let stats = Arc::new(Counters::default());
        let counters = stats.clone();
        let replier = Arc::new(writer::Replier::default());
        let route = replier.clone();
        std::thread::Builder::new()
            .name("shardik-sqlite-writer".into())
            .spawn(move || writer::run(conn, ops, max_batch, &counters, checkpoint, &route))
            .map_err(|e| StoreError::Backend(format!("cannot start the SQLite writer: {e}")))?;
        Ok(SqliteStore {
            path,
            writes,
            readers: Arc::new(Readers {
                conns,
                next: AtomicUsize::new(0),
            }),
            stats,
            replier,
        })
    }

    /// How many writes were done in how many transactions so far.
    pub fn writer_stats(&self) -> WriterStats {
        self.stats.stats()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn write<T>(&self, make: impl FnOnce(Reply<T>) -> Op) -> Result<T, StoreError> {
        self.replier.ensure();
        let (tx, rx) = oneshot::channel();
        self.writes.send(make(tx)).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let i = readers.next.fetch_add(1, Ordering::Relaxed) % readers.conns.len();
            let conn = readers.conns[i].lock();
            query(&conn).map_err(backend)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("SQLite read task failed: {e}")))?
    }
}

impl Journal for SqliteStore {
    fn append(&self, request: AppendRequest) -> StoreFuture<'_, u64> {
        Box::pin(self.write(|tx| Op::Append(request, tx)))
    }

    fn read<'a>(
        &'a self,
        persistence_id: &'a str,
        from_seq_nr: u64,
        max: usize,
    ) -> StoreFuture<'a, Vec<PersistedEvent>> {
        let pid = persistence_id.to_string();
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        Box::pin(self.read(move |c| {
            let mut s = c.prepare_cached(
                "SELECT persistence_id, seq_nr, writer, type_name, version, payload FROM journal
                 WHERE persistence_id = ?1 AND seq_nr >= ?2 ORDER BY seq_nr LIMIT ?3",
            )?;
            let rows = s.query_map(params![pid, to_i64(from_seq_nr), max], schema::event)?;
            rows.collect()
        }))
    }

    fn highest_seq_nr<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, u64> {
        let pid = persistence_id.to_string();
        Box::pin(self.read(move |c| {
            c.prepare_cached("SELECT highest_seq_nr FROM journal_meta WHERE persistence_id = ?1")?
                .query_row([pid], |r| r.get::<_, i64>(0))
                .optional()
                .map(|v| v.map_or(0, to_u64))
        }))
    }

    fn delete_up_to<'a>(&'a self, persistence_id: &'a str, to_seq_nr: u64) -> StoreFuture<'a, ()> {
        let pid = persistence_id.to_string();
        Box::pin(self.write(move |tx| Op::DeleteEvents(pid, to_seq_nr, tx)))
    }
}

impl SnapshotStore for SqliteStore {
    fn save(&self, snapshot: SnapshotRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.write(|tx| Op::SaveSnapshot(snapshot, tx)))
    }

    fn load_at_most<'a>(
        &'a self,
        persistence_id: &'a str,
        max_seq_nr: u64,
    ) -> StoreFuture<'a, Option<SnapshotRecord>> {
        let pid = persistence_id.to_string();
        let max = i64::try_from(max_seq_nr).unwrap_or(i64::MAX);
        Box::pin(self.read(move |c| {
            c.prepare_cached(
                "SELECT persistence_id, seq_nr, type_name, version, payload FROM snapshots
                 WHERE persistence_id = ?1 AND seq_nr <= ?2 ORDER BY seq_nr DESC LIMIT 1",
            )?
            .query_row(params![pid, max], schema::snapshot)
            .optional()
        }))
    }

    fn delete_snapshots_up_to<'a>(
        &'a self,
        persistence_id: &'a str,
        to_seq_nr: u64,
    ) -> StoreFuture<'a, ()> {
        let pid = persistence_id.to_string();
        Box::pin(self.write(move |tx| Op::DeleteSnapshots(pid, to_seq_nr, tx)))
    }
}

impl StateStore for SqliteStore {
    fn upsert(&self, write: StateWrite) -> StoreFuture<'_, u64> {
        Box::pin(self.write(|tx| Op::Upsert(write, tx)))
    }

    fn get<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, Option<StateRecord>> {
        let pid = persistence_id.to_string();
        Box::pin(self.read(move |c| {
            c.prepare_cached(
                "SELECT persistence_id, revision, type_name, version, payload FROM durable_state
                 WHERE persistence_id = ?1",
            )?
            .query_row([pid], schema::state)
            .optional()
        }))
    }

    fn delete<'a>(
        &'a self,
        persistence_id: &'a str,
        expected_revision: u64,
    ) -> StoreFuture<'a, ()> {
        let pid = persistence_id.to_string();
        Box::pin(self.write(move |tx| Op::DeleteState(pid, expected_revision, tx)))
    }
}
