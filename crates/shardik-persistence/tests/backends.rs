//! The store suite (`suite/mod.rs`) against every backend.
//!
//! PostgreSQL runs when `SHARDIK_PG_URL` names a server (see
//! `scripts/start-test-postgres.sh`); otherwise its tests print that they were skipped, and
//! with `SHARDIK_REQUIRE_PG=1` they fail instead (for CI).

mod common;
mod suite;

use std::sync::Arc;
use std::time::Duration;

use shardik_persistence::{
    InMemoryStore, Journal, Persistence, PostgresOptions, PostgresStore, PostgresTls,
    SnapshotStore, SqliteStore, StateRecord, StateStore, StateWrite, StoreFuture,
};

/// Keeps a backend's resources (a temporary directory) alive for one test.
type Guard = Box<dyn std::any::Any + Send>;

async fn memory() -> Option<(Arc<InMemoryStore>, Guard)> {
    Some((Arc::new(InMemoryStore::new()), Box::new(())))
}

async fn sqlite() -> Option<(Arc<SqliteStore>, Guard)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("suite.db")).expect("open SQLite");
    Some((Arc::new(store), Box::new(dir)))
}

/// The URL of the PostgreSQL server to test against, or `None` (said once on stderr).
fn pg_url() -> Option<String> {
    common::pg_env("SHARDIK_PG_URL", "PostgreSQL tests")
}

/// A fresh schema name per call, so tests sharing one server do not see each other.
fn pg_schema() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("t_{}_{nanos}_{n}", std::process::id())
}

async fn pg_store(url: &str, schema: String) -> Arc<PostgresStore> {
    let options = PostgresOptions {
        schema,
        pool_size: 4,
        ..PostgresOptions::default()
    };
    let store = PostgresStore::connect_with(url, options)
        .await
        .expect("connect to SHARDIK_PG_URL");
    Arc::new(store)
}

/// Two stores on one fresh schema, as two nodes would be.
async fn pg_pair(url: &str) -> (Arc<PostgresStore>, Arc<PostgresStore>) {
    let schema = pg_schema();
    (
        pg_store(url, schema.clone()).await,
        pg_store(url, schema).await,
    )
}

/// Two stores on one SQLite file (named `file` in a temporary directory), as two processes
/// on one machine would be.
fn sqlite_pair(file: &str) -> (tempfile::TempDir, Arc<SqliteStore>, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    let a = Arc::new(SqliteStore::open(&path).unwrap());
    let b = Arc::new(SqliteStore::open(&path).unwrap());
    (dir, a, b)
}

/// `url` with `application_name` set to `name`, so the test can find the store's
/// connections in `pg_stat_activity`.
fn tagged(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// A plain client of the test server, for looking at (or cutting) a store's connections;
/// await the handle after dropping the client.
async fn admin(
    url: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to SHARDIK_PG_URL");
    (client, tokio::spawn(connection))
}

/// A store in a fresh schema of the server at `SHARDIK_PG_URL`, or `None` without one.
async fn postgres() -> Option<(Arc<PostgresStore>, Guard)> {
    let url = pg_url()?;
    Some((pg_store(&url, pg_schema()).await, Box::new(())))
}
store_suite!(memory_backend, crate::memory);
store_suite!(sqlite_backend, crate::sqlite);
store_suite!(postgres_backend, crate::postgres);

/// The in-memory store cannot hold a revision no write can follow (it counts revisions up
/// from 0 in a `u64`): this view of one reports such a revision for the ids marked corrupt,
/// as SQLite and PostgreSQL read back a stored negative one.
struct CorruptRevisions {
    store: Arc<InMemoryStore>,
    corrupt: parking_lot::Mutex<Vec<(String, u64)>>,
}

impl StateStore for CorruptRevisions {
    fn upsert(&self, write: StateWrite) -> StoreFuture<'_, u64> {
        self.store.upsert(write)
    }

    fn get<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, Option<StateRecord>> {
        Box::pin(async move {
            let mut record = self.store.get(persistence_id).await?;
            let corrupt = self
                .corrupt
                .lock()
                .iter()
                .find_map(|(id, revision)| (id == persistence_id).then_some(*revision));
            if let (Some(r), Some(revision)) = (record.as_mut(), corrupt) {
                r.revision = revision;
            }
            Ok(record)
        })
    }

    fn delete<'a>(&'a self, persistence_id: &'a str, expected: u64) -> StoreFuture<'a, ()> {
        self.store.delete(persistence_id, expected)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_durable_state_with_a_corrupt_revision_does_not_load() {
    let memory = Arc::new(InMemoryStore::new());
    let states = Arc::new(CorruptRevisions {
        store: memory.clone(),
        corrupt: Default::default(),
    });
    let persistence = Persistence::from_parts(memory.clone(), memory, states.clone());
    suite::a_durable_state_with_a_corrupt_revision_does_not_load(
        states,
        persistence,
        |states, pid, stored| async move {
            // As SQLite and PostgreSQL read a stored negative number back.
            states.corrupt.lock().push((pid.to_string(), stored as u64))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_durable_state_with_a_corrupt_revision_does_not_load() {
    let (store, _dir) = sqlite().await.unwrap();
    let persistence = common::persistence(store.clone());
    suite::a_durable_state_with_a_corrupt_revision_does_not_load(
        store,
        persistence,
        |store, pid, stored| async move {
            let db = rusqlite::Connection::open(store.path()).unwrap();
            let changed = db
                .execute(
                    "UPDATE durable_state SET revision = ?2 WHERE persistence_id = ?1",
                    rusqlite::params![pid, stored],
                )
                .unwrap();
            assert_eq!(changed, 1);
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_durable_state_with_a_corrupt_revision_does_not_load() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let store = pg_store(&url, schema.clone()).await;
    let persistence = common::persistence(store.clone());
    suite::a_durable_state_with_a_corrupt_revision_does_not_load(
        store,
        persistence,
        |_, pid, stored| {
            let (url, schema) = (url.clone(), schema.clone());
            async move {
                let (admin, connection) = admin(&url).await;
                let changed = admin
                    .execute(
                        &format!(
                            "UPDATE {schema}.durable_state SET revision = $2 \
                             WHERE persistence_id = $1"
                        ),
                        &[&pid, &stored],
                    )
                    .await
                    .unwrap();
                assert_eq!(changed, 1);
                drop(admin);
                connection.await.unwrap().unwrap();
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_event_sourced_entity_with_a_corrupt_position_does_not_recover() {
    let (store, _dir) = sqlite().await.unwrap();
    suite::an_event_sourced_entity_with_a_corrupt_position_does_not_recover(
        store,
        |store, pid, stored| async move {
            let db = rusqlite::Connection::open(store.path()).unwrap();
            for table in ["journal", "snapshots"] {
                let changed = db
                    .execute(
                        &format!("UPDATE {table} SET seq_nr = ?2 WHERE persistence_id = ?1"),
                        rusqlite::params![pid, stored],
                    )
                    .unwrap();
                assert_eq!(changed, 1, "{table}");
            }
            let changed = db
                .execute(
                    "UPDATE journal_meta SET highest_seq_nr = ?2 WHERE persistence_id = ?1",
                    rusqlite::params![pid, stored],
                )
                .unwrap();
            assert_eq!(changed, 1);
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_event_sourced_entity_with_a_corrupt_position_does_not_recover() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let store = pg_store(&url, schema.clone()).await;
    suite::an_event_sourced_entity_with_a_corrupt_position_does_not_recover(
        store,
        |_, pid, stored| {
            let (url, schema) = (url.clone(), schema.clone());
            async move {
                let (admin, connection) = admin(&url).await;
                // The stream's position is its highest journal row.
                for table in ["journal", "snapshots"] {
                    let changed = admin
                        .execute(
                            &format!(
                                "UPDATE {schema}.{table} SET seq_nr = $2 \
                                 WHERE persistence_id = $1"
                            ),
                            &[&pid, &stored],
                        )
                        .await
                        .unwrap();
                    assert_eq!(changed, 1, "{table}");
                }
                drop(admin);
                connection.await.unwrap().unwrap();
            }
        },
    )
    .await;
}

/// SQLite groups concurrent writes into shared transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_groups_concurrent_writes_into_few_transactions() {
    let (store, _dir) = sqlite().await.unwrap();
    suite::batching_many_concurrent_writers(store.clone()).await;
    let stats = store.writer_stats();
    assert_eq!(stats.writes, 100 * 20);
    assert!(
        stats.transactions < stats.writes / 2,
        "expected batching, got {stats:?}"
    );
}

/// PostgreSQL groups concurrent writes into shared transactions too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_groups_concurrent_writes_into_few_transactions() {
    let Some((store, _guard)) = postgres().await else {
        return;
    };
    suite::batching_many_concurrent_writers(store.clone()).await;
    let stats = store.writer_stats();
    assert_eq!(stats.writes, 100 * 20);
    assert!(
        stats.transactions < stats.writes / 2,
        "expected batching, got {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_stores_one_file_race_on_one_stream() {
    let (_dir, a, b) = sqlite_pair("race.db");
    suite::two_stores_one_stream(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_one_schema_race_on_one_stream() {
    let Some(url) = pg_url() else {
        return;
    };
    let (first, second) = pg_pair(&url).await;
    suite::two_stores_one_stream(first, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_stores_one_file_take_turns_on_one_stream() {
    let (_dir, a, b) = sqlite_pair("turns.db");
    suite::two_stores_take_turns_on_one_stream(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_one_schema_take_turns_on_one_stream() {
    let Some(url) = pg_url() else {
        return;
    };
    let (first, second) = pg_pair(&url).await;
    suite::two_stores_take_turns_on_one_stream(first.clone(), second).await;
    // The first store's lane remembered position 2 when the other store had moved the
    // stream to 3: its append there was refused by the primary key, then checked again.
    assert!(
        first.writer_stats().retries >= 1,
        "{:?}",
        first.writer_stats()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_stores_one_file_stale_writer_behind_deleted_events() {
    let (_dir, a, b) = sqlite_pair("gone.db");
    suite::a_stale_writer_behind_deleted_events_is_refused(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_one_schema_stale_writer_behind_deleted_events() {
    let Some(url) = pg_url() else {
        return;
    };
    let (first, second) = pg_pair(&url).await;
    suite::a_stale_writer_behind_deleted_events_is_refused(first, second).await;
}

/// A stale writer appends at the position its lane remembers while another node's deletion
/// of the rows after it is still in progress. The append's probe sees those rows (the
/// deletion has not committed) and the batch goes again with positions read afresh: the
/// append is refused as fenced. Before, the row was written at the first later row's
/// position for the primary key to refuse, waited for the deletion, which removed that row,
/// and went in: an acknowledged append below the other writer's snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stale_writer_racing_a_deletion_in_progress_is_refused() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let stale = pg_store(&tagged(&url, &schema), schema.clone()).await;
    let newer = pg_store(&url, schema.clone()).await;
    assert_eq!(stale.append(suite::append("s", 0, 1, &[1])).await, Ok(1));
    for seq in 1..4 {
        assert_eq!(
            newer.append(suite::append("s", seq, 2, &[seq + 1])).await,
            Ok(seq + 1)
        );
    }
    let (deleter, deleter_connection) = admin(&url).await;
    let (admin, connection) = admin(&url).await;
    deleter
        .batch_execute(&format!(
            "BEGIN; DELETE FROM {schema}.journal WHERE persistence_id = 's' AND seq_nr <= 3"
        ))
        .await
        .expect("delete in an open transaction");
    let append = tokio::spawn({
        let stale = stale.clone();
        async move { stale.append(suite::append("s", 1, 1, &[20])).await }
    });
    // The append is answered, or waits for the deletion's locks (as it did before).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !append.is_finished() && waiting_on_locks(&admin, &schema).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the append neither ended nor waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    deleter
        .batch_execute("COMMIT")
        .await
        .expect("commit the deletion");
    assert_eq!(
        append.await.unwrap(),
        Err(shardik_persistence::StoreError::Fenced {
            persistence_id: "s".into(),
            writer: 1,
            current: 2
        })
    );
    assert_eq!(suite::amounts(&*newer, "s", 1).await, [(4, 4)]);
    assert!(
        stale.writer_stats().retries >= 1,
        "{:?}",
        stale.writer_stats()
    );
    drop((deleter, admin));
    deleter_connection.await.unwrap().unwrap();
    connection.await.unwrap().unwrap();
}

/// An empty append (it only checks the position) in one batch with a deletion of another
/// stream's events: both succeed. The batch once wrote a deleted-marker row at the empty
/// append's unchanged position, which the primary key refused, failing every write of it.
#[tokio::test] // one thread: both writes are queued before the writer lane takes a batch
async fn postgres_empty_append_beside_a_deletion_in_one_batch() {
    let Some(url) = pg_url() else {
        return;
    };
    let options = PostgresOptions {
        schema: pg_schema(),
        pool_size: 2,
        writers: 1,
        ..PostgresOptions::default()
    };
    let store = PostgresStore::connect_with(&url, options).await.unwrap();
    assert_eq!(store.append(suite::append("y", 0, 1, &[1])).await, Ok(1));
    assert_eq!(store.append(suite::append("x", 0, 1, &[1, 2])).await, Ok(2));
    let before = store.writer_stats();
    let (empty, deleted) = tokio::join!(
        store.append(suite::append("y", 1, 1, &[])),
        store.delete_up_to("x", 1),
    );
    assert_eq!(empty, Ok(1));
    deleted.unwrap();
    let after = store.writer_stats();
    assert_eq!(after.transactions, before.transactions + 1, "one batch");
    assert_eq!(after.retries, before.retries, "{after:?}");
    assert_eq!(store.highest_seq_nr("y").await, Ok(1));
    assert_eq!(store.highest_seq_nr("x").await, Ok(2));
    assert_eq!(store.read("x", 1, 10).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_stores_one_file_race_on_one_state() {
    let (_dir, a, b) = sqlite_pair("state-race.db");
    suite::two_stores_one_state(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_nodes_one_schema_race_on_one_state() {
    let Some(url) = pg_url() else {
        return;
    };
    let (first, second) = pg_pair(&url).await;
    suite::two_stores_one_state(first, second).await;
}

/// PostgreSQL text cannot hold NUL: such a write is refused alone, the others queued with it
/// are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_an_unstorable_write_alone() {
    let Some((store, _guard)) = postgres().await else {
        return;
    };
    let (bad, good) = tokio::join!(
        store.append(suite::append("nul\0id", 0, 1, &[1])),
        store.append(suite::append("fine", 0, 1, &[2]))
    );
    assert!(
        matches!(bad, Err(shardik_persistence::StoreError::Backend(_))),
        "{bad:?}"
    );
    assert_eq!(good, Ok(1));
    assert_eq!(suite::amounts(&*store, "fine", 1).await, [(1, 2)]);
}

/// The sharding replica records are in the file: a reopened store loads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sharding_state_survives_reopening_the_file() {
    use shardik_sharding::cluster::{RecordKey, ShardingRecord, ShardingStateStore};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let record = ShardingRecord {
        key: RecordKey::Entities {
            type_name: "t".into(),
            shard: 5,
        },
        rank: (3, 4),
        bytes: b"ids".to_vec(),
    };
    {
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.save_record("n1", &record).await, Ok(true));
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        ShardingStateStore::load_records(&store, "n1").await,
        Ok(vec![record])
    );
}

/// A schema written by an older version kept stream positions in a `journal_meta` table;
/// connecting converts them, so a stream whose events were all deleted keeps its position
/// and its newest writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_converts_a_schema_with_a_position_table() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to SHARDIK_PG_URL");
    let connection = tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.journal (
                 persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL, writer BIGINT NOT NULL,
                 type_name TEXT NOT NULL, version BIGINT NOT NULL, payload BYTEA NOT NULL,
                 written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                 PRIMARY KEY (persistence_id, seq_nr));
             CREATE TABLE {schema}.journal_meta (
                 persistence_id TEXT PRIMARY KEY, highest_seq_nr BIGINT NOT NULL,
                 writer BIGINT NOT NULL);
             INSERT INTO {schema}.journal_meta VALUES ('emptied', 4, 7), ('kept', 1, 2);"
        ))
        .await
        .expect("create the old tables");
    let event = suite::ev(5);
    client
        .execute(
            &format!(
                "INSERT INTO {schema}.journal
                 (persistence_id, seq_nr, writer, type_name, version, payload)
                 VALUES ('kept', 1, 2, $1, $2, $3)"
            ),
            &[&event.type_name, &i64::from(event.version), &event.bytes],
        )
        .await
        .expect("write the old event");
    drop(client);
    connection.await.unwrap().unwrap();

    let store = pg_store(&url, schema).await;
    assert_eq!(store.highest_seq_nr("emptied").await, Ok(4));
    assert!(suite::amounts(&*store, "emptied", 1).await.is_empty());
    assert!(matches!(
        store.append(suite::append("emptied", 4, 6, &[1])).await,
        Err(shardik_persistence::StoreError::Fenced { current: 7, .. })
    ));
    assert_eq!(
        store.append(suite::append("emptied", 4, 7, &[1])).await,
        Ok(5)
    );
    assert_eq!(suite::amounts(&*store, "kept", 1).await, [(1, 5)]);
    assert_eq!(store.append(suite::append("kept", 1, 2, &[6])).await, Ok(2));
}

/// Connecting to a schema that is up to date takes no lock on the journal: a node starting
/// while another one's transaction reads the journal does not wait for it (nor queue that
/// node's writers behind itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connecting_to_an_up_to_date_schema_takes_no_table_lock() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let first = pg_store(&url, schema.clone()).await;
    first.append(suite::append("x", 0, 1, &[1])).await.unwrap();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to SHARDIK_PG_URL");
    let connection = tokio::spawn(connection);
    client.batch_execute("BEGIN").await.unwrap();
    client
        .query(&format!("SELECT count(*) FROM {schema}.journal"), &[])
        .await
        .expect("read the journal in an open transaction");
    // An `ALTER TABLE` would wait for that transaction to end, which it does only below.
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        pg_store(&url, schema.clone()),
    )
    .await
    .expect("the second store connected while the journal was being read");
    assert_eq!(second.highest_seq_nr("x").await, Ok(1));
    client.batch_execute("COMMIT").await.unwrap();
    drop(client);
    connection.await.unwrap().unwrap();
}

/// Nodes starting at the same time against a fresh schema all connect: creating the schema
/// and its tables is serialized (PostgreSQL's `IF NOT EXISTS` alone does not make concurrent
/// creation safe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nodes_starting_together_on_a_fresh_schema_all_connect() {
    let Some(url) = pg_url() else {
        return;
    };
    for _ in 0..5 {
        let schema = pg_schema();
        let connects: Vec<_> = (0..4)
            .map(|_| {
                let options = PostgresOptions {
                    schema: schema.clone(),
                    pool_size: 2,
                    ..PostgresOptions::default()
                };
                let url = url.clone();
                tokio::spawn(async move { PostgresStore::connect_with(&url, options).await })
            })
            .collect();
        for connect in connects {
            let store = connect.await.unwrap().expect("every node connects");
            assert_eq!(store.highest_seq_nr("nobody").await, Ok(0));
        }
    }
}

/// Processes opening one fresh SQLite file at the same time all open it.
#[test]
fn sqlite_stores_opening_one_fresh_file_together_all_open() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("together-{round}.db"));
        let opens: Vec<_> = (0..4)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || SqliteStore::open(&path).map(drop))
            })
            .collect();
        for open in opens {
            open.join().unwrap().expect("every store opens the file");
        }
    }
}

/// When PostgreSQL drops the store's connections (a server restart, a failover, an
/// administrator), writes go on over new connections: a batch that finds its pooled
/// connection closed is written again on another, and no write is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_go_on_after_the_server_drops_the_connections() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let tagged = tagged(&url, &schema);
    let store = pg_store(&tagged, schema.clone()).await;
    let (admin, connection) = admin(&url).await;
    // Whether a batch or read meets a dropped connection or the pool has already noticed
    // it is a race, so cut them several times; before batches and reads went on over
    // another connection, most runs failed here.
    for round in 0..5u64 {
        // Use every lane and several pooled connections, then cut them all.
        let ids: Vec<String> = (0..16).map(|i| format!("cut-{i}")).collect();
        let appends = ids
            .iter()
            .map(|pid| store.append(suite::append(pid, round, 1, &[round])));
        for done in futures_util::future::join_all(appends).await {
            assert_eq!(done, Ok(round + 1), "round {round}");
        }
        let cut = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                &[&schema],
            )
            .await
            .expect("terminate the store's connections");
        assert!(!cut.is_empty(), "the store had connections to cut");
    }
    for i in 0..16 {
        let pid = format!("cut-{i}");
        assert_eq!(store.highest_seq_nr(&pid).await, Ok(5));
        assert_eq!(
            suite::amounts(&*store, &pid, 1).await,
            [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
        );
    }
    drop(admin);
    connection.await.unwrap().unwrap();
}

/// How many of the connections tagged `name` (see [`tagged`]) wait for a lock.
async fn waiting_on_locks(admin: &tokio_postgres::Client, name: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
            &[&name],
        )
        .await
        .expect("read pg_stat_activity")
        .get(0)
}

/// Waits until `count` of the connections tagged `name` wait for a lock (a state of the
/// server, which no event announces: polled, for at most 10 s). `admin` must not be inside a
/// transaction: PostgreSQL shows a transaction the activity it saw first, all along.
async fn until_waiting_on_locks(admin: &tokio_postgres::Client, name: &str, count: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = waiting_on_locks(admin, name).await;
        if waiting == count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{waiting} connections wait for a lock, expected {count}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Writes one after another reuse the writer connection that was returned last (the pools
/// hand connections out last in, first out), so the server backend that runs a batch is the
/// one that ran the previous batch, its caches warm. Handing out the connection idle longest
/// instead sent consecutive batches round every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_one_after_another_reuse_one_connection() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let store = pg_store(&tagged(&url, &schema), schema.clone()).await;
    let (locker, locker_connection) = admin(&url).await;
    let (admin, connection) = admin(&url).await;
    // Both lanes write at once, each on a connection of its own: while a lock holds their
    // inserts, the writers' pool has to open two.
    locker
        .batch_execute(&format!("BEGIN; LOCK TABLE {schema}.journal IN SHARE MODE"))
        .await
        .expect("lock the journal");
    let first: Vec<_> = (0..16u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let pid = format!("both-lanes-{i}");
                store.append(suite::append(&pid, 0, 1, &[i])).await
            })
        })
        .collect();
    until_waiting_on_locks(&admin, &schema, 2).await;
    locker.batch_execute("COMMIT").await.expect("unlock");
    for append in first {
        assert_eq!(append.await.expect("an append task"), Ok(1));
    }
    let since: std::time::SystemTime = admin
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .expect("the server's clock")
        .get(0);
    for i in 0..20u64 {
        let pid = format!("one-after-another-{i}");
        assert_eq!(store.append(suite::append(&pid, 0, 1, &[i])).await, Ok(1));
    }
    let used: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND state_change > $2",
            &[&schema, &since],
        )
        .await
        .expect("read pg_stat_activity")
        .get(0);
    assert_eq!(used, 1, "connections used by 20 writes one after another");
    drop((admin, locker));
    connection.await.unwrap().unwrap();
    locker_connection.await.unwrap().unwrap();
}

/// Writes do not wait behind reads: with every read connection held by a read that waits
/// (here on a lock; in production, many entities recovering at once), appends still commit
/// on the writer lanes' own connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_go_on_while_reads_hold_every_connection() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = pg_schema();
    let options = PostgresOptions {
        schema: schema.clone(),
        pool_size: 2,
        ..PostgresOptions::default()
    };
    let store = Arc::new(
        PostgresStore::connect_with(&tagged(&url, &schema), options)
            .await
            .expect("connect to SHARDIK_PG_URL"),
    );
    let (locker, locker_connection) = admin(&url).await;
    let (admin, connection) = admin(&url).await;
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {schema}.snapshots IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .expect("lock the snapshots");
    // Four snapshot reads: two hold the read connections, waiting for the lock; two wait
    // for a connection.
    let reads: Vec<_> = (0..4)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.load_latest(&format!("reader-{i}")).await })
        })
        .collect();
    until_waiting_on_locks(&admin, &schema, 2).await;
    for i in 0..10u64 {
        let pid = format!("written-meanwhile-{i}");
        let append = store.append(suite::append(&pid, 0, 1, &[i]));
        let done = tokio::time::timeout(Duration::from_secs(10), append).await;
        assert_eq!(
            done,
            Ok(Ok(1)),
            "append {i} while reads hold every read connection"
        );
    }
    locker.batch_execute("COMMIT").await.expect("unlock");
    for read in reads {
        assert!(matches!(read.await.expect("a read task"), Ok(None)));
    }
    drop((admin, locker));
    connection.await.unwrap().unwrap();
    locker_connection.await.unwrap().unwrap();
}

/// The CA that signed the test server's certificate (`SHARDIK_PG_CA`, written by
/// `scripts/start-test-postgres.sh` through `PG_CA_OUT`), or `None` (said on stderr).
fn pg_ca() -> Option<String> {
    common::pg_env("SHARDIK_PG_CA", "the PostgreSQL TLS test")
}

/// A CA that signed nothing the test server uses.
const OTHER_CA: &str = "-----BEGIN CERTIFICATE-----\n\
MIIBiDCCAS2gAwIBAgIUNZOcXxKhG78SD2hyLqo0vmGVIpswCgYIKoZIzj0EAwIw\n\
GDEWMBQGA1UEAwwNc29tZS1vdGhlci1jYTAgFw0yNjExMjUyMDM1MDRaGA8yMTI2\n\
MTEwMTIwMzUwNFowGDEWMBQGA1UEAwwNc29tZS1vdGhlci1jYTBZMBMGByqGSM49\n\
AgEGCCqGSM49AwEHA0IABL3dIl0zal6/WiFHs+/cvcNUSB26e2xr9vygLDVtrOHZ\n\
6Yw5I8kIKs7RP/K06hTW+5Xj0h2OwFl0nMpGYsF6YhqjUzBRMB0GA1UdDgQWBBSo\n\
DZ/Rlj0pBhTwWoyVWiHmlN9M+DAfBgNVHSMEGDAWgBSoDZ/Rlj0pBhTwWoyVWiHm\n\
lN9M+DAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQDq2x1sWQqB\n\
h+pscKpXpcrrp7jTHa4RTROa4l90ChhuNAIhANWmKaavgoF6XIDOYOMF5G8POmly\n\
4LZrQ8WRR+oCeJoF\n\
-----END CERTIFICATE-----";

/// A store configured with TLS talks to the server over TLS only, verifies the server's
/// certificate, and refuses a server whose certificate another CA signed, with an error that
/// says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verifies_the_server() {
    let Some(url) = pg_url() else {
        return;
    };
    let Some(ca) = pg_ca() else {
        return;
    };
    let schema = pg_schema();
    let tagged = tagged(&url, &schema);
    let options = PostgresOptions {
        schema: schema.clone(),
        pool_size: 2,
        tls: Some(PostgresTls::from_ca_pem_file(&ca).expect("the test CA loads")),
        ..PostgresOptions::default()
    };
    let store = PostgresStore::connect_with(&tagged, options)
        .await
        .expect("connect over TLS");
    assert_eq!(store.append(suite::append("tls", 0, 1, &[7])).await, Ok(1));
    assert_eq!(suite::amounts(&store, "tls", 1).await, [(1, 7)]);

    let (admin, connection) = admin(&url).await;
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s USING (pid)
             WHERE a.application_name = $1",
            &[&schema],
        )
        .await
        .expect("read the store's connections");
    assert!(!rows.is_empty(), "the store has connections");
    assert!(
        rows.iter().all(|r| r.get::<_, bool>(0)),
        "every connection of the store is encrypted"
    );
    drop(admin);
    connection.await.unwrap().unwrap();

    let untrusted = PostgresOptions {
        schema,
        tls: Some(PostgresTls::from_ca_pem(OTHER_CA.as_bytes()).expect("the other CA loads")),
        ..PostgresOptions::default()
    };
    let refused = PostgresStore::connect_with(&url, untrusted)
        .await
        .expect_err("a server certificate from another CA is refused");
    assert!(
        refused.to_string().contains("certificate"),
        "the error says why: {refused}"
    );
}
