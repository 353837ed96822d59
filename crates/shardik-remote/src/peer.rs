//! One remote node as seen from here: its outbound queue, its current connection and the rule
//! that keeps exactly one connection per node pair.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use shardik_actor::wire::WireContext;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::frame::{Frame, NodeIdentity, RejectReason};
use crate::node::Node;
use crate::queue::{Full, OutQueue};
use crate::registry::LookupCache;
use crate::replies::PeerWire;
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
}

pub(crate) struct ConnSlot {
    pub(crate) id: u64,
    pub(crate) info: ConnectionInfo,
    pub(crate) cancel: CancellationToken,
}

#[derive(Default)]
struct PeerState {
    conn: Option<ConnSlot>,
    /// Dial attempts in flight.
    dialing: u32,
    /// The last identity seen at this address.
    remote: Option<NodeIdentity>,
    /// When the last connection ended, if none has been installed since.
    ended_at: Option<Instant>,
}

/// A peer that came back as a new incarnation.
pub(crate) struct Restarted {
    /// Its previous incarnation.
    pub(crate) old: u64,
    /// Requests sent before this instant went to the old incarnation.
    pub(crate) cutoff: Instant,
}

pub(crate) struct Peer {
    /// The peer's advertised address, the key it is known by.
    pub(crate) addr: Arc<str>,
    node: Weak<Node>,
    pub(crate) queue: OutQueue,
    state: Mutex<PeerState>,
    /// Wakes the dialer: messages queued while disconnected, or a connection ended.
    pub(crate) wake: Notify,
    connected: AtomicBool,
    pub(crate) wire: Arc<dyn WireContext>,
    /// This node's own address: frames are handled in place, without a connection.
    loopback: bool,
    /// Recent heartbeats in flight: sequence number and when each was queued.
    heartbeats: Mutex<VecDeque<(u64, Instant)>>,
}

/// The order that decides simultaneous connects: the lower node keeps its outbound connection.
fn rank(id: &NodeIdentity) -> (&str, u64, &str) {
    (&id.node_id, id.incarnation, &id.addr)
}

impl Peer {
    pub(crate) fn new(node: &Arc<Node>, addr: Arc<str>) -> Arc<Peer> {
        let addr_for_loopback = addr.clone();
        Arc::new(Peer {
            wire: Arc::new(PeerWire {
                node: Arc::downgrade(node),
                peer: addr.clone(),
            }),
            addr,
            node: Arc::downgrade(node),
            queue: OutQueue::new(node.cfg.outbound_queue, node.cfg.control_queue),
            state: Mutex::new(PeerState::default()),
            wake: Notify::new(),
            connected: AtomicBool::new(false),
            loopback: *node.addr == *addr_for_loopback,
            heartbeats: Mutex::new(VecDeque::new()),
        })
    }

    /// Queues a user frame; wakes the dialer if there is no connection.
    pub(crate) fn send_user(&self, frame: Frame) -> Result<(), Full> {
        if self.loopback {
            // A message to this node itself: decode and deliver now, in order, as if it had
            // arrived (same encoding, same reply path).
            if let Some(node) = self.node.upgrade() {
                let me = node.local.me.node_id.clone();
                node.handle_frame(self, &me, frame, &mut LookupCache::default());
            }
            return Ok(());
        }
        self.queue.push_user(frame)?;
        if !self.connected.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Whether a user frame would be refused now (a message to this node itself never is).
    pub(crate) fn user_full(&self) -> bool {
        !self.loopback && self.queue.user_full()
    }

    /// Queues a reply or reply failure; a full lane drops it with an error log (the asker
    /// times out).
    pub(crate) fn send_reply(&self, frame: Frame) {
        if self.send_user(frame).is_err() {
            if let Some(node) = self.node.upgrade() {
                let n = node.counters.bump(
                    &node.counters.dropped_queue_full,
                    "shardik_remote_dropped_queue_full_total",
                );
                if should_log(n) {
                    tracing::error!(peer = %self.addr, total = n, "outbound queue full: reply dropped; the asker will time out");
                }
            }
        }
    }

    /// Queues a control frame (heartbeats); a full control lane drops it with a warning.
    pub(crate) fn send_control(&self, frame: Frame) {
        if self.queue.push_control(frame).is_err() {
            tracing::warn!(peer = %self.addr, "control lane full: frame dropped");
        }
    }

    /// Queues a message frame on the control lane ([`RemoteRef::try_tell_control`]); wakes the
    /// dialer if there is no connection. A message to this node itself is handled at once.
    ///
    /// [`RemoteRef::try_tell_control`]: crate::RemoteRef::try_tell_control
    pub(crate) fn send_control_msg(&self, frame: Frame) -> Result<(), Full> {
        if self.loopback {
            if let Some(node) = self.node.upgrade() {
                let me = node.local.me.node_id.clone();
                node.handle_frame(self, &me, frame, &mut LookupCache::default());
            }
            return Ok(());
        }
        self.queue.push_control(frame)?;
        if !self.connected.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Queues heartbeat `seq` on the control lane and remembers when.
    pub(crate) fn send_heartbeat(&self, seq: u64) {
        {
            let mut hb = self.heartbeats.lock();
            if hb.len() >= 64 {
                hb.pop_front();
            }
            hb.push_back((seq, Instant::now()));
        }
        self.send_control(Frame::Heartbeat(seq));
    }

    /// The round trip of heartbeat `seq`, if it is one of ours still in flight.
    pub(crate) fn heartbeat_acked(&self, seq: u64) -> Option<std::time::Duration> {
        let mut hb = self.heartbeats.lock();
        let i = hb.iter().position(|(s, _)| *s == seq)?;
        let (_, at) = hb[i];
        hb.drain(..=i);
        Some(at.elapsed())
    }

    /// Starts a dial if there is no connection and something to send. True if started.
    pub(crate) fn try_start_dial(&self) -> bool {
        let mut st = self.state.lock();
        if st.conn.is_none() && st.dialing == 0 && !self.queue.is_empty() {
            st.dialing += 1;
            true
        } else {
            false
        }
    }

    /// Starts a dial unconditionally (explicit connect).
    pub(crate) fn start_dial(&self) {
        self.state.lock().dialing += 1;
    }

    pub(crate) fn end_dial(&self) {
        let mut st = self.state.lock();
        st.dialing = st.dialing.saturating_sub(1);
    }

    /// Installs a connection whose handshake completed as the connector. Says so if the peer
    /// restarted.
    pub(crate) fn install(&self, slot: ConnSlot) -> Option<Restarted> {
        let mut st = self.state.lock();
        self.install_locked(&mut st, slot)
    }

    fn install_locked(&self, st: &mut PeerState, slot: ConnSlot) -> Option<Restarted> {
        if let Some(old) = st.conn.take() {
            old.cancel.cancel();
        }
        let ended_at = st.ended_at.take();
        let new = &slot.info.peer;
        let restarted = match &st.remote {
            Some(r) if r.incarnation != new.incarnation => Some(Restarted {
                old: r.incarnation,
                cutoff: ended_at.unwrap_or_else(Instant::now),
            }),
            _ => None,
        };
        st.remote = Some(new.clone());
        st.conn = Some(slot);
        self.connected.store(true, Ordering::Release);
        restarted
    }

    /// Decides, as the accepting side and after the peer proved itself, whether to keep an
    /// inbound connection, and installs it if so. With simultaneous connects the lower node
    /// (by node id, incarnation, address) keeps its outbound connection: it refuses the
    /// inbound one while it dials or holds an outbound connection to the same incarnation;
    /// the higher node always takes the lower node's connection.
    pub(crate) fn admit_inbound(
        &self,
        me: &NodeIdentity,
        slot: ConnSlot,
    ) -> Result<Option<Restarted>, RejectReason> {
        let mut st = self.state.lock();
        let remote = &slot.info.peer;
        let same_incarnation = st
            .remote
            .as_ref()
            .is_none_or(|r| r.incarnation == remote.incarnation);
        let have_outbound = st.dialing > 0 || st.conn.as_ref().is_some_and(|c| c.info.outbound);
        if rank(me) < rank(remote) && same_incarnation && have_outbound {
            return Err(RejectReason::Duplicate);
        }
        Ok(self.install_locked(&mut st, slot))
    }

    /// A connection ended. True if it was the current one (the dialer is woken).
    pub(crate) fn connection_ended(&self, id: u64) -> bool {
        let mut st = self.state.lock();
        if st.conn.as_ref().map(|c| c.id) != Some(id) {
            return false;
        }
        st.conn = None;
        st.ended_at = Some(Instant::now());
        self.connected.store(false, Ordering::Release);
        drop(st);
        self.wake.notify_one();
        true
    }

    pub(crate) fn connection(&self) -> Option<ConnectionInfo> {
        self.state.lock().conn.as_ref().map(|c| c.info.clone())
    }

    /// Closes the current connection, if any.
    pub(crate) fn disconnect(&self) {
        if let Some(c) = self.state.lock().conn.as_ref() {
            c.cancel.cancel();
        }
    }
}
