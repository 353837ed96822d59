//! [`SqliteStore`]: journal, snapshots and durable state in one SQLite file (WAL mode).
//!
//! Writes go to one writer thread that groups whatever is queued into one transaction, so
//! many entities persisting at once share an fsync; a task on the callers' runtime answers
//! them, and a checkpointer thread copies the WAL into the database file, both off the
//! writer's path (the writer only finishes a checkpoint when the WAL has grown long, so that
//! SQLite starts it over). Reads run on a few reader threads, each with its own connection,
//! taking them from one queue; in WAL mode they do not wait for the writer.

mod schema;
mod sharding;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use crate::batch::{Counters, Op, Reply, WriterStats};
use crate::error::StoreError;
use crate::record::{AppendRequest, PersistedEvent, SnapshotRecord, StateRecord, StateWrite};
use crate::store::{Journal, SnapshotStore, StateStore, StoreFuture};
use schema::{backend, connect, to_u64};

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
    /// Most writes grouped into one transaction (default 1024; 0 counts as 1).
    pub max_batch: usize,
    /// Read connections, each with a reader thread of its own (default 4; 0 counts as 1).
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

/// A read, run by whichever reader thread takes it.
type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// Starts one reader thread per connection, all taking jobs from one queue; they end when
/// the returned sender (the store) is dropped. A burst of reads (entities recovering
/// together, after a failover or a restart) waits in the queue: it costs no thread per read,
/// where reads on tokio's blocking pool took a thread each (hundreds in a burst), all but a
/// few waiting on a connection's lock.
fn start_readers(conns: Vec<Connection>) -> Result<mpsc::Sender<ReadJob>, StoreError> {
    let (jobs, queue) = mpsc::channel::<ReadJob>();
    let queue = Arc::new(Mutex::new(queue));
    for conn in conns {
        let queue = queue.clone();
        std::thread::Builder::new()
            .name("shardik-sqlite-reader".into())
            .spawn(move || loop {
                // The lock is held while waiting, so one idle reader waits on the queue and the
                // others on the lock; it is let go before the job runs.
                let job = queue.lock().recv();
                let Ok(job) = job else {
                    return;
                };
                // A panicking read drops its answer (its caller gets an error), not the
                // thread.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&conn)));
            })
            .map_err(|e| StoreError::Backend(format!("cannot start an SQLite reader: {e}")))?;
    }
    Ok(jobs)
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
    readers: mpsc::Sender<ReadJob>,
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
            .map(|_| connect(&path, sync))
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
            readers: start_readers(conns)?,
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
        let (tx, rx) = Reply::channel("SQLite");
        self.writes.send(make(tx)).map_err(|_| StoreError::Closed)?;
        // A slot dropped unanswered says so itself if its batch panicked: dropped
        // otherwise, the writer is gone.
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.readers
            .send(Box::new(move |conn: &Connection| {
                let _ = answer.send(query(conn).map_err(backend));
            }))
            .map_err(|_| StoreError::Closed)?;
        answered
            .await
            .map_err(|_| StoreError::Backend("an SQLite read panicked".into()))?
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
            let rows = s.query_map(
                params![pid, crate::batch::sql_bound(from_seq_nr), max],
                schema::event,
            )?;
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
        let max = crate::batch::sql_bound(max_seq_nr);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{SqliteOptions, SqliteStore};
    use crate::store::Journal;

    /// Threads of this process whose name is `name` (Linux: `/proc/self/task/*/comm`).
    #[cfg(target_os = "linux")]
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .expect("read /proc/self/task")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    /// A burst of reads (entities recovering together, after a failover or a restart) waits
    /// in the readers' queue: it takes no thread of the caller's runtime (reads on tokio's
    /// blocking pool took one each, 376 for this burst, all but four waiting on a lock).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_burst_of_reads_takes_no_runtime_threads() {
        const NAME: &str = "sqlite-burst";
        const WORKERS: usize = 2;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name(NAME)
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let options = SqliteOptions::default();
        let readers = options.readers;
        let store = Arc::new(
            SqliteStore::open_with(dir.path().join("burst.db"), options).expect("open the store"),
        );
        runtime.block_on(async {
            let reads = (0..1000).map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.highest_seq_nr(&format!("burst-{i}")).await })
            });
            for read in futures_util::future::join_all(reads).await {
                assert_eq!(read.expect("a read task"), Ok(0));
            }
        });
        // Blocking threads would stay alive (idle) for a while after their work, so they
        // would still be there to count.
        let threads = threads_named(NAME);
        assert_eq!(
            threads, WORKERS,
            "{threads} runtime threads for {readers} read connections and {WORKERS} workers"
        );
    }

    /// A current-thread runtime that wrote first and is then left alone (nobody drives it)
    /// does not strand the answers of writes made from another runtime: it gets no reply
    /// task (one there answered nobody until that runtime ran again).
    #[test]
    fn writes_from_another_runtime_are_answered_while_a_current_thread_one_sits_idle() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Arc::new(
            SqliteStore::open_with(dir.path().join("idle.db"), SqliteOptions::default())
                .expect("open the store"),
        );
        let append = |store: Arc<SqliteStore>, pid: &'static str| async move {
            let request = crate::record::AppendRequest {
                persistence_id: pid.into(),
                expected_seq_nr: 0,
                writer: 1,
                events: vec![crate::codec::Payload::encode_as("n", 1, &1u64).unwrap()],
            };
            store.append(request).await
        };
        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        assert_eq!(idle.block_on(append(store.clone(), "first")), Ok(1));
        // `idle` lives on but nobody drives it from here on.
        let busy = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let answered = busy.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(30),
                append(store.clone(), "second"),
            )
            .await
        });
        assert_eq!(answered, Ok(Ok(1)), "the second write is answered");
        drop(idle);
    }

    /// A batch that panics in the writer fails its writes with an error that says so (not
    /// as a closed store), and the writer serves the next writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_batch_fails_its_writes_and_the_writer_serves_on() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = SqliteStore::open_with(dir.path().join("panic.db"), SqliteOptions::default())
            .expect("open the store");
        let append = |pid: &str, expected: u64| crate::record::AppendRequest {
            persistence_id: pid.into(),
            expected_seq_nr: expected,
            writer: 1,
            events: vec![crate::codec::Payload::encode_as("n", 1, &expected).unwrap()],
        };
        assert_eq!(store.append(append("before", 0)).await, Ok(1));
        let failed = store.append(append(crate::batch::PANIC_ID, 0)).await;
        match failed {
            Err(crate::error::StoreError::Backend(m)) => {
                assert!(m.contains("panicked"), "{m}")
            }
            other => panic!("the panicking batch answered {other:?}"),
        }
        assert_eq!(store.append(append("before", 1)).await, Ok(2));
        assert_eq!(store.append(append("after", 0)).await, Ok(1));
        assert_eq!(store.highest_seq_nr("before").await, Ok(2));
        assert_eq!(
            store.highest_seq_nr(crate::batch::PANIC_ID).await,
            Ok(0),
            "the panicking batch wrote nothing"
        );
    }

    /// A read that panics fails alone, with an error that says so; its reader thread lives on
    /// and serves the next read (here the only one).
    #[tokio::test]
    async fn a_panicking_read_fails_alone_and_its_reader_serves_on() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let options = SqliteOptions {
            readers: 1,
            ..SqliteOptions::default()
        };
        let store =
            SqliteStore::open_with(dir.path().join("panic.db"), options).expect("open the store");
        let failed = store
            .read(|_| -> rusqlite::Result<u64> { panic!("a read that panics") })
            .await;
        assert_eq!(
            failed,
            Err(crate::error::StoreError::Backend(
                "an SQLite read panicked".into()
            ))
        );
        assert_eq!(store.highest_seq_nr("after-the-panic").await, Ok(0));
    }
}
