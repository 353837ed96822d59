//! Heartbeats on the control lane overtake a flood of queued user messages.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context};
use tokio::sync::oneshot;

#[derive(Serialize, Deserialize)]
struct Blob {
    #[serde(with = "serde_bytes_compat")]
    data: Vec<u8>,
}

/// Vec<u8> as a MessagePack bin (one byte per byte on the wire).
mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        <serde::de::IgnoredAny as Deserialize>::deserialize(d).map(|_| Vec::new())
    }
}

struct Counter {
    left: u64,
    done: Option<oneshot::Sender<()>>,
}

impl Actor for Counter {
    type Msg = Blob;
    async fn handle(&mut self, _msg: Blob, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.left -= 1;
        if self.left == 0 {
            if let Some(tx) = self.done.take() {
                let _ = tx.send(());
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_not_starved_by_a_user_flood() {
    flood(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_not_starved_by_a_user_flood_with_small_socket_buffers() {
    flood(Some(128 * 1024)).await;
}

async fn flood(buffer: Option<u32>) {
    const N: u64 = 300_000;
    let hb = Duration::from_millis(5);
    let cfg = |id: &str| {
        let mut c = config(id)
            .heartbeat(hb, Duration::from_secs(30))
            .outbound_queue(N as usize);
        c.socket_buffer = buffer;
        c
    };
    let (_sys_a, a) = node_with(cfg("a")).await;
    let (sys_b, b) = node_with(cfg("b")).await;
    let (tx, rx) = oneshot::channel();
    b.register(
        "/user/sink",
        sys_b.spawn(Counter {
            left: N,
            done: Some(tx),
        }),
    );
    b.connect(a.addr()).await.unwrap();
    let to_b = a.lookup::<Blob>("/user/sink", b.addr());

    let started = Instant::now();
    for _ in 0..N {
        to_b.tell(Blob {
            data: vec![0xab; 100],
        });
    }
    let queued = started.elapsed();
    let before = a.stats();
    tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .unwrap()
        .unwrap();
    let flood = started.elapsed();
    let after = a.stats();
    let max_rtt = Duration::from_micros(after.heartbeat_rtt_max_us);
    eprintln!(
        "socket buffer {buffer:?}: flood of {N} x 100 B: queued in {queued:?}, received in {flood:?}; heartbeats acked {} -> {}, max rtt {max_rtt:?}",
        before.heartbeats_acked, after.heartbeats_acked
    );
    assert!(
        after.heartbeats_acked > before.heartbeats_acked,
        "heartbeats flowed during the flood"
    );
    // Heartbeats overtook the queued backlog: their worst round trip is a fraction of the
    // time the flood took to drain.
    assert!(
        max_rtt < flood / 2,
        "max heartbeat rtt {max_rtt:?} vs flood {flood:?}"
    );
}
