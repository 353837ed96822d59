//! The cluster region of one entity type on one node: a [`RegionState`] under a lock, whose
//! actions are carried out while the lock is held (so their order is the order in which the
//! state machine emitted them), hosting shards in a `LocalRegion` and talking
//! to peers and the coordinator over shardik-remote.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use serde::de::DeserializeOwned;
use serde::Serialize;
use shardik_actor::{ActorSystem, TellError};
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::UniqueAddress;
use shardik_cluster::runtime::{Cluster, Event};
use shardik_remote::RemoteRef;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, watch};

use super::coordinator::CoordEvent;
use super::directory::Directory;
use super::membership::{coordinator_node, is_gone, is_replaced};
use super::remember::Remember;
use super::wire::{
    coordinator_path, decoder, peer_path, region_addr, region_control_path, region_id, CoordWire,
    PeerWire,
};
use crate::coordination::{
    Envelope, PeerMsg, RegionAction, RegionConfig, RegionId, RegionInput, RegionState,
    RegisterError, SendError, ShardView, ToRegion,
};
use crate::hash::ShardId;
use crate::region::{RegionCore, ShardHost};
use crate::shard::EntityId;
use crate::stats::RegionStats;

enum RegionEvent<M> {
    ShardStopped(ShardId),
    /// Messages a force-stopped entity of the shard had not handled.
    Unhandled(ShardId, Vec<Envelope<M>>),
    /// Messages an entity stopped by the fence had not handled.
    FencedUnhandled(ShardId, EntityId, Vec<M>),
}

/// Where this region stands with the coordinator of its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Registration {
    /// Not registered yet (no coordinator known, or no answer yet).
    Pending,
    /// The current coordinator acknowledged the registration.
    Registered,
    /// The coordinator refused the region: every send fails.
    Refused(RegisterError),
}

/// How a region was started: hosting, or routing only.
pub(crate) struct RegionRole {
    /// Only members with this role host the type.
    pub(crate) role: Option<String>,
    /// Started as a proxy: never hosts.
    pub(crate) proxy: bool,
    pub(crate) directory: Arc<Directory>,
    /// Remember entities (hosting regions only).
    pub(crate) remember: Option<Arc<Remember>>,
}

struct Inner<M> {
    state: RegionState<M>,
    coord: Option<UniqueAddress>,
    coord_ref: Option<RemoteRef<CoordWire>>,
    peers: HashMap<RegionId, RemoteRef<PeerWire<M>>>,
    gone: BTreeSet<RegionId>,
    /// Nodes this region has seen as members (so one missing from a later view has left).
    seen: BTreeSet<UniqueAddress>,
    out: Vec<RegionAction<M>>,
    /// Set while this node is fenced: messages for its hosted shards wait here, in order,
    /// and no entity runs (see `on_fence`). The flag marks messages the node had accepted
    /// before (an entity's unhandled ones), which do not count toward `buffer_limit`.
    fenced: Option<Vec<(ShardId, String, M, bool)>>,
    /// Per shard, the messages in `fenced` that senders added (those `buffer_limit` bounds,
    /// per shard as for the messages a shard buffers while it has no home).
    held_sent: HashMap<ShardId, usize>,
    buffer_limit: usize,
    /// Envelopes a peer's full queue handed back during the current `execute`.
    refused: Vec<Envelope<M>>,
    /// Fences a peer's full queue refused, sent again on every tick: a fence may not be
    /// dropped (the shard's owner waits for it before it hands the shard on).
    unsent_fences: Vec<(RegionId, PeerWire<M>)>,
}

pub(crate) struct ClusterRegion<M> {
    type_name: String,
    shard_count: u32,
    cluster: Cluster,
    clock: Instant,
    local: Arc<dyn ShardHost<M>>,
    self_id: RegionId,
    inner: Mutex<Inner<M>>,
    /// Per shard: messages for it go straight to the local entities, without `inner` (see
    /// [`ClusterRegion::deliver`]). True exactly while the state machine hosts the shard here
    /// (`RegionState::is_local`), the node is not fenced and the region has not stopped;
    /// rewritten at the end of every change of state ([`Change`]), while `gate` is held for
    /// writing.
    local_shards: Box<[AtomicBool]>,
    /// Held for reading by a direct local delivery, for writing by every change of state
    /// that may move a shard away: such a change waits for deliveries in progress, and
    /// none starts until the flags are rewritten.
    gate: RwLock<()>,
    /// See [`ClusterRegion::coarse_now_ms`].
    coarse_ms: AtomicU64,
    events: mpsc::UnboundedSender<RegionEvent<M>>,
    coordinator: mpsc::UnboundedSender<CoordEvent>,
    stopped: AtomicBool,
    joined: AtomicBool,
    /// The node's graceful leave ran out of time: the region holds itself fenced (see
    /// [`hold_for_leave`](Self::hold_for_leave)) until the node is gone.
    held_for_leave: AtomicBool,
    leave_complete: watch::Sender<bool>,
    registration: watch::Sender<Registration>,
    placement: RegionRole,
    metrics: crate::metrics::RegionMetrics,
    /// Messages this layer refused or recorded as dead letters (a full buffer, a refused
    /// region, a full peer queue, a stopped or fenced node), added to the local host's count
    /// in [`RegionStats::rejected_total`]; what the local entities refuse the host counts.
    rejected: Arc<AtomicU64>,
    /// When (`coarse_now_ms`, at least 1; 0: never) a message whose shard differs from this
    /// node's shard function was last logged (see `same_shard_here`).
    foreign_shard_logged: AtomicU64,
}

/// How often at most a message from a region with another shard function is logged.
const FOREIGN_SHARD_LOG_MS: u64 = 10_000;

/// The region's state, locked for a change that may move shards: holds `gate` for writing,
/// and rewrites the direct-delivery flags (`local_shards`) before it lets go.
struct Change<'a, M> {
    region: &'a ClusterRegion<M>,
    inner: MutexGuard<'a, Inner<M>>,
    _gate: RwLockWriteGuard<'a, ()>,
}

impl<M> std::ops::Deref for Change<'_, M> {
    type Target = Inner<M>;
    fn deref(&self) -> &Inner<M> {
        &self.inner
    }
}

impl<M> std::ops::DerefMut for Change<'_, M> {
    fn deref_mut(&mut self) -> &mut Inner<M> {
        &mut self.inner
    }
}

impl<M> Drop for Change<'_, M> {
    fn drop(&mut self) {
        let (region, g) = (self.region, &*self.inner);
        let open = g.fenced.is_none() && !region.stopped.load(Ordering::SeqCst);
        let mut hosted = 0u32;
        for (shard, flag) in region.local_shards.iter().enumerate() {
            let here = open && g.state.is_local(shard as ShardId);
            hosted += u32::from(here);
            flag.store(here, Ordering::Release);
        }
        region.metrics.shards_hosted.set(hosted);
    }
}

/// The driver task of a started [`ClusterRegion`], not running yet.
pub(crate) struct RegionDriver<M> {
    region: Arc<ClusterRegion<M>>,
    rx: mpsc::UnboundedReceiver<RegionEvent<M>>,
    tick: std::time::Duration,
}

impl<M> RegionDriver<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Spawns the task: it reads the membership at once, then on every event and tick.
    pub(crate) fn spawn(self) {
        let RegionDriver { region, rx, tick } = self;
        tokio::spawn(async move { region.run(rx, tick).await });
    }
}

impl<M> ClusterRegion<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Starts the region: registers its two endpoints. Its driver task (which reads the
    /// membership and registers with the coordinator) starts with [`RegionDriver::spawn`], once
    /// the caller announced the type in the directory: otherwise the first read may not see
    /// this node host the type and the region registers with another coordinator first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        type_name: &str,
        cluster: &Cluster,
        clock: Instant,
        config: RegionConfig,
        tick: std::time::Duration,
        local: Arc<dyn ShardHost<M>>,
        coordinator: mpsc::UnboundedSender<CoordEvent>,
        placement: RegionRole,
    ) -> (Arc<Self>, RegionDriver<M>) {
        let self_id = region_id(cluster.self_node());
        let shard_count = config.shard_count;
        let buffer_limit = config.buffer_limit;
        let (events, rx) = mpsc::unbounded_channel();
        let region = Arc::new(ClusterRegion {
            type_name: type_name.to_string(),
            shard_count,
            cluster: cluster.clone(),
            clock,
            local,
            self_id: self_id.clone(),
            local_shards: (0..shard_count).map(|_| AtomicBool::new(false)).collect(),
            gate: RwLock::new(()),
            coarse_ms: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                state: RegionState::new(self_id, config),
                coord: None,
                coord_ref: None,
                peers: HashMap::new(),
                gone: BTreeSet::new(),
                seen: BTreeSet::new(),
                out: Vec::new(),
                fenced: None,
                held_sent: HashMap::new(),
                buffer_limit,
                refused: Vec::new(),
                unsent_fences: Vec::new(),
            }),
            events,
            coordinator,
            stopped: AtomicBool::new(false),
            joined: AtomicBool::new(false),
            held_for_leave: AtomicBool::new(false),
            leave_complete: watch::channel(false).0,
            registration: watch::channel(Registration::Pending).0,
            placement,
            metrics: crate::metrics::RegionMetrics::new(type_name, &cluster.self_node().node_id),
            rejected: Arc::new(AtomicU64::new(0)),
            foreign_shard_logged: AtomicU64::new(0),
        });
        let remote = cluster.remote();
        let r = region.clone();
        remote.register_decoder(
            &peer_path(type_name),
            decoder(move |w: PeerWire<M>| {
                r.input(RegionInput::FromPeer {
                    from: w.from,
                    msg: w.msg,
                })
            }),
        );
        let r = region.clone();
        remote.register_decoder(
            &region_control_path(type_name),
            decoder(move |m: ToRegion| r.on_coordinator_msg(m)),
        );
        let driver = RegionDriver {
            region: region.clone(),
            rx,
            tick,
        };
        (region, driver)
    }

    /// A coordinator message (from the network, or directly from this node's coordinator).
    pub(crate) fn on_coordinator_msg(&self, mut msg: ToRegion) {
        let mut g = self.change();
        // A home on a node this view already holds gone is stale (the coordinator waits
        // `down_margin` before it reallocates): drop it, keep buffering, ask again later.
        // So is a home on a replaced process (its node id runs again with another
        // incarnation, as after a full cluster restart): this region may never have seen
        // it, so it is marked gone here, before anything is sent to it.
        let homes: Vec<RegionId> = match &msg {
            ToRegion::ShardHome { region, .. } => vec![region.clone()],
            ToRegion::RegisterAck { homes, .. } => homes.iter().map(|(_, r)| r.clone()).collect(),
            _ => Vec::new(),
        };
        if homes
            .iter()
            .any(|r| !g.gone.contains(r) && *r != self.self_id)
        {
            let state = self.cluster.state();
            for r in homes {
                let replaced =
                    super::wire::region_node(&r).is_some_and(|n| is_replaced(&state, &n));
                if replaced && g.gone.insert(r.clone()) {
                    g.peers.remove(&r);
                    self.handle_locked(&mut g, RegionInput::RegionDown(r));
                }
            }
        }
        match &mut msg {
            ToRegion::ShardHome { region, shard, .. } if g.gone.contains(region) => {
                tracing::debug!(entity_type = %self.type_name, shard, %region, "home on a gone node ignored");
                return;
            }
            ToRegion::RegisterAck { homes, .. } => {
                let gone = &g.gone;
                homes.retain(|(_, r)| !gone.contains(r));
            }
            _ => {}
        }
        self.handle_locked(&mut g, RegionInput::FromCoordinator(msg));
    }

    /// Publishes where the region stands with the coordinator (after an input that may change
    /// it): `Pending` again after a coordinator change until the new one acknowledges, never
    /// `Registered` on an answer to an earlier attempt (the state machine ignores those).
    fn publish_registration(&self, g: &Inner<M>) {
        let now = if let Some(e) = g.state.refused() {
            Registration::Refused(e.clone())
        } else if g.state.is_registered() {
            Registration::Registered
        } else {
            Registration::Pending
        };
        self.registration.send_if_modified(|r| {
            let changed = *r != now && !matches!(r, Registration::Refused(_));
            if changed {
                *r = now;
            }
            changed
        });
    }

    /// Where this region stands with the coordinator.
    pub(crate) fn registration(&self) -> watch::Receiver<Registration> {
        self.registration.subscribe()
    }

    /// Whether the coordinator told this region that all its shards are handed off.
    pub(crate) fn leave_complete(&self) -> watch::Receiver<bool> {
        self.leave_complete.subscribe()
    }

    /// The node's graceful leave ran out of time before every shard was handed off: stop
    /// hosting as a fenced node does, for good. The entities of every shard still here stop
    /// as soon as their current message is done and messages for them are held (dead letters
    /// once the node is gone), so that, once [`hosted_shards`](Self::hosted_shards) is
    /// empty, no incarnation runs here when the shards start elsewhere after the node left.
    pub(crate) fn hold_for_leave(&self) {
        self.held_for_leave.store(true, Ordering::SeqCst);
        self.on_fence(true, None);
    }

    /// Asks the coordinator to hand off every shard of this region.
    pub(crate) fn request_leave(&self) {
        let mut g = self.inner.lock();
        self.send_coordinator(
            &mut g,
            CoordWire::Leaving {
                region: self.self_id.clone(),
            },
        );
    }

    /// Shards this region has not handed off (hosted, moving or stopping), whether or not
    /// any of their entities still runs (also while fenced or after the node stopped).
    pub(crate) fn owned_shards(&self) -> BTreeSet<ShardId> {
        self.inner.lock().state.hosted_shards()
    }

    /// Shards whose entities live here (hosted, moving or stopping).
    /// Once this node stopped, or while it is fenced, the shards that still have entities
    /// (stopping).
    pub(crate) fn hosted_shards(&self) -> BTreeSet<ShardId> {
        let (hosted, fenced) = {
            let g = self.inner.lock();
            (g.state.hosted_shards(), g.fenced.is_some())
        };
        if !fenced && !self.stopped.load(Ordering::SeqCst) {
            return hosted;
        }
        let counts = self.local.shard_entities();
        hosted
            .into_iter()
            .filter(|s| counts.get(*s as usize).is_some_and(|n| *n > 0))
            .collect()
    }

    /// Milliseconds since the region started; also advances [`coarse_now_ms`](Self::coarse_now_ms).
    fn now_ms(&self) -> u64 {
        let now = self.clock.elapsed().as_millis() as u64;
        self.coarse_ms.fetch_max(now, Ordering::Relaxed);
        now
    }

    /// The time of the last input other than a message (at least every `tick`): what
    /// routing a message uses, so that a message costs no clock read. The state machine
    /// only times retries and hand-offs (seconds) with it.
    fn coarse_now_ms(&self) -> u64 {
        self.coarse_ms.load(Ordering::Relaxed)
    }

    fn input(&self, input: RegionInput<M>) {
        match input {
            // A message forwarded by a peer routes like a local send: it never moves a shard.
            RegionInput::FromPeer {
                from,
                msg: PeerMsg::Deliver(env),
            } => {
                if self.stopped.load(Ordering::SeqCst) {
                    // Nothing is hosted or forwarded any more (what waited was recorded when
                    // the node stopped): a dead letter now, not a buffer nobody empties.
                    self.dead_letter(&env.entity_id, "cluster node stopped");
                    return;
                }
                if !self.same_shard_here(&env, &from) {
                    return;
                }
                let Some(env) = self.deliver_directly(env) else {
                    return;
                };
                let shard = env.shard;
                let mut g = self.inner.lock();
                let msg = PeerMsg::Deliver(env);
                self.handle_locked(&mut g, RegionInput::FromPeer { from, msg });
                self.debug_check_flag(&g, shard);
            }
            other => {
                let mut g = self.change();
                self.handle_locked(&mut g, other);
            }
        }
    }

    /// Whether this node's shard function puts `env`'s entity in the shard the sending
    /// region computed. If not, the two nodes' functions differ for this id (custom functions
    /// that agree on the coordinator's probe ids, see [`ShardFn::fingerprint`]), and
    /// delivering here could start the entity under a shard other than the one its home
    /// hosts it under: a second live incarnation. Such a message is a dead letter, logged at
    /// error level at most every [`FOREIGN_SHARD_LOG_MS`]. One hash of the id per message
    /// from a peer.
    ///
    /// [`ShardFn::fingerprint`]: crate::ShardFn::fingerprint
    fn same_shard_here(&self, env: &Envelope<M>, from: &RegionId) -> bool {
        let here = self.local.shard_of(&env.entity_id);
        if !maps_differently(self.shard_count, env.shard, here) {
            return true;
        }
        let now = self.coarse_now_ms().max(1);
        let last = self.foreign_shard_logged.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= FOREIGN_SHARD_LOG_MS)
            && self
                .foreign_shard_logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::error!(
                entity_type = %self.type_name,
                %from,
                entity = %env.entity_id,
                sent_as = env.shard,
                here,
                "message from a region that maps entity ids to shards differently: refused \
                 (every node must use the same shard function for the entity type)"
            );
        }
        self.dead_letter(&env.entity_id, "shard function differs from the sender's");
        false
    }

    /// The gate, held for reading, if messages for `shard` are taken directly now (see
    /// `gate`): the caller delivers while it holds it.
    fn direct(&self, shard: ShardId) -> Option<RwLockReadGuard<'_, ()>> {
        let gate = self.gate.read();
        self.local_shards
            .get(shard as usize)
            .is_some_and(|f| f.load(Ordering::Acquire))
            .then_some(gate)
    }

    /// What the state machine's `DeliverLocal` does once the message may run: hands it to
    /// the local entity and, with remember-entities, records the id if the message started
    /// a new incarnation (a running entity's id is in the set already: it was recorded when
    /// the entity started, or the entity was started from the set).
    fn deliver_here(&self, shard: ShardId, id: &str, msg: M) -> Result<(), TellError<M>> {
        let Some(r) = &self.placement.remember else {
            return self.local.deliver(shard, id, msg);
        };
        let (started, result) = self.local.deliver_new(shard, id, msg);
        if started {
            r.delivered(shard, id);
        }
        result
    }

    /// What the state machine's `DeliverAccepted` does: [`deliver_here`](Self::deliver_here)
    /// for a message this node accepted already, which no entity buffer's cap or bounded
    /// mailbox refuses now.
    fn deliver_accepted_here(&self, shard: ShardId, id: &str, msg: M) -> Result<(), TellError<M>> {
        let (started, result) = self.local.deliver_accepted(shard, id, msg);
        if let (true, Some(r)) = (started, &self.placement.remember) {
            r.delivered(shard, id);
        }
        result
    }

    /// Delivers `env` to the local entity if its shard is taken directly, or hands it back
    /// for the state machine.
    fn deliver_directly(&self, env: Envelope<M>) -> Option<Envelope<M>> {
        let Some(_gate) = self.direct(env.shard) else {
            return Some(env);
        };
        if self
            .deliver_here(env.shard, &env.entity_id, env.payload)
            .is_err()
        {
            self.dead_letter_counted(&env.entity_id, "entity refused the message");
        }
        None
    }

    /// Locks the state for a change that may move shards (see `gate`); the direct-delivery
    /// flags are rewritten when the returned guard is dropped.
    fn change(&self) -> Change<'_, M> {
        let gate = self.gate.write();
        Change {
            region: self,
            inner: self.inner.lock(),
            _gate: gate,
        }
    }

    /// Debug builds: routing a message must not have changed whether its shard is taken
    /// directly (only changes under [`change`](Self::change) may). Skipped once the region
    /// stopped: `stopped` is set before the change that clears the flags.
    fn debug_check_flag(&self, g: &Inner<M>, shard: ShardId) {
        if cfg!(debug_assertions) && !self.stopped.load(Ordering::SeqCst) {
            if let Some(flag) = self.local_shards.get(shard as usize) {
                debug_assert_eq!(
                    flag.load(Ordering::SeqCst),
                    g.fenced.is_none() && g.state.is_local(shard),
                    "shard {shard}'s direct-delivery flag is stale after routing a message"
                );
            }
        }
    }

    fn handle_locked(&self, g: &mut Inner<M>, input: RegionInput<M>) {
        match &input {
            RegionInput::FromCoordinator(m) => {
                tracing::trace!(entity_type = %self.type_name, region = %self.self_id, "from coordinator: {m:?}")
            }
            RegionInput::RegionDown(r) => {
                tracing::trace!(entity_type = %self.type_name, region = %self.self_id, "region down: {r}")
            }
            RegionInput::CoordinatorChanged => {
                tracing::trace!(entity_type = %self.type_name, region = %self.self_id, "coordinator changed")
            }
            _ => {}
        }
        let registration = matches!(
            input,
            RegionInput::FromCoordinator(_) | RegionInput::CoordinatorChanged
        );
        let now = match &input {
            RegionInput::FromPeer {
                msg: PeerMsg::Deliver(_),
                ..
            } => self.coarse_now_ms(),
            _ => self.now_ms(),
        };
        let mut out = std::mem::take(&mut g.out);
        g.state.handle(now, input, &mut out);
        if registration && g.state.refused().is_some() {
            // Published before the actions run: they drop the messages that waited for a
            // home, and an asker woken by that reads the refusal to say why.
            self.publish_registration(g);
        }
        self.execute(g, &mut out);
        g.out = out;
        self.drop_refused(g);
        if self.stopped.load(Ordering::SeqCst) {
            // Once the node stopped, nothing forwards what the state machine buffers (an
            // entity's unhandled messages, say): dead letters at once.
            for env in g.state.take_buffered() {
                self.dead_letter(&env.entity_id, "cluster node stopped");
            }
        }
        if registration {
            self.publish_registration(g);
        }
    }

    /// Records the envelopes a peer's full queue handed back and no caller is waiting for.
    fn drop_refused(&self, g: &mut Inner<M>) {
        for env in g.refused.drain(..) {
            self.dead_letter(&env.entity_id, "peer region's queue full");
        }
    }

    /// Carries out a `DeliverLocal` (or, if `accepted`, a `DeliverAccepted`) under the region
    /// lock: held while the node is fenced, else handed to the local entity.
    fn deliver_action(&self, g: &mut Inner<M>, env: Envelope<M>, accepted: bool) {
        let Envelope {
            entity_id,
            shard,
            payload,
            ..
        } = env;
        if self.stopped.load(Ordering::SeqCst) {
            // Never start an entity on a node that stopped hosting.
            self.dead_letter(&entity_id, "cluster node stopped");
            return;
        }
        if let Some(held) = &mut g.fenced {
            // What was accepted already is kept past the held buffer's bound, and does not
            // use it up.
            if accepted {
                held.push((shard, entity_id, payload, true));
            } else if g.held_sent.get(&shard).copied().unwrap_or(0) < g.buffer_limit {
                held.push((shard, entity_id, payload, false));
                *g.held_sent.entry(shard).or_default() += 1;
            } else {
                self.metrics.fenced_dropped.increment(1);
                self.dead_letter(&entity_id, "node fenced and its buffer full");
            }
            return;
        }
        let delivered = if accepted {
            self.deliver_accepted_here(shard, &entity_id, payload)
        } else {
            self.deliver_here(shard, &entity_id, payload)
        };
        if delivered.is_err() {
            self.dead_letter_counted(&entity_id, "entity refused the message");
        }
    }

    /// Carries out `out` in order, under the region lock.
    fn execute(&self, g: &mut Inner<M>, out: &mut Vec<RegionAction<M>>) {
        for action in out.drain(..) {
            match action {
                RegionAction::DeliverLocal(env) => self.deliver_action(g, env, false),
                RegionAction::DeliverAccepted(env) => self.deliver_action(g, env, true),
                RegionAction::ToPeer { to, msg } => {
                    tracing::trace!(entity_type = %self.type_name, region = %self.self_id, %to, "to peer");
                    let r = g.peers.entry(to.clone()).or_insert_with(|| {
                        self.cluster
                            .remote()
                            .lookup(&peer_path(&self.type_name), region_addr(&to))
                    });
                    if let Err(refused) = r.try_send(PeerWire {
                        from: self.self_id.clone(),
                        msg,
                    }) {
                        self.metrics.forward_refused.increment(1);
                        tracing::debug!(entity_type = %self.type_name, region = %to, "message to a peer region not sent: {}", refused.error);
                        match refused.msg {
                            // Handed back: the sender sees the refusal if it is waiting.
                            Some(PeerWire {
                                msg: PeerMsg::Deliver(env),
                                ..
                            }) => g.refused.push(env),
                            Some(
                                fence @ PeerWire {
                                    msg: PeerMsg::Fence { .. },
                                    ..
                                },
                            ) => {
                                // The state machine sends a fence again while the shard's
                                // next home is unknown: one copy waiting here is enough.
                                let which = |m: &PeerMsg<M>| match m {
                                    PeerMsg::Fence { id, shard } => Some((*id, *shard)),
                                    PeerMsg::Deliver(_) => None,
                                };
                                let waiting = g
                                    .unsent_fences
                                    .iter()
                                    .any(|(t, f)| *t == to && which(&f.msg) == which(&fence.msg));
                                if !waiting {
                                    tracing::warn!(entity_type = %self.type_name, region = %to, "fence not sent (the peer's queue is full): sent again on the next tick");
                                    g.unsent_fences.push((to.clone(), fence));
                                }
                            }
                            _ => {
                                self.rejected.fetch_add(1, Ordering::Relaxed);
                                self.system().record_dead_letter(
                                    &format_args!(
                                        "{}{}",
                                        region_addr(&to),
                                        peer_path(&self.type_name)
                                    ),
                                    std::any::type_name::<M>(),
                                    "peer region's queue full, or the message not encodable",
                                )
                            }
                        }
                    }
                }
                RegionAction::ToCoordinator(msg) => {
                    let from = self.self_id.clone();
                    self.send_coordinator(g, CoordWire::Region { from, msg });
                }
                RegionAction::StartShard(shard) => {
                    let token = g.state.fencing_token(shard);
                    tracing::debug!(entity_type = %self.type_name, shard, ?token, "hosting shard");
                    self.local.set_fencing_token(shard, token);
                    // While fenced, remembered entities start when the fence is lifted.
                    if let Some(r) = self
                        .placement
                        .remember
                        .as_ref()
                        .filter(|_| g.fenced.is_none() && !self.stopped.load(Ordering::SeqCst))
                    {
                        r.shard_started(shard, token);
                    }
                }
                RegionAction::StopShard(shard) => {
                    tracing::debug!(entity_type = %self.type_name, shard, "stopping shard");
                    // Messages the fence holds for this shard go with it (ahead of what the
                    // shard buffers now): held until the fence lifts, they would reach the
                    // new home after newer ones, or be lost if this node then stops.
                    if let Some(held) = &mut g.fenced {
                        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(held)
                            .into_iter()
                            .partition(|(s, _, _, _)| *s == shard);
                        *held = rest;
                        g.held_sent.remove(&shard);
                        if !mine.is_empty() {
                            let envelopes = mine
                                .into_iter()
                                .map(|(_, id, msg, _)| Envelope::new(&id, shard, msg))
                                .collect();
                            self.handle_locked(g, RegionInput::Held { shard, envelopes });
                        }
                    }
                    self.metrics.handoffs.increment(1);
                    let (began, took) = (Instant::now(), self.metrics.handoff_seconds.clone());
                    // The shard is reported stopped once its entities stopped and, with
                    // remember entities, a majority of replicas hold its ids.
                    let flushed = self
                        .placement
                        .remember
                        .as_ref()
                        .map(|r| (self.system().runtime().clone(), r.shard_stopping(shard)));
                    let tx = self.events.clone();
                    self.local.stop_shard(
                        shard,
                        Box::new(move || match flushed {
                            None => {
                                took.record(began.elapsed());
                                let _ = tx.send(RegionEvent::ShardStopped(shard));
                            }
                            Some((runtime, flushed)) => {
                                runtime.spawn(async move {
                                    flushed.await;
                                    took.record(began.elapsed());
                                    let _ = tx.send(RegionEvent::ShardStopped(shard));
                                });
                            }
                        }),
                    );
                }
                RegionAction::ForceStopShard(shard) => {
                    self.local
                        .force_stop_shard(shard, self.unhandled_to_loop(shard, false));
                }
                RegionAction::Rejected(r) => {
                    let reason = match r.error {
                        SendError::BadShard { .. } => "shard out of range (another shard count)",
                        SendError::Refused(_) => "region refused by the coordinator",
                        SendError::BufferFull { .. } => "region buffer full",
                    };
                    self.dead_letter(&r.envelope.entity_id, reason);
                }
                RegionAction::Refused(e) => {
                    tracing::error!(
                        entity_type = %self.type_name,
                        region = %self.self_id,
                        "region refused by the coordinator: {e}; every message to this entity \
                         type fails on this node"
                    );
                }
                RegionAction::LeaveComplete => {
                    self.leave_complete.send_replace(true);
                }
            }
        }
    }

    fn send_coordinator(&self, g: &mut Inner<M>, msg: CoordWire) {
        let Some(node) = &g.coord else { return };
        if node == self.cluster.self_node() {
            let _ = self.coordinator.send(CoordEvent::Wire(msg));
        } else if let Some(r) = &g.coord_ref {
            if let Err(e) = r.try_tell_control(msg) {
                tracing::debug!(entity_type = %self.type_name, "message to the coordinator not sent: {e}");
            }
        }
    }

    /// Records a message this layer gives up on as a dead letter, and counts it.
    fn dead_letter(&self, id: &str, reason: &'static str) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        self.dead_letter_counted(id, reason);
    }

    /// Records a dead letter that the local host counted already (its entity refused it).
    fn dead_letter_counted(&self, id: &str, reason: &'static str) {
        self.system().record_dead_letter(
            &format_args!("{}/{}", self.type_name, id),
            std::any::type_name::<M>(),
            reason,
        );
    }

    async fn run(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<RegionEvent<M>>,
        tick: std::time::Duration,
    ) {
        let system = self.system().clone();
        let mut sub = self.cluster.subscribe();
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.on_membership(None, &mut rx);
        loop {
            tokio::select! {
                _ = system.shutdown_started() => break,
                _ = ticks.tick() => {
                    self.on_membership(None, &mut rx);
                    self.input(RegionInput::Tick);
                    self.resend_fences();
                }
                ev = rx.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                ev = sub.recv() => match ev {
                    Ok(Event::Stopped(_)) | Err(RecvError::Closed) => break,
                    Ok(Event::Cluster(ev)) => {
                        // The event is published before the state it leads to: take a downed
                        // or removed member from the event itself.
                        let gone = match ev {
                            ClusterEvent::MemberDowned(m) => Some(m.node),
                            ClusterEvent::MemberRemoved { node, .. } => Some(node),
                            _ => None,
                        };
                        self.on_membership(gone, &mut rx);
                    }
                    Err(RecvError::Lagged(_)) => self.on_membership(None, &mut rx),
                },
            }
        }
        self.node_stopped();
        // Unhandled messages of stopped entities still on their way are dead letters now.
        while let Ok(ev) = rx.try_recv() {
            match ev {
                RegionEvent::FencedUnhandled(_, id, msgs) => {
                    for _ in msgs {
                        self.dead_letter(&id, "node stopped while fenced");
                    }
                }
                RegionEvent::Unhandled(_, envelopes) => {
                    for env in envelopes {
                        self.dead_letter(&env.entity_id, "cluster node stopped");
                    }
                }
                RegionEvent::ShardStopped(_) => {}
            }
        }
    }

    fn on_event(&self, ev: RegionEvent<M>) {
        let mut g = self.change();
        self.on_event_in(&mut g, ev);
    }

    /// [`on_event`](Self::on_event) under the region's lock.
    fn on_event_in(&self, g: &mut Inner<M>, ev: RegionEvent<M>) {
        match ev {
            RegionEvent::ShardStopped(shard) => {
                self.handle_locked(g, RegionInput::ShardStopped(shard))
            }
            RegionEvent::Unhandled(shard, envelopes) => {
                self.handle_locked(g, RegionInput::Unhandled { shard, envelopes })
            }
            RegionEvent::FencedUnhandled(shard, id, msgs) => {
                self.on_fenced_unhandled_in(g, shard, &id, msgs)
            }
        }
    }

    /// Reads the membership (plus `gone`, a member an event just reported downed or removed).
    /// `rx`, the region's events, is for a fence lift (see [`on_fence`](Self::on_fence)).
    fn on_membership(
        &self,
        gone: Option<UniqueAddress>,
        rx: &mut mpsc::UnboundedReceiver<RegionEvent<M>>,
    ) {
        let state = self.cluster.state();
        let me = self.cluster.self_node();
        // Before this node is a member (the type may be started before it joined) it is not
        // gone; once it was one, Down or removed means stop hosting.
        if state.self_member().is_some() {
            self.joined.store(true, Ordering::Relaxed);
        }
        let joined = self.joined.load(Ordering::Relaxed);
        if state.stopped.is_some() || (joined && is_gone(&state, me)) || gone.as_ref() == Some(me) {
            self.node_stopped();
            return;
        }
        self.on_fence(state.fenced, Some(rx));
        let role = self.placement.role.as_deref();
        let dir = &self.placement.directory;
        // The region's proxy flag depends on this node's roles: wait until it is a member.
        let my_roles = state.self_member().map(|m| m.has_role(role));
        let coord = match my_roles {
            Some(_) => coordinator_node(&state, role, |n| dir.hosts(n, &self.type_name)),
            None if role.is_some() => None,
            None => coordinator_node(&state, role, |n| dir.hosts(n, &self.type_name)),
        };
        let mut inputs = Vec::new();
        {
            let mut g = self.change();
            let proxy = self.placement.proxy || my_roles == Some(false);
            if proxy != g.state.is_proxy() {
                g.state.set_proxy(proxy);
            }
            if coord != g.coord {
                g.coord_ref = coord.as_ref().filter(|n| *n != me).map(|n| {
                    self.cluster
                        .remote()
                        .lookup(&coordinator_path(&self.type_name), &n.address)
                });
                g.coord = coord.clone();
                if coord.is_some() {
                    inputs.push(RegionInput::CoordinatorChanged);
                }
            }
            // Peers whose node is gone: forget them as homes (and as fence senders).
            let known: Vec<RegionId> = g.peers.keys().cloned().collect();
            let mut candidates: BTreeSet<RegionId> = known.into_iter().collect();
            for m in &state.members {
                candidates.insert(region_id(&m.node));
            }
            // Cached homes too: after a lagged event stream a home's node may have been
            // removed with no event seen and never have been sent to (so not a peer).
            candidates.extend(g.state.cached_homes());
            let just_gone = gone.as_ref().map(region_id);
            candidates.extend(just_gone.clone());
            for m in &state.members {
                g.seen.insert(m.node.clone());
            }
            for r in candidates {
                if g.gone.contains(&r) || r == self.self_id {
                    continue;
                }
                // A node missing from this view is gone only if this region saw it before
                // (or a newer process of it): a home on a node that joined after this
                // view was taken (gossip lags the coordinator) is not stale, and being
                // marked gone is for good.
                let gone = just_gone.as_ref() == Some(&r)
                    || super::wire::region_node(&r).is_none_or(|n| match state.member(&n) {
                        Some(_) => is_gone(&state, &n),
                        None => g.seen.contains(&n) || is_replaced(&state, &n),
                    });
                if gone {
                    if let Some(n) = super::wire::region_node(&r) {
                        g.seen.remove(&n);
                    }
                    g.gone.insert(r.clone());
                    g.peers.remove(&r);
                    inputs.push(RegionInput::RegionDown(r));
                }
            }
        }
        for input in inputs {
            self.input(input);
        }
    }

    /// Follows the node's fence. Fenced (on its own view the split brain resolver would down
    /// this node): every hosted shard's entities are stopped at once and messages for them
    /// are held, because the winning side restarts them `down_margin` after it downed this
    /// node. Lifted (a majority reachable again, no decision against this node): the held
    /// messages are delivered, in order, and entities start again on demand.
    ///
    /// A lift first calls the stops off, which it does only while no entity the fence stopped
    /// is handing its unhandled messages over (else it waits for the next tick); then it
    /// takes the events already queued in `rx` (every such hand-over has sent its messages
    /// by then) before it delivers what it held: the messages an entity had not handled are
    /// older than those held for it meanwhile.
    fn on_fence(&self, fenced: bool, rx: Option<&mut mpsc::UnboundedReceiver<RegionEvent<M>>>) {
        let mut g = self.change();
        // Read under the lock: a membership update that read the flag before a concurrent
        // `hold_for_leave` set it must not lift that hold.
        let fenced = fenced || self.held_for_leave.load(Ordering::SeqCst);
        match (fenced, g.fenced.is_some()) {
            (true, false) => {
                g.fenced = Some(Vec::new());
                g.held_sent.clear();
                let hosted = g.state.hosted_shards();
                if self.held_for_leave.load(Ordering::SeqCst) {
                    tracing::info!(entity_type = %self.type_name, shards = hosted.len(), "leave out of time: stopping the entities of every shard still here");
                } else {
                    self.metrics.fenced.increment(1);
                    tracing::warn!(entity_type = %self.type_name, shards = hosted.len(), "node fenced: stopping the entities of every hosted shard");
                }
                for shard in hosted {
                    if let Some(r) = &self.placement.remember {
                        r.shard_stopped(shard);
                    }
                    self.local.stop_shard(shard, Box::new(|| {}));
                    // At once, not after each entity's backlog: the winning side starts the
                    // shard again `down_margin` after it downs this node, and an entity still
                    // working through its mailbox here then would be a second live copy.
                    // What the entities had not handled is held with what arrives meanwhile.
                    self.local
                        .force_stop_shard(shard, self.unhandled_to_loop(shard, true));
                }
            }
            (false, true) => {
                let hosted = g.state.hosted_shards();
                let hosting =
                    |view: ShardView| matches!(view, ShardView::Local | ShardView::HandingOff);
                let resumed: Vec<ShardId> = hosted
                    .iter()
                    .copied()
                    .filter(|s| hosting(g.state.shard_view(*s)))
                    .collect();
                if !self.local.cancel_stops_unless_handing_on(&resumed) {
                    tracing::debug!(entity_type = %self.type_name, "fence lift waits for the unhandled messages of stopped entities");
                    return;
                }
                if let Some(rx) = rx {
                    while let Ok(ev) = rx.try_recv() {
                        self.on_event_in(&mut g, ev);
                    }
                }
                let held = g.fenced.take().unwrap_or_default();
                g.held_sent.clear();
                tracing::info!(entity_type = %self.type_name, held = held.len(), "fence lifted: hosting again");
                // A shard still hosted here hosts again: the fence's stop of its entities was
                // called off above (those still ending come back with what they had not
                // handled). So is one whose hand-off began but has not stopped it yet (its
                // entities live until the hand-off stops them, and the hand-off may be called
                // off); a shard the hand-off is stopping keeps stopping. Remembered entities
                // start after that: one still ending starts again when it has ended.
                if let Some(r) = &self.placement.remember {
                    for shard in hosted {
                        if hosting(g.state.shard_view(shard)) {
                            r.shard_started(shard, g.state.fencing_token(shard));
                        }
                    }
                }
                // Held messages go through the state machine, per shard in order, as
                // accepted ones: to the entity here, the shard's entities running here (it
                // is hosted, or its hand-off began but has not stopped it; a shard stopped
                // while fenced took its held messages along), never to an entity started
                // here for a shard this node no longer owns.
                let mut by_shard: Vec<(ShardId, Vec<Envelope<M>>)> = Vec::new();
                for (shard, id, msg, _) in held {
                    let env = Envelope::new(&id, shard, msg);
                    match by_shard.iter_mut().find(|(s, _)| *s == shard) {
                        Some((_, envelopes)) => envelopes.push(env),
                        None => by_shard.push((shard, vec![env])),
                    }
                }
                for (shard, envelopes) in by_shard {
                    self.handle_locked(&mut g, RegionInput::Held { shard, envelopes });
                }
            }
            _ => {}
        }
    }

    /// Where a force-stopped entity of `shard` hands what it had not handled: to the region's
    /// event loop (as a hand-off's or, if `fenced`, as the fence's), or, once that loop has
    /// ended, to the dead letters, never silently away.
    fn unhandled_to_loop(&self, shard: ShardId, fenced: bool) -> crate::region::Unhandled<M> {
        let tx = self.events.clone();
        let system = self.system().clone();
        let type_name = self.type_name.clone();
        let rejected = self.rejected.clone();
        Arc::new(move |id: EntityId, msgs: Vec<M>| {
            let count = msgs.len();
            let event = if fenced {
                RegionEvent::FencedUnhandled(shard, id.clone(), msgs)
            } else {
                let envelopes = msgs
                    .into_iter()
                    .map(|m| Envelope::new(&*id, shard, m))
                    .collect();
                RegionEvent::Unhandled(shard, envelopes)
            };
            if tx.send(event).is_err() {
                rejected.fetch_add(count as u64, Ordering::Relaxed);
                for _ in 0..count {
                    system.record_dead_letter(
                        &format_args!("{type_name}/{id}"),
                        std::any::type_name::<M>(),
                        "cluster node stopped",
                    );
                }
            }
        })
    }

    /// Sends again the fences a full peer queue refused (in order, behind what was queued
    /// to that peer before them).
    fn resend_fences(&self) {
        let mut g = self.inner.lock();
        if g.unsent_fences.is_empty() {
            return;
        }
        let unsent = std::mem::take(&mut g.unsent_fences);
        for (to, fence) in unsent {
            if g.gone.contains(&to) {
                continue; // the owner is gone: nobody waits for this fence any more
            }
            let Some(r) = g.peers.get(&to) else { continue };
            if let Err(refused) = r.try_send(fence) {
                match refused.msg {
                    Some(fence) => g.unsent_fences.push((to, fence)),
                    None => {
                        tracing::error!(entity_type = %self.type_name, region = %to, "fence not encodable: {}", refused.error)
                    }
                }
            }
        }
    }

    /// Messages an entity stopped by the fence had accepted but not handled: held ahead of
    /// the messages for the same entity that arrived while fenced (they are older), or, if
    /// the fence has been lifted meanwhile, delivered; dead letters once the node stopped.
    /// Called with the region's lock held (`g`).
    fn on_fenced_unhandled_in(&self, g: &mut Inner<M>, shard: ShardId, id: &str, msgs: Vec<M>) {
        if self.stopped.load(Ordering::SeqCst) {
            for _ in msgs {
                self.dead_letter(id, "node stopped while fenced");
            }
            return;
        }
        // Its entities run here: hosted, or a hand-off that has not stopped them yet (what
        // the state machine delivers here, and the fence holds).
        let local = matches!(
            g.state.shard_view(shard),
            ShardView::Local | ShardView::HandingOff
        );
        match &mut g.fenced {
            Some(held) if local => {
                // Accepted before the fence: kept even past the held buffer's bound.
                let at = held
                    .iter()
                    .position(|(s, held_id, _, _)| *s == shard && held_id == id)
                    .unwrap_or(held.len());
                let owned: String = id.to_string();
                held.splice(
                    at..at,
                    msgs.into_iter().map(|m| (shard, owned.clone(), m, true)),
                );
            }
            // Not fenced any more, or the shard is stopping or has moved: through the state
            // machine, like the unhandled messages of a hand-off.
            _ => {
                let envelopes = msgs
                    .into_iter()
                    .map(|m| Envelope::new(id, shard, m))
                    .collect();
                self.handle_locked(g, RegionInput::Unhandled { shard, envelopes });
            }
        }
    }

    /// This node left the cluster (or was downed, or the system shuts down): stop hosting.
    fn node_stopped(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let (hosted, held, waiting) = {
            let mut g = self.change();
            let waiting: Vec<String> = g
                .state
                .take_buffered()
                .into_iter()
                .map(|e| e.entity_id)
                .collect();
            (
                g.state.hosted_shards(),
                {
                    g.held_sent.clear();
                    g.fenced.take().unwrap_or_default()
                },
                waiting,
            )
        };
        let reason = if self.held_for_leave.load(Ordering::SeqCst) {
            "cluster node left before the shard was handed off"
        } else {
            "cluster node stopped while fenced"
        };
        for (_, id, _, _) in held {
            self.dead_letter(&id, reason);
        }
        // Messages waiting for a home (or for a shard to finish moving) go nowhere now.
        for id in waiting {
            self.dead_letter(&id, "cluster node stopped before the shard had a home");
        }
        tracing::info!(entity_type = %self.type_name, shards = hosted.len(), "cluster node stopped: stopping hosted shards");
        for shard in hosted {
            if let Some(r) = &self.placement.remember {
                r.shard_stopped(shard);
            }
            self.local.stop_shard(shard, Box::new(|| {}));
            // Downed or gone: the shard starts elsewhere, so its entities stop after their
            // current message; what they had not handled is a dead letter here (the fenced
            // path records them so once `stopped` is set).
            self.local
                .force_stop_shard(shard, self.unhandled_to_loop(shard, true));
        }
    }
}

impl<M> RegionCore<M> for ClusterRegion<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    fn deliver(&self, shard: ShardId, id: &str, msg: M) -> Result<(), TellError<M>> {
        if self.stopped.load(Ordering::Relaxed) {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(TellError::Stopped(msg));
        }
        // A shard hosted here: what `send` + `DeliverLocal` would do, without an envelope and
        // without the region lock. The gate keeps every change that could move the shard
        // away waiting until this delivery is in the entity's mailbox, so it stays in order
        // with the shard's transitions (a hand-off stops the entities after it).
        if let Some(_gate) = self.direct(shard) {
            return self.deliver_here(shard, id, msg);
        }
        let mut g = self.inner.lock();
        let mut out = std::mem::take(&mut g.out);
        let res = g.state.send(
            self.coarse_now_ms(),
            Envelope::new(id, shard, msg),
            &mut out,
        );
        self.execute(&mut g, &mut out);
        g.out = out;
        // This send forwarded at most one envelope, its own: if the peer's queue handed it
        // back, the caller gets it back (`tell` records a dead letter, `ask` fails at once).
        if res.is_ok() && g.refused.last().is_some_and(|e| e.entity_id == id) {
            let env = g.refused.pop().expect("checked");
            self.drop_refused(&mut g);
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(TellError::MailboxFull(env.payload));
        }
        self.drop_refused(&mut g);
        self.debug_check_flag(&g, shard);
        if res.is_err() {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        res.map_err(|r| match r.error {
            SendError::BufferFull { .. } => TellError::MailboxFull(r.envelope.payload),
            // (The region's asks and dead letters say why: `RegionCore::refusal`.)
            SendError::Refused(_) | SendError::BadShard { .. } => {
                TellError::Stopped(r.envelope.payload)
            }
        })
    }

    fn shard_count(&self) -> u32 {
        self.shard_count
    }

    fn shard_of(&self, id: &str) -> ShardId {
        self.local.shard_of(id)
    }

    fn refusal(&self) -> Option<String> {
        match &*self.registration.borrow() {
            Registration::Refused(e) => Some(
                super::sharding::refusal(&self.type_name, self.shard_count, e.clone()).to_string(),
            ),
            _ => None,
        }
    }

    fn type_name(&self) -> &str {
        &self.type_name
    }

    fn system(&self) -> &ActorSystem {
        self.local.system()
    }

    fn stats(&self) -> RegionStats {
        let mut stats = self.local.stats();
        let g = self.inner.lock();
        stats.buffered_messages += g.state.buffered() + g.fenced.as_ref().map_or(0, Vec::len);
        stats.rejected_total += self.rejected.load(Ordering::Relaxed);
        stats
    }

    fn shard_entities(&self) -> Vec<usize> {
        self.local.shard_entities()
    }

    fn passivate(&self, id: &str) -> bool {
        self.local.passivate(id)
    }
}

/// Whether a peer's message for shard `sent`, whose entity this node's shard function puts in
/// shard `here`, shows that the two nodes map entity ids differently. A shard outside this
/// node's `shard_count` is not that: the peer has another shard count, and the state machine
/// hands such a message back as [`SendError::BadShard`] (dead letter "another shard count").
fn maps_differently(shard_count: u32, sent: ShardId, here: ShardId) -> bool {
    sent < shard_count && sent != here
}

#[cfg(test)]
mod tests {
    use super::maps_differently;

    /// Found by a review on 2026-11-30: a peer with another shard count was logged as one
    /// with another shard function, and its messages never reached the `BadShard` path.
    #[test]
    fn an_out_of_range_shard_is_another_shard_count_not_another_shard_function() {
        assert!(!maps_differently(8, 999, 3));
        assert!(!maps_differently(8, 8, 3));
        assert!(maps_differently(8, 5, 3));
        assert!(!maps_differently(8, 3, 3));
    }
}
