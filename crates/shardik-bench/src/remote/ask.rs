//! Ask round trips across the two processes, sequential and at fixed open-loop rates.
//!
//! shardik: `RemoteRef::ask` of `BenchMsg::Echo` to the peer's echo actor, which replies with
//! the number it was sent; the reply travels back as a reply frame on the same connection.
//! The baseline is raw TCP ping-pong: a 9-byte `ECHO` frame written, echoed by the raw
//! server's reader, read back ([`super::raw`]).
//!
//! - Sequential: one request at a time; each round trip is timed and recorded in an HDR
//!   histogram; p50 and p99 in microseconds.
//! - Open loop at 1 k, 10 k and 100 k requests per second: request `i` is due at `i / rate`
//!   seconds, whatever the answers do. The driver wakes when the next one is due (tokio's
//!   timer has 1 ms granularity, so at 10 k/s and 100 k/s requests leave in bursts of about
//!   10 and 100 per millisecond, for both contenders) and sends every due request; a round
//!   trip is timed from the moment its request is sent to its answer.

use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use shardik::remote::Remote;
use tokio::net::TcpStream;

use super::{BenchMsg, Ctx, ASK_TIMEOUT, ECHO_PATH, SUITE};
use crate::harness::{block_on_task, Contender};
use crate::report::{Better, Record};

/// Median sequential round trip.
pub const SEQ_P50: &str = "remote_ask_seq_p50_us";
/// 99th percentile sequential round trip.
pub const SEQ_P99: &str = "remote_ask_seq_p99_us";
/// The open-loop records, `[p50, p99]` per rate in [`RATES`] order.
pub const OPEN_LOOP: &[&str] = &[
    "remote_ask_1k_per_s_p50_us",
    "remote_ask_1k_per_s_p99_us",
    "remote_ask_10k_per_s_p50_us",
    "remote_ask_10k_per_s_p99_us",
    "remote_ask_100k_per_s_p50_us",
    "remote_ask_100k_per_s_p99_us",
];
/// Open-loop request rates per second.
pub const RATES: [f64; 3] = [1_000.0, 10_000.0, 100_000.0];

/// A histogram of latencies in nanoseconds, 1 ns to 60 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// `[p50, p99]` of `h` in microseconds.
fn percentiles_us(h: &Histogram<u64>) -> Vec<f64> {
    vec![
        h.value_at_quantile(0.50) as f64 / 1_000.0,
        h.value_at_quantile(0.99) as f64 / 1_000.0,
    ]
}

/// How many of `total` requests at `rate` per second are due since `base`.
pub fn due(base: Instant, rate: f64, total: u64) -> u64 {
    ((base.elapsed().as_secs_f64() * rate) as u64 + 1).min(total)
}

/// When request `i` at `rate` per second is due.
pub fn when(base: Instant, rate: f64, i: u64) -> Instant {
    base + Duration::from_secs_f64(i as f64 / rate)
}

async fn raw_stream(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("raw connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// `remote_ask_seq_p50_us` and `remote_ask_seq_p99_us`.
pub fn sequential(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.ask_seq;
    let mut contenders = [
        Contender::new("shardik", || {
            block_on_task(rt, shardik_seq(net.node.clone(), net.addrs.node.clone(), n))
        }),
        Contender::new("raw ping-pong", || {
            let addr = net.addrs.raw.clone();
            block_on_task(rt, async move {
                let (r, w) = raw_stream(&addr).await.into_split();
                let mut h = histogram();
                super::raw::ping_pong(r, w, n, &mut h).await;
                percentiles_us(&h)
            })
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![
        Record::new(SUITE, SEQ_P50, m[0][0], m[1][0], "us", Better::Lower),
        Record::new(SUITE, SEQ_P99, m[0][1], m[1][1], "us", Better::Lower),
    ]
}

async fn shardik_seq(node: Remote, addr: String, n: usize) -> Vec<f64> {
    let to = node.lookup::<BenchMsg>(ECHO_PATH, &addr);
    let mut h = histogram();
    for i in 0..n as u64 {
        let start = Instant::now();
        let answer = to
            .ask(|reply| BenchMsg::Echo { n: i, reply }, ASK_TIMEOUT)
            .await;
        let ns = start.elapsed().as_nanos() as u64;
        assert_eq!(answer, Ok(i), "the echo actor answers");
        h.record(ns.max(1)).expect("latency in range");
    }
    percentiles_us(&h)
}

/// `remote_ask_{1k,10k,100k}_per_s_{p50,p99}_us`; rates whose records are not selected by
/// `--filter` are skipped.
pub fn open_loop(ctx: &Ctx) -> Vec<Record> {
    let mut records = Vec::new();
    for (i, rate) in RATES.into_iter().enumerate() {
        let (p50, p99) = (OPEN_LOOP[2 * i], OPEN_LOOP[2 * i + 1]);
        if !ctx.opts.selects(p50) && !ctx.opts.selects(p99) {
            continue;
        }
        let net = ctx.net();
        let rt = &ctx.rt;
        // The 1 k/s rate runs twice as long, for enough samples behind its p99.
        let secs = ctx.sizes.open_loop.as_secs_f64() * if i == 0 { 2.0 } else { 1.0 };
        let total = ((rate * secs) as u64).max(50);
        let mut contenders = [
            Contender::new("shardik", || {
                block_on_task(
                    rt,
                    shardik_open_loop(net.node.clone(), net.addrs.node.clone(), rate, total),
                )
            }),
            Contender::new("raw pipelined", || {
                let addr = net.addrs.raw.clone();
                block_on_task(rt, async move {
                    let (r, w) = raw_stream(&addr).await.into_split();
                    percentiles_us(&super::raw::open_loop(r, w, rate, total).await)
                })
            }),
        ];
        let m = ctx.alternate(&mut contenders);
        records.push(Record::new(
            SUITE,
            p50,
            m[0][0],
            m[1][0],
            "us",
            Better::Lower,
        ));
        records.push(Record::new(
            SUITE,
            p99,
            m[0][1],
            m[1][1],
            "us",
            Better::Lower,
        ));
    }
    records
}

async fn shardik_open_loop(node: Remote, addr: String, rate: f64, total: u64) -> Vec<f64> {
    let to = node.lookup::<BenchMsg>(ECHO_PATH, &addr);
    let mut h = histogram();
    let mut inflight = FuturesUnordered::new();
    let base = Instant::now();
    let (mut issued, mut done) = (0u64, 0u64);
    while done < total {
        let due = due(base, rate, total);
        while issued < due {
            let to = to.clone();
            let i = issued;
            inflight.push(async move {
                let start = Instant::now();
                let answer = to
                    .ask(|reply| BenchMsg::Echo { n: i, reply }, ASK_TIMEOUT)
                    .await;
                (start.elapsed(), answer, i)
            });
            issued += 1;
        }
        tokio::select! {
            Some((rtt, answer, i)) = inflight.next(), if !inflight.is_empty() => {
                assert_eq!(answer, Ok(i), "the echo actor answers");
                h.record((rtt.as_nanos() as u64).max(1)).expect("latency in range");
                done += 1;
            }
            _ = tokio::time::sleep_until(when(base, rate, issued).into()), if issued < total => {}
        }
    }
    percentiles_us(&h)
}
