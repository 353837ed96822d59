//! A deterministic in-memory network for `MembershipNode`s: a fake clock, message delivery
//! one step after sending, directed link cuts and seeded random loss.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use shardik_cluster::events::ClusterEvent;
use shardik_cluster::gossip::Gossip;
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::node::{MembershipNode, NodeConfig};
use shardik_cluster::protocol::{Action, Input};

/// Milliseconds per simulation step (also the network latency).
pub const STEP: u64 = 50;
/// Heartbeat interval.
pub const HEARTBEAT: u64 = 500;

#[derive(Clone, Debug)]
pub enum Msg {
    Gossip(Box<Gossip>),
    Heartbeat,
    Watch(bool),
    Join(BTreeSet<String>),
    /// A join reminder, for the recipient's incarnation only.
    JoinReminder(BTreeSet<String>, u64),
}

pub struct SimNode {
    pub node: MembershipNode,
    pub alive: bool,
    pub events: Vec<(u64, ClusterEvent)>,
    pub shutdown_at: Option<u64>,
}

pub struct Sim {
    pub now: u64,
    pub nodes: BTreeMap<String, SimNode>,
    in_flight: Vec<(UniqueAddress, String, Msg)>,
    cuts: BTreeSet<(String, String)>,
    /// Drop heartbeats only (user traffic starving them), per direction.
    hb_cuts: BTreeSet<(String, String)>,
    /// Drop gossip only (heartbeats get through), per direction.
    gossip_cuts: BTreeSet<(String, String)>,
    loss_percent: u64,
    rng: u64,
    /// Every gossip delivered, for replaying stale ones.
    pub delivered_gossip: Vec<(UniqueAddress, String, Gossip)>,
}

pub fn addr(i: usize) -> String {
    format!("10.0.0.{i}:7000")
}

pub fn uid(i: usize, incarnation: u64) -> UniqueAddress {
    UniqueAddress::new(addr(i), format!("n{i}"), incarnation)
}

impl Sim {
    pub fn new() -> Self {
        Self {
            now: 0,
            nodes: BTreeMap::new(),
            in_flight: Vec::new(),
            cuts: BTreeSet::new(),
            hb_cuts: BTreeSet::new(),
            gossip_cuts: BTreeSet::new(),
            loss_percent: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
            delivered_gossip: Vec::new(),
        }
    }

    pub fn config(node: UniqueAddress) -> NodeConfig {
        NodeConfig::new(node)
    }

    /// Starts node `i` (incarnation `inc`) and makes it join through node 0 (or form the
    /// cluster if it is node 0's first incarnation).
    pub fn start(&mut self, i: usize, inc: u64) {
        self.start_with(Self::config(uid(i, inc)));
    }

    pub fn start_with(&mut self, config: NodeConfig) {
        let me = config.self_node.clone();
        let roles = config.roles.clone();
        let a = me.address.clone();
        self.nodes.insert(
            a.clone(),
            SimNode {
                node: MembershipNode::new(config),
                alive: true,
                events: Vec::new(),
                shutdown_at: None,
            },
        );
        self.input(&a, Input::Tick(self.now));
        if a == addr(0) && me.incarnation == 1 {
            self.input(&a, Input::Join(me, roles));
        } else {
            // Seeds: the first three addresses (a restarted seed joins through the others).
            self.input(&a, Input::JoinSeeds((0..3).map(addr).collect()));
        }
    }

    /// Starts node `i` (incarnation `inc`) the way every production node starts: with the
    /// seed list `seeds` (addresses of node numbers) and no explicit `Join` to itself, so only
    /// the first seed may form a cluster, after the seed-node timeout.
    pub fn start_seeded(&mut self, i: usize, inc: u64, seeds: &[usize]) {
        let config = Self::config(uid(i, inc));
        let a = config.self_node.address.clone();
        self.nodes.insert(
            a.clone(),
            SimNode {
                node: MembershipNode::new(config),
                alive: true,
                events: Vec::new(),
                shutdown_at: None,
            },
        );
        self.input(&a, Input::Tick(self.now));
        self.input(
            &a,
            Input::JoinSeeds(seeds.iter().map(|s| addr(*s)).collect()),
        );
    }

    /// The distinct clusters among live nodes: the sets of members (by node number) of the
    /// live nodes' views.
    pub fn clusters(&self) -> BTreeSet<Vec<String>> {
        self.alive()
            .filter(|n| n.node.status().is_some())
            .map(|n| {
                n.node
                    .gossip()
                    .members()
                    .map(|m| m.node.node_id.clone())
                    .collect()
            })
            .collect()
    }

    /// Stops node at address `a` without telling anyone (SIGKILL).
    pub fn crash(&mut self, i: usize) {
        if let Some(n) = self.nodes.get_mut(&addr(i)) {
            n.alive = false;
        }
    }

    pub fn cut(&mut self, a: &[usize], b: &[usize]) {
        for x in a {
            for y in b {
                self.cuts.insert((addr(*x), addr(*y)));
                self.cuts.insert((addr(*y), addr(*x)));
            }
        }
    }

    /// Cuts only the direction `from -> to` for every pair.
    pub fn cut_one_way(&mut self, from: &[usize], to: &[usize]) {
        for x in from {
            for y in to {
                self.cuts.insert((addr(*x), addr(*y)));
            }
        }
    }

    /// Removes the cuts between `a` and `b` (both directions), keeping every other cut.
    pub fn heal_between(&mut self, a: &[usize], b: &[usize]) {
        for x in a {
            for y in b {
                self.cuts.remove(&(addr(*x), addr(*y)));
                self.cuts.remove(&(addr(*y), addr(*x)));
            }
        }
    }

    /// Drops the membership news `from -> to` for every pair, gossip and join requests
    /// (heartbeats and requests for them still get through).
    pub fn cut_gossip(&mut self, from: &[usize], to: &[usize]) {
        for x in from {
            for y in to {
                self.gossip_cuts.insert((addr(*x), addr(*y)));
            }
        }
    }

    pub fn heal(&mut self) {
        self.cuts.clear();
        self.hb_cuts.clear();
        self.gossip_cuts.clear();
    }

    pub fn starve_heartbeats(&mut self, from: usize, to: usize) {
        self.hb_cuts.insert((addr(from), addr(to)));
    }

    pub fn set_loss(&mut self, percent: u64) {
        self.loss_percent = percent;
    }

    fn random_drop(&mut self) -> bool {
        if self.loss_percent == 0 {
            return false;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 100 < self.loss_percent
    }

    pub fn input(&mut self, a: &str, input: Input) {
        let Some(n) = self.nodes.get_mut(a) else {
            return;
        };
        if !n.alive {
            return;
        }
        let from = n.node.self_node().clone();
        let actions = n.node.handle(input);
        for act in actions {
            match act {
                Action::SendGossip(to, g) => {
                    self.in_flight
                        .push((from.clone(), to.address, Msg::Gossip(g)))
                }
                Action::SendHeartbeat(to) => {
                    self.in_flight
                        .push((from.clone(), to.address, Msg::Heartbeat))
                }
                Action::SendWatch { to, joining } => {
                    self.in_flight
                        .push((from.clone(), to.address, Msg::Watch(joining)))
                }
                Action::SendJoin(to) => {
                    let roles = self.roles_of(a);
                    self.in_flight.push((from.clone(), to, Msg::Join(roles)))
                }
                Action::SendJoinReminder(to) => {
                    let msg = Msg::JoinReminder(self.roles_of(a), to.incarnation);
                    self.in_flight.push((from.clone(), to.address, msg))
                }
                Action::Event(e) => {
                    let now = self.now;
                    self.nodes.get_mut(a).unwrap().events.push((now, e));
                }
                Action::ShutdownSelf => {
                    let n = self.nodes.get_mut(a).unwrap();
                    n.alive = false;
                    n.shutdown_at = Some(self.now);
                }
            }
        }
    }

    /// The roles of the node at `a` in its own view (none before it is a member).
    fn roles_of(&self, a: &str) -> BTreeSet<String> {
        let node = &self.nodes[a].node;
        node.gossip()
            .member(node.self_node())
            .map_or_else(BTreeSet::new, |m| m.roles.clone())
    }

    /// Injects a gossip as if `from` had sent it to node `to`.
    pub fn inject_gossip(&mut self, from: UniqueAddress, to: usize, g: Gossip) {
        self.input(&addr(to), Input::Gossip(from, Box::new(g)));
    }

    pub fn step(&mut self) {
        self.now += STEP;
        let msgs = std::mem::take(&mut self.in_flight);
        for (from, to, msg) in msgs {
            let key = (from.address.clone(), to.clone());
            if self.cuts.contains(&key) || self.random_drop() {
                continue;
            }
            if matches!(msg, Msg::Heartbeat | Msg::Watch(_)) && self.hb_cuts.contains(&key) {
                continue;
            }
            let news = matches!(msg, Msg::Gossip(_) | Msg::Join(_) | Msg::JoinReminder(..));
            if news && self.gossip_cuts.contains(&key) {
                continue;
            }
            let now = self.now;
            let input = match msg {
                Msg::Gossip(g) => {
                    self.delivered_gossip
                        .push((from.clone(), to.clone(), (*g).clone()));
                    Input::Gossip(from, g)
                }
                Msg::Heartbeat => Input::HeartbeatFrom(from, now),
                Msg::Watch(joining) => Input::WatchFrom {
                    from,
                    joining,
                    at: now,
                },
                Msg::Join(roles) => Input::Join(from, roles),
                Msg::JoinReminder(roles, incarnation) => {
                    // Like the runtime: for an earlier incarnation of the recipient, dropped.
                    if self.nodes.get(&to).map(|n| n.node.self_node().incarnation)
                        != Some(incarnation)
                    {
                        continue;
                    }
                    Input::JoinReminder(from, roles)
                }
            };
            self.input(&to, input);
        }
        let addrs: Vec<String> = self.nodes.keys().cloned().collect();
        for a in addrs {
            self.input(&a, Input::Tick(self.now));
            if self.now.is_multiple_of(HEARTBEAT) {
                self.input(&a, Input::HeartbeatTick(self.now));
            }
        }
    }

    pub fn run_for(&mut self, ms: u64) {
        let end = self.now + ms;
        while self.now < end {
            self.step();
        }
    }

    /// Steps until `cond` holds; returns the time it took, or panics after `max_ms`.
    pub fn run_until(&mut self, max_ms: u64, what: &str, cond: impl Fn(&Sim) -> bool) -> u64 {
        let start = self.now;
        while !cond(self) {
            assert!(self.now - start <= max_ms, "{what}: not within {max_ms} ms");
            self.step();
        }
        self.now - start
    }

    pub fn node(&self, i: usize) -> &SimNode {
        &self.nodes[&addr(i)]
    }

    pub fn alive(&self) -> impl Iterator<Item = &SimNode> {
        self.nodes.values().filter(|n| n.alive)
    }

    /// The status node `viewer` has for `subject`.
    pub fn status(&self, viewer: usize, subject: &UniqueAddress) -> Option<MemberStatus> {
        self.node(viewer)
            .node
            .gossip()
            .member(subject)
            .map(|m| m.status)
    }

    /// Every node in `viewers` sees exactly `members` and all of them `Up`.
    pub fn all_up(&self, viewers: &[usize], members: &[UniqueAddress]) -> bool {
        viewers.iter().all(|v| {
            let g = self.node(*v).node.gossip();
            g.members().count() == members.len()
                && members
                    .iter()
                    .all(|m| g.member(m).is_some_and(|m| m.status == MemberStatus::Up))
        })
    }

    /// Starts `k` nodes (incarnation 1) and waits until all see each other up.
    pub fn cluster(k: usize) -> (Sim, u64) {
        let mut sim = Sim::new();
        for i in 0..k {
            sim.start(i, 1);
        }
        let ids: Vec<_> = (0..k).map(|i| uid(i, 1)).collect();
        let all: Vec<usize> = (0..k).collect();
        let t = sim.run_until(20_000, "cluster up", |s| s.all_up(&all, &ids));
        (sim, t)
    }

    pub fn events_of(&self, i: usize) -> Vec<ClusterEvent> {
        self.node(i).events.iter().map(|(_, e)| e.clone()).collect()
    }
}

/// The pairs of live nodes (of the first `n`, incarnation 1) that could both run what must
/// run once: `x` is not fenced and sees `y` as `Down` or removed (so what ran on `y` may
/// start on `x`'s side), while `y`, alive, is not fenced either.
pub fn overlaps(sim: &Sim, n: usize) -> Vec<(usize, usize)> {
    let free = |i: usize| sim.node(i).alive && !sim.node(i).node.is_fenced();
    (0..n)
        .flat_map(|x| (0..n).map(move |y| (x, y)))
        .filter(|&(x, y)| {
            x != y
                && free(x)
                && free(y)
                && (sim.status(x, &uid(y, 1)) == Some(MemberStatus::Down)
                    || sim.node(x).node.gossip().is_tombstoned(&uid(y, 1)))
        })
        .collect()
}
