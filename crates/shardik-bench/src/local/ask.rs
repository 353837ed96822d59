//! Sequential ask latency: one asker, one actor that replies, one request at a time.
//!
//! Each request's round trip (build the request, queue it, the actor handles it and replies,
//! the asker wakes with the answer) is timed with `Instant` and recorded in an HDR histogram in
//! nanoseconds; the figures are its p50 and p99 in microseconds. shardik uses
//! [`ActorRef::ask`] (which arms its timeout); the baseline is two tokio tasks, the asker
//! sending `(n, oneshot::Sender)` over an unbounded mpsc channel and awaiting the oneshot.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use shardik::prelude::*;
use tokio::sync::{mpsc, oneshot};

use super::{Ctx, SUITE};
use crate::harness::{block_on_task, Contender};
use crate::report::{Better, Record};

/// Median sequential ask latency.
pub const P50: &str = "ask_seq_p50_us";
/// 99th percentile sequential ask latency.
pub const P99: &str = "ask_seq_p99_us";

/// Asks done before recording starts in each run (first turns, allocator, caches).
const UNRECORDED: usize = 1_000;
const TIMEOUT: Duration = Duration::from_secs(10);

/// `ask_seq_p50_us` and `ask_seq_p99_us`.
pub fn sequential(ctx: &Ctx) -> Vec<Record> {
    let rt = &ctx.rt;
    let n = ctx.sizes.ask_seq;
    let mut contenders = [
        Contender::new("shardik", || block_on_task(rt, shardik_asks(n))),
        Contender::new("mpsc+oneshot", || block_on_task(rt, tokio_asks(n))),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![
        Record::new(SUITE, P50, m[0][0], m[1][0], "us", Better::Lower),
        Record::new(SUITE, P99, m[0][1], m[1][1], "us", Better::Lower),
    ]
}

/// A histogram of latencies in nanoseconds, 1 ns to 10 s, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid histogram bounds")
}

/// `[p50, p99]` of `h` in microseconds.
fn percentiles_us(h: &Histogram<u64>) -> Vec<f64> {
    vec![
        h.value_at_quantile(0.50) as f64 / 1_000.0,
        h.value_at_quantile(0.99) as f64 / 1_000.0,
    ]
}

/// The request of the ask benchmark.
pub struct Echo(pub u64, pub ReplyTo<u64>);

/// Replies with the number it was sent.
pub struct Echoer;

impl Actor for Echoer {
    type Msg = Echo;

    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        msg.1.reply(msg.0);
        Ok(())
    }
}

/// Runs `UNRECORDED + n` sequential requests `ask(i)`, each expected to answer `i`, and returns
/// `[p50, p99]` of the last `n` round trips in microseconds. Shared by shardik, the baseline and
/// the peers so that all are timed the same way.
pub async fn record<F, Fut>(n: usize, mut ask: F) -> Vec<f64>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let mut h = histogram();
    for i in 0..(UNRECORDED + n) as u64 {
        let start = Instant::now();
        let got = ask(i).await;
        let ns = start.elapsed().as_nanos() as u64;
        assert_eq!(got, i, "a request was answered with another one's value");
        if i >= UNRECORDED as u64 {
            h.saturating_record(ns.max(1));
        }
    }
    percentiles_us(&h)
}

/// One run of `n` recorded asks to a shardik actor; returns `[p50, p99]` in microseconds.
pub async fn shardik_asks(n: usize) -> Vec<f64> {
    let system = ActorSystem::new("bench-ask");
    let echo = system.spawn(Echoer);
    let out = record(n, |i| {
        let echo = &echo;
        async move {
            echo.ask(|r| Echo(i, r), TIMEOUT)
                .await
                .expect("the echo actor answers")
        }
    })
    .await;
    system.shutdown().await;
    out
}

/// One run of `n` recorded requests between two tokio tasks; returns `[p50, p99]` in
/// microseconds.
pub async fn tokio_asks(n: usize) -> Vec<f64> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, oneshot::Sender<u64>)>();
    let server = tokio::spawn(async move {
        while let Some((i, reply)) = rx.recv().await {
            let _ = reply.send(i);
        }
    });
    let out = record(n, |i| {
        let tx = &tx;
        async move {
            let (reply, answer) = oneshot::channel();
            tx.send((i, reply)).expect("the server task runs");
            answer.await.expect("the server task answers")
        }
    })
    .await;
    drop(tx);
    let _ = server.await;
    out
}
