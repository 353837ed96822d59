//! The lifecycle of the entities of one shard, as a plain state machine.
//!
//! [`ShardState`] does no IO and knows no runtime: it is driven with deliveries, passivation
//! requests and termination notices, and it talks to entities through an [`EntityHandle`].
//! The region wraps one `ShardState` per shard in a lock and supplies real actor handles; the
//! tests below supply recording fakes.
//!
//! Per entity id there is at most one live incarnation. An entity is either `Active` (messages
//! go straight into its mailbox) or `Stopping` (it was asked to passivate, or it stopped
//! itself): messages for it wait in a bounded per-entity buffer. When the incarnation has
//! terminated, the messages it accepted but never handled come back and, followed by the
//! buffer, are delivered to a new incarnation in their original order. Nothing is lost.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use compact_str::CompactString;
use shardik_actor::TellError;

/// An entity id, shared between the shard's map and the entity actor's name.
pub type EntityId = Arc<str>;

/// An entity id as the shard's map keys it: ids of up to 24 bytes (the usual case) live
/// inline in the bucket, so a lookup compares bytes that are already in cache instead of
/// chasing a pointer to a separate allocation (with many entities that pointer chase was a
/// cache miss on every message). It borrows as `str`, so the map is looked up by `&str`
/// without building a key.
type Key = CompactString;

/// The longest id a [`Key`] keeps inline (on 64-bit targets).
#[cfg(test)]
const INLINE: usize = 24;

/// The map's hasher: foldhash, seeded per map (ids are user input, so not a fixed-key hash),
/// several times cheaper than std's SipHash on short ids.
type IdHasher = foldhash::fast::RandomState;

/// How the shard reaches one entity incarnation.
pub trait EntityHandle<M> {
    /// Identifies this incarnation (different for every spawn).
    fn incarnation(&self) -> u64;
    /// Puts `msg` into the mailbox, or hands it back: `Stopped` if the incarnation no longer
    /// accepts messages (it is terminating), `MailboxFull` if its bounded mailbox is full.
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>>;
    /// Puts `msg`, part of the backlog handed to a fresh incarnation, into its mailbox even
    /// if a bounded mailbox is full: these messages were accepted by the shard already, so
    /// refusing them would lose them. Hands it back only as `Stopped`. Defaults to `try_tell`.
    fn hand_over(&self, msg: M) -> Result<(), TellError<M>> {
        self.try_tell(msg)
    }
    /// Asks the incarnation to stop after handling everything already in its mailbox.
    fn passivate(&self);
    /// Asks the incarnation to stop as soon as its current message is done (a forced stop:
    /// [`ShardState::force_stop`]); the messages still in its mailbox come back as
    /// [`Ended::undelivered`]. Defaults to [`passivate`](Self::passivate).
    fn stop_now(&self) {
        self.passivate();
    }
}

enum Slot<M, H> {
    Active {
        handle: H,
        touched: u64,
    },
    Stopping {
        /// The stopping incarnation (kept for a forced stop).
        handle: H,
        /// Boxed: the map holds a slot per entity, and a stopping entity is the rare case, so
        /// the slot stays as small as an active one's (the map of a shard with many entities
        /// is what a message to a cold entity pays cache misses for).
        #[allow(clippy::box_collection)]
        buffer: Box<VecDeque<M>>,
        /// Start a new incarnation when this one ends even if no message waits for it:
        /// [`ShardState::ensure`] asked for one (a remembered entity) while it stopped.
        restart: bool,
    },
}

/// What happened to a delivered message.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery<M> {
    /// Queued in the live incarnation's mailbox.
    Delivered,
    /// A new incarnation was spawned and the message queued in its mailbox.
    Spawned,
    /// The entity is stopping; the message waits for its next incarnation.
    Buffered,
    /// Not accepted: `MailboxFull` if the entity's buffer or bounded mailbox is full. (A
    /// fresh incarnation that refuses the message because it stopped at once buffers it,
    /// [`Buffered`](Self::Buffered), for the next incarnation.)
    Rejected(TellError<M>),
}

/// The end of one incarnation, as reported by its termination hook.
#[derive(Debug)]
pub struct Ended<M> {
    /// Which incarnation ended.
    pub incarnation: u64,
    /// Messages it accepted but never handled, in arrival order.
    pub undelivered: Vec<M>,
    /// True if it stopped because it kept failing (its supervisor gave up).
    pub failed: bool,
    /// Whether it handled any message ([`Termination::handled_any`](shardik_actor::Termination::handled_any)).
    pub handled_any: bool,
}

/// How many incarnations in a row may stop without handling a message while messages wait
/// for them before those messages are given up as dead letters
/// ([`AfterStop::GaveUp`]). An entity that stops itself in its `started` hook every time
/// (a bug, or a condition that never clears) would otherwise be started again for its
/// waiting messages forever, at full speed, and never get to them.
pub const MAX_STARTS_WITHOUT_PROGRESS: u32 = 10;

/// What a termination notice led to.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterStop<M> {
    /// The entity is gone; nothing was waiting for it.
    Removed,
    /// Messages were waiting: a new incarnation was spawned and got them. (If it stopped
    /// before it had taken them all, it is stopping and the rest waits in its buffer.)
    Respawned {
        /// How many messages were handed to the new incarnation.
        delivered: usize,
        /// The dropped backlog of a failed incarnation; the caller records them as dead
        /// letters.
        dropped: Vec<M>,
    },
    /// The messages could not be handed on (the incarnation failed for good, or the
    /// system is shutting down); the caller records them as dead letters.
    Dropped(Vec<M>),
    /// [`MAX_STARTS_WITHOUT_PROGRESS`] incarnations in a row stopped without handling a
    /// message while these waited for them: no new one is started for them, and the caller
    /// records them as dead letters. The next message starts a new incarnation.
    GaveUp(Vec<M>),
    /// The notice was about an incarnation this shard no longer tracks; ignored.
    Stale,
}

/// The entities of one shard.
pub struct ShardState<M, H> {
    entities: HashMap<Key, Slot<M, H>, IdHasher>,
    buffer_limit: usize,
    active: usize,
    /// Per entity id: incarnations in a row that stopped without handling a message while
    /// messages waited for them (see [`MAX_STARTS_WITHOUT_PROGRESS`]); empty as a rule.
    fruitless: HashMap<Key, u32, IdHasher>,
}

impl<M, H: EntityHandle<M> + Clone> ShardState<M, H> {
    /// An empty shard whose stopping entities buffer at most `buffer_limit` messages each.
    pub fn new(buffer_limit: usize) -> Self {
        ShardState {
            entities: HashMap::default(),
            buffer_limit: buffer_limit.max(1),
            active: 0,
            fruitless: HashMap::default(),
        }
    }

    /// Routes `msg` to entity `id` at coarse time `now`, spawning it with `spawn` if it has
    /// no incarnation.
    #[inline]
    pub fn deliver(
        &mut self,
        id: &str,
        msg: M,
        now: u64,
        spawn: impl FnOnce(&EntityId) -> H,
    ) -> Delivery<M> {
        self.deliver_within(id, msg, now, spawn, false)
    }

    /// As [`deliver`](Self::deliver), for a message accepted already (a fence held it, or an
    /// entity stopped before it handled it): an entity still stopping buffers it past the
    /// shard's `buffer_limit`, which bounds only what senders add, and a running one takes
    /// it past a bounded mailbox's capacity ([`EntityHandle::hand_over`]).
    pub fn deliver_accepted(
        &mut self,
        id: &str,
        msg: M,
        now: u64,
        spawn: impl FnOnce(&EntityId) -> H,
    ) -> Delivery<M> {
        self.deliver_within(id, msg, now, spawn, true)
    }

    /// [`deliver`](Self::deliver), or [`deliver_accepted`](Self::deliver_accepted) if
    /// `accepted` (a constant at both calls).
    #[inline(always)]
    fn deliver_within(
        &mut self,
        id: &str,
        msg: M,
        now: u64,
        spawn: impl FnOnce(&EntityId) -> H,
        accepted: bool,
    ) -> Delivery<M> {
        let tell = |handle: &H, msg: M| {
            if accepted {
                handle.hand_over(msg)
            } else {
                handle.try_tell(msg)
            }
        };
        let Some(slot) = self.entities.get_mut(id) else {
            let key: EntityId = id.into();
            let handle = spawn(&key);
            let delivery = match tell(&handle, msg) {
                Ok(()) => Delivery::Spawned,
                Err(TellError::Stopped(msg)) => {
                    // Its first turn may already run on another thread and have stopped it
                    // (its `started` stopped it, or starting failed): the message waits for
                    // the incarnation after it, as when a respawn is refused.
                    self.insert_stopping(Key::new(id), handle, std::iter::once(msg));
                    return Delivery::Buffered;
                }
                Err(e) => Delivery::Rejected(e),
            };
            self.entities.insert(
                Key::new(id),
                Slot::Active {
                    handle,
                    touched: now,
                },
            );
            self.active += 1;
            return delivery;
        };
        match slot {
            Slot::Active { handle, touched } => match tell(handle, msg) {
                Ok(()) => {
                    if *touched != now {
                        *touched = now;
                    }
                    Delivery::Delivered
                }
                Err(TellError::MailboxFull(msg)) => Delivery::Rejected(TellError::MailboxFull(msg)),
                Err(TellError::Stopped(msg)) => {
                    // It is terminating on its own (it stopped itself or failed): buffer
                    // until its termination notice arrives.
                    let handle = handle.clone();
                    let mut buffer = Box::<VecDeque<M>>::default();
                    buffer.push_back(msg);
                    *slot = Slot::Stopping {
                        handle,
                        buffer,
                        restart: false,
                    };
                    self.active -= 1;
                    Delivery::Buffered
                }
            },
            Slot::Stopping { buffer, .. } => {
                if !accepted && buffer.len() >= self.buffer_limit {
                    Delivery::Rejected(TellError::MailboxFull(msg))
                } else {
                    buffer.push_back(msg);
                    Delivery::Buffered
                }
            }
        }
    }

    /// Starts entity `id` at coarse time `now` with `spawn` if it has no incarnation (without
    /// a message: remembered entities restarted on a new home). Returns true if it spawned.
    ///
    /// An incarnation that is still stopping (a fence lifted, or a shard came back, before
    /// its entities had ended) is not a running entity: the next incarnation starts as soon
    /// as it ends, with or without messages waiting for it.
    pub fn ensure(&mut self, id: &str, now: u64, spawn: impl FnOnce(&EntityId) -> H) -> bool {
        match self.entities.get_mut(id) {
            Some(Slot::Stopping { restart, .. }) => {
                *restart = true;
                return false;
            }
            Some(Slot::Active { .. }) => return false,
            None => {}
        }
        let key: EntityId = id.into();
        let handle = spawn(&key);
        self.entities.insert(
            Key::new(id),
            Slot::Active {
                handle,
                touched: now,
            },
        );
        self.active += 1;
        true
    }

    /// Starts passivating entity `id`: it handles what its mailbox holds, then stops; new
    /// messages wait in the shard. Returns false if it is not active.
    pub fn passivate(&mut self, id: &str) -> bool {
        let Some(slot) = self.entities.get_mut(id) else {
            return false;
        };
        let Slot::Active { handle, .. } = slot else {
            return false;
        };
        handle.passivate();
        let handle = handle.clone();
        *slot = Slot::Stopping {
            handle,
            buffer: Box::default(),
            restart: false,
        };
        self.active -= 1;
        true
    }

    /// Calls off the restarts [`ensure`](Self::ensure) asked of stopping entities (the
    /// shard stops: they are not to start again here).
    pub fn call_off_restarts(&mut self) {
        for slot in self.entities.values_mut() {
            if let Slot::Stopping { restart, .. } = slot {
                *restart = false;
            }
        }
    }

    /// Stops every entity of the shard as soon as its current message is done
    /// ([`EntityHandle::stop_now`]), those already stopping gracefully included: the end of a
    /// hand-off whose entities were too slow to stop. Returns the ids of those told.
    pub fn force_stop(&mut self) -> Vec<EntityId> {
        let mut told = Vec::with_capacity(self.entities.len());
        for (id, slot) in self.entities.iter_mut() {
            match slot {
                Slot::Active { handle, .. } => {
                    handle.stop_now();
                    let handle = handle.clone();
                    *slot = Slot::Stopping {
                        handle,
                        buffer: Box::default(),
                        restart: false,
                    };
                    self.active -= 1;
                }
                // Its messages go with the shard; whoever hosts the shard next starts it
                // again if it is remembered.
                Slot::Stopping {
                    handle, restart, ..
                } => {
                    *restart = false;
                    handle.stop_now();
                }
            }
            told.push(EntityId::from(id.as_str()));
        }
        told
    }

    /// Handles the end of an incarnation of entity `id`. `respawn` says whether new
    /// incarnations may be started (false during shutdown); `now` is the coarse time.
    pub fn terminated(
        &mut self,
        id: &str,
        ended: Ended<M>,
        respawn: bool,
        now: u64,
        spawn: impl FnOnce(&EntityId) -> H,
    ) -> AfterStop<M> {
        let Ended {
            incarnation,
            undelivered,
            failed,
            handled_any,
        } = ended;
        let matches = match self.entities.get(id) {
            Some(Slot::Active { handle, .. }) => handle.incarnation() == incarnation,
            Some(Slot::Stopping { handle, .. }) => handle.incarnation() == incarnation,
            None => false,
        };
        if !matches {
            return if undelivered.is_empty() {
                AfterStop::Stale
            } else {
                AfterStop::Dropped(undelivered)
            };
        }
        let (key, slot) = self.entities.remove_entry(id).expect("checked above");
        // The streak so far; kept below only if this incarnation adds to it.
        let streak = if self.fruitless.is_empty() {
            0
        } else {
            self.fruitless.remove(id).unwrap_or(0)
        };
        let (buffer, restart) = match slot {
            Slot::Active { .. } => {
                self.active -= 1;
                (VecDeque::new(), false)
            }
            Slot::Stopping {
                buffer, restart, ..
            } => (*buffer, restart),
        };
        if failed {
            // The failed incarnation's own backlog is dropped (it may hold the message that
            // keeps failing it); messages sent while it was stopping start a new one, and
            // so does a restart asked for meanwhile.
            if (!buffer.is_empty() || restart) && respawn {
                let delivered = self.respawn(key, buffer.into_iter(), now, spawn);
                return AfterStop::Respawned {
                    delivered,
                    dropped: undelivered,
                };
            }
            let mut all = undelivered;
            all.extend(buffer);
            return if all.is_empty() {
                AfterStop::Removed
            } else {
                AfterStop::Dropped(all)
            };
        }
        if undelivered.is_empty() && buffer.is_empty() && !(restart && respawn) {
            return AfterStop::Removed;
        }
        if !respawn {
            let mut all = undelivered;
            all.extend(buffer);
            return AfterStop::Dropped(all);
        }
        if !handled_any && (!undelivered.is_empty() || !buffer.is_empty()) {
            // Messages waited for it and it handled none (it stopped itself at its start).
            let streak = streak + 1;
            if streak >= MAX_STARTS_WITHOUT_PROGRESS {
                let mut all = undelivered;
                all.extend(buffer);
                return AfterStop::GaveUp(all);
            }
            self.fruitless.insert(key.clone(), streak);
        }
        let delivered = self.respawn(key, undelivered.into_iter().chain(buffer), now, spawn);
        AfterStop::Respawned {
            delivered,
            dropped: Vec::new(),
        }
    }

    /// Spawns a new incarnation of `key` and hands it `messages`; returns how many it took.
    fn respawn(
        &mut self,
        key: Key,
        mut messages: impl Iterator<Item = M>,
        now: u64,
        spawn: impl FnOnce(&EntityId) -> H,
    ) -> usize {
        let handle = spawn(&EntityId::from(key.as_str()));
        let mut delivered = 0;
        while let Some(msg) = messages.next() {
            // A fresh incarnation accepts the whole backlog, past the bound of a bounded
            // mailbox (a backlog larger than the mailbox used to be cut off and dropped as
            // dead letters although every message had been accepted).
            match handle.hand_over(msg) {
                Ok(()) => delivered += 1,
                Err(refused) => {
                    // It refuses only once it is stopping: it may already run on another
                    // thread and stop itself on a message of this very backlog. The rest of
                    // the backlog then waits, in order, for the incarnation after it (it used
                    // to be dropped as dead letters).
                    let refused = std::iter::once(refused.into_inner());
                    self.insert_stopping(key, handle, refused.chain(messages));
                    return delivered;
                }
            }
        }
        self.entities.insert(
            key,
            Slot::Active {
                handle,
                touched: now,
            },
        );
        self.active += 1;
        delivered
    }

    /// Tracks `handle`, an incarnation that refused a message because it is stopping, with
    /// `waiting` (that message first) buffered for the incarnation after it.
    fn insert_stopping(&mut self, key: Key, handle: H, waiting: impl Iterator<Item = M>) {
        let buffer = Box::new(waiting.collect::<VecDeque<M>>());
        self.entities.insert(
            key,
            Slot::Stopping {
                handle,
                buffer,
                restart: false,
            },
        );
    }

    /// Active entities not touched since `cutoff` (coarse time).
    pub fn idle_since(&self, cutoff: u64) -> Vec<EntityId> {
        self.entities
            .iter()
            .filter_map(|(id, slot)| match slot {
                Slot::Active { touched, .. } if *touched <= cutoff => {
                    Some(EntityId::from(id.as_str()))
                }
                _ => None,
            })
            .collect()
    }

    /// Entities with a live incarnation that accepts messages.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Entities with an incarnation, active or stopping.
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// True if the shard tracks no entity.
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }

    /// Messages waiting in the buffers of stopping entities.
    pub fn buffered(&self) -> usize {
        self.entities
            .values()
            .map(|s| match s {
                Slot::Stopping { buffer, .. } => buffer.len(),
                Slot::Active { .. } => 0,
            })
            .sum()
    }

    /// Whether incarnation `incarnation` of entity `id` lives here (active or stopping).
    pub fn holds(&self, id: &str, incarnation: u64) -> bool {
        match self.entities.get(id) {
            Some(Slot::Active { handle, .. } | Slot::Stopping { handle, .. }) => {
                handle.incarnation() == incarnation
            }
            None => false,
        }
    }

    /// Whether entity `id` is active (true), stopping (false) or unknown (None).
    pub fn is_active(&self, id: &str) -> Option<bool> {
        self.entities
            .get(id)
            .map(|s| matches!(s, Slot::Active { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A fake incarnation: a mailbox we can inspect and close.
    #[derive(Clone)]
    struct Fake {
        inc: u64,
        inbox: Rc<RefCell<Vec<u32>>>,
        closed: Rc<RefCell<bool>>,
        passivated: Rc<RefCell<bool>>,
        stopped_now: Rc<RefCell<bool>>,
        /// Closes itself once its inbox holds this many messages (it stopped itself).
        close_after: Option<usize>,
        /// A bounded mailbox: `try_tell` refuses once the inbox holds this many.
        bound: Option<usize>,
    }

    impl EntityHandle<u32> for Fake {
        fn incarnation(&self) -> u64 {
            self.inc
        }
        fn try_tell(&self, msg: u32) -> Result<(), TellError<u32>> {
            if self.bound.is_some_and(|b| self.inbox.borrow().len() >= b) {
                return Err(TellError::MailboxFull(msg));
            }
            self.hand_over(msg)
        }
        fn hand_over(&self, msg: u32) -> Result<(), TellError<u32>> {
            if *self.closed.borrow() {
                Err(TellError::Stopped(msg))
            } else {
                self.inbox.borrow_mut().push(msg);
                if self.close_after == Some(self.inbox.borrow().len()) {
                    *self.closed.borrow_mut() = true;
                }
                Ok(())
            }
        }
        fn passivate(&self) {
            *self.passivated.borrow_mut() = true;
        }
        fn stop_now(&self) {
            *self.stopped_now.borrow_mut() = true;
        }
    }

    #[derive(Default)]
    struct Spawner {
        next: u64,
        spawned: Vec<Fake>,
        /// `close_after` of the fakes spawned from now on.
        close_after: Option<usize>,
        /// `bound` of the fakes spawned from now on.
        bound: Option<usize>,
        /// The fakes spawned from now on are stopped already (their first turn ran elsewhere
        /// and stopped them).
        born_stopped: bool,
    }

    impl Spawner {
        fn spawn(&mut self) -> Fake {
            self.next += 1;
            let f = Fake {
                inc: self.next,
                inbox: Default::default(),
                closed: std::rc::Rc::new(std::cell::RefCell::new(self.born_stopped)),
                passivated: Default::default(),
                stopped_now: Default::default(),
                close_after: self.close_after,
                bound: self.bound,
            };
            self.spawned.push(f.clone());
            f
        }
    }

    /// Delivers `msg` to entity "a" at time 0.
    fn tell(s: &mut ShardState<u32, Fake>, sp: &mut Spawner, msg: u32) -> Delivery<u32> {
        s.deliver("a", msg, 0, |_| sp.spawn())
    }

    /// Feeds the termination notice of incarnation `incarnation` of entity "a".
    fn end(
        s: &mut ShardState<u32, Fake>,
        sp: &mut Spawner,
        incarnation: u64,
        undelivered: Vec<u32>,
        failed: bool,
        respawn: bool,
    ) -> AfterStop<u32> {
        let ended = Ended {
            incarnation,
            undelivered,
            failed,
            handled_any: true,
        };
        s.terminated("a", ended, respawn, 0, |_| sp.spawn())
    }

    #[test]
    fn a_forced_stop_reaches_active_and_stopping_entities_and_returns_their_backlog() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        tell(&mut s, &mut sp, 2);
        s.deliver("b", 7, 0, |_| sp.spawn());
        assert!(s.passivate("a"));
        assert_eq!(tell(&mut s, &mut sp, 3), Delivery::Buffered);
        assert_eq!(s.force_stop().len(), 2);
        assert!(sp.spawned.iter().all(|f| *f.stopped_now.borrow()));
        assert_eq!(s.active(), 0);
        // "a" ends with 2 unhandled: without respawning, its backlog comes back in order,
        // what its mailbox held before what the shard buffered.
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![2], false, false),
            AfterStop::Dropped(vec![2, 3])
        );
        assert_eq!(sp.spawned.len(), 2, "nothing respawned");
        let ended = Ended {
            incarnation: 2,
            undelivered: vec![],
            failed: false,
            handled_any: true,
        };
        assert_eq!(
            s.terminated("b", ended, false, 0, |_| sp.spawn()),
            AfterStop::Removed
        );
        assert!(s.is_empty());
    }

    /// A fresh incarnation that stopped before the message that spawned it reached its
    /// mailbox (its first turn ran on another thread and stopped it) does not refuse that
    /// message: it waits, with later ones, for the next incarnation, which gets them in order.
    #[test]
    fn a_message_to_an_incarnation_that_stopped_at_once_waits_for_the_next() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner {
            born_stopped: true,
            ..Spawner::default()
        };
        assert_eq!(tell(&mut s, &mut sp, 1), Delivery::Buffered);
        assert_eq!(tell(&mut s, &mut sp, 2), Delivery::Buffered);
        assert_eq!(s.active(), 0, "a stopped incarnation is not active");
        assert_eq!(s.len(), 1);
        sp.born_stopped = false;
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, true),
            AfterStop::Respawned {
                delivered: 2,
                dropped: vec![]
            }
        );
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![1, 2]);
        assert_eq!(s.active(), 1);
        // Without a next incarnation (shutdown) they come back to be recorded as dead letters.
        sp.born_stopped = true;
        assert_eq!(s.deliver("b", 3, 0, |_| sp.spawn()), Delivery::Buffered);
        let ended = Ended {
            incarnation: 3,
            undelivered: vec![],
            failed: false,
            handled_any: true,
        };
        assert_eq!(
            s.terminated("b", ended, false, 0, |_| sp.spawn()),
            AfterStop::Dropped(vec![3])
        );
    }

    /// An entity whose incarnations keep stopping without handling a message (its `started`
    /// stops it) is not started again and again for its waiting messages: after
    /// `MAX_STARTS_WITHOUT_PROGRESS` such incarnations in a row they are given up, and the
    /// next message starts it anew. An incarnation that handled something ends the streak.
    #[test]
    fn messages_for_an_entity_that_keeps_stopping_before_handling_them_are_given_up() {
        let fruitless = |inc: u64, undelivered: Vec<u32>, handled_any: bool| Ended {
            incarnation: inc,
            undelivered,
            failed: false,
            handled_any,
        };
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        tell(&mut s, &mut sp, 2);
        let max = u64::from(MAX_STARTS_WITHOUT_PROGRESS);
        for inc in 1..max {
            let after = s.terminated("a", fruitless(inc, vec![1, 2], false), true, 0, |_| {
                sp.spawn()
            });
            assert!(
                matches!(after, AfterStop::Respawned { delivered: 2, .. }),
                "incarnation {inc}: {after:?}"
            );
        }
        // One that handled a message ends the streak: the count starts over.
        let after = s.terminated("a", fruitless(max, vec![2], true), true, 0, |_| sp.spawn());
        assert!(matches!(after, AfterStop::Respawned { delivered: 1, .. }));
        for inc in max + 1..2 * max {
            let after = s.terminated("a", fruitless(inc, vec![2], false), true, 0, |_| sp.spawn());
            assert!(
                matches!(after, AfterStop::Respawned { .. }),
                "incarnation {inc}: {after:?}"
            );
        }
        // The last of a full streak: given up, with what waited in its buffer too.
        assert_eq!(tell(&mut s, &mut sp, 3), Delivery::Delivered);
        assert!(s.passivate("a"));
        assert_eq!(tell(&mut s, &mut sp, 4), Delivery::Buffered);
        assert_eq!(
            s.terminated("a", fruitless(2 * max, vec![2, 3], false), true, 0, |_| {
                sp.spawn()
            }),
            AfterStop::GaveUp(vec![2, 3, 4])
        );
        assert!(s.is_empty());
        assert_eq!(tell(&mut s, &mut sp, 5), Delivery::Spawned, "started anew");
    }

    #[test]
    fn a_stopping_entity_buffers_accepted_messages_past_the_cap_that_bounds_senders() {
        let mut s = ShardState::new(2);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        assert!(s.passivate("a"));
        assert_eq!(tell(&mut s, &mut sp, 2), Delivery::Buffered);
        assert_eq!(tell(&mut s, &mut sp, 3), Delivery::Buffered);
        assert_eq!(
            tell(&mut s, &mut sp, 4),
            Delivery::Rejected(TellError::MailboxFull(4)),
            "a sender's message past the cap is refused"
        );
        for n in 5..=7 {
            assert_eq!(
                s.deliver_accepted("a", n, 0, |_| sp.spawn()),
                Delivery::Buffered
            );
        }
        // The next incarnation gets every buffered message, in order.
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, true),
            AfterStop::Respawned {
                delivered: 5,
                dropped: vec![]
            }
        );
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![2, 3, 5, 6, 7]);
    }

    #[test]
    fn a_running_entity_takes_accepted_messages_past_a_bounded_mailbox() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner {
            bound: Some(1),
            ..Spawner::default()
        };
        assert_eq!(
            s.deliver_accepted("a", 1, 0, |_| sp.spawn()),
            Delivery::Spawned
        );
        assert_eq!(
            tell(&mut s, &mut sp, 2),
            Delivery::Rejected(TellError::MailboxFull(2)),
            "a sender's message past the bound is refused"
        );
        assert_eq!(
            s.deliver_accepted("a", 3, 0, |_| sp.spawn()),
            Delivery::Delivered
        );
        assert_eq!(
            s.deliver_accepted("b", 4, 0, |_| sp.spawn()),
            Delivery::Spawned
        );
        assert_eq!(
            s.deliver_accepted("b", 5, 0, |_| sp.spawn()),
            Delivery::Delivered
        );
        assert_eq!(*sp.spawned[0].inbox.borrow(), vec![1, 3]);
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![4, 5]);
    }

    #[test]
    fn ensure_during_a_stop_restarts_the_entity_once_it_ended_even_without_messages() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        assert!(s.ensure("a", 0, |_| sp.spawn()));
        assert!(!s.ensure("a", 0, |_| sp.spawn()), "it runs already");
        assert!(s.passivate("a"));
        // Asked for again (a remembered entity, its shard hosted again) while it stops.
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        assert_eq!(sp.spawned.len(), 1, "not while the old incarnation lives");
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, true),
            AfterStop::Respawned {
                delivered: 0,
                dropped: vec![]
            }
        );
        assert_eq!(sp.spawned.len(), 2);
        assert_eq!(s.active(), 1);
        // The flag went with the old incarnation: the new one ends for good.
        assert!(s.passivate("a"));
        assert_eq!(
            end(&mut s, &mut sp, 2, vec![], false, true),
            AfterStop::Removed
        );
        assert!(s.is_empty());
    }

    #[test]
    fn a_restart_asked_for_during_a_stop_is_not_made_without_respawning_or_after_a_forced_stop() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        assert!(s.passivate("a"));
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        // Shutting down: nothing starts.
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, false),
            AfterStop::Removed
        );
        assert_eq!(sp.spawned.len(), 1);
        // A forced stop (the shard leaves this node) calls the restart off.
        tell(&mut s, &mut sp, 2);
        assert!(s.passivate("a"));
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        s.force_stop();
        assert_eq!(
            end(&mut s, &mut sp, 2, vec![], false, true),
            AfterStop::Removed
        );
        assert_eq!(sp.spawned.len(), 2);
        // A failed incarnation is restarted, without its own backlog, if a restart was
        // asked for while it stopped.
        tell(&mut s, &mut sp, 3);
        assert!(s.passivate("a"));
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        assert_eq!(
            end(&mut s, &mut sp, 3, vec![3], true, true),
            AfterStop::Respawned {
                delivered: 0,
                dropped: vec![3]
            }
        );
        assert_eq!(sp.spawned.len(), 4);
        assert!(sp.spawned[3].inbox.borrow().is_empty());
        assert_eq!(s.active(), 1);
        // Failed while shutting down: not restarted.
        assert!(s.passivate("a"));
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        assert_eq!(
            end(&mut s, &mut sp, 4, vec![], true, false),
            AfterStop::Removed
        );
        // A shard stop calls the restart off.
        tell(&mut s, &mut sp, 5);
        assert!(s.passivate("a"));
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        s.call_off_restarts();
        assert_eq!(
            end(&mut s, &mut sp, 5, vec![], false, true),
            AfterStop::Removed
        );
        assert_eq!(sp.spawned.len(), 5);
    }

    /// The lifted fence's sequence: the fence force-stops the entity, the fence lifts, the
    /// shard's remembered ids are started while it still ends.
    #[test]
    fn a_restart_asked_for_after_a_forced_stop_is_made() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        s.force_stop();
        assert!(!s.ensure("a", 0, |_| sp.spawn()));
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, true),
            AfterStop::Respawned {
                delivered: 0,
                dropped: vec![]
            }
        );
        assert_eq!(sp.spawned.len(), 2);
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn a_stopping_slot_is_no_larger_than_an_active_one() {
        // The map stores a slot per entity: keep it at the active slot's size.
        type H = crate::region::EntityCell<u64>;
        assert!(
            std::mem::size_of::<Slot<u64, H>>() <= 32,
            "slot: {} B",
            std::mem::size_of::<Slot<u64, H>>()
        );
    }

    #[test]
    fn first_message_spawns_then_delivers() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        assert_eq!(tell(&mut s, &mut sp, 1), Delivery::Spawned);
        assert_eq!(tell(&mut s, &mut sp, 2), Delivery::Delivered);
        assert_eq!(sp.spawned.len(), 1);
        assert_eq!(*sp.spawned[0].inbox.borrow(), vec![1, 2]);
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn passivation_buffers_and_respawns_with_everything_in_order() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        tell(&mut s, &mut sp, 2);
        assert!(s.passivate("a"));
        assert!(*sp.spawned[0].passivated.borrow());
        assert_eq!(tell(&mut s, &mut sp, 3), Delivery::Buffered);
        assert_eq!(tell(&mut s, &mut sp, 4), Delivery::Buffered);
        // It terminates having handled 1 but not 2 (e.g. the stop raced): 2 comes back.
        let after = end(&mut s, &mut sp, 1, vec![2], false, true);
        assert_eq!(
            after,
            AfterStop::Respawned {
                delivered: 3,
                dropped: vec![]
            }
        );
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![2, 3, 4]);
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn passivation_without_waiting_messages_removes() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        s.passivate("a");
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, true),
            AfterStop::Removed
        );
        assert!(s.is_empty());
        assert_eq!(s.active(), 0);
    }

    #[test]
    fn entity_that_stops_itself_gets_buffered_messages_in_next_incarnation() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        *sp.spawned[0].closed.borrow_mut() = true; // it called ctx.stop()
        assert_eq!(tell(&mut s, &mut sp, 2), Delivery::Buffered);
        let after = end(&mut s, &mut sp, 1, vec![], false, true);
        assert_eq!(
            after,
            AfterStop::Respawned {
                delivered: 1,
                dropped: vec![]
            }
        );
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![2]);
    }

    #[test]
    fn buffer_is_bounded() {
        let mut s = ShardState::new(2);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        s.passivate("a");
        assert_eq!(tell(&mut s, &mut sp, 2), Delivery::Buffered);
        assert_eq!(tell(&mut s, &mut sp, 3), Delivery::Buffered);
        assert!(matches!(
            tell(&mut s, &mut sp, 4),
            Delivery::Rejected(TellError::MailboxFull(4))
        ));
        assert_eq!(s.buffered(), 2);
    }

    #[test]
    fn stale_notice_is_ignored() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        assert_eq!(
            end(&mut s, &mut sp, 99, vec![], false, true),
            AfterStop::Stale
        );
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn failed_incarnation_drops_its_backlog_but_not_later_messages() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        *sp.spawned[0].closed.borrow_mut() = true;
        tell(&mut s, &mut sp, 5);
        let after = end(&mut s, &mut sp, 1, vec![2, 3], true, true);
        assert_eq!(
            after,
            AfterStop::Respawned {
                delivered: 1,
                dropped: vec![2, 3]
            }
        );
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![5]);
    }

    #[test]
    fn a_new_incarnation_that_stops_during_the_handover_keeps_the_rest_buffered() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        s.passivate("a");
        for msg in 2..=5 {
            assert_eq!(tell(&mut s, &mut sp, msg), Delivery::Buffered);
        }
        // The next incarnation runs at once and stops itself after taking two messages.
        sp.close_after = Some(2);
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, true),
            AfterStop::Respawned {
                delivered: 2,
                dropped: vec![]
            }
        );
        assert_eq!(*sp.spawned[1].inbox.borrow(), vec![2, 3]);
        assert_eq!(s.is_active("a"), Some(false));
        assert_eq!((s.active(), s.buffered()), (0, 2));
        sp.close_after = None;
        assert_eq!(tell(&mut s, &mut sp, 6), Delivery::Buffered);
        assert_eq!(
            end(&mut s, &mut sp, 2, vec![], false, true),
            AfterStop::Respawned {
                delivered: 3,
                dropped: vec![]
            }
        );
        assert_eq!(*sp.spawned[2].inbox.borrow(), vec![4, 5, 6]);
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn no_respawn_during_shutdown() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        tell(&mut s, &mut sp, 1);
        s.passivate("a");
        tell(&mut s, &mut sp, 2);
        assert_eq!(
            end(&mut s, &mut sp, 1, vec![], false, false),
            AfterStop::Dropped(vec![2])
        );
        assert_eq!(sp.spawned.len(), 1);
    }

    /// Ids stored inline and ids stored on the heap (either side of the inline limit, and
    /// non-ASCII) are told apart, found again and reported back unchanged.
    #[test]
    fn ids_of_every_length_round_trip() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        let ids: Vec<String> = [0, 1, INLINE - 1, INLINE, INLINE + 1, 64]
            .into_iter()
            .map(|n| "x".repeat(n))
            .chain(["ü".repeat(11), "ü".repeat(12), "entity-42".into()])
            .collect();
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(
                s.deliver(id, n as u32, 1, |_| sp.spawn()),
                Delivery::Spawned
            );
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(
                s.deliver(id, 100 + n as u32, 2, |_| sp.spawn()),
                Delivery::Delivered
            );
            assert_eq!(
                *sp.spawned[n].inbox.borrow(),
                vec![n as u32, 100 + n as u32]
            );
            assert_eq!(s.is_active(id), Some(true));
        }
        assert_eq!(s.len(), ids.len());
        assert_eq!(s.is_active(&"x".repeat(INLINE + 2)), None);
        let last = ids.last().unwrap();
        s.deliver(last, 7, 9, |_| sp.spawn());
        let mut idle = s.idle_since(2);
        idle.sort();
        let mut expected: Vec<EntityId> = ids[..ids.len() - 1]
            .iter()
            .map(|i| EntityId::from(i.as_str()))
            .collect();
        expected.sort();
        assert_eq!(idle, expected);
        // A long id survives passivation and respawn under its own name.
        let long = &ids[5];
        assert!(s.passivate(long));
        assert_eq!(s.deliver(long, 8, 3, |_| sp.spawn()), Delivery::Buffered);
        let ended = Ended {
            incarnation: sp.spawned[5].inc,
            undelivered: vec![],
            failed: false,
            handled_any: true,
        };
        let mut names = Vec::new();
        let after = s.terminated(long, ended, true, 3, |key| {
            names.push(key.clone());
            sp.spawn()
        });
        assert_eq!(
            after,
            AfterStop::Respawned {
                delivered: 1,
                dropped: vec![]
            }
        );
        assert_eq!(names, vec![EntityId::from(long.as_str())]);
        assert_eq!(*sp.spawned.last().unwrap().inbox.borrow(), vec![8]);
    }

    #[test]
    fn idle_detection_uses_last_touch() {
        let mut s = ShardState::new(10);
        let mut sp = Spawner::default();
        s.deliver("a", 1, 5, |_| sp.spawn());
        s.deliver("b", 1, 10, |_| sp.spawn());
        assert_eq!(s.idle_since(7), vec![EntityId::from("a")]);
    }
}
