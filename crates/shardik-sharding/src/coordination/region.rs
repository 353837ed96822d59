//! The region side of one entity type on one node, as a sans-IO state machine.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::protocol::{
    Envelope, Epoch, FencingToken, HandOffId, PeerMsg, RegionId, RegisterError, ToCoordinator,
    ToRegion,
};
use crate::ShardId;

/// Settings of a [`RegionState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionConfig {
    /// Shard count; must equal the coordinator's.
    pub shard_count: u32,
    /// Proxy-only: route, never host.
    pub proxy: bool,
    /// Messages buffered per shard while its home is unknown or it moves (default 10 000).
    pub buffer_limit: usize,
    /// Interval between `Register` retries and `GetShardHome` retries (default 2 s).
    pub retry_interval_ms: u64,
    /// How long the owner waits for missing fences before stopping the shard anyway. Default
    /// `None`: wait until the fence arrives or its sender is reported down
    /// ([`RegionInput::RegionDown`]), which keeps per-sender order across the move. With a
    /// timeout, a fence delayed longer than it may let that region's earlier messages arrive
    /// after later ones (never lost, never duplicated, never two owners).
    pub fence_timeout_ms: Option<u64>,
    /// How long entities get to stop before [`RegionAction::ForceStopShard`] (default 10 s).
    pub stop_timeout_ms: u64,
    /// Forwarding hops after which a message is buffered and its home asked again (default 3).
    pub max_hops: u8,
    /// The [fingerprint](crate::ShardFn::fingerprint) of the type's id-to-shard rule, sent with
    /// `Register` (default `None`: not checked).
    pub shard_fn_fingerprint: Option<u64>,
}

impl RegionConfig {
    /// Defaults for `shard_count` shards.
    pub fn new(shard_count: u32) -> Self {
        RegionConfig {
            shard_count,
            proxy: false,
            buffer_limit: 10_000,
            retry_interval_ms: 2_000,
            fence_timeout_ms: None,
            stop_timeout_ms: 10_000,
            max_hops: 3,
            shard_fn_fingerprint: None,
        }
    }
}

/// What a region reacts to (besides [`RegionState::send`]).
#[derive(Clone, Debug, PartialEq)]
pub enum RegionInput<M> {
    /// A message from the coordinator.
    FromCoordinator(ToRegion),
    /// A message from another region.
    FromPeer {
        /// The sending region.
        from: RegionId,
        /// The message.
        msg: PeerMsg<M>,
    },
    /// A (new) coordinator is reachable: register with it (retried until acknowledged).
    CoordinatorChanged,
    /// The IO layer finished stopping the shard's entities (after `StopShard`/`ForceStopShard`).
    ShardStopped(ShardId),
    /// Messages that an entity of the shard had accepted but not handled when
    /// [`RegionAction::ForceStopShard`] (or the IO layer's fence) stopped it, oldest first.
    /// They were accepted before anything this region buffered for the shard since, so while
    /// the shard buffers they go ahead of its buffer's other messages (behind unhandled ones
    /// reported before) and travel with it to the shard's next home (reported before the
    /// shard's [`ShardStopped`](Self::ShardStopped)); delivered here while the shard's
    /// entities run here, forwarded if it has a home elsewhere.
    Unhandled {
        /// The shard.
        shard: ShardId,
        /// The messages, oldest first.
        envelopes: Vec<Envelope<M>>,
    },
    /// Messages the IO layer held for the shard while its node was fenced, oldest first
    /// (delivered locally by this region, then held instead of reaching an entity; the IO
    /// layer keeps an entity's unhandled messages that arrive meanwhile ahead of its held
    /// ones). Delivered here while the shard's entities run here, forwarded if it has a home
    /// elsewhere; if the shard buffers, they go behind the [`Unhandled`](Self::Unhandled)
    /// ones there and ahead of the rest, which senders added later.
    Held {
        /// The shard.
        shard: ShardId,
        /// The messages, oldest first.
        envelopes: Vec<Envelope<M>>,
    },
    /// Another region is gone (downed or removed): forget it as a home.
    RegionDown(RegionId),
    /// Time passed: retries and timeouts.
    Tick,
}

/// What a region asks the IO layer to do.
#[derive(Clone, Debug, PartialEq)]
pub enum RegionAction<M> {
    /// Deliver to the local entity (start it if needed). The shard is hosted here.
    DeliverLocal(Envelope<M>),
    /// As [`DeliverLocal`](Self::DeliverLocal), for a message this node accepted earlier (an
    /// entity's unhandled one, or one a fence held: [`RegionInput::Unhandled`],
    /// [`RegionInput::Held`]): no cap of the IO layer refuses it now (an entity still
    /// stopping buffers it past its cap, a bounded mailbox takes it past its bound); it
    /// still fails if the node stopped hosting or the system shuts down.
    DeliverAccepted(Envelope<M>),
    /// Send to another region.
    ToPeer {
        /// The region.
        to: RegionId,
        /// The message.
        msg: PeerMsg<M>,
    },
    /// Send to the coordinator.
    ToCoordinator(ToCoordinator),
    /// This region now hosts the shard (with remember-entities: start its entities now).
    StartShard(ShardId),
    /// Stop every entity of the shard gracefully, then report [`RegionInput::ShardStopped`].
    StopShard(ShardId),
    /// Stopping took longer than `stop_timeout_ms`: stop the shard's entities as soon as
    /// their current message is done, and report what they had not handled as
    /// [`RegionInput::Unhandled`] before [`RegionInput::ShardStopped`].
    ForceStopShard(ShardId),
    /// A message forwarded by another region could not be buffered: tell its sender.
    Rejected(Rejected<M>),
    /// The coordinator refused this region; every send fails from now on.
    Refused(RegisterError),
    /// All shards of this (leaving) region are handed off: the node may exit.
    LeaveComplete,
}

/// Why a message was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The shard's buffer is full (its home is unknown or it is moving).
    #[error(
        "buffer of shard {shard} is full ({limit} messages) while its home is unknown or it moves"
    )]
    BufferFull {
        /// The shard.
        shard: ShardId,
        /// The limit.
        limit: usize,
    },
    /// The coordinator refused this region.
    #[error("region refused by the coordinator: {0}")]
    Refused(RegisterError),
    /// The shard id is out of range.
    #[error("shard {shard} out of range (shard count {shard_count})")]
    BadShard {
        /// The shard.
        shard: ShardId,
        /// The shard count.
        shard_count: u32,
    },
}

/// A refused message and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejected<M> {
    /// Why.
    pub error: SendError,
    /// The message, handed back.
    pub envelope: Envelope<M>,
}

/// Counters for introspection and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionCoordStats {
    /// Messages delivered to local entities.
    pub delivered_local: u64,
    /// Messages forwarded to other regions.
    pub forwarded: u64,
    /// Messages refused because a buffer was full.
    pub overflow_total: u64,
    /// Coordinator messages ignored for a stale (or not yet known) epoch.
    pub stale_ignored: u64,
    /// Hand-offs where the owner stopped without all fences (timeout).
    pub fence_timeouts: u64,
    /// Shards force-stopped after the stop timeout.
    pub forced_stops: u64,
    /// `GetShardHome` requests sent.
    pub home_requests: u64,
    /// Fences sent again because the shard's new home was still unknown a while after the
    /// previous copy (see [`RegionState`]'s hand-off notes: a fence lost with a broken
    /// connection would otherwise leave the owner waiting for it).
    pub fences_resent: u64,
    /// `Register` messages sent.
    pub register_attempts: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum OwnerPhase {
    /// `BeginHandOff` seen: local senders buffer; forwards still delivered locally. The home
    /// is asked for every retry interval since `last_request` (the `BeginHandOff`, at first):
    /// an aborted hand-off ends with a `ShardHome` naming this region, and if that one is
    /// lost nothing else would end this phase (the coordinator ignores the question while
    /// the hand-off runs).
    Begun { last_request: u64 },
    /// `HandOff` seen; waiting for fences from these regions.
    WaitFences {
        need: BTreeSet<RegionId>,
        since: u64,
    },
    /// Entities stopping; everything buffers.
    Stopping {
        since: u64,
        forced: bool,
        /// The home learnt while stopping: `Some(self)` means host again afterwards.
        next_home: Option<RegionId>,
    },
}

/// A fence this region sent to the cached home of a shard whose hand-off began.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SentFence {
    id: HandOffId,
    to: RegionId,
    last_sent: u64,
    /// How long after `last_sent` the next copy goes: the retry interval at first, doubled
    /// after every copy up to [`FENCE_RESEND_MAX_INTERVAL_MS`].
    interval: u64,
}

/// The longest time between two copies of a fence (see [`RegionState`]'s `resend_fences`):
/// copies go after one retry interval, then after twice as long as the previous wait, up to
/// this. There is no last copy: the owner waits for the fence for as long as the hand-off
/// runs (until 2026-11-30 copies stopped a minute after the first, and an owner whose fence
/// was lost for longer than that, its sender neither downed nor told a next home, waited for
/// good, holding every later rebalance of the type).
pub const FENCE_RESEND_MAX_INTERVAL_MS: u64 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    /// Hosted here.
    Local,
    /// Cached remote home.
    Remote(RegionId),
    /// Home unknown (or moving): buffer and ask.
    Unknown { last_request: Option<u64> },
    /// Hosted here and moving away.
    Owner {
        id: Option<HandOffId>,
        phase: OwnerPhase,
    },
}

/// Where a shard stands at this region (introspection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardView {
    /// Hosted here.
    Local,
    /// Hosted by another region (cached).
    Remote(RegionId),
    /// Home unknown; messages buffer.
    Unknown,
    /// Hosted here, being handed off (entities live until stopped).
    HandingOff,
    /// Entities being stopped.
    Stopping,
}

/// The region of one entity type on one node: shard-home cache, bounded buffers, routing and the
/// region's side of hand-offs, with no IO.
///
/// The hot path ([`RegionState::send`] with a cached home) is a map lookup and never involves the
/// coordinator.
#[derive(Debug)]
pub struct RegionState<M> {
    id: RegionId,
    config: RegionConfig,
    epoch: Epoch,
    registered: bool,
    refused: Option<RegisterError>,
    last_register: Option<u64>,
    /// The current registration attempt (0 before the first): only an answer echoing it is
    /// taken, so a late answer of a previous coordinator cannot end the registration.
    attempt: u64,
    slots: HashMap<ShardId, Slot>,
    buffers: HashMap<ShardId, VecDeque<Envelope<M>>>,
    /// Per buffered shard: how many of its buffer's first messages are entities' unhandled
    /// ones, then how many were held by a fence. Both were accepted before the rest of the
    /// buffer, in that order, so later ones of each kind go in behind their kind.
    accepted: HashMap<ShardId, (usize, usize)>,
    /// Fences received per shard for the newest hand-off id seen.
    fences: HashMap<ShardId, (HandOffId, BTreeSet<RegionId>)>,
    /// Fences this region sent, per shard, until it learns the shard's next home: sent again
    /// at growing intervals meanwhile (see `resend_fences`).
    sent_fences: HashMap<ShardId, SentFence>,
    /// The hand-off id each shard was last stopped for (or found not hosted by): a `HandOff`
    /// with this id or an older one is a late or repeated copy, answered with `ShardStopped`
    /// and otherwise ignored (it must not stop the shard should it be hosted here again).
    stopped_for: HashMap<ShardId, HandOffId>,
    /// The fencing token of the newest allocation of each shard to this region.
    tokens: HashMap<ShardId, FencingToken>,
    leave_complete: bool,
    now: u64,
    stats: RegionCoordStats,
}

impl<M> RegionState<M> {
    /// A region that will register once told [`RegionInput::CoordinatorChanged`] (or on ticks).
    pub fn new(id: RegionId, config: RegionConfig) -> Self {
        RegionState {
            id,
            config,
            epoch: 0,
            registered: false,
            refused: None,
            last_register: None,
            attempt: 0,
            slots: HashMap::new(),
            buffers: HashMap::new(),
            accepted: HashMap::new(),
            fences: HashMap::new(),
            sent_fences: HashMap::new(),
            stopped_for: HashMap::new(),
            tokens: HashMap::new(),
            leave_complete: false,
            now: 0,
            stats: RegionCoordStats::default(),
        }
    }

    /// This region's id.
    pub fn id(&self) -> &RegionId {
        &self.id
    }

    /// The epoch of the coordinator it registered with last (0 before the first).
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Sets the proxy flag sent with the next `Register` (for an IO layer that learns it
    /// late, e.g. from the node's roles). Meant to be set before the first registration.
    pub fn set_proxy(&mut self, proxy: bool) {
        self.config.proxy = proxy;
    }

    /// Whether this region is proxy-only (routes, never hosts).
    pub fn is_proxy(&self) -> bool {
        self.config.proxy
    }

    /// Why the coordinator refused this region, if it did (every send fails from then on).
    pub fn refused(&self) -> Option<&RegisterError> {
        self.refused.as_ref()
    }

    /// Whether the current coordinator acknowledged the registration.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Whether the coordinator told this (leaving) region that all its shards are handed off.
    pub fn is_leave_complete(&self) -> bool {
        self.leave_complete
    }

    /// Counters.
    pub fn stats(&self) -> &RegionCoordStats {
        &self.stats
    }

    /// Shards whose entities live here (hosted, moving or stopping): the single-writer set.
    pub fn hosted_shards(&self) -> BTreeSet<ShardId> {
        self.slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Local | Slot::Owner { .. }))
            .map(|(k, _)| *k)
            .collect()
    }

    /// The fencing token of the newest allocation of `shard` to this region, if the
    /// coordinator gave one: what the shard's entities write with while they live here
    /// (read it when [`RegionAction::StartShard`] asks to host the shard).
    pub fn fencing_token(&self, shard: ShardId) -> Option<FencingToken> {
        self.tokens.get(&shard).copied()
    }

    /// True if [`send_local`](Self::send_local) would take a message for `shard` now (it is
    /// hosted here and this region was not refused), without counting anything.
    pub fn is_local(&self, shard: ShardId) -> bool {
        self.refused.is_none() && matches!(self.slots.get(&shard), Some(Slot::Local))
    }

    /// Where a shard stands here.
    pub fn shard_view(&self, shard: ShardId) -> ShardView {
        match self.slots.get(&shard) {
            Some(Slot::Local) => ShardView::Local,
            Some(Slot::Remote(r)) => ShardView::Remote(r.clone()),
            None | Some(Slot::Unknown { .. }) => ShardView::Unknown,
            Some(Slot::Owner {
                phase: OwnerPhase::Stopping { .. },
                ..
            }) => ShardView::Stopping,
            Some(Slot::Owner { .. }) => ShardView::HandingOff,
        }
    }

    /// The regions this one has cached as the home of some shard (those it would forward
    /// to): the IO layer checks them, with its peers and members, for a node that is gone.
    pub(crate) fn cached_homes(&self) -> BTreeSet<RegionId> {
        self.slots
            .values()
            .filter_map(|s| match s {
                Slot::Remote(r) => Some(r.clone()),
                _ => None,
            })
            .collect()
    }

    /// How many shards have fences kept (tests: bounded by the shard count).
    #[cfg(test)]
    pub(crate) fn fenced_shards(&self) -> usize {
        self.fences.len()
    }

    /// Messages buffered now, over all shards.
    pub fn buffered(&self) -> usize {
        self.buffers.values().map(VecDeque::len).sum()
    }

    /// The buffered messages (e.g. to account for them when the node dies).
    pub fn buffered_envelopes(&self) -> impl Iterator<Item = &Envelope<M>> {
        self.buffers.values().flatten()
    }

    /// Takes every buffered message out, shard by shard in order (the node stops hosting:
    /// the IO layer records them as dead letters, and nothing forwards them later).
    pub fn take_buffered(&mut self) -> Vec<Envelope<M>> {
        self.accepted.clear();
        std::mem::take(&mut self.buffers)
            .into_values()
            .flatten()
            .collect()
    }

    /// Route a message from a local sender. Delivered locally, forwarded, or buffered; a full
    /// buffer hands the message back with [`SendError::BufferFull`] (and counts it).
    pub fn send(
        &mut self,
        now_ms: u64,
        envelope: Envelope<M>,
        out: &mut Vec<RegionAction<M>>,
    ) -> Result<(), Rejected<M>> {
        self.now = self.now.max(now_ms);
        if let Some(e) = &self.refused {
            return Err(Rejected {
                error: SendError::Refused(e.clone()),
                envelope,
            });
        }
        if envelope.shard >= self.config.shard_count {
            return Err(Rejected {
                error: SendError::BadShard {
                    shard: envelope.shard,
                    shard_count: self.config.shard_count,
                },
                envelope,
            });
        }
        self.route(envelope, false, out)
    }

    /// The hot path of [`send`](Self::send) for a shard hosted here: if the region is not
    /// refused and the shard's slot is `Local`, counts the delivery and returns true; the
    /// caller then delivers to its local host itself, exactly as it would carry out the
    /// `DeliverLocal` that `send` emits, without building an [`Envelope`].
    pub fn send_local(&mut self, shard: ShardId) -> bool {
        if self.refused.is_some() || !matches!(self.slots.get(&shard), Some(Slot::Local)) {
            return false;
        }
        self.stats.delivered_local += 1;
        true
    }

    fn route(
        &mut self,
        mut env: Envelope<M>,
        from_peer: bool,
        out: &mut Vec<RegionAction<M>>,
    ) -> Result<(), Rejected<M>> {
        let shard = env.shard;
        match self.slots.get(&shard) {
            Some(Slot::Local) => {
                self.stats.delivered_local += 1;
                out.push(RegionAction::DeliverLocal(env));
                Ok(())
            }
            Some(Slot::Owner {
                phase: OwnerPhase::Begun { .. } | OwnerPhase::WaitFences { .. },
                ..
            }) if from_peer => {
                // Sent before the peer's fence: still ours to deliver.
                self.stats.delivered_local += 1;
                out.push(RegionAction::DeliverLocal(env));
                Ok(())
            }
            Some(Slot::Remote(r)) if env.hops < self.config.max_hops => {
                let to = r.clone();
                env.hops += 1;
                self.stats.forwarded += 1;
                out.push(RegionAction::ToPeer {
                    to,
                    msg: PeerMsg::Deliver(env),
                });
                Ok(())
            }
            Some(Slot::Remote(_)) => {
                // Too many hops: caches disagree. Ask again.
                self.slots
                    .insert(shard, Slot::Unknown { last_request: None });
                self.buffer(env, out)
            }
            _ => self.buffer(env, out),
        }
    }

    fn buffer(
        &mut self,
        env: Envelope<M>,
        out: &mut Vec<RegionAction<M>>,
    ) -> Result<(), Rejected<M>> {
        let shard = env.shard;
        let buf = self.buffers.entry(shard).or_default();
        // Accepted messages at its front do not count: the limit bounds what senders add.
        let accepted = self
            .accepted
            .get(&shard)
            .map_or(0, |(unhandled, held)| unhandled + held);
        if buf.len() - accepted.min(buf.len()) >= self.config.buffer_limit {
            self.stats.overflow_total += 1;
            return Err(Rejected {
                error: SendError::BufferFull {
                    shard,
                    limit: self.config.buffer_limit,
                },
                envelope: env,
            });
        }
        buf.push_back(env);
        self.ask_home_once(shard, out);
        Ok(())
    }

    /// Asks for the home of `shard` if it is unknown (an unknown shard becomes `Unknown`) and
    /// not asked for yet; later requests are the tick's retries.
    fn ask_home_once(&mut self, shard: ShardId, out: &mut Vec<RegionAction<M>>) {
        let slot = self
            .slots
            .entry(shard)
            .or_insert(Slot::Unknown { last_request: None });
        if let Slot::Unknown { last_request } = slot {
            if last_request.is_none() && self.registered {
                *last_request = Some(self.now);
                self.stats.home_requests += 1;
                out.push(RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
                    epoch: self.epoch,
                    shard,
                }));
            }
        }
    }

    /// Delivers or forwards what waited for `shard`, whose home the coordinator just gave
    /// (`on_home`: a `ShardHome`, a `RegisterAck`, or the next home learnt while stopping).
    ///
    /// Forwarded even past the hop limit: a message that reached it was buffered to ask the
    /// coordinator afresh, and this is the answer. (Routed by `route` instead, it was
    /// buffered again, the home asked again, and so on at round-trip speed for good, with
    /// everything behind it for the shard, local senders' messages too.) A loop between
    /// caches is still cut: past the limit no region forwards on its cached home, only on a
    /// fresh answer, so each further hop costs a coordinator round trip and refreshes the
    /// cache of the region that makes it. Nothing is buffered again here, so the marks of
    /// the accepted messages at the buffer's front are not needed any more; a slot that is
    /// neither `Local` nor `Remote` (not a case `on_home` leaves) keeps buffer and marks.
    fn flush(&mut self, shard: ShardId, out: &mut Vec<RegionAction<M>>) {
        let to = match self.slots.get(&shard) {
            Some(Slot::Local) => None,
            Some(Slot::Remote(r)) => Some(r.clone()),
            _ => return,
        };
        let (unhandled, held) = self.accepted.remove(&shard).unwrap_or_default();
        let Some(buf) = self.buffers.remove(&shard) else {
            return;
        };
        for (i, mut env) in buf.into_iter().enumerate() {
            match &to {
                None => {
                    self.stats.delivered_local += 1;
                    out.push(if i < unhandled + held {
                        RegionAction::DeliverAccepted(env)
                    } else {
                        RegionAction::DeliverLocal(env)
                    });
                }
                Some(to) => {
                    env.hops = env.hops.saturating_add(1);
                    self.stats.forwarded += 1;
                    out.push(RegionAction::ToPeer {
                        to: to.clone(),
                        msg: PeerMsg::Deliver(env),
                    });
                }
            }
        }
    }

    /// Handle one input at time `now_ms`, appending actions to `out`.
    pub fn handle(&mut self, now_ms: u64, input: RegionInput<M>, out: &mut Vec<RegionAction<M>>) {
        self.now = self.now.max(now_ms);
        match input {
            RegionInput::FromCoordinator(msg) => self.on_coordinator(msg, out),
            RegionInput::FromPeer { from, msg } => match msg {
                PeerMsg::Deliver(env) => {
                    if let Some(e) = &self.refused {
                        // A refused region hosts nothing (its shards stopped at the refusal)
                        // and routes nothing: handed back, as a local send is.
                        out.push(RegionAction::Rejected(Rejected {
                            error: SendError::Refused(e.clone()),
                            envelope: env,
                        }));
                        return;
                    }
                    if env.shard >= self.config.shard_count {
                        // A peer with another shard count (refused at registration, but its
                        // messages may be on their way): handed back, not dropped silently.
                        out.push(RegionAction::Rejected(Rejected {
                            error: SendError::BadShard {
                                shard: env.shard,
                                shard_count: self.config.shard_count,
                            },
                            envelope: env,
                        }));
                        return;
                    }
                    if let Err(r) = self.route(env, true, out) {
                        out.push(RegionAction::Rejected(r));
                    }
                }
                // A fence for a shard this region's shard count does not have waits for no
                // hand-off here: ignored, so the fences kept stay bounded by the shard count.
                PeerMsg::Fence { shard, .. } if shard >= self.config.shard_count => {}
                PeerMsg::Fence { id, shard } => self.on_fence(from, id, shard, out),
            },
            RegionInput::CoordinatorChanged => {
                if self.refused.is_none() {
                    self.new_attempt(out);
                }
            }
            RegionInput::ShardStopped(shard) => self.on_stopped(shard, out),
            RegionInput::Unhandled { envelopes, .. } | RegionInput::Held { envelopes, .. }
                if self.refused.is_some() =>
            {
                // Nothing is hosted or routed any more: handed back, in order.
                let error = SendError::Refused(self.refused.clone().expect("checked"));
                out.extend(envelopes.into_iter().map(|envelope| {
                    RegionAction::Rejected(Rejected {
                        error: error.clone(),
                        envelope,
                    })
                }));
            }
            RegionInput::Unhandled { shard, envelopes } => {
                self.on_accepted(shard, envelopes, false, out)
            }
            RegionInput::Held { shard, envelopes } => self.on_accepted(shard, envelopes, true, out),
            RegionInput::RegionDown(r) => self.on_region_down(r, out),
            RegionInput::Tick => self.on_tick(out),
        }
    }

    /// Starts a new registration attempt (a new coordinator, or a newer epoch): answers to
    /// earlier attempts are ignored from now on.
    fn new_attempt(&mut self, out: &mut Vec<RegionAction<M>>) {
        self.registered = false;
        self.attempt += 1;
        self.register(out);
    }

    /// Sends `Register` for the current attempt (its first send, or a retry).
    fn register(&mut self, out: &mut Vec<RegionAction<M>>) {
        if self.attempt == 0 {
            self.attempt = 1;
        }
        self.last_register = Some(self.now);
        self.stats.register_attempts += 1;
        out.push(RegionAction::ToCoordinator(ToCoordinator::Register {
            shard_count: self.config.shard_count,
            proxy: self.config.proxy,
            shard_fn: self.config.shard_fn_fingerprint,
            attempt: self.attempt,
        }));
    }

    /// Whether a registration answer with `attempt` answers an earlier attempt than the
    /// current one (0: an older coordinator that does not echo it, judged by epoch alone).
    fn stale_attempt(&self, attempt: u64) -> bool {
        attempt != 0 && attempt != self.attempt
    }

    fn ask_home(&mut self, shard: ShardId, out: &mut Vec<RegionAction<M>>) {
        if self.registered {
            self.stats.home_requests += 1;
            out.push(RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
                epoch: self.epoch,
                shard,
            }));
        }
    }

    fn on_coordinator(&mut self, msg: ToRegion, out: &mut Vec<RegionAction<M>>) {
        let e = msg.epoch();
        match msg {
            ToRegion::RegisterAck {
                epoch,
                homes,
                tokens,
                attempt,
            } => {
                if self.refused.is_some()
                    || self.stale_attempt(attempt)
                    || epoch < self.epoch
                    || (epoch == self.epoch && self.registered)
                {
                    self.stats.stale_ignored += 1;
                    return;
                }
                self.epoch = epoch;
                self.registered = true;
                for (shard, token) in tokens {
                    self.note_token(shard, token);
                }
                self.apply_homes(homes, out);
            }
            ToRegion::RegisterRefused {
                epoch,
                error,
                attempt,
            } => {
                if self.stale_attempt(attempt) || epoch < self.epoch {
                    self.stats.stale_ignored += 1;
                    return;
                }
                self.refused = Some(error.clone());
                out.push(RegionAction::Refused(error.clone()));
                // What waited for a home (sent before the answer came) fails like what is
                // sent from now on, instead of waiting in the buffers for good.
                for envelope in self.take_buffered() {
                    out.push(RegionAction::Rejected(Rejected {
                        error: SendError::Refused(error.clone()),
                        envelope,
                    }));
                }
                // The shards still hosted here stop: the coordinator that refused this region
                // does not count it as theirs (it was downed, or the coordinator has another
                // shard count or shard function) and may home them elsewhere, so entities
                // running here would be a second incarnation.
                let mut hosted: Vec<ShardId> = self
                    .slots
                    .iter()
                    .filter(|(_, s)| {
                        matches!(
                            s,
                            Slot::Local
                                | Slot::Owner {
                                    phase: OwnerPhase::Begun { .. } | OwnerPhase::WaitFences { .. },
                                    ..
                                }
                        )
                    })
                    .map(|(k, _)| *k)
                    .collect();
                hosted.sort_unstable();
                for shard in hosted {
                    self.begin_stop(shard, None, None, out);
                }
                // Shards already stopping stay stopped: a home given before the refusal
                // (possibly this region) no longer counts.
                for slot in self.slots.values_mut() {
                    if let Slot::Owner {
                        phase: OwnerPhase::Stopping { next_home, .. },
                        ..
                    } = slot
                    {
                        *next_home = None;
                    }
                }
            }
            ToRegion::StaleEpoch { epoch } => {
                if epoch > self.epoch && self.refused.is_none() {
                    self.new_attempt(out);
                }
            }
            _ if e != self.epoch || !self.registered => {
                // An old coordinator's message (fenced), or one from a coordinator not yet
                // registered with (its RegisterAck, sent first, will bring the state).
                self.stats.stale_ignored += 1;
            }
            ToRegion::ShardHome {
                shard,
                region,
                token,
                ..
            } => {
                if region == self.id {
                    self.note_token(shard, token);
                }
                self.on_home(shard, region, out)
            }
            ToRegion::BeginHandOff { id, shard } => self.on_begin_handoff(id, shard, out),
            ToRegion::HandOff { id, shard, fences } => self.on_handoff(id, shard, fences, out),
            ToRegion::LeaveComplete { .. } => {
                if !self.leave_complete {
                    self.leave_complete = true;
                    out.push(RegionAction::LeaveComplete);
                }
            }
        }
    }

    fn apply_homes(&mut self, homes: Vec<(ShardId, RegionId)>, out: &mut Vec<RegionAction<M>>) {
        let homes: BTreeMap<ShardId, RegionId> = homes.into_iter().collect();
        let known: BTreeSet<ShardId> = self
            .slots
            .keys()
            .copied()
            .chain(homes.keys().copied())
            .collect();
        for shard in known {
            match homes.get(&shard) {
                Some(r) => self.on_home(shard, r.clone(), out),
                None => self.forget(shard, out),
            }
        }
        // Buffered shards without a home: ask now.
        let waiting: Vec<ShardId> = self
            .slots
            .iter()
            .filter(|(s, slot)| {
                matches!(slot, Slot::Unknown { .. }) && self.buffers.contains_key(s)
            })
            .map(|(s, _)| *s)
            .collect();
        for shard in waiting {
            self.slots.insert(
                shard,
                Slot::Unknown {
                    last_request: Some(self.now),
                },
            );
            self.ask_home(shard, out);
        }
    }

    /// The coordinator does not list the shard: drop the cache; if hosted, stop it. A shard
    /// whose hand-off the same coordinator (epoch) runs is left to that hand-off: the
    /// coordinator leaves moving shards out of its `RegisterAck`, and stopping the shard here
    /// would skip the fences its `HandOff` waits for and answer it with no `ShardStopped`.
    fn forget(&mut self, shard: ShardId, out: &mut Vec<RegionAction<M>>) {
        let epoch = self.epoch;
        match self.slots.get_mut(&shard) {
            Some(Slot::Remote(_)) => {
                self.slots
                    .insert(shard, Slot::Unknown { last_request: None });
            }
            Some(Slot::Owner {
                id: Some(id),
                phase: OwnerPhase::Begun { .. } | OwnerPhase::WaitFences { .. },
            }) if id.epoch == epoch => {}
            Some(Slot::Local)
            | Some(Slot::Owner {
                phase: OwnerPhase::Begun { .. } | OwnerPhase::WaitFences { .. },
                ..
            }) => self.begin_stop(shard, None, None, out),
            Some(Slot::Owner {
                phase: OwnerPhase::Stopping { next_home, .. },
                ..
            }) => *next_home = None,
            _ => {}
        }
    }

    fn begin_stop(
        &mut self,
        shard: ShardId,
        id: Option<HandOffId>,
        next_home: Option<RegionId>,
        out: &mut Vec<RegionAction<M>>,
    ) {
        self.slots.insert(
            shard,
            Slot::Owner {
                id,
                phase: OwnerPhase::Stopping {
                    since: self.now,
                    forced: false,
                    next_home,
                },
            },
        );
        if let (Some(id), Some((fid, _))) = (id, self.fences.get(&shard)) {
            if *fid <= id {
                self.fences.remove(&shard);
            }
        }
        out.push(RegionAction::StopShard(shard));
    }

    /// Keeps the newest fencing token of an allocation of `shard` here (0: none given).
    fn note_token(&mut self, shard: ShardId, token: FencingToken) {
        if token != 0 {
            let t = self.tokens.entry(shard).or_insert(token);
            *t = (*t).max(token);
        }
    }

    fn on_home(&mut self, shard: ShardId, region: RegionId, out: &mut Vec<RegionAction<M>>) {
        if self.refused.is_some() {
            // A refused region hosts nothing (its shards stopped at the refusal) and every
            // send fails, so no home counts: starting a shard here again would bring its
            // remembered entities back as a second incarnation.
            match self.slots.get_mut(&shard) {
                Some(Slot::Owner {
                    phase: OwnerPhase::Stopping { next_home, .. },
                    ..
                }) => *next_home = None,
                Some(Slot::Local) | Some(Slot::Owner { .. }) => {
                    self.begin_stop(shard, None, None, out)
                }
                _ => {}
            }
            return;
        }
        let mine = region == self.id;
        match self.slots.get_mut(&shard) {
            Some(Slot::Local) if mine => {}
            Some(Slot::Local) => self.begin_stop(shard, None, Some(region), out),
            Some(Slot::Owner {
                phase: OwnerPhase::Stopping { next_home, .. },
                ..
            }) => *next_home = Some(region),
            Some(Slot::Owner { .. }) if mine => {
                // The hand-off was aborted: keep hosting, deliver what local senders buffered.
                // (Fences are kept: some may already belong to the next attempt.)
                self.slots.insert(shard, Slot::Local);
                self.flush(shard, out);
            }
            Some(Slot::Owner { .. }) => self.begin_stop(shard, None, Some(region), out),
            _ if mine => {
                if self.config.proxy {
                    return;
                }
                self.slots.insert(shard, Slot::Local);
                out.push(RegionAction::StartShard(shard));
                self.flush(shard, out);
            }
            _ => {
                self.slots.insert(shard, Slot::Remote(region));
                self.flush(shard, out);
            }
        }
    }

    fn on_begin_handoff(&mut self, id: HandOffId, shard: ShardId, out: &mut Vec<RegionAction<M>>) {
        let mut fenced = None;
        // A fence of an earlier hand-off of this shard is stale now.
        if self.sent_fences.get(&shard).is_some_and(|f| f.id < id) {
            self.sent_fences.remove(&shard);
        }
        match self.slots.get(&shard).cloned() {
            Some(Slot::Local) => {
                self.slots.insert(
                    shard,
                    Slot::Owner {
                        id: Some(id),
                        phase: OwnerPhase::Begun {
                            last_request: self.now,
                        },
                    },
                );
            }
            Some(Slot::Owner { id: old, phase }) => {
                if !matches!(phase, OwnerPhase::Stopping { .. }) && old != Some(id) {
                    self.slots.insert(
                        shard,
                        Slot::Owner {
                            id: Some(id),
                            phase: OwnerPhase::Begun {
                                last_request: self.now,
                            },
                        },
                    );
                }
            }
            Some(Slot::Remote(r)) => {
                out.push(RegionAction::ToPeer {
                    to: r.clone(),
                    msg: PeerMsg::Fence { id, shard },
                });
                self.sent_fences.insert(
                    shard,
                    SentFence {
                        id,
                        to: r.clone(),
                        last_sent: self.now,
                        interval: self.config.retry_interval_ms,
                    },
                );
                fenced = Some(r);
                // The coordinator broadcasts the new home; ask only after the retry interval.
                self.slots.insert(
                    shard,
                    Slot::Unknown {
                        last_request: Some(self.now),
                    },
                );
            }
            Some(Slot::Unknown { .. }) | None => {}
        }
        out.push(RegionAction::ToCoordinator(
            ToCoordinator::BeginHandOffAck { id, shard, fenced },
        ));
    }

    fn on_handoff(
        &mut self,
        id: HandOffId,
        shard: ShardId,
        fences: Vec<RegionId>,
        out: &mut Vec<RegionAction<M>>,
    ) {
        if self.stopped_for.get(&shard).is_some_and(|done| id <= *done) {
            // A late or repeated copy of a hand-off the shard was stopped for already (ids
            // grow): answered again, and a shard hosted here again since is left alone.
            out.push(RegionAction::ToCoordinator(ToCoordinator::ShardStopped {
                id,
                shard,
            }));
            return;
        }
        match self.slots.get(&shard).cloned() {
            Some(Slot::Local)
            | Some(Slot::Owner {
                phase: OwnerPhase::Begun { .. },
                ..
            }) => self.wait_fences(id, shard, fences.into_iter().collect(), self.now, out),
            Some(Slot::Owner {
                phase: OwnerPhase::WaitFences { since, .. },
                ..
            }) => self.wait_fences(id, shard, fences.into_iter().collect(), since, out),
            Some(Slot::Owner {
                phase: OwnerPhase::Stopping { .. },
                ..
            }) => {}
            _ => {
                // Not hosted here (already stopped, or never): nothing of it lives here.
                self.stopped_for.insert(shard, id);
                out.push(RegionAction::ToCoordinator(ToCoordinator::ShardStopped {
                    id,
                    shard,
                }));
            }
        }
    }

    fn wait_fences(
        &mut self,
        id: HandOffId,
        shard: ShardId,
        mut need: BTreeSet<RegionId>,
        since: u64,
        out: &mut Vec<RegionAction<M>>,
    ) {
        if let Some((fid, got)) = self.fences.get(&shard) {
            if *fid == id {
                need.retain(|r| !got.contains(r));
            }
        }
        if need.is_empty() {
            self.begin_stop(shard, Some(id), None, out);
        } else {
            self.slots.insert(
                shard,
                Slot::Owner {
                    id: Some(id),
                    phase: OwnerPhase::WaitFences { need, since },
                },
            );
        }
    }

    fn on_fence(
        &mut self,
        from: RegionId,
        id: HandOffId,
        shard: ShardId,
        out: &mut Vec<RegionAction<M>>,
    ) {
        let entry = self
            .fences
            .entry(shard)
            .or_insert_with(|| (id, BTreeSet::new()));
        if entry.0 < id {
            *entry = (id, BTreeSet::new());
        }
        if entry.0 == id {
            entry.1.insert(from.clone());
        }
        if let Some(Slot::Owner {
            id: Some(cur),
            phase: OwnerPhase::WaitFences { need, .. },
        }) = self.slots.get_mut(&shard)
        {
            if *cur == id {
                need.remove(&from);
                if need.is_empty() {
                    self.begin_stop(shard, Some(id), None, out);
                }
            }
        }
    }

    fn on_stopped(&mut self, shard: ShardId, out: &mut Vec<RegionAction<M>>) {
        let Some(Slot::Owner {
            id,
            phase: OwnerPhase::Stopping { next_home, .. },
        }) = self.slots.get(&shard).cloned()
        else {
            return;
        };
        if let Some(id) = id {
            self.stopped_for.insert(shard, id);
            if id.epoch == self.epoch {
                out.push(RegionAction::ToCoordinator(ToCoordinator::ShardStopped {
                    id,
                    shard,
                }));
            }
        }
        self.slots
            .insert(shard, Slot::Unknown { last_request: None });
        match next_home {
            Some(r) => self.on_home(shard, r, out),
            None => {
                if self.buffers.contains_key(&shard) {
                    // Ask after the retry interval: the coordinator broadcasts the new home.
                    self.slots.insert(
                        shard,
                        Slot::Unknown {
                            last_request: Some(self.now),
                        },
                    );
                }
            }
        }
    }

    /// Messages this node accepted earlier: those a force-stopped entity had not handled
    /// ([`RegionInput::Unhandled`]), or those a fence `held` ([`RegionInput::Held`]).
    /// Delivered here ([`RegionAction::DeliverAccepted`]) while the shard's entities run
    /// here (hosted, or a hand-off that has not stopped them yet), forwarded if the shard
    /// has a home elsewhere. While the shard buffers (its hand-off stops it, or its home is
    /// unknown) they go ahead of the buffer's other messages, even past its limit (they were
    /// accepted already): unhandled ones first, then held ones, each kind in arrival order;
    /// delivered as accepted if that buffer is later delivered here.
    fn on_accepted(
        &mut self,
        shard: ShardId,
        envelopes: Vec<Envelope<M>>,
        held: bool,
        out: &mut Vec<RegionAction<M>>,
    ) {
        if matches!(
            self.slots.get(&shard),
            Some(Slot::Local)
                | Some(Slot::Owner {
                    phase: OwnerPhase::Begun { .. } | OwnerPhase::WaitFences { .. },
                    ..
                })
        ) {
            // The shard's entities run here (until a hand-off stops them): they take the
            // messages now, ahead of what local senders buffered since the hand-off began
            // (those go to the next home), and of what peers send until they fence.
            self.stats.delivered_local += envelopes.len() as u64;
            out.extend(envelopes.into_iter().map(RegionAction::DeliverAccepted));
            return;
        }
        if matches!(self.slots.get(&shard), Some(Slot::Remote(_))) {
            if envelopes.iter().all(|e| e.hops < self.config.max_hops) {
                // A known home elsewhere: nothing is buffered for it.
                for env in envelopes {
                    if let Err(r) = self.route(env, false, out) {
                        out.push(RegionAction::Rejected(r));
                    }
                }
                return;
            }
            // One of them made too many hops (as in `route`): the cached home is asked
            // afresh, and they wait for it in the buffer, marked as accepted (ahead of the
            // rest, not counting toward the limit), all of them to keep their order.
            self.slots
                .insert(shard, Slot::Unknown { last_request: None });
        }
        if envelopes.is_empty() {
            return;
        }
        let (unhandled, held_count) = self.accepted.entry(shard).or_default();
        let at = if held {
            *unhandled + *held_count
        } else {
            *unhandled
        };
        if held {
            *held_count += envelopes.len();
        } else {
            *unhandled += envelopes.len();
        }
        let buffer = self.buffers.entry(shard).or_default();
        // In one pass, not an insertion each: a force-stopped entity's backlog can be long.
        let behind = buffer.split_off(at.min(buffer.len()));
        buffer.extend(envelopes);
        buffer.extend(behind);
        // A shard whose home is unknown is asked for, as when a sender buffers.
        self.ask_home_once(shard, out);
    }

    fn on_region_down(&mut self, r: RegionId, out: &mut Vec<RegionAction<M>>) {
        // The coordinator leaves a region that is down out of the fences a hand-off waits for.
        self.sent_fences.retain(|_, f| f.to != r);
        let shards: Vec<ShardId> = self.slots.keys().copied().collect();
        for shard in shards {
            match self.slots.get_mut(&shard) {
                Some(Slot::Remote(home)) if *home == r => {
                    self.slots
                        .insert(shard, Slot::Unknown { last_request: None });
                }
                Some(Slot::Owner {
                    id: Some(id),
                    phase: OwnerPhase::WaitFences { need, .. },
                }) => {
                    let id = *id;
                    need.remove(&r);
                    if need.is_empty() {
                        self.begin_stop(shard, Some(id), None, out);
                    }
                }
                Some(Slot::Owner {
                    phase: OwnerPhase::Stopping { next_home, .. },
                    ..
                }) if next_home.as_ref() == Some(&r) => *next_home = None,
                _ => {}
            }
        }
    }

    /// Sends again every fence whose shard's next home is still unknown here, a retry
    /// interval after the first copy and then at doubling intervals up to
    /// [`FENCE_RESEND_MAX_INTERVAL_MS`], and forgets those whose home is known (the
    /// coordinator broadcasts it when the hand-off ends), whose old home is down, or that a
    /// later hand-off of the shard replaced.
    ///
    /// There is no last copy: the owner waits for this region's fence whether or not this
    /// region has messages for the shard, for as long as the hand-off runs, so a bound on the
    /// copies (a minute, until 2026-11-30) is a bound on how long a broken connection may last
    /// before the hand-off is stuck for good. The cost of going on is one small message per
    /// `FENCE_RESEND_MAX_INTERVAL_MS` per shard: while the hand-off runs, and after one that
    /// ended without a next home (no region could take the shard), until this region learns
    /// the shard's home (it asks as soon as a sender here buffers for it).
    ///
    /// A fence goes on the user lane, which is at most once: a connection that breaks after
    /// the fence left the queue loses it, without anyone being downed, and the owner would
    /// wait for it (the coordinator only repeats `HandOff`, which does not reach this region)
    /// until a coordinator failover or this region's downing. Sending it again keeps the
    /// order the fence stands for: since the first fence this region forwards nothing to the
    /// old home for that shard (it buffers until the next home is known), so a later copy
    /// still follows every message it forwarded there before, and the owner counts copies
    /// once (per hand-off id) and ignores those of an older hand-off.
    fn resend_fences(&mut self, out: &mut Vec<RegionAction<M>>) {
        let now = self.now;
        let retry = self.config.retry_interval_ms;
        let slots = &self.slots;
        let refused = self.refused.is_some();
        self.sent_fences
            .retain(|shard, _| !refused && matches!(slots.get(shard), Some(Slot::Unknown { .. })));
        let mut due: Vec<ShardId> = self
            .sent_fences
            .iter()
            .filter(|(_, f)| now.saturating_sub(f.last_sent) >= f.interval)
            .map(|(s, _)| *s)
            .collect();
        due.sort_unstable();
        for shard in due {
            let Some(f) = self.sent_fences.get_mut(&shard) else {
                continue;
            };
            f.last_sent = now;
            f.interval = f
                .interval
                .saturating_mul(2)
                .min(FENCE_RESEND_MAX_INTERVAL_MS.max(retry));
            self.stats.fences_resent += 1;
            out.push(RegionAction::ToPeer {
                to: f.to.clone(),
                msg: PeerMsg::Fence { id: f.id, shard },
            });
        }
    }

    fn on_tick(&mut self, out: &mut Vec<RegionAction<M>>) {
        let now = self.now;
        let retry = self.config.retry_interval_ms;
        let fence_timeout = self.config.fence_timeout_ms;
        let stop_timeout = self.config.stop_timeout_ms;
        if !self.registered
            && self.refused.is_none()
            && self
                .last_register
                .is_none_or(|t| now.saturating_sub(t) >= retry)
        {
            self.register(out);
        }
        self.resend_fences(out);
        let mut shards: Vec<ShardId> = self.slots.keys().copied().collect();
        shards.sort_unstable();
        for shard in shards {
            let registered = self.registered;
            let waiting = self.buffers.contains_key(&shard);
            let Some(slot) = self.slots.get_mut(&shard) else {
                continue;
            };
            match slot {
                Slot::Unknown { last_request }
                    if registered
                        && waiting
                        && last_request.is_none_or(|t| now.saturating_sub(t) >= retry) =>
                {
                    *last_request = Some(now);
                    self.stats.home_requests += 1;
                    out.push(RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
                        epoch: self.epoch,
                        shard,
                    }));
                }
                Slot::Owner {
                    phase: OwnerPhase::Begun { last_request },
                    ..
                } if registered && now.saturating_sub(*last_request) >= retry => {
                    *last_request = now;
                    self.stats.home_requests += 1;
                    out.push(RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
                        epoch: self.epoch,
                        shard,
                    }));
                }
                Slot::Owner {
                    id,
                    phase: OwnerPhase::WaitFences { since, .. },
                } if fence_timeout.is_some_and(|t| now.saturating_sub(*since) >= t) => {
                    let id = *id;
                    self.stats.fence_timeouts += 1;
                    self.begin_stop(shard, id, None, out);
                }
                Slot::Owner {
                    phase: OwnerPhase::Stopping { since, forced, .. },
                    ..
                } if !*forced && now.saturating_sub(*since) >= stop_timeout => {
                    *forced = true;
                    self.stats.forced_stops += 1;
                    out.push(RegionAction::ForceStopShard(shard));
                }
                _ => {}
            }
        }
    }
}
