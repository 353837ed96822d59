//! One-way tell throughput, counted at the receiver.
//!
//! shardik: `pairs` sender tasks in this process each `try_tell` `n` `BenchMsg::Data` (100-byte
//! payload) to their own sink actor on the peer (all over the one connection between the two
//! nodes), then ask the sink for its count; the figure is messages counted by the sinks per
//! second, from the first tell to the last count answer. A full outbound queue (100 000 frames)
//! makes a sender sleep 1 ms and retry, so nothing is dropped. The baseline is the raw lane
//! ([`super::raw::tell`]) with the same number of senders over one fresh connection.

use std::time::Instant;

use bytes::Bytes;
use shardik::prelude::AskError;
use shardik::remote::{Remote, RemoteRef, SendError};
use tokio::net::TcpStream;

use super::{payload, sink_path, BenchMsg, Ctx, ASK_TIMEOUT, SUITE};
use crate::harness::{block_on_task, Contender};
use crate::report::{Better, Record};

/// One sender, one receiver, plain TCP.
pub const ONE_PAIR: &str = "remote_tell_1pair_msgs_per_s";
/// Four senders, four receivers, one connection, plain TCP.
pub const FOUR_PAIRS: &str = "remote_tell_4pairs_msgs_per_s";
/// One sender, one receiver, mutual TLS.
pub const TLS_ONE_PAIR: &str = "remote_tell_tls_1pair_msgs_per_s";

/// `remote_tell_1pair_msgs_per_s`.
pub fn one_pair(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, ONE_PAIR, 1, ctx.sizes.tell_1pair, false)
}

/// `remote_tell_4pairs_msgs_per_s`.
pub fn four_pairs(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, FOUR_PAIRS, 4, ctx.sizes.tell_4pairs, false)
}

/// `remote_tell_tls_1pair_msgs_per_s`: shardik over mutual TLS vs the raw lane over
/// tokio-rustls with the same certificates.
pub fn tls_one_pair(ctx: &Ctx) -> Vec<Record> {
    compare(ctx, TLS_ONE_PAIR, 1, ctx.sizes.tell_tls, true)
}

fn compare(ctx: &Ctx, name: &str, pairs: usize, n: u64, tls: bool) -> Vec<Record> {
    let net = ctx.net();
    let rt = &ctx.rt;
    let (node, addr, raw_addr) = if tls {
        (&net.tls_node, &net.addrs.tls_node, &net.addrs.raw_tls)
    } else {
        (&net.node, &net.addrs.node, &net.addrs.raw)
    };
    let raw_tls = net.raw_tls.clone();
    let mut contenders = [
        Contender::new("shardik", || {
            vec![block_on_task(
                rt,
                shardik_tell(node.clone(), addr.clone(), pairs, n),
            )]
        }),
        Contender::new("raw tcp", || {
            let raw_addr = raw_addr.clone();
            let raw_tls = raw_tls.clone();
            vec![block_on_task(rt, async move {
                let stream = TcpStream::connect(&raw_addr).await.expect("raw connect");
                stream.set_nodelay(true).expect("nodelay");
                if tls {
                    let s = raw_tls
                        .connector
                        .connect(raw_tls.server_name.clone(), stream)
                        .await
                        .expect("raw TLS handshake");
                    let (r, w) = tokio::io::split(s);
                    super::raw::tell(r, w, pairs, n, payload()).await
                } else {
                    let (r, w) = stream.into_split();
                    super::raw::tell(r, w, pairs, n, payload()).await
                }
            })]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        name,
        m[0][0],
        m[1][0],
        "msg/s",
        Better::Higher,
    )]
}

async fn send_all(to: RemoteRef<BenchMsg>, n: u64, payload: Bytes) {
    for _ in 0..n {
        loop {
            match to.try_tell(BenchMsg::Data {
                payload: payload.clone(),
            }) {
                Ok(()) => break,
                Err(SendError::QueueFull(_)) => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await
                }
                Err(e) => panic!("remote tell failed: {e}"),
            }
        }
    }
    // The other senders may still fill the shared queue: retry a refused count request.
    let counted = loop {
        match to.ask(|reply| BenchMsg::Count { reply }, ASK_TIMEOUT).await {
            Ok(counted) => break counted,
            Err(AskError::Undeliverable(why)) if why.contains("full") => {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await
            }
            Err(e) => panic!("the sink did not answer its count: {e}"),
        }
    };
    assert_eq!(counted, n, "every tell was handled by the sink");
}

/// One shardik run; returns messages handled at the receivers per second.
pub async fn shardik_tell(node: Remote, addr: String, pairs: usize, n: u64) -> f64 {
    let payload = payload();
    let refs: Vec<RemoteRef<BenchMsg>> = (0..pairs)
        .map(|i| node.lookup(&sink_path(i), &addr))
        .collect();
    let start = Instant::now();
    let tasks: Vec<_> = refs
        .into_iter()
        .map(|to| tokio::spawn(send_all(to, n, payload.clone())))
        .collect();
    for t in tasks {
        t.await.expect("shardik sender task");
    }
    (pairs as u64 * n) as f64 / start.elapsed().as_secs_f64()
}
