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
//! never answers for the entries of the one before). Its entries have a version that grows on
//! every change; the receptionists talk on the remote **control lane**
//! (`/system/receptionist`), with the messages of one enum (`WireMsg`):
//! - after a change, a node pushes the whole set of its entries, at the new version, to every
//!   other member;
//! - every [`PUSH_INTERVAL`](Receptionist::PUSH_INTERVAL), and after every membership change,
//!   it sends every member only its version ("at version V"; the origin is an incarnation, so
//!   a restarted process is another origin);
//! - a member that does not hold that version complete (it joined later, or a message was
//!   lost) asks the origin for its listing, at most once per interval for a version, and the
//!   origin sends the whole set to that member alone, at most once per interval per member.
//!
//! So an unchanged listing is not sent again, however large, and a joining node, or a lost
//! message, is repaired within a push interval. A node on which nothing was ever registered
//! sends nothing. A set too large for one message goes in **chunks** of at most half the
//! frame limit ([`RemoteConfig::max_frame_len`](shardik_remote::RemoteConfig::max_frame_len),
//! at most 1 MiB), each with the version, its number and the number of chunks; a set needing
//! more chunks than the control queue (`RemoteConfig::control_queue`) holds is not sent
//! (counted and logged). A receiver keeps, per origin node (address, node id and
//! incarnation), the entries of the highest version it has seen complete: the chunks of a
//! version are put together apart (a newer version starts over, an older one is ignored) and
//! replace the origin's set only once all are in. There is no merge to get wrong: each
//! origin's set is replaced as a whole. It refuses (and stops putting together) a listing of
//! more chunks than its control queue holds, or of more bytes of entries than that many
//! chunks carry. A chunk that could not be queued is counted
//! (`shardik_receptionist_push_failures_total`) and logged; the member asks again after the
//! next version message.
//!
//! A node of an earlier release decodes listings (of one chunk; of a listing in chunks it
//! keeps the first, having no chunk fields) but not the version and request messages, which
//! its remote layer drops as undecodable: in a rolling upgrade it gets only the listings
//! pushed after changes.
//!
//! Entries disappear:
//! - on [`deregister`](Receptionist::deregister), and when the registered actor stops (the
//!   receptionist watches it), on its own node at once and on the others with the push of
//!   the change;
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
//! (counted in `shardik_receptionist_listings_refused_total`, logged at debug level): a peer
//! cannot list another node's arbitrary actors under a key.
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

/// Every message of the receptionist protocol, all sent to [`PATH`] on the control lane.
///
/// A listing goes untagged, as the bare [`WireListing`] that nodes of earlier releases send
/// and decode; the others are tagged (`{"At": {..}}`): an earlier release, missing the
/// listing's fields in them, drops them as undecodable (counted in
/// `shardik_remote_decode_errors_total`).
#[derive(Clone, Debug, Serialize, Deserialize)]
enum WireMsg {
    /// "My listing is at `version`": what a node sends every member every push interval and
    /// after a membership change, instead of its listing. A member that does not hold that
    /// version complete answers with [`Request`](WireMsg::Request).
    At { from: UniqueAddress, version: u64 },
    /// "Send me your listing": answered with all its chunks, at most once per push interval
    /// per requester.
    Request { from: UniqueAddress },
    /// A node's entries, or one chunk of them: sent to every member after a change of them,
    /// and to a member that asked.
    #[serde(untagged)]
    Listing(WireListing),
}

impl WireMsg {
    /// The node that sent the message (its origin, or the member asking).
    fn sender(&self) -> &UniqueAddress {
        match self {
            WireMsg::At { from, .. } | WireMsg::Request { from } => from,
            WireMsg::Listing(l) => &l.from,
        }
    }
}

/// A node's entries, or one chunk of them.
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
    /// The bytes of entries in `parts` ([`entry_bytes`]).
    bytes: usize,
}

/// What a listing received may hold, from this node's settings: no more chunks than the
/// control queue holds (a listing of more could never be queued whole), and no more bytes
/// of entries than that many chunks carry ([`chunk_budget`]). A listing over either is
/// refused as a whole.
#[derive(Clone, Copy, Debug, Default)]
struct Limits {
    max_chunks: u32,
    max_bytes: usize,
}

impl Limits {
    fn of(cluster: &Cluster) -> Limits {
        let max_chunks = u32::try_from(cluster.control_queue().max(1)).unwrap_or(u32::MAX);
        Limits {
            max_chunks,
            max_bytes: (max_chunks as usize).saturating_mul(chunk_budget(cluster)),
        }
    }
}

/// The bytes an entry counts for against [`Limits::max_bytes`]: those of its strings, less
/// than its encoded size (which the sender cuts chunks by), so that no listing a node sends
/// is over the limit of a node with the same settings.
fn entry_bytes(entries: &[WireEntry]) -> usize {
    entries
        .iter()
        .map(|e| e.key.len() + e.type_tag.len() + e.path.len())
        .sum()
}

/// Why a listing message was refused: the `reason` label of
/// `shardik_receptionist_listings_refused_total`, and what to log.
struct Refused {
    reason: &'static str,
    detail: String,
}

struct LocalEntry {
    wire: WireEntry,
    /// The size of `wire` in the payload format: what it adds to a chunk.
    wire_len: usize,
    /// Larger than a chunk: listed on this node only, never sent.
    local_only: bool,
    actor_id: ActorId,
    /// The `ActorRef<M>` of the entry's type.
    actor: Box<dyn Any + Send + Sync>,
    /// The task that removes the entry when the actor stops; ended with the entry.
    watcher: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// The version of this node's entries: 1 until something is registered, then one more
    /// on every change.
    version: u64,
    /// The version last sent to every member (after a change).
    pushed: u64,
    /// A version of this node's entries found to need more chunks than the control queue
    /// holds: never sent, so never announced either (members would ask for it every
    /// interval).
    unsendable: Option<u64>,
    local: BTreeMap<u64, LocalEntry>,
    /// Members that asked for this node's listing, not yet answered.
    requests: HashSet<UniqueAddress>,
    /// Per member, the push interval (tick number) it was last answered a request in: at
    /// most one full listing per interval on request.
    served: HashMap<UniqueAddress, u64>,
    /// Per origin, the version last asked of it and when: asked again only once a push
    /// interval passed, or for a newer version.
    asked: HashMap<UniqueAddress, (u64, std::time::Instant)>,
    /// Per origin, the version of its listing last refused for being over this node's
    /// [`Limits`] (a node with a larger `control_queue` or `max_frame_len`): not asked for
    /// again, since the origin would send the same listing every interval, until it
    /// announces a newer version.
    refused: HashMap<UniqueAddress, u64>,
    limits: Limits,
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
    /// the origin's set changed, or why the message was refused.
    fn take(&mut self, msg: WireListing) -> Result<bool, Refused> {
        let WireListing {
            from,
            version,
            chunk,
            chunks,
            entries,
        } = msg;
        if self.closed || self.gone.contains(&from) {
            return Ok(false);
        }
        if self.remote.get(&from).is_some_and(|(v, _)| *v >= version) {
            return Ok(false);
        }
        let chunks = chunks.max(1);
        let limits = self.limits;
        // Refused once, refused again: not asked for until a newer version is announced.
        let taken = self.assemble(&from, version, chunk, chunks, entries, limits);
        if taken.is_err() {
            // The newest refused: a late chunk of an older version does not bring it down.
            let refused = self.refused.entry(from).or_insert(version);
            *refused = (*refused).max(version);
        }
        taken
    }

    /// [`take`](Self::take) of a listing message within this node's limits from a live
    /// origin holding no version as recent.
    fn assemble(
        &mut self,
        from: &UniqueAddress,
        version: u64,
        chunk: u32,
        chunks: u32,
        entries: Vec<WireEntry>,
        limits: Limits,
    ) -> Result<bool, Refused> {
        if chunks > limits.max_chunks {
            if self
                .assembling
                .get(from)
                .is_some_and(|a| a.version <= version)
            {
                self.assembling.remove(from);
            }
            return Err(Refused {
                reason: "too_many_chunks",
                detail: format!(
                    "{chunks} chunks, more than the control queue holds ({})",
                    limits.max_chunks
                ),
            });
        }
        let too_large = |bytes: usize| Refused {
            reason: "too_large",
            detail: format!(
                "more than {} bytes of entries ({bytes} so far)",
                limits.max_bytes
            ),
        };
        let bytes = entry_bytes(&entries);
        let entries = if chunks == 1 {
            if self
                .assembling
                .get(from)
                .is_some_and(|a| a.version <= version)
            {
                self.assembling.remove(from);
            }
            if bytes > limits.max_bytes {
                return Err(too_large(bytes));
            }
            entries
        } else {
            let a = self.assembling.entry(from.clone()).or_insert(Assembly {
                version,
                chunks,
                parts: BTreeMap::new(),
                bytes: 0,
            });
            if a.version > version {
                return Ok(false); // a newer version is being put together
            }
            if a.version < version || a.chunks != chunks {
                *a = Assembly {
                    version,
                    chunks,
                    parts: BTreeMap::new(),
                    bytes: 0,
                };
            }
            let replaced = a.parts.get(&chunk).map_or(0, |p| entry_bytes(p));
            let total = a.bytes - replaced + bytes;
            if total > limits.max_bytes {
                self.assembling.remove(from);
                return Err(too_large(total));
            }
            a.bytes = total;
            a.parts.insert(chunk, entries);
            if a.parts.len() < chunks as usize {
                return Ok(false);
            }
            let a = self.assembling.remove(from).expect("looked at above");
            a.parts.into_values().flatten().collect()
        };
        self.asked.remove(from);
        self.refused.remove(from);
        let changed = self.remote.get(from).is_none_or(|(_, old)| *old != entries);
        self.remote.insert(from.clone(), (version, entries));
        Ok(changed)
    }

    /// Whether to ask `from`, which says its listing is at `version`, for it: not if this
    /// node holds that version (or a later one) complete, nor if it asked for it less than a
    /// push interval ago.
    fn wants(&mut self, from: &UniqueAddress, version: u64, now: std::time::Instant) -> bool {
        if self.closed || self.gone.contains(from) {
            return false;
        }
        if self.remote.get(from).is_some_and(|(v, _)| *v >= version) {
            return false;
        }
        if self.refused.get(from).is_some_and(|v| *v >= version) {
            return false;
        }
        if self.asked.get(from).is_some_and(|(v, at)| {
            *v >= version && now.duration_since(*at) < Receptionist::PUSH_INTERVAL
        }) {
            return false;
        }
        self.asked.insert(from.clone(), (version, now));
        true
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
    /// Listings refused for being over [`Limits`] (rate-limits the warnings).
    refusals: AtomicU64,
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
    /// How often each node tells every member the version of its entries (a member missing
    /// it asks for them); the entries themselves go only after a change, and on request.
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
        let limits = Limits::of(&cluster);
        let shared = Arc::new(Shared {
            cluster,
            inner: Mutex::new(Inner {
                version: 1,
                pushed: 1,
                limits,
                ..Inner::default()
            }),
            changed: watch::channel(0).0,
            push: Notify::new(),
            stopped: AtomicBool::new(false),
            push_failures: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        });
        // No queue: each message is taken into the receptionist's state on the connection's
        // reader as it is decoded (a check and a move, or a comparison once a listing is
        // complete; a version message may queue a request, a request wakes the task), so
        // what is held is one listing plus one being put together (within `Limits`) per
        // origin, never a backlog of listings of up to a frame each. Weak: the registration is
        // kept by the remote layer, which the receptionist holds.
        let weak = Arc::downgrade(&shared);
        shared.cluster.remote().register_decoder(
            PATH,
            Arc::new(move |bytes: &[u8]| {
                let msg: WireMsg = decode_payload(bytes)?;
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
    /// same key lists it twice. A key name so long that one entry would not fit in a chunk
    /// (half of [`RemoteConfig::max_frame_len`](shardik_remote::RemoteConfig::max_frame_len),
    /// at most 1 MiB) cannot be sent to the other nodes: such a registration is listed on
    /// this node only, with an error in the log.
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
            let local_only = wire_len > budget;
            if local_only {
                tracing::error!(
                    key_len = key.name().len(),
                    entry_bytes = wire_len,
                    max = budget,
                    "service registered on this node only: its entry would not fit in a \
                     message to the other nodes, which will not list it"
                );
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
                    local_only,
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
    inner.asked.retain(|node, _| is_live(state, node));
    inner.refused.retain(|node, _| is_live(state, node));
    inner.requests.retain(|node| is_live(state, node));
    inner.served.retain(|node, _| is_live(state, node));
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
    for e in inner.local.values().filter(|e| !e.local_only) {
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

/// Counts a message of this node's receptionist queued for a member, by `kind`:
/// `change_chunk`, `requested_chunk`, `version`, `request`.
fn count_sent(shared: &Shared, kind: &'static str, n: usize) {
    metrics::counter!(
        "shardik_receptionist_sent_total",
        "node" => shared.cluster.self_node().node_id.clone(),
        "kind" => kind
    )
    .increment(n as u64);
}

/// Queues `chunks` for `to` on the control lane; `kind` says why (`change_chunk` or
/// `requested_chunk`). Stops at the first that cannot be queued: the rest would not
/// complete the version either, and the member asks again after the next version message.
fn send_chunks(shared: &Shared, to: &UniqueAddress, chunks: &[WireListing], kind: &'static str) {
    let remote: RemoteRef<WireMsg> = shared.cluster.remote().lookup(PATH, &to.address);
    let mut sent = 0;
    for chunk in chunks {
        if let Err(e) = remote.try_tell_control(WireMsg::Listing(chunk.clone())) {
            push_failed(shared, to, send_error_reason(&e), &e);
            break;
        }
        sent += 1;
    }
    count_sent(shared, kind, sent);
}

/// What this node sends after waking up (`tick` is the number of the push interval; `announce`
/// is set on a tick and on a cluster event): after a change of its entries, their new
/// version to every live member; otherwise the listing to each member that asked for it (at
/// most once per push interval each), and, if `announce`, its version to every live member.
/// A node on which nothing was ever registered sends nothing: the others have nothing of it
/// to replace (a restarted process is another origin).
fn send(shared: &Shared, state: &ClusterState, tick: u64, announce: bool) {
    let (version, changed, requesters, chunks) = {
        let mut inner = shared.inner.lock();
        let version = inner.version;
        // Nothing registered ever, or a listing too large to send: nothing to announce.
        if version == 1 || inner.unsendable == Some(version) {
            inner.requests.clear();
            return;
        }
        let changed = inner.pushed != version;
        let mut requesters = Vec::new();
        if changed {
            // Every member gets the new version: what they asked for is superseded.
            inner.pushed = version;
            inner.requests.clear();
        } else {
            let Inner {
                requests, served, ..
            } = &mut *inner;
            requests.retain(|r| {
                if !is_live(state, r) {
                    return false;
                }
                if served.get(r) == Some(&tick) {
                    return true; // answered in this interval already: in the next one
                }
                served.insert(r.clone(), tick);
                requesters.push(r.clone());
                false
            });
        }
        let chunks = if changed || !requesters.is_empty() {
            chunked(&inner, &state.self_node, chunk_budget(&shared.cluster))
        } else {
            Vec::new()
        };
        if chunks.len() > inner.limits.max_chunks as usize {
            let e = format!(
                "{} chunks, more than the control queue holds ({}): register fewer services \
                 on this node, or raise max_frame_len or control_queue on every node",
                chunks.len(),
                inner.limits.max_chunks
            );
            // Not announced either (before, its version went out every interval, and every
            // member asked for a listing that could not be sent).
            inner.unsendable = Some(version);
            inner.requests.clear();
            drop(inner);
            push_failed(shared, &state.self_node, "too_many_chunks", &e);
            return;
        } else {
            (version, changed, requesters, chunks)
        }
    };
    let members = || {
        state
            .members
            .iter()
            .filter(|m| m.node != state.self_node && is_live(state, &m.node))
    };
    if changed {
        for m in members() {
            send_chunks(shared, &m.node, &chunks, "change_chunk");
        }
        return;
    }
    // Before the version message: a member that asked holds the version when told it, and
    // does not ask again.
    for r in &requesters {
        send_chunks(shared, r, &chunks, "requested_chunk");
    }
    if announce {
        let at = WireMsg::At {
            from: state.self_node.clone(),
            version,
        };
        for m in members() {
            let to: RemoteRef<WireMsg> = shared.cluster.remote().lookup(PATH, &m.node.address);
            match to.try_tell_control(at.clone()) {
                Ok(()) => count_sent(shared, "version", 1),
                Err(e) => push_failed(shared, &m.node, send_error_reason(&e), &e),
            }
        }
    }
}

fn send_error_reason(e: &SendError) -> &'static str {
    match e {
        SendError::QueueFull(_) => "queue_full",
        SendError::TooLarge { .. } => "too_large",
        SendError::Encode(_) => "encode",
        SendError::ShutDown => "shut_down",
    }
}

/// Counts a message of this node's listing (a chunk or its version) that could not be
/// queued for `to`, or a listing too large to send (`too_many_chunks`, `to` this node), and
/// logs it (the first ten, then every thousandth).
fn push_failed(shared: &Shared, to: &UniqueAddress, reason: &'static str, e: &dyn fmt::Display) {
    let node = &shared.cluster.self_node().node_id;
    metrics::counter!(
        "shardik_receptionist_push_failures_total",
        "node" => node.clone(),
        "reason" => reason
    )
    .increment(1);
    let n = shared.push_failures.fetch_add(1, Ordering::Relaxed) + 1;
    if reason == "shut_down" {
        tracing::debug!(node = %node, to = %to, "receptionist listing not sent: {e}");
    } else if n <= 10 || n.is_multiple_of(1000) {
        tracing::warn!(
            node = %node,
            to = %to,
            total = n,
            "receptionist listing not sent (sent again when asked): {e}"
        );
    }
}

/// Why a listing message is refused whoever its origin: a chunk number out of range, or an
/// entry whose path is not one of the origin's registrations
/// (`/system/receptionist/<incarnation>/<n>`), so that a listing naming an origin can only
/// ever point at that origin's own registrations.
fn check(msg: &WireListing) -> Result<(), Refused> {
    let chunks = msg.chunks.max(1);
    if msg.chunk >= chunks {
        return Err(Refused {
            reason: "bad_chunk",
            detail: format!("chunk {} of {chunks}", msg.chunk),
        });
    }
    let prefix = format!("{PATH}/{}/", msg.from.incarnation);
    for e in &msg.entries {
        let own = e
            .path
            .strip_prefix(&prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !own {
            let shown: String = e.path.chars().take(64).collect();
            return Err(Refused {
                reason: "foreign_path",
                detail: format!(
                    "entry path {shown:?} is not a registration of the origin (under {prefix})"
                ),
            });
        }
    }
    Ok(())
}

/// Takes a received message, on the reader of the connection it came on.
fn receive(shared: &Shared, msg: WireMsg) {
    let live = {
        let state = shared.cluster.shared.state.borrow();
        state.stopped.is_none() && msg.sender() != &state.self_node && is_live(&state, msg.sender())
    };
    if !live {
        return;
    }
    match msg {
        WireMsg::At { from, version } => {
            if !shared
                .inner
                .lock()
                .wants(&from, version, std::time::Instant::now())
            {
                return;
            }
            let to: RemoteRef<WireMsg> = shared.cluster.remote().lookup(PATH, &from.address);
            let request = WireMsg::Request {
                from: shared.cluster.self_node().clone(),
            };
            match to.try_tell_control(request) {
                Ok(()) => count_sent(shared, "request", 1),
                // Asked again after the next version message.
                Err(e) => tracing::debug!(to = %from, "receptionist request not sent: {e}"),
            }
        }
        WireMsg::Request { from } => {
            {
                let mut inner = shared.inner.lock();
                if inner.closed {
                    return;
                }
                inner.requests.insert(from);
            }
            shared.push.notify_one();
        }
        WireMsg::Listing(msg) => {
            let (from, version) = (msg.from.clone(), msg.version);
            let taken = check(&msg).and_then(|()| shared.inner.lock().take(msg));
            match taken {
                Ok(true) => shared.bump(),
                Ok(false) => {}
                Err(why) => refused(shared, &from, version, why),
            }
        }
    }
}

/// Counts a refused listing message and logs it: at debug level when it cannot come from a
/// well-behaved node (a path or chunk number out of place), as a warning (the first ten, then
/// every thousandth) when it is over this node's [`Limits`], which a node with other
/// settings may send.
fn refused(shared: &Shared, from: &UniqueAddress, version: u64, why: Refused) {
    let node = &shared.cluster.self_node().node_id;
    metrics::counter!(
        "shardik_receptionist_listings_refused_total",
        "node" => node.clone(),
        "reason" => why.reason
    )
    .increment(1);
    if matches!(why.reason, "too_many_chunks" | "too_large") {
        let n = shared.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 10 || n.is_multiple_of(1000) {
            tracing::warn!(
                node = %node,
                from = %from,
                version,
                total = n,
                "receptionist listing refused: {}",
                why.detail
            );
        }
    } else {
        tracing::debug!(
            from = %from,
            version,
            "receptionist listing refused: {}",
            why.detail
        );
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
        inner.asked.remove(node);
        inner.refused.remove(node);
        inner.requests.remove(node);
        inner.served.remove(node);
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
    let mut ticks: u64 = 0;
    loop {
        // Whether to tell every member this node's version: on a tick, and on a cluster
        // event (so that a joining member asks for the listing without waiting for a tick).
        let mut announce = false;
        tokio::select! {
            _ = tick.tick() => {
                ticks += 1;
                announce = true;
            }
            // A change of this node's entries, or a member asking for them.
            _ = shared.push.notified() => {}
            e = events.recv() => match e {
                Ok(Event::Stopped(_)) | Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                // The event comes before the state that shows it: a member that is gone is
                // taken from the event itself.
                Ok(Event::Cluster(ev)) => {
                    if let Some(node) = gone_in(&ev) {
                        forget(&shared, node);
                    }
                    announce = true;
                }
                Err(_) => announce = true,
            },
        }
        let state = cluster.state();
        if state.stopped.is_some() {
            break;
        }
        if prune(&mut shared.inner.lock(), &state) {
            shared.bump();
        }
        send(&shared, &state, ticks, announce);
    }
    cluster.remote().unregister(PATH);
    {
        let mut inner = shared.inner.lock();
        inner.closed = true;
        inner.remote.clear();
        inner.assembling.clear();
        inner.requests.clear();
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

    /// Takes a listing message as if it had come from the network.
    fn receive(shared: &Shared, msg: WireListing) {
        super::receive(shared, WireMsg::Listing(msg));
    }

    #[derive(Serialize, Deserialize)]
    struct Ping;

    struct Sink;

    impl shardik_actor::Actor for Sink {
        type Msg = Ping;
        async fn handle(
            &mut self,
            _msg: Ping,
            _ctx: &mut shardik_actor::Context<Self>,
        ) -> Result<(), shardik_actor::ActorError> {
            Ok(())
        }
    }

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
        node_with_member_and(b, |c| c).await
    }

    /// [`node_with_member`] with the node's configuration changed by `configure`.
    async fn node_with_member_and(
        b: &UniqueAddress,
        configure: impl FnOnce(ClusterConfig) -> ClusterConfig,
    ) -> (ActorSystem, Cluster, Receptionist) {
        let system = ActorSystem::new("a");
        let cluster = Cluster::without_driver(
            &system,
            configure(ClusterConfig::new("t", "a").secret(SECRET.to_vec())),
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
        // Subscribed before anything is sent: a forged listing taken and then replaced
        // before the subscription would go unseen.
        let mut sub = receptionist.subscribe(&key);
        assert!(sub.recv().await.unwrap().is_empty());
        let to: RemoteRef<WireListing> = forger.lookup(PATH, cluster.remote().addr());
        let forged = vec![
            "/system/receptionist/77/1".to_string(),
            "/user/admin".to_string(),
        ];
        to.try_tell_control(listing(&b, 5, &forged)).unwrap();
        let other_incarnation = vec!["/system/receptionist/76/1".to_string()];
        to.try_tell_control(listing(&b, 6, &other_incarnation))
            .unwrap();
        // Then a well-formed one, of a lower version: on the same connection, it arrives
        // after the others, and is taken only if neither of them was (whatever the
        // subscription saw in between).
        let own = vec!["/system/receptionist/77/2".to_string()];
        to.try_tell_control(listing(&b, 4, &own)).unwrap();
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

    /// The counts of the counter `name` by its label `reason`, taken out of `snapshotter`.
    fn counted(
        snapshotter: &metrics_util::debugging::Snapshotter,
        name: &str,
    ) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for (k, _, _, v) in snapshotter.snapshot().into_vec() {
            if k.key().name() != name {
                continue;
            }
            let reason = k.key().labels().find(|l| l.key() == "reason").unwrap();
            match v {
                metrics_util::debugging::DebugValue::Counter(n) => {
                    *counts.entry(reason.value().to_string()).or_default() += n
                }
                other => panic!("{other:?}"),
            }
        }
        counts
    }

    /// The chunks of a listing come from the peer, with a chunk count of up to `u32::MAX`:
    /// a listing of more chunks than the control queue holds (which no node could send) is
    /// refused, and so is one whose chunks add up to more bytes of entries than such a
    /// listing could hold; the assembly is dropped, and the refusals counted. Before,
    /// distinct chunks of one version were kept without bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_assembly_is_capped_in_chunks_and_bytes() {
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        // At most 4 chunks of 512 bytes: 2 048 bytes of entries.
        let (system, cluster, receptionist) = node_with_member_and(&b, |mut c| {
            c.remote = c.remote.max_frame_len(1024);
            c.remote.control_queue = 4;
            c
        })
        .await;
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let key = ServiceKey::<Ping>::new("ping");
        let p = |n: u32| format!("/system/receptionist/77/{n}");
        let chunk = |version: u64, chunk: u32, chunks: u32, key_len: usize| {
            let mut l = listing(&b, version, &[p(chunk + 1)]);
            l.entries[0].key = "k".repeat(key_len);
            WireListing { chunk, chunks, ..l }
        };
        let take = |msg: WireListing| {
            metrics::with_local_recorder(&recorder, || receive(&receptionist.shared, msg))
        };
        let assembling = || receptionist.shared.inner.lock().assembling.len();
        take(chunk(2, 0, 5, 1));
        assert_eq!(
            assembling(),
            0,
            "5 chunks, more than the control queue holds"
        );
        take(chunk(2, 1, u32::MAX, 1));
        assert_eq!(assembling(), 0);
        // Three chunks of 700 bytes: over 2 048 at the third.
        take(chunk(3, 0, 4, 700));
        take(chunk(3, 1, 4, 700));
        assert_eq!(assembling(), 1);
        take(chunk(3, 2, 4, 700));
        assert_eq!(assembling(), 0, "over the bytes a listing can hold");
        take(chunk(3, 3, 4, 700));
        assert!(receptionist.find(&key).is_empty());
        let refused = counted(&snapshotter, "shardik_receptionist_listings_refused_total");
        assert_eq!(refused.get("too_many_chunks"), Some(&2), "{refused:?}");
        assert_eq!(refused.get("too_large"), Some(&1), "{refused:?}");
        // Within the limits, a listing of four chunks goes through.
        for i in 0..4 {
            take(chunk(4, i, 4, 100));
        }
        assert_eq!(
            receptionist
                .find(&ServiceKey::<Ping>::new("k".repeat(100)))
                .len(),
            4
        );
        cluster.remote().shutdown().await;
        system.shutdown().await;
    }

    /// A listing refused for being over this node's limits (an origin with a larger
    /// control queue or frame limit) is not asked for again: the origin would send it
    /// every interval, refused every time; a newer version is asked for. (Before, every
    /// version message an interval after the last request brought another request, and the
    /// whole listing again.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_version_refused_as_over_the_limits_is_not_asked_for_again() {
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        // At most 4 chunks of 512 bytes: 2 048 bytes of entries.
        let (system, cluster, receptionist) = node_with_member_and(&b, |mut c| {
            c.remote = c.remote.max_frame_len(1024);
            c.remote.control_queue = 4;
            c
        })
        .await;
        let chunk = |version: u64, chunk: u32, chunks: u32, key_len: usize| {
            let mut l = listing(&b, version, &[format!("/system/receptionist/77/{chunk}")]);
            l.entries[0].key = "k".repeat(key_len);
            WireListing { chunk, chunks, ..l }
        };
        let now = std::time::Instant::now();
        let later = now + Receptionist::PUSH_INTERVAL * 3;
        let wants = |version: u64, at| receptionist.shared.inner.lock().wants(&b, version, at);
        receive(&receptionist.shared, chunk(3, 0, 5, 1));
        assert!(!wants(3, now), "refused: too many chunks");
        assert!(!wants(3, later));
        for i in 0..3 {
            receive(&receptionist.shared, chunk(4, i, 4, 700));
        }
        assert!(!wants(4, later), "refused: too large");
        assert!(wants(5, now), "a newer version is asked for");
        cluster.remote().shutdown().await;
        system.shutdown().await;
    }

    /// A listing needing more chunks than the control queue holds is not sent, and its
    /// version is not announced either: no member asks for what cannot be sent. (Before,
    /// the version went out every interval, and every member asked for it in vain.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_too_large_to_send_is_not_announced() {
        let (peer_system, peer, b, mut rx) = peer_as_member().await;
        let (system, cluster, receptionist) = node_with_member_and(&b, |mut c| {
            c.remote = c.remote.max_frame_len(1024);
            c.remote.control_queue = 2;
            c
        })
        .await;
        let sink = system.spawn(Sink);
        for i in 0..8 {
            let key = ServiceKey::<Ping>::new(format!("{i}{}", "k".repeat(200)));
            receptionist.register(&key, sink.clone());
        }
        let chunks = chunked(
            &receptionist.shared.inner.lock(),
            cluster.self_node(),
            chunk_budget(&cluster),
        )
        .len();
        assert!(chunks > 2, "{chunks} chunks");
        let last = receptionist.shared.inner.lock().version;
        // An interval's version message, then a message of the test's own on the same lane:
        // nothing of the last version reaches `b` before it. (The receptionist's own task may
        // have sent an earlier version, small enough to send, while the entries were added.)
        let state = cluster.shared.state.borrow().clone();
        send(&receptionist.shared, &state, 0, true);
        let to_b: RemoteRef<WireMsg> = cluster.remote().lookup(PATH, &b.address);
        let marker = WireMsg::Request {
            from: cluster.self_node().clone(),
        };
        to_b.try_tell_control(marker).unwrap();
        loop {
            match next(&mut rx).await {
                WireMsg::Request { .. } => break,
                WireMsg::At { version, .. } => {
                    assert!(version < last, "version {version} announced")
                }
                WireMsg::Listing(l) => assert!(l.version < last, "version {} sent", l.version),
            }
        }
        peer.shutdown().await;
        cluster.remote().shutdown().await;
        system.shutdown().await;
        peer_system.shutdown().await;
    }

    /// A registration whose entry is larger than a chunk cannot be sent to the other nodes,
    /// but is still registered and listed on its own node (before, it was dropped with a
    /// log line: not even listed locally), and is left out of the listing sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_entry_too_large_to_send_is_still_listed_on_its_own_node() {
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        let (system, cluster, receptionist) = node_with_member_and(&b, |mut c| {
            c.remote = c.remote.max_frame_len(1024);
            c
        })
        .await;
        let big = ServiceKey::<Ping>::new("k".repeat(600));
        let small = ServiceKey::<Ping>::new("ping");
        let a = system.spawn(Sink);
        receptionist.register(&big, a.clone());
        receptionist.register(&small, a.clone());
        let l = receptionist.find(&big);
        assert_eq!(l.len(), 1);
        assert!(l.refs()[0].is_local());
        let sent: Vec<String> = chunked(
            &receptionist.shared.inner.lock(),
            cluster.self_node(),
            chunk_budget(&cluster),
        )
        .into_iter()
        .flat_map(|c| c.entries)
        .map(|e| e.key)
        .collect();
        assert_eq!(sent, ["ping"]);
        assert!(receptionist.deregister(&big, &a));
        assert!(receptionist.find(&big).is_empty());
        cluster.remote().shutdown().await;
        system.shutdown().await;
    }

    /// A remote layer standing in for member `b` of node "a" (`b`'s address is its own, its
    /// incarnation 77): what "a"'s receptionist sends it comes out of the channel, in order.
    async fn peer_as_member() -> (
        ActorSystem,
        Remote,
        UniqueAddress,
        tokio::sync::mpsc::UnboundedReceiver<WireMsg>,
    ) {
        let system = ActorSystem::new("b");
        let peer = Remote::start(&system, RemoteConfig::new("t", "b").secret(SECRET.to_vec()))
            .await
            .unwrap();
        let b = UniqueAddress::new(peer.addr(), "b", 77);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        peer.register_decoder(
            PATH,
            Arc::new(move |bytes: &[u8]| {
                let _ = tx.send(decode_payload::<WireMsg>(bytes)?);
                Ok(())
            }),
        );
        (system, peer, b, rx)
    }

    /// The next message [`peer_as_member`]'s channel gives.
    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<WireMsg>) -> WireMsg {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a message from a")
            .unwrap()
    }

    /// A member that asks for a node's listing again and again gets it at most once per push
    /// interval, which the node's version messages mark (one per interval here, the
    /// membership not changing; each sent after the interval's answers, so that the member
    /// holds the version when told it). Without the limit, each request was answered at
    /// once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_asking_again_gets_the_listing_at_most_once_per_interval() {
        let (peer_system, peer, b, mut rx) = peer_as_member().await;
        let (system, cluster, receptionist) = node_with_member(&b).await;
        receptionist.register(&ServiceKey::<Ping>::new("ping"), system.spawn(Sink));
        let to: RemoteRef<WireMsg> = peer.lookup(PATH, cluster.remote().addr());
        // The listing pushed after the registration.
        while !matches!(next(&mut rx).await, WireMsg::Listing(_)) {}
        let mut seen = Vec::new();
        for _ in 0..4 {
            to.try_tell_control(WireMsg::Request { from: b.clone() })
                .unwrap();
            loop {
                let m = next(&mut rx).await;
                let listing = matches!(m, WireMsg::Listing(_));
                seen.push(if listing { "listing" } else { "at" });
                if listing {
                    break;
                }
            }
        }
        // The first answer goes at once, the second in the next interval at the earliest
        // (before that interval's version message), and so on: between the first and the
        // fourth, the version messages of two intervals at least.
        let first = seen.iter().position(|k| *k == "listing").unwrap();
        let ats = seen[first..].iter().filter(|k| **k == "at").count();
        assert!(ats >= 2, "{seen:?}");
        peer.shutdown().await;
        cluster.remote().shutdown().await;
        system.shutdown().await;
        peer_system.shutdown().await;
    }

    /// A chunk lost on the way is repaired by asking: a node told a version it does not hold
    /// complete asks the origin for its listing; told of a newer one, it asks again at once
    /// (the limit of one request per interval is per version). Whether it asks for a version
    /// it holds is seen in `net_receptionist.rs` (an unchanged listing is not sent again).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_version_not_held_complete_is_asked_for() {
        let (peer_system, peer, b, mut rx) = peer_as_member().await;
        let (system, cluster, receptionist) = node_with_member(&b).await;
        let key = ServiceKey::<Ping>::new("ping");
        let to: RemoteRef<WireMsg> = peer.lookup(PATH, cluster.remote().addr());
        let p = |n: u32| format!("/system/receptionist/77/{n}");
        let chunk = |chunk: u32| {
            WireMsg::Listing(WireListing {
                chunk,
                chunks: 2,
                ..listing(&b, 3, &[p(chunk + 1)])
            })
        };
        let at = |version: u64| WireMsg::At {
            from: b.clone(),
            version,
        };
        let mut sub = receptionist.subscribe(&key);
        assert!(sub.recv().await.unwrap().is_empty());
        // Chunk 1 of version 3 is lost; the version message says there is a version 3.
        to.try_tell_control(chunk(0)).unwrap();
        to.try_tell_control(at(3)).unwrap();
        let asked = next(&mut rx).await;
        assert!(matches!(&asked, WireMsg::Request { from } if from == cluster.self_node()));
        to.try_tell_control(chunk(0)).unwrap();
        to.try_tell_control(chunk(1)).unwrap();
        // Version 3 held; version 4 is asked for, less than an interval after version 3.
        to.try_tell_control(at(3)).unwrap();
        to.try_tell_control(at(4)).unwrap();
        let l = tokio::time::timeout(Duration::from_secs(5), sub.recv())
            .await
            .expect("version 3 listed")
            .unwrap();
        assert_eq!(paths(&l), [p(1), p(2)]);
        let asked = next(&mut rx).await;
        assert!(matches!(asked, WireMsg::Request { .. }));
        assert_eq!(
            receptionist.shared.inner.lock().asked.get(&b).map(|a| a.0),
            Some(4)
        );
        peer.shutdown().await;
        cluster.remote().shutdown().await;
        system.shutdown().await;
        peer_system.shutdown().await;
    }

    /// Rolling upgrades, in the default payload format (MessagePack with named fields): a
    /// listing is still the bare struct earlier releases decode (one without chunk fields
    /// takes a chunk as a whole listing), their listings decode as listings, and the version
    /// and request messages do not decode as a listing there (dropped as undecodable).
    #[test]
    fn listings_keep_the_format_of_earlier_releases() {
        #[derive(Serialize, Deserialize)]
        struct Before {
            from: UniqueAddress,
            version: u64,
            entries: Vec<WireEntry>,
        }
        let b = UniqueAddress::new("127.0.0.1:9", "b", 77);
        let l = WireListing {
            chunk: 1,
            chunks: 2,
            ..listing(&b, 3, &["/system/receptionist/77/1".to_string()])
        };
        let bytes = rmp_serde::to_vec_named(&WireMsg::Listing(l.clone())).unwrap();
        assert_eq!(bytes, rmp_serde::to_vec_named(&l).unwrap());
        let old: Before = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!((old.version, old.entries), (3, l.entries.clone()));
        let from_old = rmp_serde::to_vec_named(&Before {
            from: b.clone(),
            version: 4,
            entries: l.entries.clone(),
        })
        .unwrap();
        match rmp_serde::from_slice::<WireMsg>(&from_old).unwrap() {
            WireMsg::Listing(m) => {
                assert_eq!((m.version, m.chunk, m.chunks.max(1)), (4, 0, 1));
            }
            other => panic!("{other:?}"),
        }
        for msg in [
            WireMsg::At {
                from: b.clone(),
                version: 3,
            },
            WireMsg::Request { from: b.clone() },
        ] {
            let bytes = rmp_serde::to_vec_named(&msg).unwrap();
            assert!(rmp_serde::from_slice::<Before>(&bytes).is_err());
            assert!(rmp_serde::from_slice::<WireListing>(&bytes).is_err());
            let back: WireMsg = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        }
    }
}
