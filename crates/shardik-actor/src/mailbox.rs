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
    /// A bounded mailbox that rejects the newest message when full.
    pub fn bounded(capacity: usize) -> Self {
        MailboxConfig::Bounded {
            capacity: capacity.max(1),
            overflow: OverflowPolicy::DropNewest,
        }
    }

    fn capacity(&self) -> Option<usize> {
        match self {
            MailboxConfig::Unbounded => None,
            MailboxConfig::Bounded { capacity, .. } => Some(*capacity),
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
    /// Accept the new message and drop the oldest one still waiting.
    DropOldest,
}

pub(crate) enum Envelope<M> {
    User(M),
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
    user: VecDeque<Envelope<M>>,
    system: Vec<SystemMessage>,
    closed: bool,
}

/// Result of a push into a mailbox that dropped the oldest message to make room.
pub(crate) enum Pushed<M> {
    Ok,
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

    /// Queues a `watch_with` notice about the watched actor `of`, like [`push`](Self::push).
    pub(crate) fn push_watched(&self, of: ActorId, msg: M) -> Result<Pushed<M>, TellError<M>> {
        self.push_user(Some(of), msg, true)
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
        let mut pushed = Pushed::Ok;
        if let Some(bound) = self.bounded.as_ref().filter(|_| respect_bound) {
            if lanes.user.len() >= bound.capacity {
                match bound.overflow {
                    OverflowPolicy::DropNewest => return Err(TellError::MailboxFull(msg)),
                    OverflowPolicy::DropOldest => {
                        let pos = lanes
                            .user
                            .iter()
                            .position(|e| !matches!(e, Envelope::GracefulStop));
                        match pos.and_then(|p| lanes.user.remove(p)) {
                            Some(Envelope::User(old) | Envelope::Watched(_, old)) => {
                                pushed = Pushed::DroppedOldest(old)
                            }
                            _ => return Err(TellError::MailboxFull(msg)),
                        }
                    }
                }
            }
        }
        lanes.user.push_back(match watched {
            Some(of) => Envelope::Watched(of, msg),
            None => Envelope::User(msg),
        });
        // SeqCst: pairs with the run task's `PARKED` store and `has_work` load (see cell.rs).
        self.user_pending.store(true, Ordering::SeqCst);
        Ok(pushed)
    }

    /// Queues the graceful stop marker. False if the mailbox is already closed.
    pub(crate) fn push_graceful_stop(&self) -> bool {
        let mut lanes = self.lanes.lock();
        if lanes.closed {
            return false;
        }
        lanes.user.push_back(Envelope::GracefulStop);
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

    pub(crate) fn take_system(&self) -> Vec<SystemMessage> {
        let mut lanes = self.lanes.lock();
        self.system_pending.store(false, Ordering::SeqCst);
        std::mem::take(&mut lanes.system)
    }

    /// Moves every waiting user message into `batch` (which must be empty) by swapping the
    /// buffers, so the lock is held for O(1). Returns false if there was nothing.
    pub(crate) fn take_batch(&self, batch: &mut VecDeque<Envelope<M>>) -> bool {
        debug_assert!(batch.is_empty());
        let took = {
            let mut lanes = self.lanes.lock();
            if lanes.user.is_empty() {
                false
            } else {
                std::mem::swap(&mut lanes.user, batch);
                self.user_pending.store(false, Ordering::SeqCst);
                true
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
    pub(crate) fn go_idle(
        &self,
        spare: &mut VecDeque<Envelope<M>>,
        mark_idle: impl FnOnce(),
    ) -> bool {
        debug_assert!(spare.is_empty());
        let mut lanes = self.lanes.lock();
        if !lanes.user.is_empty() || !lanes.system.is_empty() {
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
            (
                std::mem::take(&mut lanes.user),
                std::mem::take(&mut lanes.system),
            )
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
                Envelope::User(m) | Envelope::Watched(_, m) => Some(m),
                Envelope::GracefulStop => None,
            })
            .collect()
    }

    #[test]
    fn bounded_drop_newest_rejects() {
        let mb = Mailbox::new(&MailboxConfig::bounded(2));
        assert!(matches!(mb.push(1), Ok(Pushed::Ok)));
        assert!(matches!(mb.push(2), Ok(Pushed::Ok)));
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

    #[test]
    fn push_past_bound_ignores_the_capacity_but_not_the_close() {
        let mb = Mailbox::new(&MailboxConfig::bounded(2));
        mb.push(1).ok();
        mb.push(2).ok();
        assert!(matches!(mb.push_past_bound(3), Ok(Pushed::Ok)));
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

    #[test]
    fn batch_take_swaps_everything() {
        let mb = Mailbox::new(&MailboxConfig::Unbounded);
        for i in 0..3 {
            mb.push(i).ok();
        }
        let mut batch = VecDeque::new();
        assert!(mb.take_batch(&mut batch));
        assert_eq!(batch.len(), 3);
        assert!(!mb.has_work());
        batch.clear();
        assert!(!mb.take_batch(&mut batch));
    }
}
