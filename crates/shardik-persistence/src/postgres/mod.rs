//! [`PostgresStore`]: journal, snapshots and durable state in PostgreSQL, for nodes on
//! several machines.
//!
//! Writes go through writer tasks (lanes; all writes of one persistence id go through the
//! same one) that each group whatever is queued into one transaction of a few set-based
//! statements, on a connection of their own (a pool of one per lane); reads use a pool of
//! their own, so a burst of reads never holds the connections writes need.
//!
//! A stream's position is its highest journal row. Appends are checked optimistically: a
//! lane reads the positions it does not know (it remembers the ones it committed), checks
//! every write with the same rules as every backend, and inserts the events; the journal's
//! primary key refuses a second row at one position, so two writers on different nodes
//! cannot both append at one position, and a batch that lost such a race is checked again
//! against what the database holds. An append therefore writes one row per event and takes
//! no lock. Durable states are checked under row locks (`SELECT … FOR UPDATE`).

mod known;
mod sharding;
mod sql;
mod tls;
mod writer;

pub use tls::PostgresTls;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::mpsc;
use tokio_postgres::NoTls;

use crate::batch::{Counters, Op, Reply, WriterStats};
use crate::codec::Payload;
use crate::error::StoreError;
use crate::record::{AppendRequest, PersistedEvent, SnapshotRecord, StateRecord, StateWrite};
use crate::store::{Journal, SnapshotStore, StateStore, StoreFuture};
use sql::Sql;

/// Settings of a [`PostgresStore`].
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// The schema holding the tables, created if missing (default `"shardik"`): a plain
    /// lower-case identifier.
    pub schema: String,
    /// Connections for reads (default 8). The writer lanes have connections of their own,
    /// one per lane, so writes never wait for a connection behind reads (such as many
    /// entities recovering at once); a store opens at most `pool_size + writers` (0 counts
    /// as 1).
    pub pool_size: usize,
    /// Most writes grouped into one transaction (default 1024; 0 counts as 1).
    pub max_batch: usize,
    /// Writer lanes (default 2): each writes its own batches on its own connection, so
    /// PostgreSQL works on several batches at once. A persistence id always goes through
    /// the same lane, so its writes keep their order (0 counts as 1).
    pub writers: usize,
    /// Stream positions each writer lane remembers (default 100 000; 0 remembers none). An
    /// append that continues a position its lane committed is written without reading the
    /// position first; any other append reads it in its batch's transaction. Positions are
    /// kept in two generations of half this size each (rounded up), so what is forgotten
    /// first is what went unused for a whole generation. About 60 bytes per stream (ids of up to 24 bytes
    /// are stored inline).
    pub known_positions: usize,
    /// TLS to the server (default `None`: plaintext, as `NoTls`). With TLS, a URL without
    /// `sslmode` (or with `prefer`) means `require`. See [`PostgresTls`].
    pub tls: Option<PostgresTls>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            schema: "shardik".into(),
            pool_size: 8,
            max_batch: 1024,
            writers: 2,
            known_positions: 100_000,
            tls: None,
        }
    }
}

/// A [`Journal`], [`SnapshotStore`], [`StateStore`] and
/// [`ShardingStateStore`](shardik_sharding::cluster::ShardingStateStore) in PostgreSQL,
/// over plaintext or TLS ([`PostgresOptions::tls`]). Nodes sharing one schema each see only
/// their own sharding records (keyed by node id).
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    lanes: Vec<mpsc::UnboundedSender<Op>>,
    stats: Arc<Counters>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

/// A store error for a PostgreSQL error, with what the server said if it said anything
/// (tokio-postgres's own text for a server error is just "db error").
pub(super) fn backend(e: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(match e.as_db_error() {
        Some(db) => {
            let mut text = format!(
                "postgres: {} {}: {}",
                db.severity(),
                db.code().code(),
                db.message()
            );
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            text
        }
        None => format!("postgres: {}", with_causes(&e)),
    })
}

/// True if `e` means the connection is gone (closed, broken, or ended by the server: a
/// restart, a failover, an administrator), so a request can only go on over another one.
/// Repeating a batch there is safe even if its commit had reached the server before the
/// connection broke: its appends would then be refused by the position check, never written
/// twice.
pub(super) fn connection_lost(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        // Class 08: connection exception; 57P01-57P03: the server is shutting down or
        // starting up.
        let code = code.code();
        return code.starts_with("08") || code.starts_with("57P");
    }
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

pub(super) fn pool_error(e: impl std::error::Error) -> StoreError {
    StoreError::Backend(format!("postgres pool: {}", with_causes(&e)))
}

/// `e` and its sources, outermost first ("error performing TLS handshake: invalid peer
/// certificate: UnknownIssuer"), skipping a source whose text its parent already shows.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

pub(super) fn to_i64(v: u64) -> i64 {
    v as i64
}

pub(super) fn to_u64(v: i64) -> u64 {
    v as u64
}

/// How long opening a connection may take unless the URL says (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long sent data may go unacknowledged before the connection is dropped, unless the URL
/// says (`tcp_user_timeout`).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle time before the first keepalive probe, unless the URL says (`keepalives_idle`).
const KEEPALIVES_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes, unless the URL says (`keepalives_interval`).
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered keepalive probes that end a connection, unless the URL says
/// (`keepalives_retries`).
const KEEPALIVES_RETRIES: u32 = 3;

/// The connection settings of `url`, with the store's defaults for what the URL leaves out
/// (see [`PostgresStore::connect_with`]), and TLS required if `tls` and the URL leaves it
/// optional.
fn connection_config(url: &str, tls: bool) -> Result<tokio_postgres::Config, StoreError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(backend)?;
    // Asking for TLS and accepting plaintext would be a silent downgrade.
    if tls && config.get_ssl_mode() == tokio_postgres::config::SslMode::Prefer {
        config.ssl_mode(tokio_postgres::config::SslMode::Require);
    }
    // As would asking for TLS and connecting in plaintext because the URL says so: the two
    // contradict each other, and which one was meant is the operator's call.
    if tls && config.get_ssl_mode() == tokio_postgres::config::SslMode::Disable {
        return Err(StoreError::Backend(
            "configuration error: PostgresOptions::tls is set but the URL says \
             sslmode=disable (plaintext); remove sslmode=disable (or use sslmode=require) to \
             connect over TLS, or unset PostgresOptions::tls to connect in plaintext"
                .into(),
        ));
    }
    // Without these, a connection to a host that vanished (a failover that moved a virtual
    // IP) hangs whatever uses it until the kernel gives up retransmitting, about 15 minutes,
    // and an idle pooled one is found dead only when used. A value the URL gives is kept,
    // 0 included (tokio-postgres reads it as unset: no limit, as in libpq): a parameter
    // counts as given if the parsed value differs from the driver's default (however the
    // URL spelled its name) or if the URL names it.
    if !(config.get_connect_timeout().is_some() || url_sets(url, "connect_timeout")) {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if !(config.get_tcp_user_timeout().is_some() || url_sets(url, "tcp_user_timeout")) {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if !(config.get_keepalives_idle() != DRIVER_KEEPALIVES_IDLE || url_sets(url, "keepalives_idle"))
    {
        config.keepalives_idle(KEEPALIVES_IDLE);
    }
    if !(config.get_keepalives_interval().is_some() || url_sets(url, "keepalives_interval")) {
        config.keepalives_interval(KEEPALIVES_INTERVAL);
    }
    if !(config.get_keepalives_retries().is_some() || url_sets(url, "keepalives_retries")) {
        config.keepalives_retries(KEEPALIVES_RETRIES);
    }
    Ok(config)
}

/// tokio-postgres's keepalive idle time when the URL gives none.
const DRIVER_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// True if connection string `url` (a URL's query, or `key=value` pairs) names parameter
/// `key`, whatever its value.
fn url_sets(url: &str, key: &str) -> bool {
    url.split(|c: char| c == '?' || c == '&' || c.is_whitespace())
        .any(|part| part.split('=').next().is_some_and(|k| k.trim() == key))
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db`) with default options, creating the
    /// schema and tables if needed. Must run inside a tokio runtime: the writer lanes and the
    /// connections are tasks on it, so every use of the store waits while that runtime does
    /// not run (open it on the application's multi-thread runtime, not on a current-thread
    /// runtime that is only driven now and then).
    ///
    /// Connections time out unless the URL says otherwise; see
    /// [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects to `url` with `options`.
    ///
    /// So that a connection to a server that vanished (a failover that moved a virtual IP, a
    /// host gone without closing its connections) fails within seconds instead of hanging a
    /// writer lane or a read for the kernel's retransmission timeout (about 15 minutes), these
    /// apply unless the URL gives the parameter (a value it gives is kept, as tokio-postgres
    /// reads it: `connect_timeout=0` or `tcp_user_timeout=0` means no limit, as in libpq):
    /// `connect_timeout` 10 s, `tcp_user_timeout` 30 s (sent data unacknowledged that long
    /// ends the connection), `keepalives_idle` 30 s (tokio-postgres's default is 2 hours),
    /// `keepalives_interval` 10 s and `keepalives_retries` 3 (an idle connection to a host
    /// that vanished is found dead after about a minute). For example
    /// `postgres://app@db/app?connect_timeout=30&keepalives_idle=60`.
    pub async fn connect_with(
        url: &str,
        options: PostgresOptions,
    ) -> Result<PostgresStore, StoreError> {
        if !sql::valid_identifier(&options.schema) {
            return Err(StoreError::Backend(format!(
                "invalid schema name {:?}: use lower-case letters, digits and _",
                options.schema
            )));
        }
        let config = connection_config(url, options.tls.is_some())?;
        let manager = || {
            let recycling = ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            };
            match &options.tls {
                None => Manager::from_config(config.clone(), NoTls, recycling),
                Some(tls) => {
                    let connect =
                        tokio_postgres_rustls::MakeRustlsConnect::new((*tls.client).clone());
                    Manager::from_config(config.clone(), connect, recycling)
                }
            }
        };
        // Two pools: reads, and the writer lanes' own (one connection per lane), so that a
        // burst of reads cannot hold every connection while writes wait for one.
        // Last in, first out: the next batch or read gets the connection returned last, so
        // the server backend that runs it has its caches warm and the server keeps few
        // processes busy. First in, first out sent consecutive batches round every pooled
        // connection (measured on the 10 000-entity benchmark: +9%, docs/persistence.md).
        // Idle connections deeper in the stack may be closed by the server meanwhile; a
        // batch or read that meets one goes on over another.
        let writers = options.writers.max(1);
        let pool = Pool::builder(manager())
            .max_size(options.pool_size.max(1))
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .build()
            .map_err(pool_error)?;
        let write_pool = Pool::builder(manager())
            .max_size(writers)
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .build()
            .map_err(pool_error)?;
        let sql = Arc::new(Sql::new(&options.schema));
        pool.get()
            .await
            .map_err(pool_error)?
            .batch_execute(&sql.ddl)
            .await
            .map_err(backend)?;
        let stats = Arc::new(Counters::default());
        let lanes = (0..writers)
            .map(|_| {
                let (lane, ops) = mpsc::unbounded_channel();
                tokio::spawn(writer::run(
                    write_pool.clone(),
                    sql.clone(),
                    ops,
                    options.max_batch.max(1),
                    options.known_positions,
                    stats.clone(),
                ));
                lane
            })
            .collect();
        Ok(PostgresStore {
            pool,
            sql,
            lanes,
            stats,
        })
    }

    /// How many writes were done in how many transactions so far.
    pub fn writer_stats(&self) -> WriterStats {
        self.stats.stats()
    }

    async fn write<T>(&self, make: impl FnOnce(Reply<T>) -> Op) -> Result<T, StoreError> {
        let (tx, rx) = Reply::channel("PostgreSQL");
        let op = make(tx);
        let lane = if self.lanes.len() == 1 {
            0
        } else {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(op.persistence_id(), &mut hasher);
            (std::hash::Hasher::finish(&hasher) % self.lanes.len() as u64) as usize
        };
        self.lanes[lane].send(op).map_err(|_| StoreError::Closed)?;
        // A slot dropped unanswered says so itself if its batch panicked: dropped
        // otherwise, the writer is gone.
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs one statement (which must be safe to repeat) on a pooled connection. A
    /// connection the server has dropped is only found out by using it: the statement then
    /// goes on over another (the pool drops closed ones), at most once per pooled connection.
    async fn query(
        &self,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let mut tries = self.pool.status().max_size + 1;
        loop {
            let in_use = InUse(Some(self.pool.get().await.map_err(pool_error)?));
            let client = in_use.client();
            let result = match client.prepare_cached(statement).await {
                Ok(stmt) => client.query(&stmt, params).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if connection_lost(&e) && tries > 1 => {
                    tries -= 1;
                    tracing::warn!(error = %e, "PostgreSQL connection lost; trying another");
                    drop(in_use); // out of the pool
                }
                result => {
                    drop(in_use.release());
                    return result.map_err(backend);
                }
            }
        }
    }
}

/// A pooled connection a request uses: back to the pool once the request ended, and out of
/// it (closed) if the request is dropped before (a caller's timeout): its statement may still
/// run on the server, and the next request on that connection would wait behind it.
struct InUse(Option<deadpool_postgres::Object>);

impl InUse {
    fn client(&self) -> &deadpool_postgres::Object {
        self.0.as_ref().expect("in use until released")
    }

    /// The request ended: the connection can serve the next one.
    fn release(mut self) -> deadpool_postgres::Object {
        self.0.take().expect("released once")
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

fn payload(row: &tokio_postgres::Row, at: usize) -> Payload {
    Payload {
        type_name: row.get(at),
        version: u32::try_from(row.get::<_, i64>(at + 1)).unwrap_or(u32::MAX),
        bytes: row.get(at + 2),
    }
}

impl Journal for PostgresStore {
    fn append(&self, request: AppendRequest) -> StoreFuture<'_, u64> {
        Box::pin(self.write(|tx| Op::Append(request, tx)))
    }

    fn read<'a>(
        &'a self,
        persistence_id: &'a str,
        from_seq_nr: u64,
        max: usize,
    ) -> StoreFuture<'a, Vec<PersistedEvent>> {
        Box::pin(async move {
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    &self.sql.read_events,
                    &[&persistence_id, &crate::batch::sql_bound(from_seq_nr), &max],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| PersistedEvent {
                    persistence_id: persistence_id.to_string(),
                    seq_nr: to_u64(r.get(0)),
                    writer: to_u64(r.get(1)),
                    payload: payload(r, 2),
                })
                .collect())
        })
    }

    fn highest_seq_nr<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let rows = self.query(&self.sql.highest, &[&persistence_id]).await?;
            Ok(rows.first().map_or(0, |r| to_u64(r.get(0))))
        })
    }

    fn delete_up_to<'a>(&'a self, persistence_id: &'a str, to_seq_nr: u64) -> StoreFuture<'a, ()> {
        let pid = persistence_id.to_string();
        Box::pin(self.write(move |tx| Op::DeleteEvents(pid, to_seq_nr, tx)))
    }
}

impl SnapshotStore for PostgresStore {
    fn save(&self, snapshot: SnapshotRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.write(|tx| Op::SaveSnapshot(snapshot, tx)))
    }

    fn load_at_most<'a>(
        &'a self,
        persistence_id: &'a str,
        max_seq_nr: u64,
    ) -> StoreFuture<'a, Option<SnapshotRecord>> {
        Box::pin(async move {
            let max = crate::batch::sql_bound(max_seq_nr);
            let rows = self
                .query(&self.sql.load_snapshot, &[&persistence_id, &max])
                .await?;
            Ok(rows.first().map(|r| SnapshotRecord {
                persistence_id: persistence_id.to_string(),
                seq_nr: to_u64(r.get(0)),
                payload: payload(r, 1),
            }))
        })
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

impl StateStore for PostgresStore {
    fn upsert(&self, write: StateWrite) -> StoreFuture<'_, u64> {
        Box::pin(self.write(|tx| Op::Upsert(write, tx)))
    }

    fn get<'a>(&'a self, persistence_id: &'a str) -> StoreFuture<'a, Option<StateRecord>> {
        Box::pin(async move {
            let rows = self.query(&self.sql.state_get, &[&persistence_id]).await?;
            Ok(rows.first().map(|r| StateRecord {
                persistence_id: persistence_id.to_string(),
                revision: to_u64(r.get(0)),
                payload: payload(r, 1),
            }))
        })
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
    use std::time::Duration;

    use super::{connection_config, PostgresOptions, PostgresStore};
    use crate::error::StoreError;
    use crate::record::AppendRequest;
    use crate::store::{Journal, SnapshotStore};

    /// A request dropped while its statement runs (a caller's timeout) takes its connection
    /// out of the pool: the next request must not wait behind that statement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_dropped_mid_statement_does_not_leave_its_connection_to_the_next() {
        let Some(url) = pg_url() else { return };
        let store = PostgresStore::connect_with(
            &url,
            PostgresOptions {
                pool_size: 1,
                ..PostgresOptions::default()
            },
        )
        .await
        .unwrap();
        let slow = store.query("SELECT pg_sleep(30)", &[]);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), slow)
                .await
                .is_err(),
            "the sleep is cut short by the caller"
        );
        // The only connection was running the sleep: reused, the next request would wait
        // for it (30 s); a new connection answers at once.
        let next = tokio::time::timeout(Duration::from_secs(10), store.query("SELECT 1", &[]))
            .await
            .expect("the next request does not wait behind the dropped one")
            .unwrap();
        assert_eq!(next.len(), 1);
    }

    /// A connection to a host that vanished fails within seconds: the store's timeouts and
    /// keepalives apply where the URL gives none; values the URL gives (as a URL or as
    /// `key=value` pairs) are kept, `0` (no limit) included.
    #[test]
    fn connections_time_out_unless_the_url_says_otherwise() {
        let secs = Duration::from_secs;
        let defaults = connection_config("postgres://app@db:5432/app", false).unwrap();
        assert_eq!(defaults.get_connect_timeout(), Some(&secs(10)));
        assert_eq!(defaults.get_tcp_user_timeout(), Some(&secs(30)));
        assert!(defaults.get_keepalives());
        assert_eq!(defaults.get_keepalives_idle(), secs(30));
        assert_eq!(defaults.get_keepalives_interval(), Some(secs(10)));
        assert_eq!(defaults.get_keepalives_retries(), Some(3));

        let given = connection_config(
            "postgres://app@db/app?connect_timeout=3&tcp_user_timeout=0&keepalives_idle=7200\
             &keepalives_interval=5&keepalives_retries=9&application_name=x",
            false,
        )
        .unwrap();
        assert_eq!(given.get_connect_timeout(), Some(&secs(3)));
        assert_eq!(given.get_tcp_user_timeout(), None, "0: no limit");
        assert_eq!(given.get_keepalives_idle(), secs(7200));
        assert_eq!(given.get_keepalives_interval(), Some(secs(5)));
        assert_eq!(given.get_keepalives_retries(), Some(9));

        let pairs = connection_config(
            "host=db user=app connect_timeout=0 keepalives_idle = 60",
            false,
        )
        .unwrap();
        assert_eq!(pairs.get_connect_timeout(), None, "0: no limit");
        assert_eq!(pairs.get_keepalives_idle(), secs(60));
        // A name the driver decodes (`%5F` is `_`) is still a value given.
        let encoded =
            connection_config("postgres://app@db/app?connect%5Ftimeout=3", false).unwrap();
        assert_eq!(encoded.get_connect_timeout(), Some(&secs(3)));
        assert_eq!(pairs.get_tcp_user_timeout(), Some(&secs(30)));
        assert_eq!(pairs.get_keepalives_retries(), Some(3));

        // A value that reads like a parameter's name does not give that parameter.
        let named =
            connection_config("postgres://db/app?application_name=connect_timeout", false).unwrap();
        assert_eq!(named.get_connect_timeout(), Some(&secs(10)));

        use tokio_postgres::config::SslMode;
        let tls = connection_config("postgres://db/app", true).unwrap();
        assert_eq!(tls.get_ssl_mode(), SslMode::Require);
        assert_eq!(tls.get_connect_timeout(), Some(&secs(10)));
    }

    /// TLS configured and `sslmode=disable` in the URL contradict each other: the store is
    /// not created (it would connect in plaintext although TLS was asked for), with an error
    /// that names both; before the store connects, so no server is needed.
    #[tokio::test]
    async fn tls_with_sslmode_disable_is_refused() {
        for url in [
            "postgres://app@127.0.0.1:1/app?sslmode=disable",
            "host=127.0.0.1 port=1 user=app sslmode=disable",
        ] {
            let err = connection_config(url, true).unwrap_err();
            let StoreError::Backend(text) = &err else {
                panic!("{err:?}")
            };
            assert!(text.contains("sslmode=disable"), "{text}");
            assert!(text.contains("PostgresOptions::tls"), "{text}");
            // Without TLS configured, plaintext is what the URL asks for.
            let plain = connection_config(url, false).unwrap();
            assert_eq!(
                plain.get_ssl_mode(),
                tokio_postgres::config::SslMode::Disable
            );

            let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
            let options = PostgresOptions {
                tls: Some(super::PostgresTls::from_client_config(tls)),
                ..PostgresOptions::default()
            };
            let refused = PostgresStore::connect_with(url, options).await.err();
            assert_eq!(refused, Some(err));
        }
    }

    /// The server at `SHARDIK_PG_URL`, or `None` (said on stderr) without one; with
    /// `SHARDIK_REQUIRE_PG` set, as in CI, a missing URL fails the test.
    fn pg_url() -> Option<String> {
        match std::env::var("SHARDIK_PG_URL") {
            Ok(url) => Some(url),
            Err(_) => {
                assert!(
                    std::env::var("SHARDIK_REQUIRE_PG").is_err(),
                    "SHARDIK_REQUIRE_PG is set but SHARDIK_PG_URL is not"
                );
                eprintln!("*** PostgreSQL writer test SKIPPED: SHARDIK_PG_URL is not set ***");
                None
            }
        }
    }

    /// A store with one writer lane in a schema of its own (tests share the server).
    async fn one_lane_store(url: &str, prefix: &str) -> PostgresStore {
        one_lane_store_with_schema(url, prefix).await.0
    }

    /// [`one_lane_store`] and its schema's name.
    async fn one_lane_store_with_schema(url: &str, prefix: &str) -> (PostgresStore, String) {
        let schema = format!(
            "{prefix}_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let options = PostgresOptions {
            schema: schema.clone(),
            writers: 1,
            ..PostgresOptions::default()
        };
        let store = PostgresStore::connect_with(url, options)
            .await
            .expect("connect to SHARDIK_PG_URL");
        (store, schema)
    }

    /// A lane that committed a stream's position on one connection does not trust it on a
    /// connection opened later, which may reach a server that lacks its last commits (here:
    /// the row removed by hand, as a failover to a replica behind the primary or a restore
    /// would, and the lane's connection ended). Trusting it wrote the next event past a gap
    /// in the stream and acknowledged it; read afresh, the append is a conflict.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn positions_committed_on_one_connection_are_read_again_on_a_newer_one() {
        let Some(url) = pg_url() else { return };
        let (store, schema) = one_lane_store_with_schema(&url, "newer_conn").await;
        assert_eq!(store.append(append("gap", 0)).await, Ok(1));
        assert_eq!(
            store.append(append("gap", 1)).await,
            Ok(2),
            "position 1 known"
        );
        // The server comes back without the last commit, and without the lane's session.
        let admin = store.pool.get().await.unwrap();
        admin
            .execute(
                &format!(
                    "DELETE FROM {schema}.journal WHERE persistence_id = 'gap' AND seq_nr = 2"
                ),
                &[],
            )
            .await
            .unwrap();
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE pid <> pg_backend_pid() AND query LIKE '%' || $1 || '.journal%'",
                &[&schema],
            )
            .await
            .unwrap();
        assert!(!ended.is_empty(), "the lane's session ended");
        // Another stream's write opens the lane's new connection (at once, or after
        // finding the old one gone).
        assert_eq!(store.append(append("other", 0)).await, Ok(1));
        match store.append(append("gap", 2)).await {
            Err(StoreError::Conflict {
                expected: 2,
                actual: 1,
                ..
            }) => {}
            other => panic!("an append past the lost commit answered {other:?}"),
        }
        assert_eq!(store.highest_seq_nr("gap").await, Ok(1));
        assert_eq!(store.append(append("gap", 1)).await, Ok(2));
    }

    /// A write PostgreSQL cannot store (an id too long for the journal's index) is refused
    /// alone, with a reason that says so; the writes queued beside it are stored. (The
    /// server itself refuses such an id only when its index entry does not compress below
    /// about 2.7 KB, and then fails the whole batch.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unstorable_write_is_refused_alone() {
        let Some(url) = pg_url() else { return };
        let store = std::sync::Arc::new(one_lane_store(&url, "unstorable").await);
        let long = "x".repeat(super::writer::MAX_ID_BYTES + 1);
        let (a, b, c) = tokio::join!(
            store.append(append("before-long", 0)),
            store.append(append(&long, 0)),
            store.append(append("after-long", 0)),
        );
        assert_eq!(a, Ok(1));
        assert_eq!(c, Ok(1));
        match b {
            Err(StoreError::Backend(m)) => {
                assert!(m.contains("longer than the 2048"), "{m}")
            }
            other => panic!("the long id answered {other:?}"),
        }
        // At the limit, it is stored.
        let at_limit = "y".repeat(super::writer::MAX_ID_BYTES);
        assert_eq!(store.append(append(&at_limit, 0)).await, Ok(1));
    }

    /// An append of one event at `expected` by writer 1.
    fn append(pid: &str, expected: u64) -> AppendRequest {
        AppendRequest {
            persistence_id: pid.into(),
            expected_seq_nr: expected,
            writer: 1,
            events: vec![crate::codec::Payload::encode_as("n", 1, &expected).unwrap()],
        }
    }

    /// A batch whose commit happened but whose answer was lost with its connection is
    /// written again on another connection, where its append finds the stream moved on by
    /// its own lost commit. The caller is told that whether the write was stored is unknown,
    /// not that another writer got there first (nor, when every connection is lost, only
    /// what broke), and the lane serves on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_whose_commit_answer_was_lost_is_reported_unknown() {
        use super::writer::{lose_answer_once, LOSE_ANSWER_ID};
        let Some(url) = pg_url() else { return };
        let store = one_lane_store(&url, "lost_answer").await;
        let unknown = |outcome: Result<u64, StoreError>, what: &str| match outcome {
            Err(StoreError::Backend(m)) => {
                assert!(
                    m.contains("whether this write was stored is unknown"),
                    "{what}: {m}"
                );
                m
            }
            other => panic!("{what} answered {other:?}"),
        };
        // A stream whose position the lane reads first: `BEGIN`, the read, the insert and
        // `COMMIT`, whose answer is lost; the next attempt finds the write's own event.
        lose_answer_once("read-first");
        let m = unknown(
            store.append(append("read-first", 0)).await,
            "a write whose commit went unanswered once",
        );
        assert!(m.contains("concurrency conflict"), "{m}");
        assert_eq!(
            store.highest_seq_nr("read-first").await,
            Ok(1),
            "the unanswered commit happened"
        );
        // A stream whose position the lane knows: the insert alone, unanswered.
        assert_eq!(store.append(append("known", 0)).await, Ok(1));
        lose_answer_once("known");
        unknown(
            store.append(append("known", 1)).await,
            "a lone statement that went unanswered",
        );
        assert_eq!(store.highest_seq_nr("known").await, Ok(2));
        // Unanswered on every connection the lane tries.
        unknown(
            store.append(append(LOSE_ANSWER_ID, 0)).await,
            "a write whose commits all went unanswered",
        );
        assert_eq!(store.highest_seq_nr(LOSE_ANSWER_ID).await, Ok(1));
        // The writers go on from what is stored, and the lane serves on.
        assert_eq!(store.append(append("read-first", 1)).await, Ok(2));
        assert_eq!(store.append(append("known", 2)).await, Ok(3));
        assert_eq!(store.append(append("after", 0)).await, Ok(1));
    }

    /// A batch that panics in a writer lane (inside its transaction, after the positions were
    /// read) fails its writes with an error that says so (not as a closed store), and the
    /// lane serves the next writes, committed, on another connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_batch_fails_its_writes_and_the_lane_serves_on() {
        let Some(url) = pg_url() else { return };
        let store = one_lane_store(&url, "panic").await;
        assert_eq!(store.append(append("before", 0)).await, Ok(1));
        match store.append(append(crate::batch::PANIC_ID, 0)).await {
            Err(StoreError::Backend(m)) => assert!(m.contains("panicked"), "{m}"),
            other => panic!("the panicking batch answered {other:?}"),
        }
        // First after the panic, a batch of one statement (a snapshot), which is sent
        // without `BEGIN`: on the panicked batch's connection it would run inside that
        // batch's transaction and be answered without being committed.
        let snapshot = crate::record::SnapshotRecord {
            persistence_id: "snap".into(),
            seq_nr: 1,
            payload: crate::codec::Payload::encode_as("n", 1, &7u64).unwrap(),
        };
        assert_eq!(store.save(snapshot).await, Ok(()));
        assert!(
            matches!(store.load_latest("snap").await, Ok(Some(s)) if s.seq_nr == 1),
            "the snapshot is committed"
        );
        assert_eq!(store.append(append("before", 1)).await, Ok(2));
        assert_eq!(store.append(append("after", 0)).await, Ok(1));
        // Committed, as read over another connection: the panic (inside the batch's
        // transaction) did not leave the lane's connection in it for the writes after.
        assert_eq!(store.highest_seq_nr("before").await, Ok(2));
        assert_eq!(store.highest_seq_nr("after").await, Ok(1));
        assert_eq!(
            store.highest_seq_nr(crate::batch::PANIC_ID).await,
            Ok(0),
            "the panicking batch wrote nothing"
        );
    }
}
