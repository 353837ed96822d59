//! The coordinator of one entity type as a sans-IO state machine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::allocation::{valid_moves, AllocationStrategy, AllocationView, LeastShards};

use super::protocol::{
    Epoch, HandOffId, RegionId, RegisterError, ToCoordinator, ToRegion, Version,
};
use super::rebalance::round_limit;
use super::state::{Change, CoordinatorState, StateUpdate};
use crate::ShardId;

/// Settings of a [`Coordinator`].
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// The shard count of the entity type; regions with another count are refused.
    pub shard_count: u32,
    /// Minimum time between two rebalance rounds (default 10 s).
    pub rebalance_interval_ms: u64,
    /// Per-round limit as a percentage of the allocated shards, rounded up (default 25: a join
    /// balances in at most two rounds, see [`round_limit`]).
    pub rebalance_relative_limit_percent: u32,
    /// Per-round absolute limit (default 1000). A round moves
    /// `max(1, min(ceil(allocated * percent / 100), absolute))` shards.
    pub rebalance_absolute_limit: u32,
    /// A hand-off whose `BeginHandOffAck`s have not all arrived after this long is aborted: the
    /// owner keeps the shard and every region is told so (default 10 s).
    pub handoff_ack_timeout_ms: u64,
    /// While the owner stops the shard, `HandOff` is sent again after this long without
    /// `ShardStopped` (default 10 s). Never aborted: the shard is never reallocated until its
    /// owner reported it stopped or was downed.
    pub handoff_stop_retry_ms: u64,
    /// Remember shards: allocate a downed region's shards at once (so their remembered entities
    /// restart without waiting for a message), and after a takeover every remembered shard.
    pub remember_shards: bool,
    /// Bound on replies waiting for persistence; further requests are dropped (and counted): the
    /// regions retry. The steps of state changes (broadcasts, ends of hand-offs) always wait.
    pub max_deferred: usize,
    /// Where new shards go and what a rebalance round moves (default [`LeastShards`]). The
    /// coordinator refuses decisions naming a region that may not receive shards.
    pub allocation_strategy: Arc<dyn AllocationStrategy>,
    /// The [fingerprint](crate::ShardFn::fingerprint) of the type's id-to-shard rule: a region
    /// registering with another one is refused ([`RegisterError::ShardFnMismatch`]). Default
    /// `None`: not checked.
    pub shard_fn_fingerprint: Option<u64>,
}

impl PartialEq for CoordinatorConfig {
    /// Equal settings, and strategies of the same [`name`](AllocationStrategy::name).
    fn eq(&self, other: &Self) -> bool {
        self.shard_count == other.shard_count
            && self.rebalance_interval_ms == other.rebalance_interval_ms
            && self.rebalance_relative_limit_percent == other.rebalance_relative_limit_percent
            && self.rebalance_absolute_limit == other.rebalance_absolute_limit
            && self.handoff_ack_timeout_ms == other.handoff_ack_timeout_ms
            && self.handoff_stop_retry_ms == other.handoff_stop_retry_ms
            && self.remember_shards == other.remember_shards
            && self.max_deferred == other.max_deferred
            && self.allocation_strategy.name() == other.allocation_strategy.name()
            && self.shard_fn_fingerprint == other.shard_fn_fingerprint
    }
}

impl CoordinatorConfig {
    /// Defaults for `shard_count` shards.
    pub fn new(shard_count: u32) -> Self {
        CoordinatorConfig {
            shard_count,
            rebalance_interval_ms: 10_000,
            rebalance_relative_limit_percent: 25,
            rebalance_absolute_limit: 1000,
            handoff_ack_timeout_ms: 10_000,
            handoff_stop_retry_ms: 10_000,
            remember_shards: false,
            max_deferred: 100_000,
            allocation_strategy: Arc::new(LeastShards),
            shard_fn_fingerprint: None,
        }
    }
}

/// What the coordinator reacts to.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A message from a region.
    Message {
        /// The sending region (as the IO layer authenticated it).
        from: RegionId,
        /// The message.
        msg: ToCoordinator,
    },
    /// Every update up to this version is replicated to a majority.
    Persisted(Version),
    /// Time passed; timeouts and rebalance run here.
    Tick,
    /// Whether membership is stable (no member joining or unreachable). Rebalance only runs while
    /// it is.
    MembershipStable(bool),
    /// The region's node is leaving gracefully: hand off all its shards. Answered with
    /// [`ToRegion::LeaveComplete`] once it owns none, and again on every repeat while it
    /// owns none (the answer is a control message that may be lost; the region repeats
    /// `Leaving` until it gets one).
    RegionLeaving(RegionId),
    /// The region's node is downed or removed, but its entities may still be stopping: the IO
    /// layer waits (a margin) before [`Input::RegionDown`]. From now on no shard is allocated
    /// to it, and a `GetShardHome` for one of its shards is held instead of answered with a
    /// home the asker cannot use; `RegionDown` reallocates those shards at once and the
    /// broadcast of their new homes answers the askers (no wait for their next retry).
    RegionGone(RegionId),
    /// A region reported [`Input::RegionGone`] turned out to be there after all (the IO
    /// layer took it for gone because its view did not hold its node yet): shards may be
    /// allocated to it again, and the held `GetShardHome`s for its shards are answered.
    /// Ignored for a region that is down.
    RegionBack(RegionId),
    /// The region is gone: its node was downed or removed **and its entities are stopped**.
    RegionDown(RegionId),
    /// The region's node is unreachable (some member's failure detector flagged it; it may
    /// have crashed and not be `Down` yet): until [`Input::RegionReachable`] no *new* shard
    /// goes to it (no allocation, no hand-off target, no remembered shard) while some region
    /// that may host is reachable. The shards it holds stay where they are (they move only
    /// once it is down or left) and their homes are answered as before. With every hosting
    /// region unreachable, they are all eligible again: the flag steers, it never blocks
    /// allocation.
    RegionUnreachable(RegionId),
    /// The region's node is reachable again: it may receive shards again.
    RegionReachable(RegionId),
}

/// What the coordinator asks the IO layer to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Replicate this update to a majority, then feed back [`Input::Persisted`]. Updates must be
    /// persisted in version order.
    Persist(StateUpdate),
    /// Send a message to a region.
    Send {
        /// The region.
        to: RegionId,
        /// The message.
        msg: ToRegion,
    },
}

/// Counters for introspection and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Messages refused because they carried an older epoch.
    pub stale_epoch_refused: u64,
    /// Registrations refused (shard count mismatch, downed).
    pub registrations_refused: u64,
    /// Hand-offs started.
    pub handoffs_started: u64,
    /// Hand-offs completed (shard stopped and deallocated).
    pub handoffs_completed: u64,
    /// Hand-offs aborted because acks did not arrive in time.
    pub handoffs_aborted: u64,
    /// `HandOff` messages sent again because `ShardStopped` did not arrive in time.
    pub handoff_retries: u64,
    /// Rebalance rounds that moved at least one shard.
    pub rebalance_rounds: u64,
    /// Requests dropped because the deferred-reply bound was reached.
    pub deferred_dropped: u64,
    /// `GetShardHome` requests that found no region to allocate to.
    pub no_region_available: u64,
    /// Late or unknown hand-off messages ignored.
    pub stray_handoff_messages: u64,
    /// Decisions of the [`AllocationStrategy`] refused (a region that may not receive shards,
    /// an invalid rebalance move); allocations fell back to [`LeastShards`].
    pub allocation_rejected: u64,
    /// `StaleEpoch` calls sent to regions of the state that had not re-registered with this
    /// epoch (see [`REREGISTER_CALL_MS`]).
    pub reregister_calls: u64,
}

/// How often a recovered coordinator tells the regions of its state that have not registered
/// with its epoch yet that their epoch is stale ([`ToRegion::StaleEpoch`]), which makes them
/// register again. Hand-offs wait until every region has; a region learns of a new
/// coordinator when the coordinator's node changes, but not when the same node recovers again
/// with a newer epoch (after a newer coordinator elsewhere fenced it), and a region that sends
/// nothing (every home cached, nothing buffered) would never hear a `StaleEpoch` answer either:
/// rebalancing and leaves stalled until each such region happened to ask for a home.
pub const REREGISTER_CALL_MS: u64 = 1_000;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for every region's `BeginHandOffAck`.
    Begin {
        pending: BTreeSet<RegionId>,
        fences: BTreeSet<RegionId>,
    },
    /// `HandOff` sent to the owner; waiting for `ShardStopped`.
    Stopping {
        fences: BTreeSet<RegionId>,
        last_sent: u64,
    },
    /// Deallocation (and reallocation) emitted; waiting for persistence.
    Deallocating,
}

/// A running hand-off of one shard (introspection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandOffInfo {
    /// The attempt.
    pub id: HandOffId,
    /// The shard.
    pub shard: ShardId,
    /// The owner it moves away from.
    pub from: RegionId,
    /// Where it should go (rebalance / leave), if decided.
    pub target: Option<RegionId>,
    /// When it started.
    pub started_ms: u64,
}

#[derive(Clone, Debug)]
struct HandOff {
    info: HandOffInfo,
    phase: Phase,
}

#[derive(Clone, Debug)]
enum Deferred {
    RegisterAck { region: RegionId, attempt: u64 },
    Home { shard: ShardId, to: RegionId },
    Broadcast(ShardId),
    HandOffDone(ShardId),
}

/// The coordinator of one entity type: regions, allocations, rebalance and hand-offs, with no IO.
///
/// Feed it [`Input`]s with [`Coordinator::handle`]; it appends [`Action`]s. Every state change is
/// emitted as [`Action::Persist`] and nothing that depends on it (a reply, a broadcast, a
/// hand-off step) happens before the matching [`Input::Persisted`]. Decisions read the *working*
/// state (durable plus pending updates), so two allocations in a row never see stale counts.
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    epoch: Epoch,
    durable: CoordinatorState,
    working: CoordinatorState,
    pending: VecDeque<StateUpdate>,
    deferred: VecDeque<(Version, Deferred)>,
    live: BTreeSet<RegionId>,
    leaving: BTreeSet<RegionId>,
    /// Leaving regions told `LeaveComplete` since they last asked (a tick does not repeat
    /// it; their next `Leaving` does).
    leave_completed: BTreeSet<RegionId>,
    downed: BTreeSet<RegionId>,
    /// Regions reported [`Input::RegionGone`] and not yet down.
    gone: BTreeSet<RegionId>,
    /// Regions reported [`Input::RegionUnreachable`] and not reachable again (or down) since:
    /// they keep their shards but get no new ones while another region may
    /// ([`skip_unreachable`](Self::skip_unreachable)).
    unreachable: BTreeSet<RegionId>,
    /// Regions waiting for the home of a shard of a gone region, per shard.
    held: BTreeMap<ShardId, BTreeSet<RegionId>>,
    handoffs: BTreeMap<ShardId, HandOff>,
    next_handoff: u64,
    stable: bool,
    now: u64,
    /// Wall-clock microseconds, for fencing tokens ([`set_wall_clock`](Self::set_wall_clock)).
    wall_us: u64,
    last_rebalance: Option<u64>,
    /// When regions not yet registered with this epoch were last called ([`REREGISTER_CALL_MS`]).
    last_reregister_call: Option<u64>,
    stats: CoordinatorStats,
}

/// Why a coordinator could not be recovered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoverError {
    /// The new epoch must be greater than the recovered state's.
    #[error("new epoch {new} is not greater than the recovered state's epoch {state}")]
    EpochNotIncreasing {
        /// The state's epoch.
        state: Epoch,
        /// The epoch asked for.
        new: Epoch,
    },
    /// The recovered state has another shard count than the configuration.
    #[error("recovered state has {state} shards, configuration {config}")]
    ShardCountMismatch {
        /// The state's shard count.
        state: u32,
        /// The configuration's.
        config: u32,
    },
}

impl Coordinator {
    /// A coordinator for a fresh entity type (empty state), epoch 1. The returned actions hold the
    /// persistence of its epoch.
    pub fn new(config: CoordinatorConfig) -> (Self, Vec<Action>) {
        let state = CoordinatorState::new(config.shard_count);
        Self::recover(config, state, 1).expect("epoch 1 follows the empty state")
    }

    /// A coordinator taking over from the replicated `state` with `new_epoch` (greater than
    /// `state.epoch`). It first persists its epoch; updates of the old coordinator that never
    /// reached `state` are not assumed. Regions keep working on cached homes meanwhile; hand-offs
    /// wait until every region of `state` has re-registered (or was reported down).
    pub fn recover(
        config: CoordinatorConfig,
        state: CoordinatorState,
        new_epoch: Epoch,
    ) -> Result<(Self, Vec<Action>), RecoverError> {
        if new_epoch <= state.epoch {
            return Err(RecoverError::EpochNotIncreasing {
                state: state.epoch,
                new: new_epoch,
            });
        }
        if state.shard_count != config.shard_count {
            return Err(RecoverError::ShardCountMismatch {
                state: state.shard_count,
                config: config.shard_count,
            });
        }
        let mut c = Coordinator {
            config,
            epoch: new_epoch,
            working: state.clone(),
            durable: state,
            pending: VecDeque::new(),
            deferred: VecDeque::new(),
            live: BTreeSet::new(),
            leaving: BTreeSet::new(),
            leave_completed: BTreeSet::new(),
            downed: BTreeSet::new(),
            gone: BTreeSet::new(),
            unreachable: BTreeSet::new(),
            held: BTreeMap::new(),
            handoffs: BTreeMap::new(),
            next_handoff: 0,
            stable: false,
            now: 0,
            wall_us: 0,
            last_rebalance: None,
            last_reregister_call: None,
            stats: CoordinatorStats::default(),
        };
        let mut out = Vec::new();
        c.persist(Change::EpochStarted, &mut out);
        Ok((c, out))
    }

    /// This coordinator's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The durable (majority-replicated) state.
    pub fn state(&self) -> &CoordinatorState {
        &self.durable
    }

    /// The working state: durable plus updates still being persisted.
    pub fn working_state(&self) -> &CoordinatorState {
        &self.working
    }

    /// Updates emitted but not yet persisted.
    pub fn pending_updates(&self) -> usize {
        self.pending.len()
    }

    /// Regions registered with this epoch.
    pub fn live_regions(&self) -> impl Iterator<Item = &RegionId> {
        self.live.iter()
    }

    /// Running hand-offs.
    pub fn handoffs(&self) -> impl Iterator<Item = &HandOffInfo> {
        self.handoffs.values().map(|h| &h.info)
    }

    /// Counters.
    pub fn stats(&self) -> &CoordinatorStats {
        &self.stats
    }

    /// Whether every region of the state has registered with this epoch (hand-offs wait for it).
    pub fn all_registered(&self) -> bool {
        self.working.regions.keys().all(|r| self.live.contains(r))
    }

    /// Sets the wall-clock time (microseconds since the Unix epoch) that new allocations take
    /// their [`FencingToken`](super::FencingToken) from. The IO layer sets it before each
    /// [`handle`](Self::handle); left at 0, tokens simply count up from the last one.
    pub fn set_wall_clock(&mut self, unix_micros: u64) {
        self.wall_us = unix_micros;
    }

    /// Handle one input at time `now_ms` (monotonic milliseconds), appending actions to `out`.
    pub fn handle(&mut self, now_ms: u64, input: Input, out: &mut Vec<Action>) {
        self.now = self.now.max(now_ms);
        match input {
            Input::Message { from, msg } => self.on_message(from, msg, out),
            Input::Persisted(v) => self.on_persisted(v, out),
            Input::Tick => self.on_tick(out),
            Input::MembershipStable(s) => self.stable = s,
            Input::RegionLeaving(r) => {
                if !self.downed.contains(&r) {
                    // Asked again: answered again (below, once it owns no shard). Sent once,
                    // a lost `LeaveComplete` left the region asking in vain until its
                    // leave timed out (found by an audit on 2026-11-29).
                    self.leave_completed.remove(&r);
                    self.leaving.insert(r);
                    self.drive_leaving(out);
                }
            }
            Input::RegionGone(r) => {
                if !self.downed.contains(&r) {
                    self.gone.insert(r);
                }
            }
            Input::RegionBack(r) => {
                if self.gone.remove(&r) {
                    self.answer_held(out);
                }
            }
            Input::RegionDown(r) => self.on_region_down(r, out),
            Input::RegionUnreachable(r) => {
                if !self.downed.contains(&r) {
                    self.unreachable.insert(r);
                }
            }
            Input::RegionReachable(r) => {
                if self.unreachable.remove(&r) {
                    // A leave waiting for somewhere to hand its shards to goes on now.
                    self.drive_leaving(out);
                }
            }
        }
    }

    // ---- persistence -------------------------------------------------------------------------

    fn persist(&mut self, change: Change, out: &mut Vec<Action>) -> Version {
        let update = StateUpdate {
            epoch: self.epoch,
            version: self.working.version + 1,
            change,
        };
        self.working
            .apply(&update)
            .expect("working state follows its own updates");
        self.pending.push_back(update.clone());
        out.push(Action::Persist(update));
        self.working.version
    }

    fn epoch_durable(&self) -> bool {
        self.durable.epoch == self.epoch
    }

    /// Run `d` once everything emitted so far is durable (now, if nothing is pending).
    ///
    /// Past [`CoordinatorConfig::max_deferred`] waiting items, replies to requests are
    /// dropped (the regions retry them). The steps of a state change itself (its broadcast,
    /// the end of a hand-off) are never dropped: nobody would retry them, and a hand-off
    /// left unfinished would hold its shard, and every later rebalance, for good. There is
    /// one of those per persisted change, so they cannot outgrow the changes themselves.
    fn after_durable(&mut self, d: Deferred, out: &mut Vec<Action>) {
        let reply = matches!(d, Deferred::RegisterAck { .. } | Deferred::Home { .. });
        if self.pending.is_empty() && self.deferred.is_empty() {
            self.release(d, out);
        } else if reply && self.deferred.len() >= self.config.max_deferred {
            self.stats.deferred_dropped += 1;
        } else {
            self.deferred.push_back((self.working.version, d));
        }
    }

    fn on_persisted(&mut self, v: Version, out: &mut Vec<Action>) {
        while let Some(u) = self.pending.front() {
            if u.version > v {
                break;
            }
            let u = self.pending.pop_front().expect("front exists");
            self.durable
                .apply(&u)
                .expect("durable state follows the emitted updates");
        }
        while let Some((barrier, _)) = self.deferred.front() {
            if *barrier > self.durable.version {
                break;
            }
            let (_, d) = self.deferred.pop_front().expect("front exists");
            self.release(d, out);
        }
        if self.epoch_durable() {
            self.drive_leaving(out);
        }
    }

    /// The durable home of a shard, if no change of it is pending and it is not moving.
    fn settled_home(&self, shard: ShardId) -> Option<&RegionId> {
        if self.handoffs.contains_key(&shard) {
            return None;
        }
        let d = self.durable.home(shard)?;
        (self.working.home(shard) == Some(d)).then_some(d)
    }

    fn release(&mut self, d: Deferred, out: &mut Vec<Action>) {
        match d {
            Deferred::RegisterAck { region, attempt } => {
                if !self.live.contains(&region) {
                    return;
                }
                let homes: Vec<(ShardId, RegionId)> = self
                    .durable
                    .shards
                    .keys()
                    .filter_map(|s| self.settled_home(*s).map(|r| (*s, r.clone())))
                    .collect();
                let tokens = homes
                    .iter()
                    .filter(|(_, r)| *r == region)
                    .map(|(s, _)| (*s, self.durable.token(*s)))
                    .collect();
                out.push(Action::Send {
                    to: region,
                    msg: ToRegion::RegisterAck {
                        epoch: self.epoch,
                        homes,
                        tokens,
                        attempt,
                    },
                });
            }
            Deferred::Home { shard, to } => {
                if !self.live.contains(&to) {
                    return;
                }
                if let Some(home) = self.settled_home(shard) {
                    out.push(Action::Send {
                        to,
                        msg: ToRegion::ShardHome {
                            epoch: self.epoch,
                            shard,
                            region: home.clone(),
                            token: self.durable.token(shard),
                        },
                    });
                } else if !self.handoffs.contains_key(&shard) && self.working.home(shard).is_none()
                {
                    self.allocate(shard, &to, out);
                }
                // Otherwise a change of the shard is pending: its broadcast follows.
            }
            Deferred::Broadcast(shard) => self.broadcast_home(shard, out),
            Deferred::HandOffDone(shard) => {
                if self.handoffs.remove(&shard).is_some() {
                    self.stats.handoffs_completed += 1;
                }
                self.broadcast_home(shard, out);
                self.drive_leaving(out);
            }
        }
    }

    fn broadcast_home(&mut self, shard: ShardId, out: &mut Vec<Action>) {
        if let Some(home) = self.settled_home(shard).cloned() {
            for r in &self.live {
                out.push(Action::Send {
                    to: r.clone(),
                    msg: ToRegion::ShardHome {
                        epoch: self.epoch,
                        shard,
                        region: home.clone(),
                        token: self.durable.token(shard),
                    },
                });
            }
        }
    }

    // ---- allocation ---------------------------------------------------------------------------

    /// Whether `r` may host a new shard, reachability aside: registered with this epoch,
    /// hosting (not a proxy), not leaving and not gone.
    fn may_host(&self, r: &RegionId) -> bool {
        self.live.contains(r)
            && !self.leaving.contains(r)
            && !self.gone.contains(r)
            && self.working.regions.get(r).is_some_and(|i| !i.proxy)
    }

    /// Whether unreachable regions are left out now: only while some region that may host
    /// is reachable. Unreachability steers new shards away from a node that may have crashed
    /// but never blocks allocation: the flag is any member's (a member with a bad one-way
    /// link can flag every hosting region), and with nothing allocated the askers retry,
    /// their buffers fill and messages are refused until the flags clear or the nodes are
    /// downed (before 2026-12-01 nothing was allocated then:
    /// `tests::unreachable::with_every_region_unreachable_a_shard_is_still_allocated`).
    fn skip_unreachable(&self) -> bool {
        self.live
            .iter()
            .any(|r| !self.unreachable.contains(r) && self.may_host(r))
    }

    /// Whether `r` may receive a shard now: it [may host](Self::may_host) and is reachable,
    /// or no region that may host is (see [`skip_unreachable`](Self::skip_unreachable)).
    fn eligible(&self, r: &RegionId) -> bool {
        self.eligible_with(r, self.skip_unreachable())
    }

    /// [`eligible`](Self::eligible) with [`skip_unreachable`](Self::skip_unreachable) worked
    /// out once by the caller.
    fn eligible_with(&self, r: &RegionId, skip_unreachable: bool) -> bool {
        self.may_host(r) && !(skip_unreachable && self.unreachable.contains(r))
    }

    /// Shard counts of eligible regions in the working state, counting shards moving to them.
    fn loads(&self) -> BTreeMap<RegionId, usize> {
        let skip = self.skip_unreachable();
        let mut loads: BTreeMap<RegionId, usize> = self
            .live
            .iter()
            .filter(|r| self.eligible_with(r, skip))
            .map(|r| (r.clone(), 0))
            .collect();
        for r in self.working.shards.values() {
            if let Some(n) = loads.get_mut(r) {
                *n += 1;
            }
        }
        for h in self.handoffs.values() {
            if let Some(t) = &h.info.target {
                if self.working.home(h.info.shard) != Some(t) {
                    if let Some(n) = loads.get_mut(t) {
                        *n += 1;
                    }
                }
            }
        }
        loads
    }

    /// The region with the fewest shards (working state, moves included), ties by id: where
    /// [`LeastShards`] puts a new shard.
    pub fn least_loaded(&self) -> Option<RegionId> {
        self.loads()
            .into_iter()
            .min_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
            .map(|(r, _)| r)
    }

    /// What an [`AllocationStrategy`] sees: every eligible region with its shards in the working
    /// state, shards being handed off to it included.
    pub fn allocation_regions(&self) -> BTreeMap<RegionId, Vec<ShardId>> {
        let skip = self.skip_unreachable();
        let mut regions: BTreeMap<RegionId, Vec<ShardId>> = self
            .live
            .iter()
            .filter(|r| self.eligible_with(r, skip))
            .map(|r| (r.clone(), Vec::new()))
            .collect();
        for (s, r) in &self.working.shards {
            if let Some(v) = regions.get_mut(r) {
                v.push(*s);
            }
        }
        for h in self.handoffs.values() {
            if let Some(t) = &h.info.target {
                if self.working.home(h.info.shard) != Some(t) {
                    if let Some(v) = regions.get_mut(t) {
                        v.push(h.info.shard);
                    }
                }
            }
        }
        regions
    }

    /// The region `shard` goes to, as the strategy decides over the working state; a decision
    /// naming a region that may not receive shards is refused (warning, counter) and
    /// [`least_loaded`](Self::least_loaded) used instead.
    fn choose(&mut self, shard: ShardId, requester: Option<&RegionId>) -> Option<RegionId> {
        let regions = self.allocation_regions();
        if regions.is_empty() {
            return None;
        }
        let view = AllocationView {
            shard_count: self.config.shard_count,
            regions: &regions,
        };
        match self
            .config
            .allocation_strategy
            .allocate(shard, requester, &view)
        {
            Some(r) if regions.contains_key(&r) => return Some(r),
            Some(r) => {
                self.stats.allocation_rejected += 1;
                tracing::warn!(
                    strategy = self.config.allocation_strategy.name(),
                    shard,
                    region = %r,
                    "allocation strategy chose a region that may not receive shards \
                     (not registered, proxy, leaving, down or unreachable); allocating least-shards \
                     instead"
                );
            }
            None => {}
        }
        LeastShards.allocate(shard, requester, &view)
    }

    fn allocate_to(&mut self, shard: ShardId, region: RegionId, out: &mut Vec<Action>) {
        self.persist_allocation(shard, region, out);
        self.after_durable(Deferred::Broadcast(shard), out);
    }

    /// Persists the allocation of `shard` to `region` with a fencing token above every one
    /// handed out before (see [`FencingToken`](super::FencingToken)).
    fn persist_allocation(&mut self, shard: ShardId, region: RegionId, out: &mut Vec<Action>) {
        let token = self.working.next_token(self.wall_us);
        self.persist(
            Change::ShardAllocated {
                shard,
                region,
                token,
            },
            out,
        );
    }

    fn allocate(&mut self, shard: ShardId, asker: &RegionId, out: &mut Vec<Action>) {
        match self.choose(shard, Some(asker)) {
            Some(r) => self.allocate_to(shard, r, out),
            None => self.stats.no_region_available += 1,
        }
    }

    // ---- messages -----------------------------------------------------------------------------

    fn on_message(&mut self, from: RegionId, msg: ToCoordinator, out: &mut Vec<Action>) {
        if let Some(e) = msg.epoch() {
            if e < self.epoch {
                self.stats.stale_epoch_refused += 1;
                out.push(Action::Send {
                    to: from,
                    msg: ToRegion::StaleEpoch { epoch: self.epoch },
                });
                return;
            }
            if e > self.epoch || !self.live.contains(&from) {
                // From the future (a newer coordinator exists) or from an unregistered region.
                self.stats.stale_epoch_refused += 1;
                return;
            }
        }
        match msg {
            ToCoordinator::Register {
                shard_count,
                proxy,
                shard_fn,
                attempt,
            } => self.on_register(from, shard_count, proxy, shard_fn, attempt, out),
            ToCoordinator::GetShardHome { shard, .. } => self.on_get_home(from, shard, out),
            ToCoordinator::BeginHandOffAck { id, shard, fenced } => {
                self.on_begin_ack(from, id, shard, fenced, out)
            }
            ToCoordinator::ShardStopped { id, shard } => {
                self.on_shard_stopped(from, id, shard, out)
            }
        }
    }

    fn on_register(
        &mut self,
        from: RegionId,
        shard_count: u32,
        proxy: bool,
        shard_fn: Option<u64>,
        attempt: u64,
        out: &mut Vec<Action>,
    ) {
        let refuse = if shard_count != self.config.shard_count {
            Some(RegisterError::ShardCountMismatch {
                coordinator: self.config.shard_count,
                region: shard_count,
            })
        } else if let Some((coordinator, region)) = self
            .config
            .shard_fn_fingerprint
            .zip(shard_fn)
            .filter(|(c, r)| c != r)
        {
            Some(RegisterError::ShardFnMismatch {
                coordinator,
                region,
            })
        } else if self.downed.contains(&from) {
            Some(RegisterError::Downed(from.clone()))
        } else {
            None
        };
        if let Some(error) = refuse {
            self.stats.registrations_refused += 1;
            out.push(Action::Send {
                to: from,
                msg: ToRegion::RegisterRefused {
                    epoch: self.epoch,
                    error,
                    attempt,
                },
            });
            return;
        }
        if self.working.regions.get(&from).map(|i| i.proxy) != Some(proxy) {
            self.persist(
                Change::RegionRegistered {
                    region: from.clone(),
                    proxy,
                },
                out,
            );
        }
        self.live.insert(from.clone());
        self.after_durable(
            Deferred::RegisterAck {
                region: from,
                attempt,
            },
            out,
        );
    }

    fn on_get_home(&mut self, from: RegionId, shard: ShardId, out: &mut Vec<Action>) {
        if shard >= self.config.shard_count || self.handoffs.contains_key(&shard) {
            // Moving: the home is broadcast when the hand-off ends.
            return;
        }
        if let Some(home) = self.working.home(shard) {
            if self.gone.contains(home) {
                // Its home is gone and not down yet: answered when it is (see `RegionDown`).
                self.held.entry(shard).or_default().insert(from);
                return;
            }
            self.after_durable(Deferred::Home { shard, to: from }, out);
        } else {
            // Allocate now (in the working state) so that the next decision counts it.
            self.allocate(shard, &from, out);
        }
    }

    fn on_begin_ack(
        &mut self,
        from: RegionId,
        id: HandOffId,
        shard: ShardId,
        fenced: Option<RegionId>,
        out: &mut Vec<Action>,
    ) {
        let Some(h) = self.handoffs.get_mut(&shard) else {
            self.stats.stray_handoff_messages += 1;
            return;
        };
        if h.info.id != id {
            self.stats.stray_handoff_messages += 1;
            return;
        }
        if let Phase::Begin { pending, fences } = &mut h.phase {
            pending.remove(&from);
            if fenced.as_ref() == Some(&h.info.from) {
                fences.insert(from);
            }
        }
        self.maybe_send_handoff(shard, out);
    }

    fn maybe_send_handoff(&mut self, shard: ShardId, out: &mut Vec<Action>) {
        let now = self.now;
        let Some(h) = self.handoffs.get_mut(&shard) else {
            return;
        };
        if let Phase::Begin { pending, fences } = &h.phase {
            if pending.is_empty() {
                let fences = fences.clone();
                out.push(Action::Send {
                    to: h.info.from.clone(),
                    msg: ToRegion::HandOff {
                        id: h.info.id,
                        shard,
                        fences: fences.iter().cloned().collect(),
                    },
                });
                h.phase = Phase::Stopping {
                    fences,
                    last_sent: now,
                };
            }
        }
    }

    fn on_shard_stopped(
        &mut self,
        from: RegionId,
        id: HandOffId,
        shard: ShardId,
        out: &mut Vec<Action>,
    ) {
        let ok = matches!(
            self.handoffs.get(&shard),
            Some(h) if h.info.id == id && h.info.from == from && matches!(h.phase, Phase::Stopping { .. })
        );
        if !ok {
            // Late (hand-off already done), or from an aborted attempt (never sent HandOff).
            self.stats.stray_handoff_messages += 1;
            return;
        }
        self.persist(Change::ShardDeallocated { shard }, out);
        let target = self.handoffs[&shard]
            .info
            .target
            .clone()
            .filter(|t| self.eligible(t));
        let target = target.or_else(|| {
            self.handoffs.get_mut(&shard).expect("present").info.target = None;
            self.choose(shard, None)
        });
        if let Some(t) = target {
            self.persist_allocation(shard, t, out);
        }
        self.handoffs.get_mut(&shard).expect("present").phase = Phase::Deallocating;
        self.after_durable(Deferred::HandOffDone(shard), out);
    }

    // ---- hand-off -------------------------------------------------------------------------------

    fn start_handoff(&mut self, shard: ShardId, target: Option<RegionId>, out: &mut Vec<Action>) {
        let Some(from) = self.settled_home(shard).cloned() else {
            return;
        };
        let id = HandOffId {
            epoch: self.epoch,
            seq: self.next_handoff,
        };
        self.next_handoff += 1;
        self.stats.handoffs_started += 1;
        let pending: BTreeSet<RegionId> = self.live.clone();
        for r in &pending {
            out.push(Action::Send {
                to: r.clone(),
                msg: ToRegion::BeginHandOff { id, shard },
            });
        }
        self.handoffs.insert(
            shard,
            HandOff {
                info: HandOffInfo {
                    id,
                    shard,
                    from,
                    target,
                    started_ms: self.now,
                },
                phase: Phase::Begin {
                    pending,
                    fences: BTreeSet::new(),
                },
            },
        );
        self.maybe_send_handoff(shard, out);
    }

    /// Hand-offs start only with every region registered with this epoch and told so: a
    /// region whose `RegisterAck` still waits for an update to be stored ignores a
    /// `BeginHandOff`, and the hand-off would wait `handoff_ack_timeout` for its answer.
    fn can_hand_off(&self) -> bool {
        self.epoch_durable()
            && self.all_registered()
            && !self
                .deferred
                .iter()
                .any(|(_, d)| matches!(d, Deferred::RegisterAck { .. }))
    }

    /// Tells the regions of the state that have not registered with this epoch (and are not
    /// gone) that their epoch is stale, every [`REREGISTER_CALL_MS`].
    fn call_unregistered(&mut self, out: &mut Vec<Action>) {
        if self.all_registered()
            || self
                .last_reregister_call
                .is_some_and(|t| self.now.saturating_sub(t) < REREGISTER_CALL_MS)
        {
            return;
        }
        self.last_reregister_call = Some(self.now);
        let silent: Vec<RegionId> = self
            .working
            .regions
            .keys()
            .filter(|r| !self.live.contains(*r) && !self.gone.contains(*r))
            .cloned()
            .collect();
        for to in silent {
            self.stats.reregister_calls += 1;
            out.push(Action::Send {
                to,
                msg: ToRegion::StaleEpoch { epoch: self.epoch },
            });
        }
    }

    /// Answers the leaving regions that own nothing (durably: nothing pending), and starts
    /// the hand-offs of the others' shards once hand-offs may start ([`Self::can_hand_off`]).
    /// The answer does not wait for that: a region with nothing to hand off needs no other
    /// region registered (before 2026-11-30 it waited, after a failover until every region
    /// of the state had re-registered or was gone).
    fn drive_leaving(&mut self, out: &mut Vec<Action>) {
        let can_hand_off = self.can_hand_off();
        let leaving: Vec<RegionId> = self.leaving.iter().cloned().collect();
        for r in leaving {
            let owned: Vec<ShardId> = self
                .working
                .shards
                .iter()
                .filter(|(_, h)| **h == r)
                .map(|(s, _)| *s)
                .collect();
            for shard in owned.iter().filter(|_| can_hand_off) {
                if self.handoffs.contains_key(shard) {
                    continue;
                }
                let Some(target) = self.choose(*shard, None) else {
                    break; // nowhere to go: wait for another region
                };
                self.start_handoff(*shard, Some(target), out);
            }
            if owned.is_empty()
                && self.live.contains(&r)
                && !self.leave_completed.contains(&r)
                && self.pending.is_empty()
            {
                self.leave_completed.insert(r.clone());
                out.push(Action::Send {
                    to: r,
                    msg: ToRegion::LeaveComplete { epoch: self.epoch },
                });
            }
        }
    }

    fn on_region_down(&mut self, r: RegionId, out: &mut Vec<Action>) {
        self.downed.insert(r.clone());
        self.gone.remove(&r);
        self.unreachable.remove(&r);
        self.live.remove(&r);
        self.leaving.remove(&r);
        self.region_removed(r, out);
        self.answer_held(out);
    }

    /// Answers the `GetShardHome` requests held for shards whose home was gone and is not any
    /// more: the shard is allocated (its broadcast answers every asker) or its home sent.
    fn answer_held(&mut self, out: &mut Vec<Action>) {
        let ready: Vec<ShardId> = self
            .held
            .iter()
            .filter(|(s, _)| {
                self.working
                    .home(**s)
                    .is_none_or(|h| !self.gone.contains(h))
            })
            .map(|(s, _)| *s)
            .collect();
        for shard in ready {
            let askers: Vec<RegionId> = self
                .held
                .remove(&shard)
                .unwrap_or_default()
                .into_iter()
                .filter(|r| self.live.contains(r))
                .collect();
            if askers.is_empty() || self.handoffs.contains_key(&shard) {
                // Nobody waits any more, or moving: the home is broadcast when it ends.
                continue;
            }
            if self.working.home(shard).is_some() {
                // Already reallocated (remember-shards): its broadcast follows, or it is durable.
                for to in askers {
                    self.after_durable(Deferred::Home { shard, to }, out);
                }
            } else {
                // The first asker decides (as if its request arrived now); the broadcast of the
                // allocation answers every asker.
                self.allocate(shard, &askers[0], out);
            }
        }
    }

    /// The down region's hand-offs and shards.
    fn region_removed(&mut self, r: RegionId, out: &mut Vec<Action>) {
        let shards: Vec<ShardId> = self.handoffs.keys().copied().collect();
        for shard in shards {
            let h = self.handoffs.get_mut(&shard).expect("present");
            if h.info.from == r && !matches!(h.phase, Phase::Deallocating) {
                // Its entities are stopped (IO contract); RegionRemoved deallocates it.
                self.handoffs.remove(&shard);
                continue;
            }
            if h.info.target.as_ref() == Some(&r) {
                h.info.target = None;
            }
            match &mut h.phase {
                Phase::Begin { pending, fences } => {
                    pending.remove(&r);
                    fences.remove(&r);
                }
                Phase::Stopping { fences, .. } => {
                    fences.remove(&r);
                }
                Phase::Deallocating => {}
            }
            self.maybe_send_handoff(shard, out);
        }
        if !self.working.regions.contains_key(&r) && !self.working.shards.values().any(|h| *h == r)
        {
            return;
        }
        let lost: Vec<ShardId> = self
            .working
            .shards
            .iter()
            .filter(|(_, h)| **h == r)
            .map(|(s, _)| *s)
            .collect();
        self.persist(Change::RegionRemoved { region: r }, out);
        if self.config.remember_shards {
            for shard in lost {
                if let Some(t) = self.choose(shard, None) {
                    self.allocate_to(shard, t, out);
                }
            }
        }
        self.drive_leaving(out);
    }

    // ---- time -----------------------------------------------------------------------------------

    fn on_tick(&mut self, out: &mut Vec<Action>) {
        let now = self.now;
        // Hand-off timeouts.
        let shards: Vec<ShardId> = self.handoffs.keys().copied().collect();
        for shard in shards {
            let h = self.handoffs.get_mut(&shard).expect("present");
            match &mut h.phase {
                Phase::Begin { .. } => {
                    if now.saturating_sub(h.info.started_ms) >= self.config.handoff_ack_timeout_ms {
                        // Abort: nobody was told to stop; the owner keeps the shard.
                        self.handoffs.remove(&shard);
                        self.stats.handoffs_aborted += 1;
                        self.broadcast_home(shard, out);
                    }
                }
                Phase::Stopping { fences, last_sent } => {
                    if now.saturating_sub(*last_sent) >= self.config.handoff_stop_retry_ms {
                        *last_sent = now;
                        fences.retain(|r| self.live.contains(r));
                        self.stats.handoff_retries += 1;
                        out.push(Action::Send {
                            to: h.info.from.clone(),
                            msg: ToRegion::HandOff {
                                id: h.info.id,
                                shard,
                                fences: fences.iter().cloned().collect(),
                            },
                        });
                    }
                }
                Phase::Deallocating => {}
            }
        }
        if !self.epoch_durable() {
            return;
        }
        self.call_unregistered(out);
        self.drive_leaving(out);
        // Remembered shards without a home (after a takeover or a down without a region).
        if self.config.remember_shards && self.all_registered() {
            let homeless: Vec<ShardId> = self
                .working
                .remembered
                .iter()
                .copied()
                .filter(|s| self.working.home(*s).is_none() && !self.handoffs.contains_key(s))
                .collect();
            for shard in homeless {
                match self.choose(shard, None) {
                    Some(t) => self.allocate_to(shard, t, out),
                    None => break,
                }
            }
        }
        self.maybe_rebalance(out);
    }

    fn maybe_rebalance(&mut self, out: &mut Vec<Action>) {
        let due = self
            .last_rebalance
            .is_none_or(|t| self.now.saturating_sub(t) >= self.config.rebalance_interval_ms);
        if !due || !self.stable || !self.can_hand_off() || !self.handoffs.is_empty() {
            return;
        }
        if !self.leaving.is_empty() || !self.pending.is_empty() {
            return;
        }
        // No hand-off runs: these are exactly the allocated shards of the eligible regions.
        let per_region = self.allocation_regions();
        let total: usize = per_region.values().map(Vec::len).sum();
        let limit = round_limit(
            total,
            self.config.rebalance_relative_limit_percent,
            self.config.rebalance_absolute_limit,
        );
        let view = AllocationView {
            shard_count: self.config.shard_count,
            regions: &per_region,
        };
        let planned = self.config.allocation_strategy.rebalance(&view, limit);
        let (moves, dropped) = valid_moves(&per_region, planned, limit);
        if dropped > 0 {
            self.stats.allocation_rejected += dropped as u64;
            tracing::warn!(
                strategy = self.config.allocation_strategy.name(),
                dropped,
                "allocation strategy planned rebalance moves the coordinator may not carry out \
                 (unknown or ineligible region, shard not held by its source, duplicate, over \
                 the round limit); dropped"
            );
        }
        // The interval runs from the last round that moved something: a balanced coordinator
        // starts the first round as soon as a new region makes it unbalanced.
        if !moves.is_empty() {
            self.stats.rebalance_rounds += 1;
            self.last_rebalance = Some(self.now);
        }
        for m in moves {
            self.start_handoff(m.shard, Some(m.to), out);
        }
    }
}
