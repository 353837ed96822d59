//! The [`Receptionist`]: actors registered under typed [`ServiceKey`]s, found from any node.
//!
//! ```no_run
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::{ActorRef, ReplyTo};
//! use shardik_cluster::runtime::{Cluster, Receptionist, ServiceKey};
//!
//! #[derive(Serialize, Deserialize)]
//! enum PingMsg {
//!     Ping(ReplyTo<String>),
//! }
//!
//! # async fn run(cluster: Cluster, pinger: ActorRef<PingMsg>) {
//! let key = ServiceKey::<PingMsg>::new("pinger");
//! let receptionist = Receptionist::get(&cluster);
//! receptionist.register(&key, pinger);            // on one node
//!
//! // On any node of the cluster:
//! let mut sub = Receptionist::get(&cluster).subscribe(&key);
//! while let Some(listing) = sub.recv().await {
//!     for service in listing.refs() {
//!         let pong = service.ask(PingMsg::Ping, Duration::from_secs(1)).await;
//!         println!("{} answered {pong:?}", service.node());
//!     }
//! }
//! # }
//! ```
//!
//! ## Model
//! Every node runs one receptionist ([`Receptionist::get`] starts it on first use). Each node
//! **owns its own entries**: the actors registered on it. It makes each of them reachable at a
//! path of its own (`/system/receptionist/<incarnation>/<n>`, so that a process restarted on
//! the same address never answers for the entries of the one before) and pushes the whole set of its entries, with
//! a version that grows on every change, to every other member on the remote **control
//! lane** (`/system/receptionist`): at once after a change, after every membership change,
//! and again every [`push_interval`](Receptionist::PUSH_INTERVAL) as anti-entropy (so a
//! joining node, or a lost message, is repaired within that time). A receiver keeps, per
//! origin node (address, node id and incarnation), the entries of the highest version it has
//! seen. There is no merge to get wrong: each origin's set is replaced as a whole.
//!
//! Entries disappear:
//! - on [`deregister`](Receptionist::deregister), and when the registered actor stops (the
//!   receptionist watches it), on its own node at once and on the others with the next push;
//! - on every survivor, when their origin node is `Exiting`, `Down` or removed (a crashed node
//!   is dropped as soon as it is `Down`, about 4.5 s after the crash with the defaults; while
//!   it is only unreachable its entries stay listed, as Akka does);
//! - a message from a node that is not (or no longer) a live member is ignored, so a late
//!   message cannot bring a dead node's entries back.
//!
//! So all nodes converge on the same listing after joins, leaves and crashes, within one push
//! interval after the membership converged.
//!
//! ## Types
//! A [`ServiceKey<M>`] is a name and a message type. Entries carry the name of the message
//! type (`std::any::type_name::<M>()`), and [`find`](Receptionist::find) with a
//! `ServiceKey<M>` returns only entries registered with the same `M`: a key name reused for
//! another type yields two disjoint services, never refs of the wrong type. (Every node must
//! run a build where `M` has the same type name, which holds for the same code.)
//!
//! A [`ServiceRef`] is the local `ActorRef` for an actor of this node and a `RemoteRef` for
//! one on another node; both [`tell`](ServiceRef::tell) and [`ask`](ServiceRef::ask) alike.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardik_actor::{ActorId, ActorRef, AskError, ReplyTo};
use shardik_remote::RemoteRef;
use tokio::sync::{watch, Notify};

use super::cluster::{Cluster, ClusterState, Event};
use super::inbox;
use crate::member::{MemberStatus, UniqueAddress};

/// The path of every node's receptionist endpoint.
const PATH: &str = "/system/receptionist";

/// A typed name of a service: actors registered under it accept messages of type `M`.
pub struct ServiceKey<M> {
    name: Arc<str>,
    _msg: PhantomData<fn(M)>,
}

impl<M> ServiceKey<M> {
    /// The key named `name` for actors that take `M`.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        ServiceKey {
            name: name.into(),
            _msg: PhantomData,
        }
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn type_tag() -> &'static str {
        std::any::type_name::<M>()
    }
}

impl<M> Clone for ServiceKey<M> {
    fn clone(&self) -> Self {
        ServiceKey {
            name: self.name.clone(),
            _msg: PhantomData,
        }
    }
}

impl<M> fmt::Debug for ServiceKey<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceKey({:?}: {})", self.name, Self::type_tag())
    }
}

enum Target<M> {
    Local(ActorRef<M>),
    Remote(RemoteRef<M>),
}

/// One registered actor, as [`Receptionist::find`] lists it: where it is and how to reach it.
pub struct ServiceRef<M> {
    node: UniqueAddress,
    path: Arc<str>,
    target: Target<M>,
}

impl<M> Clone for ServiceRef<M> {
    fn clone(&self) -> Self {
        ServiceRef {
            node: self.node.clone(),
            path: self.path.clone(),
            target: match &self.target {
                Target::Local(a) => Target::Local(a.clone()),
                Target::Remote(r) => Target::Remote(r.clone()),
            },
        }
    }
}

impl<M> fmt::Debug for ServiceRef<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceRef")
            .field("node", &self.node)
            .field("path", &self.path)
            .field("local", &matches!(self.target, Target::Local(_)))
            .finish()
    }
}

impl<M> ServiceRef<M>
where
    M: Serialize + Send + 'static,
{
    /// The node the actor runs on.
    pub fn node(&self) -> &UniqueAddress {
        &self.node
    }

    /// The path the actor is reachable at on its node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `true` if the actor runs on this node.
    pub fn is_local(&self) -> bool {
        matches!(self.target, Target::Local(_))
    }

    /// Sends `msg` without waiting (at most once; an undeliverable message is a dead letter).
    pub fn tell(&self, msg: M) {
        match &self.target {
            Target::Local(a) => a.tell(msg),
            Target::Remote(r) => r.tell(msg),
        }
    }

    /// Sends a request built around a fresh [`ReplyTo`] and waits up to `timeout` for the
    /// answer.
    pub async fn ask<R>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        match &self.target {
            Target::Local(a) => a.ask(make, timeout).await,
            Target::Remote(r) => r.ask(make, timeout).await,
        }
    }
}

/// The actors registered under one key, cluster-wide, ordered by node then path.
pub struct Listing<M> {
    key: Arc<str>,
    refs: Vec<ServiceRef<M>>,
}

impl<M> Clone for Listing<M> {
    fn clone(&self) -> Self {
        Listing {
            key: self.key.clone(),
            refs: self.refs.clone(),
        }
    }
}

impl<M> fmt::Debug for Listing<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listing")
            .field("key", &self.key)
            .field("refs", &self.refs)
            .finish()
    }
}

impl<M> Listing<M> {
    /// The key's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The registered actors.
    pub fn refs(&self) -> &[ServiceRef<M>] {
        &self.refs
    }

    /// How many actors are registered.
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    /// `true` if none is.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// The nodes of the registered actors (one per actor, so a node may repeat).
    pub fn nodes(&self) -> Vec<UniqueAddress> {
        self.refs.iter().map(|r| r.node.clone()).collect()
    }

    fn ids(&self) -> Vec<(UniqueAddress, Arc<str>)> {
        self.refs
            .iter()
            .map(|r| (r.node.clone(), r.path.clone()))
            .collect()
    }
}

/// One entry as it travels between nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct WireEntry {
    key: String,
    type_tag: String,
    path: String,
}

/// A node's entries, pushed to the other members.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireListing {
    from: UniqueAddress,
    version: u64,
    entries: Vec<WireEntry>,
}

struct LocalEntry {
    wire: WireEntry,
    actor_id: ActorId,
    /// The `ActorRef<M>` of the entry's type.
    actor: Box<dyn Any + Send + Sync>,
    /// The task that removes the entry when the actor stops; ended with the entry.
    watcher: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    version: u64,
    local: BTreeMap<u64, LocalEntry>,
    remote: HashMap<UniqueAddress, (u64, Vec<WireEntry>)>,
}

struct Shared {
    cluster: Cluster,
    inner: Mutex<Inner>,
    /// Bumped on every change of the listing of any key.
    changed: watch::Sender<u64>,
    /// Wakes the task to push this node's entries now.
    push: Notify,
    stopped: AtomicBool,
}

impl Shared {
    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }
}

struct Slot(OnceLock<Receptionist>);

/// The receptionist of a cluster node: how registrations spread and when listings change is
/// described under "Receptionist" in the repository's `docs/cluster.md`. Cloning is cheap.
#[derive(Clone)]
pub struct Receptionist {
    shared: Arc<Shared>,
}

impl fmt::Debug for Receptionist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.inner.lock();
        f.debug_struct("Receptionist")
            .field("node", self.shared.cluster.self_node())
            .field("local_entries", &inner.local.len())
            .field("remote_nodes", &inner.remote.len())
            .finish()
    }
}

impl Receptionist {
    /// How often each node pushes its entries to every member even without a change.
    pub const PUSH_INTERVAL: Duration = Duration::from_millis(500);

    /// The receptionist of `cluster`'s node, started on the first call (within a tokio
    /// runtime). Every node that registers or looks up services calls it; a node that never
    /// does still needs it started to list the services of the others.
    pub fn get(cluster: &Cluster) -> Receptionist {
        let system = cluster.remote().system().clone();
        let slot = system.extension(|_| Slot(OnceLock::new()));
        slot.0
            .get_or_init(|| Receptionist::start(cluster.clone()))
            .clone()
    }

    fn start(cluster: Cluster) -> Receptionist {
        let rx = inbox::register::<WireListing>(cluster.remote(), PATH, 1024);
        let shared = Arc::new(Shared {
            cluster,
            inner: Mutex::new(Inner {
                version: 1,
                ..Inner::default()
            }),
            changed: watch::channel(0).0,
            push: Notify::new(),
            stopped: AtomicBool::new(false),
        });
        tokio::spawn(run(shared.clone(), rx));
        Receptionist { shared }
    }

    /// Registers `actor` under `key`: it is listed cluster-wide until it is deregistered,
    /// stops, or this node leaves or is downed. Registering the same actor twice under the
    /// same key lists it twice.
    pub fn register<M>(&self, key: &ServiceKey<M>, actor: ActorRef<M>)
    where
        M: Serialize + DeserializeOwned + Send + 'static,
    {
        let remote = self.shared.cluster.remote();
        let (_id, path) = {
            let mut inner = self.shared.inner.lock();
            inner.next_id += 1;
            let id = inner.next_id;
            // The incarnation in the path: a process restarted on the same address numbers
            // its registrations from 1 again, and refs to the old process's entries (listed
            // until it is `Down`, or kept by a client) must not reach the new one's services.
            let incarnation = self.shared.cluster.self_node().incarnation;
            let path = format!("{PATH}/{incarnation}/{id}");
            remote.register(&path, actor.clone());
            let weak = Arc::downgrade(&self.shared);
            let watched = actor.clone();
            // On the actor system's runtime: `register` may be called from any thread.
            let watcher = remote
                .system()
                .runtime()
                .spawn(async move {
                    watched.terminated().await;
                    if let Some(shared) = weak.upgrade() {
                        remove_local(&shared, |eid, _| eid == id);
                    }
                })
                .abort_handle();
            inner.local.insert(
                id,
                LocalEntry {
                    wire: WireEntry {
                        key: key.name().to_string(),
                        type_tag: ServiceKey::<M>::type_tag().to_string(),
                        path: path.clone(),
                    },
                    actor_id: actor.id(),
                    actor: Box::new(actor),
                    watcher,
                },
            );
            inner.version += 1;
            (id, path)
        };
        tracing::debug!(key = key.name(), path, "service registered");
        self.shared.bump();
        self.shared.push.notify_one();
    }

    /// Removes every registration of `actor` under `key`. Returns `true` if there was one.
    pub fn deregister<M>(&self, key: &ServiceKey<M>, actor: &ActorRef<M>) -> bool
    where
        M: Send + 'static,
    {
        let tag = ServiceKey::<M>::type_tag();
        let id = actor.id();
        remove_local(&self.shared, |_, e| {
            e.actor_id == id && e.wire.key == key.name() && e.wire.type_tag == tag
        })
    }

    /// The actors currently registered under `key` on all members, as this node knows them.
    pub fn find<M>(&self, key: &ServiceKey<M>) -> Listing<M>
    where
        M: Serialize + Send + 'static,
    {
        let tag = ServiceKey::<M>::type_tag();
        let self_node = self.shared.cluster.self_node().clone();
        let remote = self.shared.cluster.remote();
        let inner = self.shared.inner.lock();
        let mut refs = Vec::new();
        for e in inner.local.values() {
            if e.wire.key != key.name() || e.wire.type_tag != tag {
                continue;
            }
            if let Some(a) = e.actor.downcast_ref::<ActorRef<M>>() {
                refs.push(ServiceRef {
                    node: self_node.clone(),
                    path: e.wire.path.as_str().into(),
                    target: Target::Local(a.clone()),
                });
            }
        }
        for (node, (_, entries)) in &inner.remote {
            for e in entries {
                if e.key == key.name() && e.type_tag == tag {
                    refs.push(ServiceRef {
                        node: node.clone(),
                        path: e.path.as_str().into(),
                        target: Target::Remote(remote.lookup(&e.path, &node.address)),
                    });
                }
            }
        }
        refs.sort_by(|a, b| (&a.node, &a.path).cmp(&(&b.node, &b.path)));
        Listing {
            key: key.name.clone(),
            refs,
        }
    }

    /// A stream of the listings of `key`: the current one first, then a new one after every
    /// change of it.
    pub fn subscribe<M>(&self, key: &ServiceKey<M>) -> ListingSubscription<M>
    where
        M: Serialize + Send + 'static,
    {
        ListingSubscription {
            receptionist: self.clone(),
            key: key.clone(),
            rx: self.shared.changed.subscribe(),
            last: None,
        }
    }
}

/// Changes of one key's listing ([`Receptionist::subscribe`]).
pub struct ListingSubscription<M> {
    receptionist: Receptionist,
    key: ServiceKey<M>,
    rx: watch::Receiver<u64>,
    last: Option<Vec<(UniqueAddress, Arc<str>)>>,
}

impl<M> fmt::Debug for ListingSubscription<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListingSubscription")
            .field("key", &self.key)
            .finish()
    }
}

impl<M> ListingSubscription<M>
where
    M: Serialize + Send + 'static,
{
    /// The next listing that differs from the last one returned (the first call returns the
    /// current listing at once). Intermediate listings may be skipped when several changes
    /// happen quickly; the last one is always delivered. `None` once the receptionist
    /// stopped (its cluster node stopped).
    pub async fn recv(&mut self) -> Option<Listing<M>> {
        loop {
            self.rx.borrow_and_update();
            let listing = self.receptionist.find(&self.key);
            let ids = listing.ids();
            if self.last.as_ref() != Some(&ids) {
                self.last = Some(ids);
                return Some(listing);
            }
            if self.receptionist.shared.stopped.load(Ordering::Acquire) {
                return None;
            }
            self.rx.changed().await.ok()?;
        }
    }
}

fn remove_local(shared: &Shared, pred: impl Fn(u64, &LocalEntry) -> bool) -> bool {
    let removed: Vec<String> = {
        let mut inner = shared.inner.lock();
        let ids: Vec<u64> = inner
            .local
            .iter()
            .filter(|(id, e)| pred(**id, e))
            .map(|(id, _)| *id)
            .collect();
        let removed: Vec<String> = ids
            .iter()
            .filter_map(|id| inner.local.remove(id))
            .map(|e| {
                // A deregistered entry's watcher would otherwise hold the actor's ref (and a
                // task) until the actor stops: register/deregister cycles piled them up.
                e.watcher.abort();
                e.wire.path
            })
            .collect();
        if !removed.is_empty() {
            inner.version += 1;
        }
        removed
    };
    for path in &removed {
        shared.cluster.remote().unregister(path);
    }
    if removed.is_empty() {
        return false;
    }
    shared.bump();
    shared.push.notify_one();
    true
}

/// `true` if entries from `node` are accepted and kept: it is a member that is not `Exiting`,
/// `Down` or removed.
fn is_live(state: &ClusterState, node: &UniqueAddress) -> bool {
    state.member(node).is_some_and(|m| {
        !matches!(
            m.status,
            MemberStatus::Exiting | MemberStatus::Down | MemberStatus::Removed
        )
    })
}

/// Drops the entries of origins that are no longer live; returns whether any were dropped.
fn prune(inner: &mut Inner, state: &ClusterState) -> bool {
    let before = inner.remote.len();
    inner.remote.retain(|node, _| is_live(state, node));
    before != inner.remote.len()
}

fn push_all(shared: &Shared, state: &ClusterState) {
    let msg = {
        let inner = shared.inner.lock();
        WireListing {
            from: state.self_node.clone(),
            version: inner.version,
            entries: inner.local.values().map(|e| e.wire.clone()).collect(),
        }
    };
    for m in &state.members {
        if m.node != state.self_node && is_live(state, &m.node) {
            let to: RemoteRef<WireListing> = shared.cluster.remote().lookup(PATH, &m.node.address);
            let _ = to.try_tell_control(msg.clone());
        }
    }
}

async fn run(shared: Arc<Shared>, mut rx: tokio::sync::mpsc::Receiver<WireListing>) {
    let cluster = shared.cluster.clone();
    let mut events = cluster.subscribe();
    let mut tick = tokio::time::interval(Receptionist::PUSH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut push = false;
        tokio::select! {
            _ = tick.tick() => push = true,
            _ = shared.push.notified() => push = true,
            e = events.recv() => match e {
                Ok(Event::Stopped(_)) | Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                Ok(Event::Cluster(_)) | Err(_) => push = true,
            },
            msg = rx.recv() => {
                let Some(msg) = msg else { break };
                let state = cluster.state();
                if msg.from == state.self_node || !is_live(&state, &msg.from) {
                    continue;
                }
                let changed = {
                    let mut inner = shared.inner.lock();
                    match inner.remote.get(&msg.from) {
                        Some((v, _)) if *v >= msg.version => false,
                        Some((_, old)) if *old == msg.entries => {
                            inner.remote.insert(msg.from, (msg.version, msg.entries));
                            false
                        }
                        _ => {
                            inner.remote.insert(msg.from, (msg.version, msg.entries));
                            true
                        }
                    }
                };
                if changed {
                    shared.bump();
                }
            }
        }
        let state = cluster.state();
        if state.stopped.is_some() {
            break;
        }
        if prune(&mut shared.inner.lock(), &state) {
            shared.bump();
        }
        if push {
            push_all(&shared, &state);
        }
    }
    cluster.remote().unregister(PATH);
    shared.inner.lock().remote.clear();
    shared.stopped.store(true, Ordering::Release);
    shared.bump();
}
