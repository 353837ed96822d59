//! PostgreSQL: shardik's [`PostgresStore`] and the same tables driven directly with
//! tokio-postgres.
//!
//! The server is `SHARDIK_PG_URL` if set (used as it is configured); otherwise a throwaway
//! one started with `crates/shardik-persistence/scripts/start-test-postgres.sh`, which runs
//! with `fsync=off` for tests: the suite restarts it without that option, so it runs with
//! PostgreSQL's defaults (`fsync=on`, `synchronous_commit=on`, commits flushed to disk), and
//! stops it (and removes its directory) at the end. Each run uses two fresh schemas (the
//! store's and the baselines'), dropped at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardik_persistence::{Payload, Persistence, PostgresOptions, PostgresStore};
use tokio::runtime::Runtime;
use tokio_postgres::{Client, NoTls};

use super::entity::State;
use super::{decode_state, event_payload, fold, Direct, HAND_BATCH};

/// Baseline connections: the store's default pool size.
pub const CONNECTIONS: usize = 8;

/// A PostgreSQL server: given by `SHARDIK_PG_URL`, or started here and stopped on drop.
pub struct Server {
    /// Its URL.
    pub url: String,
    /// The command that stops it, and its directory, if this process started it.
    started: Option<(String, PathBuf)>,
}

impl Server {
    /// `SHARDIK_PG_URL`, or a throwaway server with fsync on.
    pub fn find_or_start() -> Result<Server, String> {
        if let Some(url) = std::env::var("SHARDIK_PG_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            eprintln!("[persistence] PostgreSQL at SHARDIK_PG_URL (as configured)");
            return Ok(Server { url, started: None });
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shardik-persistence/scripts/start-test-postgres.sh");
        eprintln!("[persistence] no SHARDIK_PG_URL: starting a throwaway PostgreSQL server ...");
        let out = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}): {}",
                script.display(),
                out.status,
                stderr.trim()
            ));
        }
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mut lines = stderr.lines();
        let header = lines
            .by_ref()
            .find(|l| l.contains("stop with:"))
            .ok_or("the start script printed no stop command")?;
        let stop = lines
            .next()
            .ok_or("the start script printed no stop command")?
            .trim()
            .to_string();
        let dir = header
            .split("server in ")
            .nth(1)
            .and_then(|rest| rest.split(" on port ").next())
            .map(PathBuf::from)
            .ok_or("the start script printed no directory")?;
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .unwrap_or_default()
            .to_string();
        let server = Server {
            url,
            started: Some((stop.clone(), dir.clone())),
        };
        // The script passes `-c fsync=off` on the command line, which ALTER SYSTEM cannot
        // override: restart without it.
        let restart = format!(
            "{} -w -l {d}/server.log -o \"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c max_connections=200\" restart",
            stop.trim_end_matches(" stop"),
            d = dir.display()
        );
        let ok = Command::new("sh")
            .args(["-c", &restart])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("[persistence] WARNING: could not restart PostgreSQL with fsync on");
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some((stop, dir)) = self.started.take() {
            let _ = Command::new("sh")
                .args(["-c", &stop])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("shardik-pg."))
            {
                let _ = std::fs::remove_dir_all(&dir);
            }
            eprintln!("[persistence] stopped the throwaway PostgreSQL server");
        }
    }
}

/// Opens the shardik store (schema `bench_<pid>`) and the baselines (schema
/// `bench_direct_<pid>`, its tables created by a store, so the shape is the store's).
pub fn setup(rt: &Arc<Runtime>, server: &Server) -> Result<(Persistence, PgDirect), String> {
    let store_schema = format!("bench_{}", std::process::id());
    let direct_schema = format!("bench_direct_{}", std::process::id());
    let url = server.url.clone();
    let (store, clients) = rt.block_on(async {
        let options = |schema: &str| PostgresOptions {
            schema: schema.to_string(),
            ..PostgresOptions::default()
        };
        let store = PostgresStore::connect_with(&url, options(&store_schema))
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        drop(
            PostgresStore::connect_with(&url, options(&direct_schema))
                .await
                .map_err(|e| e.to_string())?,
        );
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS {
            let (client, conn) = tokio_postgres::connect(&url, NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            clients.push(Arc::new(client));
        }
        let fsync = show(&clients[0], "fsync").await;
        let sync = show(&clients[0], "synchronous_commit").await;
        eprintln!("[persistence] PostgreSQL: fsync={fsync}, synchronous_commit={sync}");
        Ok::<_, String>((store, clients))
    })?;
    let payload = event_payload();
    Ok((
        Persistence::new(Arc::new(store)),
        PgDirect {
            rt: rt.clone(),
            clients,
            next_seq: Arc::new(AtomicI64::new(0)),
            insert: format!(
                "INSERT INTO {direct_schema}.journal
                 (persistence_id, seq_nr, writer, type_name, version, payload)
                 VALUES ($1, $2, 1, $3, $4, $5)"
            ),
            insert_many: format!(
                "INSERT INTO {direct_schema}.journal
                 (persistence_id, seq_nr, writer, type_name, version, payload)
                 SELECT u.pid, u.seq_nr, 1, $3, $4, $5
                 FROM UNNEST($1::TEXT[], $2::BIGINT[]) AS u(pid, seq_nr)"
            ),
            read_snapshot: format!(
                "SELECT seq_nr, type_name, version, payload FROM {store_schema}.snapshots
                 WHERE persistence_id = $1 ORDER BY seq_nr DESC LIMIT 1"
            ),
            read_events: format!(
                "SELECT type_name, version, payload FROM {store_schema}.journal
                 WHERE persistence_id = $1 AND seq_nr >= $2 ORDER BY seq_nr"
            ),
            drop_schemas: format!(
                "DROP SCHEMA IF EXISTS {store_schema} CASCADE;
                 DROP SCHEMA IF EXISTS {direct_schema} CASCADE;"
            ),
            payload,
        },
    ))
}

async fn show(client: &Client, setting: &str) -> String {
    client
        .query_one(&format!("SHOW {setting}"), &[])
        .await
        .map_or_else(|e| format!("? ({e})"), |r| r.get::<_, String>(0))
}

/// The PostgreSQL baselines.
pub struct PgDirect {
    rt: Arc<Runtime>,
    clients: Vec<Arc<Client>>,
    next_seq: Arc<AtomicI64>,
    insert: String,
    insert_many: String,
    read_snapshot: String,
    read_events: String,
    drop_schemas: String,
    payload: Payload,
}

impl Drop for PgDirect {
    fn drop(&mut self) {
        let client = self.clients[0].clone();
        let sql = self.drop_schemas.clone();
        let _ = self
            .rt
            .block_on(async move { client.batch_execute(&sql).await });
    }
}

fn row_payload(r: &tokio_postgres::Row, at: usize) -> Payload {
    Payload {
        type_name: r.get(at),
        version: u32::try_from(r.get::<_, i64>(at + 1)).unwrap_or(u32::MAX),
        bytes: r.get(at + 2),
    }
}

impl Direct for PgDirect {
    fn one_tx_per_event(&mut self, entities: usize, slot: Duration) -> f64 {
        let conns = entities.min(self.clients.len());
        let start = Instant::now();
        let deadline = start + slot;
        let mut tasks = Vec::new();
        for (c, client) in self.clients.iter().take(conns).enumerate() {
            let client = client.clone();
            let next = self.next_seq.clone();
            let sql = self.insert.clone();
            let p = self.payload.clone();
            tasks.push(self.rt.spawn(async move {
                let stmt = client.prepare(&sql).await.expect("prepare the insert");
                let version = i64::from(p.version);
                let mut done = 0usize;
                let mut k = c;
                while Instant::now() < deadline {
                    let seq = next.fetch_add(1, Ordering::Relaxed) + 1;
                    let pid = format!("tx{entities}|{k}");
                    // Autocommit: every statement is its own transaction.
                    client
                        .execute(&stmt, &[&pid, &seq, &p.type_name, &version, &p.bytes])
                        .await
                        .expect("insert an event row");
                    done += 1;
                    k += conns;
                    if k >= entities {
                        k = c;
                    }
                }
                done
            }));
        }
        let done: usize = self.rt.block_on(async move {
            let mut total = 0;
            for t in tasks {
                total += t.await.expect("a baseline task panicked");
            }
            total
        });
        done as f64 / start.elapsed().as_secs_f64()
    }

    fn hand_batched(&mut self, entities: usize, slot: Duration) -> f64 {
        let client = self.clients[0].clone();
        let next = self.next_seq.clone();
        let sql = self.insert_many.clone();
        let p = self.payload.clone();
        let start = Instant::now();
        let done = self.rt.block_on(async move {
            let stmt = client.prepare(&sql).await.expect("prepare the insert");
            let version = i64::from(p.version);
            let mut done = 0usize;
            while start.elapsed() < slot {
                let first = next.fetch_add(HAND_BATCH as i64, Ordering::Relaxed) + 1;
                let seqs: Vec<i64> = (first..first + HAND_BATCH as i64).collect();
                let pids: Vec<String> = (0..HAND_BATCH)
                    .map(|i| format!("batch{entities}|{}", (done + i) % entities))
                    .collect();
                // One statement in autocommit: one transaction of HAND_BATCH events.
                client
                    .execute(&stmt, &[&pids, &seqs, &p.type_name, &version, &p.bytes])
                    .await
                    .expect("insert a batch of event rows");
                done += HAND_BATCH;
            }
            done
        });
        done as f64 / start.elapsed().as_secs_f64()
    }

    fn recover(&mut self, pid: &str, snapshot: bool) -> u64 {
        let client = self.clients[0].clone();
        let (snap_sql, events_sql) = (self.read_snapshot.clone(), self.read_events.clone());
        let pid = pid.to_string();
        self.rt.block_on(async move {
            let mut state = State::default();
            let mut from = 1i64;
            if snapshot {
                if let Some(r) = client
                    .query_opt(&snap_sql, &[&pid])
                    .await
                    .expect("read the snapshot")
                {
                    state = decode_state(&row_payload(&r, 1));
                    from = r.get::<_, i64>(0) + 1;
                }
            }
            for r in client
                .query(&events_sql, &[&pid, &from])
                .await
                .expect("read events")
            {
                fold(&mut state, &row_payload(&r, 0));
            }
            state.events
        })
    }
}
