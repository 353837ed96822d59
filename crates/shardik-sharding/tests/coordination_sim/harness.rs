//! A deterministic in-memory cluster for the sans-IO coordination core: one coordinator, several
//! regions, a network with FIFO per pair and random interleaving across pairs, a replicated store,
//! entity hosting (each shard's entities with a mailbox of delivered, not yet handled
//! messages, which a stop handles and a forced stop hands back), and the invariants checked
//! after every step.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use shardik_sharding::coordination::*;
use shardik_sharding::ShardId;

/// Sender id, per-(sender, entity) sequence number, global message id.
pub type Payload = (u32, u64, u64);

/// Tiny deterministic RNG.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// The coordinator of a given epoch (its outgoing messages form their own pairs).
    Coord(u64),
    /// The coordinator's address (what regions send to).
    CoordAddr,
    Region(usize),
}

#[derive(Clone, Debug)]
pub enum Packet {
    ToCoord(ToCoordinator),
    ToRegion(ToRegion),
    Peer(PeerMsg<Payload>),
}

pub struct SimRegion {
    pub state: RegionState<Payload>,
    pub senders: Vec<u32>,
    pub leaving: bool,
}

pub struct Sim {
    pub rng: XorShift,
    pub now: u64,
    pub shard_count: u32,
    pub coord_cfg: CoordinatorConfig,
    pub region_cfg: RegionConfig,
    pub coord: Option<Coordinator>,
    pub max_epoch: u64,
    pub store: CoordinatorState,
    pub persist_queue: VecDeque<StateUpdate>,
    pub regions: BTreeMap<usize, SimRegion>,
    pub next_region: usize,
    pub next_sender: u32,
    pub net: BTreeMap<(Node, Node), VecDeque<Packet>>,
    pub hosting: BTreeMap<usize, BTreeSet<ShardId>>,
    /// Per shard: the region that hosted it last and the fencing token it was started with.
    pub last_hosted: BTreeMap<ShardId, (usize, u64)>,
    /// The current coordinator's wall clock: the simulated time in microseconds plus this
    /// skew (a coordinator on another node, its clock up to 10 s ahead or behind).
    pub clock_skew_us: u64,
    pub stopping: BTreeMap<usize, BTreeSet<ShardId>>,
    /// Messages delivered to a shard's entities and not handled yet, per (region, shard): an
    /// entity's mailbox. A stop hands them first (`complete_stop`); a forced stop gives them
    /// back to the region as `RegionInput::Unhandled`.
    pub mailboxes: BTreeMap<(usize, ShardId), VecDeque<Envelope<Payload>>>,
    /// Entities too slow to stop: no stop completes by itself (`complete_stop` does nothing),
    /// so every stop is forced once the region's `stop_timeout_ms` has passed.
    pub slow_stops: bool,
    /// Messages forced stops handed back to their region unhandled, by message id: the
    /// region that handed it back.
    pub handed_back: BTreeMap<u64, usize>,
    /// Handed-back messages of a sender on another node than the region that handed them
    /// back, handled after a later message of that sender: the documented limit of a forced
    /// stop (that sender, fenced, sent its later messages to the next home itself).
    pub overtaken_across_nodes: usize,
    /// The region each sender sends from.
    pub sender_region: HashMap<u32, usize>,
    pub pending_downs: VecDeque<usize>,
    pub gone: BTreeSet<usize>,
    pub stable: bool,
    // accounting
    pub next_msg: u64,
    pub seqs: HashMap<(u32, String), u64>,
    pub sent: BTreeMap<u64, (u32, String)>,
    pub delivered: BTreeMap<u64, usize>,
    pub last_seq: HashMap<(u32, String), u64>,
    pub lost_to_crash: BTreeSet<u64>,
    pub lost_on_exit: BTreeSet<u64>,
    pub rejected: BTreeSet<u64>,
    pub steps: u64,
    pub entities: usize,
    /// Check the invariants after every step (off only to keep big balance runs fast; they are
    /// then checked once per quiesced round).
    pub check_each_step: bool,
}

pub fn rid(i: usize) -> RegionId {
    RegionId::new(format!("r{i:03}"))
}

fn ridx(r: &RegionId) -> usize {
    r.0[1..].parse().expect("sim region id")
}

impl Sim {
    pub fn new(seed: u64, shard_count: u32, regions: usize) -> Self {
        Self::with_strategy(seed, shard_count, regions, std::sync::Arc::new(LeastShards))
    }

    /// [`Sim::new`] with the coordinator allocating by `strategy`.
    pub fn with_strategy(
        seed: u64,
        shard_count: u32,
        regions: usize,
        strategy: std::sync::Arc<dyn AllocationStrategy>,
    ) -> Self {
        let mut coord_cfg = CoordinatorConfig::new(shard_count);
        coord_cfg.allocation_strategy = strategy;
        coord_cfg.rebalance_interval_ms = 5_000;
        coord_cfg.handoff_ack_timeout_ms = 8_000;
        coord_cfg.handoff_stop_retry_ms = 8_000;
        let mut region_cfg = RegionConfig::new(shard_count);
        region_cfg.retry_interval_ms = 1_000;
        region_cfg.stop_timeout_ms = 5_000;
        let mut sim = Sim {
            rng: XorShift::new(seed),
            now: 0,
            shard_count,
            coord_cfg,
            region_cfg,
            coord: None,
            max_epoch: 0,
            store: CoordinatorState::new(shard_count),
            persist_queue: VecDeque::new(),
            regions: BTreeMap::new(),
            next_region: 0,
            next_sender: 0,
            net: BTreeMap::new(),
            hosting: BTreeMap::new(),
            last_hosted: BTreeMap::new(),
            clock_skew_us: 10_000_000,
            stopping: BTreeMap::new(),
            mailboxes: BTreeMap::new(),
            slow_stops: false,
            handed_back: BTreeMap::new(),
            overtaken_across_nodes: 0,
            sender_region: HashMap::new(),
            pending_downs: VecDeque::new(),
            gone: BTreeSet::new(),
            stable: true,
            next_msg: 0,
            seqs: HashMap::new(),
            sent: BTreeMap::new(),
            delivered: BTreeMap::new(),
            last_seq: HashMap::new(),
            lost_to_crash: BTreeSet::new(),
            lost_on_exit: BTreeSet::new(),
            rejected: BTreeSet::new(),
            steps: 0,
            entities: 24,
            check_each_step: true,
        };
        sim.start_coordinator();
        for _ in 0..regions {
            sim.join();
        }
        sim
    }

    // ---- coordinator ---------------------------------------------------------------------------

    pub fn start_coordinator(&mut self) {
        assert!(self.coord.is_none());
        let epoch = self.max_epoch.max(self.store.epoch) + 1;
        self.max_epoch = epoch;
        let (c, actions) = Coordinator::recover(self.coord_cfg.clone(), self.store.clone(), epoch)
            .expect("recover");
        self.coord = Some(c);
        // From the epoch, not the rng: the histories the tests replay stay the same.
        self.clock_skew_us = epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 20_000_001;
        self.coord_actions(actions);
        let stable = self.stable;
        self.coord_input(Input::MembershipStable(stable));
        let gone: Vec<usize> = self.gone.iter().copied().collect();
        for g in gone {
            self.coord_input(Input::RegionDown(rid(g)));
        }
        let leaving: Vec<usize> = self
            .regions
            .iter()
            .filter(|(_, r)| r.leaving)
            .map(|(i, _)| *i)
            .collect();
        for l in leaving {
            self.coord_input(Input::RegionLeaving(rid(l)));
        }
        let ids: Vec<usize> = self.regions.keys().copied().collect();
        for i in ids {
            self.region_input(i, RegionInput::CoordinatorChanged);
        }
    }

    /// Crash the coordinator: pending updates reach the store or not (at random, in order);
    /// its in-flight messages stay in the network (stale epoch), messages to it wait for the next.
    pub fn crash_coordinator(&mut self) {
        if self.coord.take().is_none() {
            return;
        }
        let keep = self.rng.below(self.persist_queue.len() + 1);
        for u in self.persist_queue.drain(..).take(keep) {
            self.store.apply(&u).expect("store applies in order");
        }
        self.persist_queue.clear();
    }

    fn coord_input(&mut self, input: Input) {
        let now = self.now;
        let Some(c) = self.coord.as_mut() else { return };
        let mut out = Vec::new();
        // Fencing tokens come from this clock (microseconds); a coordinator that recovers
        // state written later than its clock says must still hand out higher tokens.
        c.set_wall_clock((now * 1_000 + self.clock_skew_us).saturating_sub(10_000_000));
        c.handle(now, input, &mut out);
        self.coord_actions(out);
    }

    fn coord_actions(&mut self, actions: Vec<Action>) {
        let epoch = self.coord.as_ref().map(|c| c.epoch()).unwrap_or(0);
        for a in actions {
            if std::env::var("SIM_TRACE").is_ok() {
                eprintln!("  C does {a:?}");
            }
            match a {
                Action::Persist(u) => self.persist_queue.push_back(u),
                Action::Send { to, msg } => {
                    let i = ridx(&to);
                    if self.regions.contains_key(&i) {
                        self.net
                            .entry((Node::Coord(epoch), Node::Region(i)))
                            .or_default()
                            .push_back(Packet::ToRegion(msg));
                    }
                }
            }
        }
    }

    // ---- regions -------------------------------------------------------------------------------

    pub fn join(&mut self) -> usize {
        let i = self.next_region;
        self.next_region += 1;
        let senders = vec![self.next_sender, self.next_sender + 1];
        for s in &senders {
            self.sender_region.insert(*s, i);
        }
        self.next_sender += 2;
        self.regions.insert(
            i,
            SimRegion {
                state: RegionState::new(rid(i), self.region_cfg.clone()),
                senders,
                leaving: false,
            },
        );
        self.hosting.insert(i, BTreeSet::new());
        self.stopping.insert(i, BTreeSet::new());
        self.region_input(i, RegionInput::CoordinatorChanged);
        i
    }

    pub fn live_regions(&self) -> Vec<usize> {
        self.regions.keys().copied().collect()
    }

    pub fn hosting_regions(&self) -> Vec<usize> {
        self.regions
            .iter()
            .filter(|(_, r)| !r.leaving)
            .map(|(i, _)| *i)
            .collect()
    }

    pub fn leave(&mut self, i: usize) {
        if let Some(r) = self.regions.get_mut(&i) {
            if !r.leaving {
                r.leaving = true;
                self.coord_input(Input::RegionLeaving(rid(i)));
            }
        }
    }

    fn remove_region(&mut self, i: usize, exit: bool) {
        let Some(r) = self.regions.remove(&i) else {
            return;
        };
        let mut lost: Vec<u64> = r.state.buffered_envelopes().map(|e| e.payload.2).collect();
        let mailboxes: Vec<(usize, ShardId)> = self
            .mailboxes
            .keys()
            .filter(|(j, _)| *j == i)
            .copied()
            .collect();
        for k in mailboxes {
            let mailbox = self.mailboxes.remove(&k).unwrap_or_default();
            lost.extend(mailbox.into_iter().map(|e| e.payload.2));
        }
        let keys: Vec<(Node, Node)> = self
            .net
            .keys()
            .filter(|(a, b)| (!exit && *a == Node::Region(i)) || *b == Node::Region(i))
            .copied()
            .collect();
        for k in keys {
            for p in self.net.remove(&k).unwrap_or_default() {
                if let Packet::Peer(PeerMsg::Deliver(e)) = p {
                    lost.push(e.payload.2);
                }
            }
        }
        for m in lost {
            if self.delivered.contains_key(&m) {
                continue;
            }
            if exit {
                self.lost_on_exit.insert(m);
            } else {
                self.lost_to_crash.insert(m);
            }
        }
        self.hosting.remove(&i);
        self.stopping.remove(&i);
        self.gone.insert(i);
        self.pending_downs.push_back(i);
    }

    /// Crash a region: its entities die with it; RegionDown is reported later.
    pub fn crash(&mut self, i: usize) {
        self.remove_region(i, false);
    }

    fn region_input(&mut self, i: usize, input: RegionInput<Payload>) {
        let now = self.now;
        let Some(r) = self.regions.get_mut(&i) else {
            return;
        };
        let mut out = Vec::new();
        r.state.handle(now, input, &mut out);
        self.region_actions(i, out);
    }

    fn region_actions(&mut self, i: usize, actions: Vec<RegionAction<Payload>>) {
        for a in actions {
            if std::env::var("SIM_TRACE").is_ok() {
                eprintln!("  r{i} does {a:?}");
            }
            match a {
                RegionAction::DeliverLocal(env) | RegionAction::DeliverAccepted(env) => {
                    self.accept_delivery(i, env)
                }
                RegionAction::ToPeer { to, msg } => {
                    let j = ridx(&to);
                    if self.regions.contains_key(&j) {
                        self.net
                            .entry((Node::Region(i), Node::Region(j)))
                            .or_default()
                            .push_back(Packet::Peer(msg));
                    } else if let PeerMsg::Deliver(e) = msg {
                        self.lost_to_crash.insert(e.payload.2);
                    }
                }
                RegionAction::ToCoordinator(m) => {
                    self.net
                        .entry((Node::Region(i), Node::CoordAddr))
                        .or_default()
                        .push_back(Packet::ToCoord(m));
                }
                RegionAction::StartShard(s) => {
                    for (j, h) in &self.hosting {
                        assert!(
                            *j == i || !h.contains(&s),
                            "single writer: region {i} starts shard {s} hosted by {j}"
                        );
                    }
                    assert!(self.hosting.get_mut(&i).unwrap().insert(s));
                    // Fencing: a shard hosted anew elsewhere gets a higher token than its
                    // previous home had, so a store refuses the previous home's writes.
                    let token = self.regions[&i]
                        .state
                        .fencing_token(s)
                        .unwrap_or_else(|| panic!("region {i} hosts shard {s} without a token"));
                    if let Some((j, last)) = self.last_hosted.insert(s, (i, token)) {
                        assert!(
                            token > last || (j == i && token == last),
                            "shard {s}: region {i} hosts with token {token} after region {j} \
                             with {last}"
                        );
                    }
                }
                RegionAction::StopShard(s) => {
                    assert!(self.hosting[&i].contains(&s), "stop of a shard not hosted");
                    self.stopping.get_mut(&i).unwrap().insert(s);
                }
                RegionAction::ForceStopShard(s) => {
                    if self.stopping.get_mut(&i).unwrap().remove(&s) {
                        self.hosting.get_mut(&i).unwrap().remove(&s);
                        // What the entities had not handled comes back, before the stop.
                        let envelopes: Vec<_> =
                            self.mailboxes.remove(&(i, s)).unwrap_or_default().into();
                        if !envelopes.is_empty() {
                            for e in &envelopes {
                                self.handed_back.insert(e.payload.2, i);
                            }
                            self.region_input(
                                i,
                                RegionInput::Unhandled {
                                    shard: s,
                                    envelopes,
                                },
                            );
                        }
                        self.region_input(i, RegionInput::ShardStopped(s));
                    }
                }
                RegionAction::Rejected(r) => {
                    self.rejected.insert(r.envelope.payload.2);
                }
                RegionAction::Refused(e) => panic!("region {i} refused: {e}"),
                RegionAction::LeaveComplete => {}
            }
        }
    }

    /// Region `i` delivers `env` to its entity: into the entity's mailbox.
    fn accept_delivery(&mut self, i: usize, env: Envelope<Payload>) {
        let s = env.shard;
        assert!(
            self.hosting[&i].contains(&s) && !self.stopping[&i].contains(&s),
            "region {i} delivers to shard {s} it does not host (or is stopping)"
        );
        let id = env.payload.2;
        assert!(
            !self.delivered.contains_key(&id) && !self.in_mailbox(id),
            "message {id} delivered twice"
        );
        self.mailboxes.entry((i, s)).or_default().push_back(env);
    }

    /// Whether message `id` waits in some entity's mailbox.
    fn in_mailbox(&self, id: u64) -> bool {
        self.mailboxes
            .values()
            .any(|q| q.iter().any(|e| e.payload.2 == id))
    }

    /// An entity handles `env`: exactly once, in order per sender.
    fn handle(&mut self, env: Envelope<Payload>) {
        let (sender, seq, id) = env.payload;
        let n = self.delivered.entry(id).or_insert(0);
        *n += 1;
        assert_eq!(*n, 1, "message {id} delivered twice");
        let key = (sender, env.entity_id.clone());
        let last = self.last_seq.entry(key).or_insert(0);
        if seq < *last
            && self
                .handed_back
                .get(&id)
                .is_some_and(|from| self.sender_region.get(&sender) != Some(from))
        {
            self.overtaken_across_nodes += 1;
            return;
        }
        assert!(
            seq > *last,
            "order: sender {sender} entity {} got seq {seq} after {last}",
            env.entity_id
        );
        *last = seq;
    }

    /// A local sender of region `i` sends to `entity` (shard = entity % shard_count).
    pub fn send(&mut self, i: usize, sender_slot: usize, entity: usize) {
        let Some(r) = self.regions.get(&i) else {
            return;
        };
        let sender = r.senders[sender_slot % r.senders.len()];
        let name = format!("e{entity}");
        let shard = (entity as u32) % self.shard_count;
        let seq = self.seqs.entry((sender, name.clone())).or_insert(0);
        *seq += 1;
        let id = self.next_msg;
        self.next_msg += 1;
        self.sent.insert(id, (sender, name.clone()));
        let env = Envelope::new(name, shard, (sender, *seq, id));
        let now = self.now;
        let mut out = Vec::new();
        let r = self.regions.get_mut(&i).unwrap();
        if let Err(rej) = r.state.send(now, env, &mut out) {
            self.rejected.insert(rej.envelope.payload.2);
        }
        self.region_actions(i, out);
    }

    pub fn send_random(&mut self) {
        let live: Vec<usize> = self
            .regions
            .iter()
            .filter(|(_, r)| !r.state.is_leave_complete())
            .map(|(i, _)| *i)
            .collect();
        if live.is_empty() {
            return;
        }
        let i = live[self.rng.below(live.len())];
        let s = self.rng.below(2);
        let e = self.rng.below(self.entities);
        self.send(i, s, e);
    }

    // ---- steps ---------------------------------------------------------------------------------

    /// Deliver one packet from a random non-empty pair.
    pub fn deliver_one(&mut self) -> bool {
        let keys: Vec<(Node, Node)> = self
            .net
            .iter()
            .filter(|(k, q)| !q.is_empty() && (k.1 != Node::CoordAddr || self.coord.is_some()))
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return false;
        }
        let k = keys[self.rng.below(keys.len())];
        let p = self.net.get_mut(&k).unwrap().pop_front().unwrap();
        if std::env::var("SIM_TRACE").is_ok() {
            eprintln!("t={} {:?} -> {:?}: {:?}", self.now, k.0, k.1, p);
        }
        match (k, p) {
            ((Node::Region(i), Node::CoordAddr), Packet::ToCoord(msg)) => {
                self.coord_input(Input::Message { from: rid(i), msg })
            }
            ((_, Node::Region(j)), Packet::ToRegion(msg)) => {
                self.region_input(j, RegionInput::FromCoordinator(msg))
            }
            ((Node::Region(i), Node::Region(j)), Packet::Peer(msg)) => {
                self.region_input(j, RegionInput::FromPeer { from: rid(i), msg })
            }
            other => panic!("misrouted {other:?}"),
        }
        true
    }

    pub fn persist_one(&mut self) -> bool {
        let Some(u) = self.persist_queue.pop_front() else {
            return false;
        };
        self.store.apply(&u).expect("store applies in order");
        self.coord_input(Input::Persisted(u.version));
        true
    }

    /// An entity of a random shard with messages waiting handles the next one.
    pub fn handle_one(&mut self) -> bool {
        let busy: Vec<(usize, ShardId)> = self
            .mailboxes
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if busy.is_empty() {
            return false;
        }
        let k = busy[self.rng.below(busy.len())];
        let env = self.mailboxes.get_mut(&k).unwrap().pop_front().unwrap();
        self.handle(env);
        true
    }

    pub fn complete_stop(&mut self) -> bool {
        if self.slow_stops {
            return false;
        }
        let all: Vec<(usize, ShardId)> = self
            .stopping
            .iter()
            .flat_map(|(i, s)| s.iter().map(move |s| (*i, *s)))
            .collect();
        if all.is_empty() {
            return false;
        }
        let (i, s) = all[self.rng.below(all.len())];
        // The entities handle what they had queued before they stop.
        for env in self.mailboxes.remove(&(i, s)).unwrap_or_default() {
            self.handle(env);
        }
        self.stopping.get_mut(&i).unwrap().remove(&s);
        self.hosting.get_mut(&i).unwrap().remove(&s);
        self.region_input(i, RegionInput::ShardStopped(s));
        true
    }

    pub fn report_down(&mut self) -> bool {
        let Some(g) = self.pending_downs.pop_front() else {
            return false;
        };
        self.coord_input(Input::RegionDown(rid(g)));
        let ids: Vec<usize> = self.regions.keys().copied().collect();
        for i in ids {
            self.region_input(i, RegionInput::RegionDown(rid(g)));
        }
        true
    }

    pub fn tick(&mut self, advance: u64) {
        self.now += advance;
        self.coord_input(Input::Tick);
        let ids: Vec<usize> = self.regions.keys().copied().collect();
        for i in ids {
            self.region_input(i, RegionInput::Tick);
        }
        self.exit_drained();
    }

    /// Leaving regions exit once told all shards are handed off and drained.
    fn exit_drained(&mut self) {
        let done: Vec<usize> = self
            .regions
            .iter()
            .filter(|(i, r)| {
                r.state.is_leave_complete()
                    && r.state.buffered() == 0
                    && self.hosting[*i].is_empty()
                    && !self
                        .net
                        .iter()
                        .any(|(k, q)| k.1 == Node::Region(**i) && !q.is_empty())
            })
            .map(|(i, _)| *i)
            .collect();
        for i in done {
            self.remove_region(i, true);
        }
    }

    /// One random step.
    pub fn step(&mut self) {
        self.steps += 1;
        match self.rng.below(100) {
            0..=41 => {
                self.deliver_one();
            }
            42..=49 => {
                self.handle_one();
            }
            50..=64 => {
                self.persist_one();
            }
            65..=72 => {
                self.complete_stop();
            }
            73..=74 => {
                self.report_down();
            }
            75..=89 => self.send_random(),
            _ => {
                let adv = self.rng.below(1500) as u64;
                self.tick(adv);
            }
        }
        self.check();
    }

    // ---- invariants ----------------------------------------------------------------------------

    /// Checked after every step.
    pub fn check(&self) {
        if self.check_each_step {
            self.check_now();
        }
    }

    /// Check the invariants now.
    pub fn check_now(&self) {
        let mut owner: BTreeMap<ShardId, usize> = BTreeMap::new();
        for (i, r) in &self.regions {
            let hosted = r.state.hosted_shards();
            assert_eq!(
                hosted, self.hosting[i],
                "region {i}: state's hosted shards differ from live entities"
            );
            for s in hosted {
                if let Some(j) = owner.insert(s, *i) {
                    panic!("single writer violated: shard {s} on regions {j} and {i}");
                }
            }
        }
    }

    /// Run until nothing moves: coordinator up, all messages delivered, all buffers flushed.
    pub fn quiesce(&mut self) {
        if self.coord.is_none() {
            self.start_coordinator();
        }
        self.stable = true;
        self.coord_input(Input::MembershipStable(true));
        for round in 0..2_000 {
            loop {
                let mut moved = false;
                while self.deliver_one() {
                    moved = true;
                    self.check();
                }
                while self.persist_one() {
                    moved = true;
                    self.check();
                }
                while self.handle_one() {
                    moved = true;
                    self.check();
                }
                while self.complete_stop() {
                    moved = true;
                    self.check();
                }
                while self.report_down() {
                    moved = true;
                    self.check();
                }
                if !moved {
                    break;
                }
            }
            let buffered: usize = self.regions.values().map(|r| r.state.buffered()).sum();
            let coord = self.coord.as_ref().unwrap();
            let settled = buffered == 0
                && coord.handoffs().next().is_none()
                && coord.pending_updates() == 0
                && self.regions.values().all(|r| r.state.is_registered());
            if settled && round > 0 {
                self.check_now();
                return;
            }
            self.tick(1_000);
            self.check();
        }
        let c = self.coord.as_ref().unwrap();
        let handoffs: Vec<_> = c.handoffs().collect();
        let views: Vec<_> = self
            .regions
            .iter()
            .map(|(i, r)| {
                let v: Vec<_> = (0..self.shard_count)
                    .map(|s| format!("{s}:{:?}", r.state.shard_view(s)))
                    .collect();
                (i, r.state.buffered(), r.state.is_registered(), v)
            })
            .collect();
        panic!(
            "simulation did not quiesce: handoffs {handoffs:?}, pending {}, regions {views:?}",
            c.pending_updates()
        );
    }

    /// Every message sent was delivered exactly once, or lost with a crashed node, or rejected.
    pub fn check_accounting(&self) {
        assert!(
            self.lost_on_exit.is_empty(),
            "lost on graceful exit: {:?}",
            self.lost_on_exit
        );
        for id in self.sent.keys() {
            let d = self.delivered.get(id).copied().unwrap_or(0);
            let lost = self.lost_to_crash.contains(id) as usize;
            let rej = self.rejected.contains(id) as usize;
            assert_eq!(
                d + lost + rej,
                1,
                "message {id}: delivered {d}, lost {lost}, rejected {rej}"
            );
        }
    }

    pub fn counts(&self) -> BTreeMap<RegionId, usize> {
        let c = self.coord.as_ref().unwrap();
        let mut m: BTreeMap<RegionId, usize> = c
            .live_regions()
            .filter(|r| self.regions.get(&ridx(r)).is_some_and(|x| !x.leaving))
            .map(|r| (r.clone(), 0))
            .collect();
        for r in c.state().shards.values() {
            *m.entry(r.clone()).or_default() += 1;
        }
        m
    }

    pub fn spread(&self) -> usize {
        let c = self.counts();
        c.values().max().unwrap_or(&0) - c.values().min().unwrap_or(&0)
    }
}
