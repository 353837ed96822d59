//! [`ClusterSingleton`]: one instance of an actor in the whole cluster, on the oldest `Up`
//! member, reached from any node through a [`SingletonProxy`].
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::{Actor, ActorError, Context, Props};
//! use shardik_cluster::runtime::{Cluster, ClusterSingleton, SingletonSettings};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Tick;
//!
//! struct Scheduler;
//! impl Actor for Scheduler {
//!     type Msg = Tick;
//!     async fn handle(&mut self, _: Tick, _: &mut Context<Self>) -> Result<(), ActorError> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(cluster: Cluster) {
//! // On every node (the same name, the same settings):
//! let singleton = ClusterSingleton::start(
//!     &cluster,
//!     SingletonSettings::new("scheduler").role("backend"),
//!     || Props::new(|| Scheduler),
//! );
//! // From any node, wherever the instance runs now:
//! singleton.proxy().tell(Tick).expect("buffer not full");
//! # }
//! ```
//!
//! ## Where the instance runs
//! Every node that may host the singleton runs a **manager** ([`ClusterSingleton::start`]
//! with the same name and settings). Each manager decides on its own, from its view of the
//! membership, with [`decide`] (a plain function, unit-tested):
//! - the host is the **oldest `Up` member** (lowest up-number, see
//!   [`Member::is_older_than`]) with the settings' role;
//! - that member starts the instance only when no older member can still run one: every
//!   older member with the role is `Down`, removed, or has **confirmed the hand-over** (its
//!   manager stopped its instance, or never had one, and said so). A member that is `Leaving`
//!   or `Exiting`, or that was removed without having been `Down`, blocks the start until it
//!   confirmed; one that was removed without confirming (the confirmation was lost) blocks
//!   for [`removal_timeout`](SingletonSettings::removal_timeout) more.
//!
//! **Graceful leave** of the host: its manager sees itself `Leaving`, stops the instance
//! ([`graceful_stop`](shardik_actor::ActorRef::graceful_stop): the messages already queued
//! are handled first), waits until it has terminated and only then sends `HandedOver` to every
//! member; the next oldest starts the new instance when that arrives. So the old instance has
//! stopped before the new one starts. If the node is fenced, downed (an operator may down a
//! leaving node; the others then start a new instance `down_margin` later) or stopped for
//! another reason than its leave while the queue is worked through, the instance stops at once
//! (after its current message). Messages a proxy sends once its node sees the host `Leaving`
//! are buffered for the new instance; one that reaches the old host after its manager began
//! the hand-over (sent by a proxy that still took it for `Up`) is lost.
//!
//! **An instance that stops on its own** (it stopped itself, or its supervisor gave up) is
//! replaced on the same host after a backoff
//! ([`restart_backoff`](SingletonSettings::restart_backoff)): 1 s, doubled after every such
//! stop up to 30 s, back to 1 s after an instance that ran for 30 s, however that one stopped
//! (each stop is logged at `warn` with the reason). Meanwhile the host does not say it runs
//! the instance, and proxies buffer as for a fenced host (it tells them `Paused` at once and
//! on every tick, fenced or not); if it stops being the host meanwhile (it leaves), it
//! confirms the hand-over at once.
//!
//! **Crash** of the host: it stays the oldest `Up` member while it is only unreachable (no
//! second instance is started on a suspicion); once the split brain resolver marked it `Down`,
//! the next oldest starts a new instance [`down_margin`](SingletonSettings::down_margin)
//! (500 ms) later. The instance's state is lost with the crashed node (persist it, e.g. with
//! shardik-persistence, if it matters).
//!
//! **Partitions**: the `Down` member may be alive on the losing side. A manager stops its
//! instance as soon as its node is **fenced** ([`ClusterState::fenced`]: on its own view the
//! split brain resolver would down it), which happens at detection time, while the winning
//! side downs it only `stable_after` (2 s) after its own detection; the margin is on top of
//! that, against a skew between the two sides' detections and the time the old instance
//! takes to stop (Akka's `down-removal-margin` plays this role alone, see `docs/cluster.md`).
//!
//! ## The proxy
//! A [`SingletonProxy`] (from [`ClusterSingleton::proxy`], on any node) sends to the node that
//! last announced that it runs the instance (hosts announce themselves to every member at
//! once and every [`announce_interval`](SingletonSettings::announce_interval)). While no
//! instance is known (at start, or from the moment the current host is no longer `Up` in this
//! node's view until the next host announces itself) messages are **buffered** in order, up
//! to [`buffer_size`](SingletonSettings::buffer_size), and sent when the new host is known; a
//! message that finds the buffer full is refused with [`SingletonError::BufferFull`]. While
//! the host is unreachable (flagged by any member), or after it said it stopped its instance because
//! it is fenced (`Paused`), messages are buffered too, and sent once it is reachable and has
//! announced itself again (it does while its instance runs: after a fence, once the instance
//! runs again), or when the next host announces itself after it was downed. Delivery is at
//! most once: a message sent to the old host just before it stopped or crashed is lost.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorRef, AskError, Props, ReplyTo};
use shardik_remote::RemoteRef;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::cluster::{Cluster, ClusterState, Event, NodeStopReason};
use super::inbox;
use super::singleton_view::SingletonView;
use crate::events::ClusterEvent;
use crate::member::{Member, MemberStatus, UniqueAddress};

/// The oldest `Up` member with `role` (`None`: any member), by up-number then address.
pub fn oldest_up<'a>(
    members: impl IntoIterator<Item = &'a Member>,
    role: Option<&str>,
) -> Option<&'a Member> {
    members
        .into_iter()
        .filter(|m| m.status == MemberStatus::Up && m.has_role(role))
        .min_by(|a, b| a.age_key().cmp(&b.age_key()))
}

/// What a singleton manager should do, by [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SingletonDecision {
    /// This node is the oldest `Up` member with the role and nobody older can still run an
    /// instance: run it.
    Host,
    /// This node is the oldest `Up` member, but these older members may still run an
    /// instance (leaving, exiting, or removed without confirming the hand-over): wait.
    WaitFor(Vec<UniqueAddress>),
    /// Another member (or none) is the oldest `Up` member: do not run an instance.
    NotOldest(Option<UniqueAddress>),
}

/// Decides whether `self_node` runs the singleton.
///
/// `members` is this node's view of the membership, plus the members that were removed
/// without having been `Down` and without confirming (pass them with status `Exiting`);
/// `handed_over` are the members that confirmed they run no instance.
///
/// ```
/// use std::collections::BTreeSet;
/// use shardik_cluster::member::{Member, MemberStatus, UniqueAddress};
/// use shardik_cluster::runtime::{decide, SingletonDecision};
///
/// let member = |n: u64, status| Member {
///     node: UniqueAddress::new(format!("10.0.0.{n}:7000"), format!("n{n}"), 1),
///     status,
///     roles: BTreeSet::new(),
///     up_number: Some(n),
/// };
/// let (a, b) = (member(1, MemberStatus::Leaving), member(2, MemberStatus::Up));
/// let members = [a.clone(), b.clone()];
/// // The oldest is leaving: b waits until a confirmed that its instance stopped.
/// assert_eq!(
///     decide(&members, &b.node, None, &BTreeSet::new()),
///     SingletonDecision::WaitFor(vec![a.node.clone()])
/// );
/// assert_eq!(
///     decide(&members, &b.node, None, &BTreeSet::from([a.node.clone()])),
///     SingletonDecision::Host
/// );
/// assert_eq!(
///     decide(&members, &a.node, None, &BTreeSet::new()),
///     SingletonDecision::NotOldest(Some(b.node.clone()))
/// );
/// ```
pub fn decide(
    members: &[Member],
    self_node: &UniqueAddress,
    role: Option<&str>,
    handed_over: &BTreeSet<UniqueAddress>,
) -> SingletonDecision {
    let Some(me) = oldest_up(members, role) else {
        return SingletonDecision::NotOldest(None);
    };
    if &me.node != self_node {
        return SingletonDecision::NotOldest(Some(me.node.clone()));
    }
    let blockers: Vec<UniqueAddress> = members
        .iter()
        .filter(|m| {
            &m.node != self_node
                && m.has_role(role)
                && matches!(m.status, MemberStatus::Leaving | MemberStatus::Exiting)
                && m.is_older_than(me)
                && !handed_over.contains(&m.node)
        })
        .map(|m| m.node.clone())
        .collect();
    if blockers.is_empty() {
        SingletonDecision::Host
    } else {
        SingletonDecision::WaitFor(blockers)
    }
}

/// Whether the instance must stop at once, even during a hand-over: the node is fenced
/// (also when it is `Down`) or stopped for another reason than a graceful leave (a stopped
/// node is always fenced).
fn must_stop_at_once(state: &ClusterState) -> bool {
    match state.stopped {
        Some(reason) => reason != NodeStopReason::Left,
        None => state.fenced,
    }
}

/// How often a manager waiting for its instance to stop says that it still waits.
const STOP_REPORT_EVERY: Duration = Duration::from_secs(5);

/// The longest interval, timeout or margin a setting takes (longer ones are cut to it).
const MAX_SETTING: Duration = Duration::from_secs(3600);

/// Settings of a cluster singleton; every node must use the same.
#[derive(Clone, Debug)]
pub struct SingletonSettings {
    name: String,
    role: Option<String>,
    buffer_size: usize,
    announce_interval: Duration,
    removal_timeout: Duration,
    down_margin: Duration,
    restart_min: Duration,
    restart_max: Duration,
}

impl SingletonSettings {
    /// A singleton named `name` (unique among the singletons of the cluster), on any member,
    /// with a buffer of 1 000 messages, announced every 500 ms, a removal timeout of 5 s, a
    /// down margin of 500 ms and a restart backoff of 1 s to 30 s.
    pub fn new(name: impl Into<String>) -> Self {
        SingletonSettings {
            name: name.into(),
            role: None,
            buffer_size: 1000,
            announce_interval: Duration::from_millis(500),
            removal_timeout: Duration::from_secs(5),
            down_margin: Duration::from_millis(500),
            restart_min: RESTART_MIN,
            restart_max: RESTART_MAX,
        }
    }

    /// Runs the instance only on members with `role` (the oldest `Up` one among them).
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }

    /// How many messages a proxy buffers while no instance is known (at least 1).
    pub fn buffer_size(mut self, messages: usize) -> Self {
        self.buffer_size = messages.max(1);
        self
    }

    /// How often the host announces itself to every member (and a leaving node confirms its
    /// hand-over); kept between 1 ms and 1 hour (zero would stop the manager).
    pub fn announce_interval(mut self, interval: Duration) -> Self {
        self.announce_interval = interval.clamp(Duration::from_millis(1), MAX_SETTING);
        self
    }

    /// How long a member that was removed without being `Down` and without confirming its
    /// hand-over still blocks the start of a new instance (at most 1 hour).
    pub fn removal_timeout(mut self, timeout: Duration) -> Self {
        self.removal_timeout = timeout.min(MAX_SETTING);
        self
    }

    /// How long after an older member with the role was marked `Down` it still blocks the
    /// start of a new instance (unless it confirmed that it runs none). A `Down` member alive
    /// on the losing side of a partition stopped its instance when it was fenced, about
    /// `stable_after` before the winning side downed it; the margin adds to that against a
    /// skew between the two sides' detection and a slow stop (default 500 ms). Zero starts the
    /// new instance as soon as the old host is `Down` (at most 1 hour).
    pub fn down_margin(mut self, margin: Duration) -> Self {
        self.down_margin = margin.min(MAX_SETTING);
        self
    }

    /// The wait before a new instance replaces one that stopped on its own (it stopped
    /// itself, or its supervisor gave up): `min` the first time, doubled after every such stop
    /// up to `max`, and `min` again once an instance ran for at least `max`, however it
    /// stopped (default 1 s and 30 s). `min` is kept between 1 ms and 1 hour (zero would
    /// restart a failing instance in a busy loop), `max` between `min` and 1 hour.
    pub fn restart_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.restart_min = min.clamp(Duration::from_millis(1), MAX_SETTING);
        self.restart_max = max.clamp(self.restart_min, MAX_SETTING);
        self
    }

    /// The singleton's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why a [`SingletonProxy`] refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SingletonError {
    /// No instance is known and the buffer already holds `capacity` messages.
    #[error("singleton {name:?}: no instance known and the buffer of {capacity} messages is full")]
    BufferFull {
        /// The singleton's name.
        name: String,
        /// The buffer size.
        capacity: usize,
    },
    /// The cluster node (and with it the manager) has stopped.
    #[error("singleton {0:?}: the cluster node has stopped")]
    Stopped(String),
}

/// Protocol messages between the managers of one singleton.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum WireMsg {
    /// The sender runs the instance.
    Hosting(UniqueAddress),
    /// The sender runs no instance (any more).
    HandedOver(UniqueAddress),
    /// The sender stopped its instance because it is fenced, or its instance stopped on its
    /// own, and it is still the host: wait for its next `Hosting`.
    Paused(UniqueAddress),
}

enum Target<M> {
    Local(ActorRef<M>),
    Remote(RemoteRef<M>),
}

impl<M: Serialize + Send + 'static> Target<M> {
    fn tell(&self, msg: M) {
        match self {
            Target::Local(a) => a.tell(msg),
            Target::Remote(r) => r.tell(msg),
        }
    }
}

struct ProxyState<M> {
    host: Option<(UniqueAddress, Target<M>)>,
    /// The host was unreachable from here, or told that it stopped its instance for a fence,
    /// and has not announced itself since: messages wait for its next `Hosting` (sent when
    /// its instance runs again) rather than going to an instance that may not run yet.
    stale: bool,
    buffer: VecDeque<M>,
    stopped: bool,
    /// Whether the proxy sends to its host changed under the lock: publish it
    /// ([`Shared::publish_host`]) once the lock is released.
    dirty: bool,
}

struct Shared<M> {
    cluster: Cluster,
    settings: SingletonSettings,
    instance_path: String,
    manager_path: String,
    proxy: Mutex<ProxyState<M>>,
    /// Where the proxy sends now (`None`: buffering).
    host_tx: watch::Sender<Option<UniqueAddress>>,
    /// `true` while this node runs the instance.
    hosting_tx: watch::Sender<bool>,
}

impl<M: Serialize + Send + 'static> Shared<M> {
    /// Points the proxy at `host` and flushes the buffer to it, in order.
    fn set_host(&self, node: UniqueAddress, target: Target<M>) {
        let mut p = self.proxy.lock();
        while let Some(m) = p.buffer.pop_front() {
            target.tell(m);
        }
        p.host = Some((node, target));
        p.stale = false;
        drop(p);
        self.publish_host();
    }

    /// Publishes where the proxy sends now ([`SingletonProxy::host`]): its host unless it
    /// has none or waits for it (stale). Computed under the watch's lock, then the proxy's
    /// (the order of `wait_host` predicates that read the proxy), so concurrent publishers
    /// leave the current value, whatever their order.
    fn publish_host(&self) {
        self.host_tx.send_if_modified(|sent| {
            let mut p = self.proxy.lock();
            p.dirty = false;
            let now = match &p.host {
                Some((h, _)) if !p.stale => Some(h.clone()),
                _ => None,
            };
            let changed = *sent != now;
            *sent = now;
            changed
        });
    }

    /// Publishes the host if something under the lock `p` changed it.
    fn publish_if_dirty(&self, p: parking_lot::MutexGuard<'_, ProxyState<M>>) {
        let dirty = p.dirty;
        drop(p);
        if dirty {
            self.publish_host();
        }
    }

    /// Whether the proxy's host is `node` (paused or not).
    fn is_host(&self, node: &UniqueAddress) -> bool {
        self.proxy
            .lock()
            .host
            .as_ref()
            .is_some_and(|(h, _)| h == node)
    }

    /// `node`, the host, announced itself again: send to it (once it is reachable).
    fn confirm_host(&self, node: &UniqueAddress) {
        let mut p = self.proxy.lock();
        if p.stale
            && p.host.as_ref().is_some_and(|(h, _)| h == node)
            && !self.cluster.state().unreachable.contains(node)
        {
            p.stale = false;
            drop(p);
            self.publish_host();
        }
    }

    /// `node`, if it is the host, may not run the instance now (unreachable, or fenced):
    /// buffer until it announces itself again.
    fn pause_host_if(&self, node: &UniqueAddress) {
        let mut p = self.proxy.lock();
        if p.host.as_ref().is_some_and(|(h, _)| h == node) {
            Self::mark_stale(&mut p);
        }
        self.publish_if_dirty(p);
    }

    /// Buffers from now on until the host announces itself again; [`SingletonProxy::host`]
    /// says `None` meanwhile (the proxy sends to no node).
    fn mark_stale(p: &mut ProxyState<M>) {
        if !p.stale {
            p.stale = true;
            p.dirty = true;
        }
    }

    fn clear_host_if(&self, node: &UniqueAddress) {
        let mut p = self.proxy.lock();
        if p.host.as_ref().is_some_and(|(h, _)| h == node) {
            p.host = None;
            drop(p);
            self.publish_host();
        }
    }

    /// Forgets a host that is no longer `Up` in `state`; returns whether the proxy may send
    /// to its host now (known, `Up`, reachable, and announced since it was last unreachable
    /// or fenced).
    fn refresh(&self, p: &mut ProxyState<M>, state: &ClusterState) -> bool {
        let Some((h, _)) = &p.host else {
            return false;
        };
        let up = state
            .member(h)
            .is_some_and(|m| m.status == MemberStatus::Up);
        if !up {
            p.host = None;
            p.dirty = true;
            return false;
        }
        let unreachable = state.unreachable.contains(h);
        if unreachable {
            Self::mark_stale(p);
        }
        !p.stale
    }

    /// Sends the buffered messages if the host can be reached now.
    fn flush(&self, state: &ClusterState) {
        let mut p = self.proxy.lock();
        if self.refresh(&mut p, state) {
            let p = &mut *p;
            if let Some((_, target)) = &p.host {
                while let Some(m) = p.buffer.pop_front() {
                    target.tell(m);
                }
            }
        }
        self.publish_if_dirty(p);
    }
}

/// One cluster singleton as seen from this node: its manager and a source of proxies. How the
/// instance moves and what is buffered meanwhile is described under "Cluster singleton" in
/// the repository's `docs/cluster.md`. Cloning is cheap.
pub struct ClusterSingleton<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Clone for ClusterSingleton<M> {
    fn clone(&self) -> Self {
        ClusterSingleton {
            shared: self.shared.clone(),
        }
    }
}

impl<M> fmt::Debug for ClusterSingleton<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSingleton")
            .field("name", &self.shared.settings.name)
            .field("hosting", &*self.shared.hosting_tx.borrow())
            .field("host", &*self.shared.host_tx.borrow())
            .finish()
    }
}

impl<M> ClusterSingleton<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Starts this node's manager of the singleton `settings.name` (within a tokio runtime):
    /// when this node is the host it spawns the instance from `factory()` and stops it when it
    /// no longer is. Call it on every node that may host it or sends to it; nodes without the
    /// settings' role only route to it.
    pub fn start<A, F>(cluster: &Cluster, settings: SingletonSettings, factory: F) -> Self
    where
        A: Actor<Msg = M>,
        F: Fn() -> Props<A> + Send + Sync + 'static,
    {
        let manager = Manager::new(cluster, settings, factory);
        let shared = manager.shared.clone();
        let rx = inbox::register::<WireMsg>(cluster.remote(), &shared.manager_path, 1024);
        tokio::spawn(manager.run(rx));
        ClusterSingleton { shared }
    }

    /// A proxy that routes to the instance, wherever it runs.
    pub fn proxy(&self) -> SingletonProxy<M> {
        SingletonProxy {
            shared: self.shared.clone(),
        }
    }

    /// `true` while this node runs the instance.
    pub fn is_hosting(&self) -> bool {
        *self.shared.hosting_tx.borrow()
    }

    /// Waits until this node runs the instance (`true`) or no longer does (`false`).
    pub async fn wait_hosting(&self, hosting: bool) {
        let mut rx = self.shared.hosting_tx.subscribe();
        let _ = rx.wait_for(|h| *h == hosting).await;
    }
}

/// Routes messages to the singleton's current instance from any node, buffering while none
/// is known. Cloning is cheap.
pub struct SingletonProxy<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Clone for SingletonProxy<M> {
    fn clone(&self) -> Self {
        SingletonProxy {
            shared: self.shared.clone(),
        }
    }
}

impl<M> fmt::Debug for SingletonProxy<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingletonProxy")
            .field("name", &self.shared.settings.name)
            .field("host", &*self.shared.host_tx.borrow())
            .finish()
    }
}

impl<M> SingletonProxy<M>
where
    M: Serialize + Send + 'static,
{
    /// Sends `msg` to the instance, or buffers it while no instance is known (up to the
    /// proxy's buffer size; see "Cluster singleton" in `docs/cluster.md`). Fails if the
    /// buffer is full or the cluster node stopped.
    pub fn tell(&self, msg: M) -> Result<(), SingletonError> {
        let state = self.shared.cluster.state();
        let mut p = self.shared.proxy.lock();
        let res = self.tell_locked(&mut p, &state, msg);
        self.shared.publish_if_dirty(p);
        res
    }

    fn tell_locked(
        &self,
        p: &mut ProxyState<M>,
        state: &ClusterState,
        msg: M,
    ) -> Result<(), SingletonError> {
        if p.stopped || state.stopped.is_some() {
            return Err(SingletonError::Stopped(self.shared.settings.name.clone()));
        }
        if self.shared.refresh(p, state) {
            if let Some((_, target)) = &p.host {
                while let Some(m) = p.buffer.pop_front() {
                    target.tell(m);
                }
                target.tell(msg);
                return Ok(());
            }
        }
        if p.buffer.len() >= self.shared.settings.buffer_size {
            return Err(SingletonError::BufferFull {
                name: self.shared.settings.name.clone(),
                capacity: self.shared.settings.buffer_size,
            });
        }
        p.buffer.push_back(msg);
        Ok(())
    }

    /// Sends a request built around a fresh [`ReplyTo`] (buffered like [`tell`](Self::tell))
    /// and waits up to `timeout` for the answer. A full buffer fails as
    /// [`AskError::MailboxFull`], a stopped node as [`AskError::Stopped`].
    pub async fn ask<R>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        let (reply_to, rx) = ReplyTo::channel();
        self.tell(make(reply_to)).map_err(|e| match e {
            SingletonError::BufferFull { .. } => AskError::MailboxFull,
            SingletonError::Stopped(_) => AskError::Stopped,
        })?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(AskError::NoReply),
            Err(_) => {
                metrics::counter!("shardik_ask_timeouts_total", "via" => "singleton").increment(1);
                Err(AskError::Timeout(timeout))
            }
        }
    }

    /// The node the proxy sends to now (`None`: it buffers, because no instance is known,
    /// or the host is unreachable or said it stopped its instance for a fence and has not
    /// announced itself since).
    pub fn host(&self) -> Option<UniqueAddress> {
        self.shared.host_tx.borrow().clone()
    }

    /// Messages waiting in the buffer.
    pub fn buffered(&self) -> usize {
        self.shared.proxy.lock().buffer.len()
    }

    /// Waits until `pred` holds for the node the proxy sends to (checked now and after every
    /// change). Wrap it in a timeout.
    pub async fn wait_host(&self, mut pred: impl FnMut(Option<&UniqueAddress>) -> bool) {
        let mut rx = self.shared.host_tx.subscribe();
        let _ = rx.wait_for(|h| pred(h.as_ref())).await;
    }
}

type Factory<A> = Box<dyn Fn() -> Props<A> + Send + Sync>;

struct Manager<A: Actor> {
    shared: Arc<Shared<A::Msg>>,
    factory: Factory<A>,
    instance: Option<ActorRef<A::Msg>>,
    /// This node stopped its instance for a fence, or the instance stopped on its own, and
    /// has not run one since (nor seen another member host): it tells the members so
    /// (`Paused`) on every announcement tick while fenced, and while its restart backoff lasts.
    paused: bool,
    view: SingletonView,
    /// When the current instance was started (to reset the restart backoff).
    started_at: Instant,
    /// The instance stopped on its own: a new one starts (if this node still hosts) no
    /// earlier than this.
    restart_at: Option<Instant>,
    backoff: RestartBackoff,
}

/// The default least and most time between an instance that stopped on its own and the next
/// ([`SingletonSettings::restart_backoff`]).
const RESTART_MIN: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);

/// The wait before a new instance replaces one that stopped on its own: `min`, doubled after
/// every such stop up to `max`, and back to `min` after an instance that ran at least `max`
/// (however it stopped).
#[derive(Debug)]
struct RestartBackoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl RestartBackoff {
    fn new(min: Duration, max: Duration) -> Self {
        RestartBackoff {
            min,
            max,
            next: min,
        }
    }

    /// An instance stopped, however (on its own, for a fence, a hand-over), after running
    /// `ran`: a long run ends the backoff.
    fn on_ended(&mut self, ran: Duration) {
        if ran >= self.max {
            self.next = self.min;
        }
    }

    /// An instance stopped on its own after running `ran`: how long to wait before the next.
    fn on_stopped(&mut self, ran: Duration) -> Duration {
        self.on_ended(ran);
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }
}

impl<A> Manager<A>
where
    A: Actor,
    A::Msg: Serialize + DeserializeOwned + Send + 'static,
{
    /// A manager of the singleton `settings.name` on `cluster`'s node, not running yet.
    fn new<F>(cluster: &Cluster, settings: SingletonSettings, factory: F) -> Self
    where
        F: Fn() -> Props<A> + Send + Sync + 'static,
    {
        let instance_path = format!("/system/singleton/{}", settings.name);
        let manager_path = format!("/system/singleton/{}/manager", settings.name);
        let shared = Arc::new(Shared {
            cluster: cluster.clone(),
            settings,
            instance_path,
            manager_path,
            proxy: Mutex::new(ProxyState {
                host: None,
                stale: false,
                buffer: VecDeque::new(),
                stopped: false,
                dirty: false,
            }),
            host_tx: watch::channel(None).0,
            hosting_tx: watch::channel(false).0,
        });
        let view = SingletonView::new(
            shared.settings.removal_timeout,
            shared.settings.down_margin,
            &[],
        );
        let backoff = RestartBackoff::new(shared.settings.restart_min, shared.settings.restart_max);
        Manager {
            shared,
            factory: Box::new(factory),
            instance: None,
            paused: false,
            view,
            started_at: Instant::now(),
            restart_at: None,
            backoff,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<WireMsg>) {
        let cluster = self.shared.cluster.clone();
        let mut events = cluster.subscribe();
        let mut tick = tokio::time::interval(self.shared.settings.announce_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.view = SingletonView::new(
            self.shared.settings.removal_timeout,
            self.shared.settings.down_margin,
            &events.snapshot.members,
        );
        loop {
            let mut announce = false;
            // The instance may stop on its own (it stopped itself, or its supervisor gave
            // up): `step` then forgets it and starts a new one after a backoff.
            let instance = self.instance.clone();
            let terminated = async {
                match &instance {
                    Some(actor) => actor.terminated().await,
                    None => std::future::pending().await,
                }
            };
            let restart_at = self.restart_at;
            let restart = async {
                match restart_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => announce = true,
                _ = terminated => {}
                _ = restart => {}
                e = events.recv() => match e {
                    Ok(Event::Stopped(_)) | Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    Ok(Event::Cluster(e)) => self.on_event(e),
                    Err(_) => {}
                },
                msg = rx.recv() => match msg {
                    None => break,
                    Some(m) => self.on_wire(m),
                },
            }
            let state = cluster.state();
            if state.stopped.is_some() {
                break;
            }
            self.step(&state, announce).await;
        }
        // Only a node that left gracefully works through the instance's queue: one that was
        // downed, removed or shut down (or whose remoting stopped) is fenced, and the others
        // start a new instance without waiting for it.
        let left = cluster.stopped() == Some(NodeStopReason::Left);
        self.stop_instance(left).await;
        cluster.remote().unregister(&self.shared.manager_path);
        let mut p = self.shared.proxy.lock();
        p.stopped = true;
        p.host = None;
        p.buffer.clear();
        drop(p);
        self.shared.publish_host();
    }

    fn on_event(&mut self, e: ClusterEvent) {
        match &e {
            ClusterEvent::MemberRemoved { node, .. } => self.shared.clear_host_if(node),
            // Whether or not anything was sent meanwhile: it may be fenced on its side.
            ClusterEvent::Unreachable(node) => self.shared.pause_host_if(node),
            ClusterEvent::MemberJoined(m)
            | ClusterEvent::MemberWeaklyUp(m)
            | ClusterEvent::MemberUp(m)
            | ClusterEvent::MemberLeft(m)
            | ClusterEvent::MemberExited(m)
            | ClusterEvent::MemberDowned(m)
                if m.status != MemberStatus::Up =>
            {
                self.shared.clear_host_if(&m.node)
            }
            _ => {}
        }
        self.view.on_event(&e, Instant::now());
    }

    fn on_wire(&mut self, msg: WireMsg) {
        let state = self.shared.cluster.state();
        match msg {
            WireMsg::Hosting(node) => {
                if node == state.self_node {
                    return;
                }
                self.view.on_hosting(&node);
                let up = state
                    .member(&node)
                    .is_some_and(|m| m.status == MemberStatus::Up);
                // The proxy's own host, not what `host()` says: that is `None` while the
                // proxy waits for this very announcement (a paused host), and a paused host
                // is confirmed (sent to again only if reachable), not set anew.
                let known = self.shared.is_host(&node);
                if known {
                    self.shared.confirm_host(&node);
                } else if up {
                    let target = Target::Remote(
                        self.shared
                            .cluster
                            .remote()
                            .lookup(&self.shared.instance_path, &node.address),
                    );
                    self.shared.set_host(node, target);
                }
            }
            WireMsg::HandedOver(node) => {
                self.shared.clear_host_if(&node);
                self.view.on_handed_over(node);
            }
            WireMsg::Paused(node) => self.shared.pause_host_if(&node),
        }
    }

    async fn step(&mut self, state: &ClusterState, announce: bool) {
        let reaped = self.reap_instance(state).await;
        // Once its time has come the backoff is over, whatever the decision (a time left in
        // the past would wake the loop again and again).
        self.restart_at = self.restart_at.filter(|at| Instant::now() < *at);
        self.shared.flush(state);
        let shared = &self.shared;
        let members = self
            .view
            .members(state, Instant::now(), |gone| shared.clear_host_if(gone));
        let role = self.shared.settings.role.as_deref();
        let decision = decide(&members, &state.self_node, role, self.view.handed_over());
        if state.fenced {
            // On this view the resolver would down this node: the other side may start an
            // instance once it has decided, so stop ours now. No `HandedOver`: this node is
            // still the host for the members that can reach it once the fence is lifted.
            if self.instance.is_some() {
                tracing::warn!(
                    singleton = self.shared.settings.name,
                    "node fenced: stopping the singleton instance"
                );
                self.stop_instance(false).await;
                self.paused = true;
                // Proxies elsewhere that can reach this node would send to the stopped
                // instance: they wait for the next `Hosting` instead (this node's own proxy
                // forgot the instance as it stopped). Told at once and again on every
                // announcement tick while fenced, since a copy may be lost; proxies that
                // cannot reach this node wait anyway (an unreachable host is paused).
                self.send_all(state, WireMsg::Paused(state.self_node.clone()));
            } else if self.paused && announce {
                // Also after an instance that stopped on its own (reaped, maybe in this very
                // step, with one copy sent; a review of cd7253e found it was not repeated).
                self.send_all(state, WireMsg::Paused(state.self_node.clone()));
            }
            return;
        }
        match (&decision, self.instance.is_some()) {
            (SingletonDecision::Host, false) => {
                if self.restart_at.is_none() {
                    self.start_instance(state);
                } else if announce {
                    // The proxies wait for the next instance (told again: a copy may be lost).
                    self.send_all(state, WireMsg::Paused(state.self_node.clone()));
                }
            }
            (SingletonDecision::Host, true) => {
                if announce {
                    // This node's own proxy takes the announcement too (one from itself is
                    // not delivered to it).
                    self.shared.confirm_host(&state.self_node);
                    self.send_all(state, WireMsg::Hosting(state.self_node.clone()));
                }
            }
            (_, true) => {
                self.stop_instance(true).await;
                self.send_all(state, WireMsg::HandedOver(state.self_node.clone()));
            }
            (_, false) => {
                // This node was the host without an instance (reaped now, or paused: stopped
                // for a fence or waiting out a restart backoff) and no longer is: it confirms
                // at once that it runs none, as a host that stops its instance does. Otherwise
                // a node that leaves would only confirm on its next tick, which may never
                // come (it can be gone within 100 ms), and the next host would wait for the
                // removal timeout. A node on its way out confirms again on every tick, in case
                // the first confirmation was lost.
                let was_host = reaped || self.paused;
                self.paused = false;
                let leaving = state.self_member().is_none_or(|m| {
                    matches!(m.status, MemberStatus::Leaving | MemberStatus::Exiting)
                });
                if was_host || (announce && leaving) {
                    self.send_all(state, WireMsg::HandedOver(state.self_node.clone()));
                }
            }
        }
        if let SingletonDecision::WaitFor(who) = &decision {
            if announce {
                tracing::debug!(
                    singleton = self.shared.settings.name,
                    ?who,
                    "waiting for hand-over"
                );
            }
        }
    }

    /// Forgets an instance that stopped on its own (not stopped by this manager, which takes
    /// it first): this node no longer runs it, its proxies wait for the next `Hosting`
    /// (`Paused`, like a fenced host, told again on every tick) and a new one starts after a
    /// backoff. Returns whether it did.
    async fn reap_instance(&mut self, state: &ClusterState) -> bool {
        let Some(actor) = self.instance.take_if(|a| a.is_terminated()) else {
            return false;
        };
        let reason = actor.terminated().await.reason;
        self.shared
            .cluster
            .remote()
            .unregister(&self.shared.instance_path);
        self.shared.clear_host_if(&state.self_node);
        self.shared.hosting_tx.send_replace(false);
        let delay = self.backoff.on_stopped(self.started_at.elapsed());
        self.restart_at = Some(Instant::now() + delay);
        // Repeated on every announcement tick until an instance runs again, also while the
        // node is fenced (the first copy may be lost).
        self.paused = true;
        if self.shared.cluster.remote().system().is_shutting_down() {
            tracing::debug!(
                singleton = self.shared.settings.name,
                ?reason,
                "singleton instance stopped with the actor system"
            );
        } else {
            tracing::warn!(
                singleton = self.shared.settings.name,
                ?reason,
                ?delay,
                "singleton instance stopped on its own: starting a new one after a backoff"
            );
        }
        self.send_all(state, WireMsg::Paused(state.self_node.clone()));
        true
    }

    fn start_instance(&mut self, state: &ClusterState) {
        let system = self.shared.cluster.remote().system().clone();
        // A panicking factory must not end the manager: this node would stay the oldest
        // member and no other would ever host. It is tried again on the next step.
        let props = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&self.factory)) {
            Ok(props) => props,
            Err(panic) => {
                let panic = shardik_actor::panic_message(&*panic);
                tracing::error!(singleton = self.shared.settings.name, %panic, "the singleton's props factory panicked; no instance started");
                return;
            }
        };
        let actor = system.spawn_props(props);
        self.shared
            .cluster
            .remote()
            .register(&self.shared.instance_path, actor.clone());
        tracing::info!(singleton = self.shared.settings.name, node = %state.self_node.node_id, "singleton instance started");
        self.instance = Some(actor.clone());
        self.paused = false;
        self.started_at = Instant::now();
        self.shared.hosting_tx.send_replace(true);
        self.shared
            .set_host(state.self_node.clone(), Target::Local(actor));
        self.send_all(state, WireMsg::Hosting(state.self_node.clone()));
    }

    /// Stops the instance; `graceful`: after the messages already queued (a hand-over),
    /// else at once (fenced: the other side may start one soon).
    async fn stop_instance(&mut self, graceful: bool) {
        let Some(actor) = self.instance.take() else {
            return;
        };
        // An instance that ran long enough ends a restart backoff, whatever stops it (one that
        // stops on its own is reaped instead, and counted there).
        self.backoff.on_ended(self.started_at.elapsed());
        let self_node = self.shared.cluster.self_node().clone();
        self.shared.clear_host_if(&self_node);
        self.shared
            .cluster
            .remote()
            .unregister(&self.shared.instance_path);
        if graceful {
            actor.graceful_stop();
            // The queue is worked through for at most half the removal timeout: the other
            // members wait for `HandedOver` only `removal_timeout` after this node is removed,
            // and an instance still busy then would overlap with the new one. After that the
            // instance stops after its current message (the rest are dead letters).
            let grace = self.shared.settings.removal_timeout / 2;
            // Meanwhile the manager's loop does not run: the node may be fenced, downed (an
            // operator may down a leaving node, and the others then start a new instance
            // `down_margin` later, without waiting for `HandedOver`) or stopped for another
            // reason than its leave. Then the instance stops at once too.
            let cluster = self.shared.cluster.clone();
            let must_stop = async {
                let s = cluster.wait_until(must_stop_at_once).await;
                if !must_stop_at_once(&s) {
                    // Only if the state could no longer change: nothing to wait for.
                    std::future::pending::<()>().await;
                }
                s
            };
            tokio::select! {
                _ = actor.terminated() => {}
                _ = tokio::time::sleep(grace) => {
                    tracing::warn!(
                        singleton = self.shared.settings.name,
                        ?grace,
                        "singleton instance still working through its queue: stopping it after its current message"
                    );
                    actor.stop();
                }
                s = must_stop => {
                    tracing::warn!(
                        singleton = self.shared.settings.name,
                        stopped = ?s.stopped,
                        "node fenced, downed or stopped during the hand-over: stopping the singleton instance after its current message"
                    );
                    actor.stop();
                }
            }
        } else {
            actor.stop();
        }
        // A handler cannot be preempted: one that never returns keeps the instance (and this
        // manager) here. Not silently: the other members stop waiting `removal_timeout` after
        // this node is removed, and two instances then overlap.
        let since = Instant::now();
        while tokio::time::timeout(STOP_REPORT_EVERY, actor.terminated())
            .await
            .is_err()
        {
            tracing::error!(
                singleton = self.shared.settings.name,
                waited = ?since.elapsed(),
                "singleton instance does not stop: its current message is still being handled"
            );
        }
        tracing::info!(singleton = self.shared.settings.name, node = %self_node.node_id, "singleton instance stopped");
        self.shared.hosting_tx.send_replace(false);
    }

    fn send_all(&self, state: &ClusterState, msg: WireMsg) {
        for m in &state.members {
            if m.node == state.self_node
                || matches!(m.status, MemberStatus::Down | MemberStatus::Removed)
            {
                continue;
            }
            let to: RemoteRef<WireMsg> = self
                .shared
                .cluster
                .remote()
                .lookup(&self.shared.manager_path, &m.node.address);
            let _ = to.try_tell_control(msg.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(n: u64, status: MemberStatus, up: Option<u64>, roles: &[&str]) -> Member {
        Member {
            node: UniqueAddress::new(format!("10.0.0.{n}:7000"), format!("n{n}"), 1),
            status,
            roles: roles.iter().map(|r| r.to_string()).collect(),
            up_number: up,
        }
    }

    fn none() -> BTreeSet<UniqueAddress> {
        BTreeSet::new()
    }

    /// Settings that would stop the manager (a zero interval panics tokio's `interval`) or
    /// overflow the clock are cut to a range.
    #[test]
    fn settings_are_kept_in_range() {
        let s = SingletonSettings::new("x")
            .announce_interval(Duration::ZERO)
            .removal_timeout(Duration::MAX)
            .down_margin(Duration::MAX);
        assert_eq!(s.announce_interval, Duration::from_millis(1));
        assert_eq!(s.removal_timeout, MAX_SETTING);
        assert_eq!(s.down_margin, MAX_SETTING);
        let s = SingletonSettings::new("x").announce_interval(Duration::MAX);
        assert_eq!(s.announce_interval, MAX_SETTING);
        // A zero backoff would restart a failing instance in a busy loop; a bound below the
        // start is the start.
        let s = SingletonSettings::new("x").restart_backoff(Duration::ZERO, Duration::ZERO);
        assert_eq!(s.restart_min, Duration::from_millis(1));
        assert_eq!(s.restart_max, Duration::from_millis(1));
        let s = SingletonSettings::new("x").restart_backoff(Duration::MAX, Duration::MAX);
        assert_eq!((s.restart_min, s.restart_max), (MAX_SETTING, MAX_SETTING));
        let s = SingletonSettings::new("x");
        assert_eq!((s.restart_min, s.restart_max), (RESTART_MIN, RESTART_MAX));
    }

    /// An instance that stops on its own is replaced after 1 s, then 2, 4, ... up to 30 s
    /// while it keeps stopping soon, and after 1 s again once one ran for 30 s, also one that
    /// was stopped for another reason (a fence, a hand-over).
    #[test]
    fn restart_backoff_doubles_up_to_a_bound_and_resets_after_a_long_run() {
        let mut b = RestartBackoff::new(RESTART_MIN, RESTART_MAX);
        let short = Duration::from_millis(10);
        let delays: Vec<u64> = (0..7).map(|_| b.on_stopped(short).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(b.on_stopped(RESTART_MAX), RESTART_MIN);
        assert_eq!(b.on_stopped(short), 2 * RESTART_MIN);
        // A short run stopped otherwise changes nothing; a long one ends the backoff.
        b.on_ended(short);
        assert_eq!(b.on_stopped(short), 4 * RESTART_MIN);
        b.on_ended(RESTART_MAX);
        assert_eq!(b.on_stopped(short), RESTART_MIN);
    }

    /// An instance of the manager tests: it stops itself on any message.
    struct Quitter;

    impl Actor for Quitter {
        type Msg = ();
        async fn handle(
            &mut self,
            _: (),
            ctx: &mut shardik_actor::Context<Self>,
        ) -> Result<(), shardik_actor::ActorError> {
            ctx.stop();
            Ok(())
        }
    }

    /// Two nodes of one cluster, `a` (formed it: the oldest) and `b`; a manager on `a` that
    /// the test steps itself with states it chooses (it does not run); and what `b` is told
    /// by that manager.
    struct Rig {
        systems: Vec<shardik_actor::ActorSystem>,
        a: Cluster,
        manager: Manager<Quitter>,
        to_b: mpsc::Receiver<WireMsg>,
    }

    impl Rig {
        async fn new(settings: SingletonSettings) -> Rig {
            use super::super::ClusterConfig;
            let config = |id: &str| {
                ClusterConfig::new("unit", id)
                    .secret(b"singleton unit tests, a secret of 32 bytes or more".to_vec())
            };
            let systems = vec![
                shardik_actor::ActorSystem::new("a"),
                shardik_actor::ActorSystem::new("b"),
            ];
            let a = Cluster::start(&systems[0], config("a")).await.unwrap();
            let seed = a.self_node().address.clone();
            let b = Cluster::start(&systems[1], config("b").seed_nodes([seed]))
                .await
                .unwrap();
            let both = [a.self_node().clone(), b.self_node().clone()];
            for c in [&a, &b] {
                let up = c.wait_until(|s| s.all_up(&both));
                tokio::time::timeout(Duration::from_secs(20), up)
                    .await
                    .expect("both nodes up");
            }
            let manager = Manager::new(&a, settings, || Props::new(|| Quitter));
            let to_b = inbox::register(b.remote(), &manager.shared.manager_path, 64);
            Rig {
                systems,
                a,
                manager,
                to_b,
            }
        }

        /// `a`'s state, fenced or not.
        fn state(&self, fenced: bool) -> ClusterState {
            let mut s = self.a.state();
            assert_eq!(
                decide(&s.members, &s.self_node, None, &none()),
                SingletonDecision::Host
            );
            s.fenced = fenced;
            s
        }

        /// The instance stops itself; returns once it has.
        async fn instance_stops_itself(&self) {
            let actor = self.manager.instance.clone().expect("an instance runs");
            actor.tell(());
            actor.terminated().await;
        }

        /// The next message `b` got: `what` from `a`.
        async fn b_is_told(&mut self, what: &str) {
            let a = self.a.self_node().clone();
            let next = tokio::time::timeout(Duration::from_secs(10), self.to_b.recv()).await;
            match next {
                Ok(Some(WireMsg::Hosting(n))) if what == "Hosting" && n == a => {}
                Ok(Some(WireMsg::Paused(n))) if what == "Paused" && n == a => {}
                Ok(Some(WireMsg::HandedOver(n))) if what == "HandedOver" && n == a => {}
                other => panic!("b was to be told {what} by a, got {other:?}"),
            }
        }

        async fn end(self) {
            for s in &self.systems {
                if let Some(c) = Cluster::get(s) {
                    c.shutdown().await;
                }
                s.shutdown().await;
            }
        }
    }

    /// An instance that stops on its own while its node is fenced, or before (during the
    /// restart backoff), is not running for the proxies that reach the node: the node tells
    /// them `Paused` on every announcement tick while fenced, not once (a review of cd7253e
    /// found the fenced branch repeated it only for an instance it had stopped itself, so a
    /// proxy that lost the one copy sent to the dead path until the fence lifted).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paused_is_told_on_every_tick_while_fenced_after_an_instance_stopped_on_its_own() {
        // No restart within the test.
        let settings = SingletonSettings::new("q").restart_backoff(MAX_SETTING, MAX_SETTING);
        let mut rig = Rig::new(settings).await;
        let (up, fenced) = (rig.state(false), rig.state(true));
        rig.manager.step(&up, false).await;
        rig.b_is_told("Hosting").await;
        // Reaped in the step that first sees the fence.
        rig.instance_stops_itself().await;
        rig.manager.step(&fenced, false).await;
        rig.b_is_told("Paused").await;
        rig.manager.step(&fenced, true).await;
        rig.b_is_told("Paused").await;
        // Fence lifted, still in the backoff: told on every tick; fenced again: still told.
        rig.manager.step(&up, true).await;
        rig.b_is_told("Paused").await;
        rig.manager.step(&fenced, true).await;
        rig.b_is_told("Paused").await;
        assert!(rig.manager.instance.is_none());
        rig.end().await;
    }

    /// `a`'s state with `a` leaving: `b` is the oldest `Up` member.
    fn leaving(rig: &Rig) -> ClusterState {
        let mut s = rig.a.state();
        let me = s.self_node.clone();
        for m in s.members.iter_mut().filter(|m| m.node == me) {
            m.status = MemberStatus::Leaving;
        }
        assert!(matches!(
            decide(&s.members, &me, None, &none()),
            SingletonDecision::NotOldest(Some(_))
        ));
        s
    }

    /// A host whose instance stopped on its own confirms the hand-over (`HandedOver`) in the
    /// step that sees it leave, not only on the next tick: whether the instance is reaped in
    /// that very step, or stopped earlier and the node waits out the restart backoff (found
    /// while testing the review of cd7253e: a leave is over within 100 ms, before any tick, and
    /// the next host waited for the removal timeout).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_without_an_instance_that_leaves_confirms_the_hand_over_at_once() {
        let settings = SingletonSettings::new("q").restart_backoff(MAX_SETTING, MAX_SETTING);
        let mut rig = Rig::new(settings).await;
        let (up, leaving) = (rig.state(false), leaving(&rig));
        // Reaped in the step that first sees the leave.
        rig.manager.step(&up, false).await;
        rig.b_is_told("Hosting").await;
        rig.instance_stops_itself().await;
        rig.manager.step(&leaving, false).await;
        rig.b_is_told("Paused").await;
        rig.b_is_told("HandedOver").await;
        // Reaped before, waiting out the backoff when the leave is seen.
        rig.manager.restart_at = None;
        rig.manager.step(&up, false).await;
        rig.b_is_told("Hosting").await;
        rig.instance_stops_itself().await;
        rig.manager.step(&up, false).await;
        rig.b_is_told("Paused").await;
        rig.manager.step(&leaving, false).await;
        rig.b_is_told("HandedOver").await;
        rig.end().await;
    }

    /// An instance that ran for the backoff's bound ends a restart backoff also when the
    /// manager stops it (here for a fence): the next one that stops on its own soon is
    /// replaced after the least wait (a review of cd7253e found only a long run ended by the
    /// instance itself reset it, so a crash after an hour-long run that a fence ended waited
    /// the longest wait).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_run_ends_the_restart_backoff_however_the_instance_stopped() {
        let (min, max) = (Duration::from_millis(10), Duration::from_millis(200));
        let settings = SingletonSettings::new("q").restart_backoff(min, max);
        let mut rig = Rig::new(settings).await;
        let (up, fenced) = (rig.state(false), rig.state(true));
        rig.manager.step(&up, false).await;
        assert!(rig.manager.instance.is_some());
        // As after a crash loop.
        rig.manager.backoff.next = max;
        tokio::time::sleep(max).await;
        rig.manager.step(&fenced, false).await;
        assert!(rig.manager.instance.is_none(), "stopped for the fence");
        rig.manager.step(&up, false).await;
        assert!(rig.manager.instance.is_some(), "started again, no backoff");
        rig.instance_stops_itself().await;
        rig.manager.step(&up, false).await;
        assert!(rig.manager.restart_at.is_some() || rig.manager.instance.is_some());
        assert_eq!(
            rig.manager.backoff.next,
            2 * min,
            "the stop after a short run waited {min:?}, not {max:?}"
        );
        rig.end().await;
    }

    /// During a hand-over the instance stops at once when the node is fenced (a `Down` node
    /// is) or stopped for any reason but a graceful leave.
    #[test]
    fn only_a_graceful_leave_lets_the_instance_work_through_its_queue() {
        let me = member(1, MemberStatus::Leaving, Some(1), &[]);
        let mut s = ClusterState::empty(me.node.clone());
        s.members = vec![me];
        assert!(!must_stop_at_once(&s));
        s.fenced = true;
        assert!(must_stop_at_once(&s));
        // A stopped node is always fenced.
        s.stopped = Some(NodeStopReason::Left);
        assert!(!must_stop_at_once(&s));
        for reason in [
            NodeStopReason::Downed,
            NodeStopReason::Removed,
            NodeStopReason::Shutdown,
            NodeStopReason::SystemShutdown,
            NodeStopReason::RemoteStopped,
            NodeStopReason::DriverFailed,
        ] {
            s.stopped = Some(reason);
            assert!(must_stop_at_once(&s), "{reason:?}");
        }
    }

    #[test]
    fn oldest_up_member_hosts_by_up_number_not_address() {
        let a = member(1, MemberStatus::Up, Some(3), &[]);
        let b = member(2, MemberStatus::Up, Some(1), &[]);
        let c = member(3, MemberStatus::Up, Some(2), &[]);
        let ms = [a.clone(), b.clone(), c.clone()];
        assert_eq!(decide(&ms, &b.node, None, &none()), SingletonDecision::Host);
        assert_eq!(
            decide(&ms, &a.node, None, &none()),
            SingletonDecision::NotOldest(Some(b.node.clone()))
        );
        assert_eq!(
            decide(&ms, &c.node, None, &none()),
            SingletonDecision::NotOldest(Some(b.node.clone()))
        );
    }

    #[test]
    fn joining_and_weakly_up_members_never_host() {
        let a = member(1, MemberStatus::Joining, None, &[]);
        let b = member(2, MemberStatus::WeaklyUp, None, &[]);
        let ms = [a.clone(), b.clone()];
        assert_eq!(
            decide(&ms, &a.node, None, &none()),
            SingletonDecision::NotOldest(None)
        );
        assert_eq!(
            decide(&ms, &b.node, None, &none()),
            SingletonDecision::NotOldest(None)
        );
    }

    #[test]
    fn role_restricts_the_candidates_and_the_blockers() {
        let a = member(1, MemberStatus::Up, Some(1), &[]);
        let b = member(2, MemberStatus::Up, Some(2), &["backend"]);
        let c = member(3, MemberStatus::Up, Some(3), &["backend"]);
        let ms = [a.clone(), b.clone(), c.clone()];
        let role = Some("backend");
        assert_eq!(decide(&ms, &b.node, role, &none()), SingletonDecision::Host);
        assert_eq!(
            decide(&ms, &a.node, role, &none()),
            SingletonDecision::NotOldest(Some(b.node.clone()))
        );
        // An older member without the role leaving does not block.
        let ms = [a.with_status(MemberStatus::Leaving).unwrap(), b.clone()];
        assert_eq!(decide(&ms, &b.node, role, &none()), SingletonDecision::Host);
    }

    #[test]
    fn leaving_host_blocks_until_it_handed_over() {
        let a = member(1, MemberStatus::Leaving, Some(1), &[]);
        let b = member(2, MemberStatus::Up, Some(2), &[]);
        let c = member(3, MemberStatus::Up, Some(3), &[]);
        let ms = [a.clone(), b.clone(), c.clone()];
        assert_eq!(
            decide(&ms, &b.node, None, &none()),
            SingletonDecision::WaitFor(vec![a.node.clone()])
        );
        assert_eq!(
            decide(&ms, &c.node, None, &none()),
            SingletonDecision::NotOldest(Some(b.node.clone()))
        );
        let done = BTreeSet::from([a.node.clone()]);
        assert_eq!(decide(&ms, &b.node, None, &done), SingletonDecision::Host);
        // Exiting (or a removed member passed as Exiting) blocks the same way.
        let ms = [a.with_status(MemberStatus::Exiting).unwrap(), b.clone()];
        assert_eq!(
            decide(&ms, &b.node, None, &none()),
            SingletonDecision::WaitFor(vec![a.node.clone()])
        );
        // A younger leaving member does not block.
        let d = member(4, MemberStatus::Leaving, Some(4), &[]);
        let ms = [b.clone(), d];
        assert_eq!(decide(&ms, &b.node, None, &none()), SingletonDecision::Host);
    }

    #[test]
    fn unreachable_host_stays_until_down_then_next_oldest_hosts() {
        let a = member(1, MemberStatus::Up, Some(1), &[]);
        let b = member(2, MemberStatus::Up, Some(2), &[]);
        // Unreachable is not a status: a stays the oldest Up member.
        let ms = [a.clone(), b.clone()];
        assert_eq!(
            decide(&ms, &b.node, None, &none()),
            SingletonDecision::NotOldest(Some(a.node.clone()))
        );
        let ms = [a.with_status(MemberStatus::Down).unwrap(), b.clone()];
        assert_eq!(decide(&ms, &b.node, None, &none()), SingletonDecision::Host);
        assert_eq!(
            decide(&ms, &a.node, None, &none()),
            SingletonDecision::NotOldest(Some(b.node.clone()))
        );
    }

    #[test]
    fn at_most_one_host_in_any_shared_view() {
        // Every combination of statuses of three members: in one view, at most one decides Host.
        use MemberStatus::*;
        let statuses = [Joining, WeaklyUp, Up, Leaving, Exiting, Down];
        for s1 in statuses {
            for s2 in statuses {
                for s3 in statuses {
                    let ms: Vec<Member> = [(1, s1), (2, s2), (3, s3)]
                        .into_iter()
                        .map(|(n, s)| {
                            let up = (!matches!(s, Joining | WeaklyUp)).then_some(n);
                            member(n, s, up, &[])
                        })
                        .collect();
                    let hosts = ms
                        .iter()
                        .filter(|m| decide(&ms, &m.node, None, &none()) == SingletonDecision::Host)
                        .count();
                    assert!(hosts <= 1, "{ms:?}");
                }
            }
        }
    }
}
