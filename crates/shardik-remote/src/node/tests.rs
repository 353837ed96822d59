//! Unit tests of the node: handshakes, dispatch, replies, bad input from peers.

/// The accept loop's warnings: the first failure, then one per period with the number
/// not logged since; the back-off is longest when descriptors or memory ran out.
#[cfg(unix)]
#[test]
fn accept_errors_are_logged_rarely_and_backed_off() {
    use super::{accept_backoff, AcceptErrorLog, ACCEPT_ERROR_LOG_EVERY};
    let t0 = tokio::time::Instant::now();
    let mut log = AcceptErrorLog::default();
    assert_eq!(log.failed(t0), Some(0));
    let ms = Duration::from_millis;
    let logged: Vec<_> = (1..=2_500u64)
        .filter_map(|i| log.failed(t0 + ms(10 * i)))
        .collect();
    // 25 s of failures every 10 ms: two more lines, each counting what it stood for.
    assert_eq!(logged, vec![999, 999]);
    assert_eq!(log.failed(t0 + ACCEPT_ERROR_LOG_EVERY * 3), Some(500));

    let os = std::io::Error::from_raw_os_error;
    assert_eq!(accept_backoff(&os(24)), Duration::from_secs(1), "EMFILE");
    assert_eq!(accept_backoff(&os(23)), Duration::from_secs(1), "ENFILE");
    assert_eq!(
        accept_backoff(&std::io::ErrorKind::OutOfMemory.into()),
        Duration::from_secs(1)
    );
    assert_eq!(
        accept_backoff(&std::io::ErrorKind::ConnectionAborted.into()),
        Duration::ZERO
    );
    assert_eq!(accept_backoff(&std::io::ErrorKind::Other.into()), ms(10));
}

use super::{clip, shown, shown_max};

use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, AskError, Context, ReplyTo};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::codec::{encode_frame, BodyCodec};
use crate::error::DecodeError;
use crate::frame::{Envelope, Frame, Lane, NodeIdentity, ReplyFailure};
use crate::{Remote, RemoteConfig, RemoteEvent};

const T: Duration = Duration::from_secs(5);

#[derive(Serialize, Deserialize)]
struct Hold {
    reply: ReplyTo<u64>,
}

/// Keeps the reply handle of each request and hands it to the test.
struct Holder(mpsc::UnboundedSender<ReplyTo<u64>>);

impl Actor for Holder {
    type Msg = Hold;
    async fn handle(&mut self, msg: Hold, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let _ = self.0.send(msg.reply);
        Ok(())
    }
}

fn config(id: &str) -> RemoteConfig {
    RemoteConfig::new("test", id)
        .secret(b"test secret: 32 bytes or more....".to_vec())
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
}

async fn node_with(config: RemoteConfig) -> (ActorSystem, Remote) {
    let system = ActorSystem::new(config.node_id.clone());
    let remote = Remote::start(&system, config).await.expect("remote starts");
    (system, remote)
}

async fn node(id: &str) -> (ActorSystem, Remote) {
    node_with(config(id)).await
}

/// The identity of a raw peer named `name`.
fn identity(name: &str) -> NodeIdentity {
    NodeIdentity {
        node_id: name.into(),
        incarnation: 1,
        addr: format!("{name}:1"),
    }
}

/// A message to `recipient` naming reply slots `ids`, with `payload`.
fn message(recipient: &str, ids: Vec<u64>, payload: Vec<u8>) -> Frame {
    Frame::Message(Envelope {
        recipient: recipient.into(),
        sender: None,
        type_tag: "test::Msg".into(),
        reply_ids: ids,
        payload: payload.into(),
    })
}

/// A peer on a raw connection: it passed the handshake (it knows the secret) and then
/// sends whatever frames it likes.
struct RawPeer {
    reader: FramedRead<tokio::net::tcp::OwnedReadHalf, BodyCodec>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl RawPeer {
    async fn connect(to: &Remote, me: NodeIdentity) -> RawPeer {
        let mut local = to.node.local.clone();
        local.me = me;
        let (r, mut writer) = tokio::net::TcpStream::connect(to.addr())
            .await
            .unwrap()
            .into_split();
        let mut reader = FramedRead::new(r, BodyCodec::new(local.max_frame_len));
        let deadline = tokio::time::Instant::now() + T;
        crate::handshake::connect(&mut reader, &mut writer, &local, Lane::User, deadline)
            .await
            .expect("the raw peer passes the handshake");
        RawPeer { reader, writer }
    }

    /// The reply slots of the next message sent to it.
    async fn next_request(&mut self) -> Vec<u64> {
        loop {
            let body = tokio::time::timeout(T, self.reader.next())
                .await
                .expect("a frame in time")
                .expect("connection open")
                .unwrap();
            if let Frame::Message(env) = Frame::decode_body(body).unwrap() {
                return env.reply_ids;
            }
        }
    }

    /// The next reply failure sent to it: its slots, failure and reason.
    async fn next_failure(&mut self) -> (Vec<u64>, ReplyFailure, String) {
        loop {
            let body = tokio::time::timeout(T, self.reader.next())
                .await
                .expect("a frame in time")
                .expect("connection open")
                .unwrap();
            if let Frame::ReplyFailed {
                ids,
                failure,
                reason,
            } = Frame::decode_body(body).unwrap()
            {
                return (ids, failure, reason);
            }
        }
    }

    /// Waits until the node closes the connection.
    async fn closed(&mut self) {
        tokio::time::timeout(T, async {
            while let Some(Ok(_)) = self.reader.next().await {}
        })
        .await
        .expect("the node closes the connection");
    }

    async fn send(&mut self, frames: &[Frame]) {
        let mut buf = BytesMut::new();
        for f in frames {
            encode_frame(f, &mut buf, crate::codec::DEFAULT_MAX_FRAME_LEN).unwrap();
        }
        self.writer.write_all(&buf).await.unwrap();
    }
}

fn reply(id: u64, n: u64) -> Frame {
    Frame::Reply {
        id,
        payload: rmp_serde::to_vec(&n).unwrap().into(),
    }
}

/// A peer answers only the asks whose requests went to it: replies and reply failures
/// it sends for slots of asks sent to another node are ignored (counted in
/// `replies_unmatched`), and those asks get their own node's answer. The reason of a
/// failure it sends reaches the asker bounded, with control characters escaped. (Before,
/// a peer that got one request could guess the sequential slot numbers of asks sent to
/// other nodes and answer or fail them all, and its reason went into the asker's error
/// whole: up to 4 MiB, terminal escapes included.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_answers_only_the_asks_sent_to_it() {
    let (_sys_v, v) = node("v").await;
    let (sys_q, q) = node("q").await;
    let (held_tx, mut held) = mpsc::unbounded_channel();
    q.register("/user/hold", sys_q.spawn(Holder(held_tx)));
    let mallory = NodeIdentity {
        node_id: "mallory".into(),
        incarnation: 1,
        addr: "mallory:1".into(),
    };
    let mut m = RawPeer::connect(&v, mallory.clone()).await;

    // v asks mallory, then q: their slots are consecutive.
    let to_m = v.lookup::<Hold>("/user/hold", &mallory.addr);
    let ask_m = {
        let to_m = to_m.clone();
        tokio::spawn(async move { to_m.ask(|reply| Hold { reply }, T).await })
    };
    let [own] = m.next_request().await[..] else {
        panic!("one reply slot")
    };
    let to_q = v.lookup::<Hold>("/user/hold", q.addr());
    let ask_q = tokio::spawn(async move { to_q.ask(|reply| Hold { reply }, T).await });
    let at_q = tokio::time::timeout(T, held.recv()).await.unwrap().unwrap();

    // Mallory answers and fails the slots after its own, then answers its own ask: once
    // that is answered, v has handled the rest (one connection, read in order).
    let mut forged: Vec<Frame> = (own + 1..=own + 100).map(|id| reply(id, 999)).collect();
    forged.push(Frame::ReplyFailed {
        ids: (own + 1..=own + 64).collect(),
        failure: ReplyFailure::Undeliverable,
        reason: "forged".into(),
    });
    forged.push(reply(own, 5));
    m.send(&forged).await;
    assert_eq!(ask_m.await.unwrap(), Ok(5), "mallory answers its own ask");
    assert_eq!(
        v.stats().replies_unmatched,
        101,
        "one forged reply and one forged failure for q's slot, 99 replies for no slot"
    );
    at_q.reply(43);
    assert_eq!(
        ask_q.await.unwrap(),
        Ok(43),
        "the ask sent to q gets q's answer"
    );

    // A failure's reason reaches the asker bounded and escaped.
    let ask_m = tokio::spawn(async move { to_m.ask(|reply| Hold { reply }, T).await });
    let [own] = m.next_request().await[..] else {
        panic!("one reply slot")
    };
    let reason = format!("bad\n\u{1b}[31m{}", "x".repeat(100_000));
    let sent = reason.len();
    m.send(&[Frame::ReplyFailed {
        ids: vec![own],
        failure: ReplyFailure::Undeliverable,
        reason,
    }])
    .await;
    match ask_m.await.unwrap() {
        Err(AskError::Undeliverable(why)) => {
            assert!(why.starts_with("bad\\n\\u{1b}[31mxxx"), "{why:.40}");
            assert!(why.ends_with(&format!("… ({sent} bytes)")), "{why:.40}");
            assert!(why.len() < 1100, "{} bytes", why.len());
        }
        other => panic!("expected Undeliverable, got {other:?}"),
    }
}

#[test]
fn clip_keeps_short_strings_and_cuts_long_ones_on_a_char_boundary() {
    assert_eq!(clip("/user/echo"), "/user/echo");
    let long = "é".repeat(150); // 300 bytes, 2 per char
    let cut = clip(&long);
    assert!(cut.starts_with(&"é".repeat(100)), "{cut}");
    assert!(cut.ends_with("… (300 bytes)"), "{cut}");
    assert_eq!(shown("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
    assert!(shown(&"x".repeat(70_000)).ends_with("… (70000 bytes)"));
    assert!(cut.len() < 220);
}

/// The cut comes after escaping: a string of control characters, each escaped into up
/// to 6 bytes, still comes out at most `max` bytes and the marker, and no escape is cut
/// in two. (Before, the first `max` bytes were kept and then escaped: these 2 000
/// control characters cut to 1 KiB came out at 4.4 KiB, and up to 6 KiB is possible.)
#[test]
fn shown_cuts_after_escaping() {
    let controls: String = (0..2_000).map(|i| ['\u{1b}', '\n', '\0'][i % 3]).collect();
    let marker = "… (2000 bytes)";
    let out = shown_max(&controls, 1024);
    assert!(out.ends_with(marker), "{out:.60}");
    let body = &out[..out.len() - marker.len()];
    assert!(body.len() <= 1024, "{} bytes", body.len());
    assert!(body.len() > 1024 - 6, "{} bytes", body.len());
    assert!(body.starts_with("\\u{1b}\\n\\u{0}\\u{1b}"), "{body:.40}");
    assert!(body.ends_with('}') || body.ends_with("\\n"), "{body}");
    let short = shown_max(&"\u{1b}".repeat(100), 1024);
    assert_eq!(short, "\\u{1b}".repeat(100));
    // Multi-byte characters are kept whole.
    let out = shown_max(&"é".repeat(600), 1024);
    assert!(out.starts_with(&"é".repeat(512)), "{out:.40}");
    assert!(out.ends_with("… (1200 bytes)"), "{out:.40}");
}

/// A message naming more reply slots than one may carry (64) is a malformed frame:
/// skipped and counted, never echoed in a reply failure; so is a reply failure naming
/// more, which fails nothing. The connection goes on. (Before, any number was taken: a
/// peer that never reads could send messages naming 450 000 made-up slots in 4 MiB each,
/// and this node queued a reply failure of the same size for each, 100 000 of them, out
/// of memory; and a reply failure that long held the lock every ask of the node takes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_reply_slots_in_one_frame_are_malformed_and_not_echoed() {
    let (_sys_v, v) = node("v").await;
    let mallory = identity("mallory");
    let mut m = RawPeer::connect(&v, mallory.clone()).await;
    let to_m = v.lookup::<Hold>("/user/hold", &mallory.addr);
    let ask = tokio::spawn(async move { to_m.ask(|reply| Hold { reply }, T).await });
    let [own] = m.next_request().await[..] else {
        panic!("one reply slot")
    };
    m.send(&[
        message("/user/nobody", (1..=100_000).collect(), Vec::new()),
        Frame::ReplyFailed {
            ids: (own..own + 100_000).collect(),
            failure: ReplyFailure::Undeliverable,
            reason: "forged".into(),
        },
        message("/user/nobody", vec![7], Vec::new()),
    ])
    .await;
    // The first answer is the one for the last message.
    let (ids, failure, _) = m.next_failure().await;
    assert_eq!((ids.len(), failure), (1, ReplyFailure::UnknownRecipient));
    assert_eq!(ids, [7]);
    let stats = v.stats();
    assert_eq!((stats.malformed_frames, stats.unknown_recipient), (2, 1));
    // The ask the long failure named still waits for its answer.
    m.send(&[reply(own, 5)]).await;
    assert_eq!(ask.await.unwrap(), Ok(5));
}

/// Sends heartbeats on `writer` every 100 ms until the connection fails.
fn keep_beating(mut writer: tokio::net::tcp::OwnedWriteHalf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        for seq in 0.. {
            tick.tick().await;
            let mut buf = BytesMut::new();
            encode_frame(&Frame::Heartbeat(seq), &mut buf, 1 << 20).unwrap();
            if writer.write_all(&buf).await.is_err() {
                return;
            }
        }
    })
}

#[derive(Serialize)]
struct Big(Vec<u8>);

/// A connection whose writer makes no progress for `write_stall_timeout` while it has frames
/// to write is closed, although the peer keeps sending (heartbeats): what waits in the queue
/// then follows the reconnect rules. (Before, only what the node received was watched: a
/// peer that sent heartbeats and never read held the writer in its write for good, and
/// the queue behind it filled to its bound.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_peer_reads_nothing_is_closed_after_the_stall_timeout() {
    let idle = Duration::from_secs(1);
    let (_sys_v, v) = node_with(
        config("v")
            .heartbeat(Duration::from_millis(100), idle)
            .write_stall_timeout(idle)
            .socket_buffer(16 * 1024),
    )
    .await;
    let mut events = v.events();
    let mallory = identity("mallory");
    let RawPeer {
        reader: _unread,
        writer,
    } = RawPeer::connect(&v, mallory.clone()).await;
    let beats = keep_beating(writer);
    let to_m = v.lookup::<Big>("/user/sink", &mallory.addr);
    // Far more than the socket buffers of both ends take.
    for _ in 0..16 {
        to_m.try_tell(Big(vec![1; 1 << 20])).unwrap();
    }
    let closed = tokio::time::timeout(idle * 8, async {
        loop {
            match events.recv().await {
                Ok(RemoteEvent::ConnectionClosed { addr, lane }) if addr == mallory.addr => {
                    return lane
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await
    .expect("the stalled connection is closed");
    assert_eq!(closed, Lane::User);
    assert_eq!(v.stats().write_stalls, 1);
    beats.abort();
}

#[derive(Debug, Serialize, Deserialize)]
enum Pick {
    One,
}

struct Picker;

impl Actor for Picker {
    type Msg = Pick;
    async fn handle(&mut self, _: Pick, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        Ok(())
    }
}

/// The log lines of this test binary from the first call on (one global subscriber), for
/// the tests that read them.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other test sets a global subscriber");
        logs
    })
    .clone()
}

/// The captured lines that contain every one of `parts`.
fn log_lines(logs: &Mutex<Vec<u8>>, parts: &[&str]) -> Vec<String> {
    String::from_utf8_lossy(&logs.lock())
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(str::to_string)
        .collect()
}

/// Strings a peer sends (a recipient path, a payload whose decoding error quotes them)
/// reach the reply failure sent back and the log escaped and bounded. (Before, the
/// decoding error went back and into the log whole, up to 4 MiB with terminal escapes,
/// and paths were cut but not escaped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_from_a_peer_reach_failures_and_logs_escaped_and_bounded() {
    let logs = captured_logs();
    let (sys, v) = node("v-strings").await;
    v.register("/user/pick", sys.spawn(Picker));
    let mut m = RawPeer::connect(&v, identity("stringer")).await;
    let evil = format!("evil\n\u{1b}[35m{}", "z".repeat(100_000));
    let payload = rmp_serde::to_vec_named(&evil).unwrap();
    let path = format!("/user/\n\u{1b}[2J{}", "y".repeat(10_000));
    m.send(&[
        message("/user/pick", vec![7], payload),
        message(&path, vec![8], Vec::new()),
    ])
    .await;
    for (slot, quoted) in [
        (7, "unknown variant `evil\\n\\u{1b}[35mzzz"),
        (8, "/user/\\n\\u{1b}[2Jyyy"),
    ] {
        let (ids, _, reason) = m.next_failure().await;
        assert_eq!(ids, [slot]);
        assert!(reason.contains(quoted), "{reason:.200}");
        assert!(!reason.contains(['\n', '\u{1b}']), "{reason:.200}");
        assert!(reason.len() < 1200, "{} bytes", reason.len());
    }
    let lines = log_lines(&logs, &["v-strings"]);
    assert!(lines.len() >= 2, "{lines:?}");
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "{line:.200}");
        assert!(line.len() < 2500, "{} bytes: {line:.200}", line.len());
    }
    assert!(log_lines(&logs, &["\u{1b}[35mzzz"]).is_empty());
    assert!(log_lines(&logs, &["\u{1b}[2Jyyy"]).is_empty());
}

#[derive(Serialize, Deserialize)]
struct Give {
    size: usize,
    reply: ReplyTo<Vec<u8>>,
}

struct Giver;

impl Actor for Giver {
    type Msg = Give;
    async fn handle(&mut self, msg: Give, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        msg.reply.reply(vec![7; msg.size]);
        Ok(())
    }
}

/// Errors a peer can cause at will are logged like the others: the first ten and every
/// thousandth (all are counted). (Before, a handshake frame on an established
/// connection, a frame over the size limit and a reply too large to send were logged
/// every time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_a_peer_can_cause_at_will_are_logged_rarely() {
    let logs = captured_logs();
    let (_sys, v) = node("v-handshake-frames").await;
    for _ in 0..12 {
        let mut m = RawPeer::connect(&v, identity("again-hello")).await;
        m.send(&[Frame::Accept(crate::frame::Accept {})]).await;
        m.closed().await;
    }
    assert_eq!(v.stats().connections_rejected, 12);
    let lines = log_lines(&logs, &["again-hello", "handshake frame on an established"]);
    assert_eq!(lines.len(), 10, "{lines:#?}");

    let (_sys, v) = node("v-too-large").await;
    for _ in 0..12 {
        let mut m = RawPeer::connect(&v, identity("again-large")).await;
        m.writer.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        m.closed().await;
    }
    assert_eq!(v.stats().connections_rejected, 12);
    let lines = log_lines(&logs, &["again-large", "closing the connection"]);
    assert_eq!(lines.len(), 10, "{lines:#?}");

    let (_sys_a, a) = node("a-asks-big").await;
    let (sys_b, b) = node_with(config("b-replies-big").max_frame_len(16 * 1024)).await;
    b.register("/user/giver", sys_b.spawn(Giver));
    let giver = a.lookup::<Give>("/user/giver", b.addr());
    for _ in 0..12 {
        let res = giver
            .ask(
                |reply| Give {
                    size: 32 * 1024,
                    reply,
                },
                T,
            )
            .await;
        assert!(matches!(res, Err(AskError::Undeliverable(_))));
    }
    assert_eq!(b.stats().dropped_too_large, 12);
    let lines = log_lines(&logs, &[a.addr(), "reply not sent"]);
    assert_eq!(lines.len(), 10, "{lines:#?}");
}

/// A decoder at `/user/seq` of `v` that records the numbers it decodes and reports each;
/// it holds its reader on 1 until the test opens the gate (or drops it).
struct Seq {
    seen: Arc<Mutex<Vec<u64>>>,
    /// Its reader holds on 1.
    holding: mpsc::UnboundedReceiver<()>,
    delivered: mpsc::UnboundedReceiver<u64>,
    gate: std::sync::mpsc::Sender<()>,
}

impl Seq {
    fn register(v: &Remote) -> Seq {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (holds, holding) = mpsc::unbounded_channel();
        let (done, delivered) = mpsc::unbounded_channel();
        let (gate, closed) = std::sync::mpsc::channel::<()>();
        let closed = Mutex::new(closed);
        let record = seen.clone();
        v.register_decoder(
            "/user/seq",
            Arc::new(move |bytes: &[u8]| {
                let n: u64 = rmp_serde::from_slice(bytes).map_err(|e| DecodeError::Payload {
                    expected: "u64",
                    detail: e.to_string(),
                })?;
                record.lock().push(n);
                if n == 1 {
                    let _ = holds.send(());
                    // Until the test opens the gate, or ends (drops it).
                    tokio::task::block_in_place(|| {
                        let _ = closed.lock().recv();
                    });
                }
                let _ = done.send(n);
                Ok(())
            }),
        );
        Seq {
            seen,
            holding,
            delivered,
            gate,
        }
    }

    /// Waits until the readers of `v` wait for replaced ones exactly as in `waits` (reader's
    /// connection id, replaced one's); fails if anything is delivered meanwhile.
    async fn wait_handover(&mut self, v: &Remote, mut waits: Vec<(u64, u64)>) {
        waits.sort_unstable();
        let mut now = v.node.handover_waits.subscribe();
        let reached = now.wait_for(|w| {
            let mut w = w.clone();
            w.sort_unstable();
            w == waits
        });
        tokio::time::timeout(T, async {
            tokio::select! {
                r = reached => { r.unwrap(); }
                n = self.delivered.recv() => panic!("{n:?} delivered while the old reader is held"),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("readers wait as in {waits:?}: {:?}", *now.borrow()));
    }

    /// Opens the gate, then waits until `last` is delivered; everything seen is in order.
    async fn open_and_expect(&mut self, last: u64) {
        let _ = self.gate.send(());
        tokio::time::timeout(T, async {
            while self.delivered.recv().await != Some(last) {}
        })
        .await
        .expect("the later message is delivered");
        let seen = self.seen.lock().clone();
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "out of order: {seen:?}"
        );
    }
}

fn seq(n: u64) -> Frame {
    message("/user/seq", vec![], rmp_serde::to_vec(&n).unwrap())
}

/// The id the next connection of `v` gets.
fn next_conn(v: &Remote) -> u64 {
    v.node.next_conn.load(std::sync::atomic::Ordering::Relaxed)
}

/// A connection of peer `me` to `v` whose reader is held in `s`'s decoder on message 1 (of
/// 50 sent), and its connection id.
async fn a_held_reader(v: &Remote, s: &mut Seq, me: &NodeIdentity) -> (u64, RawPeer) {
    let id = next_conn(v);
    let mut held = RawPeer::connect(v, me.clone()).await;
    held.send(&(1..=50).map(seq).collect::<Vec<_>>()).await;
    tokio::time::timeout(T, s.holding.recv())
        .await
        .unwrap()
        .unwrap();
    (id, held)
}

/// A new connection of a peer on a lane, replacing the one it had, hands nothing on
/// before the replaced connection's reader has stopped: what the peer sent on the old
/// connection and this node reads is never overtaken by what it sent later on the new
/// one. Here the old reader is held in a decoder while the new connection comes up and
/// brings a later message; the test opens the gate once the new reader waits for the old
/// one, having delivered nothing. (Before, the old reader went on with the frames it had
/// buffered, up to 256, while the new one already delivered: a later message overtook
/// earlier ones.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_replaces_another_delivers_only_after_it() {
    const LATER: u64 = 1_000;
    let (_sys, v) = node("v").await;
    let mut s = Seq::register(&v);
    let me = identity("sender");
    let (a, old) = a_held_reader(&v, &mut s, &me).await;
    // The same node's new connection on the same lane replaces the old one.
    let b = next_conn(&v);
    let mut new = RawPeer::connect(&v, me).await;
    new.send(&[seq(LATER)]).await;
    s.wait_handover(&v, vec![(b, a)]).await;
    assert_eq!(*s.seen.lock(), [1]);
    s.open_and_expect(LATER).await;
    drop(old);
}

/// The wait carries down a chain of replacements: a connection that replaces one still
/// waiting for its own predecessor waits for that predecessor too. (Before, the waiting
/// connection, cancelled, stopped waiting and so released its successor, which delivered
/// while the first reader was still held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_waits_for_every_reader_before_it() {
    const LATER: u64 = 1_000;
    let (_sys, v) = node("v").await;
    let mut s = Seq::register(&v);
    let me = identity("sender");
    let (a, first) = a_held_reader(&v, &mut s, &me).await;
    let b = next_conn(&v);
    let _second = RawPeer::connect(&v, me.clone()).await;
    s.wait_handover(&v, vec![(b, a)]).await;
    let c = next_conn(&v);
    let mut third = RawPeer::connect(&v, me).await;
    third.send(&[seq(LATER)]).await;
    // The second reader, replaced, no longer waits; the third waits for the first.
    s.wait_handover(&v, vec![(c, a)]).await;
    assert_eq!(*s.seen.lock(), [1]);
    s.open_and_expect(LATER).await;
    drop(first);
}

/// A reader held longer than `idle_timeout` (a decoder that blocks) holds up the
/// connection that replaced it no longer than that: it then reads, with a warning and a
/// count. (Before, it waited as long as the decoder blocked, for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_waits_for_a_held_reader_at_most_idle_timeout() {
    const LATER: u64 = 1_000;
    let logs = captured_logs();
    let cfg = config("v-held").heartbeat(Duration::from_millis(100), Duration::from_millis(300));
    let (_sys, v) = node_with(cfg).await;
    let mut s = Seq::register(&v);
    let me = identity("held-sender");
    let (_, old) = a_held_reader(&v, &mut s, &me).await;
    let mut new = RawPeer::connect(&v, me).await;
    new.send(&[seq(LATER)]).await;
    let got = tokio::time::timeout(T, s.delivered.recv()).await;
    assert_eq!(
        got.expect("delivered while the old reader is held"),
        Some(LATER)
    );
    assert_eq!(*s.seen.lock(), [1, LATER]);
    assert_eq!(v.stats().handover_timeouts, 1);
    let lines = log_lines(&logs, &["held-sender", "out of order"]);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let _ = s.gate.send(());
    drop(old);
}
