//! [`Remote`]: the remote layer of one actor system.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use shardik_actor::wire::PayloadFormat;
use shardik_actor::{ActorRef, ActorSystem};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::broadcast;

use crate::config::RemoteConfig;
use crate::error::RemoteError;
use crate::frame::{Lane, NodeIdentity, PROTOCOL_VERSION};
use crate::handshake::Local;
use crate::node::{accept_loop, is_duplicate, reply_sweeper, Node};
use crate::peer::{ConnectionInfo, Peer};
use crate::registry::{typed_decoder, Decoder};
use crate::remote_ref::RemoteRef;
use crate::stats::{RemoteEvent, RemoteStats};

/// The remote layer of an [`ActorSystem`]: a TCP listener, connections to other nodes,
/// actors registered under paths, and [`RemoteRef`]s to actors elsewhere.
///
/// Cloning is cheap and shares the node. It is also kept as an extension of its system
/// ([`Remote::get`]). It stops when the system shuts down, or with [`Remote::shutdown`].
#[derive(Clone)]
pub struct Remote {
    pub(crate) node: Arc<Node>,
}

struct Slot(OnceLock<Remote>);

impl Remote {
    /// Starts the remote layer of `system`: binds `config.bind` and starts accepting.
    ///
    /// Fails if the configuration is invalid, the address cannot be bound, or the system
    /// already has a remote layer.
    pub async fn start(system: &ActorSystem, config: RemoteConfig) -> Result<Remote, RemoteError> {
        config.validate().map_err(RemoteError::Config)?;
        let slot = system.extension(|_| Slot(OnceLock::new()));
        if slot.0.get().is_some() {
            return Err(RemoteError::Config(
                "this actor system already has a remote layer".into(),
            ));
        }
        let listener = bind(&config.bind, config.socket_buffer).await?;
        let bound = listener.local_addr().map_err(|source| RemoteError::Bind {
            addr: config.bind.clone(),
            source,
        })?;
        let addr = config
            .advertise
            .clone()
            .unwrap_or_else(|| bound.to_string());
        if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
            if sa.ip().is_unspecified() || sa.port() == 0 {
                return Err(RemoteError::Config(format!(
                    "this node would advertise {addr}, which other nodes cannot connect to: \
                     set `advertise` to an address they reach it at (binding to {} is fine)",
                    config.bind
                )));
            }
        }
        // Other nodes refuse a peer that advertises anything else.
        crate::remote_ref::check_node_addr(&addr).map_err(|e| {
            RemoteError::Config(format!("this node cannot advertise {addr:?}: {e}"))
        })?;
        let incarnation = loop {
            let n =
                getrandom::u64().map_err(|e| RemoteError::Config(format!("no randomness: {e}")))?;
            if n != 0 {
                break n;
            }
        };
        let local = Local {
            version: PROTOCOL_VERSION,
            cluster: config.cluster.clone(),
            me: NodeIdentity {
                node_id: config.node_id.clone(),
                incarnation,
                addr,
            },
            secret: config.secret.clone().unwrap_or_else(|| Arc::from(&[][..])),
            max_frame_len: config.max_frame_len,
            payload_format: config.payload_format.name().to_string(),
        };
        if config.secret.is_none() {
            tracing::warn!(
                node = %config.node_id,
                "remoting runs without a shared secret: any host that can reach {bound} can send messages to registered actors"
            );
        }
        let sweep_every = (config.max_reply_wait / 4).max(Duration::from_secs(1));
        let max_reply_wait = config.max_reply_wait;
        let node = Node::new(system.clone(), config, local);
        let remote = Remote { node: node.clone() };
        if slot.0.set(remote.clone()).is_err() {
            return Err(RemoteError::Config(
                "this actor system already has a remote layer".into(),
            ));
        }
        node.tasks.spawn(accept_loop(node.clone(), listener));
        node.tasks.spawn(reply_sweeper(
            Arc::downgrade(&node),
            sweep_every,
            max_reply_wait,
            node.shutdown.clone(),
        ));
        let sys = system.clone();
        let stopping = node.clone();
        node.tasks.spawn(async move {
            tokio::select! {
                _ = sys.shutdown_started() => stopping.shut_down(),
                _ = stopping.shutdown.cancelled() => {}
            }
        });
        tracing::info!(
            node = %node.local.me.node_id,
            addr = %node.addr,
            incarnation,
            cluster = %node.local.cluster,
            "remoting started"
        );
        Ok(remote)
    }

    /// The remote layer started on `system`, if any.
    pub fn get(system: &ActorSystem) -> Option<Remote> {
        system.extension(|_| Slot(OnceLock::new())).0.get().cloned()
    }

    /// This node's address (`host:port`), with the real port if it bound port 0.
    pub fn addr(&self) -> &str {
        &self.node.addr
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node.local.me.node_id
    }

    /// This process's incarnation of the node (random, new at each start).
    pub fn incarnation(&self) -> u64 {
        self.node.local.me.incarnation
    }

    /// This node's identity as sent in handshakes.
    pub fn identity(&self) -> NodeIdentity {
        self.node.local.me.clone()
    }

    /// The format this node encodes and decodes payloads in.
    pub fn payload_format(&self) -> &PayloadFormat {
        &self.node.cfg.payload_format
    }

    /// The actor system this layer serves.
    pub fn system(&self) -> &ActorSystem {
        &self.node.system
    }

    /// Makes `actor` reachable from other nodes at `path`; messages are decoded as `M`.
    /// Returns true if it replaced an earlier registration.
    ///
    /// The registration ends by itself once the actor has terminated (unless `path` was
    /// registered anew meanwhile): messages to the path then fail as for a path nobody
    /// registered, and paths of short-lived actors do not accumulate.
    pub fn register<M>(&self, path: &str, actor: ActorRef<M>) -> bool
    where
        M: DeserializeOwned + Send + 'static,
    {
        let decoder = typed_decoder(
            self.node.system.clone(),
            path.into(),
            actor.clone(),
            self.node.cfg.payload_format.clone(),
        );
        let replaced = self.node.registry.insert(path, decoder.clone());
        let node = Arc::downgrade(&self.node);
        let (at, watched) = (path.to_string(), decoder.clone());
        let watcher = self.node.system.runtime().spawn(async move {
            actor.terminated().await;
            if let Some(node) = node.upgrade() {
                node.registry.remove_if_same(&at, &watched);
            }
        });
        self.node
            .registry
            .watch(path, &decoder, watcher.abort_handle());
        replaced
    }

    /// Whether a local actor or decoder is registered at `path`.
    pub fn is_registered(&self, path: &str) -> bool {
        self.node.registry.get(path).is_some()
    }

    /// Registers a hand-written decoder at `path` (adapters, routers). It runs on the
    /// connection's reader task: it must not block. It decodes the payload with
    /// [`decode_payload`](crate::decode_payload), which uses this node's payload format.
    pub fn register_decoder(&self, path: &str, decoder: Decoder) -> bool {
        self.node.registry.insert(path, decoder)
    }

    /// Removes the registration at `path`. Returns true if there was one.
    pub fn unregister(&self, path: &str) -> bool {
        self.node.registry.remove(path)
    }

    /// A reference to the actor registered at `path` on the node at `addr`. Nothing is sent
    /// until the first message; the connection is made (and kept) on demand.
    pub fn lookup<M>(&self, path: &str, addr: &str) -> RemoteRef<M>
    where
        M: Serialize + Send + 'static,
    {
        RemoteRef::new(self.node.clone(), self.node.peer(addr), path.into())
    }

    /// Connects to the node at `addr` now, control connection first, then the user
    /// connection, and waits for their handshakes. Returns the peer's identity, or why it
    /// failed (unreachable, or refused by either side).
    ///
    /// A dial the peer refuses as a duplicate (it dialed this node at the same moment and,
    /// as the lower node, keeps its own connection) is not a failure: the connection is the
    /// peer's, and `connect` waits for it (up to `handshake_timeout`) and returns Ok. Only if
    /// none comes under `addr` within that time (the peer was dialed under another address
    /// than it advertises, and its connection is known here under that one) does it return
    /// the refusal.
    pub async fn connect(&self, addr: &str) -> Result<NodeIdentity, RemoteError> {
        let peer = self.node.peer(addr);
        // Every lane without a connection counts as dialing until its turn, so the dialer
        // tasks do not race this call with dials of their own.
        let mut res = Ok(None);
        for lane in peer.start_dials() {
            if res.is_ok() {
                res = self.connect_lane(&peer, lane).await;
            }
            peer.end_dial(lane);
            // The lane's dialer may have looked while this call held the lane, and rested:
            // it looks again (and dials if something waits and the lane is still down).
            if !peer.link(lane).is_connected() {
                peer.link(lane).wake.notify_one();
            }
        }
        match res? {
            Some(identity) => Ok(identity),
            None => Lane::ALL
                .into_iter()
                .find_map(|lane| peer.connection(lane))
                .map(|c| c.peer)
                .ok_or_else(|| RemoteError::Connect {
                    addr: addr.to_string(),
                    source: std::io::ErrorKind::NotConnected.into(),
                }),
        }
    }

    /// Makes `peer`'s `lane` connection for [`connect`](Self::connect), which holds the lane
    /// as dialing: dials, unless the peer's connection came in meanwhile, and if the peer
    /// refuses the dial as a duplicate, waits for the peer's own connection.
    async fn connect_lane(
        &self,
        peer: &Arc<Peer>,
        lane: Lane,
    ) -> Result<Option<NodeIdentity>, RemoteError> {
        if let Some(c) = peer.connection(lane) {
            // The peer dialed in while the previous lane was made.
            return Ok(Some(c.peer));
        }
        match self.node.dial_once(peer, lane).await {
            Ok(identity) => Ok(Some(identity)),
            Err(RemoteError::Handshake(e)) if is_duplicate(&e) => {
                match peer
                    .wait_connected(lane, self.node.cfg.handshake_timeout)
                    .await
                {
                    Some(c) => Ok(Some(c.peer)),
                    None => Err(RemoteError::Handshake(e)),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The current user connection (messages and replies) to the node at `addr`, if any.
    pub fn connection(&self, addr: &str) -> Option<ConnectionInfo> {
        self.connection_on(addr, Lane::User)
    }

    /// The current connection on `lane` to the node at `addr`, if any.
    pub fn connection_on(&self, addr: &str, lane: Lane) -> Option<ConnectionInfo> {
        self.node.existing_peer(addr)?.connection(lane)
    }

    /// Closes the current connections to `addr` (they are re-made on demand).
    pub fn disconnect(&self, addr: &str) {
        if let Some(p) = self.node.existing_peer(addr) {
            p.disconnect(&Lane::ALL);
        }
    }

    /// Closes the current connection on `lane` to `addr` only; the other connection stays
    /// up, and this one is re-made on demand (by the node that dialed the other one, or by
    /// the next frame queued on this lane).
    pub fn disconnect_on(&self, addr: &str, lane: Lane) {
        if let Some(p) = self.node.existing_peer(addr) {
            p.disconnect(&[lane]);
        }
    }

    /// Messages waiting in the user lane toward `addr`.
    pub fn queued(&self, addr: &str) -> usize {
        self.node
            .existing_peer(addr)
            .map_or(0, |p| p.link(Lane::User).queue.len())
    }

    /// How many peers this node keeps state for now (queues, dialers, the last identity
    /// seen): those it has a connection to or something queued for, those a live
    /// [`RemoteRef`] points at, and, until they are forgotten, recently used ones.
    /// Peers nothing uses any more are forgotten (counted in
    /// [`RemoteStats::peers_forgotten`]).
    pub fn known_peers(&self) -> usize {
        self.node.peer_count()
    }

    /// Counters since start.
    pub fn stats(&self) -> RemoteStats {
        self.node.counters.snapshot()
    }

    /// Subscribes to connection events (connected, disconnected, handshake failures, ...).
    pub fn events(&self) -> broadcast::Receiver<RemoteEvent> {
        self.node.events.subscribe()
    }

    /// Stops listening, closes every connection and waits for the layer's tasks to end.
    /// Queued messages are dropped. Also happens when the actor system shuts down.
    pub async fn shutdown(&self) {
        self.node.shut_down();
        self.node.tasks.close();
        self.node.tasks.wait().await;
    }
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("node_id", &self.node_id())
            .field("addr", &self.addr())
            .field("incarnation", &self.incarnation())
            .finish()
    }
}

async fn bind(addr: &str, buffer: Option<u32>) -> Result<TcpListener, RemoteError> {
    let err = |source| RemoteError::Bind {
        addr: addr.to_string(),
        source,
    };
    let sa: SocketAddr = tokio::net::lookup_host(addr)
        .await
        .map_err(err)?
        .next()
        .ok_or_else(|| err(std::io::ErrorKind::AddrNotAvailable.into()))?;
    let socket = if sa.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    if let Some(size) = buffer {
        // Inherited by accepted connections.
        socket.set_send_buffer_size(size).map_err(err)?;
        socket.set_recv_buffer_size(size).map_err(err)?;
    }
    socket.bind(sa).map_err(err)?;
    socket.listen(1024).map_err(err)
}
