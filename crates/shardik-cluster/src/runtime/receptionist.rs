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
//! Every node runs one receptionist, started with the node by [`Cluster::start`]
//! ([`Receptionist::get`] returns it). Each node **owns its own entries**: the actors
//! registered on it. It makes each of them reachable at a path of its own
//! (`/system/receptionist/<incarnation>/<n>`, so that a process restarted on the same address
//! never answers for the entries of the one before) and pushes the whole set of its entries,
//! with a version that grows on every change, to every other member on the remote **control
//! lane** (`/system/receptionist`): at once after a change, after every membership change,
//! and again every [`push_interval`](Receptionist::PUSH_INTERVAL) as anti-entropy (so a
//! joining node, or a lost message, is repaired within that time). A node on which nothing
//! was ever registered sends nothing. A set too large for one message goes in **chunks** of
//! at most half the frame limit ([`RemoteConfig::max_frame_len`](shardik_remote::RemoteConfig::max_frame_len),
//! at most 1 MiB), each with the version, its number and the number of chunks. A receiver
//! keeps, per origin node (address, node id and incarnation), the entries of the highest
//! version it has seen complete: the chunks of a version are put together apart (a newer
//! version starts over, an older one is ignored) and replace the origin's set only once all
//! are in. There is no merge to get wrong: each origin's set is replaced as a whole. A chunk
//! that could not be queued is counted (`shardik_receptionist_push_failures_total`) and
//! logged, and sent again with the next push.
//!
//! Entries disappear:
//! - on [`deregister`](Receptionist::deregister), and when the registered actor stops (the
//!   receptionist watches it), on its own node at once and on the others with the next push;
//! - on every survivor, when their origin node is `Exiting`, `Down` or removed: as soon as
//!   the event saying so is handled (a crashed node is dropped once it is `Down`, about
//!   4.1-4.3 s after the crash with the defaults; while it is only unreachable its entries
//!   stay listed, as Akka does);
//! - a message from a node that is not (or no longer) a live member is ignored, so a late
//!   message cannot bring a dead node's entries back.
//!
//! A listing names its origin itself (the remote layer does not tell a receiver which
//! connection a message came on), so a message whose entries are not all registrations of
//! that origin (paths under `/system/receptionist/<its incarnation>/`) is refused as a whole
//! (logged at debug level): a peer cannot list another node's arbitrary actors under a key.
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
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardik_actor::{ActorId, ActorRef, AskError, ReplyTo};
use shardik_remote::{decode_payload, RemoteRef, SendError};
use tokio::sync::{watch, Notify};

use super::cluster::{Cluster, ClusterState, Event, Subscription};
use crate::events::ClusterEvent;
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

/// A node's entries, or one chunk of them, pushed to the other members.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireListing {
    from: UniqueAddress,
    version: u64,
    /// Which chunk of the version's entries this is, from 0.
    #[serde(default)]
    chunk: u32,
    /// How many chunks the version was cut into. Nodes of earlier releases send neither
    /// field: 0 counts as 1 (the whole listing in one message).
    #[serde(default)]
    chunks: u32,
    entries: Vec<WireEntry>,
}

/// The chunks of one version of a listing, while they arrive.
struct Assembly {
    version: u64,
    chunks: u32,
    parts: BTreeMap<u32, Vec<WireEntry>>,
}

struct LocalEntry {
    wire: WireEntry,
    /// The size of `wire` in the payload format: what it adds to a chunk.
    wire_len: usize,
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
    /// Per origin, the chunks of the one version of its listing being put together (a newer
    /// version replaces it; it replaces the origin's set only once complete).
    assembling: HashMap<UniqueAddress, Assembly>,
    /// Origins this node saw `Exiting`, `Down` or removed in an event: their listings are
    /// refused, also while the cluster's state still shows them live (events are published
    /// just before the state). Forgotten once the state no longer holds them.
    gone: HashSet<UniqueAddress>,
    /// The receptionist stopped: nothing is taken any more.
    closed: bool,
}

impl Inner {
    /// Takes a listing message (checked by [`check`]) from a live origin; returns whether
    /// the origin's set changed.
    fn take(&mut self, msg: WireListing) -> bool {
        let WireListing {
            from,
            version,
            chunk,
            chunks,
            entries,
        } = msg;
        if self.closed || self.gone.contains(&from) {
            return false;
        }
        if self.remote.get(&from).is_some_and(|(v, _)| *v >= version) {
            return false;
        }
        let chunks = chunks.max(1);
        let entries = if chunks == 1 {
            if self
                .assembling
                .get(&from)
                .is_some_and(|a| a.version <= version)
            {
                self.assembling.remove(&from);
            }
            entries
        } else {
            let a = self.assembling.entry(from.clone()).or_insert(Assembly {
                version,
                chunks,
                parts: BTreeMap::new(),
            });
            if a.version > version {
                return false; // a newer version is being put together
            }
            if a.version < version || a.chunks != chunks {
                *a = Assembly {
                    version,
                    chunks,
                    parts: BTreeMap::new(),
                };
            }
            a.parts.insert(chunk, entries);
            if a.parts.len() < chunks as usize {
                return false;
            }
            let a = self.assembling.remove(&from).expect("looked at above");
            a.parts.into_values().flatten().collect()
        };
        let changed = self
            .remote
            .get(&from)
            .is_none_or(|(_, old)| *old != entries);
        self.remote.insert(from, (version, entries));
        changed
    }
}

struct Shared {
    cluster: Cluster,
    inner: Mutex<Inner>,
    /// Bumped on every change of the listing of any key.
    changed: watch::Sender<u64>,
    /// Wakes the task to push this node's entries now.
    push: Notify,
    stopped: AtomicBool,
    /// Chunks of this node's listing that could not be queued for a member (rate-limits the
    /// warnings; the metric counts them by reason).
    push_failures: AtomicU64,
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
            .field("assembling", &inner.assembling.len())
            .finish()
    }
}

impl Receptionist {
    /// How often each node pushes its entries to every member even without a change.
    pub const PUSH_INTERVAL: Duration = Duration::from_millis(500);

    /// The receptionist of `cluster`'s node, started by [`Cluster::start`] (so that every
    /// node has the endpoint the others push to, and knows their entries before it first
    /// looks). A node sends nothing until something is registered on it.
    pub fn get(cluster: &Cluster) -> Receptionist {
        let system = cluster.remote().system().clone();
        let slot = system.extension(|_| Slot(OnceLock::new()));
        slot.0
            .get_or_init(|| Receptionist::start(cluster.clone()))
            .clone()
    }

    fn start(cluster: Cluster) -> Receptionist {
        let shared = Arc::new(Shared {
            cluster,
            inner: Mutex::new(Inner {
                version: 1,
                ..Inner::default()
            }),
            changed: watch::channel(0).0,
            push: Notify::new(),
            stopped: AtomicBool::new(false),
            push_failures: AtomicU64::new(0),
        });
        // No queue: each message is taken into the receptionist's state on the connection's
        // reader as it is decoded (a check and a move, or a comparison once a listing is
        // complete), so what is held is one listing plus one being put together per origin,
        // never a backlog of listings of up to a frame each. Weak: the registration is
        // kept by the remote layer, which the receptionist holds.
        let weak = Arc::downgrade(&shared);
        shared.cluster.remote().register_decoder(
            PATH,
            Arc::new(move |bytes: &[u8]| {
                let msg: WireListing = decode_payload(bytes)?;
                if let Some(shared) = weak.upgrade() {
                    receive(&shared, msg);
                }
                Ok(())
            }),
        );
        // Subscribed here, not in the task: no event published after `start` is missed.
        let events = shared.cluster.subscribe();
        tokio::spawn(run(shared.clone(), events));
        Receptionist { shared }
    }

    /// Registers `actor` under `key`: it is listed cluster-wide until it is deregistered,
    /// stops, or this node leaves or is downed. Registering the same actor twice under the
    /// same key lists it twice. A key name so long that one entry would not fit in half a
    /// frame ([`RemoteConfig::max_frame_len`](shardik_remote::RemoteConfig::max_frame_len))
    /// cannot be sent to the other nodes: such a registration is refused with an error in
    /// the log.
    pub fn register<M>(&self, key: &ServiceKey<M>, actor: ActorRef<M>)
    where
        M: Serialize + DeserializeOwned + Send + 'static,
    {
        let remote = self.shared.cluster.remote();
        let budget = chunk_budget(&self.shared.cluster);
        let (_id, path) = {
            let mut inner = self.shared.inner.lock();
            inner.next_id += 1;
            let id = inner.next_id;
            // The incarnation in the path: a process restarted on the same address numbers
            // its registrations from 1 again, and refs to the old process's entries (listed
            // until it is `Down`, or kept by a client) must not reach the new one's services.
            let incarnation = self.shared.cluster.self_node().incarnation;
            let path = format!("{PATH}/{incarnation}/{id}");
            let wire = WireEntry {
                key: key.name().to_string(),
                type_tag: ServiceKey::<M>::type_tag().to_string(),
                path: path.clone(),
            };
            let wire_len = remote.payload_format().encode(&wire).map_or(
                wire.key.len() + wire.type_tag.len() + wire.path.len(),
                |b| b.len(),
            );
            if wire_len > budget {
                tracing::error!(
                    key_len = key.name().len(),
                    entry_bytes = wire_len,
                    max = budget,
                    "service not registered: its entry would not fit in a message to the other nodes"
                );
                return;
            }
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
                    wire,
                    wire_len,
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

/// Drops the entries (and listings being put together) of origins that are no longer live;
/// returns whether any entries were dropped.
fn prune(inner: &mut Inner, state: &ClusterState) -> bool {
    let before = inner.remote.len();
    inner.remote.retain(|node, _| is_live(state, node));
    inner.assembling.retain(|node, _| is_live(state, node));
    inner.gone.retain(|node| state.member(node).is_some());
    before != inner.remote.len()
}

/// The most bytes of entries one chunk of a listing carries: half the frame limit (the rest
/// is room for the message around them), at most 1 MiB (a chunk shares the control lane with
/// gossip and heartbeats, which wait behind it).
fn chunk_budget(cluster: &Cluster) -> usize {
    (cluster.max_frame_len() / 2).min(1 << 20)
}

/// This node's listing, cut into chunks of at most `budget` bytes of entries (an empty
/// listing is one empty chunk).
fn chunked(inner: &Inner, from: &UniqueAddress, budget: usize) -> Vec<WireListing> {
    let mut parts: Vec<Vec<WireEntry>> = vec![Vec::new()];
    let mut size = 0;
    for e in inner.local.values() {
        // One byte more per entry: a separator in text formats.
        let len = e.wire_len + 1;
        let last = parts.last_mut().expect("never empty");
        if size + len > budget && !last.is_empty() {
            parts.push(Vec::new());
            size = 0;
        }
        size += len;
        parts.last_mut().expect("never empty").push(e.wire.clone());
    }
    let chunks = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    parts
        .into_iter()
        .enumerate()
        .map(|(i, entries)| WireListing {
            from: from.clone(),
            version: inner.version,
            chunk: i as u32,
            chunks,
            entries,
        })
        .collect()
}

fn push_all(shared: &Shared, state: &ClusterState) {
    let chunks = {
        let inner = shared.inner.lock();
        if inner.version == 1 {
            // Nothing was ever registered here: the others have nothing of this node to
            // replace (a restarted process is another origin).
            return;
        }
        chunked(&inner, &state.self_node, chunk_budget(&shared.cluster))
    };
    for m in &state.members {
        if m.node != state.self_node && is_live(state, &m.node) {
            let to: RemoteRef<WireListing> = shared.cluster.remote().lookup(PATH, &m.node.address);
            for chunk in &chunks {
                if let Err(e) = to.try_tell_control(chunk.clone()) {
                    // The rest would not complete the version either; the next push
                    // repairs it (a receiver keeps the chunks it got of a version).
                    push_failed(shared, &m.node, &e);
                    break;
                }
            }
        }
    }
}

/// Counts a chunk that could not be queued for `to`, and logs it (the first ten, then every
/// thousandth).
fn push_failed(shared: &Shared, to: &UniqueAddress, e: &SendError) {
    let node = &shared.cluster.self_node().node_id;
    let reason = match e {
        SendError::QueueFull(_) => "queue_full",
        SendError::TooLarge { .. } => "too_large",
        SendError::Encode(_) => "encode",
        SendError::ShutDown => "shut_down",
    };
    metrics::counter!(
        "shardik_receptionist_push_failures_total",
        "node" => node.clone(),
        "reason" => reason
    )
    .increment(1);
    let n = shared.push_failures.fetch_add(1, Ordering::Relaxed) + 1;
    if matches!(e, SendError::ShutDown) {
        tracing::debug!(node = %node, to = %to, "receptionist listing not sent: {e}");
    } else if n <= 10 || n.is_multiple_of(1000) {
        tracing::warn!(
            node = %node,
            to = %to,
            total = n,
            "receptionist listing not sent (the next push retries): {e}"
        );
    }
}

/// Why a listing message is refused whoever its origin: a chunk number out of range, or an
/// entry whose path is not one of the origin's registrations
/// (`/system/receptionist/<incarnation>/<n>`), so that a listing naming an origin can only
/// ever point at that origin's own registrations.
fn check(msg: &WireListing) -> Result<(), String> {
    let chunks = msg.chunks.max(1);
    if msg.chunk >= chunks {
        return Err(format!("chunk {} of {chunks}", msg.chunk));
    }
    let prefix = format!("{PATH}/{}/", msg.from.incarnation);
    for e in &msg.entries {
        let own = e
            .path
            .strip_prefix(&prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !own {
            let shown: String = e.path.chars().take(64).collect();
            return Err(format!(
                "entry path {shown:?} is not a registration of the origin (under {prefix})"
            ));
        }
    }
    Ok(())
}

/// Takes a received listing message, on the reader of the connection it came on.
fn receive(shared: &Shared, msg: WireListing) {
    let live = {
        let state = shared.cluster.shared.state.borrow();
        state.stopped.is_none() && msg.from != state.self_node && is_live(&state, &msg.from)
    };
    if !live {
        return;
    }
    if let Err(why) = check(&msg) {
        tracing::debug!(
            from = %msg.from,
            version = msg.version,
            "receptionist listing refused: {why}"
        );
        return;
    }
    if shared.inner.lock().take(msg) {
        shared.bump();
    }
}

/// The member an event says is `Exiting`, `Down` or removed.
fn gone_in(event: &ClusterEvent) -> Option<&UniqueAddress> {
    match event {
        ClusterEvent::MemberExited(m) | ClusterEvent::MemberDowned(m) => Some(&m.node),
        ClusterEvent::MemberRemoved { node, .. } => Some(node),
        _ => None,
    }
}

/// Drops `node`'s entries at once and refuses its listings from now on.
fn forget(shared: &Shared, node: &UniqueAddress) {
    let dropped = {
        let mut inner = shared.inner.lock();
        inner.gone.insert(node.clone());
        inner.assembling.remove(node);
        inner.remote.remove(node).is_some()
    };
    if dropped {
        shared.bump();
    }
}

async fn run(shared: Arc<Shared>, mut events: Subscription) {
    let cluster = shared.cluster.clone();
    let mut tick = tokio::time::interval(Receptionist::PUSH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.push.notified() => {}
            e = events.recv() => match e {
                Ok(Event::Stopped(_)) | Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                // The event comes before the state that shows it: a member that is gone is
                // taken from the event itself.
                Ok(Event::Cluster(ev)) => {
                    if let Some(node) = gone_in(&ev) {
                        forget(&shared, node);
                    }
                }
                Err(_) => {}
            },
        }
        let state = cluster.state();
        if state.stopped.is_some() {
            break;
        }
        if prune(&mut shared.inner.lock(), &state) {
            shared.bump();
        }
        push_all(&shared, &state);
    }
    cluster.remote().unregister(PATH);
    {
        let mut inner = shared.inner.lock();
        inner.closed = true;
        inner.remote.clear();
        inner.assembling.clear();
    }
    shared.stopped.store(true, Ordering::Release);
    shared.bump();
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use shardik_actor::ActorSystem;
    use shardik_remote::{Remote, RemoteConfig};

    use super::*;
    use crate::member::Member;
    use crate::runtime::ClusterConfig;

    const SECRET: &[u8] = b"receptionist unit test secret, 32 bytes";

    #[derive(Serialize, Deserialize)]
    struct Ping;

    fn up(node: &UniqueAddress) -> Member {
        Member {
            node: node.clone(),
            status: MemberStatus::Up,
            roles: BTreeSet::new(),
            up_number: Some(1),
        }
    }

    /// A node whose cluster state the test publishes (no driver), with `b` an `Up` member
    /// besides itself, and its receptionist.
    async fn node_with_member(b: &UniqueAddress) -> (ActorSystem, Cluster, Receptionist) {
        let system = ActorSystem::new("a");
        let cluster = Cluster::without_driver(
            &system,
            ClusterConfig::new("t", "a").secret(SECRET.to_vec()),
        )
        .await;
        let mut state = ClusterState::empty(cluster.self_node().clone());
        state.members = vec![up(cluster.self_node()), up(b)];
        cluster.shared.publish(Some(state), Vec::new());
        let receptionist = Receptionist::get(&cluster);
        (system, cluster, receptionist)
    }

    fn listing(from: &UniqueAddress, version: u64, paths: &[String]) -> WireListing {
        WireListing {
            from: from.clone(),
            version,
            chunk: 0,
            chunks: 1,
            entries: paths
                .iter()
                .map(|p| WireEntry {
                    key: "ping".into(),
                    type_tag: ServiceKey::<Ping>::type_tag().into(),
                    path: p.clone(),
                })
                .collect(),
        }
    }

    fn paths(l: &Listing<Ping>) -> Vec<String> {
        l.refs().iter().map(|r| r.path().to_string()).collect()
    }

    /// Any connected peer can send a listing in another member's name. It can no longer
    /// point that member's entries at paths that are not the member's own registrations
    /// (an arbitrary actor of it, which would then get the service's messages): such a
    /// listing is refused as a whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_with_paths_outside_its_origins_registrations_is_refused() {
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        let (system, cluster, receptionist) = node_with_member(&b).await;
        let key = ServiceKey::<Ping>::new("ping");
        let forger_system = ActorSystem::new("forger");
        let forger = Remote::start(
            &forger_system,
            RemoteConfig::new("t", "forger").secret(SECRET.to_vec()),
        )
        .await
        .unwrap();
        let to: RemoteRef<WireListing> = forger.lookup(PATH, cluster.remote().addr());
        let forged = vec![
            "/system/receptionist/77/1".to_string(),
            "/user/admin".to_string(),
        ];
        to.try_tell_control(listing(&b, 5, &forged)).unwrap();
        let other_incarnation = vec!["/system/receptionist/76/1".to_string()];
        to.try_tell_control(listing(&b, 6, &other_incarnation))
            .unwrap();
        // Then a well-formed one: on the same connection, it arrives after the others.
        let own = vec!["/system/receptionist/77/2".to_string()];
        to.try_tell_control(listing(&b, 7, &own)).unwrap();
        let mut sub = receptionist.subscribe(&key);
        let mut seen = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let l = sub.recv().await.unwrap();
                seen.push(paths(&l));
                if !l.is_empty() {
                    break;
                }
            }
        })
        .await
        .expect("the well-formed listing arrives");
        assert_eq!(seen.last().unwrap(), &own);
        assert!(
            seen.iter().all(|p| p.is_empty() || *p == own),
            "a refused listing was listed: {seen:?}"
        );
        forger.shutdown().await;
        cluster.remote().shutdown().await;
        system.shutdown().await;
        forger_system.shutdown().await;
    }

    /// Events are published just before the state that shows them: a member's entries go
    /// as soon as its `MemberDowned` is handled, while the state still shows it `Up` (before,
    /// they stayed until a later state showed it), and a listing of it arriving meanwhile is
    /// refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_downed_members_entries_go_with_its_event_before_the_state_shows_it() {
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        let (system, cluster, receptionist) = node_with_member(&b).await;
        let key = ServiceKey::<Ping>::new("ping");
        receive(
            &receptionist.shared,
            listing(&b, 2, &["/system/receptionist/77/1".to_string()]),
        );
        assert_eq!(receptionist.find(&key).len(), 1);
        let mut sub = receptionist.subscribe(&key);
        assert_eq!(sub.recv().await.unwrap().len(), 1);
        let mut downed = up(&b);
        downed.status = MemberStatus::Down;
        cluster.shared.publish(
            None,
            vec![Event::Cluster(ClusterEvent::MemberDowned(downed))],
        );
        let l = tokio::time::timeout(Duration::from_secs(3), sub.recv())
            .await
            .expect("dropped on the event, without a state showing it")
            .unwrap();
        assert!(l.is_empty());
        assert!(is_live(&cluster.state(), &b), "the state still shows it Up");
        receive(
            &receptionist.shared,
            listing(&b, 3, &["/system/receptionist/77/2".to_string()]),
        );
        assert!(receptionist.find(&key).is_empty());
        cluster.remote().shutdown().await;
        system.shutdown().await;
    }

    /// A listing cut into chunks replaces the origin's set only once every chunk of one
    /// version is in; chunks of an older version than the one being put together are
    /// ignored, and a newer version starts over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_replace_the_set_only_when_a_version_is_complete() {
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        let (system, cluster, receptionist) = node_with_member(&b).await;
        let key = ServiceKey::<Ping>::new("ping");
        let p = |n: u32| format!("/system/receptionist/77/{n}");
        let chunk = |version: u64, chunk: u32, chunks: u32, path: String| WireListing {
            chunk,
            chunks,
            ..listing(&b, version, &[path])
        };
        let found = || paths(&receptionist.find(&key));
        receive(&receptionist.shared, listing(&b, 2, &[p(1)]));
        assert_eq!(found(), [p(1)]);
        receive(&receptionist.shared, chunk(4, 0, 2, p(10)));
        assert_eq!(found(), [p(1)], "half of version 4");
        // Version 3 is older than the one being put together, even complete.
        receive(&receptionist.shared, chunk(3, 1, 2, p(9)));
        receive(&receptionist.shared, chunk(3, 0, 2, p(8)));
        assert_eq!(found(), [p(1)]);
        // Version 5 starts over: version 4's first chunk is not mixed into it.
        receive(&receptionist.shared, chunk(5, 1, 2, p(21)));
        receive(&receptionist.shared, chunk(4, 1, 2, p(11)));
        assert_eq!(found(), [p(1)]);
        receive(&receptionist.shared, chunk(5, 0, 2, p(20)));
        assert_eq!(found(), [p(20), p(21)]);
        // Out of range: refused.
        receive(&receptionist.shared, chunk(6, 2, 2, p(30)));
        receive(&receptionist.shared, chunk(6, 0, 1, p(31)));
        assert_eq!(found(), [p(31)]);
        cluster.remote().shutdown().await;
        system.shutdown().await;
    }
}
