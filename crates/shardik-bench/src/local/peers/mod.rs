//! Peers (feature `peers`): the ping-pong tell and sequential ask shapes of [`super::pingpong`]
//! and [`super::ask`] against other Rust actor crates, alternated with shardik in this run.
//!
//! Records are `peer_{crate}_{shape}` with `value` = shardik and `baseline` = the peer, so a
//! ratio above 1 still means shardik did better. Each peer is used the way its documentation
//! shows, with an unbounded mailbox where it has a choice:
//!
//! - [`kameo`]: actors on the same 2-worker tokio runtime; `tell(..).try_send()`, `ask(..)`
//!   (no reply timeout).
//! - [`ractor`]: same runtime; `cast`, `call(.., None)` (no timeout).
//! - [`actix`]: actix runs its actors on a single-threaded arbiter, so each run gets its own
//!   `actix::System` on a fresh thread; `do_send`, `send(..).await`.
//!
//! shardik's `ask` always arms a timeout; the peers' asks above do not.

pub mod actix;
pub mod kameo;
pub mod ractor;

use super::ask::shardik_asks;
use super::pingpong::{shardik_pingpong, Shape};
use super::{Bench, Ctx, SUITE};
use crate::harness::{block_on_task, Contender};
use crate::report::{Better, Record};

/// How one peer runs the two shapes: ping-pong (messages per second) and sequential asks
/// (`[p50, p99]` in microseconds).
pub struct Peer {
    /// The crate's name, as it appears in record names.
    pub name: &'static str,
    /// One ping-pong run.
    pub pingpong: fn(&tokio::runtime::Runtime, Shape) -> f64,
    /// One run of `n` recorded sequential asks.
    pub asks: fn(&tokio::runtime::Runtime, usize) -> Vec<f64>,
}

const PEERS: [Peer; 3] = [kameo::PEER, ractor::PEER, actix::PEER];

/// The peer benchmarks for the suite's list: record names (for `--filter`) and runner.
pub fn benches() -> Vec<Bench> {
    let runs: [fn(&Ctx) -> Vec<Record>; 3] = [run_peer::<0>, run_peer::<1>, run_peer::<2>];
    PEER_RECORDS
        .iter()
        .zip(runs)
        .map(|(records, run)| Bench { records, run })
        .collect()
}

/// Record names per peer, in [`PEERS`] order.
const PEER_RECORDS: [[&str; 4]; 3] = [
    [
        "peer_kameo_tell_pingpong_1pair_msgs_per_s",
        "peer_kameo_tell_pingpong_4pairs_100inflight_msgs_per_s",
        "peer_kameo_ask_seq_p50_us",
        "peer_kameo_ask_seq_p99_us",
    ],
    [
        "peer_ractor_tell_pingpong_1pair_msgs_per_s",
        "peer_ractor_tell_pingpong_4pairs_100inflight_msgs_per_s",
        "peer_ractor_ask_seq_p50_us",
        "peer_ractor_ask_seq_p99_us",
    ],
    [
        "peer_actix_tell_pingpong_1pair_msgs_per_s",
        "peer_actix_tell_pingpong_4pairs_100inflight_msgs_per_s",
        "peer_actix_ask_seq_p50_us",
        "peer_actix_ask_seq_p99_us",
    ],
];

/// Runs the shapes selected by `--filter` for peer `I`, each alternated with shardik.
fn run_peer<const I: usize>(ctx: &Ctx) -> Vec<Record> {
    let peer = &PEERS[I];
    let names = &PEER_RECORDS[I];
    assert!(
        names[0].contains(peer.name),
        "PEERS and PEER_RECORDS disagree"
    );
    let rt = &ctx.rt;
    let mut out = Vec::new();
    let shapes = [
        (
            names[0],
            Shape {
                pairs: 1,
                balls: 1,
                hops: ctx.sizes.pingpong_1pair_msgs,
            },
        ),
        (
            names[1],
            Shape {
                pairs: 4,
                balls: 100,
                hops: ctx.sizes.pingpong_4pairs_hops,
            },
        ),
    ];
    for (name, shape) in shapes {
        if !ctx.opts.selects(name) {
            continue;
        }
        let mut contenders = [
            Contender::new("shardik", || {
                vec![block_on_task(rt, shardik_pingpong(shape))]
            }),
            Contender::new(peer.name, || vec![(peer.pingpong)(rt, shape)]),
        ];
        let m = ctx.alternate(&mut contenders);
        out.push(Record::new(
            SUITE,
            name,
            m[0][0],
            m[1][0],
            "msg/s",
            Better::Higher,
        ));
    }
    if ctx.opts.selects(names[2]) || ctx.opts.selects(names[3]) {
        let n = ctx.sizes.ask_seq;
        let mut contenders = [
            Contender::new("shardik", || block_on_task(rt, shardik_asks(n))),
            Contender::new(peer.name, || (peer.asks)(rt, n)),
        ];
        let m = ctx.alternate(&mut contenders);
        out.push(Record::new(
            SUITE,
            names[2],
            m[0][0],
            m[1][0],
            "us",
            Better::Lower,
        ));
        out.push(Record::new(
            SUITE,
            names[3],
            m[0][1],
            m[1][1],
            "us",
            Better::Lower,
        ));
    }
    out
}
