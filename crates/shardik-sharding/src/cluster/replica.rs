//! The replica endpoint: every node stores the latest coordinator state of every entity type
//! it was sent, so that a new coordinator can read it back from a majority.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use shardik_remote::Remote;

use super::wire::{decoder, EntitySet, ReplicaAck, ReplicaReq, REPLICA_PATH};
use crate::coordination::CoordinatorState;
use crate::hash::ShardId;

/// The coordinator states this node holds, by entity type name.
#[derive(Default)]
pub(crate) struct ReplicaStore {
    states: Mutex<HashMap<String, CoordinatorState>>,
    entities: Mutex<HashMap<(String, ShardId), EntitySet>>,
}

impl ReplicaStore {
    /// Stores `state` unless the stored one is newer: a higher epoch, or the same epoch and a
    /// higher version. A coordinator fenced off by a newer one is refused here, so it never
    /// gathers a majority again.
    pub(crate) fn write(&self, type_name: &str, state: CoordinatorState) -> ReplicaAck {
        let mut states = self.states.lock();
        let accepted = match states.get(type_name) {
            Some(cur) => (state.epoch, state.version) >= (cur.epoch, cur.version),
            None => true,
        };
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

    /// The stored state of a type.
    pub(crate) fn read(&self, type_name: &str) -> Option<CoordinatorState> {
        self.states.lock().get(type_name).cloned()
    }

    /// Stores the remembered entities of a shard unless the stored set has a higher stamp.
    pub(crate) fn write_entities(&self, type_name: &str, shard: ShardId, set: EntitySet) {
        let mut e = self.entities.lock();
        let key = (type_name.to_string(), shard);
        if e.get(&key).is_none_or(|cur| set.stamp >= cur.stamp) {
            e.insert(key, set);
        }
    }

    /// The remembered entities of a shard.
    pub(crate) fn read_entities(&self, type_name: &str, shard: ShardId) -> Option<EntitySet> {
        self.entities
            .lock()
            .get(&(type_name.to_string(), shard))
            .cloned()
    }

    /// Every remembered entity id of a type this replica holds.
    pub(crate) fn remembered(&self, type_name: &str) -> std::collections::BTreeSet<String> {
        self.entities
            .lock()
            .iter()
            .filter(|((t, _), _)| t == type_name)
            .flat_map(|(_, s)| s.ids.iter().cloned())
            .collect()
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
                } => reply.reply(me.write(&type_name, state)),
                ReplicaReq::Read { type_name, reply } => reply.reply(me.read(&type_name)),
                ReplicaReq::WriteEntities {
                    type_name,
                    shard,
                    set,
                } => me.write_entities(&type_name, shard, set),
                ReplicaReq::ReadEntities {
                    type_name,
                    shard,
                    reply,
                } => reply.reply(me.read_entities(&type_name, shard)),
            }),
        );
    }
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
}
