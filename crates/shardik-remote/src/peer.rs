//! One remote node as seen from here: its two outbound queues (control and user lane), its
//! current connection on each lane and the rule that keeps exactly one connection per lane
//! and node pair.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use shardik_actor::wire::WireContext;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use bytes::{Bytes, BytesMut};

use crate::codec::encode_frame;
use crate::error::FrameError;
use crate::frame::{Frame, Lane, NodeIdentity, RejectReason, ReplyFailure};
use crate::node::Node;
use crate::queue::{Full, OutQueue};
use crate::registry::LookupCache;
use crate::replies::PeerWire;
use crate::scratch::with_scratch;
use crate::stats::should_log;

/// A live connection to a peer (diagnostics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// This end of the TCP connection.
    pub local: SocketAddr,
    /// The other end of the TCP connection.
    pub remote: SocketAddr,
    /// Who is on the other end.
    pub peer: NodeIdentity,
    /// True if this node dialed.
    pub outbound: bool,
    /// Which of the node pair's two connections this is.
    pub lane: Lane,
}

pub(crate) struct ConnSlot {
    pub(crate) id: u64,
    pub(crate) info: ConnectionInfo,
    pub(crate) cancel: CancellationToken,
    /// Cancelled once the connection's reader has stopped handling frames (or the
    /// connection never got one): a connection that replaces it reads from then on.
    pub(crate) stopped: CancellationToken,
}

/// Per-lane state of a peer.
#[derive(Default)]
struct LaneState {
    conn: Option<ConnSlot>,
    /// Dial attempts in flight.
    dialing: u32,
    /// When this lane's last connection ended, if none has been installed since.
    ended_at: Option<Instant>,
    /// Connections replaced on this lane whose readers may still be handling frames, each
    /// until when a successor waits for it: every connection installed on the lane waits
    /// for all of them, not only for the one it replaced (which may itself have been
    /// waiting, or have failed before it had a reader).
    unstopped: Vec<Predecessor>,
}

impl LaneState {
    /// Remembers the replaced connection `old` as one whose reader may still be running.
    fn replaced(&mut self, old: ConnSlot, deadline: tokio::time::Instant) {
        self.unstopped.push(Predecessor {
            id: old.id,
            stopped: old.stopped,
            deadline,
        });
    }

    /// The replaced connections whose readers may still be running and are still waited for.
    fn unstopped(&mut self, now: tokio::time::Instant) -> &[Predecessor] {
        self.unstopped
            .retain(|p| !p.stopped.is_cancelled() && p.deadline > now);
        &self.unstopped
    }
}

/// A replaced connection whose reader a successor waits for.
#[derive(Clone, Debug)]
pub(crate) struct Predecessor {
    /// Its connection id.
    pub(crate) id: u64,
    /// Its [`ConnSlot::stopped`].
    pub(crate) stopped: CancellationToken,
    /// Until when it is waited for (`idle_timeout` after it was replaced): a reader held
    /// longer (a decoder that blocks) no longer holds up the connections after it.
    pub(crate) deadline: tokio::time::Instant,
}

#[derive(Default)]
struct PeerState {
    lanes: [LaneState; 2],
    /// The last identity seen at this address.
    remote: Option<NodeIdentity>,
}

impl PeerState {
    fn lane(&mut self, lane: Lane) -> &mut LaneState {
        &mut self.lanes[lane.index()]
    }

    fn any_connected(&self) -> bool {
        self.lanes.iter().any(|l| l.conn.is_some())
    }
}

/// A peer that came back as a new incarnation.
pub(crate) struct Restarted {
    /// Its previous incarnation.
    pub(crate) old: u64,
    /// Requests sent before this instant went to the old incarnation ...
    pub(crate) cutoff: Instant,
    /// ... except those still queued (their frames wait for the new incarnation's
    /// connections): the reply slots they carry.
    pub(crate) queued: std::collections::HashSet<u64>,
}

/// What installing a connection changed.
pub(crate) struct Installed {
    /// Set if the peer is a new incarnation (detected once, by the first connection to it).
    pub(crate) restarted: Option<Restarted>,
    /// True if no other connection to the peer was up: the association just came up.
    pub(crate) first: bool,
    /// Lanes whose installed connection this one replaced (closed): their ends no longer
    /// find themselves installed, so the caller accounts for them here.
    pub(crate) replaced: Vec<Lane>,
    /// The connections replaced on this lane (or, by a restart, on any lane) whose readers
    /// may still be running, the one this one replaced and those it was still waiting for:
    /// its reader handles nothing before they have all stopped (or their deadline passed),
    /// so that what the peer sent on a replaced connection and this node reads is never
    /// overtaken by what it sent later on this one.
    pub(crate) predecessors: Vec<Predecessor>,
}

/// One lane toward the peer: its queue, the dialer's wake-up and whether it is connected.
pub(crate) struct LaneLink {
    pub(crate) queue: OutQueue,
    /// Wakes this lane's dialer: frames queued while disconnected, a connection ended, or the
    /// other lane connected.
    pub(crate) wake: Notify,
    /// Cuts this lane's reconnect backoff short: the other lane just connected, so the peer
    /// is reachable again.
    pub(crate) other_up: Notify,
    /// Wakes everyone waiting for this lane to connect ([`Peer::wait_connected`]).
    up: Notify,
    connected: AtomicBool,
    /// Recent heartbeats in flight on this lane: sequence number and when each was queued.
    heartbeats: Mutex<VecDeque<(u64, Instant)>>,
}

impl LaneLink {
    /// True if a connection is installed on this lane.
    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }
}

pub(crate) struct Peer {
    /// The peer's advertised address, the key it is known by.
    pub(crate) addr: Arc<str>,
    node: Weak<Node>,
    links: [LaneLink; 2],
    state: Mutex<PeerState>,
    pub(crate) wire: Arc<dyn WireContext>,
    /// This node's own address: frames are handled in place, without a connection.
    loopback: bool,
    /// The node's frame size limit (`RemoteConfig::max_frame_len`).
    max_frame_len: usize,
    /// Heartbeats and heartbeat answers dropped for a full lane (for rate-limited logs).
    heartbeats_dropped: AtomicU64,
    /// How long a new connection waits for the readers of those it replaced
    /// (`RemoteConfig::idle_timeout`).
    handover_limit: std::time::Duration,
    /// Ends this peer's dialers: cancelled when the node shuts down or forgets the peer.
    pub(crate) retired: CancellationToken,
}

/// Why a frame was not queued.
#[derive(Debug)]
pub(crate) enum NotQueued {
    /// The lane is full (drop newest).
    Full,
    /// The frame could not be encoded (too large, or its header failed to serialize).
    Encode(FrameError),
}

impl From<Full> for NotQueued {
    fn from(_: Full) -> Self {
        NotQueued::Full
    }
}

thread_local! {
    /// A scratch buffer per thread that frames are encoded into before they are queued.
    static FRAME_SCRATCH: std::cell::RefCell<BytesMut> =
        std::cell::RefCell::new(BytesMut::new());
}

/// The order that decides simultaneous connects: the lower node keeps its outbound connection.
fn rank(id: &NodeIdentity) -> (&str, u64, &str) {
    (&id.node_id, id.incarnation, &id.addr)
}

impl Peer {
    pub(crate) fn new(node: &Arc<Node>, addr: Arc<str>) -> Arc<Peer> {
        let link = |cap, per_write| LaneLink {
            queue: OutQueue::new(cap, per_write, node.cfg.outbound_queue_bytes),
            wake: Notify::new(),
            other_up: Notify::new(),
            up: Notify::new(),
            connected: AtomicBool::new(false),
            heartbeats: Mutex::new(VecDeque::new()),
        };
        Arc::new(Peer {
            wire: Arc::new(PeerWire {
                node: Arc::downgrade(node),
                peer: addr.clone(),
                format: node.cfg.payload_format.clone(),
            }),
            loopback: *node.addr == *addr,
            max_frame_len: node.cfg.max_frame_len,
            heartbeats_dropped: AtomicU64::new(0),
            handover_limit: node.cfg.idle_timeout,
            retired: node.shutdown.child_token(),
            addr,
            node: Arc::downgrade(node),
            links: [
                // The control lane writes whatever is queued at once.
                link(node.cfg.control_queue, node.cfg.control_queue),
                link(node.cfg.outbound_queue, node.cfg.write_batch_frames),
            ],
            state: Mutex::new(PeerState::default()),
        })
    }

    /// True if nothing is going on with this peer: no connection or dial on any lane,
    /// nothing queued, and no connection ended within `grace` of `now` (a peer that was just
    /// connected is likely to be used again).
    pub(crate) fn is_idle(&self, now: Instant, grace: std::time::Duration) -> bool {
        let st = self.state.lock();
        st.lanes.iter().all(|l| {
            l.conn.is_none()
                && l.dialing == 0
                && l.ended_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= grace)
        }) && self.links.iter().all(|l| l.queue.is_empty())
    }

    /// The queue, wake-up and heartbeats of `lane`.
    pub(crate) fn link(&self, lane: Lane) -> &LaneLink {
        &self.links[lane.index()]
    }

    /// Queues `frame` on `lane`; wakes that lane's dialer if it has no connection. A frame
    /// to this node itself is handled at once, as if it had arrived.
    fn send_on(&self, lane: Lane, frame: Frame) -> Result<(), NotQueued> {
        if self.loopback {
            self.handle_here(lane, frame);
            return Ok(());
        }
        self.push_frame(lane, &frame)
    }

    /// A frame to this node itself: decoded and delivered now, in order, as if it had
    /// arrived (same encoding, same reply path).
    fn handle_here(&self, lane: Lane, frame: Frame) {
        if let Some(node) = self.node.upgrade() {
            let me = node.local.me.clone();
            node.handle_frame(self, lane, &me, frame, &mut LookupCache::default());
        }
    }

    /// Encodes `frame` and queues it on `lane` (no loopback handling).
    fn push_frame(&self, lane: Lane, frame: &Frame) -> Result<(), NotQueued> {
        with_scratch(&FRAME_SCRATCH, |buf| {
            encode_frame(frame, buf, self.max_frame_len).map_err(NotQueued::Encode)?;
            Ok(self.push_encoded(lane, buf)?)
        })
    }

    /// Queues an encoded frame (length prefix and body) on `lane`; wakes that lane's dialer
    /// if it has no connection.
    fn push_encoded(&self, lane: Lane, frame: &[u8]) -> Result<(), Full> {
        let link = self.link(lane);
        link.queue.push(frame)?;
        if !link.connected.load(Ordering::Acquire) {
            link.wake.notify_one();
        }
        Ok(())
    }

    /// Queues an encoded message frame (built with [`crate::frame::begin_message`]) on the
    /// user lane, or on the control lane if `control`. A message to this node itself is
    /// handled at once, as if it had arrived.
    pub(crate) fn send_message(&self, frame: &[u8], control: bool) -> Result<(), Full> {
        let lane = if control { Lane::Control } else { Lane::User };
        if self.loopback {
            match Frame::decode_body(Bytes::copy_from_slice(&frame[4..])) {
                Ok(f) => self.handle_here(lane, f),
                Err(e) => tracing::error!("a message to this node failed to decode: {e}"),
            }
            return Ok(());
        }
        self.push_encoded(lane, frame)
    }

    /// Whether a user frame would be refused now (a message to this node itself never is).
    pub(crate) fn user_full(&self) -> bool {
        !self.loopback && self.link(Lane::User).queue.is_full()
    }

    /// Queues a reply or reply failure; a full lane drops it with an error log (the asker
    /// times out). A reply too large to send fails the asker's slot instead.
    pub(crate) fn send_reply(&self, frame: Frame) {
        let failed_id = match &frame {
            Frame::Reply { id, .. } => Some(*id),
            _ => None,
        };
        let err = match self.send_on(Lane::User, frame) {
            Ok(()) => return,
            Err(e) => e,
        };
        let Some(node) = self.node.upgrade() else {
            return;
        };
        match err {
            NotQueued::Full => {
                if let Some(n) = node.counters.bump_to_log(
                    &node.counters.dropped_queue_full,
                    "shardik_remote_dropped_queue_full_total",
                ) {
                    tracing::error!(peer = %self.addr, total = n, "outbound queue full: reply dropped; the asker will time out");
                }
            }
            NotQueued::Encode(e) => {
                let n = node.counters.bump(
                    &node.counters.dropped_too_large,
                    "shardik_remote_dropped_too_large_total",
                );
                // A peer can ask for answers too large to send at will.
                if should_log(n) {
                    tracing::error!(peer = %self.addr, total = n, "reply not sent: {e}");
                }
                if let Some(id) = failed_id {
                    self.send_reply(Frame::ReplyFailed {
                        ids: vec![id],
                        failure: ReplyFailure::Undeliverable,
                        reason: format!("the reply could not be sent: {e}"),
                    });
                }
            }
        }
    }

    /// Queues a heartbeat answer on `lane`; a full lane drops it with a warning.
    pub(crate) fn send_heartbeat_ack(&self, lane: Lane, seq: u64) {
        if self.push_frame(lane, &Frame::HeartbeatAck(seq)).is_err() {
            // Rate-limited: a peer that floods heartbeats without reading fills the lane and
            // would otherwise get a log line per heartbeat.
            let n = self.heartbeats_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if should_log(n) {
                tracing::warn!(peer = %self.addr, lane = lane.as_str(), total = n, "lane full: heartbeat answer dropped");
            }
        }
    }

    /// Queues heartbeat `seq` on `lane` and remembers when.
    pub(crate) fn send_heartbeat(&self, lane: Lane, seq: u64) {
        let link = self.link(lane);
        {
            let mut hb = link.heartbeats.lock();
            if hb.len() >= 64 {
                hb.pop_front();
            }
            hb.push_back((seq, Instant::now()));
        }
        if self.push_frame(lane, &Frame::Heartbeat(seq)).is_err() {
            let n = self.heartbeats_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if should_log(n) {
                tracing::warn!(peer = %self.addr, lane = lane.as_str(), total = n, "lane full: heartbeat dropped");
            }
        }
    }

    /// The round trip of heartbeat `seq` on `lane`, if it is one of ours still in flight.
    pub(crate) fn heartbeat_acked(&self, lane: Lane, seq: u64) -> Option<std::time::Duration> {
        let mut hb = self.link(lane).heartbeats.lock();
        let i = hb.iter().position(|(s, _)| *s == seq)?;
        let (_, at) = hb[i];
        hb.drain(..=i);
        Some(at.elapsed())
    }

    /// Starts a dial on `lane` if it has no connection and no dial in flight, and either has
    /// something to send or this node dialed the other lane's connection (the dialer of an
    /// association makes both of its connections). True if started.
    pub(crate) fn try_start_dial(&self, lane: Lane) -> bool {
        let mut st = self.state.lock();
        // A connection being closed (`disconnect`) does not count: closing both must not
        // re-make one at once.
        let other_outbound = st.lanes[lane.other().index()]
            .conn
            .as_ref()
            .is_some_and(|c| c.info.outbound && !c.cancel.is_cancelled());
        let l = st.lane(lane);
        if l.conn.is_none()
            && l.dialing == 0
            && (other_outbound || !self.link(lane).queue.is_empty())
        {
            l.dialing += 1;
            true
        } else {
            false
        }
    }

    /// Starts a dial on every lane that has no connection (explicit connect); returns those
    /// lanes. Each must be ended with [`end_dial`](Self::end_dial).
    pub(crate) fn start_dials(&self) -> Vec<Lane> {
        let mut st = self.state.lock();
        Lane::ALL
            .into_iter()
            .filter(|&lane| {
                let l = st.lane(lane);
                let start = l.conn.is_none();
                if start {
                    l.dialing += 1;
                }
                start
            })
            .collect()
    }

    pub(crate) fn end_dial(&self, lane: Lane) {
        let mut st = self.state.lock();
        let l = st.lane(lane);
        l.dialing = l.dialing.saturating_sub(1);
    }

    /// Installs a connection whose handshake completed as the connector.
    pub(crate) fn install(&self, slot: ConnSlot) -> Installed {
        let mut st = self.state.lock();
        self.install_locked(&mut st, slot)
    }

    /// Installs `slot` on its lane, replacing (and closing) the lane's previous connection.
    /// A new incarnation is detected here, once: its first connection closes every
    /// connection to the old one and reports the restart.
    fn install_locked(&self, st: &mut PeerState, slot: ConnSlot) -> Installed {
        let lane = slot.info.lane;
        let new = &slot.info.peer;
        let mut replaced = Vec::new();
        let mut predecessors = Vec::new();
        let now = tokio::time::Instant::now();
        let deadline = now + self.handover_limit;
        let restarted = match &st.remote {
            Some(r) if r.incarnation != new.incarnation => {
                // Requests sent before the old incarnation's first connection ended went to
                // it; if none ended yet, everything sent so far did.
                let cutoff = st
                    .lanes
                    .iter()
                    .filter_map(|l| l.ended_at)
                    .min()
                    .unwrap_or_else(Instant::now);
                let mut queued = std::collections::HashSet::new();
                for (l, link) in st.lanes.iter_mut().zip(&self.links) {
                    if let Some(old) = l.conn.take() {
                        old.cancel.cancel();
                        link.queue.release(old.id);
                        replaced.push(old.info.lane);
                        l.replaced(old, deadline);
                    }
                    // The first connection to the new incarnation waits for every old
                    // reader (the other lane's connection, for that lane's).
                    predecessors.extend_from_slice(l.unstopped(now));
                    l.ended_at = None;
                    // No old writer takes frames any more (also not that of a connection
                    // that ended but has not released the lane yet): what waits goes to the
                    // new incarnation.
                    link.queue.unassign();
                    link.queue.queued_reply_ids(&mut queued);
                }
                Some(Restarted {
                    old: r.incarnation,
                    cutoff,
                    queued,
                })
            }
            _ => None,
        };
        st.remote = Some(new.clone());
        let first = !st.any_connected();
        let l = st.lane(lane);
        if let Some(old) = l.conn.take() {
            old.cancel.cancel();
            replaced.push(lane);
            l.replaced(old, deadline);
        }
        if restarted.is_none() {
            predecessors.extend_from_slice(l.unstopped(now));
        }
        l.ended_at = None;
        // From here on only this connection's writer takes the lane's frames: the replaced
        // one's, even if it has not seen its cancellation yet, gets none.
        self.links[lane.index()].queue.assign(slot.id);
        l.conn = Some(slot);
        self.link(lane).connected.store(true, Ordering::Release);
        self.link(lane).up.notify_waiters();
        // The dialer of an association also makes its other connection, at once.
        let other = self.link(lane.other());
        other.wake.notify_one();
        other.other_up.notify_one();
        Installed {
            restarted,
            first,
            replaced,
            predecessors,
        }
    }

    /// Decides, as the accepting side and after the peer proved itself, whether to keep an
    /// inbound connection, and installs it if so. Each lane is decided on its own: with
    /// simultaneous connects the lower node (by node id, incarnation, address) keeps its
    /// outbound connection: it refuses the inbound one while it dials or holds an outbound
    /// connection on the same lane to the same incarnation; the higher node always takes the
    /// lower node's connection.
    pub(crate) fn admit_inbound(
        &self,
        me: &NodeIdentity,
        slot: ConnSlot,
    ) -> Result<Installed, RejectReason> {
        let mut st = self.state.lock();
        let remote = &slot.info.peer;
        let same_incarnation = st
            .remote
            .as_ref()
            .is_none_or(|r| r.incarnation == remote.incarnation);
        let l = &st.lanes[slot.info.lane.index()];
        let have_outbound = l.dialing > 0 || l.conn.as_ref().is_some_and(|c| c.info.outbound);
        if rank(me) < rank(remote) && same_incarnation && have_outbound {
            return Err(RejectReason::Duplicate);
        }
        Ok(self.install_locked(&mut st, slot))
    }

    /// A connection on `lane` ended. Returns `None` if it was not the lane's current one,
    /// else whether it was the peer's last connection (the association is down). Wakes the
    /// lane's dialer.
    pub(crate) fn connection_ended(&self, lane: Lane, id: u64) -> Option<bool> {
        let mut st = self.state.lock();
        let l = st.lane(lane);
        if l.conn.as_ref().map(|c| c.id) != Some(id) {
            return None;
        }
        l.conn = None;
        l.ended_at = Some(Instant::now());
        let last = !st.any_connected();
        drop(st);
        let link = self.link(lane);
        link.queue.release(id);
        link.connected.store(false, Ordering::Release);
        link.wake.notify_one();
        Some(last)
    }

    /// The identity last seen at this address (by the last connection installed), if any.
    pub(crate) fn identity(&self) -> Option<NodeIdentity> {
        self.state.lock().remote.clone()
    }

    /// Waits up to `timeout` for a connection on `lane` (the current one if there is one);
    /// `None` if none came, or the peer was retired meanwhile.
    pub(crate) async fn wait_connected(
        &self,
        lane: Lane,
        timeout: std::time::Duration,
    ) -> Option<ConnectionInfo> {
        let wait = async {
            loop {
                // Registered before looking, so an install in between is not missed.
                let up = self.link(lane).up.notified();
                if let Some(c) = self.connection(lane) {
                    return Some(c);
                }
                tokio::select! {
                    _ = self.retired.cancelled() => return None,
                    _ = up => {}
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    /// The current connection on `lane`, if any.
    pub(crate) fn connection(&self, lane: Lane) -> Option<ConnectionInfo> {
        self.state.lock().lanes[lane.index()]
            .conn
            .as_ref()
            .map(|c| c.info.clone())
    }

    /// Closes the current connection on each lane in `lanes`, if any.
    pub(crate) fn disconnect(&self, lanes: &[Lane]) {
        let st = self.state.lock();
        for lane in lanes {
            if let Some(c) = &st.lanes[lane.index()].conn {
                c.cancel.cancel();
                // Frames queued from now on wait for the next connection.
                self.link(*lane).queue.release(c.id);
            }
        }
    }
}
