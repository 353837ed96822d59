//! The coordinator driver: one task per entity type on every node; the one on the oldest `Up`
//! member reads the replicated state from a majority, recovers a [`Coordinator`] with a new
//! epoch, and drives it: region messages in, `ToRegion` out, every `Persist` replicated to a
//! majority of members before `Persisted` is fed back.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::{Cluster, ClusterState, Event};
use shardik_remote::RemoteRef;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::directory::Directory;
use super::membership::{
    coordinator_node, has_role, is_flagged, is_gone, is_leaving, is_replaced, is_stable, majority,
    never_seen, quorum_members,
};
use super::replica::ReplicaStore;
use super::settings::ClusterShardingSettings;
use super::wire::{
    region_addr, region_control_path, region_node, CoordWire, PromiseAck, ReplicaAck, ReplicaReq,
    REPLICA_PATH,
};
use crate::coordination::{
    next_epoch, Action, Coordinator, CoordinatorConfig, CoordinatorState, Epoch, Input, RegionId,
    ToCoordinator, ToRegion, Version,
};

/// What the coordinator driver reacts to besides membership and ticks.
pub(crate) enum CoordEvent {
    /// A message to the coordinator endpoint (from a remote region or the local one).
    Wire(CoordWire),
    /// A replica answered a write.
    Acked {
        epoch: Epoch,
        node: UniqueAddress,
        ack: ReplicaAck,
    },
    /// A replica answered the promise request of recovery attempt `attempt`.
    Promised {
        attempt: u64,
        node: UniqueAddress,
        ack: PromiseAck,
    },
}

/// What the node's coordinator looks like from outside (introspection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorSnapshot {
    /// The coordinator's epoch.
    pub epoch: Epoch,
    /// Its durable (majority-replicated) state.
    pub state: CoordinatorState,
    /// Hand-offs running now.
    pub handoffs: usize,
}

/// Delivers a coordinator message to this node's region directly (no network).
pub(crate) type LocalRegionSink = Arc<dyn Fn(ToRegion) + Send + Sync>;

pub(crate) struct Ctx {
    pub(crate) type_name: String,
    pub(crate) cluster: Cluster,
    pub(crate) replicas: Arc<ReplicaStore>,
    pub(crate) directory: Arc<Directory>,
    pub(crate) settings: ClusterShardingSettings,
    pub(crate) clock: Instant,
    pub(crate) events: mpsc::UnboundedSender<CoordEvent>,
    pub(crate) local_region: LocalRegionSink,
    pub(crate) snapshot: Arc<Mutex<Option<CoordinatorSnapshot>>>,
}

impl Ctx {
    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn me(&self) -> &UniqueAddress {
        self.cluster.self_node()
    }

    fn role(&self) -> Option<&str> {
        self.settings.role.as_deref()
    }

    fn quorum(&self, state: &ClusterState) -> Vec<UniqueAddress> {
        quorum_members(state, self.role())
    }
}

struct Active {
    coord: Coordinator,
    /// The durable state plus every update emitted so far: what is replicated.
    target: CoordinatorState,
    /// The highest version each replica acknowledged for this epoch.
    acked: HashMap<UniqueAddress, Version>,
    /// The last version fed back as `Persisted`.
    fed: Version,
    last_replicate: Instant,
    /// Replicas with a write in flight, since when.
    inflight: HashMap<UniqueAddress, Instant>,
    fed_down: BTreeSet<RegionId>,
    fed_leaving: BTreeSet<RegionId>,
    /// Regions fed as unreachable (their node flagged or gone: [`is_flagged`]) and not
    /// reachable again since.
    fed_unreachable: BTreeSet<RegionId>,
    /// When each region's node was first seen gone (`Down` or removed without leaving).
    gone_since: HashMap<RegionId, Instant>,
    /// Regions whose node is missing from the view although this node never saw it as a
    /// member, since when (see [`UNSEEN_GRACE`]).
    unseen_since: HashMap<RegionId, Instant>,
    stable: Option<bool>,
    refs: HashMap<String, RemoteRef<ToRegion>>,
    fenced: bool,
}

struct Recovery {
    attempt: u64,
    started: Instant,
    /// The epoch this attempt takes over with (promised by the replicas that granted).
    epoch: Epoch,
    /// The states of the replicas that granted the promise.
    results: HashMap<UniqueAddress, Option<CoordinatorState>>,
    /// Recovering from the majority's state failed (a shard count mismatch): not tried
    /// again in this attempt (the next starts after `replication_timeout`).
    failed: bool,
}

pub(crate) struct CoordinatorDriver {
    ctx: Ctx,
    config: CoordinatorConfig,
    active: Option<Active>,
    recovery: Option<Recovery>,
    attempt: u64,
    published: Option<(Epoch, Version, usize)>,
    /// When the type was started on this node (see [`SETTLE`]).
    started: Instant,
    /// Every node this node's view has held as a member since the type started here.
    seen: BTreeSet<UniqueAddress>,
    /// The highest epoch a replica reported beyond what this node's replica knows (a
    /// refused promise or write): the next takeover starts above it.
    highest_seen: Epoch,
    /// Since when this node, which would be the coordinator, waits for `min_quorum` members,
    /// and when it last said so (see [`QUORUM_WARN_AFTER`]).
    short_of_quorum: Option<(Instant, Option<Instant>)>,
    metrics: crate::metrics::CoordinatorMetrics,
}

/// A node that would be the coordinator but waits for `min_quorum` members warns once it has
/// waited this long, and again every [`QUORUM_WARN_EVERY`] (a `min_quorum` above the number
/// of members with the type's role leaves the type without a coordinator for good, and
/// nothing else would say so).
const QUORUM_WARN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// See [`QUORUM_WARN_AFTER`].
const QUORUM_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// A node that would be the coordinator while an older member (with the role) does not host
/// the type waits this long after starting the type: the older member may be starting it
/// too (its announcement in flight), and becoming the coordinator only to hand over to it at
/// once would cost a takeover. The oldest member with the role never waits.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a region whose node this node has never seen as a member may be missing from the
/// view before it counts as gone. Such a node may have joined and registered with the
/// previous coordinator while the gossip that brings it here is still on its way (counting it
/// gone would move its shards while it runs them); or it may have been removed before this
/// node ever saw it. Nodes seen before and missing now are gone at once, as are replaced ones.
const UNSEEN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl CoordinatorDriver {
    pub(crate) fn new(ctx: Ctx, config: CoordinatorConfig) -> Self {
        let metrics = crate::metrics::CoordinatorMetrics::new(&ctx.type_name, &ctx.me().node_id);
        metrics.set(None);
        CoordinatorDriver {
            metrics,
            ctx,
            config,
            active: None,
            recovery: None,
            attempt: 0,
            published: None,
            started: Instant::now(),
            seen: BTreeSet::new(),
            highest_seen: 0,
            short_of_quorum: None,
        }
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<CoordEvent>) {
        let system = self.ctx.cluster.remote().system().clone();
        let mut sub = self.ctx.cluster.subscribe();
        let mut tick = tokio::time::interval(self.ctx.settings.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.on_membership();
        loop {
            let margin_over = self.margin_over();
            tokio::select! {
                _ = system.shutdown_started() => break,
                _ = tick.tick() => {
                    self.on_membership();
                    self.on_tick();
                }
                // A gone region's `down_margin` ends: reallocate now, not on the next tick.
                _ = async {
                    match margin_over {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => self.on_membership(),
                ev = rx.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                ev = sub.recv() => match ev {
                    Ok(Event::Stopped(_)) | Err(RecvError::Closed) => break,
                    Ok(Event::Cluster(_)) | Err(RecvError::Lagged(_)) => self.on_membership(),
                },
            }
            self.publish();
        }
        self.active = None;
        self.metrics.set(None);
        *self.ctx.snapshot.lock() = None;
    }

    /// When the next `down_margin` of a gone region not yet fed down ends, if still ahead
    /// (one already over is handled by the next tick).
    fn margin_over(&self) -> Option<Instant> {
        let a = self.active.as_ref()?;
        let now = Instant::now();
        a.gone_since
            .iter()
            .filter(|(r, _)| !a.fed_down.contains(*r))
            .map(|(_, since)| *since + self.ctx.settings.down_margin)
            .filter(|at| *at > now)
            .min()
    }

    fn publish(&mut self) {
        let now = self.active.as_ref().map(|a| {
            (
                a.coord.epoch(),
                a.coord.state().version,
                a.coord.handoffs().count(),
            )
        });
        if now == self.published {
            return;
        }
        self.published = now;
        self.metrics.set(
            self.active
                .as_ref()
                .map(|a| (a.coord.state().shards.len(), a.coord.handoffs().count())),
        );
        *self.ctx.snapshot.lock() = self.active.as_ref().map(|a| CoordinatorSnapshot {
            epoch: a.coord.epoch(),
            state: a.coord.state().clone(),
            handoffs: a.coord.handoffs().count(),
        });
    }

    fn on_membership(&mut self) {
        let state = self.ctx.cluster.state();
        self.seen
            .extend(state.members.iter().map(|m| m.node.clone()));
        let dir = &self.ctx.directory;
        let oldest = coordinator_node(&state, self.ctx.role(), |n| {
            dir.hosts(n, &self.ctx.type_name)
        });
        let me = self.ctx.me();
        let settling = self.active.is_none()
            && self.started.elapsed() < SETTLE
            && state.self_member().is_some_and(|mine| {
                state.members.iter().any(|m| {
                    m.status == MemberStatus::Up
                        && m.has_role(self.ctx.role())
                        && m.age_key() < mine.age_key()
                })
            });
        if state.stopped.is_some() || oldest.as_ref() != Some(me) || settling {
            if self.active.take().is_some() {
                tracing::info!(entity_type = %self.ctx.type_name, "no longer the coordinator");
            }
            self.recovery = None;
            // Not waiting for a quorum either: a later wait starts its warning delay afresh.
            self.short_of_quorum = None;
            return;
        }
        if self.active.as_ref().is_some_and(|a| a.fenced) {
            // A newer coordinator wrote to the replicas; start over from their state (first,
            // so that the check below applies to that recovery too: before 2026-11-29 a
            // coordinator that stepped down recovered at once, from a majority of however few
            // members were left).
            self.active = None;
        }
        let members = self.ctx.quorum(&state).len();
        if self.active.is_none() && members < self.ctx.settings.min_quorum {
            // Too few members to trust a majority read (see `min_quorum`): wait for more.
            self.recovery = None;
            self.warn_short_of_quorum(members);
            return;
        }
        self.short_of_quorum = None;
        if self.active.is_none() {
            match self.recovery {
                None => self.start_recovery(&state),
                // Members that are gone no longer count: the answers already in may be a
                // majority of the smaller membership (else it waited for the timeout).
                Some(_) => self.try_finish_recovery(),
            }
        }
        if let Some(a) = &mut self.active {
            a.feed_membership(&self.ctx, &state, &self.seen);
        }
    }

    /// Logs, rate-limited, that the type has no coordinator because only `members` of the
    /// `min_quorum` members it needs are `Up` or `Leaving` with its role.
    fn warn_short_of_quorum(&mut self, members: usize) {
        let now = Instant::now();
        let (since, last) = self.short_of_quorum.get_or_insert((now, None));
        if now.duration_since(*since) < QUORUM_WARN_AFTER
            || last.is_some_and(|t| now.duration_since(t) < QUORUM_WARN_EVERY)
        {
            return;
        }
        *last = Some(now);
        tracing::warn!(
            entity_type = %self.ctx.type_name,
            role = ?self.ctx.role(),
            members,
            min_quorum = self.ctx.settings.min_quorum,
            waited_s = now.duration_since(*since).as_secs(),
            "the type has no coordinator: fewer members with its role are Up or Leaving than \
             its min_quorum; nothing is allocated until more join (is min_quorum larger than \
             the cluster?)"
        );
    }

    fn on_tick(&mut self) {
        if let Some(a) = &mut self.active {
            a.input(&self.ctx, Input::Tick);
            let retry = self.ctx.settings.replication_timeout / 2;
            if a.target.version > a.fed && a.last_replicate.elapsed() >= retry {
                a.replicate(&self.ctx);
            }
        }
        if self
            .recovery
            .as_ref()
            .is_some_and(|r| r.started.elapsed() >= self.ctx.settings.replication_timeout)
        {
            let state = self.ctx.cluster.state();
            self.start_recovery(&state);
        }
    }

    fn on_event(&mut self, ev: CoordEvent) {
        match ev {
            CoordEvent::Wire(w) => {
                let Some(a) = &mut self.active else {
                    return; // not the coordinator (yet): the region retries
                };
                let input = match w {
                    CoordWire::Region { from, mut msg } => {
                        // A region whose node this view does not hold yet registers later (it
                        // retries): a region absent from the membership counts as gone.
                        let state = self.ctx.cluster.state();
                        let Some(node) = region_node(&from).filter(|n| !is_gone(&state, n)) else {
                            return;
                        };
                        // A node without the type's role never hosts it, whatever it says.
                        if let ToCoordinator::Register { proxy, .. } = &mut msg {
                            if !has_role(&state, &node, self.ctx.role()) {
                                *proxy = true;
                            }
                        }
                        Input::Message { from, msg }
                    }
                    CoordWire::Leaving { region } => Input::RegionLeaving(region),
                };
                a.input(&self.ctx, input);
            }
            CoordEvent::Acked { epoch, node, ack } => {
                if !ack.accepted {
                    self.highest_seen = self.highest_seen.max(ack.epoch);
                }
                if let Some(a) = &mut self.active {
                    if a.coord.epoch() == epoch {
                        a.on_ack(&self.ctx, node, ack);
                    }
                }
            }
            CoordEvent::Promised { attempt, node, ack } => self.on_promised(attempt, node, ack),
        }
    }

    /// Starts a takeover: picks an epoch above every one known here and asks the replicas of
    /// a majority to promise it (see `ReplicaStore::promise`), which also reads their state.
    fn start_recovery(&mut self, state: &ClusterState) {
        self.attempt += 1;
        let attempt = self.attempt;
        let me = self.ctx.me().clone();
        let known = self
            .highest_seen
            .max(self.ctx.replicas.highest_epoch(&self.ctx.type_name));
        let epoch = next_epoch(known, node_tag(self.ctx.cluster.self_node()));
        // Never the same epoch twice from this node, even if its own replica did not keep
        // the promise (a failing store): replicas holding a state of an earlier reign at
        // that epoch would be taken for this one's.
        self.highest_seen = self.highest_seen.max(epoch);
        self.recovery = Some(Recovery {
            attempt,
            started: Instant::now(),
            epoch,
            results: HashMap::new(),
            failed: false,
        });
        let timeout = self.ctx.settings.replication_timeout;
        for node in self.ctx.quorum(state) {
            if node == me {
                continue;
            }
            let r = self
                .ctx
                .cluster
                .remote()
                .lookup::<ReplicaReq>(REPLICA_PATH, &node.address);
            let tx = self.ctx.events.clone();
            let type_name = self.ctx.type_name.clone();
            tokio::spawn(async move {
                let res = r
                    .ask(
                        |reply| ReplicaReq::Promise {
                            type_name,
                            epoch,
                            reply,
                        },
                        timeout,
                    )
                    .await;
                if let Ok(ack) = res {
                    let _ = tx.send(CoordEvent::Promised { attempt, node, ack });
                }
            });
        }
        // This node's own replica, counted like any other (with a store, once it has the
        // promise).
        if self.ctx.replicas.is_durable() {
            let (replicas, tx) = (self.ctx.replicas.clone(), self.ctx.events.clone());
            let type_name = self.ctx.type_name.clone();
            tokio::spawn(async move {
                if let Some(ack) = replicas.promise_durable(&type_name, epoch).await {
                    let _ = tx.send(CoordEvent::Promised {
                        attempt,
                        node: me,
                        ack,
                    });
                }
            });
        } else {
            let ack = self.ctx.replicas.promise(&self.ctx.type_name, epoch);
            self.on_promised(attempt, me, ack);
        }
    }

    fn on_promised(&mut self, attempt: u64, node: UniqueAddress, ack: PromiseAck) {
        let Some(r) = &mut self.recovery else { return };
        if r.attempt != attempt {
            return;
        }
        if !ack.granted {
            // A newer takeover reached this replica first. Try again above it, on the next
            // tick (not at once: two nodes that both take themselves for the coordinator
            // would outbid each other as fast as the network goes until their views agree).
            tracing::debug!(
                entity_type = %self.ctx.type_name,
                epoch = r.epoch,
                promised = ack.promised,
                "a replica promised a newer epoch; taking over again above it"
            );
            self.highest_seen = self.highest_seen.max(ack.promised);
            self.recovery = None;
            return;
        }
        r.results.insert(node, ack.state);
        self.try_finish_recovery();
    }

    fn try_finish_recovery(&mut self) {
        let Some(r) = self.recovery.as_ref().filter(|r| !r.failed) else {
            return;
        };
        let state = self.ctx.cluster.state();
        let members = self.ctx.quorum(&state);
        if members.len() < self.ctx.settings.min_quorum {
            // Members left while it waited for answers: a majority of the few left is not
            // one `min_quorum` trusts.
            return;
        }
        let answered = r.results.keys().filter(|n| members.contains(n)).count();
        if answered < majority(members.len().max(1)) {
            return;
        }
        let best = r
            .results
            .values()
            .flatten()
            .max_by_key(|s| (s.epoch, s.version))
            .cloned()
            .unwrap_or_else(|| CoordinatorState::new(self.config.shard_count));
        let epoch = r.epoch;
        match Coordinator::recover(self.config.clone(), best.clone(), epoch) {
            Ok((coord, actions)) => {
                self.recovery = None;
                tracing::info!(
                    entity_type = %self.ctx.type_name,
                    epoch,
                    version = best.version,
                    shards = best.shards.len(),
                    "coordinator started from the majority's state"
                );
                let mut a = Active {
                    coord,
                    fed: best.version,
                    target: best,
                    acked: HashMap::new(),
                    last_replicate: Instant::now(),
                    inflight: HashMap::new(),
                    fed_down: BTreeSet::new(),
                    fed_leaving: BTreeSet::new(),
                    fed_unreachable: BTreeSet::new(),
                    gone_since: HashMap::new(),
                    unseen_since: HashMap::new(),
                    stable: None,
                    refs: HashMap::new(),
                    fenced: false,
                };
                a.process(&self.ctx, actions);
                a.feed_membership(&self.ctx, &state, &self.seen);
                self.active = Some(a);
            }
            Err(e) => {
                // Retried after the replication timeout; a shard count mismatch stays.
                tracing::error!(entity_type = %self.ctx.type_name, "coordinator cannot start: {e}");
                if let Some(r) = &mut self.recovery {
                    r.failed = true;
                }
            }
        }
    }
}

/// Wall-clock microseconds since the Unix epoch, for fencing tokens (0 if the clock is set
/// before 1970: tokens then count up from the last one).
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Active {
    fn input(&mut self, ctx: &Ctx, input: Input) {
        if !matches!(input, Input::Tick) {
            tracing::trace!(entity_type = %ctx.type_name, "coordinator input: {input:?}");
        }
        let mut out = Vec::new();
        self.coord.set_wall_clock(unix_micros());
        self.coord.handle(ctx.now_ms(), input, &mut out);
        self.process(ctx, out);
    }

    fn process(&mut self, ctx: &Ctx, actions: Vec<Action>) {
        let mut dirty = false;
        for action in actions {
            match action {
                Action::Persist(update) => {
                    if let Err(e) = self.target.apply(&update) {
                        tracing::error!(entity_type = %ctx.type_name, "coordinator update out of order: {e}");
                    }
                    dirty = true;
                }
                Action::Send { to, msg } => self.send(ctx, &to, msg),
            }
        }
        if dirty {
            self.replicate(ctx);
        }
    }

    fn send(&mut self, ctx: &Ctx, to: &RegionId, msg: ToRegion) {
        if let ToRegion::RegisterRefused { error, .. } = &msg {
            tracing::error!(entity_type = %ctx.type_name, region = %to, "coordinator refused a region: {error}");
        }
        let addr = region_addr(to);
        if addr == ctx.me().address {
            (ctx.local_region)(msg);
            return;
        }
        let r = self.refs.entry(addr.to_string()).or_insert_with(|| {
            ctx.cluster
                .remote()
                .lookup(&region_control_path(&ctx.type_name), addr)
        });
        if let Err(e) = r.try_tell_control(msg) {
            // Regions retry (Register, GetShardHome); hand-off steps are resent or time out.
            tracing::debug!(entity_type = %ctx.type_name, region = %to, "coordinator message not sent: {e}");
        }
    }

    /// Sends the target state to every member's replica (this node's directly). At most one
    /// write per replica is in flight: a replica that acknowledges an older version gets the
    /// newest state then, so a burst of updates costs one write per replica and round trip.
    ///
    /// With a durable replica store this node's own write is asynchronous too (it counts
    /// once the store has it), like a remote one.
    fn replicate(&mut self, ctx: &Ctx) {
        self.last_replicate = Instant::now();
        let me = ctx.me().clone();
        let durable = ctx.replicas.is_durable();
        let local = (!durable).then(|| ctx.replicas.write(&ctx.type_name, self.target.clone()));
        let timeout = ctx.settings.replication_timeout;
        let mut nodes = ctx.quorum(&ctx.cluster.state());
        if durable && !nodes.contains(&me) {
            nodes.push(me.clone());
        }
        for node in nodes {
            if (node == me && !durable)
                || self.acked.get(&node).copied().unwrap_or(0) >= self.target.version
            {
                continue;
            }
            if self
                .inflight
                .get(&node)
                .is_some_and(|t| t.elapsed() < timeout)
            {
                continue;
            }
            self.write_to(ctx, node);
        }
        if let Some(ack) = local {
            self.on_ack(ctx, me, ack);
        }
    }

    fn write_to(&mut self, ctx: &Ctx, node: UniqueAddress) {
        self.inflight.insert(node.clone(), Instant::now());
        let tx = ctx.events.clone();
        let state = self.target.clone();
        let epoch = self.coord.epoch();
        if node == *ctx.me() {
            // Only with a durable store: acknowledged once the store has it.
            let replicas = ctx.replicas.clone();
            let type_name = ctx.type_name.clone();
            tokio::spawn(async move {
                if let Some(ack) = replicas.write_durable(&type_name, state).await {
                    let _ = tx.send(CoordEvent::Acked { epoch, node, ack });
                }
            });
            return;
        }
        let r = ctx
            .cluster
            .remote()
            .lookup::<ReplicaReq>(REPLICA_PATH, &node.address);
        let type_name = ctx.type_name.clone();
        let timeout = ctx.settings.replication_timeout;
        tokio::spawn(async move {
            let res = r
                .ask(
                    |reply| ReplicaReq::Write {
                        type_name,
                        state,
                        reply,
                    },
                    timeout,
                )
                .await;
            if let Ok(ack) = res {
                let _ = tx.send(CoordEvent::Acked { epoch, node, ack });
            }
        });
    }

    fn on_ack(&mut self, ctx: &Ctx, node: UniqueAddress, ack: ReplicaAck) {
        if !ack.accepted && ack.epoch > self.coord.epoch() {
            if !self.fenced {
                tracing::warn!(
                    entity_type = %ctx.type_name,
                    epoch = self.coord.epoch(),
                    newer = ack.epoch,
                    "a newer coordinator wrote to the replicas; stepping down"
                );
            }
            self.fenced = true;
            return;
        }
        if ack.epoch == self.coord.epoch() {
            let v = self.acked.entry(node.clone()).or_insert(0);
            *v = (*v).max(ack.version);
        }
        if self.inflight.remove(&node).is_some()
            && self.acked.get(&node).copied().unwrap_or(0) < self.target.version
        {
            // Updates came while this write was in flight: send the newest state.
            self.write_to(ctx, node);
        }
        self.check_persisted(ctx);
    }

    fn check_persisted(&mut self, ctx: &Ctx) {
        if self.fenced {
            return;
        }
        let members = ctx.quorum(&ctx.cluster.state());
        let need = majority(members.len().max(1));
        let mut versions: Vec<Version> = members
            .iter()
            .map(|n| self.acked.get(n).copied().unwrap_or(0))
            .collect();
        versions.sort_unstable_by(|a, b| b.cmp(a));
        let v = versions
            .get(need - 1)
            .copied()
            .unwrap_or(0)
            .min(self.target.version);
        if v > self.fed {
            self.fed = v;
            self.input(ctx, Input::Persisted(v));
        }
    }

    fn feed_membership(&mut self, ctx: &Ctx, state: &ClusterState, seen: &BTreeSet<UniqueAddress>) {
        if self.fenced {
            return;
        }
        let stable = is_stable(state);
        if self.stable != Some(stable) {
            self.stable = Some(stable);
            self.input(ctx, Input::MembershipStable(stable));
        }
        let regions: BTreeSet<RegionId> = self
            .coord
            .working_state()
            .regions
            .keys()
            .chain(self.coord.live_regions())
            .cloned()
            .collect();
        let regions: Vec<(RegionId, UniqueAddress)> = regions
            .into_iter()
            .filter_map(|region| region_node(&region).map(|node| (region, node)))
            .collect();
        // A node a failure detector flagged may have crashed: no new shard goes there until
        // it is reachable again (its shards stay until it is down or left). A gone node
        // counts as flagged: removed without this view seeing it `Down`, it drops out of
        // `state.unreachable`, and fed reachable (which drives the leaves) it could be picked
        // as a leave target before `RegionGone` below. Every region newly flagged is fed
        // before any region reachable again: a `RegionReachable` drives the leaves at once,
        // which must not pick a region gone in the same update but not fed as flagged yet
        // (review on 2026-11-30).
        let mut reachable_again = Vec::new();
        for (region, node) in &regions {
            let flagged = is_flagged(state, node);
            if flagged && self.fed_unreachable.insert(region.clone()) {
                self.input(ctx, Input::RegionUnreachable(region.clone()));
            } else if !flagged && self.fed_unreachable.contains(region) {
                reachable_again.push(region.clone());
            }
        }
        for region in reachable_again {
            self.fed_unreachable.remove(&region);
            self.input(ctx, Input::RegionReachable(region));
        }
        for (region, node) in regions {
            if never_seen(state, &node, seen) {
                let since = match self.unseen_since.get(&region) {
                    Some(since) => *since,
                    None => {
                        // Held like a gone region's (no home on a node that may not be
                        // there, nothing new allocated to it) until it shows up or the grace
                        // is over.
                        self.unseen_since.insert(region.clone(), Instant::now());
                        self.input(ctx, Input::RegionGone(region.clone()));
                        Instant::now()
                    }
                };
                if since.elapsed() < UNSEEN_GRACE {
                    continue;
                }
            } else if self.unseen_since.remove(&region).is_some()
                && !self.fed_down.contains(&region)
                && !is_gone(state, &node)
            {
                tracing::info!(entity_type = %ctx.type_name, %region, "a region whose node this view did not hold has shown up");
                // Its margin starts afresh should its node go later.
                self.gone_since.remove(&region);
                self.input(ctx, Input::RegionBack(region.clone()));
            }
            if is_gone(state, &node) {
                if self.fed_down.contains(&region) {
                    continue;
                }
                // A node that left after handing all its shards off: no margin. A downed one
                // (or one that left before its hand-offs were done) may still be stopping
                // its entities.
                let since = match self.gone_since.get(&region) {
                    Some(since) => *since,
                    None => {
                        let now = Instant::now();
                        self.gone_since.insert(region.clone(), now);
                        // From now on its shards' askers wait for `RegionDown` (instead of
                        // getting a home they would ignore), which answers them at once.
                        self.input(ctx, Input::RegionGone(region.clone()));
                        now
                    }
                };
                let left = self.fed_leaving.contains(&region)
                    && self
                        .coord
                        .working_state()
                        .shards
                        .values()
                        .all(|r| *r != region);
                // A replaced process (its node id runs again as a newer incarnation, as after
                // a full cluster restart) no longer runs its entities: no margin either.
                let replaced = is_replaced(state, &node);
                if left || replaced || since.elapsed() >= ctx.settings.down_margin {
                    self.fed_down.insert(region.clone());
                    tracing::info!(entity_type = %ctx.type_name, %region, replaced, "region down: its shards are reallocated");
                    self.input(ctx, Input::RegionDown(region));
                }
            } else if is_leaving(state, &node) && self.fed_leaving.insert(region.clone()) {
                self.input(ctx, Input::RegionLeaving(region));
            }
        }
        // Acks of members that are gone no longer count; a smaller quorum may be complete.
        self.check_persisted(ctx);
    }
}

/// A stable tag of `node` for [`next_epoch`]: the shard hash of its region id (address, node
/// id, incarnation), the same on every run and every node.
fn node_tag(node: &UniqueAddress) -> u64 {
    u64::from(crate::hash::hash32(&super::wire::region_id(node).0))
}
