//! The driver task: owns the [`MembershipNode`], feeds it ticks and arriving messages, and
//! carries out its actions over the remote layer.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shardik_actor::ActorSystem;
use shardik_remote::{DecodeError, Decoder, Remote, RemoteRef, SendError};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use super::cluster::{ClusterState, Command, Event, NodeStopReason, Shared};
use super::config::ClusterConfig;
use super::wire::{Body, WireMsg, PATH};
use crate::events::ClusterEvent;
use crate::member::{MemberStatus, UniqueAddress};
use crate::node::{millis, MembershipNode};
use crate::protocol::{Action, Input};

/// Cluster messages waiting for the driver; beyond this, arriving ones are dropped (the
/// protocol repeats everything it needs).
const INBOX: usize = 8 * 1024;

/// How this node finds its way into a cluster.
#[derive(Debug)]
enum Seeding {
    /// A member (or formed one): nothing left to do.
    Done,
    /// The first seed node: asks the other seeds; forms a new cluster when all of them
    /// answered "not a member", or at the deadline if some did not answer at all.
    FirstSeed {
        pending: BTreeSet<String>,
        deadline: u64,
    },
    /// Any other node: asks the seeds until one that is a member answers, and joins it.
    Seek,
    /// The first seed node after a seed answered that it is a member: joins it like
    /// [`Seeding::Seek`], but asks all seeds afresh ([`Seeding::FirstSeed`]) if no seed said
    /// so again for `seed_timeout` and this node is still not a member. The member that
    /// answered may have stopped before taking this node in, and seeds that restarted since
    /// answer "not a member": without the fresh round the first seed would wait for a member
    /// forever and no cluster would form.
    FirstSeedJoining { retry_at: u64 },
}

struct Driver {
    system: ActorSystem,
    remote: Remote,
    cfg: ClusterConfig,
    me: UniqueAddress,
    node: MembershipNode,
    shared: Arc<Shared>,
    epoch: Instant,
    refs: HashMap<String, RemoteRef<WireMsg>>,
    /// When the last heartbeat of each peer arrived (for the largest-gap statistic).
    last_heartbeat: HashMap<UniqueAddress, u64>,
    other_seeds: Vec<String>,
    seeding: Seeding,
    next_init_join: u64,
    next_join_feed: u64,
    leaving: bool,
    stop: Option<NodeStopReason>,
    send_failures: u64,
}

/// Registers the cluster endpoint on `remote` and spawns the driver.
pub(crate) fn start(
    system: ActorSystem,
    remote: Remote,
    cfg: ClusterConfig,
    me: UniqueAddress,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedReceiver<Command>,
) {
    let (tx, inbox) = mpsc::channel::<(Instant, WireMsg)>(INBOX);
    let endpoint = shared.clone();
    let decoder: Decoder = Arc::new(move |bytes: &[u8]| {
        let msg: WireMsg = shardik_remote::decode_payload(bytes)?;
        // Stamped on arrival: the failure detector must not see the driver's own delays.
        let c = &endpoint.counters;
        c.received.fetch_add(1, Ordering::Relaxed);
        tx.try_send((Instant::now(), msg)).map_err(|_| {
            c.inbox_dropped.fetch_add(1, Ordering::Relaxed);
            DecodeError::Refused("cluster inbox full or closed".into())
        })
    });
    remote.register_decoder(PATH, decoder);
    let other_seeds: Vec<String> = cfg
        .seed_nodes
        .iter()
        .filter(|s| **s != me.address)
        .cloned()
        .collect();
    let mut node_config = cfg.node_config(me.clone());
    // Instant 0 of the node's times is `epoch` below, taken right after this.
    node_config.wall_clock_origin_ms = wall_clock_ms();
    let node = MembershipNode::new(node_config);
    let watch = (
        remote.clone(),
        me.clone(),
        shared.clone(),
        cfg.node_id().to_string(),
    );
    let driver = Driver {
        system,
        remote,
        me,
        node,
        shared,
        epoch: Instant::now(),
        refs: HashMap::new(),
        last_heartbeat: HashMap::new(),
        other_seeds,
        seeding: Seeding::Seek,
        next_init_join: 0,
        next_join_feed: 0,
        leaving: false,
        stop: None,
        send_failures: 0,
        cfg,
    };
    let running = tokio::spawn(driver.run(inbox, commands));
    let (remote, me, shared, node_id) = watch;
    tokio::spawn(async move {
        if let Err(e) = running.await {
            // Cancelled only when the runtime itself goes away: nobody is left to tell.
            if e.is_panic() {
                driver_panicked(e.into_panic(), remote, me, shared, node_id).await;
            }
        }
    });
}

/// The driver task panicked: nothing runs the node's membership any more, so nothing would
/// ever publish that it stopped, and everything waiting for that (`when_up`, `leave`, the
/// shard regions and singletons watching `fenced`) would wait for good while local work went
/// on. Publishes the node as stopped and fenced instead (reason `DriverFailed`; the cluster
/// endpoint and remoting are shut down here, as on any other stop), and logs why.
async fn driver_panicked(
    panic: Box<dyn std::any::Any + Send>,
    remote: Remote,
    me: UniqueAddress,
    shared: Arc<Shared>,
    node_id: String,
) {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into());
    let reason = NodeStopReason::DriverFailed;
    tracing::error!(
        node = %me,
        %reason,
        "the cluster driver panicked: {why}; the node stops, fenced (its shards and \
         singletons stop; the other members see it as crashed)"
    );
    remote.unregister(PATH);
    if shared.state.borrow().stopped.is_some() {
        // It panicked after publishing its stop: nothing is left to say.
        remote.shutdown().await;
        return;
    }
    // As on any stop: fenced first (local shards and singletons stop), then remoting goes
    // down, and only then is the stop published, so that whoever waits for it (`leave`,
    // `shutdown`) finds remoting down, its port free for a restart.
    let mut state = shared.state.borrow().clone();
    state.fenced = true;
    shared.publish(Some(state.clone()), Vec::new());
    remote.shutdown().await;
    state.stopped = Some(reason);
    let events = vec![Event::Stopped(reason)];
    super::metrics::record(&node_id, &state, &events);
    shared.publish(Some(state), events);
}

impl Driver {
    fn now(&self) -> u64 {
        millis(self.epoch.elapsed())
    }

    fn at(&self, t: Instant) -> u64 {
        millis(t.saturating_duration_since(self.epoch))
    }

    async fn run(
        mut self,
        mut inbox: mpsc::Receiver<(Instant, WireMsg)>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        tracing::info!(
            node = %self.me,
            cluster = %self.cfg.remote.cluster,
            seeds = ?self.cfg.seed_nodes,
            "cluster node starting"
        );
        let mut tick = tokio::time::interval(self.cfg.tick_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heartbeat = tokio::time::interval(self.cfg.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let system = self.system.clone();
        let system_down = system.shutdown_started();
        tokio::pin!(system_down);
        self.begin_join();
        let reason = loop {
            if let Some(r) = self.stop {
                break r;
            }
            tokio::select! {
                biased;
                _ = &mut system_down => break NodeStopReason::SystemShutdown,
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => break NodeStopReason::Shutdown,
                },
                // Timers before messages: a busy inbox must not hold heartbeats and
                // failure-detector checks back (timers fire at most a few times a second).
                _ = heartbeat.tick() => {
                    let now = self.now();
                    self.input(Input::HeartbeatTick(now));
                }
                _ = tick.tick() => {
                    let now = self.now();
                    // Follows the wall clock if it is set or stepped while the node runs
                    // (removal times in the gossip are wall-clock times).
                    self.node
                        .set_wall_clock_origin(wall_clock_ms().saturating_sub(now));
                    self.input(Input::Tick(now));
                    self.seed_tick(now);
                }
                msg = inbox.recv() => match msg {
                    Some((at, msg)) => self.on_wire(at, msg),
                    None => break NodeStopReason::RemoteStopped,
                },
            }
        };
        self.finish(reason).await;
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Leave => {
                self.leaving = true;
                match self.node.status() {
                    None => self.stop = Some(NodeStopReason::Left),
                    Some(_) => {
                        tracing::info!(node = %self.me, "leaving the cluster");
                        self.input(Input::Leave);
                    }
                }
            }
            Command::Down(n) => {
                tracing::info!(node = %self.me, downing = %n, "operator downs a member");
                self.input(Input::Down(n));
            }
            Command::Shutdown => self.stop = Some(NodeStopReason::Shutdown),
        }
    }

    fn on_wire(&mut self, at: Instant, msg: WireMsg) {
        if msg.to.is_some_and(|i| i != self.me.incarnation) {
            tracing::debug!(node = %self.me, from = %msg.from, "message for an earlier incarnation dropped");
            return;
        }
        let from = msg.from;
        match msg.body {
            Body::Gossip(g) => match g.check_received() {
                Ok(()) => self.input(Input::Gossip(from, g)),
                Err(why) => tracing::warn!(
                    node = %self.me,
                    from = %from,
                    "gossip refused, it cannot come from a healthy node: {why}"
                ),
            },
            Body::Heartbeat => {
                let t = self.at(at);
                let c = &self.shared.counters;
                c.heartbeats.fetch_add(1, Ordering::Relaxed);
                if let Some(prev) = self.last_heartbeat.insert(from.clone(), t) {
                    c.max_heartbeat_gap_ms
                        .fetch_max(t.saturating_sub(prev), Ordering::Relaxed);
                }
                if self.last_heartbeat.len() > self.cfg.monitored_by.max(16).saturating_mul(4) {
                    // Forget peers that left: keep only the ones still monitored.
                    let watched: BTreeSet<&UniqueAddress> = self.node.monitored().collect();
                    self.last_heartbeat.retain(|n, _| watched.contains(n));
                }
                self.input(Input::HeartbeatFrom(from, t));
            }
            Body::Watch { joining } => {
                let at = self.at(at);
                self.input(Input::WatchFrom { from, joining, at });
            }
            Body::Join { roles } => self.input(Input::Join(from, roles)),
            Body::JoinReminder { roles } => self.input(Input::JoinReminder(from, roles)),
            Body::InitJoin => {
                // Any member that can still take a joiner in says so, a leaving one included
                // (it welcomes joiners until it exits): answering "not a member" there would
                // let a restarted first seed, having heard that from every other seed, form
                // a second cluster. Only a node on its way out (`Exiting`, `Down`) is not
                // used for joining, as in Akka.
                let member = self.node.status().is_some_and(|s| {
                    !matches!(
                        s,
                        MemberStatus::Exiting | MemberStatus::Down | MemberStatus::Removed
                    )
                });
                let body = if member {
                    Body::InitJoinAck
                } else {
                    Body::InitJoinNack
                };
                self.send(&from.address, Some(from.incarnation), body);
            }
            Body::InitJoinAck => self.on_init_join_ack(from),
            Body::InitJoinNack => {
                if let Seeding::FirstSeed { pending, .. } = &mut self.seeding {
                    pending.remove(&from.address);
                    if pending.is_empty() && self.node.status().is_none() {
                        tracing::info!(node = %self.me, "every other seed node answered and none is a member: forming a new cluster");
                        self.form();
                    }
                }
            }
        }
    }

    fn begin_join(&mut self) {
        let now = self.now();
        if self.other_seeds.is_empty() {
            tracing::info!(node = %self.me, "no other seed nodes: forming a new cluster");
            self.form();
            return;
        }
        self.seeding = if self.cfg.seed_nodes.first() == Some(&self.me.address) {
            Seeding::FirstSeed {
                pending: self.other_seeds.iter().cloned().collect(),
                deadline: now.saturating_add(millis(self.cfg.seed_timeout)),
            }
        } else {
            Seeding::Seek
        };
        self.seed_tick(now);
    }

    fn form(&mut self) {
        self.seeding = Seeding::Done;
        self.input(Input::Join(self.me.clone(), self.cfg.roles.clone()));
    }

    fn seed_tick(&mut self, now: u64) {
        if matches!(self.seeding, Seeding::Done) {
            return;
        }
        if self.node.status().is_some() || self.node.is_shut_down() {
            self.seeding = Seeding::Done;
            return;
        }
        if let Seeding::FirstSeedJoining { retry_at } = self.seeding {
            if now >= retry_at {
                tracing::info!(
                    node = %self.me,
                    timeout = ?self.cfg.seed_timeout,
                    "the seed node that answered it is a member has not taken this node in, \
                     and no seed said it is a member since: asking the seed nodes again"
                );
                self.seeding = Seeding::FirstSeed {
                    pending: self.other_seeds.iter().cloned().collect(),
                    deadline: now.saturating_add(millis(self.cfg.seed_timeout)),
                };
                self.next_init_join = now;
            }
        }
        if let Seeding::FirstSeed { deadline, .. } = &self.seeding {
            if now >= *deadline {
                tracing::info!(
                    node = %self.me,
                    timeout = ?self.cfg.seed_timeout,
                    "no other seed node is a member: forming a new cluster"
                );
                self.form();
                return;
            }
        }
        if now >= self.next_init_join {
            self.next_init_join = now.saturating_add(millis(self.cfg.join_retry));
            for s in self.other_seeds.clone() {
                self.send(&s, None, Body::InitJoin);
            }
        }
    }

    fn on_init_join_ack(&mut self, from: UniqueAddress) {
        if self.node.status().is_some() || matches!(self.seeding, Seeding::Done) {
            return;
        }
        let now = self.now();
        self.seeding = if self.cfg.seed_nodes.first() == Some(&self.me.address) {
            Seeding::FirstSeedJoining {
                retry_at: now.saturating_add(millis(self.cfg.seed_timeout)),
            }
        } else {
            Seeding::Seek
        };
        if now >= self.next_join_feed {
            self.next_join_feed = now.saturating_add(millis(self.cfg.join_retry));
            tracing::info!(node = %self.me, through = %from, "joining through a member seed node");
            self.input(Input::JoinSeeds(vec![from.address]));
        }
    }

    fn input(&mut self, input: Input) {
        let actions = self.node.handle(input);
        if actions.is_empty() {
            return;
        }
        let mut events = Vec::new();
        let mut shut_down = false;
        for a in actions {
            match a {
                Action::SendGossip(to, g) => {
                    self.send(&to.address, Some(to.incarnation), Body::Gossip(g))
                }
                Action::SendHeartbeat(to) => {
                    self.send(&to.address, Some(to.incarnation), Body::Heartbeat)
                }
                Action::SendWatch { to, joining } => {
                    self.send(&to.address, Some(to.incarnation), Body::Watch { joining })
                }
                Action::SendJoin(addr) => {
                    let roles = self.cfg.roles.clone();
                    self.send(&addr, None, Body::Join { roles })
                }
                Action::SendJoinReminder(to) => {
                    let roles = self.cfg.roles.clone();
                    let body = Body::JoinReminder { roles };
                    self.send(&to.address, Some(to.incarnation), body)
                }
                Action::Event(e) => {
                    log_event(&self.me, &e);
                    events.push(Event::Cluster(e));
                }
                Action::ShutdownSelf => shut_down = true,
            }
        }
        if !events.is_empty() {
            let state = self.snapshot();
            super::metrics::record(self.cfg.node_id(), &state, &events);
            self.shared.publish(Some(state), events);
        }
        if shut_down && self.stop.is_none() {
            self.stop = Some(match self.node.status() {
                Some(MemberStatus::Down) => NodeStopReason::Downed,
                Some(MemberStatus::Exiting) => NodeStopReason::Left,
                _ if self.leaving => NodeStopReason::Left,
                _ => NodeStopReason::Removed,
            });
        }
    }

    fn snapshot(&self) -> ClusterState {
        let g = self.node.gossip();
        ClusterState {
            self_node: self.me.clone(),
            members: g.members().cloned().collect(),
            unreachable: g.unreachable_members(),
            leader: g.leader(&self.me),
            fenced: self.node.is_fenced(),
            stopped: None,
        }
    }

    fn send(&mut self, addr: &str, to: Option<u64>, body: Body) {
        if !self.refs.contains_key(addr) && self.refs.len() >= self.refs_bound() {
            self.forget_refs();
        }
        let r = match self.refs.get(addr) {
            Some(r) => r,
            None => {
                let r = self.remote.lookup::<WireMsg>(PATH, addr);
                self.refs.entry(addr.to_string()).or_insert(r)
            }
        };
        let msg = WireMsg {
            from: self.me.clone(),
            to,
            body,
        };
        match r.try_tell_control(msg) {
            Ok(()) => {
                self.shared.counters.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(SendError::ShutDown) => {
                if self.stop.is_none() {
                    // Remoting also stops when the actor system shuts down; say which.
                    self.stop = Some(if self.system.is_shutting_down() {
                        NodeStopReason::SystemShutdown
                    } else {
                        tracing::warn!(node = %self.me, "the remote layer stopped underneath the cluster; stopping");
                        NodeStopReason::RemoteStopped
                    });
                }
            }
            Err(e) => {
                self.shared
                    .counters
                    .send_failures
                    .fetch_add(1, Ordering::Relaxed);
                self.send_failures += 1;
                let n = self.send_failures;
                if n <= 10 || n.is_multiple_of(1000) {
                    tracing::warn!(node = %self.me, to = addr, total = n, "cluster message not sent: {e}");
                }
            }
        }
    }

    /// Refs kept before those of addresses that are neither members nor seeds are dropped:
    /// addresses that joiners, restarted incarnations or stray `InitJoin`s declared would
    /// otherwise stay for the node's lifetime.
    fn refs_bound(&self) -> usize {
        64 + 2 * (self.node.gossip().members().count() + self.cfg.seed_nodes.len())
    }

    /// Drops the refs of addresses that are neither members nor seeds (looked up again if
    /// they are sent to again).
    fn forget_refs(&mut self) {
        let g = self.node.gossip();
        let keep: HashSet<&str> = g
            .members()
            .map(|m| m.node.address.as_str())
            .chain(self.cfg.seed_nodes.iter().map(String::as_str))
            .collect();
        self.refs.retain(|addr, _| keep.contains(addr.as_str()));
    }

    async fn finish(mut self, reason: NodeStopReason) {
        tracing::info!(node = %self.me, %reason, "cluster node stopping");
        self.remote.unregister(PATH);
        if matches!(
            reason,
            NodeStopReason::Left | NodeStopReason::Downed | NodeStopReason::Removed
        ) {
            // The actions that stopped this node usually end with gossip telling the rest of
            // its side (a downing decision, say); give the writers a moment to send it, since
            // shutting remoting down drops what is still queued.
            tokio::time::sleep(self.cfg.tick_interval.saturating_mul(2)).await;
        }
        self.remote.shutdown().await;
        if self.cfg.stop_system_on_exit
            && matches!(
                reason,
                NodeStopReason::Left | NodeStopReason::Downed | NodeStopReason::Removed
            )
        {
            self.system.shutdown().await;
        }
        let mut state = self.snapshot();
        state.stopped = Some(reason);
        state.fenced = true;
        self.refs.clear();
        let events = vec![Event::Stopped(reason)];
        super::metrics::record(self.cfg.node_id(), &state, &events);
        self.shared.publish(Some(state), events);
        tracing::info!(node = %self.me, %reason, "cluster node stopped");
    }
}

fn log_event(me: &UniqueAddress, e: &ClusterEvent) {
    match e {
        ClusterEvent::MemberJoined(m) => {
            tracing::info!(node = %me, member = %m.node, "member joining")
        }
        ClusterEvent::MemberWeaklyUp(m) => {
            tracing::info!(node = %me, member = %m.node, "member weakly up")
        }
        ClusterEvent::MemberUp(m) => tracing::info!(node = %me, member = %m.node, "member up"),
        ClusterEvent::MemberLeft(m) => {
            tracing::info!(node = %me, member = %m.node, "member leaving")
        }
        ClusterEvent::MemberExited(m) => {
            tracing::info!(node = %me, member = %m.node, "member exiting")
        }
        ClusterEvent::MemberDowned(m) => {
            tracing::warn!(node = %me, member = %m.node, "member downed")
        }
        ClusterEvent::MemberRemoved { node, previous } => {
            tracing::info!(node = %me, member = %node, ?previous, "member removed")
        }
        ClusterEvent::Unreachable(n) => {
            tracing::warn!(node = %me, member = %n, "member unreachable")
        }
        ClusterEvent::Reachable(n) => {
            tracing::info!(node = %me, member = %n, "member reachable again")
        }
        ClusterEvent::LeaderChanged(l) => {
            tracing::info!(node = %me, leader = ?l.as_ref().map(|l| l.to_string()), "leader changed")
        }
        ClusterEvent::Fenced => tracing::warn!(
            node = %me,
            "fenced: on this view the split brain resolver would down this node; shard \
             hosting and singletons stop here"
        ),
        ClusterEvent::Unfenced => {
            tracing::info!(node = %me, "no longer fenced: a majority is reachable again")
        }
    }
}

/// The wall clock, in ms since the UNIX epoch (0 if it is set before the epoch).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}
