//! The baseline: raw length-prefixed frames over a tokio TCP (or tokio-rustls) stream.
//!
//! A frame is a `u32` big-endian body length and a body whose first byte is its kind:
//! [`DATA`] (counted by the server), [`COUNT`] (the server answers `COUNT` + `u64`, the
//! frames counted since the last `COUNT`, and starts over) and [`ECHO`] (sent back as is).
//! Senders hand payloads to a bounded queue (the same capacity as shardik's outbound lane)
//! drained by one writer task that copies up to [`BATCH`] frames into one buffer per
//! `write_all` (then a flush, which a TLS stream needs), as shardik's writer does. There is no serialization, no envelope, no actor and
//! no heartbeat: the server counts or echoes on its reader task.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

/// Frame kind: a payload to count.
pub const DATA: u8 = 0;
/// Frame kind: asks for the count (and the answer).
pub const COUNT: u8 = 1;
/// Frame kind: echoed back.
pub const ECHO: u8 = 2;
/// Frames per write, as shardik's default `write_batch_frames`.
pub const BATCH: usize = 1_024;
/// Capacity of the send queue, as shardik's default `outbound_queue`.
pub const QUEUE: usize = 100_000;

/// Makes room for at least 32 KiB of reading in `buf`.
fn reserve(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < 32 * 1024 {
        buf.reserve(128 * 1024);
    }
}

/// Cuts one frame body off `buf`, if a whole one is there.
fn cut(buf: &mut BytesMut) -> Option<BytesMut> {
    if buf.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if buf.len() < 4 + len {
        return None;
    }
    buf.advance(4);
    Some(buf.split_to(len))
}

/// Serves one connection (peer process): counts `DATA`, answers `COUNT`, echoes `ECHO`.
/// The answers to one read are written with one `write_all`.
pub async fn serve<R, W>(mut r: R, mut w: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(128 * 1024);
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut count = 0u64;
    loop {
        reserve(&mut buf);
        if r.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        while let Some(body) = cut(&mut buf) {
            match body.first() {
                Some(&DATA) => count += 1,
                Some(&COUNT) => {
                    out.put_u32(9);
                    out.put_u8(COUNT);
                    out.put_u64(count);
                    count = 0;
                }
                Some(&ECHO) => {
                    out.put_u32(body.len() as u32);
                    out.extend_from_slice(&body);
                }
                _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad raw frame")),
            }
        }
        if !out.is_empty() {
            w.write_all(&out).await?;
            w.flush().await?;
            out.clear();
        }
    }
}

enum Out {
    Data(Bytes),
    Count,
}

/// The bounded send queue of a raw lane.
struct Queue {
    frames: Mutex<VecDeque<Out>>,
    ready: Notify,
    closed: AtomicBool,
}

impl Queue {
    fn push(&self, frame: Out) -> Result<(), Out> {
        {
            let mut q = self.frames.lock();
            if q.len() >= QUEUE {
                return Err(frame);
            }
            q.push_back(frame);
        }
        self.ready.notify_one();
        Ok(())
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(queue: Arc<Queue>, mut w: W) -> io::Result<()> {
    let mut frames = Vec::with_capacity(BATCH);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        {
            let mut q = queue.frames.lock();
            let n = q.len().min(BATCH);
            frames.extend(q.drain(..n));
        }
        if frames.is_empty() {
            if queue.closed.load(Ordering::Acquire) {
                break;
            }
            queue.ready.notified().await;
            continue;
        }
        for frame in frames.drain(..) {
            match frame {
                Out::Data(payload) => {
                    buf.put_u32(1 + payload.len() as u32);
                    buf.put_u8(DATA);
                    buf.extend_from_slice(&payload);
                }
                Out::Count => {
                    buf.put_u32(1);
                    buf.put_u8(COUNT);
                }
            }
        }
        w.write_all(&buf).await?;
        w.flush().await?;
        buf.clear();
    }
    w.shutdown().await
}

/// Queues `frame`, waiting (1 ms at a time) while the queue is full.
async fn push(queue: &Queue, mut frame: Out) {
    loop {
        match queue.push(frame) {
            Ok(()) => return,
            Err(back) => {
                frame = back;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// One-way throughput over a fresh connection: `senders` tasks each queue `per_sender`
/// `DATA` frames carrying `payload`; then one `COUNT` reports how many the server counted.
/// Returns frames counted at the server per second, from the first frame queued to the count.
pub async fn tell<R, W>(mut r: R, w: W, senders: usize, per_sender: u64, payload: Bytes) -> f64
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let queue = Arc::new(Queue {
        frames: Mutex::new(VecDeque::new()),
        ready: Notify::new(),
        closed: AtomicBool::new(false),
    });
    // The writer runs in this task, next to the read of the answer (not as a task of its
    // own): a TLS stream split with `tokio::io::split` is not guaranteed to wake two tasks
    // that use its halves at once (tokio-rs/tls#40), and one task polling both halves needs
    // no such guarantee.
    let writer = write_loop(queue.clone(), w);
    let start = Instant::now();
    let count = async {
        let tasks: Vec<_> = (0..senders)
            .map(|_| {
                let queue = queue.clone();
                let payload = payload.clone();
                tokio::spawn(async move {
                    for _ in 0..per_sender {
                        push(&queue, Out::Data(payload.clone())).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("raw sender task");
        }
        push(&queue, Out::Count).await;
        let mut answer = [0u8; 13];
        r.read_exact(&mut answer)
            .await
            .expect("the raw server answers the count");
        let secs = start.elapsed().as_secs_f64();
        queue.closed.store(true, Ordering::Release);
        queue.ready.notify_one();
        (answer, secs)
    };
    let (written, (answer, secs)) = tokio::join!(writer, count);
    written.expect("raw writer wrote");
    let mut a = &answer[..];
    assert_eq!((a.get_u32(), a.get_u8()), (9, COUNT), "raw count frame");
    let counted = a.get_u64();
    assert_eq!(counted, senders as u64 * per_sender, "raw server count");
    counted as f64 / secs
}

/// Sequential ping-pong: `n` `ECHO` round trips, one at a time, each recorded in `hist` (ns).
pub async fn ping_pong<R, W>(mut r: R, mut w: W, n: usize, hist: &mut Histogram<u64>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut answer = [0u8; 13];
    for i in 0..n as u64 {
        let mut req = [0u8; 13];
        req[..4].copy_from_slice(&9u32.to_be_bytes());
        req[4] = ECHO;
        req[5..].copy_from_slice(&i.to_be_bytes());
        let start = Instant::now();
        w.write_all(&req).await.expect("raw ping written");
        w.flush().await.expect("raw ping flushed");
        r.read_exact(&mut answer).await.expect("raw pong read");
        let ns = start.elapsed().as_nanos() as u64;
        assert_eq!(answer, req, "echoed as sent");
        hist.record(ns.max(1)).expect("latency in range");
    }
}

/// Open loop: `total` `ECHO` requests at `rate` per second; each due batch is written with one
/// `write_all`, each request carries its send time, and a reader task records every round trip
/// (ns) into the returned histogram.
pub async fn open_loop<R, W>(r: R, mut w: W, rate: f64, total: u64) -> Histogram<u64>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let base = Instant::now();
    let reader = tokio::spawn(async move {
        let mut r = r;
        let mut hist = super::ask::histogram();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut seen = 0u64;
        while seen < total {
            reserve(&mut buf);
            if r.read_buf(&mut buf).await.expect("raw echoes read") == 0 {
                panic!("raw server closed the connection");
            }
            while let Some(mut body) = cut(&mut buf) {
                assert_eq!(body.get_u8(), ECHO);
                let sent = body.get_u64();
                let ns = (base.elapsed().as_nanos() as u64).saturating_sub(sent);
                hist.record(ns.max(1)).expect("latency in range");
                seen += 1;
            }
        }
        hist
    });
    let mut issued = 0u64;
    let mut buf = BytesMut::new();
    while issued < total {
        let due = super::ask::due(base, rate, total);
        if due > issued {
            let now = base.elapsed().as_nanos() as u64;
            for _ in issued..due {
                buf.put_u32(9);
                buf.put_u8(ECHO);
                buf.put_u64(now);
            }
            w.write_all(&buf).await.expect("raw requests written");
            w.flush().await.expect("raw requests flushed");
            buf.clear();
            issued = due;
        } else {
            tokio::time::sleep_until(super::ask::when(base, rate, issued).into()).await;
        }
    }
    reader.await.expect("raw reader task")
}

/// Accepts raw connections on `listener` and serves each ([`serve`]) on its own task, for
/// as long as the runtime runs (the peer processes of the `remote` and `sharding` suites).
pub fn spawn_server(listener: tokio::net::TcpListener) {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let (r, w) = stream.into_split();
            tokio::spawn(async move {
                if let Err(e) = serve(r, w).await {
                    eprintln!("[raw server] connection failed: {e}");
                }
            });
        }
    });
}

/// Closed-loop pipelining: `n` `ECHO` round trips with `in_flight` outstanding at all times;
/// each read's worth of answers is replaced by as many new requests in one `write_all`.
/// Returns round trips per second.
pub async fn pipelined<R, W>(mut r: R, mut w: W, n: u64, in_flight: u64) -> f64
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let start = Instant::now();
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut buf = BytesMut::with_capacity(128 * 1024);
    let mut issued = 0u64;
    let mut answered = 0u64;
    let request = |out: &mut BytesMut, i: u64| {
        out.put_u32(9);
        out.put_u8(ECHO);
        out.put_u64(i);
    };
    while issued < n.min(in_flight) {
        request(&mut out, issued);
        issued += 1;
    }
    w.write_all(&out).await.expect("raw requests written");
    w.flush().await.expect("raw requests flushed");
    out.clear();
    while answered < n {
        reserve(&mut buf);
        if r.read_buf(&mut buf).await.expect("raw echoes read") == 0 {
            panic!("raw server closed the connection");
        }
        while let Some(mut body) = cut(&mut buf) {
            assert_eq!(body.get_u8(), ECHO);
            let _ = body.get_u64();
            answered += 1;
            if issued < n {
                request(&mut out, issued);
                issued += 1;
            }
        }
        if !out.is_empty() {
            w.write_all(&out).await.expect("raw requests written");
            w.flush().await.expect("raw requests flushed");
            out.clear();
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}
