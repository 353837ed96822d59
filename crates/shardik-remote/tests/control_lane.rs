//! The control connection under a flood of user messages on the same node pair: heartbeats
//! and control messages keep round trips of a few milliseconds, because user bytes travel on
//! the other connection. And each of the two connections keeps working while the other one
//! is re-made.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context};
use shardik_remote::{decode_payload, Lane, Remote, RemoteEvent};
use tokio::sync::{mpsc, oneshot};

/// The worst control round trip accepted during the flood, in a release build (the
/// requirement: a few milliseconds). Measured on 2 shared vCPUs (`cargo test --release`):
/// worst heartbeat round trip 0.3-3.6 ms, worst `tell_control` ping 0.4-4.4 ms, median ping
/// 0.11-0.15 ms; with one shared connection (before) the worst heartbeat took 29-78 ms.
///
/// A debug build runs the same flood for 3-6 s instead of 0.25 s, with both cores saturated
/// by unoptimized code: worst heartbeat 5-13 ms, worst ping 6-13 ms, median ping 1.0-1.7 ms
/// (worst up to 46 ms while another build loaded the machine), against 183-690 ms for the
/// worst heartbeat with one shared connection in the same build. Its bound is looser so
/// that the test stays deterministic there.
const BOUND: Duration = if cfg!(debug_assertions) {
    Duration::from_millis(100)
} else {
    Duration::from_millis(10)
};

/// The median control-message round trip accepted during the flood, in any build.
const MEDIAN_BOUND: Duration = Duration::from_millis(5);

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

/// A control-lane probe: sent by `a` with `tell_control`, sent back the same way by `b`.
#[derive(Serialize, Deserialize)]
struct Ping(u64);

/// Makes `b` answer every `Ping` at `/system/ping` with a `Ping` to `a`'s `/system/pong` on the
/// control lane; returns the channel `a` receives the answers on.
fn ping_pong(a: &Remote, b: &Remote) -> mpsc::UnboundedReceiver<u64> {
    let back = b.lookup::<Ping>("/system/pong", a.addr());
    b.register_decoder(
        "/system/ping",
        Arc::new(move |bytes: &[u8]| {
            let Ping(n) = decode_payload(bytes)?;
            back.tell_control(Ping(n));
            Ok(())
        }),
    );
    let (tx, rx) = mpsc::unbounded_channel();
    a.register_decoder(
        "/system/pong",
        Arc::new(move |bytes: &[u8]| {
            let Ping(n) = decode_payload(bytes)?;
            let _ = tx.send(n);
            Ok(())
        }),
    );
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_round_trips_stay_within_a_few_ms_during_a_user_flood() {
    flood(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_round_trips_stay_within_a_few_ms_during_a_user_flood_with_small_socket_buffers() {
    flood(Some(128 * 1024)).await;
}

/// The two floods run one after the other, not on 2 cores at once.
static ONE_FLOOD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn flood(buffer: Option<u32>) {
    const N: u64 = 300_000;
    let _alone = ONE_FLOOD_AT_A_TIME.lock().await;
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
    let mut pongs = ping_pong(&a, &b);
    b.connect(a.addr()).await.unwrap();
    let control = a.connection_on(b.addr(), Lane::Control).unwrap();
    let to_b = a.lookup::<Blob>("/user/sink", b.addr());
    let ping = a.lookup::<Ping>("/system/ping", b.addr());
    let before = a.stats();

    // The flood, from a task on the runtime like an actor's: it queues every tell, yielding
    // now and then as an actor does at the end of its turn; the user connection drains them.
    // Meanwhile the control connection carries heartbeats and pings.
    let started = Instant::now();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            to_b.tell(Blob {
                data: vec![0xab; 100],
            });
            if i % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        started.elapsed()
    });

    // Ping round trips, one at a time, until the sink has counted the whole flood; from a
    // task on the runtime too (like the cluster layer's), not from the test's own thread,
    // which the operating system would have to wake for every answer.
    let pinger = tokio::spawn(async move {
        let mut done = rx;
        let mut rtts = Vec::new();
        let mut seq = 0;
        loop {
            seq += 1;
            let sent = Instant::now();
            ping.tell_control(Ping(seq));
            let answer = tokio::time::timeout(T, pongs.recv()).await;
            assert_eq!(answer.unwrap(), Some(seq), "pings come back in order");
            rtts.push(sent.elapsed());
            if tokio::time::timeout(Duration::from_millis(2), &mut done)
                .await
                .is_ok()
            {
                return (rtts, started.elapsed());
            }
            assert!(started.elapsed() < Duration::from_secs(60), "flood drained");
        }
    });
    let (mut rtts, flood) = pinger.await.unwrap();
    let queued = sender.await.unwrap();
    let after = a.stats();
    let max_hb = Duration::from_micros(after.heartbeat_rtt_max_us);
    rtts.sort();
    let max_ping = rtts.last().copied().unwrap_or_default();
    let p50 = rtts[rtts.len() / 2];
    eprintln!(
        "socket buffer {buffer:?}: flood of {N} x 100 B: queued in {queued:?}, received in {flood:?}; \
         heartbeats acked {} -> {}, max heartbeat rtt before the flood {:?}, overall {max_hb:?}; {} control pings, p50 {p50:?}, max {max_ping:?}",
        before.heartbeats_acked,
        after.heartbeats_acked,
        Duration::from_micros(before.heartbeat_rtt_max_us),
        rtts.len(),
    );
    assert!(
        after.heartbeats_acked > before.heartbeats_acked + 2,
        "heartbeats flowed during the flood"
    );
    assert!(rtts.len() >= 5, "pings flowed during the flood");
    assert!(
        max_hb < BOUND,
        "worst heartbeat round trip {max_hb:?} (bound {BOUND:?}, flood {flood:?})"
    );
    assert!(
        p50 < MEDIAN_BOUND,
        "median control message round trip {p50:?} (bound {MEDIAN_BOUND:?})"
    );
    assert!(
        max_ping < BOUND,
        "worst control message round trip {max_ping:?} (bound {BOUND:?}, flood {flood:?})"
    );
    assert_eq!(
        a.connection_on(b.addr(), Lane::Control),
        Some(control),
        "the control connection stayed up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_keeps_working_while_the_other_is_remade() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let mut seen = echo(&sys_b, &b);
    let mut pongs = ping_pong(&a, &b);
    a.connect(b.addr()).await.unwrap();
    let control = a.connection_on(b.addr(), Lane::Control).unwrap();
    let user = a.connection_on(b.addr(), Lane::User).unwrap();
    assert_eq!((control.lane, user.lane), (Lane::Control, Lane::User));
    assert_ne!(control.local, user.local, "two TCP connections");
    let ping = a.lookup::<Ping>("/system/ping", b.addr());
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let mut events = a.events();

    // The user connection goes; control messages go on over the same control connection,
    // and the association is not reported down.
    a.disconnect_on(b.addr(), Lane::User);
    ping.tell_control(Ping(1));
    assert_eq!(next(&mut pongs).await, 1);
    assert_eq!(
        a.connection_on(b.addr(), Lane::Control),
        Some(control.clone())
    );
    // The next user message re-makes the user connection.
    to_b.tell(Echo::Record { from: 1, n: 1 });
    assert_eq!(next(&mut seen).await, (1, 1));
    let user2 = a.connection_on(b.addr(), Lane::User).unwrap();
    assert_ne!(user2.local, user.local);

    // The control connection goes; user messages go on over the same user connection.
    a.disconnect_on(b.addr(), Lane::Control);
    to_b.tell(Echo::Record { from: 1, n: 2 });
    assert_eq!(next(&mut seen).await, (1, 2));
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    assert_eq!(a.connection_on(b.addr(), Lane::User), Some(user2));
    // The control connection is re-made by the dialer of the association (here `a`).
    ping.tell_control(Ping(2));
    assert_eq!(next(&mut pongs).await, 2);
    let control2 = a.connection_on(b.addr(), Lane::Control).unwrap();
    assert_ne!(control2.local, control.local);

    // Neither loss was reported as the association going down.
    while let Ok(e) = events.try_recv() {
        assert!(!matches!(e, RemoteEvent::Disconnected { .. }), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_connections_of_a_pair_are_the_same_on_both_sides() {
    let (_sys_a, a) = node("a").await;
    let (_sys_b, b) = node("b").await;
    let mut events_b = b.events();
    a.connect(b.addr()).await.unwrap();
    for lane in Lane::ALL {
        let ca = a.connection_on(b.addr(), lane).unwrap();
        // `b` installs an inbound connection before `a` sees the handshake end.
        let cb = b.connection_on(a.addr(), lane).unwrap();
        assert_eq!((ca.local, ca.remote), (cb.remote, cb.local), "{lane:?}");
        assert!(ca.outbound && !cb.outbound);
        assert_eq!(ca.lane, lane);
    }
    let mut lanes = Vec::new();
    while lanes.len() < 2 {
        if let RemoteEvent::Connected { lane, .. } = wait_event(&mut events_b, |e| {
            matches!(e, RemoteEvent::Connected { .. })
        })
        .await
        {
            lanes.push(lane);
        }
    }
    assert!(
        lanes.contains(&Lane::Control) && lanes.contains(&Lane::User),
        "one event per connection: {lanes:?}"
    );
}
