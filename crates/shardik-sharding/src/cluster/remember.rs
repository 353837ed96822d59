//! Remember entities: the ids of the entities started in each hosted shard are written to the
//! replicas of the type's quorum members, and a new home of a shard reads them back from a
//! majority and starts those entities at once.
//!
//! Per shard, the owner is the single writer (a shard has one home at a time). Each set
//! carries a stamp (owner generation, write number); a new owner reads a majority, takes the
//! set with the highest stamp and continues with the next generation, so a replica never
//! takes an older owner's set over a newer one's. Writes are sent to every quorum member
//! without waiting: a write lost (connection down) is repaired by the next write of the
//! shard (every new entity of the shard writes the whole set again).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shardik_cluster::member::UniqueAddress;
use shardik_cluster::runtime::Cluster;

use super::membership::{majority, quorum_members};
use super::replica::ReplicaStore;
use super::wire::{EntitySet, ReplicaReq, REPLICA_PATH};
use crate::hash::ShardId;

/// Starts an entity of a hosted shard without a message.
pub(crate) type StartEntity = Arc<dyn Fn(ShardId, &str) + Send + Sync>;

struct ShardMem {
    /// Bumped every time the shard starts being hosted here (a stale read is ignored).
    gen: u64,
    /// The majority read is done: `stamp` continues the newest set.
    loaded: bool,
    stamp: (u64, u64),
    ids: BTreeSet<String>,
}

pub(crate) struct Remember {
    pub(crate) type_name: String,
    pub(crate) cluster: Cluster,
    pub(crate) replicas: Arc<ReplicaStore>,
    pub(crate) role: Option<String>,
    pub(crate) timeout: Duration,
    /// Fewer quorum members than this: no read counts as a majority (`min_quorum`).
    pub(crate) min_quorum: usize,
    pub(crate) start: StartEntity,
    shards: Mutex<HashMap<ShardId, ShardMem>>,
    next_gen: Mutex<u64>,
}

impl Remember {
    pub(crate) fn new(
        type_name: &str,
        cluster: &Cluster,
        replicas: Arc<ReplicaStore>,
        role: Option<String>,
        timeout: Duration,
        min_quorum: usize,
        start: StartEntity,
    ) -> Arc<Self> {
        Arc::new(Remember {
            type_name: type_name.to_string(),
            cluster: cluster.clone(),
            replicas,
            role,
            timeout,
            min_quorum,
            start,
            shards: Mutex::new(HashMap::new()),
            next_gen: Mutex::new(0),
        })
    }

    /// An entity message was delivered to a hosted shard: remember its id.
    pub(crate) fn delivered(&self, shard: ShardId, id: &str) {
        let write = {
            let mut shards = self.shards.lock();
            let Some(m) = shards.get_mut(&shard) else {
                return;
            };
            if m.ids.contains(id) {
                return;
            }
            m.ids.insert(id.to_string());
            m.loaded.then(|| next_set(m))
        };
        if let Some(set) = write {
            self.write(shard, set);
        }
    }

    /// The shard is hosted here from now on: read its remembered ids from a majority, start
    /// those entities, and continue the set.
    pub(crate) fn shard_started(self: &Arc<Self>, shard: ShardId) {
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
                stamp: (0, 0),
                ids: BTreeSet::new(),
            },
        );
        let me = self.clone();
        tokio::spawn(async move { me.load(shard, gen).await });
    }

    /// The shard is no longer hosted here (its entities stop): stop tracking it.
    pub(crate) fn shard_stopped(&self, shard: ShardId) {
        self.shards.lock().remove(&shard);
    }

    async fn load(self: Arc<Self>, shard: ShardId, gen: u64) {
        let best = loop {
            if let Some(best) = self.read_majority(shard).await {
                break best;
            }
            if !self.tracking(shard, gen) || self.cluster.stopped().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (set, to_start) = {
            let mut shards = self.shards.lock();
            let Some(m) = shards.get_mut(&shard).filter(|m| m.gen == gen) else {
                return;
            };
            let to_start: Vec<String> = best.ids.iter().cloned().collect();
            m.ids.extend(best.ids);
            m.stamp = (best.stamp.0 + 1, 0);
            m.loaded = true;
            (next_set(m), to_start)
        };
        if !to_start.is_empty() {
            tracing::debug!(entity_type = %self.type_name, shard, entities = to_start.len(), "starting remembered entities");
        }
        for id in &to_start {
            // Under the lock `shard_stopped` takes before the region stops the shard: an
            // entity is started either before the stop (which then stops it too) or not at all.
            let shards = self.shards.lock();
            if shards.get(&shard).is_none_or(|m| m.gen != gen) {
                return;
            }
            (self.start)(shard, id);
        }
        self.write(shard, set);
    }

    fn tracking(&self, shard: ShardId, gen: u64) -> bool {
        self.shards.lock().get(&shard).is_some_and(|m| m.gen == gen)
    }

    /// The newest set of `shard` among a majority of the quorum's replicas, or `None` if a
    /// majority did not answer within the timeout.
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
                best = newest(best, s);
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
                        best = newest(best, s);
                    }
                }
                Some(_) => {}
                None => return None,
            }
        }
        Some(best)
    }

    fn write(&self, shard: ShardId, set: EntitySet) {
        let state = self.cluster.state();
        let me: UniqueAddress = self.cluster.self_node().clone();
        for node in quorum_members(&state, self.role.as_deref()) {
            if node == me {
                continue;
            }
            let r = self
                .cluster
                .remote()
                .lookup::<ReplicaReq>(REPLICA_PATH, &node.address);
            let _ = r.try_tell_control(ReplicaReq::WriteEntities {
                type_name: self.type_name.clone(),
                shard,
                set: set.clone(),
            });
        }
        self.replicas.write_entities(&self.type_name, shard, set);
    }
}

fn next_set(m: &mut ShardMem) -> EntitySet {
    m.stamp.1 += 1;
    EntitySet {
        stamp: m.stamp,
        ids: m.ids.clone(),
    }
}

fn newest(a: EntitySet, b: EntitySet) -> EntitySet {
    if b.stamp > a.stamp {
        b
    } else {
        a
    }
}
