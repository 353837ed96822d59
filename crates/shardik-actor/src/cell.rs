//! The actor cell: state, mailbox, scheduling flag, and the run loop that drives it.
//!
//! Scheduling: `sched` is `IDLE` while no task runs the actor. Whoever queues work and wins the
//! `IDLE -> SCHEDULED` exchange hands one turn to the dispatcher (see `dispatcher.rs`), which
//! polls it inline and spawns it as a task only if it has to wait. The run task takes the [`RunState`] out of
//! its slot, handles messages in batches, and on an empty mailbox puts the state back and
//! stores `IDLE` under the mailbox lock, only if the mailbox is still empty then (a sender that
//! queued before saw `SCHEDULED` and did not spawn, so the run task must see its message; a
//! sender that queues after sees `IDLE` and spawns). Only a message queued into an empty user
//! lane schedules: one queued behind waiting messages is taken with them by the turn the first
//! one's sender scheduled (see `Pushed::Behind`). `TERMINATED` is final.
//!
//! Lingering: even a dispatched turn costs a queue round trip and an allocation, which dominates
//! when an actor receives a message every few microseconds (ping-pong, request/response). A
//! *hot* actor (its previous turn ended less than [`HOT_GAP`] ago) therefore keeps its task:
//! it registers its waker, stores `PARKED`, looks at the mailbox once more and sleeps until a
//! sender moves `PARKED -> HANDOFF` and wakes it (no spawn), or until a [`LINGER`] window
//! passes; it lingers window by window while work keeps coming, and after a window without
//! work it takes the normal idle path above. Only the parked task leaves
//! `HANDOFF` and only it moves `PARKED` anywhere but `HANDOFF`, so there is never more than
//! one task that owns the run state. Actors that receive rarely never linger, so an idle
//! actor still costs no task.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::actor::{Actor, ActorError, ActorId, StopReason, Terminated, Termination};
use crate::context::Context;
use crate::dead_letters::DeadReason;
use crate::dispatcher::{Runnable, Turn};
use crate::error::TellError;
use crate::mailbox::{Batch, Envelope, Mailbox, Pushed, SystemMessage};
use crate::props::{Factory, Props, SettingsRef};
use crate::supervision::{RestartWindow, SupervisorStrategy};
use crate::system::SystemShared;

const IDLE: u8 = 0;
const SCHEDULED: u8 = 1;
const TERMINATED: u8 = 2;
/// A run task is parked on `Cell::waker`, still owning the run state.
const PARKED: u8 = 3;
/// A sender has handed the next turn to the parked run task and woken it.
const HANDOFF: u8 = 4;

/// How recently an actor must have finished a turn to keep its task parked between turns,
/// and how long it stays parked without work before giving the task up.
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// How recently an actor must have ended its previous turn for the end of this one to start
/// lingering: a tenth of [`LINGER`], so that a lingering task expects several messages per
/// window. Lingering costs a task spawn, a timer and its expiry each time a window passes
/// without work; an actor that hears something about once per window (a hot key among many,
/// every few hundred microseconds) paid that on nearly every message, which the dispatcher's
/// turn does not cost (2026-11-29, sharded asks on skewed keys, alternating runs: median 0.88
/// against 0.67 M/s with a 1 ms gap; ping-pong, sequential asks and sharded tells the same).
pub(crate) const HOT_GAP: Duration = Duration::from_micros(100);

pub(crate) type WatchNotify = Box<dyn FnOnce(&Terminated) + Send>;

/// The type-erased face of a cell: what parents, watchers and the system need.
pub(crate) trait CellHandle: Send + Sync + 'static {
    fn id(&self) -> ActorId;
    fn name(&self) -> Option<&Arc<str>>;
    fn send_system(&self, msg: SystemMessage);
    /// Registers `notify` to run once when this actor terminates (at once if it already has).
    fn add_watcher(&self, watcher: ActorId, notify: WatchNotify);
    fn remove_watcher(&self, watcher: ActorId);
    fn remove_child(&self, child: ActorId);
    fn is_terminated(&self) -> bool;
}

/// The typed face of a cell, behind [`ActorRef`](crate::ActorRef).
pub(crate) trait RefTarget<M>: CellHandle {
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>>;
    fn try_tell_past_bound(&self, msg: M) -> Result<(), TellError<M>>;
    fn graceful_stop(&self);
    fn space(&self) -> Option<&Notify>;
    fn system(&self) -> &Arc<SystemShared>;
}

pub(crate) enum Parent {
    System,
    Actor(Weak<dyn CellHandle>),
}

/// Bookkeeping most actors never touch; allocated on first use.
#[derive(Default)]
pub(crate) struct Extras {
    pub(crate) terminated: Option<Terminated>,
    pub(crate) stopping: bool,
    pub(crate) watchers: Vec<(ActorId, WatchNotify)>,
    pub(crate) watching: Vec<(ActorId, Weak<dyn CellHandle>)>,
    pub(crate) children: HashMap<ActorId, Arc<dyn CellHandle>>,
    pub(crate) timers: HashMap<u64, tokio::task::AbortHandle>,
    pub(crate) next_timer: u64,
    /// The run task's waker while a restart backs off: a system message wakes it.
    pub(crate) backoff: Option<std::task::Waker>,
}

impl Extras {
    /// Unregisters timer `id` and aborts its task. False if it was not registered: a
    /// one-shot timer that fired, or a timer cancelled before (by the actor, a restart or
    /// the stop). A timer task that is already running when it is aborted goes on until its
    /// next await; it delivers only if it still finds itself registered under this lock
    /// (see [`Cell::fire_timer`]), so a timer unregistered here never delivers again.
    pub(crate) fn cancel_timer(&mut self, id: u64) -> bool {
        match self.timers.remove(&id) {
            Some(task) => {
                task.abort();
                true
            }
            None => false,
        }
    }

    /// Unregisters and aborts every timer (at a restart and at the stop).
    fn cancel_all_timers(&mut self) {
        for (_, task) in self.timers.drain() {
            task.abort();
        }
    }
}

/// What the run task owns while it runs; parked in the cell between turns.
pub(crate) struct RunState<A: Actor> {
    actor: Option<A>,
    factory: Option<Factory<A>>,
    restarts: RestartWindow,
    started: bool,
    /// Whether a user message was handed to an instance (see [`Termination::handled_any`]).
    handled_any: bool,
    /// When the last turn that handled messages ended: decides whether the actor is hot.
    last_turn_end: Option<tokio::time::Instant>,
}

pub(crate) struct Cell<A: Actor> {
    pub(crate) id: ActorId,
    pub(crate) name: Option<Arc<str>>,
    me: Weak<Cell<A>>,
    pub(crate) system: Arc<SystemShared>,
    parent: Parent,
    sched: AtomicU8,
    pub(crate) mailbox: Mailbox<A::Msg>,
    run: Mutex<Option<Box<RunState<A>>>>,
    settings: SettingsRef<A::Msg>,
    extras: Mutex<Option<Box<Extras>>>,
    /// The parked run task, while `sched` is `PARKED` (see the module docs).
    waker: AtomicWaker,
}

impl<A: Actor> Cell<A> {
    /// A new cell, started at once (for tests; the system and contexts register the cell
    /// before they start it, see [`create`](Self::create)).
    #[cfg(test)]
    pub(crate) fn spawn(system: &Arc<SystemShared>, parent: Parent, props: Props<A>) -> Arc<Self> {
        let cell = Self::create(system, parent, props);
        cell.launch();
        cell
    }

    /// A new cell, not started yet: the caller registers it (with the system or its parent)
    /// and then calls [`launch`](Self::launch). Registered after its first turn could run,
    /// an actor that stops at once would be removed before it was inserted, and the stale
    /// entry kept it (and, at the top level, its system) alive.
    pub(crate) fn create(system: &Arc<SystemShared>, parent: Parent, props: Props<A>) -> Arc<Self> {
        let id = ActorId::next();
        let cell = Arc::new_cyclic(|me| Cell {
            id,
            name: props.name,
            me: me.clone(),
            system: system.clone(),
            parent,
            sched: AtomicU8::new(SCHEDULED),
            mailbox: Mailbox::new(props.settings.mailbox()),
            run: Mutex::new(None),
            settings: props.settings,
            extras: Mutex::new(None),
            waker: AtomicWaker::new(),
        });
        let state = Box::new(RunState {
            actor: props.instance,
            factory: props.factory,
            restarts: RestartWindow::default(),
            started: false,
            handled_any: false,
            last_turn_end: None,
        });
        *cell.run.lock() = Some(state);
        system.actor_started();
        cell
    }

    /// Starts a cell made by [`create`](Self::create): its first turn runs `started`.
    pub(crate) fn launch(&self) {
        self.dispatch();
    }

    /// Makes sure a run task will look at the mailbox: spawns one if the actor is idle, wakes
    /// the parked one if it lingers, and does nothing if one is running.
    #[inline]
    fn schedule(&self) {
        let mut state = self.sched.load(Ordering::Acquire);
        loop {
            let next = match state {
                IDLE => SCHEDULED,
                PARKED => HANDOFF,
                _ => return,
            };
            match self
                .sched
                .compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next == HANDOFF => return self.waker.wake(),
                Ok(_) => return self.dispatch(),
                Err(now) => state = now,
            }
        }
    }

    /// Hands a turn of this actor to the system's dispatcher.
    fn dispatch(&self) {
        if let Some(cell) = self.me.upgrade() {
            self.system.dispatcher.dispatch(&self.system.runtime, cell);
        }
    }

    pub(crate) fn with_extras<T>(&self, f: impl FnOnce(&mut Extras) -> T) -> T {
        let mut guard = self.extras.lock();
        f(guard.get_or_insert_with(Default::default))
    }

    fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} ({})", self.id),
            None => format!("{} <{}>", self.id, short_type_name::<A>()),
        }
    }

    pub(crate) fn dead_letter(&self, reason: DeadReason) {
        self.system.dead_letters.record(
            &self.system.name,
            &self.label(),
            std::any::type_name::<A::Msg>(),
            reason,
        );
    }

    /// Queues a [`watch_with`](Context::watch_with) notice about `of`; like `tell`, a refused
    /// one becomes a dead letter.
    pub(crate) fn tell_watched(&self, of: ActorId, msg: A::Msg) {
        match self.mailbox.push_watched(of, msg) {
            Ok(pushed) => self.queued(pushed),
            Err(TellError::Stopped(_)) => self.dead_letter(DeadReason::RecipientStopped),
            Err(TellError::MailboxFull(_)) => self.dead_letter(DeadReason::MailboxFull),
        }
    }

    /// Delivers `msg` from timer `id`, if the timer is still registered: a one-shot timer
    /// unregisters itself (`once`), a periodic one stays. Returns false, dropping `msg`, if
    /// it was not registered (cancelled, or dropped by a restart or the stop): the timer
    /// task then ends.
    ///
    /// The check and the push happen under the extras lock, which [`Extras::cancel_timer`]
    /// and the restart and stop paths take to unregister timers: either the message is
    /// queued before the timer is unregistered (a one-shot timer then counts as fired and
    /// `cancel_timer` returns false; a queued tick stays queued), or it is never queued.
    /// Aborting the timer's task is not enough on its own: it does not interrupt a poll that
    /// is already running. Lock order: extras, then mailbox; nothing takes the extras lock
    /// while it holds the mailbox lock.
    pub(crate) fn fire_timer(&self, id: u64, msg: A::Msg, once: bool) -> bool {
        let pushed = {
            let mut guard = self.extras.lock();
            let registered = guard.as_mut().is_some_and(|x| {
                if once {
                    x.timers.remove(&id).is_some()
                } else {
                    x.timers.contains_key(&id)
                }
            });
            if !registered {
                drop(guard);
                drop(msg);
                return false;
            }
            self.mailbox.push(msg)
        };
        match pushed {
            Ok(pushed) => self.queued(pushed),
            Err(TellError::Stopped(msg)) => {
                drop(msg);
                self.dead_letter(DeadReason::RecipientStopped);
            }
            Err(TellError::MailboxFull(msg)) => {
                drop(msg);
                self.dead_letter(DeadReason::MailboxFull);
            }
        }
        true
    }

    #[inline]
    fn queued(&self, pushed: Pushed<A::Msg>) {
        match pushed {
            Pushed::First => self.schedule(),
            Pushed::Behind => {}
            Pushed::DroppedOldest(old) => {
                drop(old);
                self.dead_letter(DeadReason::MailboxFull);
            }
        }
    }

    /// Consumes this actor's watch of `of` for a termination notice about to be delivered.
    /// False if the watch was cancelled with `unwatch` (or already notified): the notice is
    /// then dropped, so none arrives after `unwatch` even if it was already queued.
    fn take_watch(&self, of: ActorId) -> bool {
        self.with_extras(|x| match x.watching.iter().position(|(w, _)| *w == of) {
            Some(i) => {
                x.watching.swap_remove(i);
                true
            }
            None => false,
        })
    }

    /// Adds a child. False if this actor is stopping (the caller stops the child at once):
    /// a child spawned while its parent stops, from the `stopped` hook say, is still awaited
    /// before the parent terminates. Also false, without adding it, once the parent has
    /// terminated.
    pub(crate) fn add_child(&self, child: Arc<dyn CellHandle>) -> bool {
        self.with_extras(|x| {
            if x.terminated.is_some() {
                return false;
            }
            x.children.insert(child.id(), child);
            !x.stopping
        })
    }
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

impl<A: Actor> Runnable for Cell<A> {
    fn turn(self: Arc<Self>) -> Turn {
        Box::pin(run(self))
    }
}

impl<A: Actor> CellHandle for Cell<A> {
    fn id(&self) -> ActorId {
        self.id
    }

    fn name(&self) -> Option<&Arc<str>> {
        self.name.as_ref()
    }

    fn send_system(&self, msg: SystemMessage) {
        if self.mailbox.push_system(msg) {
            let backing_off = self.extras.lock().as_mut().and_then(|x| x.backoff.take());
            if let Some(waker) = backing_off {
                waker.wake();
            }
            self.schedule();
        }
    }

    fn add_watcher(&self, watcher: ActorId, notify: WatchNotify) {
        let already = {
            let mut guard = self.extras.lock();
            let x = guard.get_or_insert_with(Default::default);
            match &x.terminated {
                Some(t) => Some((t.clone(), notify)),
                None => {
                    x.watchers.push((watcher, notify));
                    None
                }
            }
        };
        if let Some((t, notify)) = already {
            notify(&t);
        }
    }

    fn remove_watcher(&self, watcher: ActorId) {
        if let Some(x) = self.extras.lock().as_mut() {
            x.watchers.retain(|(w, _)| *w != watcher);
        }
    }

    fn remove_child(&self, child: ActorId) {
        if let Some(x) = self.extras.lock().as_mut() {
            x.children.remove(&child);
        }
    }

    fn is_terminated(&self) -> bool {
        self.sched.load(Ordering::Acquire) == TERMINATED
    }
}

impl<A: Actor> RefTarget<A::Msg> for Cell<A> {
    #[inline]
    fn try_tell(&self, msg: A::Msg) -> Result<(), TellError<A::Msg>> {
        let pushed = self.mailbox.push(msg)?;
        self.queued(pushed);
        Ok(())
    }

    fn try_tell_past_bound(&self, msg: A::Msg) -> Result<(), TellError<A::Msg>> {
        let pushed = self.mailbox.push_past_bound(msg)?;
        self.queued(pushed);
        Ok(())
    }

    fn graceful_stop(&self) {
        if self.mailbox.push_graceful_stop() {
            self.schedule();
        }
    }

    fn space(&self) -> Option<&Notify> {
        self.mailbox.space()
    }

    fn system(&self) -> &Arc<SystemShared> {
        &self.system
    }
}

/// Outcome of a supervised call.
type Guarded = Result<(), String>;

/// Runs `make` (a handler or hook call) and the future it returns, turning an error or a
/// panic in either into the failure text. A handler written as `fn handle(..) -> impl
/// Future` runs code before it returns its future: a panic there is a failure like any
/// other (before 2026-11-27 it escaped the turn and left the actor scheduled for good).
///
/// Not an `async fn`: that would keep the future in its state twice (once as the argument and
/// once inside the `catch_unwind` it awaits), doubling the size of every turn's future, which
/// the dispatcher allocates per turn (an event-sourced entity's turn went from 1.3 KB to 0.9 KB).
fn guarded<F: Future<Output = Result<(), ActorError>>>(
    make: impl FnOnce() -> F,
) -> impl Future<Output = Guarded> {
    match call_guarded(make) {
        Ok(fut) => futures_util::future::Either::Left(AssertUnwindSafe(fut).catch_unwind().map(
            |outcome| match outcome {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(panic) => Err(format!("panicked: {}", panic_message(&*panic))),
            },
        )),
        Err(panic) => futures_util::future::Either::Right(std::future::ready(Err(format!(
            "panicked: {}",
            panic_message(&*panic)
        )))),
    }
}

/// Calls `f`, catching a panic.
fn call_guarded<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    std::panic::catch_unwind(AssertUnwindSafe(f))
}

/// The message of a caught panic (the payload of `catch_unwind` or of a `JoinError`), for
/// errors and logs: the text of `panic!("..")`, or a placeholder for other payloads.
///
/// ```
/// let caught = std::panic::catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
/// assert_eq!(shardik_actor::panic_message(&*caught), "boom 7");
/// ```
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

enum Decision {
    Resume,
    Restart(std::time::Duration),
    Stop(String),
    /// The strategy says restart, but the actor has been told to stop (`ctx.stop()` in the
    /// failing call, or a `Stop` already taken from the system lane): the failed instance is
    /// dropped as for a restart, no new one is made, and the actor stops as `Stopped`.
    NoRestart,
}

impl<A: Actor> Cell<A> {
    /// What to do about a failure. `stopping`: the actor has been told to stop, so a restart
    /// would only build an instance to stop it.
    fn decide(&self, st: &mut RunState<A>, error: String, stopping: bool) -> Decision {
        match self.settings.supervisor() {
            SupervisorStrategy::Stop => {
                tracing::warn!(actor = %self.label(), %error, "actor failed; stopping it");
                Decision::Stop(error)
            }
            SupervisorStrategy::Resume => {
                tracing::warn!(actor = %self.label(), %error, "actor failed; resuming with the next message");
                Decision::Resume
            }
            SupervisorStrategy::Restart(_) if stopping => {
                tracing::warn!(actor = %self.label(), %error, "actor failed after it was told to stop; stopping it instead of restarting it");
                Decision::NoRestart
            }
            SupervisorStrategy::Restart(_) if st.factory.is_none() => {
                // Spawned from an instance: nothing to make a new one from. Decided now, not
                // after a backoff and a restart counted for nothing.
                tracing::warn!(actor = %self.label(), %error, "actor failed and cannot be restarted (spawned from an instance, not a factory); stopping it");
                Decision::Stop(format!(
                    "{error} (the actor cannot be recreated: it was spawned from an instance, not a factory)"
                ))
            }
            SupervisorStrategy::Restart(policy) => {
                match st.restarts.on_failure(policy, tokio::time::Instant::now()) {
                    Some(backoff) => {
                        tracing::warn!(actor = %self.label(), %error, ?backoff, "actor failed; restarting it");
                        metrics::counter!("shardik_actor_restarts_total").increment(1);
                        Decision::Restart(backoff)
                    }
                    None => {
                        tracing::error!(
                            actor = %self.label(), %error,
                            max_restarts = policy.max_restarts, within = ?policy.within,
                            "actor failed too often; stopping it"
                        );
                        Decision::Stop(format!(
                            "restart limit of {} within {:?} reached; last failure: {error}",
                            policy.max_restarts, policy.within
                        ))
                    }
                }
            }
        }
    }

    /// Creates an instance and runs `started`, restarting per strategy. Err = must stop.
    /// Ok without an instance: told to stop before a restart (the run loop stops next).
    async fn start_incarnation(
        &self,
        st: &mut RunState<A>,
        ctx: &mut Context<A>,
    ) -> Result<(), String> {
        loop {
            // The spawner's own instance is used for the first incarnation only: every restart
            // discards the failed instance first.
            let made = match (st.actor.take(), &st.factory) {
                (Some(actor), _) => Ok(actor),
                (None, Some(factory)) => std::panic::catch_unwind(AssertUnwindSafe(factory)),
                (None, None) => return Err(
                    "the actor cannot be recreated: it was spawned from an instance, not a factory"
                        .into(),
                ),
            };
            let actor = match made {
                Ok(actor) => actor,
                Err(panic) => {
                    let error = format!("factory panicked: {}", panic_message(&*panic));
                    match self.decide(st, error, ctx.stop_requested()) {
                        Decision::Restart(backoff) => {
                            if self.back_off(backoff).await {
                                return Ok(()); // stopped meanwhile: the run loop stops next
                            }
                            continue;
                        }
                        Decision::NoRestart => return Ok(()),
                        Decision::Resume | Decision::Stop(_) => {
                            return Err("the actor factory panicked".into())
                        }
                    }
                }
            };
            let actor = st.actor.insert(actor);
            match guarded(|| actor.started(ctx)).await {
                Ok(()) => return Ok(()),
                Err(error) => {
                    let error = format!("started hook failed: {error}");
                    match self.decide(st, error, ctx.stop_requested()) {
                        Decision::Resume => return Ok(()),
                        Decision::Restart(backoff) => {
                            self.discard_instance(st);
                            if self.back_off(backoff).await {
                                return Ok(()); // stopped meanwhile: the run loop stops next
                            }
                        }
                        Decision::NoRestart => {
                            self.discard_instance(st);
                            return Ok(());
                        }
                        Decision::Stop(reason) => return Err(reason),
                    }
                }
            }
        }
    }

    /// Waits `backoff` before a restart, or less if the actor is told to stop meanwhile
    /// (`ActorRef::stop` then takes effect at once instead of after the backoff). True if a
    /// `Stop` is waiting: the restart must not happen.
    ///
    /// A zero backoff still yields to the runtime once: an actor whose `started` keeps
    /// failing at once, with restarts to spare, would otherwise restart in a loop that never
    /// returns `Pending`, and on a current-thread runtime nothing else (its `stop()`, the
    /// system's shutdown) would ever run again.
    async fn back_off(&self, backoff: std::time::Duration) -> bool {
        if backoff.is_zero() {
            yield_turn().await;
        } else {
            let sleep = tokio::time::sleep(backoff);
            tokio::pin!(sleep);
            std::future::poll_fn(|cx| {
                if self.mailbox.stop_pending() {
                    return Poll::Ready(());
                }
                // Registered before the second check: a `Stop` pushed in between wakes us.
                self.extras
                    .lock()
                    .get_or_insert_with(Default::default)
                    .backoff = Some(cx.waker().clone());
                if self.mailbox.stop_pending() {
                    return Poll::Ready(());
                }
                sleep.as_mut().poll(cx)
            })
            .await;
            if let Some(x) = self.extras.lock().as_mut() {
                x.backoff = None;
            }
        }
        self.mailbox.stop_pending()
    }

    /// Drops a failed instance before a restart, with the timers it started: their ids died
    /// with it, and the new incarnation's `started` would schedule them a second time.
    fn discard_instance(&self, st: &mut RunState<A>) {
        self.drop_instance(st.actor.take());
        if let Some(x) = self.extras.lock().as_mut() {
            x.cancel_all_timers();
        }
    }

    /// Drops an instance. A panic in its `Drop` is logged: let out of the turn, it would leave
    /// the actor scheduled for good without its run state (nothing handled, stops ignored).
    fn drop_instance(&self, actor: Option<A>) {
        if let Err(panic) = call_guarded(|| drop(actor)) {
            tracing::error!(actor = %self.label(), panic = %panic_message(&*panic), "dropping the actor's instance panicked");
        }
    }

    /// Handles a failure of `handle` or `terminated`: `Some(reason)` if the actor must stop
    /// (it failed for good, or was told to stop before a restart; then it has no instance).
    /// `stop_taken`: a `Stop` was taken from the system lane and is not handled yet; a stop
    /// requested through the context counts too.
    async fn after_failure(
        &self,
        st: &mut RunState<A>,
        ctx: &mut Context<A>,
        error: String,
        stop_taken: bool,
    ) -> Option<StopReason> {
        match self.on_failure(st, ctx, error, stop_taken).await {
            Err(reason) => Some(StopReason::Failed(reason)),
            Ok(()) if st.actor.is_none() => Some(StopReason::Stopped),
            Ok(()) => None,
        }
    }

    /// Handles a failure of `handle` or `terminated`. Err = must stop.
    async fn on_failure(
        &self,
        st: &mut RunState<A>,
        ctx: &mut Context<A>,
        error: String,
        stop_taken: bool,
    ) -> Result<(), String> {
        // A stop queued while the failing turn ran counts too: no restart is counted for it.
        let stopping = stop_taken || ctx.stop_requested() || self.mailbox.stop_pending();
        match self.decide(st, error, stopping) {
            Decision::Resume => Ok(()),
            Decision::Stop(reason) => Err(reason),
            Decision::NoRestart => {
                // The caller finds no instance and stops.
                self.discard_instance(st);
                Ok(())
            }
            Decision::Restart(backoff) => {
                self.discard_instance(st);
                if self.back_off(backoff).await {
                    // Stopped before the restart: no new instance only to stop it. The caller
                    // finds no instance and stops.
                    return Ok(());
                }
                self.start_incarnation(st, ctx).await
            }
        }
    }

    /// Stops `children` and waits until each has terminated.
    async fn stop_children(&self, children: HashMap<ActorId, Arc<dyn CellHandle>>) {
        if children.is_empty() {
            return;
        }
        let mut waits = Vec::with_capacity(children.len());
        for child in children.values() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            child.add_watcher(
                self.id,
                Box::new(move |_| {
                    let _ = tx.send(());
                }),
            );
            child.send_system(SystemMessage::Stop);
            waits.push(rx);
        }
        for rx in waits {
            let _ = rx.await;
        }
    }

    /// The stop sequence: close the mailbox, cancel timers, stop and await children, run
    /// `stopped`, hand over undelivered messages (termination hook or dead letters), then
    /// publish the termination: mark terminated, unregister from the system or parent,
    /// uncount, notify watchers and `terminated()` waiters.
    async fn finish(
        self: &Arc<Self>,
        mut st: Box<RunState<A>>,
        ctx: &mut Context<A>,
        batch: Batch<A::Msg>,
        reason: StopReason,
    ) {
        let mut leftovers = batch.into_envelopes();
        leftovers.extend(self.mailbox.close());

        let (children, watching) = self.with_extras(|x| {
            x.stopping = true;
            x.cancel_all_timers();
            (
                std::mem::take(&mut x.children),
                std::mem::take(&mut x.watching),
            )
        });
        let mut undelivered: Vec<A::Msg> = leftovers
            .into_iter()
            .filter_map(|e| match e {
                Envelope::User(m) | Envelope::Kept(m) => Some(m),
                // A `watch_with` notice counts only if its watch still stands.
                Envelope::Watched(of, m) => watching.iter().any(|(w, _)| *w == of).then_some(m),
                Envelope::GracefulStop => None,
            })
            .collect();
        // Without a termination hook the leftovers are dead letters: they go now, before the
        // children are awaited, so that a child waiting on an ask queued here learns at once
        // (its `ReplyTo` is dropped) instead of holding the stop up until its timeout.
        if self.settings.on_termination().is_none() {
            for msg in undelivered.drain(..) {
                drop(msg);
                self.dead_letter(DeadReason::UnhandledAtStop);
            }
        }
        for (_, target) in watching {
            if let Some(target) = target.upgrade() {
                target.remove_watcher(self.id);
            }
        }
        self.stop_children(children).await;
        if let Some(actor) = st.actor.as_mut() {
            let made = call_guarded(|| actor.stopped(ctx));
            let res = match made {
                Ok(fut) => AssertUnwindSafe(fut).catch_unwind().await,
                Err(panic) => Err(panic),
            };
            if let Err(panic) = res {
                tracing::error!(actor = %self.label(), panic = %panic_message(&*panic), "stopped hook panicked");
            }
            // Timers the hook itself started die with the actor too.
            if let Some(x) = self.extras.lock().as_mut() {
                x.cancel_all_timers();
            }
            // So do children it spawned (already told to stop): awaited like the others.
            let late = self.with_extras(|x| std::mem::take(&mut x.children));
            self.stop_children(late).await;
        }
        self.drop_instance(st.actor.take());
        let handled_any = st.handled_any;
        drop(st);

        let terminated = Terminated {
            id: self.id,
            name: self.name.clone(),
            reason: reason.clone(),
        };
        self.waker.take();
        match self.settings.on_termination() {
            Some(hook) => {
                let termination = Termination {
                    id: self.id,
                    name: self.name.clone(),
                    reason,
                    undelivered,
                    handled_any,
                };
                // A panicking hook must not leave the actor half-terminated (its watchers and
                // a system shutdown would wait forever); what it was handed is lost with it.
                let res = std::panic::catch_unwind(AssertUnwindSafe(|| hook(termination)));
                if let Err(panic) = res {
                    tracing::error!(actor = %self.label(), panic = %panic_message(&*panic), "termination hook panicked; its undelivered messages are lost");
                }
            }
            None => {
                for msg in undelivered {
                    drop(msg);
                    self.dead_letter(DeadReason::UnhandledAtStop);
                }
            }
        }
        // Only now publish the termination: whoever observes it (`is_terminated()`, the
        // registry of its system or parent, the live-actor count, a waiter on `terminated()`,
        // early or late, a watcher, a parent stopping its children) then sees everything it
        // implies: the hooks have run, leftovers are accounted for. In this order: marked
        // terminated and unregistered first, so that whoever sees the actor uncounted (a
        // shutdown that returns) or notified also sees it terminated.
        self.sched.store(TERMINATED, Ordering::Release);
        match &self.parent {
            Parent::System => self.system.remove_top_level(self.id),
            Parent::Actor(parent) => {
                if let Some(parent) = parent.upgrade() {
                    parent.remove_child(self.id);
                }
            }
        }
        self.system.actor_stopped();
        let watchers = self.with_extras(|x| {
            x.terminated = Some(terminated.clone());
            std::mem::take(&mut x.watchers)
        });
        for (_, notify) in watchers {
            notify(&terminated);
        }
    }
}

/// Boxes a cold-path future so the hot run loop's state machine stays small (it is moved into
/// every task spawned for a turn).
fn cold<'a, T>(
    f: impl Future<Output = T> + Send + 'a,
) -> Pin<Box<dyn Future<Output = T> + Send + 'a>> {
    Box::pin(f)
}

/// Lets other tasks run after `throughput` messages: wakes this task and returns `Pending`
/// once, which puts it at the back of its worker's run queue. (`tokio::task::yield_now`
/// defers the wake until the worker has polled its I/O driver, a system call per yield that
/// busy actors paid every 64 messages; the worker still polls the driver on its own
/// schedule, so I/O is not starved.)
async fn yield_turn() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Parks a lingering run task until a sender hands it work (true) or `sleep` fires first
/// (false). The caller has found the mailbox empty and holds the run state.
///
/// `sleep_waker` is the waker `sleep` was last polled with (`None` after it was armed or
/// reset). While the task's waker stays the same, the timer already knows whom to wake, so
/// the sleep is only checked, not polled: polling it costs a waker registration and a unit
/// of tokio's cooperative budget on every park, which is every message of a ping-pong.
async fn park<A: Actor>(
    cell: &Cell<A>,
    sleep: Pin<&mut tokio::time::Sleep>,
    sleep_waker: &mut Option<std::task::Waker>,
) -> bool {
    let mut sleep = sleep;
    let mut parked = false;
    std::future::poll_fn(|cx| {
        cell.waker.register(cx.waker());
        if !parked {
            parked = true;
            cell.sched.store(PARKED, Ordering::SeqCst);
            // A sender that queued after the mailbox looked empty saw `SCHEDULED` and left it
            // to us: look once more.
            if cell.mailbox.has_work() {
                return Poll::Ready(cell.unpark());
            }
        }
        if cell.sched.load(Ordering::Acquire) == HANDOFF {
            cell.sched.store(SCHEDULED, Ordering::Release);
            return Poll::Ready(true);
        }
        let elapsed = match sleep_waker {
            Some(w) if w.will_wake(cx.waker()) => sleep.is_elapsed(),
            _ => {
                *sleep_waker = Some(cx.waker().clone());
                sleep.as_mut().poll(cx).is_ready()
            }
        };
        if elapsed {
            return Poll::Ready(cell.unpark());
        }
        Poll::Pending
    })
    .await
}

impl<A: Actor> Cell<A> {
    /// Takes the turn back from `PARKED` (or from `HANDOFF`, if a sender got there first).
    /// True if a sender had handed over work.
    fn unpark(&self) -> bool {
        let handed = self
            .sched
            .compare_exchange(PARKED, SCHEDULED, Ordering::AcqRel, Ordering::Acquire)
            .is_err();
        if handed {
            self.sched.store(SCHEDULED, Ordering::Release);
        }
        handed || self.mailbox.has_work()
    }
}

/// One scheduling of an actor: runs until its mailbox is empty or it stops.
async fn run<A: Actor>(cell: Arc<Cell<A>>) {
    let Some(mut st) = cell.run.lock().take() else {
        debug_assert!(false, "run state missing while scheduled");
        return;
    };
    let mut ctx = Context::new(cell.clone());
    let mut batch: Batch<A::Msg> = Batch::new();
    let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // The waker `linger` was last polled with (see `park`).
    let mut linger_waker: Option<std::task::Waker> = None;
    // `Some` while this task lingers: whether work came during the current window.
    let mut linger_worked: Option<bool> = None;
    if !st.started {
        st.started = true;
        if let Err(reason) = cold(cell.start_incarnation(&mut st, &mut ctx)).await {
            cold(cell.finish(st, &mut ctx, batch, StopReason::Failed(reason))).await;
            return;
        }
        if st.actor.is_none() {
            // Told to stop during a restart backoff of `started`.
            cold(cell.finish(st, &mut ctx, batch, StopReason::Stopped)).await;
            return;
        }
    }
    let throughput = cell.settings.throughput();
    loop {
        let mut budget = throughput;
        loop {
            if cell.mailbox.system_pending() {
                let mut system = cell.mailbox.take_system().into_iter();
                while let Some(sys) = system.next() {
                    match sys {
                        SystemMessage::Stop => {
                            cold(cell.finish(st, &mut ctx, batch, StopReason::Stopped)).await;
                            return;
                        }
                        SystemMessage::Terminated(t) => {
                            if !cell.take_watch(t.id) {
                                continue;
                            }
                            let Some(actor) = st.actor.as_mut() else {
                                continue;
                            };
                            let res = cold(guarded(|| actor.terminated(&mut ctx, t))).await;
                            if let Err(error) = res {
                                // A `Stop` already in hand (later in this batch of system
                                // messages) must not let the actor restart first.
                                let stop_taken = system
                                    .as_slice()
                                    .iter()
                                    .any(|m| matches!(m, SystemMessage::Stop));
                                let failed =
                                    cell.after_failure(&mut st, &mut ctx, error, stop_taken);
                                if let Some(reason) = cold(failed).await {
                                    cold(cell.finish(st, &mut ctx, batch, reason)).await;
                                    return;
                                }
                            }
                        }
                    }
                }
            }
            if ctx.stop_requested() {
                cold(cell.finish(st, &mut ctx, batch, StopReason::Stopped)).await;
                return;
            }
            let envelope = match batch.pop_front() {
                Some(e) => e,
                None => {
                    // The flag saves the lock when nothing came (a racing push is caught by the
                    // checks on the way to parking or idling).
                    if cell.mailbox.user_pending() && cell.mailbox.take_batch(&mut batch) {
                        continue;
                    }
                    break;
                }
            };
            let msg = match envelope {
                Envelope::GracefulStop => {
                    cold(cell.finish(st, &mut ctx, batch, StopReason::Stopped)).await;
                    return;
                }
                Envelope::User(msg) | Envelope::Kept(msg) => msg,
                Envelope::Watched(of, msg) => {
                    if !cell.take_watch(of) {
                        continue;
                    }
                    msg
                }
            };
            let Some(actor) = st.actor.as_mut() else {
                debug_assert!(false, "no instance while running");
                continue;
            };
            st.handled_any = true;
            if let Err(error) = guarded(|| actor.handle(msg, &mut ctx)).await {
                let failed = cell.after_failure(&mut st, &mut ctx, error, false);
                if let Some(reason) = cold(failed).await {
                    cold(cell.finish(st, &mut ctx, batch, reason)).await;
                    return;
                }
            }
            budget -= 1;
            if budget == 0 {
                budget = throughput;
                yield_turn().await;
            }
        }
        if ctx.stop_requested() {
            cold(cell.finish(st, &mut ctx, batch, StopReason::Stopped)).await;
            return;
        }
        // Mailbox empty. A hot actor keeps its task for a while (see module docs). While it
        // lingers, the clock is read once per window, not once per turn: the window is armed
        // when lingering starts, and when it passes the task lingers on for another window
        // only if work came during this one.
        if linger_worked.is_none() {
            let now = tokio::time::Instant::now();
            let hot = st
                .last_turn_end
                .is_some_and(|end| now.saturating_duration_since(end) < HOT_GAP);
            st.last_turn_end = Some(now);
            if hot {
                match &mut linger {
                    Some(sleep) => sleep.as_mut().reset(now + LINGER),
                    None => linger = Some(Box::pin(tokio::time::sleep_until(now + LINGER))),
                }
                linger_waker = None;
                linger_worked = Some(false);
            }
        }
        if let (Some(worked), Some(sleep)) = (linger_worked.as_mut(), linger.as_mut()) {
            if park(&cell, sleep.as_mut(), &mut linger_waker).await {
                *worked = true;
                continue;
            }
            if *worked {
                *worked = false;
                sleep.as_mut().reset(tokio::time::Instant::now() + LINGER);
                linger_waker = None;
                continue;
            }
            linger_worked = None;
            st.last_turn_end = Some(tokio::time::Instant::now());
        }
        // Park the state and go idle unless work arrived meanwhile (see module docs). The
        // waker of this task must not outlive it in the cell.
        cell.waker.take();
        *cell.run.lock() = Some(st);
        if cell
            .mailbox
            .go_idle(&mut batch, || cell.sched.store(IDLE, Ordering::SeqCst))
        {
            return;
        }
        match cell.run.lock().take() {
            Some(s) => st = s,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nop;

    impl Actor for Nop {
        type Msg = u64;
        async fn handle(&mut self, _m: u64, _c: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
    }

    /// Every turn of an actor that does not linger moves the run future into a new task, and
    /// every actor holds a cell: guard their sizes against silent growth (the idle-memory
    /// benchmark reports the whole cost per actor).
    #[tokio::test]
    async fn the_run_future_and_the_cell_stay_small() {
        let system = crate::ActorSystem::new("sizes");
        let cell = Cell::spawn(&system.shared, Parent::System, Props::from_instance(Nop));
        let turn = run(cell.clone());
        assert!(
            std::mem::size_of_val(&turn) <= 512,
            "run future: {} B",
            std::mem::size_of_val(&turn)
        );
        drop(turn);
        assert!(
            std::mem::size_of::<Cell<Nop>>() <= 256,
            "cell: {} B",
            std::mem::size_of::<Cell<Nop>>()
        );
        assert!(std::mem::size_of::<RunState<Nop>>() <= 96);
        // Not registered as a top-level actor: stop it by hand before the system shuts down.
        cell.send_system(SystemMessage::Stop);
        system.shutdown().await;
    }

    /// A handler that keeps 1 KB across an await.
    struct Big;

    impl Actor for Big {
        type Msg = u64;
        async fn handle(&mut self, m: u64, _c: &mut Context<Self>) -> Result<(), ActorError> {
            let buf = [m as u8; 1024];
            tokio::task::yield_now().await;
            std::hint::black_box(&buf);
            Ok(())
        }
    }

    /// A turn's future holds the handler's future once: a large handler future makes every
    /// turn's allocation larger by its size, not by twice its size (as an `async fn` wrapper
    /// around it did).
    #[tokio::test]
    async fn a_turn_holds_the_handler_future_once() {
        let system = crate::ActorSystem::new("sizes");
        let cell = Cell::spawn(&system.shared, Parent::System, Props::from_instance(Big));
        let handler = {
            let mut ctx = Context::new(cell.clone());
            let mut actor = Big;
            let fut = actor.handle(1, &mut ctx);
            std::mem::size_of_val(&fut)
        };
        assert!(handler >= 1024, "handler future: {handler} B");
        let turn = std::mem::size_of_val(&run(cell.clone()));
        assert!(
            turn <= handler + 512,
            "run future: {turn} B for a handler future of {handler} B"
        );
        cell.send_system(SystemMessage::Stop);
        system.shutdown().await;
    }

    /// Spins (without sleeping) until `done` holds, failing after 10 s instead of hanging.
    fn spin_until(what: &str, mut done: impl FnMut() -> bool) {
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                std::time::Instant::now() < give_up,
                "gave up waiting: {what}"
            );
            std::thread::yield_now();
        }
    }

    /// A cell that is never run until the test lets it (so the test sees its mailbox as the
    /// timer left it), its context, and how many references the test itself holds.
    fn unrun_cell(system: &crate::ActorSystem) -> (Arc<Cell<Nop>>, Context<Nop>, usize) {
        let cell = Cell::create(&system.shared, Parent::System, Props::from_instance(Nop));
        let ctx = Context::new(cell.clone());
        let held = Arc::strong_count(&cell);
        (cell, ctx, held)
    }

    /// Lets the never-run cell run, stop, and the system shut down.
    async fn stop_unrun(system: crate::ActorSystem, cell: Arc<Cell<Nop>>) {
        cell.send_system(SystemMessage::Stop);
        cell.launch();
        system.shutdown().await;
    }

    /// `cancel_timer` returned true while the one-shot timer's task was already running
    /// (past its sleep, about to deliver): aborting it did not interrupt that poll, and the
    /// message still arrived (its task ignored that its entry was gone). Now the timer
    /// delivers only if it finds its own entry, under the lock `cancel_timer` takes.
    #[test]
    fn a_once_timer_cancelled_while_its_task_runs_does_not_deliver() {
        // Nothing runs on this runtime until the test drives it from another thread.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let system = crate::ActorSystem::with_config(crate::SystemConfig {
            name: "timer-race-once".into(),
            runtime: Some(rt.handle().clone()),
        });
        let (cell, mut ctx, held) = unrun_cell(&system);
        let timer = ctx.schedule_once(Duration::from_millis(1), 7);
        // Held while the timer fires: its task gets past the sleep, takes a reference to the
        // cell and waits for this lock.
        let mut extras = cell.extras.lock();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let driver = std::thread::spawn(move || {
            let _ = rt.block_on(finished);
            rt
        });
        spin_until("the timer's task runs", || Arc::strong_count(&cell) > held);
        // What `cancel_timer` does, while the timer's task is inside its poll.
        let x = extras.as_mut().expect("the timer is registered");
        assert!(x.cancel_timer(timer.0), "cancelled before it fired");
        drop(extras);
        spin_until("the timer's task ends", || Arc::strong_count(&cell) == held);
        let delivered = cell.mailbox.user_pending();
        let _ = finish.send(());
        let rt = driver.join().unwrap();
        assert!(!delivered, "a cancelled timer delivered its message");
        assert!(!ctx.cancel_timer(timer));
        drop(ctx);
        rt.block_on(stop_unrun(system, cell));
    }

    /// The same for a periodic timer, whose task never checked that it was still
    /// registered: a tick being made while the timer was cancelled (or dropped by a restart,
    /// which unregisters timers the same way) still arrived. Here the tick's `make` holds
    /// the task inside its poll while the timer is cancelled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_periodic_timer_cancelled_while_its_task_runs_does_not_deliver() {
        let system = crate::ActorSystem::new("timer-race-periodic");
        let (cell, mut ctx, held) = unrun_cell(&system);
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = std::sync::Mutex::new(go_rx);
        let first = std::sync::atomic::AtomicBool::new(true);
        let timer = ctx.schedule_periodic(Duration::from_millis(1), move || {
            if first.swap(false, Ordering::SeqCst) {
                let _ = entered_tx.send(());
                let _ = go_rx.lock().unwrap().recv();
            }
            7
        });
        entered.recv().expect("the first tick is being made");
        assert!(ctx.cancel_timer(timer), "cancelled while its tick is made");
        go.send(()).unwrap();
        drop(go);
        spin_until("the timer's task lets go of the cell", || {
            Arc::strong_count(&cell) == held
        });
        assert!(
            !cell.mailbox.user_pending(),
            "a cancelled periodic timer delivered a tick"
        );
        drop(ctx);
        stop_unrun(system, cell).await;
    }

    /// A `terminated()` future dropped before the actor terminates (a `select!` that took
    /// another branch, in a loop) withdraws its wait instead of leaving it in the cell.
    #[tokio::test]
    async fn dropped_termination_waits_are_withdrawn() {
        let system = crate::ActorSystem::new("waits");
        let cell = Cell::spawn(&system.shared, Parent::System, Props::from_instance(Nop));
        let actor = crate::ActorRef::from_cell(cell.clone());
        for _ in 0..100 {
            let wait = actor.terminated();
            assert!(wait.now_or_never().is_none(), "the actor still runs");
        }
        let waits = cell.with_extras(|x| x.watchers.len());
        assert_eq!(waits, 0, "dropped waits left behind");
        let kept = actor.terminated();
        actor.stop();
        assert_eq!(kept.await.reason, StopReason::Stopped);
        system.shutdown().await;
    }
}
