//! The PostgreSQL schema and statements, qualified with the configured schema name.

/// Every statement the backend runs, built once for one schema.
pub(super) struct Sql {
    pub(super) ddl: String,
    pub(super) meta_ensure: String,
    pub(super) meta_lock: String,
    pub(super) meta_update: String,
    pub(super) insert_events: String,
    pub(super) delete_events: String,
    pub(super) read_events: String,
    pub(super) highest: String,
    pub(super) save_snapshot: String,
    pub(super) delete_snapshots: String,
    pub(super) load_snapshot: String,
    pub(super) state_insert: String,
    pub(super) state_lock: String,
    pub(super) state_update: String,
    pub(super) state_delete: String,
    pub(super) state_revision: String,
    pub(super) state_get: String,
}

/// True for a plain lower-case SQL identifier (letters, digits, `_`; not starting with a
/// digit), which is all a schema name may be here.
pub(super) fn valid_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl Sql {
    pub(super) fn new(s: &str) -> Sql {
        Sql {
            ddl: format!(
                "CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE IF NOT EXISTS {s}.journal (
                     persistence_id TEXT NOT NULL,
                     seq_nr BIGINT NOT NULL,
                     writer BIGINT NOT NULL,
                     type_name TEXT NOT NULL,
                     version BIGINT NOT NULL,
                     payload BYTEA NOT NULL,
                     written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                     PRIMARY KEY (persistence_id, seq_nr));
                 CREATE TABLE IF NOT EXISTS {s}.journal_meta (
                     persistence_id TEXT PRIMARY KEY,
                     highest_seq_nr BIGINT NOT NULL,
                     writer BIGINT NOT NULL);
                 CREATE TABLE IF NOT EXISTS {s}.snapshots (
                     persistence_id TEXT NOT NULL,
                     seq_nr BIGINT NOT NULL,
                     type_name TEXT NOT NULL,
                     version BIGINT NOT NULL,
                     payload BYTEA NOT NULL,
                     written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                     PRIMARY KEY (persistence_id, seq_nr));
                 CREATE TABLE IF NOT EXISTS {s}.durable_state (
                     persistence_id TEXT PRIMARY KEY,
                     revision BIGINT NOT NULL,
                     writer BIGINT NOT NULL,
                     type_name TEXT NOT NULL,
                     version BIGINT NOT NULL,
                     payload BYTEA NOT NULL,
                     written_at TIMESTAMPTZ NOT NULL DEFAULT now());"
            ),
            meta_ensure: format!(
                "INSERT INTO {s}.journal_meta (persistence_id, highest_seq_nr, writer)
                 VALUES ($1, 0, 0) ON CONFLICT (persistence_id) DO NOTHING"
            ),
            meta_lock: format!(
                "SELECT highest_seq_nr, writer FROM {s}.journal_meta
                 WHERE persistence_id = $1 FOR UPDATE"
            ),
            meta_update: format!(
                "UPDATE {s}.journal_meta SET highest_seq_nr = $2, writer = $3
                 WHERE persistence_id = $1"
            ),
            insert_events: format!(
                "INSERT INTO {s}.journal (persistence_id, seq_nr, writer, type_name, version, payload)
                 SELECT $1, u.seq_nr, $2, u.type_name, u.version, u.payload
                 FROM UNNEST($3::BIGINT[], $4::TEXT[], $5::BIGINT[], $6::BYTEA[])
                 AS u(seq_nr, type_name, version, payload)"
            ),
            delete_events: format!(
                "DELETE FROM {s}.journal WHERE persistence_id = $1 AND seq_nr <= $2"
            ),
            read_events: format!(
                "SELECT seq_nr, writer, type_name, version, payload FROM {s}.journal
                 WHERE persistence_id = $1 AND seq_nr >= $2 ORDER BY seq_nr LIMIT $3"
            ),
            highest: format!(
                "SELECT highest_seq_nr FROM {s}.journal_meta WHERE persistence_id = $1"
            ),
            save_snapshot: format!(
                "INSERT INTO {s}.snapshots (persistence_id, seq_nr, type_name, version, payload)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (persistence_id, seq_nr) DO UPDATE SET type_name = excluded.type_name,
                 version = excluded.version, payload = excluded.payload, written_at = now()"
            ),
            delete_snapshots: format!(
                "DELETE FROM {s}.snapshots WHERE persistence_id = $1 AND seq_nr <= $2"
            ),
            load_snapshot: format!(
                "SELECT seq_nr, type_name, version, payload FROM {s}.snapshots
                 WHERE persistence_id = $1 AND seq_nr <= $2 ORDER BY seq_nr DESC LIMIT 1"
            ),
            state_insert: format!(
                "INSERT INTO {s}.durable_state
                 (persistence_id, revision, writer, type_name, version, payload)
                 VALUES ($1, 1, $2, $3, $4, $5) ON CONFLICT (persistence_id) DO NOTHING"
            ),
            state_lock: format!(
                "SELECT revision, writer FROM {s}.durable_state
                 WHERE persistence_id = $1 FOR UPDATE"
            ),
            state_update: format!(
                "UPDATE {s}.durable_state SET revision = $2, writer = $3, type_name = $4,
                 version = $5, payload = $6, written_at = now() WHERE persistence_id = $1"
            ),
            state_delete: format!(
                "DELETE FROM {s}.durable_state WHERE persistence_id = $1 AND revision = $2"
            ),
            state_revision: format!(
                "SELECT revision FROM {s}.durable_state WHERE persistence_id = $1"
            ),
            state_get: format!(
                "SELECT revision, type_name, version, payload FROM {s}.durable_state
                 WHERE persistence_id = $1"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_are_schema_names() {
        assert!(valid_identifier("shardik"));
        assert!(valid_identifier("t_1"));
        for bad in ["", "1t", "a-b", "A", "x; DROP TABLE y", "a.b"] {
            assert!(!valid_identifier(bad), "{bad}");
        }
    }
}
