//! A flood of user messages between two nodes, both ways, for longer than the failure
//! detector needs to suspect a silent node: cluster heartbeats travel on the control lane, so
//! nobody is flagged unreachable or downed.

mod netutil;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netutil::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::runtime::Event;

#[derive(Debug, Serialize, Deserialize)]
enum Sink {
    Blob(#[serde(with = "bytes")] Vec<u8>),
    Count { reply: ReplyTo<u64> },
}

mod bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        <serde::de::IgnoredAny as Deserialize>::deserialize(d).map(|_| Vec::new())
    }
}

struct SinkActor(u64);

impl Actor for SinkActor {
    type Msg = Sink;
    async fn handle(&mut self, msg: Sink, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Sink::Blob(_) => self.0 += 1,
            Sink::Count { reply } => reply.reply(self.0),
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_message_flood_does_not_cause_a_false_unreachable() {
    // Larger user queues so that the flood keeps them full rather than dropping.
    let (nodes, _) = cluster_with(2, |i| {
        let mut c = config(&format!("n{i}"));
        c.remote = c.remote.outbound_queue(200_000);
        c
    })
    .await;
    for n in &nodes {
        n.cluster
            .remote()
            .register("/user/sink", n.system.spawn(SinkActor(0)));
    }
    let mut subs: Vec<_> = nodes.iter().map(|n| n.cluster.subscribe()).collect();
    let flood_for = Duration::from_secs(4);
    let sent = Arc::new(AtomicU64::new(0));
    let deepest = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (from, to) in [(0usize, "n1"), (1, "n0")] {
        let sink = nodes[from]
            .cluster
            .lookup::<Sink>("/user/sink", to)
            .unwrap();
        let remote = nodes[from].cluster.remote().clone();
        let addr = sink.node_addr().to_string();
        let sent = sent.clone();
        let deepest = deepest.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let payload = vec![7u8; 100];
            while started.elapsed() < flood_for {
                // Keep the user lane deep (100 000+ frames queued) without overflowing it.
                let queued = remote.queued(&addr);
                deepest.fetch_max(queued as u64, Ordering::Relaxed);
                if queued > 150_000 {
                    tokio::task::yield_now().await;
                    continue;
                }
                for _ in 0..1_000 {
                    sink.tell(Sink::Blob(payload.clone()));
                }
                sent.fetch_add(1_000, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut received = 0;
    for (n, to) in [(&nodes[0], "n1"), (&nodes[1], "n0")] {
        let sink = n.cluster.lookup::<Sink>("/user/sink", to).unwrap();
        received += sink
            .ask(|reply| Sink::Count { reply }, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let sent = sent.load(Ordering::Relaxed);
    let deepest = deepest.load(Ordering::Relaxed);
    eprintln!(
        "flood: {sent} messages sent, {received} received in {flood_for:?} plus drain; \
         deepest user queue {deepest}"
    );
    assert!(sent >= 100_000, "the flood was too small to matter: {sent}");
    for (n, sub) in nodes.iter().zip(subs.iter_mut()) {
        while let Ok(e) = sub.try_recv() {
            assert!(
                !matches!(
                    e,
                    Event::Cluster(ClusterEvent::Unreachable(_) | ClusterEvent::MemberDowned(_))
                        | Event::Stopped(_)
                ),
                "false failure detection on {}: {e:?}",
                n.id()
            );
        }
        assert!(n.cluster.stopped().is_none());
    }
    let ids: Vec<_> = nodes.iter().map(|n| n.id().clone()).collect();
    for n in &nodes {
        assert!(n.cluster.state().all_up(&ids));
        let stats = n.cluster.stats();
        eprintln!("{}: {stats:?}", n.id().node_id);
        // Heartbeats kept coming: 4 per second for the whole flood.
        assert!(stats.heartbeats_received >= 12, "{stats:?}");
        // The detector suspects a node after about 2.3 s of silence.
        assert!(
            stats.max_heartbeat_gap < Duration::from_secs(2),
            "{stats:?}"
        );
        assert_eq!(stats.inbox_dropped, 0);
    }
    stop_all(&nodes).await;
}
