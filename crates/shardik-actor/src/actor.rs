//! The [`Actor`] trait and the values that describe an actor's end.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::context::Context;

/// The error a handler or lifecycle hook returns. Any error type converts into it with `?`;
/// a plain string works too: `Err("bad input".into())`.
pub type ActorError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A stateful unit of computation that processes one message at a time.
///
/// An actor has exactly one message type, usually an enum. Handlers are `async`: an actor may
/// await inside a handler (for example an [`ask`](crate::ActorRef::ask) to another actor) and no
/// other message of the same actor runs meanwhile.
///
/// Implement the methods with `async fn`:
///
/// ```
/// use shardik_actor::{Actor, ActorError, Context};
///
/// struct Greeter;
///
/// impl Actor for Greeter {
///     type Msg = String;
///     async fn handle(&mut self, name: String, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
///         if name.is_empty() {
///             return Err("empty name".into()); // handled by the supervisor strategy
///         }
///         println!("hello, {name}");
///         Ok(())
///     }
/// }
/// ```
pub trait Actor: Sized + Send + 'static {
    /// The one message type this actor accepts.
    type Msg: Send + 'static;

    /// Handles one message. An `Err` or a panic is a failure, dealt with by the actor's
    /// [`SupervisorStrategy`](crate::SupervisorStrategy).
    fn handle(
        &mut self,
        msg: Self::Msg,
        ctx: &mut Context<Self>,
    ) -> impl Future<Output = Result<(), ActorError>> + Send;

    /// Runs once per incarnation before the first message (also after each restart).
    /// A failure here counts like a failure in [`handle`](Actor::handle).
    fn started(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> impl Future<Output = Result<(), ActorError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }

    /// Runs once when the actor stops for good (not between restarts), after its children have
    /// stopped. Messages still queued at that point are handed to the
    /// [termination hook](crate::Props::on_termination) or counted as dead letters.
    fn stopped(&mut self, ctx: &mut Context<Self>) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }

    /// Called when an actor watched with [`Context::watch`] terminates. The default does
    /// nothing; return an error to treat the termination as a failure of this actor.
    fn terminated(
        &mut self,
        ctx: &mut Context<Self>,
        terminated: Terminated,
    ) -> impl Future<Output = Result<(), ActorError>> + Send {
        let _ = (ctx, terminated);
        async { Ok(()) }
    }
}

/// The last id handed out in this process (actor ids and the ids of `terminated()` waits
/// come from one counter, shared by every [`ActorSystem`](crate::ActorSystem)).
static LAST_ID: AtomicU64 = AtomicU64::new(0);

/// A process-unique identifier of one actor incarnation chain (restarts keep the id).
///
/// Ids come from one counter shared by every [`ActorSystem`](crate::ActorSystem) of the
/// process and are never reused, so actors of two systems in one process never share an id
/// (watch bookkeeping relies on that: until 2026-11-29 each system counted from 1, and an
/// `unwatch` by actor #5 of one system could withdraw watcher #5 of another).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ActorId(pub(crate) u64);

impl ActorId {
    /// A fresh id, unique in the process.
    pub(crate) fn next() -> ActorId {
        ActorId(LAST_ID.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// The raw number, unique within the process (across all actor systems in it).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why an actor stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// It was asked to stop ([`Context::stop`], [`ActorRef::stop`](crate::ActorRef::stop),
    /// [`ActorRef::graceful_stop`](crate::ActorRef::graceful_stop), its parent stopped, or the
    /// system shut down).
    Stopped,
    /// It failed and its supervisor strategy decided to stop it (or the restart limit was hit,
    /// or it could not be recreated). The message describes the last failure.
    Failed(String),
}

/// The notice a watcher receives when a watched actor has terminated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terminated {
    /// The actor that terminated.
    pub id: ActorId,
    /// Its name, if it had one.
    pub name: Option<std::sync::Arc<str>>,
    /// Why it stopped.
    pub reason: StopReason,
}

/// What an actor left behind when it terminated; given to the
/// [termination hook](crate::Props::on_termination).
pub struct Termination<M> {
    /// The actor that terminated.
    pub id: ActorId,
    /// Its name, if it had one.
    pub name: Option<std::sync::Arc<str>>,
    /// Why it stopped.
    pub reason: StopReason,
    /// User messages that were accepted into its mailbox but never handled, in arrival order.
    pub undelivered: Vec<M>,
    /// Whether it handled at least one user message (with any of its instances, across
    /// restarts). False for an actor that stopped in its `started` hook, say.
    pub handled_any: bool,
}

impl<M> fmt::Debug for Termination<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Termination")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("reason", &self.reason)
            .field("undelivered", &self.undelivered.len())
            .field("handled_any", &self.handled_any)
            .finish()
    }
}
