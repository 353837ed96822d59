//! Tell and ask to local and remote account entities, against the channel-owner pattern
//! (local) and the raw TCP lane (remote).
//!
//! - **tell** (`sharding_tell_{local,remote}_msgs_per_s`): [`SENDERS`] tasks `tell`
//!   `Deposit(1)` round-robin over the local (or remote) entities; the clock stops when the sum
//!   of their balances (asked through the region, after the tells) shows every deposit
//!   handled at the entity. A sender to remote entities pauses while more than
//!   [`REMOTE_HIGH_WATER`] frames wait in the connection's outbound queue (see below). The
//!   local baseline is the channel owners ([`Owners`]) with the same entity ids and senders,
//!   each increment counted where it is handled; the remote baseline is the raw lane
//!   ([`raw::tell`]) with the same senders and a [`RAW_PAYLOAD`]-byte payload (an entity id
//!   and an amount).
//! - **sequential ask** (`sharding_ask_seq_{local,remote}_{per_s,p50_us,p99_us}`): one
//!   `Balance` ask at a time through an `EntityRef`, round-robin over the entities; each round
//!   trip timed into an HDR histogram; the rate is asks over the whole recorded run. Baselines:
//!   `get` on the channel owners (mpsc + oneshot), raw TCP ping-pong.
//! - **concurrent ask** (`sharding_ask_concurrent_{local,remote}_per_s`): one task keeps
//!   [`IN_FLIGHT`] `Balance` asks outstanding. Baselines: the channel owners with 100
//!   outstanding `get`s, raw pipelined echo frames with 100 outstanding
//!   ([`raw::pipelined`]).
//!
//! Why the high-water mark: a region refuses a message whose node's outbound queue (100 000
//! frames) is full (`try_tell` hands it back, `tell` records a dead letter): there is no
//! waiting send, so without pacing a fast `tell` sender loses messages. The raw lane's senders
//! wait on a full queue, so both contenders are paced.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use shardik::prelude::*;
use tokio::net::TcpStream;

use super::account::AccountMsg;
use super::{Ctx, Net, SUITE};
use crate::harness::{block_on_task, Contender};
use crate::local::shard::driver::Store;
use crate::local::shard::owners::Owners;
use crate::local::shard::progress;
use crate::remote::raw;
use crate::report::{Better, Record};

/// Tells to the entities hosted on this node.
pub const TELL_LOCAL: &str = "sharding_tell_local_msgs_per_s";
/// Tells to the entities hosted on the child.
pub const TELL_REMOTE: &str = "sharding_tell_remote_msgs_per_s";
/// Sequential asks to local entities: rate, p50, p99.
pub const ASK_SEQ_LOCAL: &[&str] = &[
    "sharding_ask_seq_local_per_s",
    "sharding_ask_seq_local_p50_us",
    "sharding_ask_seq_local_p99_us",
];
/// Sequential asks to remote entities: rate, p50, p99.
pub const ASK_SEQ_REMOTE: &[&str] = &[
    "sharding_ask_seq_remote_per_s",
    "sharding_ask_seq_remote_p50_us",
    "sharding_ask_seq_remote_p99_us",
];
/// Asks with 100 in flight to local entities.
pub const ASK_CONCURRENT_LOCAL: &str = "sharding_ask_concurrent_local_per_s";
/// Asks with 100 in flight to remote entities.
pub const ASK_CONCURRENT_REMOTE: &str = "sharding_ask_concurrent_remote_per_s";

/// Sending tasks of the tell benchmarks.
pub const SENDERS: usize = 2;
/// Outstanding asks of the concurrent benchmarks.
pub const IN_FLIGHT: usize = 100;
/// Frames in the outbound queue above which a remote sender waits (the queue holds 100 000).
pub const REMOTE_HIGH_WATER: usize = 50_000;
/// Payload bytes of a raw baseline frame.
pub const RAW_PAYLOAD: usize = 16;
/// Asks done before recording starts in each sequential run.
const UNRECORDED: usize = 200;
const TIMEOUT: Duration = Duration::from_secs(30);

fn ids(net: &Net, remote: bool) -> Vec<&'static str> {
    if remote {
        net.remote_ids.clone()
    } else {
        net.local_ids.clone()
    }
}

async fn raw_stream(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("raw connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// `sharding_tell_local_msgs_per_s`.
pub fn tell_local(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.tell_local;
    let ids = ids(net, false);
    let mut contenders = [
        Contender::new("shardik", || {
            vec![block_on_task(
                rt,
                shardik_tell(net.region.clone(), ids.clone(), n, None),
            )]
        }),
        Contender::new("channel owners", || {
            vec![block_on_task(rt, owners_tell(ids.clone(), n))]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        TELL_LOCAL,
        m[0][0],
        m[1][0],
        "msg/s",
        Better::Higher,
    )]
}

/// `sharding_tell_remote_msgs_per_s`.
pub fn tell_remote(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.tell_remote;
    let ids = ids(net, true);
    let remote = net.cluster.remote().clone();
    let peer_addr = net.peer.id.address.clone();
    let raw_addr = net.peer.raw_addr.clone();
    let mut contenders = [
        Contender::new("shardik", || {
            vec![block_on_task(
                rt,
                shardik_tell(
                    net.region.clone(),
                    ids.clone(),
                    n,
                    Some((remote.clone(), peer_addr.clone())),
                ),
            )]
        }),
        Contender::new("raw tcp", || {
            let raw_addr = raw_addr.clone();
            vec![block_on_task(rt, async move {
                let (r, w) = raw_stream(&raw_addr).await.into_split();
                let payload = Bytes::from(vec![7u8; RAW_PAYLOAD]);
                raw::tell(r, w, SENDERS, n / SENDERS as u64, payload).await
            })]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        TELL_REMOTE,
        m[0][0],
        m[1][0],
        "msg/s",
        Better::Higher,
    )]
}

async fn sum_balances(region: &Region<AccountMsg>, ids: &[&'static str]) -> u64 {
    let mut pending: FuturesUnordered<_> = ids
        .iter()
        .map(|&id| region.ask(id, AccountMsg::Balance, TIMEOUT))
        .collect();
    let mut sum = 0;
    while let Some(b) = pending.next().await {
        sum += b.expect("an account answers its balance");
    }
    sum
}

/// One shardik tell run: `n` deposits (split over [`SENDERS`] tasks) to `ids`, paced by the
/// outbound queue to `pace`'s node if given; returns deposits handled per second.
async fn shardik_tell(
    region: Region<AccountMsg>,
    ids: Vec<&'static str>,
    n: u64,
    pace: Option<(shardik::remote::Remote, String)>,
) -> f64 {
    let dead_before = region.system().dead_letters().total();
    let before = sum_balances(&region, &ids).await;
    let per_sender = n / SENDERS as u64;
    let total = per_sender * SENDERS as u64;
    let start = Instant::now();
    let tasks: Vec<_> = (0..SENDERS)
        .map(|s| {
            let (region, ids, pace) = (region.clone(), ids.clone(), pace.clone());
            tokio::spawn(async move {
                let mut next = s;
                for i in 0..per_sender {
                    if i % 256 == 0 {
                        if let Some((remote, addr)) = &pace {
                            while remote.queued(addr) > REMOTE_HIGH_WATER {
                                tokio::time::sleep(Duration::from_micros(200)).await;
                            }
                        }
                    }
                    region.tell(ids[next], AccountMsg::Deposit(1));
                    next += 1;
                    if next == ids.len() {
                        next = 0;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a sender panicked");
    }
    loop {
        let now = sum_balances(&region, &ids).await;
        if now - before >= total {
            assert_eq!(now - before, total, "more deposits than sent");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "only {} of {total} deposits arrived; dead letters {} (before: {dead_before})",
            now - before,
            region.system().dead_letters().total()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// One channel-owner tell run over the same ids; returns increments handled per second.
async fn owners_tell(ids: Vec<&'static str>, n: u64) -> f64 {
    let owners = Owners::start().await;
    let per_sender = n / SENDERS as u64;
    let total = per_sender * SENDERS as u64;
    progress::reset();
    let start = Instant::now();
    let tasks: Vec<_> = (0..SENDERS)
        .map(|s| {
            let (owners, ids) = (owners.clone(), ids.clone());
            tokio::spawn(async move {
                let mut next = s;
                for _ in 0..per_sender {
                    owners.tell_add(ids[next]);
                    next += 1;
                    if next == ids.len() {
                        next = 0;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a sender panicked");
    }
    progress::wait_for(total).await;
    let rate = total as f64 / start.elapsed().as_secs_f64();
    owners.stop().await;
    rate
}

/// A histogram of latencies in nanoseconds.
fn histogram() -> Histogram<u64> {
    crate::remote::ask::histogram()
}

/// `[rate, p50 us, p99 us]` of `h` recorded over `secs`.
fn figures(h: &Histogram<u64>, secs: f64) -> Vec<f64> {
    vec![
        h.len() as f64 / secs,
        h.value_at_quantile(0.50) as f64 / 1_000.0,
        h.value_at_quantile(0.99) as f64 / 1_000.0,
    ]
}

/// Times `UNRECORDED + n` sequential calls of `ask(i)`, recording the last `n`.
async fn sequential<F, Fut>(n: usize, mut ask: F) -> Vec<f64>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut h = histogram();
    let mut recorded_from = Instant::now();
    for i in 0..UNRECORDED + n {
        if i == UNRECORDED {
            recorded_from = Instant::now();
        }
        let start = Instant::now();
        ask(i).await;
        if i >= UNRECORDED {
            h.saturating_record((start.elapsed().as_nanos() as u64).max(1));
        }
    }
    figures(&h, recorded_from.elapsed().as_secs_f64())
}

async fn shardik_seq(region: Region<AccountMsg>, ids: Vec<&'static str>, n: usize) -> Vec<f64> {
    let refs: Vec<EntityRef<AccountMsg>> = ids.iter().map(|id| region.entity_ref(*id)).collect();
    sequential(n, |i| {
        let to = &refs[i % refs.len()];
        async move {
            to.ask(AccountMsg::Balance, TIMEOUT)
                .await
                .expect("an account answers");
        }
    })
    .await
}

fn seq_records(names: &[&str], m: &[Vec<f64>]) -> Vec<Record> {
    vec![
        Record::new(SUITE, names[0], m[0][0], m[1][0], "ask/s", Better::Higher),
        Record::new(SUITE, names[1], m[0][1], m[1][1], "us", Better::Lower),
        Record::new(SUITE, names[2], m[0][2], m[1][2], "us", Better::Lower),
    ]
}

/// `sharding_ask_seq_local_{per_s,p50_us,p99_us}`.
pub fn ask_seq_local(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.ask_seq_local;
    let ids = ids(net, false);
    let mut contenders = [
        Contender::new("shardik", || {
            block_on_task(rt, shardik_seq(net.region.clone(), ids.clone(), n))
        }),
        Contender::new("channel owners", || {
            let ids = ids.clone();
            block_on_task(rt, async move {
                let owners = Owners::start().await;
                let out = sequential(n, |i| {
                    let (owners, id) = (&owners, ids[i % ids.len()]);
                    async move {
                        owners.get(id).await;
                    }
                })
                .await;
                owners.stop().await;
                out
            })
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    seq_records(ASK_SEQ_LOCAL, &m)
}

/// `sharding_ask_seq_remote_{per_s,p50_us,p99_us}`.
pub fn ask_seq_remote(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.ask_seq_remote;
    let ids = ids(net, true);
    let raw_addr = net.peer.raw_addr.clone();
    let mut contenders = [
        Contender::new("shardik", || {
            block_on_task(rt, shardik_seq(net.region.clone(), ids.clone(), n))
        }),
        Contender::new("raw ping-pong", || {
            let raw_addr = raw_addr.clone();
            block_on_task(rt, async move {
                let (r, w) = raw_stream(&raw_addr).await.into_split();
                let mut warm = histogram();
                let (mut r, mut w) = (r, w);
                raw::ping_pong(&mut r, &mut w, UNRECORDED, &mut warm).await;
                let mut h = histogram();
                let start = Instant::now();
                raw::ping_pong(&mut r, &mut w, n, &mut h).await;
                figures(&h, start.elapsed().as_secs_f64())
            })
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    seq_records(ASK_SEQ_REMOTE, &m)
}

/// `n` asks made by `ask(i)`, [`IN_FLIGHT`] outstanding; returns asks per second.
async fn concurrent<F, Fut>(n: u64, ask: F) -> f64
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    let mut pending = FuturesUnordered::new();
    let mut issued = 0u64;
    while issued < n.min(IN_FLIGHT as u64) {
        pending.push(ask(issued));
        issued += 1;
    }
    while pending.next().await.is_some() {
        if issued < n {
            pending.push(ask(issued));
            issued += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn shardik_concurrent(region: Region<AccountMsg>, ids: Vec<&'static str>, n: u64) -> f64 {
    let refs: Vec<EntityRef<AccountMsg>> = ids.iter().map(|id| region.entity_ref(*id)).collect();
    concurrent(n, |i| {
        let to = &refs[i as usize % refs.len()];
        async move {
            to.ask(AccountMsg::Balance, TIMEOUT)
                .await
                .expect("an account answers");
        }
    })
    .await
}

/// `sharding_ask_concurrent_local_per_s`.
pub fn ask_concurrent_local(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.ask_concurrent_local;
    let ids = ids(net, false);
    let mut contenders = [
        Contender::new("shardik", || {
            vec![block_on_task(
                rt,
                shardik_concurrent(net.region.clone(), ids.clone(), n),
            )]
        }),
        Contender::new("channel owners", || {
            let ids = ids.clone();
            vec![block_on_task(rt, async move {
                let owners = Owners::start().await;
                let rate = concurrent(n, |i| {
                    let (owners, id) = (&owners, ids[i as usize % ids.len()]);
                    async move {
                        owners.get(id).await;
                    }
                })
                .await;
                owners.stop().await;
                rate
            })]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        ASK_CONCURRENT_LOCAL,
        m[0][0],
        m[1][0],
        "ask/s",
        Better::Higher,
    )]
}

/// `sharding_ask_concurrent_remote_per_s`.
pub fn ask_concurrent_remote(ctx: &Ctx) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let n = ctx.sizes.ask_concurrent_remote;
    let ids = ids(net, true);
    let raw_addr = net.peer.raw_addr.clone();
    let mut contenders = [
        Contender::new("shardik", || {
            vec![block_on_task(
                rt,
                shardik_concurrent(net.region.clone(), ids.clone(), n),
            )]
        }),
        Contender::new("raw pipelined", || {
            let raw_addr = raw_addr.clone();
            vec![block_on_task(rt, async move {
                let (r, w) = raw_stream(&raw_addr).await.into_split();
                raw::pipelined(r, w, n, IN_FLIGHT as u64).await
            })]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        ASK_CONCURRENT_REMOTE,
        m[0][0],
        m[1][0],
        "ask/s",
        Better::Higher,
    )]
}
