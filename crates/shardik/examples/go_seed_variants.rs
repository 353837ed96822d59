//! The Go seed ("sharding state owners by key") in three variants, side by side, giving the same
//! answers:
//!
//! 1. **channel owners**: `N` owner tasks, each holding a map; a key goes to owner
//!    `hash(key) % N` over a channel and the caller waits for the owner's answer.
//! 2. **mutex shards**: `N` maps, each behind its own lock; the caller locks `hash(key) % N`.
//! 3. **shardik entities**: one actor per key, addressed by id through a [`Region`]; shardik
//!    hashes the id to a shard and starts the entity on its first message.
//!
//! ```text
//! cargo run --release -p shardik --example go_seed_variants
//! ```
//!
//! Every variant runs the same deterministic workload: several concurrent clients `write`,
//! `add` and `read` keys in an interleaved order, then every key is read back. The example
//! prints each variant's time and a checksum of all final values, and fails if they differ.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardik::prelude::*;
use tokio::sync::{mpsc, oneshot};

const KEYS: u64 = 10_000;
const CLIENTS: u64 = 8;
const OPS_PER_CLIENT: u64 = 25_000;
const OWNERS: usize = 32;
const TIMEOUT: Duration = Duration::from_secs(5);

/// The store interface all three variants offer: the Go seed's `read` and `write`, plus an
/// `add` that makes per-key linearizability visible (concurrent adds must not be lost).
trait Store: Clone + Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn write(&self, key: u64, val: i64) -> impl std::future::Future<Output = ()> + Send;
    fn add(&self, key: u64, delta: i64) -> impl std::future::Future<Output = i64> + Send;
    fn read(&self, key: u64) -> impl std::future::Future<Output = i64> + Send;
}

/// Which owner or lock a key belongs to: the same hash for both plain variants.
fn owner_of(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % OWNERS
}

// ---- 1. channel owners -------------------------------------------------------------------

enum Op {
    Read(u64, oneshot::Sender<i64>),
    Write(u64, i64, oneshot::Sender<()>),
    Add(u64, i64, oneshot::Sender<i64>),
}

#[derive(Clone)]
struct ChannelOwners {
    owners: Arc<Vec<mpsc::UnboundedSender<Op>>>,
}

impl ChannelOwners {
    fn start() -> Self {
        let owners = (0..OWNERS)
            .map(|_| {
                let (tx, mut rx) = mpsc::unbounded_channel::<Op>();
                tokio::spawn(async move {
                    let mut state: HashMap<u64, i64> = HashMap::new();
                    while let Some(op) = rx.recv().await {
                        match op {
                            Op::Read(k, resp) => {
                                let _ = resp.send(state.get(&k).copied().unwrap_or(0));
                            }
                            Op::Write(k, v, resp) => {
                                state.insert(k, v);
                                let _ = resp.send(());
                            }
                            Op::Add(k, d, resp) => {
                                let v = state.entry(k).or_insert(0);
                                *v += d;
                                let _ = resp.send(*v);
                            }
                        }
                    }
                });
                tx
            })
            .collect();
        ChannelOwners {
            owners: Arc::new(owners),
        }
    }

    async fn call<R>(&self, key: u64, op: impl FnOnce(oneshot::Sender<R>) -> Op) -> R {
        let (tx, rx) = oneshot::channel();
        self.owners[owner_of(key)]
            .send(op(tx))
            .expect("owner task is running");
        rx.await.expect("owner answers")
    }
}

impl Store for ChannelOwners {
    fn name(&self) -> &'static str {
        "channel owners (Go seed)"
    }
    async fn write(&self, key: u64, val: i64) {
        self.call(key, |r| Op::Write(key, val, r)).await
    }
    async fn add(&self, key: u64, delta: i64) -> i64 {
        self.call(key, |r| Op::Add(key, delta, r)).await
    }
    async fn read(&self, key: u64) -> i64 {
        self.call(key, |r| Op::Read(key, r)).await
    }
}

// ---- 2. mutex shards ---------------------------------------------------------------------

#[derive(Clone)]
struct MutexShards {
    shards: Arc<Vec<parking_lot::Mutex<HashMap<u64, i64>>>>,
}

impl MutexShards {
    fn new() -> Self {
        MutexShards {
            shards: Arc::new((0..OWNERS).map(|_| Default::default()).collect()),
        }
    }
}

impl Store for MutexShards {
    fn name(&self) -> &'static str {
        "mutex shards (Go seed)"
    }
    async fn write(&self, key: u64, val: i64) {
        self.shards[owner_of(key)].lock().insert(key, val);
    }
    async fn add(&self, key: u64, delta: i64) -> i64 {
        let mut shard = self.shards[owner_of(key)].lock();
        let v = shard.entry(key).or_insert(0);
        *v += delta;
        *v
    }
    async fn read(&self, key: u64) -> i64 {
        self.shards[owner_of(key)]
            .lock()
            .get(&key)
            .copied()
            .unwrap_or(0)
    }
}

// ---- 3. shardik entities -----------------------------------------------------------------

/// The messages of one key's entity.
#[derive(Serialize, Deserialize)]
enum KeyMsg {
    Read(ReplyTo<i64>),
    Write(i64, ReplyTo<()>),
    Add(i64, ReplyTo<i64>),
}

/// One entity per key: its state is just its value.
struct KeyEntity {
    value: i64,
}

impl Actor for KeyEntity {
    type Msg = KeyMsg;

    async fn handle(&mut self, msg: KeyMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            KeyMsg::Read(reply) => reply.reply(self.value),
            KeyMsg::Write(v, reply) => {
                self.value = v;
                reply.reply(());
            }
            KeyMsg::Add(d, reply) => {
                self.value += d;
                reply.reply(self.value);
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
struct Entities {
    keys: Region<KeyMsg>,
}

impl Entities {
    fn start(system: &ActorSystem) -> Self {
        let keys = system
            .sharding()
            .start(EntityType::new("key", |_id: &str| KeyEntity { value: 0 }).shards(OWNERS as u32))
            .expect("entity type starts");
        Entities { keys }
    }

    async fn call<R>(&self, key: u64, make: impl FnOnce(ReplyTo<R>) -> KeyMsg) -> R {
        let id = key.to_string();
        self.keys
            .ask(&id, make, TIMEOUT)
            .await
            .expect("entity answers")
    }
}

impl Store for Entities {
    fn name(&self) -> &'static str {
        "shardik entities"
    }
    async fn write(&self, key: u64, val: i64) {
        self.call(key, |r| KeyMsg::Write(val, r)).await
    }
    async fn add(&self, key: u64, delta: i64) -> i64 {
        self.call(key, |r| KeyMsg::Add(delta, r)).await
    }
    async fn read(&self, key: u64) -> i64 {
        self.call(key, KeyMsg::Read).await
    }
}

// ---- the workload ------------------------------------------------------------------------

/// What a run produced: the same for every correct variant.
#[derive(Debug, PartialEq, Eq)]
struct Answers {
    /// Sum over keys of `key * value`, a checksum of the final state.
    checksum: i128,
    /// Sum of all final values.
    total: i64,
    /// A few keys' final values, to print.
    samples: Vec<(u64, i64)>,
}

/// Each client walks its own deterministic sequence of keys. Writes only ever set a key to a
/// value derived from the key alone, and come before any add to that key (phase 1), so the
/// final state does not depend on how the clients interleave; adds commute (phase 2).
async fn run<S: Store>(store: S) -> (Answers, Duration) {
    let started = Instant::now();
    for phase in 0..2u64 {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..OPS_PER_CLIENT {
                        let key = (c * 7_919 + i * 104_729) % KEYS;
                        if phase == 0 {
                            store.write(key, (key % 97) as i64).await;
                        } else if i % 4 == 0 {
                            // Reads interleave with the adds of other clients.
                            std::hint::black_box(store.read(key).await);
                        } else {
                            store.add(key, (c + 1) as i64).await;
                        }
                    }
                })
            })
            .collect();
        for client in clients {
            client.await.expect("client finished");
        }
    }
    let mut checksum = 0i128;
    let mut total = 0i64;
    for key in 0..KEYS {
        let value = store.read(key).await;
        checksum += i128::from(key) * i128::from(value);
        total += value;
    }
    let mut samples = Vec::new();
    for key in [0, 1, 42, 4_242, KEYS - 1] {
        samples.push((key, store.read(key).await));
    }
    (
        Answers {
            checksum,
            total,
            samples,
        },
        started.elapsed(),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ops = CLIENTS * OPS_PER_CLIENT * 2 + KEYS;
    println!(
        "Go seed variants: {KEYS} keys, {CLIENTS} concurrent clients, {ops} operations each run, {OWNERS} owners/shards\n"
    );
    println!(
        "{:<26} {:>10} {:>14} {:>22} {:>12}",
        "variant", "time", "ops/s", "checksum", "total"
    );
    println!("{}", "-".repeat(88));

    let system = ActorSystem::new("go-seed");
    let mut results = Vec::new();
    results.push(report(ChannelOwners::start(), ops).await);
    results.push(report(MutexShards::new(), ops).await);
    results.push(report(Entities::start(&system), ops).await);
    system.shutdown().await;

    println!("\nsample final values (key = value):");
    for (name, answers) in &results {
        let samples: Vec<String> = answers
            .samples
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("  {name:<26} {}", samples.join("  "));
    }
    let first = &results[0].1;
    if results.iter().all(|(_, a)| a == first) {
        println!("\nall three variants give the same answers");
        Ok(())
    } else {
        Err("the variants disagree: per-key linearizability is broken somewhere".into())
    }
}

async fn report<S: Store>(store: S, ops: u64) -> (&'static str, Answers) {
    let name = store.name();
    let (answers, elapsed) = run(store).await;
    println!(
        "{:<26} {:>8.1}ms {:>14.0} {:>22} {:>12}",
        name,
        elapsed.as_secs_f64() * 1e3,
        ops as f64 / elapsed.as_secs_f64(),
        answers.checksum,
        answers.total
    );
    (name, answers)
}
