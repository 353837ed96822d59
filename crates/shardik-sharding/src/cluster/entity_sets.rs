//! A replica's remembered entity sets, one per (entity type, shard), and the writes waiting
//! for the durable store: the bookkeeping of [`ReplicaStore`](super::replica::ReplicaStore)'s
//! remembered entities without its IO.
//!
//! A shard's owner writes its set in two forms: whole ([`EntitySet`]) or as the ids added
//! since a set the replica acknowledged ([`EntityDelta`]). A delta applies only to exactly
//! its base; otherwise the replica answers [`EntitiesAck::NeedFull`] and the owner sends the
//! whole set. A write older than the set held is ignored and answered
//! [`EntitiesAck::Newer`] with the stamp held.
//!
//! Sets only grow (no id is ever forgotten), so a whole set is merged into the one the
//! replica holds, not put in its place: an id an earlier hosting wrote here stays even when
//! the next owner's majority read missed it (its save still running, or the hand-off ended
//! by its timeout). An acknowledgement therefore means "the replica holds at least your
//! set".
//!
//! Without a durable store an accepted write is held at once. With one, it becomes the
//! shard's *pending* set: one save per shard runs at a time, always of the newest pending
//! set, and a write is acknowledged once a save of it or of a newer set succeeds. Reads see
//! only what was saved. A delta applies to the newest set accepted, pending or saved, so
//! deltas keep applying while a save is in flight.

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::wire::{EntitiesAck, EntityDelta, EntitySet};
use crate::hash::ShardId;

/// (entity type name, shard).
pub(crate) type SetKey = (String, ShardId);

/// A write of remembered entities, as an owner sends it.
#[derive(Debug)]
pub(crate) enum EntityWrite {
    /// The whole set.
    Full(EntitySet),
    /// The ids added since the set the replica acknowledged last.
    Delta(EntityDelta),
}

impl EntityWrite {
    /// The stamp of the set the replica holds once it applied this write.
    pub(crate) fn stamp(&self) -> (u64, u64) {
        match self {
            EntityWrite::Full(s) => s.stamp,
            EntityWrite::Delta(d) => d.stamp,
        }
    }
}

/// What [`EntitySets::offer`] decided.
#[derive(Debug)]
pub(crate) enum Offer {
    /// Answered now.
    Ready(EntitiesAck),
    /// Accepted and pending: the answer comes when a save covering it ends (the sender is
    /// dropped if that save fails). `start_saving` says the caller must start the shard's
    /// save loop ([`EntitySets::next_save`]); otherwise one runs already.
    Pending {
        answer: oneshot::Receiver<EntitiesAck>,
        start_saving: bool,
    },
}

/// A shard's accepted set waiting for (or in) a save.
struct Pending {
    /// The newest accepted set.
    latest: EntitySet,
    /// `latest` changed since the last save started.
    dirty: bool,
    /// Writers waiting for a save of at least this stamp.
    waiters: Vec<((u64, u64), oneshot::Sender<EntitiesAck>)>,
}

/// The remembered sets of one replica.
#[derive(Default)]
pub(crate) struct EntitySets {
    durable: bool,
    /// The sets reads see: saved (or accepted, without a durable store).
    held: HashMap<SetKey, EntitySet>,
    /// Accepted sets not saved yet, with a durable store.
    pending: HashMap<SetKey, Pending>,
}

impl EntitySets {
    /// Empty sets; `durable` says whether accepted writes wait for a save.
    pub(crate) fn new(durable: bool) -> Self {
        EntitySets {
            durable,
            ..EntitySets::default()
        }
    }

    /// Holds `set` unless a newer one is held: a set loaded from the durable store.
    pub(crate) fn load(&mut self, key: SetKey, set: EntitySet) {
        if self.held.get(&key).is_none_or(|cur| set.stamp >= cur.stamp) {
            self.held.insert(key, set);
        }
    }

    /// Applies an owner's write. A delta extends the newest accepted set in place (no copy
    /// of the set), except for the first write after a save with a durable store, which
    /// copies the saved set once.
    pub(crate) fn offer(&mut self, key: SetKey, write: EntityWrite) -> Offer {
        let stamp = write.stamp();
        let in_place = !self.durable || self.pending.contains_key(&key);
        let latest = match self.pending.get_mut(&key) {
            Some(p) => Some(&mut p.latest),
            None => self.held.get_mut(&key),
        };
        let next = match (write, latest) {
            (_, Some(cur)) if cur.stamp > stamp => {
                return Offer::Ready(EntitiesAck::Newer(cur.stamp))
            }
            // Applied already (a retry whose answer was lost).
            (EntityWrite::Delta(d), Some(cur)) if cur.stamp == d.stamp => {
                return self.answer_for(&key, stamp);
            }
            (EntityWrite::Delta(d), Some(cur)) if cur.stamp == d.base => {
                if in_place {
                    cur.ids.extend(d.ids);
                    cur.stamp = d.stamp;
                    if !self.durable {
                        return Offer::Ready(EntitiesAck::Held);
                    }
                    None
                } else {
                    let mut set = cur.clone();
                    set.ids.extend(d.ids);
                    set.stamp = d.stamp;
                    Some(set)
                }
            }
            (EntityWrite::Delta(_), _) => return Offer::Ready(EntitiesAck::NeedFull),
            // Sets only grow: the whole set keeps what the replica accepted before, which may
            // hold ids an earlier hosting wrote that this owner's majority read missed.
            (EntityWrite::Full(mut set), Some(cur)) => {
                // Usually the owner's set holds them all already: clone only what it lacks.
                for id in &cur.ids {
                    if !set.ids.contains(id) {
                        set.ids.insert(id.clone());
                    }
                }
                Some(set)
            }
            (EntityWrite::Full(set), None) => Some(set),
        };
        if !self.durable {
            if let Some(set) = next {
                self.held.insert(key, set);
            }
            return Offer::Ready(EntitiesAck::Held);
        }
        let (tx, rx) = oneshot::channel();
        let start_saving = !self.pending.contains_key(&key);
        let p = self.pending.entry(key).or_insert_with(|| Pending {
            latest: EntitySet::default(),
            dirty: false,
            waiters: Vec::new(),
        });
        if let Some(set) = next {
            p.latest = set;
        }
        p.dirty = true;
        p.waiters.push((stamp, tx));
        Offer::Pending {
            answer: rx,
            start_saving,
        }
    }

    /// The answer to a repeated write of `stamp`: held if saved, else wait for the save.
    fn answer_for(&mut self, key: &SetKey, stamp: (u64, u64)) -> Offer {
        match self.pending.get_mut(key) {
            Some(p) => {
                let (tx, rx) = oneshot::channel();
                p.waiters.push((stamp, tx));
                Offer::Pending {
                    answer: rx,
                    start_saving: false,
                }
            }
            None => Offer::Ready(EntitiesAck::Held),
        }
    }

    /// The set the shard's save loop stores next, or `None` when nothing changed since the
    /// last save started (the loop ends; the next accepted write starts a new one).
    pub(crate) fn next_save(&mut self, key: &SetKey) -> Option<EntitySet> {
        let p = self.pending.get_mut(key)?;
        if !p.dirty {
            // Every waiter was answered by the save that just ended.
            self.pending.remove(key);
            return None;
        }
        p.dirty = false;
        Some(p.latest.clone())
    }

    /// A save of `set` ended: `stored` if the store holds it or a newer record. Writers
    /// waiting for at most its stamp are answered, or on failure dropped (they retry).
    pub(crate) fn saved(&mut self, key: &SetKey, set: EntitySet, stored: bool) {
        let stamp = set.stamp;
        if stored && self.held.get(key).is_none_or(|cur| stamp >= cur.stamp) {
            self.held.insert(key.clone(), set);
        }
        let Some(p) = self.pending.get_mut(key) else {
            return;
        };
        let (done, waiting): (Vec<_>, Vec<_>) = p.waiters.drain(..).partition(|(s, _)| *s <= stamp);
        p.waiters = waiting;
        if stored {
            for (_, tx) in done {
                let _ = tx.send(EntitiesAck::Held);
            }
        }
    }

    /// The set reads see.
    pub(crate) fn read(&self, key: &SetKey) -> Option<EntitySet> {
        self.held.get(key).cloned()
    }

    /// The held sets of every shard of `type_name`.
    pub(crate) fn of_type<'a>(&'a self, type_name: &'a str) -> impl Iterator<Item = &'a EntitySet> {
        self.held
            .iter()
            .filter(move |((t, _), _)| t == type_name)
            .map(|(_, s)| s)
    }

    /// Shards holding a set.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(shard: ShardId) -> SetKey {
        ("t".to_string(), shard)
    }

    fn set(stamp: (u64, u64), ids: &[&str]) -> EntitySet {
        EntitySet {
            stamp,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn delta(base: (u64, u64), stamp: (u64, u64), ids: &[&str]) -> EntityWrite {
        EntityWrite::Delta(EntityDelta {
            base,
            stamp,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn ready(o: Offer) -> EntitiesAck {
        match o {
            Offer::Ready(a) => a,
            Offer::Pending { .. } => panic!("expected an answer now"),
        }
    }

    #[test]
    fn deltas_apply_to_their_base_only() {
        let mut s = EntitySets::new(false);
        // Nothing held: a delta cannot apply.
        assert_eq!(
            ready(s.offer(key(1), delta((1, 0), (1, 1), &["a"]))),
            EntitiesAck::NeedFull
        );
        assert_eq!(
            ready(s.offer(key(1), EntityWrite::Full(set((1, 1), &["a"])))),
            EntitiesAck::Held
        );
        assert_eq!(
            ready(s.offer(key(1), delta((1, 1), (1, 3), &["b", "c"]))),
            EntitiesAck::Held
        );
        assert_eq!(s.read(&key(1)), Some(set((1, 3), &["a", "b", "c"])));
        // A gap (the delta from 3 to 4 was lost): the whole set is needed.
        assert_eq!(
            ready(s.offer(key(1), delta((1, 4), (1, 5), &["e"]))),
            EntitiesAck::NeedFull
        );
        // A repeated delta whose answer was lost is held, and not applied twice.
        assert_eq!(
            ready(s.offer(key(1), delta((1, 1), (1, 3), &["b", "c"]))),
            EntitiesAck::Held
        );
        assert_eq!(s.read(&key(1)).unwrap().ids.len(), 3);
        assert_eq!(
            ready(s.offer(
                key(1),
                EntityWrite::Full(set((1, 5), &["a", "b", "c", "d", "e"]))
            )),
            EntitiesAck::Held
        );
        assert_eq!(s.read(&key(1)).unwrap().stamp, (1, 5));
    }

    #[test]
    fn an_older_owner_is_ignored_and_a_newer_generation_takes_over() {
        let mut s = EntitySets::new(false);
        s.offer(key(1), EntityWrite::Full(set((2, 4), &["a", "b"])));
        // A write of an earlier generation (its owner's late write): ignored, and the writer
        // learns the stamp held.
        assert_eq!(
            ready(s.offer(key(1), EntityWrite::Full(set((1, 9), &["z"])))),
            EntitiesAck::Newer((2, 4))
        );
        assert_eq!(
            ready(s.offer(key(1), delta((1, 9), (1, 10), &["y"]))),
            EntitiesAck::Newer((2, 4))
        );
        // So is an older write of the same generation.
        assert_eq!(
            ready(s.offer(key(1), EntityWrite::Full(set((2, 3), &["a"])))),
            EntitiesAck::Newer((2, 4))
        );
        assert_eq!(s.read(&key(1)), Some(set((2, 4), &["a", "b"])));
        // The next owner starts with its whole set.
        s.offer(key(1), EntityWrite::Full(set((3, 0), &["a", "b", "c"])));
        assert_eq!(s.read(&key(1)).unwrap().stamp, (3, 0));
        // Shards are independent.
        assert_eq!(s.read(&key(2)), None);
        assert_eq!(s.of_type("t").map(|s| s.ids.len()).sum::<usize>(), 3);
        assert_eq!(s.of_type("other").count(), 0);
    }

    #[test]
    fn a_newer_generation_keeps_the_ids_an_earlier_one_wrote() {
        let mut s = EntitySets::new(false);
        s.offer(key(1), EntityWrite::Full(set((2, 4), &["a", "x"])));
        // The next owner's majority read missed `x` (this replica's copy came in late): its
        // whole set does not make the replica forget it.
        assert_eq!(
            ready(s.offer(key(1), EntityWrite::Full(set((3, 0), &["a", "b"])))),
            EntitiesAck::Held
        );
        assert_eq!(s.read(&key(1)), Some(set((3, 0), &["a", "b", "x"])));
        // Its deltas go on from there.
        s.offer(key(1), delta((3, 0), (3, 1), &["c"]));
        assert_eq!(s.read(&key(1)), Some(set((3, 1), &["a", "b", "c", "x"])));
    }

    #[tokio::test]
    async fn a_newer_generation_keeps_ids_still_being_saved() {
        // The scenario of a hand-off that ended by its timeout: the old owner's delta with `x`
        // is accepted and its save still runs when the new owner's whole set arrives.
        let mut s = EntitySets::new(true);
        let Offer::Pending { answer: base, .. } =
            s.offer(key(1), EntityWrite::Full(set((1, 1), &["a"])))
        else {
            panic!("a durable write waits for its save");
        };
        let saving = s.next_save(&key(1)).unwrap();
        s.saved(&key(1), saving, true);
        assert_eq!(base.await, Ok(EntitiesAck::Held));
        let Offer::Pending { answer: old, .. } = s.offer(key(1), delta((1, 1), (1, 2), &["x"]))
        else {
            panic!("a durable write waits for its save");
        };
        let saving = s.next_save(&key(1)).unwrap();
        let Offer::Pending { answer: new, .. } =
            s.offer(key(1), EntityWrite::Full(set((2, 0), &["a", "b"])))
        else {
            panic!("a durable write waits for its save");
        };
        s.saved(&key(1), saving, true);
        assert_eq!(old.await, Ok(EntitiesAck::Held));
        let saving = s.next_save(&key(1)).unwrap();
        assert_eq!(saving, set((2, 0), &["a", "b", "x"]));
        s.saved(&key(1), saving, true);
        assert_eq!(new.await, Ok(EntitiesAck::Held));
        assert_eq!(s.read(&key(1)), Some(set((2, 0), &["a", "b", "x"])));
        assert!(s.next_save(&key(1)).is_none());
    }

    #[tokio::test]
    async fn durable_writes_are_answered_after_a_save_covering_them() {
        let mut s = EntitySets::new(true);
        let Offer::Pending {
            answer: first,
            start_saving,
        } = s.offer(key(1), EntityWrite::Full(set((1, 1), &["a"])))
        else {
            panic!("a durable write waits for its save");
        };
        assert!(start_saving);
        let saving = s.next_save(&key(1)).unwrap();
        assert_eq!(saving.stamp, (1, 1));
        // While it is saved, a delta applies to the pending set and joins the next save.
        let Offer::Pending {
            answer: second,
            start_saving,
        } = s.offer(key(1), delta((1, 1), (1, 2), &["b"]))
        else {
            panic!("a durable write waits for its save");
        };
        assert!(!start_saving, "one save loop per shard");
        // Reads see only what is saved.
        assert_eq!(s.read(&key(1)), None);
        s.saved(&key(1), saving, true);
        assert_eq!(first.await, Ok(EntitiesAck::Held));
        assert_eq!(s.read(&key(1)).unwrap().stamp, (1, 1));
        let saving = s.next_save(&key(1)).unwrap();
        assert_eq!(saving, set((1, 2), &["a", "b"]));
        // That save fails: its writer is not answered (it retries), nothing more is held.
        s.saved(&key(1), saving, false);
        assert!(second.await.is_err());
        assert_eq!(s.read(&key(1)).unwrap().stamp, (1, 1));
        // The loop ends; the held set is the base deltas apply to now.
        assert!(s.next_save(&key(1)).is_none());
        assert_eq!(
            ready(s.offer(key(1), delta((1, 2), (1, 3), &["c"]))),
            EntitiesAck::NeedFull
        );
        let Offer::Pending { answer, .. } = s.offer(key(1), delta((1, 1), (1, 2), &["b"])) else {
            panic!("a durable write waits for its save");
        };
        let saving = s.next_save(&key(1)).unwrap();
        s.saved(&key(1), saving, true);
        assert_eq!(answer.await, Ok(EntitiesAck::Held));
        assert_eq!(s.read(&key(1)), Some(set((1, 2), &["a", "b"])));
    }
}
