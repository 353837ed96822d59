//! [`Context`]: what a handler can do besides changing its own state.

use std::sync::Arc;
use std::time::Duration;

use crate::actor::{Actor, ActorId, Terminated};
use crate::actor_ref::ActorRef;
use crate::cell::{Cell, CellHandle, Parent};
use crate::mailbox::SystemMessage;
use crate::props::Props;
use crate::system::ActorSystem;

/// Identifies a timer started with [`Context::schedule_once`] or
/// [`Context::schedule_periodic`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(pub(crate) u64);

/// The actor's view of the runtime, passed to every handler and hook.
pub struct Context<A: Actor> {
    cell: Arc<Cell<A>>,
    stop: bool,
}

impl<A: Actor> Context<A> {
    pub(crate) fn new(cell: Arc<Cell<A>>) -> Self {
        Context { cell, stop: false }
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop
    }

    /// A reference to this actor, to hand out or to send to itself.
    pub fn myself(&self) -> ActorRef<A::Msg> {
        ActorRef::from_cell(self.cell.clone())
    }

    /// This actor's id.
    pub fn id(&self) -> ActorId {
        self.cell.id
    }

    /// This actor's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.cell.name.as_deref()
    }

    /// The system this actor runs in.
    pub fn system(&self) -> ActorSystem {
        ActorSystem::from_shared(self.cell.system.clone())
    }

    /// Stops this actor once the current handler returns. Messages still queued are not handled:
    /// they go to the termination hook, or are counted as dead letters.
    pub fn stop(&mut self) {
        self.stop = true;
    }

    /// Spawns a child actor. Children stop before their parent's
    /// [`stopped`](Actor::stopped) hook runs. A child spawned while its parent is stopping,
    /// or once the system's shutdown has begun, is stopped at once (its `started` runs
    /// first).
    pub fn spawn<C: Actor>(&mut self, props: Props<C>) -> ActorRef<C::Msg> {
        let parent: Arc<dyn CellHandle> = self.cell.clone();
        let child = Cell::create(
            &self.cell.system,
            Parent::Actor(Arc::downgrade(&parent)),
            props,
        );
        // Checked after the child is registered with its parent, like the system does for
        // top-level actors: a shutdown that begins after the check stops the parent, which
        // stops the child.
        let added = self.cell.add_child(child.clone());
        if !added || self.cell.system.is_shutting_down() {
            if added {
                tracing::debug!(system = %self.cell.system.name, "child spawned during shutdown; stopping it at once");
            }
            child.send_system(SystemMessage::Stop);
        }
        child.launch();
        ActorRef::from_cell(child)
    }

    /// Watches `other`: when it terminates (or at once, if it already has), this actor's
    /// [`Actor::terminated`] hook runs with a [`Terminated`] notice, as a system message that
    /// overtakes queued user messages. Watching stops when this actor stops.
    pub fn watch<T: Send + 'static>(&mut self, other: &ActorRef<T>) {
        let me = Arc::downgrade(&self.cell);
        self.register_watch(
            other,
            Box::new(move |t: &Terminated| {
                if let Some(cell) = me.upgrade() {
                    cell.send_system(SystemMessage::Terminated(t.clone()));
                }
            }),
        );
    }

    /// Watches `other` and receives `msg` as an ordinary user message when it terminates.
    pub fn watch_with<T: Send + 'static>(&mut self, other: &ActorRef<T>, msg: A::Msg) {
        let me = Arc::downgrade(&self.cell);
        let of = other.id();
        self.register_watch(
            other,
            Box::new(move |_| {
                if let Some(cell) = me.upgrade() {
                    cell.tell_watched(of, msg);
                }
            }),
        );
    }

    /// Stops watching `other`; no notice is delivered after this returns, not even one that
    /// was already queued.
    pub fn unwatch<T: Send + 'static>(&mut self, other: &ActorRef<T>) {
        other.handle().remove_watcher(self.cell.id);
        let id = other.id();
        self.cell
            .with_extras(|x| x.watching.retain(|(w, _)| *w != id));
    }

    fn register_watch<T: Send + 'static>(
        &mut self,
        other: &ActorRef<T>,
        notify: crate::cell::WatchNotify,
    ) {
        let handle = other.handle();
        handle.remove_watcher(self.cell.id);
        let weak = Arc::downgrade(&handle);
        self.cell.with_extras(|x| {
            x.watching.retain(|(w, _)| *w != handle.id());
            x.watching.push((handle.id(), weak));
        });
        handle.add_watcher(self.cell.id, notify);
    }

    /// Sends `msg` to this actor after `delay`. Timers are cancelled when the actor stops or
    /// is restarted (a restarted actor schedules its timers again in `started`).
    pub fn schedule_once(&mut self, delay: Duration, msg: A::Msg) -> TimerId {
        let weak = Arc::downgrade(&self.cell);
        self.start_timer(move |id| async move {
            tokio::time::sleep(delay).await;
            if let Some(cell) = weak.upgrade() {
                cell.fire_timer(id, msg, true);
            }
        })
    }

    /// Sends `make()` to this actor every `interval`, first after one interval. Ticks are
    /// queued like any message: while the actor is busy they wait in its mailbox. If the
    /// timer task itself falls behind, the next tick is delayed, not doubled. An interval
    /// too long to add to the clock (such as `Duration::MAX`) never ticks.
    ///
    /// # Panics
    ///
    /// If `interval` is zero, like [`tokio::time::interval`].
    pub fn schedule_periodic(
        &mut self,
        interval: Duration,
        make: impl Fn() -> A::Msg + Send + 'static,
    ) -> TimerId {
        assert!(
            !interval.is_zero(),
            "schedule_periodic: the interval must be above zero"
        );
        let weak = Arc::downgrade(&self.cell);
        self.start_timer(move |id| async move {
            let first = crate::deadline::instant_after(tokio::time::Instant::now(), interval);
            let mut ticks = tokio::time::interval_at(first, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(cell) = weak.upgrade() else {
                    return;
                };
                // `make` runs outside the cell's locks; its tick is queued only if the timer
                // is still registered then.
                if !cell.fire_timer(id, make(), false) {
                    return;
                }
            }
        })
    }

    /// Cancels a timer. Returns false if it had already fired (one-shot) or was cancelled.
    /// After it returns true the timer delivers nothing more, also when its task was
    /// already running (a tick queued before the call stays queued).
    pub fn cancel_timer(&mut self, timer: TimerId) -> bool {
        self.cell.with_extras(|x| x.cancel_timer(timer.0))
    }

    fn start_timer<F, Fut>(&mut self, body: F) -> TimerId
    where
        F: FnOnce(u64) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let cell = &self.cell;
        // Spawn under the lock so a timer that fires at once finds its own entry to remove.
        let id = cell.with_extras(|x| {
            x.next_timer += 1;
            let id = x.next_timer;
            let task = cell.system.runtime.spawn(body(id));
            x.timers.insert(id, task.abort_handle());
            id
        });
        TimerId(id)
    }
}
