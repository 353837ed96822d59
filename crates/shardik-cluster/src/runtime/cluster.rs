//! [`Cluster`]: the handle of a running cluster node, its snapshots, events and errors.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use shardik_actor::ActorSystem;
use shardik_remote::{Remote, RemoteError, RemoteRef};
use tokio::sync::{broadcast, mpsc, watch};

use super::config::{ClusterConfig, ConfigError};
use super::driver;
use crate::events::ClusterEvent;
use crate::member::{Member, MemberStatus, UniqueAddress};

/// Why the cluster layer of a node stopped. (Why an actor stopped is
/// `shardik_actor::StopReason`, another type.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeStopReason {
    /// The node left gracefully (it reached `Exiting`, or was removed after leaving).
    Left,
    /// The node was marked `Down` (by the split brain resolver or an operator).
    Downed,
    /// The node was removed from the membership without leaving (for example a newer
    /// incarnation at the same address joined).
    Removed,
    /// [`Cluster::shutdown`] was called.
    Shutdown,
    /// The actor system shut down.
    SystemShutdown,
    /// The remote layer was shut down underneath the cluster.
    RemoteStopped,
    /// The task that runs the node's membership panicked (a bug in shardik): the node
    /// stopped, fenced, and the other members see it as crashed.
    DriverFailed,
}

impl fmt::Display for NodeStopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeStopReason::Left => "left the cluster",
            NodeStopReason::Downed => "downed",
            NodeStopReason::Removed => "removed from the cluster",
            NodeStopReason::Shutdown => "shut down",
            NodeStopReason::SystemShutdown => "the actor system shut down",
            NodeStopReason::RemoteStopped => "the remote layer stopped",
            NodeStopReason::DriverFailed => "the cluster driver failed (panicked)",
        })
    }
}

/// Errors of the cluster layer.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The configuration is invalid.
    #[error("invalid cluster configuration: {0}")]
    Config(#[from] ConfigError),
    /// The remote layer failed to start (address in use, invalid transport settings, ...).
    #[error("remoting failed to start: {0}")]
    Remote(#[from] RemoteError),
    /// This actor system already runs a cluster node.
    #[error("this actor system already runs a cluster node")]
    AlreadyStarted,
    /// No live member has this node id.
    #[error("no live member has node id {0:?}")]
    UnknownNode(String),
    /// The cluster layer of this node has stopped.
    #[error("the cluster node stopped: {0}")]
    Stopped(NodeStopReason),
}

/// What a subscriber receives after its snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A change of membership, reachability or leadership.
    Cluster(ClusterEvent),
    /// The cluster layer of this node stopped; always the last event.
    Stopped(NodeStopReason),
}

/// A consistent picture of the cluster as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterState {
    /// This node.
    pub self_node: UniqueAddress,
    /// The members, in address order (removed members are gone).
    pub members: Vec<Member>,
    /// Members some reachable member flagged unreachable.
    pub unreachable: BTreeSet<UniqueAddress>,
    /// The leader as seen from here.
    pub leader: Option<UniqueAddress>,
    /// This node is fenced (see
    /// [`MembershipNode::is_fenced`](crate::node::MembershipNode::is_fenced)): what must never
    /// run twice in the cluster (shard hosting, singletons) must not run here now. Also set
    /// once the node is `Down` or stopped.
    pub fenced: bool,
    /// Set once the cluster layer of this node has stopped.
    pub stopped: Option<NodeStopReason>,
}

impl ClusterState {
    pub(crate) fn empty(self_node: UniqueAddress) -> Self {
        ClusterState {
            self_node,
            members: Vec::new(),
            unreachable: BTreeSet::new(),
            leader: None,
            fenced: false,
            stopped: None,
        }
    }

    /// One member by its unique address.
    pub fn member(&self, node: &UniqueAddress) -> Option<&Member> {
        self.members.iter().find(|m| &m.node == node)
    }

    /// This node as a member (`None` before it joined and after it was removed).
    pub fn self_member(&self) -> Option<&Member> {
        self.member(&self.self_node)
    }

    /// The member with this node id that is not `Down` (a restarted process downs its
    /// previous incarnation when it joins, so there is at most one).
    pub fn member_by_id(&self, node_id: &str) -> Option<&Member> {
        self.members
            .iter()
            .find(|m| m.node.node_id == node_id && m.status != MemberStatus::Down)
    }

    /// The members in this state.
    pub fn with_status(&self, status: MemberStatus) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(move |m| m.status == status)
    }

    /// `true` if exactly `nodes` are members, all `Up` and reachable.
    pub fn all_up(&self, nodes: &[UniqueAddress]) -> bool {
        self.members.len() == nodes.len()
            && nodes.iter().all(|n| {
                self.member(n).is_some_and(|m| m.status == MemberStatus::Up)
                    && !self.unreachable.contains(n)
            })
    }
}

/// A subscription: the state when it was taken, then every event after it, in order.
#[derive(Debug)]
pub struct Subscription {
    /// The state at subscription time; apply the events that follow to keep it current.
    pub snapshot: ClusterState,
    rx: broadcast::Receiver<Event>,
    /// [`Event::Stopped`] was received, or the node had stopped when this was taken.
    stopped: bool,
}

impl Subscription {
    /// The next event; `Lagged(n)` if this subscriber fell more than 1 024 events behind
    /// (take a new snapshot with [`Cluster::state`]), `Closed` after [`Event::Stopped`] (and
    /// at once for a subscription taken after the node stopped), so a
    /// `while let Ok(event) = sub.recv().await` loop ends with the node.
    pub async fn recv(&mut self) -> Result<Event, broadcast::error::RecvError> {
        if self.stopped {
            return Err(broadcast::error::RecvError::Closed);
        }
        let event = self.rx.recv().await;
        self.stopped = matches!(event, Ok(Event::Stopped(_)));
        event
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Result<Event, broadcast::error::TryRecvError> {
        if self.stopped {
            return Err(broadcast::error::TryRecvError::Closed);
        }
        let event = self.rx.try_recv();
        self.stopped = matches!(event, Ok(Event::Stopped(_)));
        event
    }
}

pub(crate) enum Command {
    Leave,
    Down(UniqueAddress),
    Shutdown,
}

/// State shared by the handle and the driver task.
pub(crate) struct Shared {
    /// Held while publishing, so a subscription's snapshot and its events fit together.
    pub(crate) publish: Mutex<()>,
    pub(crate) state: watch::Sender<ClusterState>,
    pub(crate) events: broadcast::Sender<Event>,
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    pub(crate) counters: Counters,
}

/// Counters the driver and the endpoint update.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) send_failures: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) inbox_dropped: AtomicU64,
    pub(crate) heartbeats: AtomicU64,
    pub(crate) max_heartbeat_gap_ms: AtomicU64,
}

/// Counters of a cluster node since it started ([`Cluster::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Cluster messages queued for other nodes (gossip, heartbeats, joins).
    pub messages_sent: u64,
    /// Cluster messages that could not be queued (full control lane toward a peer).
    pub send_failures: u64,
    /// Cluster messages received.
    pub messages_received: u64,
    /// Cluster messages dropped on arrival because the driver's inbox was full.
    pub inbox_dropped: u64,
    /// Heartbeats received from the nodes this one monitors.
    pub heartbeats_received: u64,
    /// The longest time between two consecutive heartbeats from the same node: how close
    /// the failure detector came to suspecting a live node (compare with the acceptable
    /// pause plus the heartbeat interval).
    pub max_heartbeat_gap: Duration,
}

impl Shared {
    /// Publishes a new state and the events that led to it.
    pub(crate) fn publish(&self, state: Option<ClusterState>, events: Vec<Event>) {
        let _g = self.publish.lock();
        // Events first: whoever sees the new state finds its events already queued.
        for e in events {
            let _ = self.events.send(e);
        }
        if let Some(s) = state {
            self.state.send_replace(s);
        }
    }
}

struct Slot(OnceLock<Cluster>);

/// A running cluster node: the membership state machine of
/// [`MembershipNode`](crate::node::MembershipNode) driven over shardik-remote connections.
///
/// Cloning is cheap and shares the node; it is also kept as an extension of its actor
/// system ([`Cluster::get`]). The node runs until it leaves, is downed or removed,
/// [`Cluster::shutdown`] is called or the actor system shuts down; dropping the handles does
/// not stop it. See the [module docs](super) for what it does.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) shared: Arc<Shared>,
    remote: Remote,
    self_node: UniqueAddress,
    /// The remote layer's frame size limit (`RemoteConfig::max_frame_len`): what the
    /// receptionist cuts its listings to.
    max_frame_len: usize,
    /// The remote layer's control-lane queue per peer (`RemoteConfig::control_queue`): the
    /// most chunks a receptionist listing may be cut into.
    control_queue: usize,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("self_node", &self.self_node)
            .field("status", &self.self_member().map(|m| m.status))
            .finish()
    }
}

impl Cluster {
    /// Starts this node: validates `config`, starts the remote layer of `system` (the cluster
    /// name goes into its handshake), registers the cluster endpoint and starts the driver
    /// task on the current tokio runtime, which joins the cluster through the seed nodes. The
    /// node's [`Receptionist`](super::Receptionist) is started too, so that its endpoint
    /// exists on every node (the pushes of the others find it) and a later
    /// [`Receptionist::get`](super::Receptionist::get) finds their entries already there.
    ///
    /// Returns as soon as the node is listening; await [`Cluster::when_up`] to wait until it
    /// is a member. Fails if the configuration is invalid, the address cannot be bound, or
    /// the system already runs a cluster node or a remote layer.
    pub async fn start(
        system: &ActorSystem,
        config: ClusterConfig,
    ) -> Result<Cluster, ClusterError> {
        config.validate()?;
        let slot = system.extension(|_| Slot(OnceLock::new()));
        if slot.0.get().is_some() {
            return Err(ClusterError::AlreadyStarted);
        }
        let max_frame_len = config.remote.max_frame_len;
        let control_queue = config.remote.control_queue;
        let remote = Remote::start(system, config.remote.clone()).await?;
        let self_node = UniqueAddress::new(remote.addr(), remote.node_id(), remote.incarnation());
        let (commands, command_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            publish: Mutex::new(()),
            state: watch::channel(ClusterState::empty(self_node.clone())).0,
            events: broadcast::channel(1024).0,
            commands,
            counters: Counters::default(),
        });
        let cluster = Cluster {
            shared: shared.clone(),
            remote: remote.clone(),
            self_node: self_node.clone(),
            max_frame_len,
            control_queue,
        };
        if slot.0.set(cluster.clone()).is_err() {
            remote.shutdown().await;
            return Err(ClusterError::AlreadyStarted);
        }
        driver::start(
            system.clone(),
            remote,
            config,
            self_node,
            shared,
            command_rx,
        );
        // Cheap: a task that sends nothing until something is registered on this node.
        super::Receptionist::get(&cluster);
        Ok(cluster)
    }

    /// A cluster handle over a started remote layer with no driver: the test publishes the
    /// states and events itself (`shared.publish`).
    #[cfg(test)]
    pub(crate) async fn without_driver(system: &ActorSystem, config: ClusterConfig) -> Cluster {
        let max_frame_len = config.remote.max_frame_len;
        let control_queue = config.remote.control_queue;
        let remote = Remote::start(system, config.remote)
            .await
            .expect("remote starts");
        let self_node = UniqueAddress::new(remote.addr(), remote.node_id(), remote.incarnation());
        let shared = Arc::new(Shared {
            publish: Mutex::new(()),
            state: watch::channel(ClusterState::empty(self_node.clone())).0,
            events: broadcast::channel(1024).0,
            commands: mpsc::unbounded_channel().0,
            counters: Counters::default(),
        });
        Cluster {
            shared,
            remote,
            self_node,
            max_frame_len,
            control_queue,
        }
    }

    /// The cluster node started on `system`, if any.
    pub fn get(system: &ActorSystem) -> Option<Cluster> {
        system.extension(|_| Slot(OnceLock::new())).0.get().cloned()
    }

    /// This node's unique address (advertised address, node id, incarnation).
    pub fn self_node(&self) -> &UniqueAddress {
        &self.self_node
    }

    /// The remote layer this node talks through (register actors on it to make them
    /// reachable by [`Cluster::lookup`] from other nodes).
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// The remote layer's frame size limit, in bytes.
    pub(crate) fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// The remote layer's control-lane queue per peer, in frames.
    pub(crate) fn control_queue(&self) -> usize {
        self.control_queue
    }

    /// The current state as this node sees it.
    pub fn state(&self) -> ClusterState {
        self.shared.state.borrow().clone()
    }

    /// A snapshot of the members.
    pub fn members(&self) -> Vec<Member> {
        self.shared.state.borrow().members.clone()
    }

    /// This node as a member (`None` before it joined and after it was removed).
    pub fn self_member(&self) -> Option<Member> {
        self.shared.state.borrow().self_member().cloned()
    }

    /// The leader as seen from here.
    pub fn leader(&self) -> Option<UniqueAddress> {
        self.shared.state.borrow().leader.clone()
    }

    /// Counters since this node started.
    pub fn stats(&self) -> ClusterStats {
        let c = &self.shared.counters;
        ClusterStats {
            messages_sent: c.sent.load(Ordering::Relaxed),
            send_failures: c.send_failures.load(Ordering::Relaxed),
            messages_received: c.received.load(Ordering::Relaxed),
            inbox_dropped: c.inbox_dropped.load(Ordering::Relaxed),
            heartbeats_received: c.heartbeats.load(Ordering::Relaxed),
            max_heartbeat_gap: Duration::from_millis(
                c.max_heartbeat_gap_ms.load(Ordering::Relaxed),
            ),
        }
    }

    /// `Some(reason)` once the cluster layer of this node has stopped.
    pub fn stopped(&self) -> Option<NodeStopReason> {
        self.shared.state.borrow().stopped
    }

    /// The current state and every event after it.
    pub fn subscribe(&self) -> Subscription {
        let _g = self.shared.publish.lock();
        let snapshot = self.shared.state.borrow().clone();
        Subscription {
            stopped: snapshot.stopped.is_some(),
            snapshot,
            rx: self.shared.events.subscribe(),
        }
    }

    /// Waits until `pred` holds for the state (checked now and after every change) and
    /// returns that state. Wrap it in a timeout; it also returns once the node stopped,
    /// with `stopped` set, if `pred` holds then.
    pub async fn wait_until(&self, mut pred: impl FnMut(&ClusterState) -> bool) -> ClusterState {
        let mut rx = self.shared.state.subscribe();
        let s = match rx.wait_for(|s| pred(s)).await {
            Ok(s) => s.clone(),
            Err(_) => self.state(),
        };
        s
    }

    /// Waits until this node is `Up` (or `WeaklyUp`). Fails if it stops first.
    pub async fn when_up(&self) -> Result<(), ClusterError> {
        let s = self
            .wait_until(|s| {
                s.stopped.is_some()
                    || s.self_member().is_some_and(|m| {
                        matches!(m.status, MemberStatus::Up | MemberStatus::WeaklyUp)
                    })
            })
            .await;
        match s.stopped {
            Some(r) => Err(ClusterError::Stopped(r)),
            None => Ok(()),
        }
    }

    /// Leaves the cluster gracefully and waits until this node has stopped: it becomes
    /// `Leaving`, the leader moves it to `Exiting` at convergence, and then this node stops
    /// its cluster layer and remoting (the others remove it). A node that is not a member
    /// yet stops at once. Returns why it stopped (`Left`, or `Downed` if it was downed
    /// meanwhile). With [`stop_system_on_exit`](super::ClusterConfig::stop_system_on_exit),
    /// do not await it inside a handler of an actor of this node's system (see there).
    pub async fn leave(&self) -> NodeStopReason {
        let _ = self.shared.commands.send(Command::Leave);
        self.stopped_reason().await
    }

    /// Marks `node` `Down` (an operator decision): it is removed from the cluster, and shuts
    /// itself down if it hears of it. Nothing happens if it is not a member.
    pub fn down(&self, node: &UniqueAddress) {
        let _ = self.shared.commands.send(Command::Down(node.clone()));
    }

    /// Stops this node's cluster layer and remoting at once, **without leaving**: the others
    /// see it as crashed (unreachable, then downed). Use [`Cluster::leave`] to go gracefully.
    pub async fn shutdown(&self) {
        let _ = self.shared.commands.send(Command::Shutdown);
        self.stopped_reason().await;
    }

    async fn stopped_reason(&self) -> NodeStopReason {
        let s = self.wait_until(|s| s.stopped.is_some()).await;
        s.stopped.unwrap_or(NodeStopReason::Shutdown)
    }

    /// A reference to the actor registered at `path` (with [`Remote::register`]) on the
    /// member whose node id is `node_id`. The node must be a current member that is not
    /// `Down`; the ref keeps pointing at that member's address.
    pub fn lookup<M>(&self, path: &str, node_id: &str) -> Result<RemoteRef<M>, ClusterError>
    where
        M: Serialize + Send + 'static,
    {
        let state = self.shared.state.borrow();
        let m = state
            .member_by_id(node_id)
            .ok_or_else(|| ClusterError::UnknownNode(node_id.to_string()))?;
        Ok(self.remote.lookup(path, &m.node.address))
    }
}
