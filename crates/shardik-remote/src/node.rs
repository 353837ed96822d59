//! The state shared by one node's tasks: peers, registry, reply slots, counters; and the tasks
//! themselves: accepting, dialing with backoff, reading and writing connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use parking_lot::Mutex;
use shardik_actor::wire::with_wire_context;
use shardik_actor::ActorSystem;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio_util::codec::FramedRead;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::codec::{BodyCodec, HANDSHAKE_MAX_FRAME_LEN};
use crate::config::RemoteConfig;
use crate::error::{panic_message, DecodeError, HandshakeError, RemoteError};
use crate::frame::{Envelope, Frame, HeaderCache, Lane, NodeIdentity, RejectReason, ReplyFailure};
use crate::handshake::{self, Local};
use crate::handshake_slots::{
    HandshakeSlot, HandshakeSlots, Refused, MAX_PENDING, MAX_PENDING_PER_SOURCE,
};
use crate::peer::{ConnSlot, ConnectionInfo, Installed, Peer, Predecessor, Restarted};
use crate::registry::{LookupCache, Registry};
use crate::replies::{self, AnswerFrom, Answered, Replies};
use crate::stats::{should_log, Counters, RemoteEvent};

/// Frames a connection reader handles in one go before it looks at cancellation again.
const READ_BURST: usize = 256;

/// With control characters escaped (`\n`, `\u{1b}`), then [`clip`]ped: a string a peer sent,
/// before the handshake has proven anything, made safe to put in an error, a log line or an
/// event.
pub(crate) fn shown(s: &str) -> String {
    shown_max(s, CLIP)
}

/// [`shown`], cut at `max` bytes instead. The cut is made after escaping, so the result is
/// at most `max` bytes (and the marker) however many control characters `s` holds, and
/// falls on a character boundary without splitting an escape.
pub(crate) fn shown_max(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let kept = out.len();
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > max {
            out.truncate(kept);
            out.push_str(&format!("… ({} bytes)", s.len()));
            break;
        }
    }
    out
}

/// How many bytes of a string from the network [`clip`] and [`shown`] keep.
const CLIP: usize = 200;

/// How many bytes of the reason of a [`Frame::ReplyFailed`] reach the asker's error: more
/// than [`CLIP`], as the reason of a payload that did not decode names its type and the
/// decoding error.
const MAX_FAILURE_REASON: usize = 1024;

/// `s`, or its first 200 bytes (on a character boundary) and a marker if it is longer: for
/// logging and echoing strings that came from the network.
pub(crate) fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    clip_max(s, CLIP)
}

fn clip_max(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let end = (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}… ({} bytes)", &s[..end], s.len()).into()
}

/// The known peers, and the size at which creating one looks for idle ones first.
struct Peers {
    map: HashMap<Arc<str>, Arc<Peer>>,
    look_again_at: usize,
}

impl Default for Peers {
    fn default() -> Self {
        Peers {
            map: HashMap::new(),
            look_again_at: MIN_PEERS_BEFORE_LOOKING,
        }
    }
}

/// Below this many peers, creating one does not look for idle ones (the periodic sweep
/// still does).
const MIN_PEERS_BEFORE_LOOKING: usize = 64;

/// A peer whose last connection ended less than this long ago is not forgotten yet.
const PEER_GRACE: Duration = Duration::from_secs(30);

/// How long a closing connection's writer may take to flush and shut its stream down.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) struct Node {
    pub(crate) system: ActorSystem,
    pub(crate) cfg: RemoteConfig,
    pub(crate) local: Local,
    /// This node's advertised address.
    pub(crate) addr: Arc<str>,
    peers: Mutex<Peers>,
    pub(crate) registry: Registry,
    pub(crate) replies: Replies,
    pub(crate) counters: Counters,
    pub(crate) events: broadcast::Sender<RemoteEvent>,
    pub(crate) shutdown: CancellationToken,
    /// Set with `shutdown` (see [`Node::shut_down`]): read on every send, where the token's
    /// `is_cancelled` would take its mutex.
    closed: AtomicBool,
    pub(crate) tasks: TaskTracker,
    handshake_slots: HandshakeSlots,
    /// Failed handshakes per kind, for rate-limited logging.
    handshake_failure_kinds: Mutex<HashMap<&'static str, u64>>,
    next_conn: AtomicU64,
    me: Weak<Node>,
    /// Tests: which reader (connection id) waits for which replaced one's, now.
    #[cfg(test)]
    handover_waits: tokio::sync::watch::Sender<Vec<(u64, u64)>>,
}

impl Node {
    pub(crate) fn new(system: ActorSystem, cfg: RemoteConfig, local: Local) -> Arc<Node> {
        Arc::new_cyclic(|me| Node {
            system,
            counters: Counters::new(&local.me.node_id),
            addr: local.me.addr.as_str().into(),
            local,
            cfg,
            peers: Mutex::new(Peers::default()),
            registry: Registry::default(),
            replies: Replies::new(),
            events: broadcast::channel(1024).0,
            shutdown: CancellationToken::new(),
            closed: AtomicBool::new(false),
            tasks: TaskTracker::new(),
            handshake_slots: HandshakeSlots::new(),
            handshake_failure_kinds: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            me: me.clone(),
            #[cfg(test)]
            handover_waits: tokio::sync::watch::channel(Vec::new()).0,
        })
    }

    /// Starts shutting the layer down: sends fail from now on and every task is cancelled.
    pub(crate) fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
        self.shutdown.cancel();
    }

    /// True once [`shut_down`](Self::shut_down) was called (a lock-free read).
    #[inline]
    pub(crate) fn is_shut_down(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn event(&self, e: RemoteEvent) {
        let _ = self.events.send(e);
    }

    /// Moves `shardik_remote_connections{node, lane}` (connections installed now, one per
    /// lane and peer) by `delta`: up as a connection is installed (with its `Connected`
    /// event), down as an installed one ends (with its `ConnectionClosed`).
    fn open_connections(&self, lane: Lane, delta: f64) {
        metrics::gauge!(
            "shardik_remote_connections",
            "node" => self.counters.node().clone(),
            "lane" => lane.as_str()
        )
        .increment(delta);
    }

    /// The peer at `addr`, created (with a dialer task per lane) on first use.
    ///
    /// Creating one may first forget idle peers (see [`forget_idle_peers`](Self::forget_idle_peers)),
    /// once the map has doubled since they were last looked at: addresses learned from
    /// messages (a `RemoteRef` inside one) must not make the map grow for good.
    pub(crate) fn peer(&self, addr: &str) -> Arc<Peer> {
        if let Some(p) = self.peers.lock().map.get(addr) {
            return p.clone();
        }
        let node = self.me.upgrade().expect("node is alive while used");
        let full = {
            let peers = self.peers.lock();
            peers.map.len() >= peers.look_again_at
        };
        if full {
            self.forget_idle_peers();
        }
        let mut peers = self.peers.lock();
        if let Some(p) = peers.map.get(addr) {
            return p.clone();
        }
        let peer = Peer::new(&node, addr.into());
        // On the actor system's runtime: the first message to a peer may be sent from a
        // thread outside any runtime. Spawned before the peer is in the map (and under its
        // lock), so that `forget_idle_peers` never sees it with its dialers' references
        // standing in for the caller's.
        for lane in Lane::ALL {
            self.tasks.spawn_on(
                dial_loop(node.clone(), peer.clone(), lane),
                self.system.runtime(),
            );
        }
        peers.map.insert(peer.addr.clone(), peer.clone());
        drop(peers);
        peer
    }

    pub(crate) fn existing_peer(&self, addr: &str) -> Option<Arc<Peer>> {
        self.peers.lock().map.get(addr).cloned()
    }

    /// Peers this node knows of now.
    pub(crate) fn peer_count(&self) -> usize {
        self.peers.lock().map.len()
    }

    /// Forgets the peers nothing uses: no connection, dial or queued frame (none ended
    /// within [`PEER_GRACE`]), no reference held outside the map and the peer's own dialers
    /// (a `RemoteRef`, a connection task), and no reply slot waiting on an answer from it.
    /// Their dialers end. Returns how many were forgotten.
    pub(crate) fn forget_idle_peers(&self) -> usize {
        // Read before the map is locked (never the reply slots' lock under the map's). A
        // slot made meanwhile belongs to a request sent through a reference to its peer,
        // which keeps the peer.
        let waited_on = self.replies.peers_waited_on();
        let now = std::time::Instant::now();
        let mut peers = self.peers.lock();
        let before = peers.map.len();
        peers.map.retain(|addr, p| {
            // Under the map's lock nobody can take a new reference from the map, and one
            // taken from an outside reference would show in the count: an unused peer stays
            // unused while it is removed.
            let unused = Arc::strong_count(p) == 1 + Lane::ALL.len()
                && !waited_on.contains(addr)
                && p.is_idle(now, PEER_GRACE);
            if unused {
                p.retired.cancel();
            }
            !unused
        });
        let forgotten = before - peers.map.len();
        peers.look_again_at = (peers.map.len() * 2).max(MIN_PEERS_BEFORE_LOOKING);
        if forgotten > 0 {
            self.counters
                .peers_forgotten
                .fetch_add(forgotten as u64, Ordering::Relaxed);
            metrics::counter!("shardik_remote_peers_forgotten_total", "node" => self.counters.node().clone())
                .increment(forgotten as u64);
            tracing::debug!(node = %self.local.me.node_id, forgotten, left = peers.map.len(), "forgot idle peers");
        }
        forgotten
    }

    /// A new connection's slot, its id, the token that ends its tasks, and the guard that
    /// tells a connection replacing it that its reader has stopped (dropped when the reader
    /// stops, or when the connection fails before it has one).
    fn conn_slot(&self, info: ConnectionInfo) -> (u64, ConnSlot, CancellationToken, DropGuard) {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let cancel = self.shutdown.child_token();
        let stopped = CancellationToken::new();
        (
            id,
            ConnSlot {
                id,
                info,
                cancel: cancel.clone(),
                stopped: stopped.clone(),
            },
            cancel,
            stopped.drop_guard(),
        )
    }

    fn connection_up(&self, peer: &Peer, info: &ConnectionInfo, installed: Installed) {
        let (remote, outbound, lane) = (&info.peer, info.outbound, info.lane);
        self.counters.bump(
            &self.counters.connections_established,
            "shardik_remote_connections_established_total",
        );
        tracing::info!(
            node = %self.local.me.node_id,
            peer = %remote.node_id,
            peer_addr = %peer.addr,
            incarnation = remote.incarnation,
            outbound,
            lane = lane.as_str(),
            first = installed.first,
            "connected"
        );
        self.install_effects(peer, remote, installed);
        self.open_connections(lane, 1.0);
        self.event(RemoteEvent::Connected {
            addr: peer.addr.to_string(),
            node_id: remote.node_id.clone(),
            incarnation: remote.incarnation,
            outbound,
            lane,
        });
    }

    /// What installing a connection did besides adding it, whether or not the connection
    /// then comes up: a detected restart fails the replies its old incarnation owes, and the
    /// connections it replaced are closed.
    fn install_effects(&self, peer: &Peer, remote: &NodeIdentity, installed: Installed) {
        if let Some(Restarted {
            old,
            cutoff,
            queued,
        }) = installed.restarted
        {
            tracing::info!(
                peer = %remote.node_id,
                peer_addr = %peer.addr,
                old_incarnation = old,
                new_incarnation = remote.incarnation,
                "peer restarted; failing replies pending toward its old incarnation"
            );
            self.replies.fail_peer(
                &peer.addr,
                cutoff,
                &queued,
                "the peer restarted before answering",
            );
            self.event(RemoteEvent::PeerRestarted {
                addr: peer.addr.to_string(),
                old,
                new: remote.incarnation,
            });
        }
        for old in &installed.replaced {
            self.open_connections(*old, -1.0);
            self.event(RemoteEvent::ConnectionClosed {
                addr: peer.addr.to_string(),
                lane: *old,
            });
        }
    }

    /// Accounts for a handshake that did not complete: counted in `handshake_failures`,
    /// logged (rate-limited) and published as [`RemoteEvent::HandshakeFailed`]; except for
    /// the refusal of a duplicate connection, which is how simultaneous connects are decided,
    /// not a failure (logged at debug level only).
    fn handshake_failed(&self, addr: &str, e: &HandshakeError) {
        let me = &self.local.me.node_id;
        match e {
            HandshakeError::Refused { detail, .. } if is_duplicate(e) => {
                tracing::debug!(node = %me, peer_addr = addr, "refused a duplicate connection (the peer takes ours): {detail}");
                return;
            }
            _ if is_duplicate(e) => {
                tracing::debug!(node = %me, peer_addr = addr, "the peer keeps its own connection to us");
                return;
            }
            _ => {}
        }
        self.counters.bump(
            &self.counters.handshake_failures,
            "shardik_remote_handshake_failures_total",
        );
        // Anyone who can reach the port can fail handshakes: of each kind of failure the
        // first ten and every thousandth are logged (all are counted and published as
        // events), so a flood of one kind neither fills the log nor hides another kind.
        let kind = match e {
            HandshakeError::Refused { reason, .. }
            | HandshakeError::RefusedByPeer { reason, .. } => reason.as_str(),
            HandshakeError::Tls(_) => "tls",
            HandshakeError::Timeout => "timeout",
            _ => "other",
        };
        let log = {
            let mut seen = self.handshake_failure_kinds.lock();
            let count = seen.entry(kind).or_insert(0);
            *count += 1;
            should_log(*count)
        };
        match e {
            _ if !log => {}
            HandshakeError::Refused { reason, detail } => tracing::error!(
                node = %me,
                peer_addr = addr,
                reason = reason.as_str(),
                "refused a peer in the handshake: {detail}"
            ),
            HandshakeError::RefusedByPeer { reason, detail } => tracing::error!(
                node = %me,
                peer_addr = addr,
                reason = reason.as_str(),
                "the peer refused us in the handshake: {detail}"
            ),
            HandshakeError::Tls(e) => tracing::error!(
                node = %me,
                peer_addr = addr,
                "TLS handshake failed, connection refused: {e}"
            ),
            other => {
                // May quote what the peer sent (a malformed frame's decoding error).
                let other = shown(&other.to_string());
                tracing::warn!(node = %me, peer_addr = addr, "handshake failed: {other}")
            }
        }
        let error = match e {
            // Their details are made of checked parts and clipped peer strings.
            HandshakeError::Refused { .. } | HandshakeError::RefusedByPeer { .. } => e.to_string(),
            other => shown(&other.to_string()),
        };
        self.event(RemoteEvent::HandshakeFailed {
            addr: addr.to_string(),
            reason: e.reason(),
            by_us: matches!(e, HandshakeError::Refused { .. }),
            error,
        });
    }

    /// Dials `peer` for its `lane` connection, runs the handshake and starts the
    /// connection's tasks.
    pub(crate) async fn dial_once(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        lane: Lane,
    ) -> Result<NodeIdentity, RemoteError> {
        // One deadline for the whole handshake: TCP connect, TLS, then the protocol.
        let deadline = tokio::time::Instant::now() + self.cfg.handshake_timeout;
        let connect = connect_tcp(&peer.addr, self.cfg.socket_buffer);
        let stream = match tokio::time::timeout_at(deadline, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => {
                return Err(RemoteError::Connect {
                    addr: peer.addr.to_string(),
                    source,
                })
            }
            Err(_) => {
                return Err(RemoteError::Connect {
                    addr: peer.addr.to_string(),
                    source: std::io::ErrorKind::TimedOut.into(),
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let (local_sa, remote_sa) = match (stream.local_addr(), stream.peer_addr()) {
            (Ok(l), Ok(r)) => (l, r),
            (Err(source), _) | (_, Err(source)) => {
                return Err(RemoteError::Connect {
                    addr: peer.addr.to_string(),
                    source,
                })
            }
        };
        match &self.cfg.tls {
            None => {
                let (r, w) = stream.into_split();
                self.outbound_on(peer, lane, r, w, (local_sa, remote_sa), deadline)
                    .await
            }
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
                let connecting = connector.connect(tls.server_name.clone(), stream);
                let tls_stream = match tokio::time::timeout_at(deadline, connecting).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let e = HandshakeError::Tls(e.to_string());
                        self.handshake_failed(&peer.addr, &e);
                        return Err(e.into());
                    }
                    Err(_) => {
                        let e = HandshakeError::Timeout;
                        self.handshake_failed(&peer.addr, &e);
                        return Err(e.into());
                    }
                };
                let (r, w) = tokio::io::split(tls_stream);
                self.outbound_on(peer, lane, r, w, (local_sa, remote_sa), deadline)
                    .await
            }
        }
    }

    /// The protocol handshake over an established (plain or TLS) stream, as the dialer.
    async fn outbound_on<R, W>(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        lane: Lane,
        r: R,
        mut w: W,
        (local_sa, remote_sa): (std::net::SocketAddr, std::net::SocketAddr),
        deadline: tokio::time::Instant,
    ) -> Result<NodeIdentity, RemoteError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let handshake_limit = HANDSHAKE_MAX_FRAME_LEN.min(self.cfg.max_frame_len);
        let mut reader = FramedRead::new(r, BodyCodec::new(handshake_limit));
        let remote =
            match handshake::connect(&mut reader, &mut w, &self.local, lane, deadline).await {
                Ok(remote) => {
                    reader
                        .decoder_mut()
                        .set_max_frame_len(self.cfg.max_frame_len);
                    remote
                }
                Err(e) => {
                    let e = tls_alert(e);
                    self.handshake_failed(&peer.addr, &e);
                    return Err(e.into());
                }
            };
        if *remote.addr != *peer.addr {
            tracing::warn!(
                dialed = %peer.addr,
                advertised = %remote.addr,
                "peer advertises another address than the one dialed"
            );
        }
        let info = ConnectionInfo {
            local: local_sa,
            remote: remote_sa,
            peer: remote.clone(),
            outbound: true,
            lane,
        };
        let (id, slot, cancel, stopped) = self.conn_slot(info.clone());
        let mut installed = peer.install(slot);
        let predecessors = std::mem::take(&mut installed.predecessors);
        self.connection_up(peer, &info, installed);
        let conn = Conn {
            peer: peer.clone(),
            lane,
            id,
            remote: remote.clone(),
            cancel,
            stopped,
            predecessors,
        };
        self.tasks
            .spawn(run_connection(self.clone(), conn, reader, w));
        Ok(remote)
    }

    async fn inbound(self: Arc<Self>, stream: TcpStream) {
        // One deadline for the whole handshake: TLS, then the protocol.
        let deadline = tokio::time::Instant::now() + self.cfg.handshake_timeout;
        let (local_sa, remote_sa) = match (stream.local_addr(), stream.peer_addr()) {
            (Ok(l), Ok(r)) => (l, r),
            _ => return,
        };
        let permit = match self.handshake_slots.try_take(remote_sa.ip()) {
            Ok(slot) => slot,
            Err(refused) => {
                if let Some(n) = self.counters.bump_to_log(
                    &self.counters.handshakes_refused_busy,
                    "shardik_remote_handshakes_refused_busy_total",
                ) {
                    tracing::warn!(
                        node = %self.local.me.node_id,
                        source = %remote_sa.ip(),
                        total = n,
                        "{}; closing a new connection",
                        match refused {
                            Refused::Node => format!("{MAX_PENDING} connections are in their handshake"),
                            Refused::Source => format!(
                                "{MAX_PENDING_PER_SOURCE} connections from {} are in their handshake",
                                remote_sa.ip()
                            ),
                        }
                    );
                }
                return;
            }
        };
        let _ = stream.set_nodelay(true);
        match self.cfg.tls.clone() {
            None => {
                let (r, w) = stream.into_split();
                self.inbound_on(permit, r, w, (local_sa, remote_sa), deadline)
                    .await
            }
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
                let accepting = acceptor.accept(stream);
                let tls_stream = match tokio::time::timeout_at(deadline, accepting).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let e = HandshakeError::Tls(e.to_string());
                        self.handshake_failed(&remote_sa.to_string(), &e);
                        return;
                    }
                    Err(_) => {
                        self.handshake_failed(&remote_sa.to_string(), &HandshakeError::Timeout);
                        return;
                    }
                };
                let (r, w) = tokio::io::split(tls_stream);
                self.inbound_on(permit, r, w, (local_sa, remote_sa), deadline)
                    .await
            }
        }
    }

    /// The protocol handshake over an accepted (plain or TLS) stream.
    async fn inbound_on<R, W>(
        self: Arc<Self>,
        permit: HandshakeSlot,
        r: R,
        mut w: W,
        (local_sa, remote_sa): (std::net::SocketAddr, std::net::SocketAddr),
        deadline: tokio::time::Instant,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let handshake_limit = HANDSHAKE_MAX_FRAME_LEN.min(self.cfg.max_frame_len);
        let mut reader = FramedRead::new(r, BodyCodec::new(handshake_limit));
        let mut admitted = None;
        let res = handshake::accept(
            &mut reader,
            &mut w,
            &self.local,
            deadline,
            |remote, lane| {
                let peer = self.peer(&remote.addr);
                let info = ConnectionInfo {
                    local: local_sa,
                    remote: remote_sa,
                    peer: remote.clone(),
                    outbound: false,
                    lane,
                };
                let (id, slot, cancel, stopped) = self.conn_slot(info.clone());
                let installed = peer.admit_inbound(&self.local.me, slot)?;
                admitted = Some((peer, id, (cancel, stopped), info, installed));
                Ok(())
            },
        )
        .await;
        drop(permit);
        match res {
            Ok((remote, lane)) => {
                reader
                    .decoder_mut()
                    .set_max_frame_len(self.cfg.max_frame_len);
                let (peer, id, (cancel, stopped), info, mut installed) =
                    admitted.expect("admitted before accept");
                let predecessors = std::mem::take(&mut installed.predecessors);
                self.connection_up(&peer, &info, installed);
                let conn = Conn {
                    peer,
                    lane,
                    id,
                    remote,
                    cancel,
                    stopped,
                    predecessors,
                };
                run_connection(self.clone(), conn, reader, w).await;
            }
            Err(e) => {
                if let Some((peer, id, (cancel, _stopped), info, installed)) = admitted {
                    cancel.cancel();
                    // Never reported as connected, so not as disconnected either; but what
                    // it replaced is gone, and a restart it detected is not detected again.
                    let last = peer.connection_ended(info.lane, id) == Some(true);
                    let replaced_any = !installed.replaced.is_empty();
                    self.install_effects(&peer, &info.peer, installed);
                    if last && replaced_any {
                        // What it replaced was up; now nothing is.
                        self.event(RemoteEvent::Disconnected {
                            addr: peer.addr.to_string(),
                        });
                    }
                }
                self.handshake_failed(&remote_sa.to_string(), &e);
            }
        }
    }

    /// Delivers a received message to the registered actor.
    fn dispatch(self: &Arc<Self>, peer: &Peer, env: Envelope, lookups: &mut LookupCache) {
        let fail = |failure: ReplyFailure, reason: String| {
            if !env.reply_ids.is_empty() {
                peer.send_reply(Frame::ReplyFailed {
                    ids: env.reply_ids.clone(),
                    failure,
                    reason,
                });
            }
        };
        let Some(decoder) = self.registry.get_cached(&env.recipient, lookups) else {
            if let Some(n) = self.counters.bump_to_log(
                &self.counters.unknown_recipient,
                "shardik_remote_unknown_recipient_total",
            ) {
                tracing::error!(
                    node = %self.local.me.node_id,
                    from = %peer.addr,
                    recipient = %shown(&env.recipient),
                    message_type = %shown(&env.type_tag),
                    total = n,
                    "message for an unknown recipient dropped"
                );
            }
            // The path is the sender's input and may be long: the answer quotes its start
            // only (escaped), so a failure costs less to send back than the request did.
            fail(
                ReplyFailure::UnknownRecipient,
                format!(
                    "no actor is registered at {} on {}",
                    shown(&env.recipient),
                    self.addr
                ),
            );
            return;
        };
        // A panicking `Deserialize` (or decoder) costs this message only: the reader task
        // that runs it must go on reading the connection. The contexts set around the call
        // are restored by their guards while the panic unwinds.
        let res = replies::dispatching(|| {
            crate::remote_ref::decoding_on(self, || {
                with_wire_context(&peer.wire, || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decoder(&env.payload)))
                        .unwrap_or_else(|panic| Err(DecodeError::Panicked(panic_message(&*panic))))
                })
            })
        });
        match res {
            Ok(()) => {
                self.counters
                    .messages_delivered
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e @ (DecodeError::Payload { .. } | DecodeError::Panicked(_))) => {
                let n = self.counters.bump(
                    &self.counters.decode_errors,
                    "shardik_remote_decode_errors_total",
                );
                // A decoding error may quote what the peer sent (serde's "unknown variant
                // `…`" quotes it whole): escaped and bounded, in the log and in the answer.
                let why = shown_max(&e.to_string(), MAX_FAILURE_REASON);
                if should_log(n) {
                    tracing::error!(
                        node = %self.local.me.node_id,
                        from = %peer.addr,
                        recipient = %shown(&env.recipient),
                        sent_type = %shown(&env.type_tag),
                        total = n,
                        "message dropped: {why}"
                    );
                }
                fail(ReplyFailure::Undecodable, why);
            }
            Err(e @ DecodeError::Refused(_)) => {
                self.counters.bump(
                    &self.counters.recipient_refused,
                    "shardik_remote_recipient_refused_total",
                );
                // A decoder registered by hand says what it likes.
                fail(
                    ReplyFailure::RecipientRefused,
                    shown_max(&e.to_string(), MAX_FAILURE_REASON),
                );
            }
        }
    }

    /// Handles one frame that arrived on the `lane` connection of `peer` from `remote` (the
    /// identity it proved in the handshake). `lookups` is the connection's recipient lookup
    /// cache. False ends the connection.
    pub(crate) fn handle_frame(
        self: &Arc<Self>,
        peer: &Peer,
        lane: Lane,
        remote: &NodeIdentity,
        frame: Frame,
        lookups: &mut LookupCache,
    ) -> bool {
        if let Some(f) = &self.cfg.faults {
            if f.is_cut(&remote.node_id, &self.local.me.node_id) {
                self.counters.fault_dropped.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        // A slot takes answers from the peer its request went to only. That peer is known by
        // the address it was reached at, which need not be the address the answer came from
        // (a peer dialed under another name than the one it advertises, answering over a
        // connection it made itself): then the identity last seen there decides.
        let same_node = |key: &str| {
            self.existing_peer(key)
                .and_then(|p| p.identity())
                .is_some_and(|id| id == *remote)
        };
        let from = AnswerFrom {
            key: &peer.addr,
            same_node: &same_node,
        };
        match frame {
            Frame::Message(env) => self.dispatch(peer, env, lookups),
            Frame::Reply { id, payload } => match self.replies.complete(id, &payload, &from) {
                Ok(Answered::Delivered) => {}
                Ok(Answered::Unknown) => {
                    self.counters
                        .replies_unmatched
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(from = %peer.addr, id, "reply for an unknown slot (late after a timeout?) dropped");
                }
                Ok(Answered::NotFromItsPeer) => {
                    self.counters
                        .replies_unmatched
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(from = %peer.addr, peer = %remote.node_id, id, "reply for a slot that waits on another node dropped");
                }
                Err(e) => {
                    if let Some(n) = self.counters.bump_to_log(
                        &self.counters.reply_decode_errors,
                        "shardik_remote_reply_decode_errors_total",
                    ) {
                        // May quote what the peer sent.
                        let e = shown_max(&e, MAX_FAILURE_REASON);
                        tracing::error!(from = %peer.addr, id, total = n, "reply dropped: {e}");
                    }
                }
            },
            Frame::ReplyFailed {
                ids,
                failure,
                reason,
            } => {
                // The peer's text goes into the asker's error: bounded, control characters
                // escaped.
                let reason = shown_max(&reason, MAX_FAILURE_REASON);
                let foreign = self.replies.fail_from(&ids, &from, failure, &reason);
                if foreign > 0 {
                    self.counters
                        .replies_unmatched
                        .fetch_add(foreign as u64, Ordering::Relaxed);
                    tracing::debug!(from = %peer.addr, peer = %remote.node_id, slots = foreign, "reply failure for slots that wait on another node ignored");
                }
            }
            Frame::Heartbeat(n) => peer.send_heartbeat_ack(lane, n),
            Frame::HeartbeatAck(seq) => {
                let rtt = peer.heartbeat_acked(lane, seq);
                // The user connection's heartbeats only keep it from idling out; only the
                // control connection's round trips are reported.
                if let Some(rtt) = rtt.filter(|_| lane == Lane::Control) {
                    let us = rtt.as_micros().min(u64::MAX as u128) as u64;
                    let c = &self.counters;
                    c.heartbeats_acked.fetch_add(1, Ordering::Relaxed);
                    c.heartbeat_rtt_max_us.fetch_max(us, Ordering::Relaxed);
                    c.heartbeat_rtt_last_us.store(us, Ordering::Relaxed);
                    c.heartbeat_rtt(rtt);
                }
            }
            Frame::Hello(_)
            | Frame::Challenge(_)
            | Frame::Response(_)
            | Frame::Accept(_)
            | Frame::Reject(_) => {
                let n = self.counters.bump(
                    &self.counters.connections_rejected,
                    "shardik_remote_connections_rejected_total",
                );
                // A peer can do this at will (and reconnect): rate-limited.
                if should_log(n) {
                    tracing::error!(from = %peer.addr, total = n, "handshake frame on an established connection; closing it");
                }
                return false;
            }
        }
        true
    }
}

/// Connects, with the configured kernel buffer sizes if any.
async fn connect_tcp(addr: &str, buffer: Option<u32>) -> std::io::Result<TcpStream> {
    let Some(size) = buffer else {
        return TcpStream::connect(addr).await;
    };
    let mut last = None;
    for sa in tokio::net::lookup_host(addr).await? {
        let socket = if sa.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_send_buffer_size(size)?;
        socket.set_recv_buffer_size(size)?;
        match socket.connect(sa).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrNotAvailable.into()))
}

async fn sleep_or_shutdown(node: &Node, d: Duration) -> bool {
    tokio::select! {
        _ = node.shutdown.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// True if `e` is the refusal of a duplicate connection: with simultaneous connects on a
/// lane, the lower node refuses the other's connection and keeps its own (which the other
/// takes). Either side sees it only after the other proved itself (see
/// [`handshake::connect`]).
pub(crate) fn is_duplicate(e: &HandshakeError) -> bool {
    e.reason() == Some(RejectReason::Duplicate)
}

/// Keeps one lane of a peer connected while it has something to send (or while this node
/// holds the outbound connection of the other lane): dials, and on failure retries after an
/// exponentially growing delay (`backoff_min` doubling up to `backoff_max`).
///
/// A dial the peer refuses as a duplicate (it dialed us at the same time and keeps its own
/// connection) is not a failure: it is not counted and does not grow the backoff. The
/// dialer looks again after a wait of its own (also `backoff_min` doubling up to
/// `backoff_max`); in a routine tie-break the peer's connection is installed within
/// milliseconds, so by then the lane is connected and this loop rests (which ends any run of
/// failures). A refused dial that still leaves the lane unconnected after that wait does
/// count toward `give_up_message_after`, as a failed one does: a peer dialed under another
/// address than the one it advertises (an alias: `localhost` for `127.0.0.1`, another DNS
/// name) that holds a connection to this node refuses every dial under the alias as a
/// duplicate, while the connection it keeps is known here under its advertised address.
/// Without the clock such a lane would be dialed forever and its frames never given up.
/// [`DUPLICATES_BEFORE_WARNING`] refusals in a row with no connection are logged once.
async fn dial_loop(node: Arc<Node>, peer: Arc<Peer>, lane: Lane) {
    let mut backoff = node.cfg.backoff_min;
    let mut duplicate_wait = node.cfg.backoff_min;
    // Dials refused as duplicates since the lane was last connected.
    let mut duplicates = 0u64;
    // The last dial was refused as a duplicate (the peer answered: it is reachable).
    let mut refused_last = false;
    let mut failures = 0u64;
    // When the dials of the current run of failures began (dials refused as duplicates that
    // left the lane unconnected included).
    let mut failing_since: Option<tokio::time::Instant> = None;
    // Cancelled at shutdown, or when the node forgets this peer.
    let retired = peer.retired.clone();
    loop {
        loop {
            let woken = peer.link(lane).wake.notified();
            if retired.is_cancelled() {
                return;
            }
            if peer.try_start_dial(lane) {
                break;
            }
            // Connected another way (the peer dialed in, an explicit connect), or nothing to
            // send: a run of failures has ended, and the next failure starts a new one.
            failing_since = None;
            duplicate_wait = node.cfg.backoff_min;
            if peer.link(lane).is_connected() {
                duplicates = 0;
            }
            tokio::select! {
                _ = retired.cancelled() => return,
                _ = woken => {}
            }
        }
        let dialed_at = tokio::time::Instant::now();
        let res = tokio::select! {
            _ = retired.cancelled() => { peer.end_dial(lane); return }
            r = node.dial_once(&peer, lane) => r,
        };
        peer.end_dial(lane);
        match res {
            Ok(_) => {
                backoff = node.cfg.backoff_min;
                duplicate_wait = node.cfg.backoff_min;
                duplicates = 0;
                failures = 0;
                failing_since = None;
                refused_last = false;
            }
            Err(RemoteError::Handshake(e)) if is_duplicate(&e) => {
                duplicates += 1;
                if !refused_last {
                    // The peer answered this dial: failures before it (an outage) end here,
                    // and a run of refusals starts afresh, so a tie-break right after an
                    // outage does not give up what waits at once.
                    failing_since = Some(dialed_at);
                    refused_last = true;
                }
                if duplicates == DUPLICATES_BEFORE_WARNING {
                    tracing::warn!(
                        node = %node.local.me.node_id,
                        peer_addr = %peer.addr,
                        lane = lane.as_str(),
                        refusals = duplicates,
                        "the peer keeps refusing our connection as a duplicate while no \
                         connection to it is up under this address: it is likely dialed under \
                         another address than the one it advertises (its frames are given up \
                         after give_up_message_after): {e}"
                    );
                }
                tokio::select! {
                    _ = retired.cancelled() => return,
                    _ = tokio::time::sleep(duplicate_wait) => {}
                }
                duplicate_wait = (duplicate_wait * 2).min(node.cfg.backoff_max);
                // In a tie-break the peer's connection is up by now (and the loop rests);
                // if it is not, the refused dial counts toward giving up.
                if !peer.link(lane).is_connected() {
                    node.dial_run_goes_on(&peer, lane, &mut failing_since, dialed_at);
                }
            }
            Err(e) => {
                failures += 1;
                refused_last = false;
                node.counters.bump(
                    &node.counters.dial_failures,
                    "shardik_remote_dial_failures_total",
                );
                node.dial_run_goes_on(&peer, lane, &mut failing_since, dialed_at);
                if matches!(e, RemoteError::Connect { .. }) && should_log(failures) {
                    tracing::warn!(
                        node = %node.local.me.node_id,
                        peer_addr = %peer.addr,
                        lane = lane.as_str(),
                        attempt = failures,
                        retry_in = ?backoff,
                        "cannot reach peer: {e}"
                    );
                }
                // The other lane connecting means the peer is back: retry at once.
                tokio::select! {
                    _ = retired.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                    _ = peer.link(lane).other_up.notified() => {}
                }
                backoff = (backoff * 2).min(node.cfg.backoff_max);
            }
        }
    }
}

/// How many dials of a lane refused as duplicates in a row, with no connection on the lane
/// in between, are logged (once) as a likely alias.
const DUPLICATES_BEFORE_WARNING: u64 = 5;

impl Node {
    /// A dial of `lane` toward `peer` begun at `dialed_at` left the lane unconnected (it
    /// failed, or the peer refused it as a duplicate and no connection came): it extends the
    /// current run of such dials, or begins one, and once the run has lasted
    /// `give_up_message_after` the frames waiting in the lane's queue are given up. Frames
    /// queued after that get a full period again: the run ends.
    fn dial_run_goes_on(
        &self,
        peer: &Peer,
        lane: Lane,
        failing_since: &mut Option<tokio::time::Instant>,
        dialed_at: tokio::time::Instant,
    ) {
        let since = *failing_since.get_or_insert(dialed_at);
        if since.elapsed() >= self.cfg.give_up_message_after {
            self.give_up_queued(peer, lane, since.elapsed());
            *failing_since = None;
        }
    }

    /// Drops what waits in `lane`'s queue toward `peer`, unreachable for `unreachable`: the
    /// frames are counted, asks among them fail as undeliverable (their requests never left),
    /// and the lane's dialer, with nothing to send, stops until something new is queued.
    fn give_up_queued(&self, peer: &Peer, lane: Lane, unreachable: std::time::Duration) {
        let (frames, asks) = peer.link(lane).queue.drop_waiting();
        if frames == 0 {
            return;
        }
        self.counters.add(
            &self.counters.dropped_unreachable,
            "shardik_remote_dropped_unreachable_total",
            frames as u64,
        );
        tracing::warn!(
            node = %self.local.me.node_id,
            peer_addr = %peer.addr,
            lane = lane.as_str(),
            frames,
            asks = asks.len(),
            ?unreachable,
            "peer unreachable for give_up_message_after: dropped the frames waiting for it"
        );
        self.replies.fail(
            &asks,
            ReplyFailure::Undeliverable,
            "the peer stayed unreachable for give_up_message_after; the request was dropped unsent",
        );
    }
}

/// Accepts connections until shutdown. A failed accept is counted in `accept_errors` and
/// logged at most once per [`ACCEPT_ERROR_LOG_EVERY`] (with the number of failures not logged
/// since); the loop then waits a little ([`accept_backoff`]) and goes on listening.
pub(crate) async fn accept_loop(node: Arc<Node>, listener: TcpListener) {
    let mut log = AcceptErrorLog::default();
    loop {
        let res = tokio::select! {
            _ = node.shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        match res {
            Ok((stream, _)) => {
                let stop = node.shutdown.clone();
                let work = node.clone().inbound(stream);
                // Shutdown also ends connections still in their handshake.
                node.tasks.spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = work => {}
                    }
                });
            }
            Err(e) => {
                node.counters.bump(
                    &node.counters.accept_errors,
                    "shardik_remote_accept_errors_total",
                );
                let wait = accept_backoff(&e);
                if let Some(suppressed) = log.failed(tokio::time::Instant::now()) {
                    tracing::warn!(
                        node = %node.local.me.node_id,
                        not_logged_since = suppressed,
                        retry_in = ?wait,
                        "accept failed: {e}"
                    );
                }
                if !wait.is_zero() && !sleep_or_shutdown(&node, wait).await {
                    return;
                }
            }
        }
    }
}

/// Accept failures are logged at most once per this period (all are counted).
const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// Rate limit of the accept loop's warnings: the first failure is logged, then at most one
/// per [`ACCEPT_ERROR_LOG_EVERY`], which reports how many were not logged since the last.
#[derive(Default)]
struct AcceptErrorLog {
    last: Option<tokio::time::Instant>,
    suppressed: u64,
}

impl AcceptErrorLog {
    /// A failure at `now`: `Some(failures not logged since the last logged one)` if this one
    /// is to be logged.
    fn failed(&mut self, now: tokio::time::Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < ACCEPT_ERROR_LOG_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// How long the accept loop waits after a failed accept. None after a connection that was
/// aborted or reset before it was accepted: that concerns only the one connection. A
/// second when the process or system is out of file descriptors (`EMFILE`, `ENFILE`) or
/// memory: accepting again at once would fail the same way until connections close (tokio
/// and hyper wait as long). 10 ms after anything else.
fn accept_backoff(e: &std::io::Error) -> Duration {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ConnectionAborted
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionRefused => Duration::ZERO,
        ErrorKind::OutOfMemory => Duration::from_secs(1),
        _ if is_out_of_descriptors(e) => Duration::from_secs(1),
        _ => Duration::from_millis(10),
    }
}

/// `EMFILE` or `ENFILE` (the same numbers on Linux, the BSDs and macOS; `WSAEMFILE` on
/// Windows), which `std::io::ErrorKind` does not name.
fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    const CODES: &[i32] = &[23, 24];
    #[cfg(windows)]
    const CODES: &[i32] = &[10024];
    #[cfg(not(any(unix, windows)))]
    const CODES: &[i32] = &[];
    e.raw_os_error().is_some_and(|c| CODES.contains(&c))
}

/// Forgets reply slots that waited longer than `max_reply_wait`, and idle peers.
pub(crate) async fn reply_sweeper(
    node: Weak<Node>,
    every: Duration,
    max_age: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(node) = node.upgrade() else { return };
        let n = node.replies.sweep(max_age);
        if n > 0 {
            tracing::debug!(forgotten = n, "reply slots expired without an answer");
        }
        node.forget_idle_peers();
    }
}

/// The TLS failure inside `e`, if that is what it is. With TLS 1.3 the dialer's TLS
/// handshake is over before the acceptor has checked the dialer's certificate, so an
/// acceptor that refuses the certificate is heard of only in the first read of the protocol
/// handshake, as an I/O error carrying the TLS alert: reported as the TLS failure it is.
fn tls_alert(e: HandshakeError) -> HandshakeError {
    // A plain node that dialed a TLS node reads the TLS alert's record header (content type
    // 21 or 22, version 3.x) where it expects a frame length.
    if let HandshakeError::Frame(crate::error::FrameError::TooLarge { len, .. }) = &e {
        let [kind, major, ..] = (*len as u32).to_be_bytes();
        if matches!(kind, 0x15 | 0x16) && major == 0x03 {
            return HandshakeError::Tls(
                "the peer answered with TLS: this node has no TLS configured (RemoteConfig::tls)"
                    .into(),
            );
        }
    }
    if let HandshakeError::Frame(crate::error::FrameError::Io(io)) = &e {
        if let Some(tls) = io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<tokio_rustls::rustls::Error>())
        {
            return HandshakeError::Tls(format!("the peer ended the TLS session: {tls}"));
        }
    }
    e
}

/// An established connection: which peer and lane, its id there, who is on the other end,
/// and the token that ends its tasks.
struct Conn {
    peer: Arc<Peer>,
    lane: Lane,
    id: u64,
    remote: NodeIdentity,
    cancel: CancellationToken,
    /// Tells a connection that replaces this one that its reader has stopped, when dropped.
    stopped: DropGuard,
    /// The connections this one replaced, whose readers must have stopped before this one
    /// handles anything (see [`Installed::predecessors`](crate::peer::Installed)).
    predecessors: Vec<Predecessor>,
}

/// Runs an established connection: a writer task, a heartbeat task, and the reader here.
async fn run_connection<R, W>(
    node: Arc<Node>,
    conn: Conn,
    mut reader: FramedRead<R, BodyCodec>,
    writer: W,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Conn {
        peer,
        lane,
        id,
        remote,
        cancel,
        stopped,
        predecessors,
    } = conn;
    // Dropped last, when the reader has stopped handling frames (after `_end`, below).
    let _stopped = stopped;
    // Ends the connection when the reader stops, however it stops: a panic in this task
    // (a bug) must not leave the writer and heartbeat tasks running and the lane looking
    // connected, with nothing read from it again.
    let _end = ConnEnd {
        node: node.clone(),
        peer: peer.clone(),
        lane,
        id,
        cancel: cancel.clone(),
    };
    node.tasks.spawn(write_loop(
        node.clone(),
        peer.clone(),
        (lane, id),
        writer,
        remote.node_id.clone(),
        cancel.clone(),
    ));
    node.tasks.spawn(heartbeat_loop(
        node.cfg.heartbeat_interval,
        peer.clone(),
        lane,
        cancel.clone(),
    ));
    // The connections this one replaced may still be handling frames they had read (up to
    // a burst, before they look at their cancellation): what the peer sent on them came
    // before what it sends on this one, so this reader waits until they have stopped.
    // (Before, both ran at once, and a later message could overtake earlier ones.)
    if !wait_for_predecessors(&node, &peer, lane, id, &remote, &cancel, &predecessors).await {
        return;
    }
    let idle = node.cfg.idle_timeout;
    let mut delayer: Option<Delayer> = None;
    let mut headers = HeaderCache::default();
    let mut lookups = LookupCache::default();
    // One idle timer for the connection, re-armed from the time of the last frame only when
    // it fires, and one cancellation future: nothing per frame.
    let idle_timer = tokio::time::sleep(idle);
    tokio::pin!(idle_timer);
    let cancelled = cancel.cancelled();
    tokio::pin!(cancelled);
    let mut last_frame = tokio::time::Instant::now();
    'connection: loop {
        let mut next = tokio::select! {
            biased;
            _ = &mut cancelled => break,
            _ = &mut idle_timer => {
                let due = last_frame + idle;
                if due > tokio::time::Instant::now() {
                    idle_timer.as_mut().reset(due);
                    continue;
                }
                tracing::warn!(peer = %remote.node_id, peer_addr = %peer.addr, lane = lane.as_str(), ?idle, "nothing received within the idle timeout; closing the connection");
                break;
            }
            r = reader.next() => r,
        };
        last_frame = tokio::time::Instant::now();
        // Frames already read and buffered are handled without going back to the select,
        // up to a budget, so that cancellation and the idle timer are still looked at.
        let mut budget = READ_BURST;
        loop {
            let body = match next {
                None => {
                    tracing::debug!(peer = %remote.node_id, lane = lane.as_str(), "connection closed by the peer");
                    break 'connection;
                }
                Some(Err(e)) => {
                    if !matches!(e, crate::error::FrameError::Io(_)) {
                        let n = node.counters.bump(
                            &node.counters.connections_rejected,
                            "shardik_remote_connections_rejected_total",
                        );
                        // A peer can do this at will (and reconnect): rate-limited.
                        if should_log(n) {
                            let e = shown(&e.to_string());
                            tracing::error!(peer = %remote.node_id, peer_addr = %peer.addr, lane = lane.as_str(), total = n, "closing the connection: {e}");
                        }
                        node.event(RemoteEvent::ConnectionRejected {
                            addr: peer.addr.to_string(),
                            error: e.to_string(),
                        });
                    } else {
                        tracing::debug!(peer = %remote.node_id, lane = lane.as_str(), "connection failed: {e}");
                    }
                    break 'connection;
                }
                Some(Ok(body)) => body,
            };
            match Frame::decode_body_with(body, &mut headers) {
                Ok(frame) => {
                    // Fault injection: a delayed link or a held lane, or frames still held
                    // from one.
                    let (delay, hold) = node.cfg.faults.as_ref().map_or((None, false), |f| {
                        let (from, to) = (&remote.node_id, &node.local.me.node_id);
                        (f.delay_of(from, to), f.is_held(from, to, lane))
                    });
                    let held = delayer
                        .as_ref()
                        .is_some_and(|d| d.pending.load(Ordering::Acquire) > 0);
                    if delay.is_some() || hold || held {
                        let d = delayer.get_or_insert_with(|| {
                            Delayer::start(&node, &peer, lane, &remote, &cancel)
                        });
                        d.pending.fetch_add(1, Ordering::AcqRel);
                        if delay.is_some() {
                            node.counters.fault_delayed.fetch_add(1, Ordering::Relaxed);
                        }
                        let due = tokio::time::Instant::now() + delay.unwrap_or_default();
                        let _ = d.tx.send((due, frame));
                    } else if !node.handle_frame(&peer, lane, &remote, frame, &mut lookups) {
                        break 'connection;
                    }
                }
                Err(e) => {
                    if let Some(n) = node.counters.bump_to_log(
                        &node.counters.malformed_frames,
                        "shardik_remote_malformed_frames_total",
                    ) {
                        // May quote what the peer sent (an unknown variant's name).
                        let e = shown_max(&e.to_string(), MAX_FAILURE_REASON);
                        tracing::error!(peer = %remote.node_id, total = n, "skipping a frame that does not parse: {e}");
                    }
                }
            }
            budget -= 1;
            if budget == 0 {
                break;
            }
            // Buffered frames are parsed without touching the socket, so without this a busy
            // reader would handle thousands of them per turn and hold its worker thread for
            // tens of milliseconds, in front of the control connection's tasks. It yields
            // after each coop budget (128 units) instead.
            tokio::task::coop::consume_budget().await;
            match reader.next().now_or_never() {
                Some(n) => next = n,
                None => break,
            }
        }
    }
}

/// Waits until the readers of `predecessors` have stopped, each at most until its deadline
/// (a reader held longer, by a decoder that blocks, is given up with a rate-limited warning:
/// order across that reconnect may break). False if connection `id` was cancelled meanwhile.
async fn wait_for_predecessors(
    node: &Node,
    peer: &Peer,
    lane: Lane,
    id: u64,
    remote: &NodeIdentity,
    cancel: &CancellationToken,
    predecessors: &[Predecessor],
) -> bool {
    let mut gave_up = Vec::new();
    for before in predecessors {
        #[cfg(test)]
        let _waiting = HandoverWait::new(node, id, before.id);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return false,
            _ = before.stopped.cancelled() => {}
            _ = tokio::time::sleep_until(before.deadline) => gave_up.push(before.id),
        }
    }
    if !gave_up.is_empty() {
        if let Some(n) = node.counters.bump_to_log(
            &node.counters.handover_timeouts,
            "shardik_remote_handover_timeouts_total",
        ) {
            tracing::warn!(
                peer = %remote.node_id,
                peer_addr = %peer.addr,
                lane = lane.as_str(),
                connection = id,
                replaced = ?gave_up,
                total = n,
                "the reader of a replaced connection is still busy after idle_timeout (a decoder that blocks?); the new connection reads now: messages sent across this reconnect may be handled out of order"
            );
        }
    }
    true
}

/// Tests: the wait of a reader for a replaced one's, on [`Node::handover_waits`] while it lasts.
#[cfg(test)]
struct HandoverWait<'a>(&'a Node, (u64, u64));

#[cfg(test)]
impl<'a> HandoverWait<'a> {
    fn new(node: &'a Node, id: u64, before: u64) -> Self {
        node.handover_waits.send_modify(|w| w.push((id, before)));
        HandoverWait(node, (id, before))
    }
}

#[cfg(test)]
impl Drop for HandoverWait<'_> {
    fn drop(&mut self) {
        let wait = self.1;
        self.0.handover_waits.send_modify(|w| {
            if let Some(i) = w.iter().position(|&e| e == wait) {
                w.remove(i);
            }
        });
    }
}

/// Ends an established connection when dropped: cancels its tasks and takes it off its peer.
struct ConnEnd {
    node: Arc<Node>,
    peer: Arc<Peer>,
    lane: Lane,
    id: u64,
    cancel: CancellationToken,
}

impl Drop for ConnEnd {
    fn drop(&mut self) {
        let ConnEnd {
            node,
            peer,
            lane,
            id,
            cancel,
        } = self;
        cancel.cancel();
        if let Some(last) = peer.connection_ended(*lane, *id) {
            node.open_connections(*lane, -1.0);
            node.event(RemoteEvent::ConnectionClosed {
                addr: peer.addr.to_string(),
                lane: *lane,
            });
            if last {
                node.event(RemoteEvent::Disconnected {
                    addr: peer.addr.to_string(),
                });
            }
        }
    }
}

/// Holds the frames of a delayed link or a held lane (fault injection) until they are due
/// and the lane is not held, and then handles them in arrival order, off the reader task so
/// that reading goes on.
struct Delayer {
    tx: mpsc::UnboundedSender<(tokio::time::Instant, Frame)>,
    /// Frames sent to the delayer and not handled yet.
    pending: Arc<AtomicUsize>,
}

impl Delayer {
    fn start(
        node: &Arc<Node>,
        peer: &Arc<Peer>,
        lane: Lane,
        remote: &NodeIdentity,
        cancel: &CancellationToken,
    ) -> Delayer {
        let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Frame)>();
        let pending = Arc::new(AtomicUsize::new(0));
        let (node2, peer, remote, cancel) =
            (node.clone(), peer.clone(), remote.clone(), cancel.clone());
        let left = pending.clone();
        let mut lookups = LookupCache::default();
        node.tasks.spawn(async move {
            loop {
                let (due, frame) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    next = rx.recv() => match next {
                        Some(x) => x,
                        None => return,
                    },
                };
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(due) => {}
                }
                if let Some(faults) = &node2.cfg.faults {
                    let me = &node2.local.me.node_id;
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = faults.until_released(&remote.node_id, me, lane) => {}
                    }
                }
                let keep = node2.handle_frame(&peer, lane, &remote, frame, &mut lookups);
                left.fetch_sub(1, Ordering::AcqRel);
                if !keep {
                    cancel.cancel();
                    return;
                }
            }
        });
        Delayer { tx, pending }
    }
}

/// Sends a heartbeat on the `lane` connection every `every`: on the control connection to
/// measure its round trip, on both so that neither idles out.
async fn heartbeat_loop(every: Duration, peer: Arc<Peer>, lane: Lane, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        seq += 1;
        peer.send_heartbeat(lane, seq);
    }
}

/// Returns `Pending` once, waking its own task first: the task goes to the back of its
/// worker's run queue, behind the tasks already runnable there. (`tokio::task::yield_now`
/// defers the wake-up until the worker next polls the I/O driver: a syscall.)
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut yielded, true) {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Why a segment was not written.
enum WriteFailed {
    /// A write or the flush made no progress for the stall limit.
    Stalled,
    /// The stream failed.
    Io(std::io::Error),
}

/// Writes `bytes` whole and flushes, failing as [`WriteFailed::Stalled`] if a write or the
/// flush makes no progress for `stall`: the peer has stopped reading. A slow peer that
/// reads a little at a time is not cut off.
async fn write_segment<W: AsyncWrite + Unpin>(
    writer: &mut W,
    mut bytes: &[u8],
    stall: Duration,
) -> Result<(), WriteFailed> {
    while !bytes.is_empty() {
        match tokio::time::timeout(stall, writer.write(bytes)).await {
            Err(_) => return Err(WriteFailed::Stalled),
            Ok(Ok(0)) => return Err(WriteFailed::Io(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(n)) => bytes = &bytes[n..],
            Ok(Err(e)) => return Err(WriteFailed::Io(e)),
        }
    }
    match tokio::time::timeout(stall, writer.flush()).await {
        Err(_) => Err(WriteFailed::Stalled),
        Ok(res) => res.map_err(WriteFailed::Io),
    }
}

/// Drains the `lane` queue of the peer: each segment of already encoded frames (up to
/// `write_batch_frames` user frames, or every queued control frame) is written whole and
/// flushed, and its buffer goes back to the queue for reuse. A write that makes no progress
/// for `write_stall_timeout` closes the connection.
async fn write_loop<W: AsyncWrite + Unpin>(
    node: Arc<Node>,
    peer: Arc<Peer>,
    (lane, conn_id): (Lane, u64),
    mut writer: W,
    remote_id: String,
    cancel: CancellationToken,
) {
    let queue = &peer.link(lane).queue;
    // A write that makes no progress for this long (the peer reads nothing, although it
    // may keep sending) closes the connection; the idle timeout only watches what arrives.
    let stall = node.cfg.write_stall_timeout;
    // Whether the last write carried more than one frame: traffic comes in bursts.
    let mut bursty = false;
    loop {
        // A write can take long (a peer that stopped reading); the connection may have been
        // cancelled or replaced meanwhile. Then the frames are the next connection's: the
        // queue hands them only to the writer of the connection it was assigned to.
        if cancel.is_cancelled() {
            break;
        }
        let Some(segment) = queue.take(conn_id) else {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = queue.ready.notified() => {}
            }
            // Woken by the first frame of what is likely a burst: let the tasks already
            // runnable on this worker (actors answering the rest of a burst of requests,
            // senders mid-loop) queue theirs first, so one syscall carries them all. Not
            // when frames come one at a time (sequential asks), where it would only add
            // latency: yielding can wake an idle worker.
            if bursty {
                yield_once().await;
            }
            continue;
        };
        bursty = segment.frames > 1;
        let cut = node
            .cfg
            .faults
            .as_ref()
            .is_some_and(|f| f.is_cut(&node.local.me.node_id, &remote_id));
        if cut {
            node.counters
                .fault_dropped
                .fetch_add(segment.frames as u64, Ordering::Relaxed);
            queue.recycle(segment.bytes);
            continue;
        }
        // Flushed after every write: a TLS stream accepts the tail of a write into its own
        // buffer when the socket would block and reports it written, and only a later write
        // or a flush sends it (without this, the end of a burst waited for the next frame,
        // a heartbeat away when traffic stops). On TCP the flush does nothing.
        let res = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            r = write_segment(&mut writer, &segment.bytes, stall) => r,
        };
        match res {
            Ok(()) => {}
            Err(WriteFailed::Stalled) => {
                if let Some(n) = node.counters.bump_to_log(
                    &node.counters.write_stalls,
                    "shardik_remote_write_stalls_total",
                ) {
                    tracing::warn!(
                        node = %node.local.me.node_id,
                        peer = %remote_id,
                        peer_addr = %peer.addr,
                        lane = lane.as_str(),
                        ?stall,
                        total = n,
                        "the peer has read nothing we wrote for write_stall_timeout; closing the connection"
                    );
                }
                cancel.cancel();
                break;
            }
            Err(WriteFailed::Io(e)) => {
                tracing::debug!(peer = %remote_id, "write failed: {e}");
                cancel.cancel();
                break;
            }
        }
        node.counters.write_batches.fetch_add(1, Ordering::Relaxed);
        node.counters
            .frames_written
            .fetch_add(segment.frames as u64, Ordering::Relaxed);
        queue.recycle(segment.bytes);
    }
    // A wake-up this writer consumed may belong to the next connection's writer.
    queue.ready.notify_one();
    // A polite close (TLS `close_notify`, TCP FIN), bounded: a peer that has stopped reading
    // would otherwise hold this task, its socket and `Remote::shutdown` for good.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.shutdown()).await;
}

#[cfg(test)]
mod tests;
