//! `MembershipNode`: one node's membership state machine.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::downing::{
    decide, would_down, DowningConfig, InstabilityTimer, StabilityTimer, Strategy,
};
use crate::events::{diff, ClusterEvent};
use crate::gossip::{Gossip, Received};
use crate::leader::leader_actions;
use crate::member::{MemberStatus, UniqueAddress};
use crate::phi::{PhiAccrualDetector, PhiConfig};
use crate::protocol::{Action, Input};
use crate::ring;

/// `d` in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Settings of a [`MembershipNode`].
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node.
    pub self_node: UniqueAddress,
    /// Its roles.
    pub roles: BTreeSet<String>,
    /// How often a gossip round runs (checked on `Tick`).
    pub gossip_interval: Duration,
    /// How often join requests are retried while joining.
    pub join_retry: Duration,
    /// The failure detector's settings.
    pub phi: PhiConfig,
    /// How many peers monitor each node (Akka: 9).
    pub monitored_by: usize,
    /// The split brain resolver's settings.
    pub downing: DowningConfig,
    /// A watched peer silent for this long counts as lost for fencing (see
    /// [`MembershipNode::is_fenced`]), even before the failure detector flags it. Keep it
    /// below the detector's earliest suspicion (about `acceptable_heartbeat_pause` plus the
    /// heartbeat interval) so that the losing side of a partition is fenced before the
    /// winning side can even start its `stable_after`. Default 1.5 s; the cluster runtime uses
    /// its detector's `acceptable_heartbeat_pause`.
    pub fence_after: Duration,
    /// Move joining members to `WeaklyUp` after this long without convergence (`None`: never).
    pub weakly_up_after: Option<Duration>,
    /// How long the first node of the seed list waits for another seed to answer its join
    /// requests before it forms a new cluster (Akka's `seed-node-timeout`: 5 s).
    pub seed_node_timeout: Duration,
    /// How long a removed incarnation's tombstone is kept (Akka's
    /// `prune-gossip-tombstones-after`: 24 h). Until then no gossip, however stale, brings it
    /// back as a member and it cannot join again; then the leader drops it at a convergence,
    /// so that restarts and leaves do not grow the gossip for good.
    pub prune_tombstones_after: Duration,
    /// The wall-clock time (ms since the UNIX epoch) at instant 0 of the times this node is
    /// given; removal times in the gossip are wall-clock times, comparable across nodes. The
    /// cluster runtime sets it; tests may leave it at 0.
    pub wall_clock_origin_ms: u64,
}

impl NodeConfig {
    /// Defaults for `self_node`: gossip every 1 s, heartbeat detector with a 500 ms estimate
    /// and a 1.5 s acceptable pause (a stopped node is suspected about 2.5 s after its last
    /// heartbeat, if heartbeats are sent every 500 ms), keep-majority after 2 s of stability,
    /// monitoring by 9 peers, weakly-up after 7 s, seed-node timeout 5 s.
    pub fn new(self_node: UniqueAddress) -> Self {
        Self {
            self_node,
            roles: BTreeSet::new(),
            gossip_interval: Duration::from_secs(1),
            join_retry: Duration::from_secs(1),
            phi: PhiConfig {
                acceptable_heartbeat_pause: Duration::from_millis(1500),
                first_heartbeat_estimate: Duration::from_millis(500),
                ..PhiConfig::default()
            },
            monitored_by: 9,
            downing: DowningConfig::default(),
            fence_after: Duration::from_millis(1500),
            weakly_up_after: Some(Duration::from_secs(7)),
            seed_node_timeout: Duration::from_secs(5),
            prune_tombstones_after: Duration::from_secs(24 * 3600),
            wall_clock_origin_ms: 0,
        }
    }
}

/// One node's membership state machine: feed it [`Input`]s, carry out the [`Action`]s.
///
/// It owns the node's view of the [`Gossip`], the failure detectors of the peers it monitors
/// and the split brain resolver's stability timer. It reads no clock: every input that needs
/// time carries the instant.
#[derive(Debug)]
pub struct MembershipNode {
    config: NodeConfig,
    gossip: Gossip,
    detectors: BTreeMap<UniqueAddress, PhiAccrualDetector>,
    /// Nodes that asked for this node's heartbeats, until when (see [`Input::WatchFrom`]).
    watch_requests: BTreeMap<UniqueAddress, u64>,
    stability: StabilityTimer,
    instability: InstabilityTimer,
    now: u64,
    next_gossip: u64,
    gossip_round: usize,
    seeds: Vec<String>,
    next_join: u64,
    form_at: Option<u64>,
    not_converged_since: Option<u64>,
    was_member: bool,
    /// When this node first saw itself a member (the welcome, or forming the cluster).
    member_since: Option<u64>,
    /// Join reminders sent (see [`MembershipNode::remind_members`]): picks the next member
    /// asked.
    reminders: usize,
    shut_down: bool,
    fence: Fence,
}

/// Whether this node is fenced: on the side of a partition that would lose (see
/// [`MembershipNode::is_fenced`]).
#[derive(Debug, Default)]
struct Fence {
    /// Fenced now.
    active: bool,
    /// Members whose gossip arrived since the losing picture went away (while `active`).
    heard: BTreeSet<UniqueAddress>,
}

impl MembershipNode {
    /// A node that is not a member of anything yet.
    pub fn new(config: NodeConfig) -> Self {
        Self {
            config,
            gossip: Gossip::new(),
            detectors: BTreeMap::new(),
            watch_requests: BTreeMap::new(),
            stability: StabilityTimer::new(),
            instability: InstabilityTimer::new(),
            now: 0,
            next_gossip: 0,
            gossip_round: 0,
            seeds: Vec::new(),
            next_join: 0,
            form_at: None,
            not_converged_since: None,
            was_member: false,
            member_since: None,
            reminders: 0,
            shut_down: false,
            fence: Fence::default(),
        }
    }

    /// Sets the wall-clock time at instant 0 again (see
    /// [`NodeConfig::wall_clock_origin_ms`]): the runtime does it on every tick, so that a
    /// clock set or stepped while the node runs is followed.
    pub fn set_wall_clock_origin(&mut self, origin_ms: u64) {
        self.config.wall_clock_origin_ms = origin_ms;
    }

    /// This node.
    pub fn self_node(&self) -> &UniqueAddress {
        &self.config.self_node
    }

    /// The current view of the membership.
    pub fn gossip(&self) -> &Gossip {
        &self.gossip
    }

    /// The status of this node in its own view (`None`: not a member).
    pub fn status(&self) -> Option<MemberStatus> {
        self.gossip.member(self.self_node()).map(|m| m.status)
    }

    /// `true` once the node has asked to be shut down.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// Whether this node is **fenced**: what must never run twice in the cluster (shard
    /// hosting, singletons) must not run here now.
    ///
    /// A node is fenced as soon as its current view is one on which the split brain resolver
    /// would down it: the resolver's decision evaluated without waiting for `stable_after`,
    /// with the watched peers silent for [`NodeConfig::fence_after`] counted as unreachable
    /// (so the losing side of a partition stops about when it could first suspect the other
    /// side, `stable_after` before the winning side can even decide), or, when the ring makes
    /// it watch only some of the members (more than [`NodeConfig::monitored_by`]), once it
    /// lost more than half of the peers it watches (its own view then cannot show that it is cut off from most of the
    /// cluster). It stays fenced until that is over, gossip arrived from a majority
    /// of the live members, **and** its view has converged (every `Up` or `Leaving` member
    /// has seen it, every unreachable member is `Down` or `Exiting`): a member that downed
    /// it meanwhile holds that decision in any view it has seen, so the decision reaches this
    /// node before it runs anything again. A `Down` node stays fenced, and so does one that
    /// was a member and learnt that it was removed (it is shutting down).
    pub fn is_fenced(&self) -> bool {
        self.fence.active || matches!(self.status(), Some(MemberStatus::Down)) || self.removed()
    }

    /// Was a member and is not any more: removed (it shuts down).
    fn removed(&self) -> bool {
        self.was_member && !self.is_member()
    }

    /// The peers whose heartbeats this node checks.
    pub fn monitored(&self) -> impl Iterator<Item = &UniqueAddress> {
        self.detectors.keys()
    }

    /// Handles one input.
    pub fn handle(&mut self, input: Input) -> Vec<Action> {
        if self.shut_down {
            return Vec::new();
        }
        let before = self.gossip.clone();
        let mut out = Vec::new();
        match input {
            Input::Gossip(from, g) => self.on_gossip(from, *g, &mut out),
            Input::HeartbeatTick(now) => {
                self.advance(now);
                let now = self.now;
                let nodes = self.ring_nodes();
                // The watchers in this node's view, those that flagged it (only they can
                // clear their flags), and those that asked: their view of the ring may differ.
                self.watch_requests.retain(|_, until| *until > now);
                for w in ring::watchers(self.self_node(), &nodes, self.config.monitored_by)
                    .into_iter()
                    .chain(self.gossip.reachability().observers_of(self.self_node()))
                    .chain(self.watch_requests.keys().cloned())
                    .collect::<BTreeSet<_>>()
                {
                    out.push(Action::SendHeartbeat(w));
                }
                let joining = matches!(
                    self.status(),
                    Some(MemberStatus::Joining | MemberStatus::WeaklyUp)
                );
                for peer in self.detectors.keys() {
                    out.push(Action::SendWatch {
                        to: peer.clone(),
                        joining,
                    });
                }
            }
            Input::HeartbeatFrom(from, now) => {
                self.advance(now);
                if let Some(d) = self.detectors.get_mut(&from) {
                    d.heartbeat(now);
                }
            }
            Input::WatchFrom { from, joining, at } => {
                self.advance(at);
                // From a member this node holds live, or from a joiner it may not know of
                // yet. Not from a downed or removed incarnation, nor from a stranger that
                // takes itself for a member (one removed long ago, whose tombstone is gone):
                // heartbeats would clear its flags and keep it from downing itself.
                let asks = match self.gossip.member(&from) {
                    Some(m) => m.status != MemberStatus::Down,
                    None => joining && !self.gossip.is_tombstoned(&from),
                };
                if asks && from != *self.self_node() {
                    // Renewed on every heartbeat tick of the watcher; kept for twice the
                    // pause its detector accepts, so a late renewal never starves it.
                    let keep = millis(self.config.phi.acceptable_heartbeat_pause).max(1);
                    let until = self.now.saturating_add(keep.saturating_mul(2));
                    self.watch_requests.insert(from, until);
                }
            }
            Input::Join(node, roles) => self.on_join(node, roles, &mut out),
            Input::JoinReminder(node, roles) => {
                if !self.replaces_a_live_one(&node) {
                    self.on_join(node, roles, &mut out);
                }
            }
            Input::JoinSeeds(seeds) => {
                // Only the first seed of the list may form a cluster, and only once no other
                // seed has answered within the seed-node timeout; every other node only joins.
                // So nodes sharing one seed list never form two clusters, and a restarted
                // first seed joins the running cluster through the other seeds.
                let me = self.config.self_node.address.clone();
                let first = seeds.first() == Some(&me);
                let others: Vec<String> = seeds.into_iter().filter(|s| s != &me).collect();
                self.form_at = first.then(|| {
                    if others.is_empty() {
                        self.now
                    } else {
                        self.now
                            .saturating_add(millis(self.config.seed_node_timeout))
                    }
                });
                self.seeds = others;
                self.next_join = self.now;
                self.try_join(&mut out);
            }
            Input::Leave => {
                let me = self.self_node().clone();
                if self.gossip.set_status(&me, MemberStatus::Leaving) == Ok(true) {
                    self.gossip.touch(&me);
                    self.gossip_to_all(&mut out);
                }
            }
            Input::Down(node) => {
                let me = self.self_node().clone();
                if self.gossip.set_status(&node, MemberStatus::Down) == Ok(true) {
                    self.gossip.touch(&me);
                    self.gossip_to_all(&mut out);
                }
            }
            Input::Tick(now) => self.on_tick(now, &mut out),
        }
        self.after(&before, &mut out);
        out
    }

    fn advance(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    fn is_member(&self) -> bool {
        self.gossip.member(self.self_node()).is_some()
    }

    fn ring_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.gossip
            .members()
            .filter(|m| m.status != MemberStatus::Down)
            .map(|m| m.node.clone())
            .collect()
    }

    fn on_join(&mut self, node: UniqueAddress, roles: BTreeSet<String>, out: &mut Vec<Action>) {
        let me = self.self_node().clone();
        if node == me && self.gossip.members().next().is_none() {
            // Form a new cluster.
            let _ = self.gossip.add_joining(node, roles);
            self.gossip.touch(&me);
            self.seeds.clear();
            self.form_at = None;
            return;
        }
        if !self.is_member() {
            return;
        }
        if self.gossip.add_joining(node.clone(), roles) == Ok(true) {
            self.gossip.touch(&me);
        }
        // Welcome (or remind a retrying joiner): it needs a gossip that contains it.
        if self.gossip.member(&node).is_some() {
            out.push(Action::SendGossip(node, Box::new(self.gossip.clone())));
        }
    }

    fn try_join(&mut self, out: &mut Vec<Action>) {
        if self.is_member() || self.was_member {
            return;
        }
        if self.form_at.is_some_and(|at| self.now >= at) {
            // The first seed, and no other seed answered: form a new cluster.
            let me = self.self_node().clone();
            let roles = self.config.roles.clone();
            self.on_join(me, roles, out);
            return;
        }
        if self.seeds.is_empty() || self.now < self.next_join {
            return;
        }
        self.next_join = self.now.saturating_add(millis(self.config.join_retry));
        for seed in &self.seeds {
            out.push(Action::SendJoin(seed.clone()));
        }
    }

    /// A joiner (`Joining` or `WeaklyUp` in its own view) sends a join reminder
    /// ([`Action::SendJoinReminder`]), every `join_retry` from two `join_retry` after its
    /// welcome on, to one member that has not seen its state (taking them in turn), if no
    /// member flags that one unreachable.
    ///
    /// A joiner is a member in its own view from the welcome on and sends no join requests
    /// any more; if the member that welcomed it crashed before telling the others, they take
    /// it in from its gossip only when its state holds no member they do not know (see
    /// [`MembershipNode::may_join_by_gossip`]). Two joiners welcomed together hold each other
    /// and would stay `Joining` for good. A member that already knows the joiner answers a
    /// reminder with its state, as a retried join. A reminder goes to the incarnation in the
    /// joiner's view only, and never takes the place of a live member with the joiner's
    /// address or node id (see [`Input::JoinReminder`]).
    ///
    /// Only for the first half of the tombstones' lifetime after the welcome (by this node's
    /// clock; the leader prunes by its own, so the two may differ by up to that half): a
    /// joiner that was downed and removed meanwhile (say while it was cut off) is refused by
    /// its tombstone, which lives that long at least; past it, it could come back as the
    /// incarnation that was removed.
    fn remind_members(&mut self, me: &UniqueAddress, out: &mut Vec<Action>) {
        let joining = self
            .gossip
            .member(me)
            .is_some_and(|m| matches!(m.status, MemberStatus::Joining | MemberStatus::WeaklyUp));
        let window = millis(self.config.prune_tombstones_after) / 2;
        let retry = millis(self.config.join_retry);
        let in_window = self.member_since.is_some_and(|since| {
            self.now >= since.saturating_add(retry.saturating_mul(2))
                && self.now < since.saturating_add(window)
        });
        if !joining || !in_window || self.now < self.next_join {
            return;
        }
        self.next_join = self.now.saturating_add(retry);
        let unaware: Vec<&UniqueAddress> = self
            .gossip
            .members()
            .filter(|m| {
                m.node != *me
                    && !matches!(m.status, MemberStatus::Down | MemberStatus::Exiting)
                    && !self.gossip.has_seen(&m.node)
                    && self.gossip.is_reachable(&m.node)
            })
            .map(|m| &m.node)
            .collect();
        if unaware.is_empty() {
            return;
        }
        let to = unaware[self.reminders % unaware.len()].clone();
        self.reminders = self.reminders.wrapping_add(1);
        out.push(Action::SendJoinReminder(to));
    }

    fn on_gossip(&mut self, from: UniqueAddress, remote: Gossip, out: &mut Vec<Action>) {
        if remote.check_received().is_err() {
            return; // see `Gossip::check_received`; the runtime logs it
        }
        let me = self.self_node().clone();
        if !self.is_member() {
            // Joining: only a gossip that contains this node is a welcome.
            if remote.member(&me).is_some() {
                self.gossip = remote;
                self.gossip.mark_seen(&me);
                self.seeds.clear();
                self.form_at = None;
            }
            return;
        }
        // A state that has this node down or removed is final, whoever sends it: even a
        // node this one holds down in turn (after crossed decisions each side of a split
        // may hold the other down, and this is how both learn it and stop, rather than both
        // going on).
        let downed_me = remote.is_tombstoned(&me)
            || remote
                .member(&me)
                .is_some_and(|m| m.status == MemberStatus::Down);
        if downed_me {
            self.gossip.receive(&remote, &me);
            return;
        }
        let sender_dead = self.gossip.is_tombstoned(&from)
            || self
                .gossip
                .member(&from)
                .is_some_and(|m| m.status == MemberStatus::Down);
        if sender_dead {
            // A removed or downed incarnation: tell it, never take its view.
            out.push(Action::SendGossip(from, Box::new(self.gossip.clone())));
            return;
        }
        if self.gossip.member(&from).is_none() {
            // A joiner that some member welcomed (its state holds this node, so it is of this
            // cluster) before this node heard of it. Its join counts here too: the member
            // that welcomed it may have crashed before telling anyone, and the joiner, a
            // member in its own view, sends no join requests (only reminders, to members
            // that have not seen its state, from a while after its welcome on).
            if let Some(m) = remote.member(&from) {
                if matches!(m.status, MemberStatus::Joining | MemberStatus::WeaklyUp)
                    && remote.member(&me).is_some()
                    && self.may_join_by_gossip(&from, &remote)
                {
                    self.on_join(from, m.roles.clone(), out);
                }
            }
            return; // otherwise a node we do not know (yet), or another cluster
        }
        if remote.member(&from).is_none() {
            return; // another cluster
        }
        if remote.member(&me).is_none() && !remote.is_tombstoned(&me) {
            return; // the sender does not know us yet; it will
        }
        if self.fence.active {
            self.fence.heard.insert(from.clone());
        }
        let sender_saw_us = remote.has_seen(&me);
        // Tombstones older than half their lifetime may be missing from a newer state: the
        // leader dropped them (the half is a margin for clocks that disagree).
        let keep_since = self
            .wall_now()
            .saturating_sub(millis(self.config.prune_tombstones_after) / 2);
        let outcome = self.gossip.receive_keeping(&remote, &me, keep_since);
        let reply = match outcome {
            Received::Older | Received::Merged => true,
            Received::Newer | Received::Same => !sender_saw_us,
        };
        if reply && self.is_member() {
            out.push(Action::SendGossip(from, Box::new(self.gossip.clone())));
        }
    }

    /// The reachability picture has kept changing for `stable_after` plus
    /// `down_all_when_unstable` since a member became unreachable: no decision this side takes
    /// could be trusted to match the other side's, so every member is downed, this node
    /// included (the other side's leader does the same on its own measure). Safety over
    /// availability, as Akka's `down-all-when-unstable`.
    fn down_all_when_unstable(&mut self, me: &UniqueAddress, out: &mut Vec<Action>) {
        let all: Vec<UniqueAddress> = self
            .gossip
            .members()
            .filter(|m| m.status != MemberStatus::Down)
            .map(|m| m.node.clone())
            .collect();
        tracing::warn!(
            node = %me.node_id,
            members = all.len(),
            unreachable = self.gossip.unreachable_members().len(),
            fenced = self.fence.active,
            "split brain resolver: the reachability picture kept changing for longer than \
             stable_after plus down_all_when_unstable; downing every member, this one included \
             (only this one if fenced)"
        );
        // A fenced node's view of who is on its side may be wrong (as for its resolver's own
        // decisions, see `on_tick`): it downs only itself, and its gossip tells nobody else
        // to stop.
        let all = if self.fence.active {
            vec![me.clone()]
        } else {
            all
        };
        let mut changed = false;
        for n in &all {
            changed |= self.gossip.set_status(n, MemberStatus::Down) == Ok(true);
        }
        if changed {
            self.gossip.touch(me);
            self.gossip_to_all(out);
        }
    }

    fn on_tick(&mut self, now: u64, out: &mut Vec<Action>) {
        self.advance(now);
        if !self.is_member() {
            self.try_join(out);
            return;
        }
        let me = self.self_node().clone();
        self.check_reachability(now);
        self.remind_members(&me, out);
        // Split brain resolver: only the leader of this side applies a decision.
        let stable_for = self.stability.observe(&self.gossip, now);
        let unstable = self
            .instability
            .observe(&self.gossip, now, &self.config.downing);
        let leading = self.gossip.leader(&me).as_ref() == Some(&me);
        if unstable && leading {
            self.down_all_when_unstable(&me, out);
        } else if leading {
            let decision = decide(&self.gossip, &me, stable_for, &self.config.downing);
            if let Some(d) = decision {
                // A fenced node cannot fully trust its view of the others. While the resolver
                // on its view downs it, it downs only itself (the rest of its side does the
                // same, each in turn as the leader of what is left, or is downed by the other
                // side): its idea of who is on its side may be wrong. Fenced because it lost
                // most of the peers it watches (a partial ring), it downs another member only
                // if some member that nobody flags flags it too: an isolated node that watches
                // few peers sees only its own flags, the leader of a majority sees its
                // side's. Fenced while its view converges, it decides as usual: downing a
                // crashed member is what lets its view converge.
                let (picture_loses, lost_most) = if self.fence.active {
                    self.losing_why()
                } else {
                    (false, false)
                };
                let mut changed = false;
                for n in &d.down {
                    if *n != me && (picture_loses || (lost_most && !self.corroborated(n))) {
                        continue;
                    }
                    // An end of a broken link that nobody flags (only its own flags make it
                    // one, as for a node that cannot hear some others) is not downed by
                    // others: its flags may be ones it has cleared since (the news still on
                    // its way), and it cannot know that it is the end to down, so it would go
                    // on, unaware, while this side takes over its work. If it cannot hear most
                    // of the cluster, its own resolver downs it. (A flagged end may be gone
                    // for good: it is downed like any unreachable member.)
                    if d.broken_links.contains(n) && *n != me && self.gossip.is_reachable(n) {
                        continue;
                    }
                    // A member others flag but whose heartbeats this node gets now is not
                    // downed as lost: those flags may be from a partition that has just
                    // healed (their observers clear them on their next heartbeat; the member
                    // may never have been cut off long enough to learn of them and fence
                    // itself), or it is a broken link, which its seen mark turns into one
                    // soon. Either way the picture changes.
                    if !d.broken_links.contains(n)
                        && *n != me
                        && !self.gossip.is_reachable(n)
                        && !self.gossip.reachability().is_unreachable_by(&me, n)
                        && self.detectors.get(n).is_some_and(|d| d.is_available(now))
                    {
                        continue;
                    }
                    changed |= self.gossip.set_status(n, MemberStatus::Down) == Ok(true);
                }
                if changed {
                    // A decision was taken: the instability measure starts over.
                    self.instability.reset();
                    self.gossip.touch(&me);
                    self.gossip_to_all(out);
                }
            }
        }
        // Leader actions.
        let converged = self.gossip.convergence(&me);
        if converged {
            self.not_converged_since = None;
        } else if self.not_converged_since.is_none() {
            self.not_converged_since = Some(now);
        }
        let weakly_up = match (self.config.weakly_up_after, self.not_converged_since) {
            (Some(after), Some(since)) => now.saturating_sub(since) >= millis(after),
            _ => false,
        };
        let removed_before: BTreeSet<_> = self.gossip.tombstones().keys().cloned().collect();
        let acted = !leader_actions(&mut self.gossip, &me, weakly_up).is_empty();
        self.settle_tombstones(&me, acted);
        if acted {
            // Removed members get one last gossip so they learn it.
            for t in self.gossip.tombstones().keys() {
                if !removed_before.contains(t) {
                    out.push(Action::SendGossip(t.clone(), Box::new(self.gossip.clone())));
                }
            }
            self.gossip_to_all(out);
        }
        // Gossip round.
        if now >= self.next_gossip {
            self.next_gossip = now.saturating_add(millis(self.config.gossip_interval));
            if let Some(to) = self.gossip_target() {
                out.push(Action::SendGossip(to, Box::new(self.gossip.clone())));
            }
            // Also one member flagged unreachable (and not down): a node that can still hear
            // (a one-way cut) learns that it was flagged, and is fenced long before it is
            // downed instead of learning it only from the decision.
            if let Some(to) = self.unreachable_target() {
                out.push(Action::SendGossip(to, Box::new(self.gossip.clone())));
            }
        }
    }

    /// Whether a joiner that this node only knows from its gossip may join through it. Less
    /// than a join request does: never in place of a live earlier incarnation of it (a
    /// join marks that one `Down`; a request comes from a process that starts, a gossip may
    /// come from an older process still running), and only with a state that holds no
    /// member this node knows nothing of (a joiner that slept past the removal of members
    /// and the pruning of their tombstones would bring them back).
    fn may_join_by_gossip(&self, joiner: &UniqueAddress, state: &Gossip) -> bool {
        let replaces_a_live_one = self.replaces_a_live_one(joiner);
        let strangers = state.members().any(|m| {
            m.node != *joiner
                && self.gossip.member(&m.node).is_none()
                && !self.gossip.is_tombstoned(&m.node)
        });
        !replaces_a_live_one && !strangers
    }

    /// Whether a member other than `joiner` with its address or node id is not `Down`: a
    /// join would mark it `Down`, which only a join request (from a process that starts)
    /// may do.
    fn replaces_a_live_one(&self, joiner: &UniqueAddress) -> bool {
        self.gossip.members().any(|m| {
            m.node != *joiner
                && (m.node.address == joiner.address || m.node.node_id == joiner.node_id)
                && m.status != MemberStatus::Down
        })
    }

    /// The wall-clock time now, in ms since the UNIX epoch.
    fn wall_now(&self) -> u64 {
        self.config.wall_clock_origin_ms.saturating_add(self.now)
    }

    /// The leader stamps new removals with the time and, at convergence (every member has
    /// seen every tombstone), drops those older than `prune_tombstones_after`. If the leader
    /// actions of this tick made a new version (`acted`), it is not sent yet, so the stamps
    /// go into it; otherwise a change makes a version of its own.
    fn settle_tombstones(&mut self, me: &UniqueAddress, acted: bool) {
        if self.gossip.tombstones().is_empty() || self.gossip.leader(me).as_ref() != Some(me) {
            return;
        }
        let now = self.wall_now();
        let drop_before = if self.gossip.convergence(me) {
            now.saturating_sub(millis(self.config.prune_tombstones_after))
        } else {
            0
        };
        if self.gossip.settle_tombstones(now, drop_before) && !acted {
            self.gossip.touch(me);
        }
    }

    fn check_reachability(&mut self, now: u64) {
        let me = self.self_node().clone();
        let mut changed = false;
        for (peer, d) in &self.detectors {
            let flagged = self.gossip.reachability().is_unreachable_by(&me, peer);
            let available = d.is_available(now);
            if available && flagged {
                changed |= self.gossip.reachability_mut().reachable(&me, peer);
            } else if !available && !flagged {
                changed |= self.gossip.reachability_mut().unreachable(&me, peer);
            }
        }
        if changed {
            self.gossip.touch(&me);
        }
    }

    fn gossip_target(&mut self) -> Option<UniqueAddress> {
        let me = self.self_node();
        let candidates: Vec<&UniqueAddress> = self
            .gossip
            .members()
            .filter(|m| &m.node != me && m.status != MemberStatus::Down)
            .filter(|m| self.gossip.is_reachable(&m.node))
            .map(|m| &m.node)
            .collect();
        let unseen: Vec<&UniqueAddress> = candidates
            .iter()
            .copied()
            .filter(|n| !self.gossip.has_seen(n))
            .collect();
        let pool = if unseen.is_empty() {
            candidates
        } else {
            unseen
        };
        if pool.is_empty() {
            return None;
        }
        self.gossip_round = self.gossip_round.wrapping_add(1);
        Some(pool[self.gossip_round % pool.len()].clone())
    }

    fn unreachable_target(&self) -> Option<UniqueAddress> {
        let me = self.self_node();
        let flagged: Vec<&UniqueAddress> = self
            .gossip
            .members()
            .filter(|m| &m.node != me && m.status != MemberStatus::Down)
            .filter(|m| !self.gossip.is_reachable(&m.node))
            .map(|m| &m.node)
            .collect();
        (!flagged.is_empty()).then(|| flagged[self.gossip_round % flagged.len()].clone())
    }

    fn gossip_to_all(&self, out: &mut Vec<Action>) {
        let me = self.self_node();
        for m in self.gossip.members() {
            if &m.node != me && self.gossip.is_reachable(&m.node) {
                out.push(Action::SendGossip(
                    m.node.clone(),
                    Box::new(self.gossip.clone()),
                ));
            }
        }
    }

    /// After every input: events, detectors for the new ring, and shutting down when this
    /// node is out.
    fn after(&mut self, before: &Gossip, out: &mut Vec<Action>) {
        let me = self.self_node().clone();
        if &self.gossip != before {
            for e in diff(before, &self.gossip, &me) {
                out.push(Action::Event(e));
            }
            self.update_detectors();
        }
        self.update_fence(out);
        let status = self.status();
        if status.is_some() {
            self.was_member = true;
            self.member_since.get_or_insert(self.now);
        }
        let out_of_cluster = matches!(status, Some(MemberStatus::Down | MemberStatus::Exiting))
            || (self.was_member && status.is_none());
        if out_of_cluster {
            self.shut_down = true;
            out.push(Action::ShutdownSelf);
        }
    }

    /// Whether the current view is one on which this node would be downed (see
    /// [`is_fenced`](Self::is_fenced)).
    fn losing(&self) -> bool {
        let (resolver, most_watched) = self.losing_why();
        resolver || most_watched
    }

    /// Why this node would be downed: the resolver's decision on its view (with silent
    /// watched peers counted as flagged), and, with a partial ring, having lost more than half
    /// of the peers it watches.
    fn losing_why(&self) -> (bool, bool) {
        let me = self.self_node();
        if !self.is_member() {
            return (false, false);
        }
        // Watched peers this node lost: flagged by its detector, or silent for `fence_after`
        // (a hard bound that does not grow with the detector's variance on a busy machine).
        let fence_after = millis(self.config.fence_after);
        let lost: Vec<&UniqueAddress> = self
            .detectors
            .iter()
            .filter(|(p, d)| {
                self.gossip.reachability().is_unreachable_by(me, p)
                    || d.last_heartbeat()
                        .is_some_and(|t| self.now.saturating_sub(t) >= fence_after)
            })
            .map(|(p, _)| p)
            .collect();
        let silent: Vec<&UniqueAddress> = lost
            .iter()
            .copied()
            .filter(|p| !self.gossip.reachability().is_unreachable_by(me, p))
            .collect();
        if self.gossip.reachability().records().next().is_none() && lost.is_empty() {
            return (false, false);
        }
        // The resolver's decision on this view, taken now rather than after `stable_after`.
        let down_me = |g: &Gossip| would_down(g, me, &self.config.downing);
        let resolver = if silent.is_empty() {
            down_me(&self.gossip)
        } else {
            let mut g = self.gossip.clone();
            for p in silent {
                g.reachability_mut().unreachable(me, p);
            }
            // As if the detector had flagged them: a new version only this node has seen.
            g.touch(me);
            down_me(&g)
        };
        if resolver {
            return (true, false);
        }
        // With a partial ring the own flags do not show a cut-off from most members: count
        // the watched peers lost instead (strategies where only a majority goes on).
        let partial = self.ring_nodes().len().saturating_sub(1) > self.config.monitored_by;
        let majority_rule = matches!(
            self.config.downing.strategy,
            Strategy::KeepMajority | Strategy::StaticQuorum { .. }
        );
        (
            false,
            partial && majority_rule && lost.len() * 2 > self.detectors.len(),
        )
    }

    /// Whether a live member other than this node, which nobody flags, flags `n`.
    fn corroborated(&self, n: &UniqueAddress) -> bool {
        let me = self.self_node();
        self.gossip.reachability().observers_of(n).iter().any(|o| {
            o != me
                && self.gossip.is_reachable(o)
                && self
                    .gossip
                    .member(o)
                    .is_some_and(|m| m.status != MemberStatus::Down)
        })
    }

    fn update_fence(&mut self, out: &mut Vec<Action>) {
        if self.removed() {
            // Out of the cluster: nothing is lifted on the way out (its own view no longer
            // holds it, so `losing` says nothing).
            return;
        }
        let was = self.fence.active;
        if self.losing() {
            self.fence.active = true;
            self.fence.heard.clear();
        } else if self.fence.active {
            let me = self.self_node();
            let live: BTreeSet<&UniqueAddress> = self
                .gossip
                .members()
                .filter(|m| m.status != MemberStatus::Down)
                .map(|m| &m.node)
                .collect();
            let heard = live
                .iter()
                .filter(|n| **n == me || self.fence.heard.contains(**n))
                .count();
            // Every member that could have decided to down this node (any `Up` or `Leaving`
            // member leads its own side in a partition) has seen this node's current view:
            // such a member takes a state as its own only if it holds all its own earlier
            // changes, so a decision it made before would be in this view. Gossip from a
            // majority alone (which counts this side) may all predate the other side's
            // decision.
            if heard * 2 > live.len() && self.gossip.convergence(me) {
                self.fence.active = false;
                self.fence.heard.clear();
            }
        }
        if self.fence.active != was {
            out.push(Action::Event(if self.fence.active {
                ClusterEvent::Fenced
            } else {
                ClusterEvent::Unfenced
            }));
        }
    }

    fn update_detectors(&mut self) {
        let me = self.self_node().clone();
        let nodes = self.ring_nodes();
        let mut wanted = ring::monitored(&me, &nodes, self.config.monitored_by);
        // Keep watching what we flagged: only we can clear our own flag.
        if let Some(rows) = self.gossip.reachability().rows(&me) {
            wanted.extend(
                rows.unreachable
                    .iter()
                    .filter(|n| nodes.contains(*n))
                    .cloned(),
            );
        }
        self.detectors.retain(|n, _| wanted.contains(n));
        for n in wanted {
            let now = self.now;
            let phi = self.config.phi.clone();
            self.detectors.entry(n).or_insert_with(|| {
                // Start as if a heartbeat had just arrived, so a peer that never sends one is
                // still detected.
                let mut d = PhiAccrualDetector::new(phi);
                d.heartbeat(now);
                d
            });
        }
    }
}
