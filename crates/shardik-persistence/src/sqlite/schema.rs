//! The SQLite schema and row conversions.

use rusqlite::{Connection, Row};

use crate::codec::Payload;
use crate::error::StoreError;
use crate::record::{PersistedEvent, SnapshotRecord, StateRecord};

/// Tables: events per stream, the stream's position and newest writer (kept when events are
/// deleted), snapshots, durable state, and the cluster sharding replica of each node id
/// (`sharding_state`, shard -1 = the coordinator state of the type, -2 = the promise to a coordinator taking over). Numbers are stored as SQLite integers (`u64` values
/// are bit-cast to `i64` and back).
pub(super) const DDL: &str = "
CREATE TABLE IF NOT EXISTS journal (
    persistence_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    writer INTEGER NOT NULL,
    type_name TEXT NOT NULL,
    version INTEGER NOT NULL,
    payload BLOB NOT NULL,
    written_at INTEGER NOT NULL,
    PRIMARY KEY (persistence_id, seq_nr)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_meta (
    persistence_id TEXT PRIMARY KEY,
    highest_seq_nr INTEGER NOT NULL,
    writer INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    persistence_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    type_name TEXT NOT NULL,
    version INTEGER NOT NULL,
    payload BLOB NOT NULL,
    written_at INTEGER NOT NULL,
    PRIMARY KEY (persistence_id, seq_nr)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS durable_state (
    persistence_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    writer INTEGER NOT NULL,
    type_name TEXT NOT NULL,
    version INTEGER NOT NULL,
    payload BLOB NOT NULL,
    written_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sharding_state (
    node_id TEXT NOT NULL,
    type_name TEXT NOT NULL,
    shard INTEGER NOT NULL,
    rank_major INTEGER NOT NULL,
    rank_minor INTEGER NOT NULL,
    payload BLOB NOT NULL,
    written_at INTEGER NOT NULL,
    PRIMARY KEY (node_id, type_name, shard)
) WITHOUT ROWID;
";

/// How long opening waits for other connections (busy timeout, and switching to WAL mode).
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens a connection in WAL mode with the given `synchronous` level and a busy timeout.
pub(super) fn connect(path: &std::path::Path, synchronous: &str) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(backend)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(backend)?;
    let mode = wal_mode(&conn).map_err(|e| {
        StoreError::Backend(format!(
            "sqlite: setting WAL mode on {}: {e}",
            path.display()
        ))
    })?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "SQLite refused WAL mode for {} (got {mode})",
            path.display()
        )));
    }
    conn.execute_batch(&format!("PRAGMA synchronous={synchronous};"))
        .map_err(backend)?;
    Ok(conn)
}

/// Switches the database to WAL mode (a no-op once it is) and returns the mode it is in.
///
/// Switching needs the database to itself, and SQLite answers `SQLITE_BUSY` at once, without
/// its busy handler, while another connection holds it (for example another process opening
/// the same fresh file): retry until that connection is done or [`BUSY_TIMEOUT`] passes.
fn wal_mode(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

pub(super) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("sqlite: {e}"))
}

pub(super) fn to_i64(v: u64) -> i64 {
    v as i64
}

pub(super) fn to_u64(v: i64) -> u64 {
    v as u64
}

pub(super) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Reads `type_name, version, payload` starting at column `at`.
fn payload(row: &Row<'_>, at: usize) -> rusqlite::Result<Payload> {
    Ok(Payload {
        type_name: row.get(at)?,
        version: row.get(at + 1)?,
        bytes: row.get(at + 2)?,
    })
}

/// `persistence_id, seq_nr, writer, type_name, version, payload`.
pub(super) fn event(row: &Row<'_>) -> rusqlite::Result<PersistedEvent> {
    Ok(PersistedEvent {
        persistence_id: row.get(0)?,
        seq_nr: to_u64(row.get(1)?),
        writer: to_u64(row.get(2)?),
        payload: payload(row, 3)?,
    })
}

/// `persistence_id, seq_nr, type_name, version, payload`.
pub(super) fn snapshot(row: &Row<'_>) -> rusqlite::Result<SnapshotRecord> {
    Ok(SnapshotRecord {
        persistence_id: row.get(0)?,
        seq_nr: to_u64(row.get(1)?),
        payload: payload(row, 2)?,
    })
}

/// `persistence_id, revision, type_name, version, payload`.
pub(super) fn state(row: &Row<'_>) -> rusqlite::Result<StateRecord> {
    Ok(StateRecord {
        persistence_id: row.get(0)?,
        revision: to_u64(row.get(1)?),
        payload: payload(row, 2)?,
    })
}
