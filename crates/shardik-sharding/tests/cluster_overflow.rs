//! A full outbound queue toward the node hosting an entity is an error the sender sees: the
//! region hands the message back (`try_tell` returns it, `ask` fails at once with
//! `MailboxFull`), counts it, and what it accepted is delivered once the queue drains.
//!
//! The test runs on a current-thread runtime: while it sends without awaiting, the writer
//! task toward the peer cannot run, so the queue fills after exactly its capacity.

mod cluster_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_util::*;
use shardik_actor::{AskError, TellError};
use shardik_sharding::cluster::ClusterSharding;
use shardik_sharding::ShardingError;

const QUEUE: usize = 16;

async fn node(id: &str, seed: Option<&str>, reg: &Arc<Registry>) -> Node {
    let mut c = config(id);
    c.remote = c.remote.outbound_queue(QUEUE);
    if let Some(seed) = seed {
        c = c.seed_nodes([seed.to_string()]);
    }
    let (system, cluster) = up(id, c).await;
    let sharding = ClusterSharding::get(&cluster);
    let region = start_probe(&sharding, id, 8, reg, settings());
    Node {
        system,
        cluster,
        sharding,
        region,
    }
}

#[tokio::test]
async fn full_peer_queue_hands_the_message_back() {
    let reg = Arc::new(Registry::default());
    let n0 = node("n0", None, &reg).await;
    let n1 = node("n1", Some(&n0.id().address), &reg).await;
    let nodes = [n0, n1];
    all_up(&nodes).await;
    registered(&nodes[0], 2).await;
    // An entity on n1, its home known to n0.
    let mut id = None;
    for i in 0..100 {
        let e = format!("e{i}");
        if where_is(&nodes[0], &e).await == "n1" {
            id = Some(e);
            break;
        }
    }
    let id = id.expect("an entity on n1");

    // No await in this loop: n0's writer toward n1 cannot drain the queue.
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for seq in 0..(QUEUE as u64 * 4) {
        match nodes[0].region.try_tell(&id, Msg::Add { sender: 7, seq }) {
            Ok(()) => accepted.push(seq),
            Err(TellError::MailboxFull(Msg::Add { seq: back, .. })) => {
                assert_eq!(back, seq, "the refused message itself is handed back");
                refused.push(seq)
            }
            Err(e) => panic!("unexpected refusal: {e:?}"),
        }
    }
    assert!(
        !accepted.is_empty() && accepted.len() <= QUEUE,
        "{accepted:?}"
    );
    assert_eq!(accepted.len() + refused.len(), QUEUE * 4);
    // Accepted ones are a prefix: once full, the queue stays full while nobody drains it.
    assert_eq!(accepted, (0..accepted.len() as u64).collect::<Vec<_>>());
    // An ask through the full queue fails at once, not at its timeout.
    let started = Instant::now();
    let r = nodes[0]
        .region
        .ask(&id, Msg::Where, Duration::from_secs(10))
        .await;
    assert!(matches!(r, Err(AskError::MailboxFull)), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // Every refusal is counted, the ask's too (before 2026-11-29 the cluster layer's
    // refusals were not: only what the local entities refused).
    assert_eq!(
        nodes[0].region.stats().rejected_total,
        refused.len() as u64 + 1
    );

    // Once the queue drains, exactly the accepted messages arrive, in order.
    let got = poll_value(&nodes[1], &id, accepted.len()).await;
    let seqs: Vec<u64> = got.iter().map(|(_, s)| *s).collect();
    assert_eq!(seqs, accepted);
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// A proxy counts what it refuses (its full buffer here: no node hosts the type, so no home
/// is known), and its shard count is bounded like a hosting type's.
#[tokio::test]
async fn a_proxy_counts_what_it_refuses_and_its_shard_count_is_bounded() {
    let (system, cluster) = up("p0", config("p0")).await;
    let sharding = ClusterSharding::get(&cluster);
    for shards in [0, shardik_sharding::MAX_SHARDS + 1, u32::MAX] {
        match sharding.start_proxy::<Msg>(TYPE, shards) {
            Err(ShardingError::InvalidSettings { problem, .. }) => {
                assert!(problem.contains("shard count"), "{problem}")
            }
            other => panic!("{shards} shards: {:?}", other.map(|_| ())),
        }
    }
    let proxy = sharding
        .start_proxy_with::<Msg>(TYPE, 8, settings().buffer_limit(2))
        .unwrap();
    for seq in 0..2 {
        proxy.try_tell("a", Msg::Add { sender: 1, seq }).unwrap();
    }
    assert!(matches!(
        proxy.try_tell("a", Msg::Add { sender: 1, seq: 2 }),
        Err(TellError::MailboxFull(_))
    ));
    proxy.tell("a", Msg::Add { sender: 1, seq: 3 });
    let stats = proxy.stats();
    assert_eq!((stats.buffered_messages, stats.rejected_total), (2, 2));
    cluster.shutdown().await;
    system.shutdown().await;
}

/// What the entity received, once it holds `n` messages.
async fn poll_value(node: &Node, id: &str, n: usize) -> Vec<(u32, u64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = node
            .region
            .ask(id, Msg::Get, ASK)
            .await
            .expect("get answers");
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} arrived",
            got.len()
        );
        tokio::task::yield_now().await;
    }
}
