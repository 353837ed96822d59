//! The replica endpoint: every node stores the latest coordinator state of every entity type
//! it was sent, so that a new coordinator can read it back from a majority.
//!
//! With a [`ShardingStateStore`] (see
//! [`ClusterSharding::with_state_store`](super::ClusterSharding::with_state_store)) every
//! accepted write is stored durably before it is acknowledged and before reads see it, and
//! the node loads what its store holds before it serves any request: a majority that
//! acknowledged a coordinator state still holds it after a full cluster restart.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use shardik_actor::ReplyTo;
use shardik_remote::Remote;

use super::entity_sets::{EntitySets, EntityWrite, Offer, SetKey};
use super::state_store::{
    decode, encode, RecordKey, ShardingRecord, ShardingStateStore, StateStoreError,
};
use super::wire::{decoder, EntitiesAck, EntitySet, ReplicaAck, ReplicaReq, REPLICA_PATH};
use crate::coordination::CoordinatorState;
use crate::hash::ShardId;

/// The durable side of a replica: the store and this node's id in it.
struct Durable {
    store: Arc<dyn ShardingStateStore>,
    node: String,
    /// The runtime the replica was loaded on: saves are spawned there, since a remembered
    /// entity's write may be offered from a thread outside any runtime (an entity told from
    /// a plain thread).
    runtime: tokio::runtime::Handle,
}

/// The coordinator states this node holds, by entity type name, and the remembered entity
/// sets by (type name, shard).
#[derive(Default)]
pub(crate) struct ReplicaStore {
    states: Mutex<HashMap<String, CoordinatorState>>,
    entities: Mutex<EntitySets>,
    durable: Option<Durable>,
    /// Serializes durable coordinator writes: each is checked against the state held and
    /// then stored, and a check must not pass on a state another write is replacing.
    durable_writes: tokio::sync::Mutex<()>,
}

/// A coordinator state's rank: epoch, then version.
type Rank = (u64, u64);

/// Whether this replica takes a write of `state` over `cur`, the state it holds.
///
/// A write never goes back: it must rank at least as high. And while a coordinator's
/// first write of its epoch (its `EpochStarted`) is not yet acknowledged by a majority, its
/// writes carry `base`, the rank of the state it recovered from: a replica that holds a
/// state of an older epoch ranked above `base` has taken a write since the new coordinator
/// read the majority (the previous coordinator, still at work), and refuses, so the new one
/// reads again instead of overwriting a change it never saw. Once a replica took the new
/// epoch it refuses the old coordinator's writes; so of the two, at most one gets a majority.
fn accepts(cur: Option<&CoordinatorState>, state: &CoordinatorState, base: Option<Rank>) -> bool {
    let Some(cur) = cur else { return true };
    let held = (cur.epoch, cur.version);
    if (state.epoch, state.version) < held {
        return false;
    }
    !(state.epoch > cur.epoch && base.is_some_and(|b| held > b))
}

impl ReplicaStore {
    /// A replica over `store` for node id `node`, holding what the store holds.
    pub(crate) async fn load(
        store: Arc<dyn ShardingStateStore>,
        node: &str,
    ) -> Result<ReplicaStore, StateStoreError> {
        let records = store.load_records(node).await.inspect_err(|e| {
            metrics::counter!("shardik_sharding_state_store_failures_total", "op" => "load")
                .increment(1);
            tracing::error!(node, "cannot load the sharding state: {e}");
        })?;
        let r = ReplicaStore {
            durable: Some(Durable {
                store,
                node: node.to_string(),
                runtime: tokio::runtime::Handle::current(),
            }),
            entities: Mutex::new(EntitySets::new(true)),
            ..ReplicaStore::default()
        };
        for rec in records {
            match rec.key {
                RecordKey::Coordinator { type_name } => {
                    let state: CoordinatorState = decode(&rec.bytes)?;
                    r.write(&type_name, state, None);
                }
                RecordKey::Entities { type_name, shard } => {
                    let set: EntitySet = decode(&rec.bytes)?;
                    r.entities.lock().load((type_name, shard), set);
                }
            }
        }
        tracing::debug!(
            node,
            types = r.states.lock().len(),
            shards = r.entities.lock().len(),
            "sharding state loaded"
        );
        Ok(r)
    }

    /// Whether writes go to a durable store (and so complete asynchronously).
    pub(crate) fn is_durable(&self) -> bool {
        self.durable.is_some()
    }

    /// Stores `state` in memory unless the stored one is newer (a higher epoch, or the same
    /// epoch and a higher version), or changed since the writer's `base` was read (see
    /// [`accepts`]). A coordinator fenced off by a newer one is refused here, so it never
    /// gathers a majority again. Without a store this is the whole write.
    pub(crate) fn write(
        &self,
        type_name: &str,
        state: CoordinatorState,
        base: Option<Rank>,
    ) -> ReplicaAck {
        let mut states = self.states.lock();
        let accepted = accepts(states.get(type_name), &state, base);
        if accepted {
            states.insert(type_name.to_string(), state);
        }
        let cur = &states[type_name];
        ReplicaAck {
            accepted,
            epoch: cur.epoch,
            version: cur.version,
        }
    }

    /// [`write`](Self::write), first storing `state` durably if this replica has a store.
    /// `None` (no acknowledgement: the writer retries) if the store failed, or kept a newer
    /// record that this replica's memory does not show yet.
    pub(crate) async fn write_durable(
        &self,
        type_name: &str,
        state: CoordinatorState,
        base: Option<Rank>,
    ) -> Option<ReplicaAck> {
        let Some(d) = &self.durable else {
            return Some(self.write(type_name, state, base));
        };
        let _one_at_a_time = self.durable_writes.lock().await;
        let rank = (state.epoch, state.version);
        if let Some(refused) = self.refusal(type_name, &state, base) {
            return Some(refused);
        }
        let record = encode(&state).map(|bytes| ShardingRecord {
            key: RecordKey::Coordinator {
                type_name: type_name.to_string(),
            },
            rank,
            bytes,
        });
        let saved = match record {
            Ok(record) => d.store.save_record(&d.node, &record).await,
            Err(e) => Err(e),
        };
        match saved {
            Ok(true) => Some(self.write(type_name, state, base)),
            Ok(false) => self.refusal(type_name, &state, None),
            Err(e) => {
                store_failed(type_name, &e);
                None
            }
        }
    }

    /// The refusal of a write of `state` if the state held does not take it (see
    /// [`accepts`]).
    fn refusal(
        &self,
        type_name: &str,
        state: &CoordinatorState,
        base: Option<Rank>,
    ) -> Option<ReplicaAck> {
        let states = self.states.lock();
        let cur = states.get(type_name)?;
        (!accepts(Some(cur), state, base)).then_some(ReplicaAck {
            accepted: false,
            epoch: cur.epoch,
            version: cur.version,
        })
    }

    /// The stored state of a type.
    pub(crate) fn read(&self, type_name: &str) -> Option<CoordinatorState> {
        self.states.lock().get(type_name).cloned()
    }

    /// Applies a write of a shard's remembered entities (see [`EntitySets`]): answered now,
    /// or (with a durable store) once a save covering it ends, the answer's sender dropped if
    /// that save fails. Starts the shard's save loop if it needs one.
    pub(crate) fn offer_entities(
        self: &Arc<Self>,
        type_name: &str,
        shard: ShardId,
        write: EntityWrite,
    ) -> Offer {
        let key = (type_name.to_string(), shard);
        let offer = self.entities.lock().offer(key.clone(), write);
        if let Offer::Pending {
            start_saving: true, ..
        } = &offer
        {
            // Only a durable replica answers later (`Pending`).
            if let Some(durable) = &self.durable {
                let me = self.clone();
                durable
                    .runtime
                    .spawn(async move { me.save_entities(key).await });
            }
        }
        offer
    }

    /// The save loop of one shard's set: stores the newest accepted set until no newer one
    /// is waiting. One runs per shard at a time.
    async fn save_entities(&self, key: SetKey) {
        let Some(d) = &self.durable else { return };
        loop {
            let Some(set) = self.entities.lock().next_save(&key) else {
                return;
            };
            let saved = match encode(&set) {
                Ok(bytes) => {
                    let record = ShardingRecord {
                        key: RecordKey::Entities {
                            type_name: key.0.clone(),
                            shard: key.1,
                        },
                        rank: set.stamp,
                        bytes,
                    };
                    d.store.save_record(&d.node, &record).await
                }
                Err(e) => Err(e),
            };
            // `Ok(false)`: the store holds a newer record than this set, so it is not lost.
            let stored = match saved {
                Ok(_) => true,
                Err(e) => {
                    store_failed(&key.0, &e);
                    false
                }
            };
            self.entities.lock().saved(&key, set, stored);
        }
    }

    /// The remembered entities of a shard.
    pub(crate) fn read_entities(&self, type_name: &str, shard: ShardId) -> Option<EntitySet> {
        self.entities.lock().read(&(type_name.to_string(), shard))
    }

    /// Every remembered entity id of a type this replica holds.
    pub(crate) fn remembered(&self, type_name: &str) -> BTreeSet<String> {
        self.entities
            .lock()
            .of_type(type_name)
            .flat_map(|s| s.ids.iter().cloned())
            .collect()
    }

    /// How many remembered entity ids of a type this replica holds.
    pub(crate) fn remembered_count(&self, type_name: &str) -> usize {
        self.entities
            .lock()
            .of_type(type_name)
            .map(|s| s.ids.len())
            .sum()
    }

    /// Applies an owner's write received over the network and answers it; no answer if the
    /// durable store failed (the owner's ask fails and it writes the whole set again later).
    fn answer_entities(
        self: &Arc<Self>,
        type_name: String,
        shard: ShardId,
        write: EntityWrite,
        reply: ReplyTo<EntitiesAck>,
    ) {
        match self.offer_entities(&type_name, shard, write) {
            Offer::Ready(ack) => reply.reply(ack),
            Offer::Pending { answer, .. } => {
                tokio::spawn(async move {
                    if let Ok(ack) = answer.await {
                        reply.reply(ack);
                    }
                });
            }
        }
    }

    /// Serves [`REPLICA_PATH`] on `remote`.
    pub(crate) fn serve(self: &Arc<Self>, remote: &Remote) {
        let me = self.clone();
        remote.register_decoder(
            REPLICA_PATH,
            decoder(move |req: ReplicaReq| match req {
                ReplicaReq::Write {
                    type_name,
                    state,
                    base,
                    reply,
                } => {
                    if me.is_durable() {
                        let me = me.clone();
                        tokio::spawn(async move {
                            if let Some(ack) = me.write_durable(&type_name, state, base).await {
                                reply.reply(ack);
                            }
                        });
                    } else {
                        reply.reply(me.write(&type_name, state, base));
                    }
                }
                ReplicaReq::Read { type_name, reply } => reply.reply(me.read(&type_name)),
                ReplicaReq::WriteEntities {
                    type_name,
                    shard,
                    set,
                    reply,
                } => me.answer_entities(type_name, shard, EntityWrite::Full(set), reply),
                ReplicaReq::AddEntities {
                    type_name,
                    shard,
                    delta,
                    reply,
                } => me.answer_entities(type_name, shard, EntityWrite::Delta(delta), reply),
                ReplicaReq::ReadEntities {
                    type_name,
                    shard,
                    reply,
                } => reply.reply(me.read_entities(&type_name, shard)),
            }),
        );
    }
}

/// A durable write failed: logged at error level and counted; never acknowledged.
fn store_failed(type_name: &str, e: &StateStoreError) {
    metrics::counter!("shardik_sharding_state_store_failures_total", "op" => "save").increment(1);
    tracing::error!(entity_type = %type_name, "sharding state not stored (not acknowledged): {e}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(epoch: u64, version: u64) -> CoordinatorState {
        let mut s = CoordinatorState::new(10);
        s.epoch = epoch;
        s.version = version;
        s
    }

    #[test]
    fn newer_epoch_wins_and_fences_older_writers() {
        let r = ReplicaStore::default();
        assert!(r.write("t", state(1, 5), None).accepted);
        assert!(!r.write("t", state(1, 4), None).accepted);
        // A new coordinator that recovered from an older majority copy still wins.
        assert!(r.write("t", state(2, 4), None).accepted);
        let ack = r.write("t", state(1, 9), None);
        assert!(!ack.accepted);
        assert_eq!((ack.epoch, ack.version), (2, 4));
        assert_eq!(r.read("t").unwrap().version, 4);
        assert!(r.read("other").is_none());
    }

    /// A takeover (epoch 2) that read the majority at (1, 5): a replica that has taken the
    /// old coordinator's (1, 6) since refuses it, so it cannot overwrite a change it never saw;
    /// one that took the takeover first refuses the old coordinator from then on.
    #[test]
    fn a_takeover_is_refused_where_the_state_moved_on_since_its_read() {
        let moved = ReplicaStore::default();
        assert!(moved.write("t", state(1, 5), None).accepted);
        assert!(
            moved.write("t", state(1, 6), None).accepted,
            "the old coordinator"
        );
        let ack = moved.write("t", state(2, 6), Some((1, 5)));
        assert!(!ack.accepted);
        assert_eq!((ack.epoch, ack.version), (1, 6), "tells what it holds");
        // A replica that lags behind the base takes it.
        let behind = ReplicaStore::default();
        assert!(behind.write("t", state(1, 3), None).accepted);
        assert!(behind.write("t", state(2, 6), Some((1, 5))).accepted);
        assert!(
            !behind.write("t", state(1, 6), None).accepted,
            "the old one is fenced"
        );
        // Its later writes in the new epoch need no base; once at a majority the new
        // coordinator stops sending one, and a replica left on the old epoch then takes it.
        assert!(behind.write("t", state(2, 7), Some((1, 5))).accepted);
        assert!(moved.write("t", state(2, 8), None).accepted);
        // An empty replica takes anything.
        assert!(
            ReplicaStore::default()
                .write("t", state(2, 6), Some((1, 5)))
                .accepted
        );
    }

    /// The race a takeover must not lose: the new coordinator reads a majority, the old one
    /// (still at work) gets its next change to a majority, then the new one writes its epoch
    /// start. Whichever order the writes reach the three replicas in, at most one of the two
    /// gets a majority, and a re-read after a lost race sees the old one's change.
    #[test]
    fn of_an_old_and_a_new_coordinator_at_most_one_gets_a_majority() {
        let takes = |rs: &[ReplicaStore], w: (u64, u64), base: Option<(u64, u64)>| {
            rs.iter()
                .filter(|r| r.write("t", state(w.0, w.1), base).accepted)
                .count()
        };
        let fresh = || -> Vec<ReplicaStore> {
            let rs: Vec<_> = (0..3).map(|_| ReplicaStore::default()).collect();
            assert_eq!(takes(&rs, (1, 5), None), 3);
            rs
        };
        // The old coordinator's change lands first (on replicas 1 and 2): it is committed, and
        // the takeover that read (1, 5) is refused by both, keeping one replica of three.
        let rs = fresh();
        assert_eq!(takes(&rs[1..], (1, 6), None), 2);
        assert_eq!(
            takes(&rs, (2, 6), Some((1, 5))),
            1,
            "no majority for the takeover"
        );
        let reread = rs[1..]
            .iter()
            .filter_map(|r| r.read("t"))
            .max_by_key(|s| s.version);
        assert_eq!(reread.map(|s| (s.epoch, s.version)), Some((1, 6)));
        // The next takeover, from it, gets the two; replica 0 holds the lost takeover's
        // epoch start, ranked above this base, and is written to once the epoch is at a
        // majority (without a base).
        assert_eq!(
            takes(&rs, (3, 7), Some((1, 6))),
            2,
            "the next takeover, from it"
        );
        assert_eq!(takes(&rs[..1], (3, 8), None), 1);
        // The takeover lands first (on replicas 0 and 1): the old change then reaches only
        // replica 2.
        let rs = fresh();
        assert_eq!(takes(&rs[..2], (2, 6), Some((1, 5))), 2);
        assert_eq!(
            takes(&rs[1..], (1, 6), None),
            1,
            "no majority for the old coordinator"
        );
    }
}

#[cfg(test)]
mod durable_tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::super::state_store::{replaces, StateStoreFuture};
    use super::*;

    /// A store in memory that fails every operation while `fail` is set.
    #[derive(Default)]
    struct TestStore {
        records: Mutex<HashMap<(String, RecordKey), ShardingRecord>>,
        fail: AtomicBool,
    }

    impl ShardingStateStore for TestStore {
        fn save_record<'a>(
            &'a self,
            node: &'a str,
            record: &'a ShardingRecord,
        ) -> StateStoreFuture<'a, bool> {
            Box::pin(async move {
                if self.fail.load(Ordering::SeqCst) {
                    return Err(StateStoreError("injected".into()));
                }
                let mut r = self.records.lock();
                let key = (node.to_string(), record.key.clone());
                if r.get(&key)
                    .is_some_and(|cur| !replaces(record.rank, cur.rank))
                {
                    return Ok(false);
                }
                r.insert(key, record.clone());
                Ok(true)
            })
        }

        fn load_records<'a>(&'a self, node: &'a str) -> StateStoreFuture<'a, Vec<ShardingRecord>> {
            Box::pin(async move {
                if self.fail.load(Ordering::SeqCst) {
                    return Err(StateStoreError("injected".into()));
                }
                Ok(self
                    .records
                    .lock()
                    .iter()
                    .filter(|((n, _), _)| n == node)
                    .map(|(_, r)| r.clone())
                    .collect())
            })
        }
    }

    fn state(epoch: u64, version: u64) -> CoordinatorState {
        let mut s = CoordinatorState::new(10);
        s.epoch = epoch;
        s.version = version;
        s
    }

    fn set(stamp: (u64, u64), ids: &[&str]) -> EntitySet {
        EntitySet {
            stamp,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[tokio::test]
    async fn acknowledged_writes_survive_a_reload_and_failed_ones_are_not_acknowledged() {
        let store = Arc::new(TestStore::default());
        let r = ReplicaStore::load(store.clone(), "n1").await.unwrap();
        assert!(r.is_durable());
        let ack = r.write_durable("t", state(1, 3), None).await.unwrap();
        assert!(ack.accepted);
        // Refused by the newer-wins rule without touching the store.
        store.fail.store(true, Ordering::SeqCst);
        let ack = r.write_durable("t", state(1, 2), None).await.unwrap();
        assert!(!ack.accepted);
        assert_eq!((ack.epoch, ack.version), (1, 3));
        // A failing store: no acknowledgement, and reads do not see the state.
        assert_eq!(r.write_durable("t", state(1, 4), None).await, None);
        assert_eq!(r.read("t").unwrap().version, 3);
        store.fail.store(false, Ordering::SeqCst);
        // The writer's retry succeeds.
        assert!(
            r.write_durable("t", state(1, 4), None)
                .await
                .unwrap()
                .accepted
        );

        // Another node id in the same store sees nothing of n1's.
        let other = ReplicaStore::load(store.clone(), "n2").await.unwrap();
        assert!(other.read("t").is_none());
        // A new process of n1 finds what was acknowledged.
        let again = ReplicaStore::load(store.clone(), "n1").await.unwrap();
        assert_eq!(again.read("t"), Some(state(1, 4)));
        // A failing load is an error, not an empty replica.
        store.fail.store(true, Ordering::SeqCst);
        assert!(ReplicaStore::load(store, "n1").await.is_err());
    }

    /// Applies `write` and waits for its answer; `None` if it was not stored.
    async fn write_entities(
        r: &Arc<ReplicaStore>,
        type_name: &str,
        shard: ShardId,
        write: EntityWrite,
    ) -> Option<EntitiesAck> {
        match r.offer_entities(type_name, shard, write) {
            Offer::Ready(ack) => Some(ack),
            Offer::Pending { answer, .. } => answer.await.ok(),
        }
    }

    #[tokio::test]
    async fn entity_sets_are_stored_newest_first_and_reloaded() {
        let store = Arc::new(TestStore::default());
        let r = Arc::new(ReplicaStore::load(store.clone(), "n1").await.unwrap());
        let full = |stamp, ids: &[&str]| EntityWrite::Full(set(stamp, ids));
        // Writes of one shard while its save runs: coalesced, each answered once a save
        // covering it ended; the older one (1, 2) is refused at once (a newer set is
        // accepted).
        let (a, b, c, d) = tokio::join!(
            write_entities(&r, "t", 3, full((1, 1), &["a"])),
            write_entities(&r, "t", 3, full((1, 3), &["a", "b", "c"])),
            write_entities(&r, "t", 3, full((1, 2), &["a", "b"])),
            write_entities(&r, "t", 4, full((2, 1), &["x"])),
        );
        for ack in [a, b, d] {
            assert_eq!(ack, Some(EntitiesAck::Held));
        }
        assert_eq!(c, Some(EntitiesAck::Newer((1, 3))));
        let rank = |shard| {
            store
                .records
                .lock()
                .get(&(
                    "n1".to_string(),
                    RecordKey::Entities {
                        type_name: "t".into(),
                        shard,
                    },
                ))
                .map(|r| r.rank)
        };
        assert_eq!((rank(3), rank(4)), (Some((1, 3)), Some((2, 1))));
        // A delta on the saved set.
        let delta = EntityWrite::Delta(super::super::wire::EntityDelta {
            base: (1, 3),
            stamp: (1, 4),
            ids: vec!["d".into()],
        });
        assert_eq!(
            write_entities(&r, "t", 3, delta).await,
            Some(EntitiesAck::Held)
        );
        // A failing store: not acknowledged, and reads keep the saved set.
        store.fail.store(true, Ordering::SeqCst);
        assert_eq!(write_entities(&r, "t", 3, full((1, 5), &["e"])).await, None);
        assert_eq!(r.read_entities("t", 3).unwrap().stamp, (1, 4));
        store.fail.store(false, Ordering::SeqCst);

        let again = ReplicaStore::load(store, "n1").await.unwrap();
        assert_eq!(
            again.read_entities("t", 3),
            Some(set((1, 4), &["a", "b", "c", "d"]))
        );
        assert_eq!(again.remembered("t").len(), 5);
        assert_eq!(again.remembered_count("t"), 5);
    }
}
