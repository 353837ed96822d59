//! The mailbox: a user lane, a system lane that overtakes it, and a closed flag, under one
//! short lock. Nothing is allocated until the first message arrives.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::actor::{ActorId, Terminated};
use crate::error::TellError;

/// Which mailbox an actor gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MailboxConfig {
    /// No limit (the default). Memory grows with the backlog; use a bounded mailbox where
    /// producers can outrun the actor for long.
    #[default]
    Unbounded,
    /// At most `capacity` messages wait to be taken (the batch the actor is working through is
    /// not counted, so at most twice `capacity` are held in memory). The one exception is
    /// [`ActorRef::try_tell_past_bound`](crate::ActorRef::try_tell_past_bound), with which an
    /// owner hands over messages it must not drop.
    Bounded {
        /// Messages that may wait.
        capacity: usize,
        /// What a full mailbox does with one more message.
        overflow: OverflowPolicy,
    },
}

impl MailboxConfig {
    /// A bounded mailbox that rejects the newest message when full. A capacity of 0 counts
    /// as 1 (it would refuse everything).
    pub fn bounded(capacity: usize) -> Self {
        MailboxConfig::Bounded {
            capacity: capacity.max(1),
            overflow: OverflowPolicy::DropNewest,
        }
    }

    fn capacity(&self) -> Option<usize> {
        match self {
            MailboxConfig::Unbounded => None,
            // At least 1, also when the fields were set by hand (as `bounded` does): a
            // capacity of 0 would refuse everything and leave `send` waiting for ever.
            MailboxConfig::Bounded { capacity, .. } => Some((*capacity).max(1)),
        }
    }
}

/// What a full bounded mailbox does with a new message.
///
/// Whatever is dropped is counted as a dead letter. [`ActorRef::try_tell`](crate::ActorRef::try_tell)
/// reports a rejected message to the sender, and [`ActorRef::send`](crate::ActorRef::send)
/// waits for room instead (back-pressure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OverflowPolicy {
    /// Reject the new message (the default).
    #[default]
    DropNewest,
    /// Accept the new message and drop the oldest one still waiting that was sent within the
    /// capacity. Termination notices of [`watch_with`](crate::Context::watch_with), messages
    /// taken past the bound
    /// ([`ActorRef::try_tell_past_bound`](crate::ActorRef::try_tell_past_bound)) and the
    /// [`graceful_stop`](crate::ActorRef::graceful_stop) marker are never dropped, though
    /// they take room; if only such entries wait, the new message is refused as with
    /// `DropNewest` ([`TellError::MailboxFull`], or a dead letter for `tell`).
    DropOldest,
}

pub(crate) enum Envelope<M> {
    User(M),
    /// A user message accepted past a bounded mailbox's capacity
    /// ([`push_past_bound`](Mailbox::push_past_bound)): the sender was told it was taken, so
    /// `DropOldest` never evicts it to make room.
    Kept(M),
    /// A [`watch_with`](crate::Context::watch_with) notice that the watched actor `.0` has
    /// terminated. Handled like a user message, unless the watch was cancelled meanwhile.
    Watched(ActorId, M),
    /// Stop once every message queued before this marker has been handled.
    GracefulStop,
}

pub(crate) enum SystemMessage {
    Stop,
    Terminated(Terminated),
}

struct Lanes<M> {
    /// The oldest waiting user envelope, kept inline next to the lock: an actor that gets one
    /// message at a time (most entities) never touches the separate `user` buffer, which is
    /// a second cache miss per message when many actors each get a message now and then.
    /// `user` is empty while this is `None`.
    first: Option<Envelope<M>>,
    /// The envelopes after `first`, oldest first.
    user: VecDeque<Envelope<M>>,
    system: Vec<SystemMessage>,
    closed: bool,
}

impl<M> Lanes<M> {
    fn user_len(&self) -> usize {
        usize::from(self.first.is_some()) + self.user.len()
    }

    fn push_user(&mut self, envelope: Envelope<M>) {
        if self.first.is_none() {
            debug_assert!(self.user.is_empty());
            self.first = Some(envelope);
        } else {
            self.user.push_back(envelope);
        }
    }

    /// Drops the oldest plain user message to make room. Termination notices (`watch_with`) and the stop
    /// marker are never dropped: each watch is owed its notice.
    fn drop_oldest(&mut self) -> Option<M> {
        if matches!(self.first, Some(Envelope::User(_))) {
            let old = self.first.take();
            self.first = self.user.pop_front();
            return match old {
                Some(Envelope::User(m)) => Some(m),
                _ => None,
            };
        }
        let pos = self
            .user
            .iter()
            .position(|e| matches!(e, Envelope::User(_)))?;
        match self.user.remove(pos) {
            Some(Envelope::User(m)) => Some(m),
            _ => None,
        }
    }
}

/// The user envelopes a run task took from its mailbox: the first one apart, so a single
/// message is handed over without the buffer.
pub(crate) struct Batch<M> {
    head: Option<Envelope<M>>,
    rest: VecDeque<Envelope<M>>,
}

impl<M> Batch<M> {
    pub(crate) fn new() -> Self {
        Batch {
            head: None,
            rest: VecDeque::new(),
        }
    }

    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<Envelope<M>> {
        self.head.take().or_else(|| self.rest.pop_front())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none() && self.rest.is_empty()
    }

    /// Everything left, oldest first.
    pub(crate) fn into_envelopes(self) -> VecDeque<Envelope<M>> {
        let mut all = self.rest;
        if let Some(head) = self.head {
            all.push_front(head);
        }
        all
    }
}

/// What a push into a mailbox did.
pub(crate) enum Pushed<M> {
    /// Queued in an empty user lane: the sender must schedule the actor.
    First,
    /// Queued behind messages that were waiting. The push that queued the first of them
    /// scheduled the actor after queueing it, and no run has taken them yet (a take empties
    /// the lane), so the run that takes them takes this one too: nothing to schedule.
    Behind,
    /// Queued after dropping the oldest waiting message to make room.
    DroppedOldest(M),
}

pub(crate) struct Mailbox<M> {
    lanes: Mutex<Lanes<M>>,
    /// True while the user lane is not empty; written under the lock, read without it.
    user_pending: AtomicBool,
    system_pending: AtomicBool,
    bounded: Option<Box<Bound>>,
}

struct Bound {
    capacity: usize,
    overflow: OverflowPolicy,
    space: Notify,
}

impl<M> Mailbox<M> {
    pub(crate) fn new(config: &MailboxConfig) -> Self {
        let bounded = config.capacity().map(|capacity| {
            let overflow = match config {
                MailboxConfig::Bounded { overflow, .. } => *overflow,
                MailboxConfig::Unbounded => OverflowPolicy::DropNewest,
            };
            Box::new(Bound {
                capacity,
                overflow,
                space: Notify::new(),
            })
        });
        Mailbox {
            lanes: Mutex::new(Lanes {
                first: None,
                user: VecDeque::new(),
                system: Vec::new(),
                closed: false,
            }),
            user_pending: AtomicBool::new(false),
            system_pending: AtomicBool::new(false),
            bounded,
        }
    }

    /// Queues a user message. The caller schedules the actor afterwards.
    pub(crate) fn push(&self, msg: M) -> Result<Pushed<M>, TellError<M>> {
        self.push_user(None, msg, true)
    }

    /// Queues a user message even if a bounded mailbox is full (nothing is rejected or
    /// dropped for it); refused only once the mailbox is closed. See
    /// [`ActorRef::try_tell_past_bound`](crate::ActorRef::try_tell_past_bound).
    pub(crate) fn push_past_bound(&self, msg: M) -> Result<Pushed<M>, TellError<M>> {
        self.push_user(None, msg, false)
    }

    /// Queues a `watch_with` notice about the watched actor `of`, even if a bounded mailbox
    /// is full: every watch gets its one notice (refused only once the mailbox is closed).
    pub(crate) fn push_watched(&self, of: ActorId, msg: M) -> Result<Pushed<M>, TellError<M>> {
        self.push_user(Some(of), msg, false)
    }

    fn push_user(
        &self,
        watched: Option<ActorId>,
        msg: M,
        respect_bound: bool,
    ) -> Result<Pushed<M>, TellError<M>> {
        let mut lanes = self.lanes.lock();
        if lanes.closed {
            return Err(TellError::Stopped(msg));
        }
        let mut pushed = if lanes.first.is_some() {
            Pushed::Behind
        } else {
            Pushed::First
        };
        if let Some(bound) = self.bounded.as_ref().filter(|_| respect_bound) {
            if lanes.user_len() >= bound.capacity {
                match bound.overflow {
                    OverflowPolicy::DropNewest => return Err(TellError::MailboxFull(msg)),
                    OverflowPolicy::DropOldest => match lanes.drop_oldest() {
                        Some(old) => pushed = Pushed::DroppedOldest(old),
                        None => return Err(TellError::MailboxFull(msg)),
                    },
                }
            }
        }
        lanes.push_user(match watched {
            Some(of) => Envelope::Watched(of, msg),
            None if respect_bound => Envelope::User(msg),
            None => Envelope::Kept(msg),
        });
        // The flag is true while the lane holds anything (only a take that empties the lane,
        // or closing, clears it), so only the first message sets it: a sender flooding an
        // actor that is behind pays no barrier per message.
        if matches!(pushed, Pushed::First) {
            // SeqCst: pairs with the run task's `PARKED` store and `has_work` load (cell.rs).
            self.user_pending.store(true, Ordering::SeqCst);
        }
        Ok(pushed)
    }

    /// Queues the graceful stop marker. False if the mailbox is already closed.
    pub(crate) fn push_graceful_stop(&self) -> bool {
        let mut lanes = self.lanes.lock();
        if lanes.closed {
            return false;
        }
        lanes.push_user(Envelope::GracefulStop);
        self.user_pending.store(true, Ordering::SeqCst);
        true
    }

    /// Queues a system message. False if the mailbox is closed (the actor is terminating).
    pub(crate) fn push_system(&self, msg: SystemMessage) -> bool {
        let mut lanes = self.lanes.lock();
        if lanes.closed {
            return false;
        }
        lanes.system.push(msg);
        self.system_pending.store(true, Ordering::SeqCst);
        true
    }

    /// Cheap check done between two user messages.
    #[inline]
    pub(crate) fn system_pending(&self) -> bool {
        self.system_pending.load(Ordering::SeqCst)
    }

    /// Cheap check that the user lane may hold messages, without the lock.
    #[inline]
    pub(crate) fn user_pending(&self) -> bool {
        self.user_pending.load(Ordering::SeqCst)
    }

    /// True if a `Stop` waits in the system lane (checked while a restart backs off).
    pub(crate) fn stop_pending(&self) -> bool {
        self.system_pending()
            && self
                .lanes
                .lock()
                .system
                .iter()
                .any(|m| matches!(m, SystemMessage::Stop))
    }

    pub(crate) fn take_system(&self) -> Vec<SystemMessage> {
        let mut lanes = self.lanes.lock();
        self.system_pending.store(false, Ordering::SeqCst);
        std::mem::take(&mut lanes.system)
    }

    /// Moves every waiting user message into `batch` (which must be empty): the first one by
    /// itself, the others by swapping the buffers, so the lock is held for O(1). Returns
    /// false if there was nothing.
    pub(crate) fn take_batch(&self, batch: &mut Batch<M>) -> bool {
        debug_assert!(batch.is_empty());
        let took = {
            let mut lanes = self.lanes.lock();
            match lanes.first.take() {
                None => false,
                Some(first) => {
                    batch.head = Some(first);
                    if !lanes.user.is_empty() {
                        std::mem::swap(&mut lanes.user, &mut batch.rest);
                    }
                    self.user_pending.store(false, Ordering::SeqCst);
                    true
                }
            }
        };
        if took {
            if let Some(bound) = &self.bounded {
                bound.space.notify_waiters();
            }
        }
        took
    }

    /// True if anything waits in either lane. Lock-free: reads the flags that pushes set
    /// under the lock.
    pub(crate) fn has_work(&self) -> bool {
        self.user_pending() || self.system_pending()
    }

    /// If both lanes are empty, gives back buffer memory and runs `mark_idle` under the lock,
    /// so no message can be queued between the check and the mark (a sender queues under the
    /// lock and schedules after it). Returns false, without calling `mark_idle`, if work waits.
    ///
    /// `spare` is the run task's emptied batch buffer: a small one is kept as the user lane's
    /// buffer (the lane has none after [`take_batch`](Self::take_batch) swapped it out), so an
    /// actor that gets a message now and then does not allocate and free a buffer every turn.
    pub(crate) fn go_idle(&self, spare: &mut Batch<M>, mark_idle: impl FnOnce()) -> bool {
        debug_assert!(spare.is_empty());
        let spare = &mut spare.rest;
        let mut lanes = self.lanes.lock();
        if lanes.first.is_some() || !lanes.system.is_empty() {
            return false;
        }
        if lanes.user.capacity() > 8 {
            lanes.user = VecDeque::new();
        }
        if lanes.user.capacity() == 0 && (1..=8).contains(&spare.capacity()) {
            std::mem::swap(&mut lanes.user, spare);
        }
        if lanes.system.capacity() > 0 {
            lanes.system = Vec::new();
        }
        mark_idle();
        true
    }

    /// Closes the mailbox and returns the user lane's envelopes that were never taken.
    pub(crate) fn close(&self) -> VecDeque<Envelope<M>> {
        let (user, _system) = {
            let mut lanes = self.lanes.lock();
            lanes.closed = true;
            self.user_pending.store(false, Ordering::SeqCst);
            self.system_pending.store(false, Ordering::SeqCst);
            let mut user = std::mem::take(&mut lanes.user);
            if let Some(first) = lanes.first.take() {
                user.push_front(first);
            }
            (user, std::mem::take(&mut lanes.system))
        };
        if let Some(bound) = &self.bounded {
            bound.space.notify_waiters();
        }
        user
    }

    /// For back-pressured senders: a future that completes when room may have been made.
    /// None for unbounded mailboxes.
    pub(crate) fn space(&self) -> Option<&Notify> {
        self.bounded.as_ref().map(|b| &b.space)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages<M>(envelopes: VecDeque<Envelope<M>>) -> Vec<M> {
        envelopes
            .into_iter()
            .filter_map(|e| match e {
                Envelope::User(m) | Envelope::Kept(m) | Envelope::Watched(_, m) => Some(m),
                Envelope::GracefulStop => None,
            })
            .collect()
    }

    #[test]
    fn bounded_drop_newest_rejects() {
        let mb = Mailbox::new(&MailboxConfig::bounded(2));
        assert!(matches!(mb.push(1), Ok(Pushed::First)));
        assert!(matches!(mb.push(2), Ok(Pushed::Behind)));
        assert!(matches!(mb.push(3), Err(TellError::MailboxFull(3))));
    }

    #[test]
    fn bounded_drop_oldest_evicts_front() {
        let mb = Mailbox::new(&MailboxConfig::Bounded {
            capacity: 2,
            overflow: OverflowPolicy::DropOldest,
        });
        mb.push(1).ok();
        mb.push(2).ok();
        assert!(matches!(mb.push(3), Ok(Pushed::DroppedOldest(1))));
        assert_eq!(messages(mb.close()), vec![2, 3]);
    }

    /// A `watch_with` notice is owed to its watch: a full bounded mailbox takes it anyway, and
    /// `DropOldest` never evicts it.
    #[test]
    fn termination_notices_are_neither_refused_nor_evicted() {
        let who = crate::actor::ActorId(7);
        let mb = Mailbox::new(&MailboxConfig::bounded(1));
        mb.push(1).ok();
        assert!(mb.push_watched(who, 9).is_ok());
        assert_eq!(messages(mb.close()), vec![1, 9]);
        let mb = Mailbox::new(&MailboxConfig::Bounded {
            capacity: 2,
            overflow: OverflowPolicy::DropOldest,
        });
        assert!(mb.push_watched(who, 9).is_ok());
        mb.push(1).ok();
        assert!(matches!(mb.push(2), Ok(Pushed::DroppedOldest(1))));
        assert!(matches!(mb.push(3), Ok(Pushed::DroppedOldest(2))));
        assert_eq!(messages(mb.close()), vec![9, 3]);
    }

    /// `DropOldest` refuses a new message when only entries it never evicts wait: a
    /// `watch_with` notice and the graceful stop marker here.
    #[test]
    fn drop_oldest_refuses_when_only_notices_and_the_stop_marker_wait() {
        let mb = Mailbox::new(&MailboxConfig::Bounded {
            capacity: 2,
            overflow: OverflowPolicy::DropOldest,
        });
        assert!(mb.push_watched(crate::actor::ActorId(7), 9).is_ok());
        assert!(mb.push_graceful_stop());
        assert!(matches!(mb.push(1), Err(TellError::MailboxFull(1))));
        assert_eq!(messages(mb.close()), vec![9]);
    }

    /// A capacity of 0 set by hand counts as 1 (it would refuse everything).
    #[test]
    fn a_zero_capacity_holds_one_message() {
        let mb = Mailbox::new(&MailboxConfig::Bounded {
            capacity: 0,
            overflow: OverflowPolicy::DropNewest,
        });
        assert!(matches!(mb.push(1), Ok(Pushed::First)));
        assert!(matches!(mb.push(2), Err(TellError::MailboxFull(2))));
    }

    /// Messages taken past the capacity were accepted (a backlog handed to a fresh
    /// incarnation): `DropOldest` evicts the oldest message sent within the capacity instead,
    /// and refuses a new one when every queued message was taken that way.
    #[test]
    fn drop_oldest_never_evicts_what_was_taken_past_the_bound() {
        let mb = Mailbox::new(&MailboxConfig::Bounded {
            capacity: 2,
            overflow: OverflowPolicy::DropOldest,
        });
        for n in 1..=3 {
            assert!(mb.push_past_bound(n).is_ok());
        }
        assert!(matches!(mb.push(4), Err(TellError::MailboxFull(4))));
        assert_eq!(messages(mb.close()), vec![1, 2, 3]);
        let mb = Mailbox::new(&MailboxConfig::Bounded {
            capacity: 2,
            overflow: OverflowPolicy::DropOldest,
        });
        assert!(mb.push_past_bound(1).is_ok());
        mb.push(2).ok();
        assert!(mb.push_past_bound(3).is_ok());
        assert!(matches!(mb.push(4), Ok(Pushed::DroppedOldest(2))));
        assert_eq!(messages(mb.close()), vec![1, 3, 4]);
    }

    #[test]
    fn push_past_bound_ignores_the_capacity_but_not_the_close() {
        let mb = Mailbox::new(&MailboxConfig::bounded(2));
        mb.push(1).ok();
        mb.push(2).ok();
        assert!(matches!(mb.push_past_bound(3), Ok(Pushed::Behind)));
        assert!(matches!(mb.push(4), Err(TellError::MailboxFull(4))));
        assert_eq!(messages(mb.close()), vec![1, 2, 3]);
        assert!(matches!(mb.push_past_bound(5), Err(TellError::Stopped(5))));
    }

    #[test]
    fn closed_mailbox_refuses_and_returns_leftovers_in_order() {
        let mb = Mailbox::new(&MailboxConfig::Unbounded);
        for i in 0..5 {
            mb.push(i).ok();
        }
        assert!(mb.push_graceful_stop());
        assert_eq!(messages(mb.close()), vec![0, 1, 2, 3, 4]);
        assert!(matches!(mb.push(9), Err(TellError::Stopped(9))));
        assert!(!mb.push_system(SystemMessage::Stop));
    }

    /// Only the push into an empty user lane asks the sender to schedule the actor; once a
    /// take emptied the lane (or the mailbox went idle), the next push is first again.
    #[test]
    fn only_the_first_waiting_message_schedules() {
        let mb = Mailbox::new(&MailboxConfig::Unbounded);
        assert!(matches!(mb.push(1), Ok(Pushed::First)));
        assert!(mb.has_work());
        assert!(matches!(mb.push(2), Ok(Pushed::Behind)));
        assert!(matches!(mb.push(3), Ok(Pushed::Behind)));
        let mut batch = Batch::new();
        assert!(mb.take_batch(&mut batch));
        assert!(!mb.has_work());
        assert!(
            matches!(mb.push(4), Ok(Pushed::First)),
            "the lane was emptied"
        );
        assert!(
            mb.has_work(),
            "the first push after a take sets the flag again"
        );
        assert!(matches!(mb.push(5), Ok(Pushed::Behind)));
        assert_eq!(messages(batch.into_envelopes()), vec![1, 2, 3]);
        let mut batch = Batch::new();
        assert!(mb.take_batch(&mut batch));
        assert_eq!(messages(batch.into_envelopes()), vec![4, 5]);
        assert!(mb.go_idle(&mut Batch::new(), || {}));
        assert!(matches!(mb.push(6), Ok(Pushed::First)));
    }

    #[test]
    fn batch_take_swaps_everything() {
        let mb = Mailbox::new(&MailboxConfig::Unbounded);
        for i in 0..3 {
            mb.push(i).ok();
        }
        let mut batch = Batch::new();
        assert!(mb.take_batch(&mut batch));
        assert_eq!(messages(batch.into_envelopes()), vec![0, 1, 2]);
        assert!(!mb.has_work());
        let mut batch = Batch::new();
        assert!(!mb.take_batch(&mut batch));
        // One message at a time: handed over without the buffer, and in order after a
        // batch.
        mb.push(7).ok();
        assert!(mb.take_batch(&mut batch));
        assert!(matches!(batch.pop_front(), Some(Envelope::User(7))));
        assert!(batch.pop_front().is_none());
    }
}
