//! The replica endpoint: every node stores the latest coordinator state of every entity type
//! it was sent, so that a new coordinator can read it back from a majority.
//!
//! With a [`ShardingStateStore`] (see
//! [`ClusterSharding::with_state_store`](super::ClusterSharding::with_state_store)) every
//! accepted write is stored durably before it is acknowledged and before reads see it, and
//! the node loads what its store holds before it serves any request: a majority that
//! acknowledged a coordinator state still holds it after a full cluster restart.
//!
//! A save that has not answered within [`STORE_TIMEOUT`] counts as failed (nothing is
//! acknowledged; the writer retries): a store that hangs must not hold a type's writes, or a
//! shard's saves, for good. (The node's load at start has no such limit: it reads everything
//! the node holds, and the node cannot serve before it.)

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shardik_actor::ReplyTo;
use shardik_remote::Remote;

use super::entity_sets::{EntitySets, EntityWrite, Offer, SetKey};
use super::state_store::{
    decode, encode, RecordKey, ShardingRecord, ShardingStateStore, StateStoreError,
    StateStoreFuture,
};
use super::wire::{
    decoder, EntitiesAck, EntitySet, PromiseAck, ReplicaAck, ReplicaReq, REPLICA_PATH,
};
use crate::coordination::{CoordinatorState, Epoch};
use crate::hash::ShardId;

/// How long a save to the [`ShardingStateStore`] may take before it counts as failed. A save
/// that lands later is harmless: it was never acknowledged, so no majority relied on it, and
/// records replace only lower (or equal) ranks, so it cannot undo a newer record; at most
/// the store then holds a write this replica refused to acknowledge (a restart loads it, as
/// if it had been acknowledged and outbid).
pub(crate) const STORE_TIMEOUT: Duration = Duration::from_secs(30);

/// The save `call`, failed if it has not answered within [`STORE_TIMEOUT`].
async fn save_within_timeout(call: StateStoreFuture<'_, bool>) -> Result<bool, StateStoreError> {
    tokio::time::timeout(STORE_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(StateStoreError(format!(
                "no answer to a save within {STORE_TIMEOUT:?}"
            )))
        })
}

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
    types: Mutex<HashMap<String, TypeReplica>>,
    entities: Mutex<EntitySets>,
    durable: Option<Durable>,
    /// Serializes the durable coordinator writes and promises of each type: each is checked
    /// against what the replica holds and then stored, and a check must not pass on a state
    /// or promise that another one is replacing.
    durable_ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What a replica holds for the coordinator of one entity type.
#[derive(Default)]
struct TypeReplica {
    /// The newest state accepted.
    state: Option<CoordinatorState>,
    /// The highest epoch promised to a coordinator that is taking over (see
    /// [`ReplicaStore::promise`]): writes of older epochs are refused.
    promised: Epoch,
}

impl TypeReplica {
    /// Whether a write of `state` is taken: not older (by epoch, then version) than the
    /// state held, and not of an epoch older than the one promised.
    fn accepts(&self, state: &CoordinatorState) -> bool {
        state.epoch >= self.promised
            && self
                .state
                .as_ref()
                .is_none_or(|c| (state.epoch, state.version) >= (c.epoch, c.version))
    }

    /// Whether a coordinator taking over with `epoch` gets this replica's promise: above
    /// the epoch of the state held (a state is written by one epoch's coordinator only) and
    /// above every earlier promise. An epoch is promised once: every takeover attempt picks
    /// a new one, so a second request for a promised epoch comes from another node whose
    /// tag collided (see [`next_epoch`](crate::coordination::next_epoch)), and granting both
    /// could give both a majority.
    fn grants(&self, epoch: Epoch) -> bool {
        epoch > self.promised && self.state.as_ref().is_none_or(|c| epoch > c.epoch)
    }

    /// The highest epoch this replica knows of.
    fn highest(&self) -> Epoch {
        self.promised
            .max(self.state.as_ref().map_or(0, |c| c.epoch))
    }

    fn ack(&self, accepted: bool) -> ReplicaAck {
        ReplicaAck {
            accepted,
            epoch: self.highest(),
            version: self.state.as_ref().map_or(0, |c| c.version),
        }
    }

    fn promise_ack(&self, granted: bool) -> PromiseAck {
        PromiseAck {
            granted,
            promised: self.highest(),
            state: self.state.clone(),
        }
    }
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
                // Set as stored, in whatever order the store returns the records: a state
                // replayed through `write` would be refused under a promise loaded first.
                RecordKey::Coordinator { type_name } => {
                    let state: CoordinatorState = decode(&rec.bytes)?;
                    let mut types = r.types.lock();
                    let t = types.entry(type_name).or_default();
                    if t.state
                        .as_ref()
                        .is_none_or(|c| (state.epoch, state.version) > (c.epoch, c.version))
                    {
                        t.state = Some(state);
                    }
                }
                RecordKey::Promise { type_name } => {
                    let epoch: Epoch = decode(&rec.bytes)?;
                    let mut types = r.types.lock();
                    let t = types.entry(type_name).or_default();
                    t.promised = t.promised.max(epoch);
                }
                RecordKey::Entities { type_name, shard } => {
                    let set: EntitySet = decode(&rec.bytes)?;
                    r.entities.lock().load((type_name, shard), set);
                }
            }
        }
        tracing::debug!(
            node,
            types = r.types.lock().len(),
            shards = r.entities.lock().len(),
            "sharding state loaded"
        );
        Ok(r)
    }

    /// Whether writes go to a durable store (and so complete asynchronously).
    pub(crate) fn is_durable(&self) -> bool {
        self.durable.is_some()
    }

    /// Stores `state` in memory unless the replica holds a newer one (a higher epoch, or
    /// the same epoch and a higher version) or promised a newer epoch. A coordinator fenced off
    /// by a newer one is refused here, so it never gathers a majority again; the answer
    /// carries the highest epoch known here. Without a store this is the whole write.
    pub(crate) fn write(&self, type_name: &str, state: CoordinatorState) -> ReplicaAck {
        let mut types = self.types.lock();
        let t = types.entry(type_name.to_string()).or_default();
        let accepted = t.accepts(&state);
        if accepted {
            t.state = Some(state);
        }
        t.ack(accepted)
    }

    /// Promises a coordinator taking over with `epoch` to refuse every write of an older
    /// epoch from now on, if no newer epoch was promised or written here, and answers with
    /// the state held (the read of a takeover: Paxos' first phase). A takeover reads a
    /// majority this way, so of a change the previous coordinator gets to a majority and the
    /// new coordinator's read, one comes first at some replica both majorities share: the
    /// change is in what the new coordinator reads, or the change never reaches its majority.
    pub(crate) fn promise(&self, type_name: &str, epoch: Epoch) -> PromiseAck {
        let mut types = self.types.lock();
        let t = types.entry(type_name.to_string()).or_default();
        let granted = t.grants(epoch);
        if granted {
            t.promised = epoch;
        }
        t.promise_ack(granted)
    }

    /// The highest epoch promised or written here for `type_name` (0 if none).
    pub(crate) fn highest_epoch(&self, type_name: &str) -> Epoch {
        self.types
            .lock()
            .get(type_name)
            .map_or(0, TypeReplica::highest)
    }

    /// The lock that serializes the durable operations of one type.
    fn durable_lock(&self, type_name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.durable_ops
            .lock()
            .entry(type_name.to_string())
            .or_default()
            .clone()
    }

    /// [`write`](Self::write), first storing `state` durably if this replica has a store.
    /// `None` (no acknowledgement: the writer retries) if the store failed, or kept a newer
    /// record that this replica's memory does not show yet.
    pub(crate) async fn write_durable(
        &self,
        type_name: &str,
        state: CoordinatorState,
    ) -> Option<ReplicaAck> {
        let Some(d) = &self.durable else {
            return Some(self.write(type_name, state));
        };
        let lock = self.durable_lock(type_name);
        let _one_at_a_time = lock.lock().await;
        if let Some(refused) = self.refusal(type_name, &state) {
            return Some(refused);
        }
        let record = encode(&state).map(|bytes| ShardingRecord {
            key: RecordKey::Coordinator {
                type_name: type_name.to_string(),
            },
            rank: (state.epoch, state.version),
            bytes,
        });
        let saved = match record {
            Ok(record) => save_within_timeout(d.store.save_record(&d.node, &record)).await,
            Err(e) => Err(e),
        };
        match saved {
            Ok(true) => Some(self.write(type_name, state)),
            Ok(false) => self.refusal(type_name, &state),
            Err(e) => {
                store_failed(type_name, &e);
                None
            }
        }
    }

    /// [`promise`](Self::promise), first storing the promise durably if this replica has a
    /// store (a replica that restarts must not forget it). `None` (no answer: the
    /// coordinator asks again) if the store failed.
    pub(crate) async fn promise_durable(
        &self,
        type_name: &str,
        epoch: Epoch,
    ) -> Option<PromiseAck> {
        let Some(d) = &self.durable else {
            return Some(self.promise(type_name, epoch));
        };
        let lock = self.durable_lock(type_name);
        let _one_at_a_time = lock.lock().await;
        {
            let types = self.types.lock();
            if let Some(t) = types.get(type_name).filter(|t| !t.grants(epoch)) {
                return Some(t.promise_ack(false));
            }
        }
        let record = encode(&epoch).map(|bytes| ShardingRecord {
            key: RecordKey::Promise {
                type_name: type_name.to_string(),
            },
            rank: (epoch, 0),
            bytes,
        });
        let saved = match record {
            Ok(record) => save_within_timeout(d.store.save_record(&d.node, &record)).await,
            Err(e) => Err(e),
        };
        match saved {
            Ok(true) => Some(self.promise(type_name, epoch)),
            // The store holds a higher promise this replica's memory does not show yet.
            Ok(false) => Some(PromiseAck {
                granted: false,
                promised: epoch.max(self.highest_epoch(type_name)),
                state: self.read(type_name),
            }),
            Err(e) => {
                store_failed(type_name, &e);
                None
            }
        }
    }

    /// The refusal of a write of `state` if this replica does not take it.
    fn refusal(&self, type_name: &str, state: &CoordinatorState) -> Option<ReplicaAck> {
        let types = self.types.lock();
        let t = types.get(type_name)?;
        (!t.accepts(state)).then(|| t.ack(false))
    }

    /// The stored state of a type.
    pub(crate) fn read(&self, type_name: &str) -> Option<CoordinatorState> {
        self.types
            .lock()
            .get(type_name)
            .and_then(|t| t.state.clone())
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
                    save_within_timeout(d.store.save_record(&d.node, &record)).await
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
                    reply,
                } => {
                    if me.is_durable() {
                        let me = me.clone();
                        tokio::spawn(async move {
                            if let Some(ack) = me.write_durable(&type_name, state).await {
                                reply.reply(ack);
                            }
                        });
                    } else {
                        reply.reply(me.write(&type_name, state));
                    }
                }
                ReplicaReq::Read { type_name, reply } => reply.reply(me.read(&type_name)),
                ReplicaReq::Promise {
                    type_name,
                    epoch,
                    reply,
                } => {
                    if me.is_durable() {
                        let me = me.clone();
                        tokio::spawn(async move {
                            if let Some(ack) = me.promise_durable(&type_name, epoch).await {
                                reply.reply(ack);
                            }
                        });
                    } else {
                        reply.reply(me.promise(&type_name, epoch));
                    }
                }
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
        assert!(r.write("t", state(1, 5)).accepted);
        assert!(!r.write("t", state(1, 4)).accepted);
        // A new coordinator that recovered from an older majority copy still wins.
        assert!(r.write("t", state(2, 4)).accepted);
        let ack = r.write("t", state(1, 9));
        assert!(!ack.accepted);
        assert_eq!((ack.epoch, ack.version), (2, 4));
        assert_eq!(r.read("t").unwrap().version, 4);
        assert!(r.read("other").is_none());
    }

    /// A takeover's promise: granted above every epoch promised or written here, it makes
    /// the replica refuse the older epochs' writes; refused, it tells the highest epoch known.
    #[test]
    fn a_promise_fences_older_epochs_and_is_refused_below_a_newer_one() {
        let r = ReplicaStore::default();
        assert!(r.write("t", state(1, 5)).accepted);
        let ack = r.promise("t", 3);
        assert!(ack.granted);
        assert_eq!(
            ack.state.map(|s| (s.epoch, s.version)),
            Some((1, 5)),
            "reads the state"
        );
        let ack = r.write("t", state(1, 6));
        assert!(
            !ack.accepted,
            "the old coordinator is refused after the promise"
        );
        assert_eq!(ack.epoch, 3, "and told of the promise");
        assert!(!r.promise("t", 2).granted, "a lower takeover is refused");
        assert_eq!(r.promise("t", 2).promised, 3);
        assert!(
            r.write("t", state(3, 6)).accepted,
            "the promised epoch writes"
        );
        assert!(
            !r.promise("t", 3).granted,
            "an epoch that wrote here cannot be promised again"
        );
        assert_eq!(r.highest_epoch("t"), 3);
        assert_eq!(r.highest_epoch("other"), 0);
    }

    /// Two nodes whose epoch tags collide take over at once with the same epoch. Whatever
    /// order each of three replicas sees their promise requests in (also with a replica that
    /// already holds a state of that epoch), at most one of them gathers a majority, so two
    /// coordinators never recover from the same epoch. With the same epoch granted twice, as
    /// before, both got all three.
    #[test]
    fn two_takeovers_with_one_epoch_never_both_get_a_majority() {
        let epoch = crate::coordination::next_epoch(1, 7);
        for order in 0..8u32 {
            for written in [None, Some(1), Some(epoch)] {
                let rs = [(); 3].map(|_| ReplicaStore::default());
                if let Some(e) = written {
                    assert!(rs[0].write("t", state(e, 5)).accepted);
                }
                let mut grants = [0; 2];
                for (i, r) in rs.iter().enumerate() {
                    let first = ((order >> i) & 1) as usize;
                    for who in [first, 1 - first] {
                        if r.promise("t", epoch).granted {
                            grants[who] += 1;
                        }
                    }
                }
                assert!(
                    grants.iter().filter(|&&g| g >= 2).count() <= 1,
                    "order {order:03b}, replica 0 holding {written:?}: grants {grants:?}"
                );
                assert!(
                    grants.iter().sum::<usize>() <= 3,
                    "each replica promises the epoch once: {grants:?}"
                );
                if written != Some(epoch) {
                    assert_eq!(grants.iter().sum::<usize>(), 3, "one grant per replica");
                }
            }
        }
    }

    /// The races of a takeover (Paxos' argument, on three replicas): of a change the old
    /// coordinator (epoch 1) gets to a majority and the new coordinator's promise majority,
    /// one comes first at a shared replica, so either the change is in what the takeover
    /// reads, or the change never reaches a majority. Also when a takeover lost and a later
    /// one reads a replica holding the lost one's epoch start.
    #[test]
    fn a_takeover_never_loses_a_change_the_old_coordinator_committed() {
        let takes = |rs: &[&ReplicaStore], w: (u64, u64)| {
            rs.iter()
                .filter(|r| r.write("t", state(w.0, w.1)).accepted)
                .count()
        };
        let promise = |rs: &[&ReplicaStore], epoch: u64| -> Option<(u64, u64)> {
            let acks: Vec<PromiseAck> = rs.iter().map(|r| r.promise("t", epoch)).collect();
            assert!(acks.iter().all(|a| a.granted), "promised {epoch}");
            acks.iter()
                .filter_map(|a| a.state.as_ref().map(|s| (s.epoch, s.version)))
                .max()
        };
        let fresh = || -> [ReplicaStore; 3] {
            let rs = [(); 3].map(|_| ReplicaStore::default());
            assert_eq!(takes(&[&rs[0], &rs[1], &rs[2]], (1, 5)), 3);
            rs
        };
        // The old coordinator's change reaches replicas 1 and 2 first: a takeover promised by
        // replicas 0 and 1 reads it.
        let rs = fresh();
        assert_eq!(takes(&[&rs[1], &rs[2]], (1, 6)), 2, "committed");
        assert_eq!(promise(&[&rs[0], &rs[1]], 2), Some((1, 6)));
        // The takeover's promises come first: the change reaches only replica 2.
        let rs = fresh();
        assert_eq!(promise(&[&rs[0], &rs[1]], 2), Some((1, 5)));
        assert_eq!(takes(&[&rs[1], &rs[2]], (1, 6)), 1, "never committed");
        // Interleaved: the takeover has replica 0's promise when the old coordinator commits
        // on replicas 1 and 2; replica 1's promise, which completes the majority, comes with
        // the change. The takeover writes its epoch start from it, but only to replica 0
        // before its node fails: not committed, and nothing was answered on it. A third
        // takeover promised by replicas 1 and 2 reads the change; one promised by replicas 0
        // and 1 reads the lost epoch start, which holds the change too (a state of an epoch
        // is only ever written from its promise majority's read).
        let rs = fresh();
        assert_eq!(promise(&[&rs[0]], 2), Some((1, 5)));
        assert_eq!(takes(&[&rs[1], &rs[2]], (1, 6)), 2, "committed by epoch 1");
        assert_eq!(
            promise(&[&rs[1]], 2),
            Some((1, 6)),
            "the majority's read has it"
        );
        assert_eq!(takes(&[&rs[0]], (2, 7)), 1, "epoch 2's start, from (1, 6)");
        assert_eq!(
            takes(&[&rs[1], &rs[2]], (1, 7)),
            1,
            "epoch 1 is fenced where epoch 2 was promised: no majority any more"
        );
        // (Replica 2 took the fenced (1, 7), never committed: adopting it is safe, it
        // extends (1, 6).)
        assert_eq!(promise(&[&rs[1], &rs[2]], 3), Some((1, 7)));
        let rs2 = [&rs[0], &rs[1]];
        assert_eq!(promise(&rs2, 4), Some((2, 7)));
    }
}

#[cfg(test)]
mod durable_tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::super::state_store::replaces;
    use super::*;

    /// A store in memory that fails every operation while `fail` is set, and never answers
    /// a save while `hang` is set.
    #[derive(Default)]
    struct TestStore {
        records: Mutex<HashMap<(String, RecordKey), ShardingRecord>>,
        fail: AtomicBool,
        hang: AtomicBool,
    }

    impl ShardingStateStore for TestStore {
        fn save_record<'a>(
            &'a self,
            node: &'a str,
            record: &'a ShardingRecord,
        ) -> StateStoreFuture<'a, bool> {
            Box::pin(async move {
                if self.hang.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
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
                // In SQLite's order (by shard column): a promise comes before its state.
                let mut records: Vec<ShardingRecord> = self
                    .records
                    .lock()
                    .iter()
                    .filter(|((n, _), _)| n == node)
                    .map(|(_, r)| r.clone())
                    .collect();
                records.sort_by_key(|r| r.key.shard_column());
                Ok(records)
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

    /// A promise is stored before it is granted: a replica that restarts still refuses the
    /// old epoch's writes; one the store failed to keep is not granted.
    #[tokio::test]
    async fn a_granted_promise_survives_a_reload_and_a_failed_one_is_not_granted() {
        let store = Arc::new(TestStore::default());
        let r = ReplicaStore::load(store.clone(), "n1").await.unwrap();
        assert!(r.write_durable("t", state(1, 3)).await.unwrap().accepted);
        assert!(r.promise_durable("t", 5).await.unwrap().granted);
        let r = ReplicaStore::load(store.clone(), "n1").await.unwrap();
        assert_eq!(r.highest_epoch("t"), 5);
        assert_eq!(
            r.read("t").map(|s| (s.epoch, s.version)),
            Some((1, 3)),
            "the state comes back with the promise, whichever the store returns first"
        );
        let ack = r.write_durable("t", state(1, 4)).await.unwrap();
        assert!(
            !ack.accepted,
            "the old epoch stays fenced after the restart"
        );
        assert_eq!(ack.epoch, 5);
        assert!(!r.promise_durable("t", 4).await.unwrap().granted);
        store.fail.store(true, Ordering::SeqCst);
        assert_eq!(
            r.promise_durable("t", 7).await,
            None,
            "not stored, not granted"
        );
        assert_eq!(r.highest_epoch("t"), 5);
    }

    #[tokio::test]
    async fn acknowledged_writes_survive_a_reload_and_failed_ones_are_not_acknowledged() {
        let store = Arc::new(TestStore::default());
        let r = ReplicaStore::load(store.clone(), "n1").await.unwrap();
        assert!(r.is_durable());
        let ack = r.write_durable("t", state(1, 3)).await.unwrap();
        assert!(ack.accepted);
        // Refused by the newer-wins rule without touching the store.
        store.fail.store(true, Ordering::SeqCst);
        let ack = r.write_durable("t", state(1, 2)).await.unwrap();
        assert!(!ack.accepted);
        assert_eq!((ack.epoch, ack.version), (1, 3));
        // A failing store: no acknowledgement, and reads do not see the state.
        assert_eq!(r.write_durable("t", state(1, 4)).await, None);
        assert_eq!(r.read("t").unwrap().version, 3);
        store.fail.store(false, Ordering::SeqCst);
        // The writer's retry succeeds.
        assert!(r.write_durable("t", state(1, 4)).await.unwrap().accepted);

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

    /// A store that never answers (a connection hung on a host that is gone) fails the call
    /// after [`STORE_TIMEOUT`]: the type's writes and the shard's saves go on once it answers
    /// again, instead of waiting behind the hung call.
    #[tokio::test(start_paused = true)]
    async fn a_store_that_does_not_answer_fails_the_call_after_the_timeout() {
        let store = Arc::new(TestStore::default());
        let r = Arc::new(ReplicaStore::load(store.clone(), "n1").await.unwrap());
        store.hang.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        assert_eq!(r.write_durable("t", state(1, 1)).await, None);
        assert_eq!(r.promise_durable("t", 2).await, None);
        assert_eq!(started.elapsed(), STORE_TIMEOUT * 2);
        let set_write = |stamp, ids: &[&str]| EntityWrite::Full(set(stamp, ids));
        let hung = write_entities(&r, "t", 3, set_write((1, 1), &["a"]));
        assert_eq!(
            hung.await,
            None,
            "a save that timed out is not acknowledged"
        );
        store.hang.store(false, Ordering::SeqCst);
        assert!(r.write_durable("t", state(1, 1)).await.unwrap().accepted);
        assert_eq!(
            write_entities(&r, "t", 3, set_write((1, 2), &["a", "b"])).await,
            Some(EntitiesAck::Held)
        );
        assert_eq!(r.read("t").map(|s| s.version), Some(1));
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
