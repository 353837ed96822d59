//! Remember entities: the ids of the entities started in each hosted shard are written to the
//! replicas of the type's quorum members, and a new home of a shard reads them back from a
//! majority and starts those entities without a message: all at once, or paced by
//! [`RememberedStart::Constant`].
//!
//! Per shard, the owner is the single writer (a shard has one home at a time). Each set
//! carries a stamp (owner generation, write number, one per id added); a new owner reads a
//! majority, merges the sets it gets (sets only grow) and continues with a generation above
//! the highest stamp, so a replica never takes an older owner's write over a newer one's.
//!
//! The owner writes to each replica (its own node's included) over a *pipe*: at most one
//! write in flight, answered by the replica once it holds the write (stored, with a durable
//! store). The first write of a pipe is the whole set; after that a write carries only the
//! ids added since the stamp the replica acknowledged last ([`EntityDelta`]), so a burst of
//! new entities costs writes of the new ids, batched by the round trip, not a copy of the
//! whole set per id. A replica that does not hold a delta's base answers `NeedFull` and
//! gets the whole set next. A write that fails (no answer within the replication timeout,
//! the connection down, the store failing) is retried with the whole set by a tick every
//! [`RESEND`], as long as the shard is hosted here, backing off to one try every
//! [`MAX_BACKOFF`] while the replica stays silent; the same tick brings new quorum members
//! the set.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shardik_cluster::member::UniqueAddress;
use shardik_cluster::runtime::Cluster;

use super::entity_sets::{EntityWrite, Offer};
use super::membership::{majority, quorum_members};
use super::replica::ReplicaStore;
use super::settings::{ClusterShardingSettings, RememberedStart};
use super::wire::{EntitiesAck, EntityDelta, EntitySet, ReplicaReq, REPLICA_PATH};
use crate::coordination::FencingToken;
use crate::hash::ShardId;

/// How often failed writes are retried and new quorum members are sent the sets.
pub(crate) const RESEND: Duration = Duration::from_secs(1);

/// The longest wait between two writes to a replica that does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long the list of quorum members written to is used before it is read again.
const PEERS_TTL: Duration = Duration::from_millis(50);

/// Starts an entity of a hosted shard without a message.
pub(crate) type StartEntity = Arc<dyn Fn(ShardId, &str) + Send + Sync>;

/// Where a shard's set is written: this node's replica or a peer's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Target {
    Local,
    Peer(UniqueAddress),
}

/// The owner's side of the writes to one replica.
#[derive(Default)]
struct Pipe {
    /// The stamp the replica acknowledged; `None`: unknown, the next write is the whole set.
    held: Option<(u64, u64)>,
    /// The stamp of the write in flight, if one is.
    in_flight: Option<(u64, u64)>,
    /// Writes in a row that got no answer, and when the next may be sent: an unreachable
    /// replica is written to less and less often (up to every [`MAX_BACKOFF`]), not sent
    /// every set on every tick.
    failures: u32,
    retry_at: Option<Instant>,
}

struct ShardMem {
    /// Bumped every time the shard starts being hosted here (a stale read is ignored).
    gen: u64,
    /// The majority read is done: `stamp` continues the newest set.
    loaded: bool,
    /// The shard is being handed off: its entities stop, no remembered one starts any more,
    /// and the writes already due finish ([`Remember::shard_stopping`]).
    stopping: bool,
    stamp: (u64, u64),
    ids: BTreeSet<String>,
    /// The ids of write numbers `log_start + 1 ..= stamp.1`, in order: what deltas carry.
    log: Vec<String>,
    log_start: u64,
    pipes: HashMap<Target, Pipe>,
}

pub(crate) struct Remember {
    pub(crate) type_name: String,
    pub(crate) cluster: Cluster,
    /// The actor system's runtime: writes and loads are spawned there, since an entity may be
    /// told (and so remembered) from a thread outside any runtime.
    runtime: tokio::runtime::Handle,
    pub(crate) replicas: Arc<ReplicaStore>,
    pub(crate) role: Option<String>,
    pub(crate) timeout: Duration,
    /// Fewer quorum members than this: no read counts as a majority (`min_quorum`).
    pub(crate) min_quorum: usize,
    /// How a loaded shard's remembered entities are started.
    pub(crate) start_rate: RememberedStart,
    pub(crate) start: StartEntity,
    shards: Mutex<HashMap<ShardId, ShardMem>>,
    next_gen: Mutex<u64>,
    /// The highest set generation this node used per shard (kept when the shard stops): a
    /// shard hosted here again continues above it even if its majority read missed the
    /// previous hosting's last writes (they race with the read), so two hostings never
    /// write different sets under one stamp.
    set_gens: Mutex<HashMap<ShardId, u64>>,
    /// The resend task runs.
    ticking: AtomicBool,
    /// Notified whenever a write is answered (or found unanswered): hand-offs waiting for
    /// their shard's writes look again.
    settled: tokio::sync::Notify,
    /// The quorum members other than this node, and when they were read from the cluster
    /// state (read again when older than [`PEERS_TTL`]: a pump per new id must not copy the
    /// cluster state).
    peers: Mutex<(Option<Instant>, Arc<[Target]>)>,
}

impl Remember {
    /// Remember entities of `type_name` with the type's `settings` (role, replication
    /// timeout, minimum quorum, start rate); `start` starts an entity without a message.
    pub(crate) fn new(
        type_name: &str,
        cluster: &Cluster,
        replicas: Arc<ReplicaStore>,
        settings: &ClusterShardingSettings,
        start: StartEntity,
    ) -> Arc<Self> {
        Arc::new(Remember {
            type_name: type_name.to_string(),
            cluster: cluster.clone(),
            runtime: cluster.remote().system().runtime().clone(),
            replicas,
            role: settings.role.clone(),
            timeout: settings.replication_timeout,
            min_quorum: settings.min_quorum,
            start_rate: settings.remembered_start,
            start,
            shards: Mutex::new(HashMap::new()),
            next_gen: Mutex::new(0),
            set_gens: Mutex::new(HashMap::new()),
            ticking: AtomicBool::new(false),
            settled: tokio::sync::Notify::new(),
            peers: Mutex::new((None, Arc::from(Vec::new()))),
        })
    }

    /// An entity message was delivered to a hosted shard: remember its id.
    pub(crate) fn delivered(self: &Arc<Self>, shard: ShardId, id: &str) {
        {
            let mut shards = self.shards.lock();
            let Some(m) = shards.get_mut(&shard) else {
                return;
            };
            if m.ids.contains(id) {
                return;
            }
            m.ids.insert(id.to_string());
            m.stamp.1 += 1;
            if !m.loaded {
                // The load continues the set with these ids; nothing is written before.
                return;
            }
            m.log.push(id.to_string());
            if !m.pipes.is_empty() && m.pipes.values().all(|p| p.in_flight.is_some()) {
                // Every pipe is busy: each takes this id with its next write, when its
                // answer comes.
                return;
            }
        }
        self.pump(shard);
    }

    /// The shard is hosted here from now on, under the allocation `token` names: read its
    /// remembered ids from a majority, start those entities, and continue the set.
    pub(crate) fn shard_started(self: &Arc<Self>, shard: ShardId, token: Option<FencingToken>) {
        let gen = {
            let mut g = self.next_gen.lock();
            *g += 1;
            *g
        };
        self.shards.lock().insert(
            shard,
            ShardMem {
                gen,
                loaded: false,
                stopping: false,
                stamp: (0, 0),
                ids: BTreeSet::new(),
                log: Vec::new(),
                log_start: 0,
                pipes: HashMap::new(),
            },
        );
        if !self.ticking.swap(true, Ordering::AcqRel) {
            self.runtime.spawn(resend(Arc::downgrade(self)));
        }
        let me = self.clone();
        self.runtime
            .spawn(async move { me.load(shard, gen, token).await });
    }

    /// The shard is no longer hosted here (its entities stop): stop tracking it.
    pub(crate) fn shard_stopped(&self, shard: ShardId) {
        self.shards.lock().remove(&shard);
        // A hand-off waiting for this shard's writes has nothing left to wait for.
        self.settled.notify_waiters();
    }

    /// The shard is handed off: no remembered entity of it starts here any more, and the
    /// returned future ends once a majority of the quorum's replicas hold every id this
    /// hosting delivered to (or after the replication timeout), then stops tracking the
    /// shard. The region reports the shard stopped only then, so the next home's majority
    /// read finds those ids: a rebalance or a graceful leave forgets none of them while a
    /// majority is reachable. (Without the wait, the ids delivered during the last round trip
    /// before the hand-off could reach the replicas after the next home read them.)
    pub(crate) fn shard_stopping(
        self: &Arc<Self>,
        shard: ShardId,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let gen = {
            let mut shards = self.shards.lock();
            shards.get_mut(&shard).map(|m| {
                m.stopping = true;
                m.gen
            })
        };
        if gen.is_some() {
            self.pump(shard);
        }
        let me = self.clone();
        async move {
            let Some(gen) = gen else { return };
            let deadline = tokio::time::Instant::now() + me.timeout;
            loop {
                let settled = me.settled.notified();
                tokio::pin!(settled);
                settled.as_mut().enable();
                if me.flushed(shard, gen) {
                    break;
                }
                if tokio::time::timeout_at(deadline, settled).await.is_err() {
                    tracing::warn!(entity_type = %me.type_name, shard, "hand-off goes on before a majority of replicas acknowledged every remembered id");
                    break;
                }
            }
            let mut shards = me.shards.lock();
            if shards.get(&shard).is_some_and(|m| m.gen == gen) {
                shards.remove(&shard);
            }
        }
    }

    /// True if the hosting `gen` of `shard` has nothing left to write to a majority (or is
    /// not tracked any more). A shard whose majority read never finished wrote nothing: the
    /// ids it delivered meanwhile are not remembered (the read that would have continued the
    /// set could not reach a majority either).
    fn flushed(&self, shard: ShardId, gen: u64) -> bool {
        let peers = self.peers();
        let shards = self.shards.lock();
        let Some(m) = shards.get(&shard).filter(|m| m.gen == gen && m.loaded) else {
            return true;
        };
        let holding = m
            .pipes
            .iter()
            .filter(|(t, p)| p.held == Some(m.stamp) && (**t == Target::Local || peers.contains(t)))
            .count();
        holding >= majority(peers.len() + 1)
    }

    async fn load(self: Arc<Self>, shard: ShardId, gen: u64, token: Option<FencingToken>) {
        let best = loop {
            if let Some(best) = self.read_majority(shard).await {
                break best;
            }
            if !self.tracking(shard, gen) || self.cluster.stopped().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let to_start = {
            let mut shards = self.shards.lock();
            let Some(m) = shards.get_mut(&shard).filter(|m| m.gen == gen) else {
                return;
            };
            let to_start: Vec<String> = best.ids.iter().cloned().collect();
            m.ids.extend(best.ids);
            let mut gens = self.set_gens.lock();
            let last = gens.entry(shard).or_default();
            *last = set_generation(best.stamp.0.max(*last), token);
            m.stamp = (*last, 0);
            m.loaded = true;
            to_start
        };
        // The set is complete: write it before the (possibly paced) starts.
        self.pump(shard);
        if !to_start.is_empty() {
            tracing::debug!(entity_type = %self.type_name, shard, entities = to_start.len(), "starting remembered entities");
        }
        let (step, every) = match self.start_rate {
            RememberedStart::All => (to_start.len().max(1), Duration::ZERO),
            RememberedStart::Constant { entities, every } => (entities.get(), every),
        };
        for (i, ids) in to_start.chunks(step).enumerate() {
            if i > 0 {
                tokio::time::sleep(every).await;
            }
            for id in ids {
                // Under the lock `shard_stopped` takes before the region stops the shard: an
                // entity is started either before the stop (which then stops it too) or not
                // at all, and none once the shard has moved on.
                let shards = self.shards.lock();
                if shards
                    .get(&shard)
                    .is_none_or(|m| m.gen != gen || m.stopping)
                {
                    return;
                }
                (self.start)(shard, id);
            }
        }
    }

    fn tracking(&self, shard: ShardId, gen: u64) -> bool {
        self.shards
            .lock()
            .get(&shard)
            .is_some_and(|m| m.gen == gen && !m.stopping)
    }

    /// The sets of `shard` of a majority of the quorum's replicas, merged (the newest stamp,
    /// every id), or `None` if a majority did not answer within the timeout.
    async fn read_majority(&self, shard: ShardId) -> Option<EntitySet> {
        let state = self.cluster.state();
        let members = quorum_members(&state, self.role.as_deref());
        if members.len() < self.min_quorum {
            return None;
        }
        let need = majority(members.len().max(1));
        let me = self.cluster.self_node().clone();
        let mut answered = 0;
        let mut best = EntitySet::default();
        if members.contains(&me) || members.is_empty() {
            answered += 1;
            if let Some(s) = self.replicas.read_entities(&self.type_name, shard) {
                best = merged(best, s);
            }
        }
        let mut reads = tokio::task::JoinSet::new();
        for node in members.into_iter().filter(|n| *n != me) {
            let r = self
                .cluster
                .remote()
                .lookup::<ReplicaReq>(REPLICA_PATH, &node.address);
            let type_name = self.type_name.clone();
            let timeout = self.timeout;
            reads.spawn(async move {
                r.ask(
                    |reply| ReplicaReq::ReadEntities {
                        type_name,
                        shard,
                        reply,
                    },
                    timeout,
                )
                .await
            });
        }
        while answered < need {
            match reads.join_next().await {
                Some(Ok(Ok(set))) => {
                    answered += 1;
                    if let Some(s) = set {
                        best = merged(best, s);
                    }
                }
                Some(_) => {}
                None => return None,
            }
        }
        Some(best)
    }

    /// Starts a write on every pipe of `shard` that is idle and behind: the whole set where
    /// the replica's position is unknown, else the ids it lacks.
    fn pump(self: &Arc<Self>, shard: ShardId) {
        // A loop, not recursion: this node's replica answers inline, and ids may have been
        // added meanwhile.
        while self.pump_once(shard) {}
    }

    /// One round of [`pump`](Self::pump); true if this node's replica answered inline
    /// (another round may have more to write).
    fn pump_once(self: &Arc<Self>, shard: ShardId) -> bool {
        let peers = self.peers();
        let mut writes = Vec::new();
        let gen = {
            let mut shards = self.shards.lock();
            let Some(m) = shards.get_mut(&shard).filter(|m| m.loaded) else {
                return false;
            };
            // Members that left the quorum get nothing more.
            m.pipes
                .retain(|t, _| *t == Target::Local || peers.contains(t));
            for target in std::iter::once(&Target::Local).chain(peers.iter()) {
                let (stamp, log_start) = (m.stamp, m.log_start);
                let pipe = m.pipes.entry(target.clone()).or_default();
                if pipe.in_flight.is_some()
                    || pipe.held == Some(stamp)
                    || pipe.retry_at.is_some_and(|at| Instant::now() < at)
                {
                    continue;
                }
                pipe.in_flight = Some(stamp);
                let write = match pipe.held {
                    Some(held) if held.0 == stamp.0 && held.1 >= log_start => {
                        EntityWrite::Delta(EntityDelta {
                            base: held,
                            stamp,
                            ids: m.log[(held.1 - log_start) as usize..].to_vec(),
                        })
                    }
                    _ => EntityWrite::Full(EntitySet {
                        stamp,
                        ids: m.ids.clone(),
                    }),
                };
                writes.push((target.clone(), write));
            }
            m.gen
        };
        let mut again = false;
        for (target, write) in writes {
            let sent = write.stamp();
            if target == Target::Local {
                // This node's replica answers at once unless it waits for its store.
                match self.replicas.offer_entities(&self.type_name, shard, write) {
                    Offer::Ready(ack) => again = self.settle(shard, gen, &target, sent, Some(ack)),
                    Offer::Pending { answer, .. } => {
                        let me = self.clone();
                        self.runtime.spawn(async move {
                            let ack = answer.await.ok();
                            if me.settle(shard, gen, &target, sent, ack) {
                                me.pump(shard);
                            }
                        });
                    }
                }
                continue;
            }
            let Target::Peer(node) = &target else {
                continue;
            };
            let kind = match &write {
                EntityWrite::Full(_) => "full",
                EntityWrite::Delta(_) => "delta",
            };
            metrics::counter!(
                "shardik_sharding_remember_writes_total",
                "entity_type" => self.type_name.clone(),
                "kind" => kind
            )
            .increment(1);
            let node = node.clone();
            let me = self.clone();
            self.runtime.spawn(async move {
                let ack = me.send(&node, shard, write).await;
                if me.settle(shard, gen, &target, sent, ack) {
                    me.pump(shard);
                }
            });
        }
        again
    }

    /// The quorum members other than this node, read from the cluster state at most every
    /// [`PEERS_TTL`].
    fn peers(&self) -> Arc<[Target]> {
        let mut peers = self.peers.lock();
        if peers.0.is_none_or(|at| at.elapsed() >= PEERS_TTL) {
            let state = self.cluster.state();
            let me = self.cluster.self_node();
            let list: Vec<Target> = quorum_members(&state, self.role.as_deref())
                .into_iter()
                .filter(|n| n != me)
                .map(Target::Peer)
                .collect();
            *peers = (Some(Instant::now()), list.into());
        }
        peers.1.clone()
    }

    /// Sends one write to the replica of `node`; `None` if it was not answered.
    async fn send(
        &self,
        node: &UniqueAddress,
        shard: ShardId,
        write: EntityWrite,
    ) -> Option<EntitiesAck> {
        let r = self
            .cluster
            .remote()
            .lookup::<ReplicaReq>(REPLICA_PATH, &node.address);
        let type_name = self.type_name.clone();
        r.ask(
            |reply| match write {
                EntityWrite::Full(set) => ReplicaReq::WriteEntities {
                    type_name,
                    shard,
                    set,
                    reply,
                },
                EntityWrite::Delta(delta) => ReplicaReq::AddEntities {
                    type_name,
                    shard,
                    delta,
                    reply,
                },
            },
            self.timeout,
        )
        .await
        .ok()
    }

    /// The answer (or none) to a write stamped `sent` on `target`'s pipe. True if the shard
    /// should be pumped again (the replica answered; more may be waiting).
    fn settle(
        &self,
        shard: ShardId,
        gen: u64,
        target: &Target,
        sent: (u64, u64),
        ack: Option<EntitiesAck>,
    ) -> bool {
        {
            let mut shards = self.shards.lock();
            let Some(m) = shards.get_mut(&shard).filter(|m| m.gen == gen) else {
                return false;
            };
            let Some(pipe) = m.pipes.get_mut(target) else {
                return false;
            };
            pipe.in_flight = None;
            if ack.is_some() {
                pipe.failures = 0;
                pipe.retry_at = None;
            } else {
                // RESEND, 2 RESEND, 4 RESEND, ... up to MAX_BACKOFF after the failure.
                pipe.failures = pipe.failures.saturating_add(1);
                let wait = RESEND.saturating_mul(1 << (pipe.failures - 1).min(5));
                pipe.retry_at = Some(Instant::now() + wait.min(MAX_BACKOFF));
            }
            pipe.held = match ack {
                Some(EntitiesAck::Held) => Some(sent),
                Some(EntitiesAck::NeedFull) | None => None,
                Some(EntitiesAck::Newer(theirs)) => {
                    // The replica holds a set stamped above this one: written under the same
                    // or a higher generation by an earlier hosting whose writes the majority
                    // read missed (it ended before this one started: one home at a time).
                    // This node hosts the shard now, so its set wins: continue above theirs,
                    // and every replica gets the whole set again.
                    if theirs > m.stamp {
                        let mut gens = self.set_gens.lock();
                        let last = gens.entry(shard).or_default();
                        *last = theirs.0.max(*last) + 1;
                        m.stamp = (*last, 0);
                        m.log.clear();
                        m.log_start = 0;
                        tracing::debug!(entity_type = %self.type_name, shard, ?theirs, "remembered set continues above an earlier hosting's");
                    }
                    None
                }
            };
            // The log is kept from the oldest position of this generation a replica holds
            // or is being sent: the next delta of each pipe starts there.
            let stamp = m.stamp;
            let oldest = m
                .pipes
                .values()
                .filter_map(|p| p.in_flight.or(p.held))
                .filter(|s| s.0 == stamp.0)
                .map(|s| s.1)
                .min();
            let keep_from = oldest.unwrap_or(m.stamp.1).max(m.log_start);
            m.log.drain(..(keep_from - m.log_start) as usize);
            m.log_start = keep_from;
        }
        self.settled.notify_waiters();
        if ack.is_none() {
            metrics::counter!(
                "shardik_sharding_remember_write_failures_total",
                "entity_type" => self.type_name.clone()
            )
            .increment(1);
            tracing::debug!(entity_type = %self.type_name, shard, ?target, "remembered entities not written; retried");
            // Retried by the resend tick, not at once: the replica may be down.
            return false;
        }
        true
    }
}

/// Every [`RESEND`], pumps every loaded shard: writes that failed are retried, new quorum
/// members get the sets. Ends with the [`Remember`] or the cluster.
async fn resend(remember: Weak<Remember>) {
    loop {
        tokio::time::sleep(RESEND).await;
        let Some(r) = remember.upgrade() else { return };
        if r.cluster.stopped().is_some() {
            return;
        }
        let shards: Vec<ShardId> = r
            .shards
            .lock()
            .iter()
            .filter(|(_, m)| m.loaded)
            .map(|(s, _)| *s)
            .collect();
        for shard in shards {
            r.pump(shard);
        }
    }
}

/// The set generation of a new hosting of a shard: its allocation's fencing token, unless
/// that is not above `floor` (the highest generation the majority read found or this node
/// used for the shard; then one more than `floor`).
///
/// A generation must name one hosting: two hostings writing different sets under one stamp
/// would each take the replica's `Held` for its own set, and a replica would keep the other
/// hosting's ids for good. Counting up from what the majority read found is not enough on
/// its own: that read races with the previous hosting's last writes (when a shard moves
/// quickly again, or the previous owner's writes reached only a minority), so two nodes can
/// count up to the same number. Fencing tokens are unique per allocation and grow with
/// every allocation of the entity type, so a newer hosting always writes above an older one.
/// The fallback covers a coordinator without tokens, a clock set back, and a shard hosted
/// again under the same allocation (when a fence is lifted), where this node's own floor
/// already holds the token.
fn set_generation(floor: u64, token: Option<FencingToken>) -> u64 {
    floor.saturating_add(1).max(token.unwrap_or(0))
}

/// Two replicas' sets of one shard as one: the newer stamp and every id of both. Sets only
/// grow, so an id an older set holds and the newer one lacks was written by a hosting whose
/// write to the newer set's replica is still on its way (or was cut off by a hand-off's
/// timeout): it stays remembered.
fn merged(a: EntitySet, b: EntitySet) -> EntitySet {
    let (mut big, small) = if a.ids.len() >= b.ids.len() {
        (a, b)
    } else {
        (b, a)
    };
    big.stamp = big.stamp.max(small.stamp);
    big.ids.extend(small.ids);
    big
}

#[cfg(test)]
mod tests {
    use super::{merged, set_generation};
    use crate::cluster::wire::EntitySet;

    fn set(stamp: (u64, u64), ids: &[&str]) -> EntitySet {
        EntitySet {
            stamp,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_majority_read_keeps_the_ids_of_every_set_it_got() {
        // The newer set (a later hosting's) lacks `x`, which an earlier hosting wrote to the
        // other replica after the later one read: `x` stays remembered.
        let older = set((3, 9), &["a", "x"]);
        let newer = set((5, 1), &["a", "b"]);
        assert_eq!(
            merged(older.clone(), newer.clone()),
            set((5, 1), &["a", "b", "x"])
        );
        assert_eq!(merged(newer, older), set((5, 1), &["a", "b", "x"]));
        assert_eq!(
            merged(EntitySet::default(), set((1, 0), &[])),
            set((1, 0), &[])
        );
    }

    #[test]
    fn a_hosting_writes_under_its_allocation_token() {
        // Two nodes that found the same sets (or none) still write under different
        // generations: their allocations' tokens.
        assert_eq!(
            set_generation(0, Some(1_700_000_000_000_001)),
            1_700_000_000_000_001
        );
        assert_eq!(
            set_generation(0, Some(1_700_000_000_000_002)),
            1_700_000_000_000_002
        );
        // A token at or below what was found (or used here before) is not reused.
        assert_eq!(set_generation(500, Some(500)), 501);
        assert_eq!(set_generation(500, Some(20)), 501);
        // No token (0 or none): one more than the floor.
        assert_eq!(set_generation(7, Some(0)), 8);
        assert_eq!(set_generation(7, None), 8);
        assert_eq!(set_generation(u64::MAX, None), u64::MAX);
    }
}
