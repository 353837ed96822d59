//! The `persistence` suite: event-sourced entities over shardik-persistence's SQLite and
//! PostgreSQL stores against the same database driven directly.
//!
//! | benchmark | shardik | baseline |
//! |---|---|---|
//! | `persist_{sqlite,postgres}_{1,100,10000}_entities` | events/s acknowledged by counter entities, each command persisting one event, with `min(entities, 1000)` concurrent askers | the same backend, one transaction per event (SQLite: one connection; PostgreSQL: `min(entities, 8)` connections, the store's pool size) |
//! | `persist_…_entities_vs_batched` | the same figure | hand-batched: transactions of [`HAND_BATCH`] events (PostgreSQL: one multi-row `INSERT … UNNEST`) |
//! | `recover_{sqlite,postgres}_10000_events[_snapshot]` | ms from spawning an entity with 10 000 stored events (or a snapshot at 10 000) to its first answer | the same rows (snapshot, then events after it) read with one query and folded with the same codec |
//!
//! Baselines write rows of the store's own `journal` table shape (the tables are created by
//! opening the store on a separate database file or schema) but only the journal row: no
//! stream-position row, no concurrency check, no savepoint. Durability is the same for both:
//! SQLite in WAL mode with `synchronous=FULL` in a temporary directory on disk; PostgreSQL
//! with `fsync=on` and `synchronous_commit=on` (see [`pg`]). Throughput contenders each run for
//! a fixed time per round ([`Sizes::slot`]) and report events / elapsed time including the
//! drain of in-flight work.
//!
//! The target: with many entities (10 000), at least 10x the one-transaction-per-event
//! baseline (`persist_*_10000_entities` ratio ≥ 10). The JSON contract has no target field,
//! so the suite prints whether it was met on stderr.

pub mod entity;
pub mod pg;
pub mod sqlite;

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardik::prelude::*;
use shardik_persistence::{
    AppendRequest, Payload, PersistSettings, Persistence, SnapshotRecord, Versioned,
};

use crate::harness::{alternate, block_on_task, Contender};
use crate::report::{Better, Record};
use crate::SuiteOptions;
use entity::{Cmd, Counter, Event, State};

/// The suite's name in every record.
pub const SUITE: &str = "persistence";
/// Entity counts of the throughput benchmarks.
pub const ENTITIES: [usize; 3] = [1, 100, 10_000];
/// Most concurrent askers (commands in flight) of a throughput benchmark.
pub const MAX_ASKERS: usize = 1000;
/// Events per transaction of the hand-batched baseline.
pub const HAND_BATCH: usize = 1000;
/// Events of the recovered entity.
pub const RECOVER_EVENTS: u64 = 10_000;
/// The target ratio against one transaction per event, with many entities.
pub const TARGET_RATIO: f64 = 10.0;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Problem sizes: the full run, or small ones for `--quick`.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// How long each throughput contender runs per round.
    pub slot: Duration,
}

impl Sizes {
    /// The sizes for `opts`.
    pub fn for_options(opts: &SuiteOptions) -> Sizes {
        Sizes {
            slot: if opts.quick {
                Duration::from_millis(100)
            } else {
                Duration::from_millis(400)
            },
        }
    }
}

/// A database driven directly, without shardik: the baselines of one backend.
pub trait Direct {
    /// Writes events of `entities` streams, one transaction per event, for about `slot`;
    /// returns events per second.
    fn one_tx_per_event(&mut self, entities: usize, slot: Duration) -> f64;
    /// Writes events of `entities` streams in transactions of [`HAND_BATCH`] events for about
    /// `slot`; returns events per second.
    fn hand_batched(&mut self, entities: usize, slot: Duration) -> f64;
    /// Reads stream `pid` of the shardik store (its latest snapshot if `snapshot`, then the
    /// events after it) and folds it; returns the events the state counts.
    fn recover(&mut self, pid: &str, snapshot: bool) -> u64;
}

/// Runs the suite: SQLite, then PostgreSQL if a server is available.
pub fn run(opts: &SuiteOptions, emit: &mut dyn FnMut(Record)) {
    let rt = Arc::new(crate::harness::runtime());
    let sizes = Sizes::for_options(opts);
    let mut results = Vec::new();
    if wants(opts, "sqlite") {
        let dir = sqlite::TempDir::new();
        eprintln!(
            "[persistence] SQLite in {} (WAL, synchronous=FULL)",
            dir.path().display()
        );
        let (persistence, mut direct) = sqlite::setup(&dir);
        backend(
            &rt,
            opts,
            sizes,
            "sqlite",
            &persistence,
            &mut direct,
            &mut |r| {
                results.push(r.clone());
                emit(r)
            },
        );
    }
    if wants(opts, "postgres") {
        match pg::Server::find_or_start() {
            Ok(server) => {
                match pg::setup(&rt, &server) {
                    Ok((persistence, mut direct)) => backend(
                        &rt,
                        opts,
                        sizes,
                        "postgres",
                        &persistence,
                        &mut direct,
                        &mut |r| {
                            results.push(r.clone());
                            emit(r)
                        },
                    ),
                    Err(e) => eprintln!("[persistence] PostgreSQL benches SKIPPED: {e}"),
                }
                drop(server);
            }
            Err(e) => eprintln!("[persistence] PostgreSQL benches SKIPPED: {e}"),
        }
    }
    for r in &results {
        if r.bench.ends_with("_10000_entities") {
            eprintln!(
                "[persistence] target: {} at {:.1}x one transaction per event (target ≥ {TARGET_RATIO}x): {}",
                r.bench,
                r.ratio,
                if r.ratio >= TARGET_RATIO { "MET" } else { "NOT met" }
            );
        }
    }
}

/// True if any benchmark of `backend` is selected.
fn wants(opts: &SuiteOptions, backend: &str) -> bool {
    let mut names: Vec<String> = ENTITIES
        .iter()
        .flat_map(|n| {
            let base = format!("persist_{backend}_{n}_entities");
            [format!("{base}_vs_batched"), base]
        })
        .collect();
    names.push(format!("recover_{backend}_{RECOVER_EVENTS}_events"));
    names.push(format!(
        "recover_{backend}_{RECOVER_EVENTS}_events_snapshot"
    ));
    names.iter().any(|n| opts.selects(n))
}

/// Every benchmark of one backend.
fn backend(
    rt: &Arc<tokio::runtime::Runtime>,
    opts: &SuiteOptions,
    sizes: Sizes,
    name: &str,
    persistence: &Persistence,
    direct: &mut dyn Direct,
    emit: &mut dyn FnMut(Record),
) {
    // Actor systems below are created on the suite's runtime.
    let _runtime = rt.enter();
    for n in ENTITIES {
        let vs_tx = format!("persist_{name}_{n}_entities");
        let vs_batch = format!("{vs_tx}_vs_batched");
        if !opts.selects(&vs_tx) && !opts.selects(&vs_batch) {
            continue;
        }
        eprintln!("[persistence] {vs_tx} ...");
        let system = ActorSystem::new("bench-persistence");
        let region = system
            .sharding()
            .start(
                persistence
                    .event_sourced(&format!("counter{n}"), PersistSettings::default(), |_| {
                        Counter
                    })
                    .shards(256),
            )
            .expect("the counter entity type starts");
        let ids: Arc<Vec<String>> = Arc::new((0..n).map(|i| i.to_string()).collect());
        // Start (and recover) every entity before measuring.
        let started = block_on_task(rt, drive(region.clone(), ids.clone(), None));
        assert_eq!(started, n as u64, "every entity answered");
        let cell = std::cell::RefCell::new(&mut *direct);
        let figures = {
            let mut contenders = [
                Contender::new("shardik", || {
                    let start = Instant::now();
                    let events = block_on_task(
                        rt,
                        drive(region.clone(), ids.clone(), Some(start + sizes.slot)),
                    );
                    vec![events as f64 / start.elapsed().as_secs_f64()]
                }),
                Contender::new("one tx per event", || {
                    vec![cell.borrow_mut().one_tx_per_event(n, sizes.slot)]
                }),
                Contender::new("hand-batched", || {
                    vec![cell.borrow_mut().hand_batched(n, sizes.slot)]
                }),
            ];
            alternate(&mut contenders, opts.warmup(), opts.rounds())
        };
        rt.block_on(system.shutdown());
        let (value, tx, batch) = (figures[0][0], figures[1][0], figures[2][0]);
        for (bench, base) in [(vs_tx, tx), (vs_batch, batch)] {
            if opts.selects(&bench) {
                emit(Record::new(
                    SUITE,
                    bench,
                    value,
                    base,
                    "events/s",
                    Better::Higher,
                ));
            }
        }
    }
    let plain = format!("recover_{name}_{RECOVER_EVENTS}_events");
    let snap = format!("{plain}_snapshot");
    for (bench, snapshot) in [(plain, false), (snap, true)] {
        if !opts.selects(&bench) {
            continue;
        }
        eprintln!("[persistence] {bench} ...");
        let pid = format!("recover|{}", if snapshot { "snapshot" } else { "plain" });
        block_on_task(rt, seed(persistence.clone(), pid.clone(), snapshot));
        let system = ActorSystem::new("bench-recovery");
        let cell = std::cell::RefCell::new(&mut *direct);
        let figures = {
            let mut contenders = [
                Contender::new("shardik", || {
                    let props =
                        persistence
                            .event_sourced_props(&pid, PersistSettings::default(), || Counter);
                    let system = system.clone();
                    let start = Instant::now();
                    let events = block_on_task(rt, async move {
                        let actor = system.spawn_props(props);
                        let events = actor.ask(Cmd::Get, TIMEOUT).await.expect("recovered");
                        actor.stop();
                        events
                    });
                    let ms = start.elapsed().as_secs_f64() * 1e3;
                    assert_eq!(events, RECOVER_EVENTS, "shardik recovered every event");
                    vec![ms]
                }),
                Contender::new("direct read", || {
                    let start = Instant::now();
                    let events = cell.borrow_mut().recover(&pid, snapshot);
                    let ms = start.elapsed().as_secs_f64() * 1e3;
                    assert_eq!(events, RECOVER_EVENTS, "the direct read saw every event");
                    vec![ms]
                }),
            ];
            alternate(&mut contenders, opts.warmup(), opts.rounds())
        };
        rt.block_on(system.shutdown());
        emit(Record::new(
            SUITE,
            bench,
            figures[0][0],
            figures[1][0],
            "ms",
            Better::Lower,
        ));
    }
}

/// Asks `Add(1)` of the entities from `min(entities, MAX_ASKERS)` concurrent askers (asker
/// `a` cycles over entities `a`, `a + askers`, …) until `deadline`; returns the acknowledged
/// events. With no deadline every entity is asked `Get` once instead (to start them).
async fn drive(region: Region<Cmd>, ids: Arc<Vec<String>>, deadline: Option<Instant>) -> u64 {
    let askers = ids.len().min(MAX_ASKERS);
    let mut tasks = tokio::task::JoinSet::new();
    for a in 0..askers {
        let region = region.clone();
        let ids = ids.clone();
        tasks.spawn(async move {
            let mut done = 0u64;
            let mut k = a;
            match deadline {
                None => {
                    while k < ids.len() {
                        region
                            .ask(&ids[k], Cmd::Get, TIMEOUT)
                            .await
                            .expect("an entity starts");
                        done += 1;
                        k += askers;
                    }
                }
                Some(deadline) => {
                    while Instant::now() < deadline {
                        region
                            .ask(&ids[k], |r| Cmd::Add(1, r), TIMEOUT)
                            .await
                            .expect("an entity persists");
                        done += 1;
                        k += askers;
                        if k >= ids.len() {
                            k = a;
                        }
                    }
                }
            }
            done
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.expect("an asker panicked");
    }
    total
}

/// The encoded event every baseline row carries.
pub fn event_payload() -> Payload {
    Payload::encode(&Event::Added { amount: 1 }).expect("the event encodes")
}

/// Decodes and folds baseline rows: the work recovery does per event.
pub fn fold(state: &mut State, payload: &Payload) {
    let event: Event = payload.decode().expect("a stored event decodes");
    entity::apply(state, &event);
}

/// Decodes a stored snapshot.
pub fn decode_state(payload: &Payload) -> State {
    payload.decode().expect("a stored snapshot decodes")
}

/// Writes [`RECOVER_EVENTS`] events to stream `pid` through the journal (once: skipped if
/// the stream has them), and with `snapshot` a snapshot of the state after the last one.
async fn seed(persistence: Persistence, pid: String, snapshot: bool) {
    let journal = persistence.journal();
    let have = journal.highest_seq_nr(&pid).await.expect("read highest");
    if have >= RECOVER_EVENTS {
        return;
    }
    let payload = event_payload();
    let mut seq = have;
    while seq < RECOVER_EVENTS {
        let n = (RECOVER_EVENTS - seq).min(1000);
        seq = journal
            .append(AppendRequest {
                persistence_id: pid.clone(),
                expected_seq_nr: seq,
                writer: persistence.incarnation(),
                events: vec![payload.clone(); n as usize],
            })
            .await
            .expect("seed events");
    }
    if snapshot {
        let state = State {
            count: RECOVER_EVENTS,
            events: RECOVER_EVENTS,
        };
        persistence
            .snapshots()
            .save(SnapshotRecord {
                persistence_id: pid,
                seq_nr: RECOVER_EVENTS,
                payload: Payload::encode(&state).expect("the state encodes"),
            })
            .await
            .expect("seed snapshot");
    }
    let _ = State::TYPE_NAME;
}
