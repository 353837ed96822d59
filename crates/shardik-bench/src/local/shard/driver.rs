//! The one driver every variant runs under, so all of them see the same workload shape.
//!
//! A run: start the store; warm up with one increment-and-get ask per key (shardik spawns its
//! entities here, the owners and mutex maps insert their keys), untimed; then the timed part
//! (tells from [`PRODUCERS`] tasks until every tell is handled, or asks from [`ASKERS`] tasks
//! with [`IN_FLIGHT`] each outstanding); then, untimed, read every key's counter back and
//! compare the totals with the workload's (a mismatch panics: a fast wrong answer is no
//! answer); then shut the store down.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::progress;
use super::workload::{Totals, Workload};

/// Tasks sending the tells of a tell run.
pub const PRODUCERS: usize = 4;
/// Tasks sending the asks of an ask run.
pub const ASKERS: usize = 4;
/// Asks each asking task keeps outstanding (400 in flight in all).
pub const IN_FLIGHT: usize = 100;

/// A keyed counter store: shardik entities or one of the plain patterns.
pub trait Store: Clone + Send + Sync + 'static {
    /// True if `tell_add` has done its work when it returns (no need to wait for handling).
    const SYNC: bool;
    /// Starts an empty store.
    fn start() -> impl Future<Output = Self> + Send;
    /// Adds one to `key`'s counter, fire and forget. Asynchronous stores count the handled
    /// increment with [`progress::handled`].
    fn tell_add(&self, key: &'static str);
    /// Adds one to `key`'s counter and returns the new value.
    fn ask_add(&self, key: &'static str) -> impl Future<Output = u64> + Send;
    /// Reads `key`'s counter.
    fn get(&self, key: &'static str) -> impl Future<Output = u64> + Send;
    /// Stops the store and waits until it has.
    fn stop(self) -> impl Future<Output = ()> + Send;
}

/// Which timed part a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Fire-and-forget increments.
    Tell,
    /// Increment-and-get asks with [`IN_FLIGHT`] outstanding per asker.
    Ask,
}

/// One run of `op` over `work` with store `S`; returns messages per second after checking
/// the totals.
pub async fn run<S: Store>(variant: &str, op: Op, work: Arc<Workload>) -> f64 {
    let store = S::start().await;
    let warm = &store;
    for_each_key(&work, move |k| async move {
        warm.ask_add(k).await;
    })
    .await;
    progress::reset();
    let start = Instant::now();
    match op {
        Op::Tell => {
            let tasks: Vec<_> = (0..PRODUCERS)
                .map(|p| {
                    let (store, work) = (store.clone(), work.clone());
                    tokio::spawn(async move {
                        for &k in work.slice(p, PRODUCERS) {
                            store.tell_add(work.key(k));
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("a producer panicked");
            }
            if !S::SYNC {
                progress::wait_for(work.seq.len() as u64).await;
            }
        }
        Op::Ask => {
            let tasks: Vec<_> = (0..ASKERS)
                .map(|a| {
                    let (store, work) = (store.clone(), work.clone());
                    tokio::spawn(async move { ask_slice(&store, &work, a).await })
                })
                .collect();
            for t in tasks {
                t.await.expect("an asker panicked");
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let totals = read_totals(&store, &work).await;
    store.stop().await;
    assert_eq!(
        totals, work.expected,
        "{variant} ({op:?}) ended with other counters than the workload implies"
    );
    work.seq.len() as f64 / secs
}

/// Asker `a`'s part of the sequence, [`IN_FLIGHT`] at a time.
async fn ask_slice<S: Store>(store: &S, work: &Workload, a: usize) {
    let mut keys = work.slice(a, ASKERS).iter().map(|&k| work.key(k));
    if S::SYNC {
        for k in keys {
            store.ask_add(k).await;
        }
        return;
    }
    let mut pending = FuturesUnordered::new();
    for k in keys.by_ref().take(IN_FLIGHT) {
        pending.push(store.ask_add(k));
    }
    while pending.next().await.is_some() {
        if let Some(k) = keys.next() {
            pending.push(store.ask_add(k));
        }
    }
}

/// Runs `f` once per key, [`IN_FLIGHT`] * [`ASKERS`] at a time.
async fn for_each_key<F, Fut>(work: &Workload, f: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut keys = work.keys.iter().copied();
    let mut pending = FuturesUnordered::new();
    for k in keys.by_ref().take(IN_FLIGHT * ASKERS) {
        pending.push(f(k));
    }
    while pending.next().await.is_some() {
        if let Some(k) = keys.next() {
            pending.push(f(k));
        }
    }
}

/// Reads every key's counter back.
async fn read_totals<S: Store>(store: &S, work: &Workload) -> Totals {
    let totals = parking_lot::Mutex::new(Totals::default());
    let sum = &totals;
    for_each_key(work, move |k| async move {
        let count = store.get(k).await;
        sum.lock().add(k, count);
    })
    .await;
    totals.into_inner()
}
