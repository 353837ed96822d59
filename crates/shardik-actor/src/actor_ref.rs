//! [`ActorRef`]: the typed handle through which everyone talks to an actor.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::actor::{Actor, ActorId, Terminated};
use crate::cell::{Cell, CellHandle, RefTarget};
use crate::dead_letters::DeadReason;
use crate::error::{AskError, TellError};
use crate::mailbox::SystemMessage;
use crate::reply::ReplyTo;

/// A reference to an actor that accepts messages of type `M`.
///
/// Cloning is cheap (one reference count). [`tell`](ActorRef::tell) never blocks and never
/// fails loudly: a message that cannot be queued becomes a counted, logged dead letter.
/// [`try_tell`](ActorRef::try_tell) hands such a message back instead, and
/// [`send`](ActorRef::send) waits for room in a bounded mailbox.
pub struct ActorRef<M> {
    target: Arc<dyn RefTarget<M>>,
}

impl<M: Send + 'static> ActorRef<M> {
    pub(crate) fn from_cell<A: Actor<Msg = M>>(cell: Arc<Cell<A>>) -> Self {
        ActorRef { target: cell }
    }

    pub(crate) fn handle(&self) -> Arc<dyn CellHandle> {
        self.target.clone()
    }

    /// Queues `msg` without waiting. If the actor has stopped, or its bounded mailbox is full,
    /// the message is recorded as a dead letter.
    #[inline]
    pub fn tell(&self, msg: M) {
        if let Err(e) = self.target.try_tell(msg) {
            self.dead_letter(&e);
        }
    }

    /// Queues `msg` without waiting, or hands it back with the reason it was refused.
    #[inline]
    pub fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.target.try_tell(msg)
    }

    /// Queues `msg` even if the actor's bounded mailbox is full; refused (handed back as
    /// [`TellError::Stopped`]) only if the actor has stopped.
    ///
    /// For owners that hand over messages they already accepted on the actor's behalf and
    /// must not drop, such as a sharding region passing the backlog of a passivated entity to
    /// its next incarnation. The mailbox then holds more than its capacity until the actor
    /// catches up, and other senders are refused meanwhile (under
    /// [`OverflowPolicy::DropOldest`](crate::OverflowPolicy::DropOldest) a new message evicts
    /// one sent within the capacity, never one taken past it). Everyone else should use
    /// [`try_tell`](ActorRef::try_tell) or [`send`](ActorRef::send).
    #[inline]
    pub fn try_tell_past_bound(&self, msg: M) -> Result<(), TellError<M>> {
        self.target.try_tell_past_bound(msg)
    }

    /// Queues `msg`, waiting while a bounded mailbox is full (back-pressure). Fails only if
    /// the actor stops. For an unbounded mailbox this is the same as `try_tell`.
    pub async fn send(&self, msg: M) -> Result<(), TellError<M>> {
        let mut msg = msg;
        loop {
            let Some(space) = self.target.space() else {
                return self.target.try_tell(msg);
            };
            let notified = space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.target.try_tell(msg) {
                Err(TellError::MailboxFull(back)) => msg = back,
                other => return other,
            }
            notified.await;
        }
    }

    /// Sends a request built by `make` around a fresh [`ReplyTo`] and waits up to `timeout`
    /// for the answer.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use shardik_actor::{Actor, ActorError, ActorSystem, AskError, Context, ReplyTo};
    /// enum Msg { Ping(ReplyTo<&'static str>), Ignore(ReplyTo<&'static str>) }
    /// struct Ponger;
    /// impl Actor for Ponger {
    ///     type Msg = Msg;
    ///     async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
    ///         if let Msg::Ping(r) = msg { r.reply("pong") }
    ///         Ok(())
    ///     }
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let system = ActorSystem::new("docs");
    /// let ponger = system.spawn(Ponger);
    /// assert_eq!(ponger.ask(Msg::Ping, Duration::from_secs(1)).await, Ok("pong"));
    /// // Dropping the ReplyTo unanswered fails the ask at once, without waiting the timeout.
    /// assert_eq!(ponger.ask(Msg::Ignore, Duration::from_secs(60)).await, Err(AskError::NoReply));
    /// # }
    /// ```
    pub async fn ask<R>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError> {
        let (reply_to, rx) = ReplyTo::channel();
        if let Err(e) = self.target.try_tell(make(reply_to)) {
            self.dead_letter(&e);
            return Err(e.into());
        }
        match self.target.system().timeout(timeout, rx).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(AskError::NoReply),
            Err(_) => {
                metrics::counter!("shardik_ask_timeouts_total", "via" => "actor_ref").increment(1);
                Err(AskError::Timeout(timeout))
            }
        }
    }

    /// Stops the actor as soon as its current message is done. System messages overtake user
    /// messages, so queued messages are not handled: they go to the actor's termination hook,
    /// or become dead letters.
    pub fn stop(&self) {
        self.target.send_system(SystemMessage::Stop);
    }

    /// Stops the actor after it has handled every message queued before this call. Messages
    /// queued afterwards are not handled: until the actor reaches the stop they are still
    /// accepted, then handed to the termination hook (or counted as dead letters without one);
    /// after it has stopped they are refused as dead letters. The stop marker takes one slot
    /// of a bounded mailbox.
    pub fn graceful_stop(&self) {
        self.target.graceful_stop();
    }

    /// Waits until the actor has terminated (at once if it already has). Dropping the
    /// future before then (a `select!` that took another branch) withdraws its wait.
    pub async fn terminated(&self) -> Terminated {
        /// Withdraws the wait when the future is dropped unfinished (and costs a scan of
        /// an empty list when it finished: termination takes the waits).
        struct Withdraw<'a>(&'a dyn CellHandle, ActorId);
        impl Drop for Withdraw<'_> {
            fn drop(&mut self) {
                self.0.remove_watcher(self.1);
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiter = ActorId::next();
        self.target.add_watcher(
            waiter,
            Box::new(move |t| {
                let _ = tx.send(t.clone());
            }),
        );
        let _withdraw = Withdraw(&*self.target, waiter);
        rx.await.expect("termination notice is always sent")
    }

    /// True once the actor has terminated for good: its `stopped` hook and its termination
    /// hook have run and its undelivered messages are accounted for. It turns true just
    /// before the actor is uncounted from [`live_actors`](crate::ActorSystem::live_actors)
    /// and its watchers and [`terminated`](ActorRef::terminated) waiters are told.
    pub fn is_terminated(&self) -> bool {
        self.target.is_terminated()
    }

    /// The actor's id.
    pub fn id(&self) -> ActorId {
        self.target.id()
    }

    /// The actor's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.target.name().map(|n| &**n)
    }

    fn dead_letter(&self, e: &TellError<M>) {
        let reason = match e {
            TellError::Stopped(_) => DeadReason::RecipientStopped,
            TellError::MailboxFull(_) => DeadReason::MailboxFull,
        };
        let label = match self.target.name() {
            Some(n) => format!("{n} ({})", self.target.id()),
            None => self.target.id().to_string(),
        };
        let sys = self.target.system();
        sys.dead_letters
            .record(&sys.name, &label, std::any::type_name::<M>(), reason);
    }
}

impl<M> Clone for ActorRef<M> {
    fn clone(&self) -> Self {
        ActorRef {
            target: self.target.clone(),
        }
    }
}

impl<M: Send + 'static> PartialEq for ActorRef<M> {
    fn eq(&self, other: &Self) -> bool {
        self.target.id() == other.target.id()
    }
}

impl<M: Send + 'static> Eq for ActorRef<M> {}

impl<M: Send + 'static> Hash for ActorRef<M> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.target.id().hash(state)
    }
}

impl<M: Send + 'static> fmt::Debug for ActorRef<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ActorRef");
        d.field("id", &self.target.id());
        if let Some(name) = self.target.name() {
            d.field("name", name);
        }
        d.finish()
    }
}
