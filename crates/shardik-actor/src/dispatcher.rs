//! The dispatcher: runs actor turns without a tokio task of their own.
//!
//! A turn that is not a hot actor's lingering task used to be a fresh tokio task: an aligned
//! allocation, registration in the runtime's task list, a queue push and often a wake-up of
//! another worker, then the reverse when the turn ended. Most turns handle a message or two
//! and finish without ever waiting, so that bookkeeping cost more than the turn.
//!
//! Instead, a scheduled actor is pushed onto one queue per system, drained by a few long-lived
//! dispatcher tasks (one per runtime worker). A dispatcher polls each turn's future once,
//! inline. A turn that completes (the usual case) costs a small heap allocation and no task.
//! A turn that returns `Pending` (a handler awaits something, the turn yields after its
//! `throughput`, or a hot actor parks to linger) is spawned as a tokio task at that point and
//! continues there: its next poll registers the task's own waker, so nothing is lost by the
//! first poll having seen the dispatcher's.
//!
//! Dispatchers park on a [`Notify`] when the queue is empty; a pusher wakes one only if one is
//! parked. They yield to the runtime every [`TURNS_PER_YIELD`] turns so other tasks (and the
//! other dispatchers) get their share, and they end when the system is dropped.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::cell::panic_message;

/// A turn, ready to be polled.
pub(crate) type Turn = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Something the dispatcher can run a turn of (an actor cell).
pub(crate) trait Runnable: Send + Sync + 'static {
    /// Creates the future of one turn.
    fn turn(self: Arc<Self>) -> Turn;
}

/// Turns a dispatcher runs before it yields to the runtime.
const TURNS_PER_YIELD: usize = 64;

pub(crate) struct Dispatcher {
    queue: Mutex<VecDeque<Arc<dyn Runnable>>>,
    /// Dispatcher tasks parked on `wake` (or about to be).
    parked: AtomicUsize,
    wake: Notify,
    closed: AtomicBool,
    started: OnceLock<()>,
}

impl Dispatcher {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Dispatcher {
            queue: Mutex::new(VecDeque::new()),
            parked: AtomicUsize::new(0),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            started: OnceLock::new(),
        })
    }

    /// Queues a turn of `what`, starting the dispatcher tasks on first use.
    pub(crate) fn dispatch(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        what: Arc<dyn Runnable>,
    ) {
        self.started.get_or_init(|| {
            let workers = runtime.metrics().num_workers().max(1);
            for _ in 0..workers {
                runtime.spawn(run_dispatcher(self.clone()));
            }
        });
        self.queue.lock().push_back(what);
        // Pairs with the fence in `run_dispatcher`: either it sees this turn in the queue
        // after announcing itself parked, or this sees it parked and wakes it.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            self.wake.notify_one();
        }
    }

    /// Ends the dispatcher tasks once the queue is drained (the system is gone).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }
}

async fn run_dispatcher(d: Arc<Dispatcher>) {
    let mut since_yield = 0;
    loop {
        // One turn at a time: a turn taken from the queue waits for this dispatcher only, so
        // taking more would strand them behind a long or blocking turn while the other
        // dispatchers idle.
        let next = d.queue.lock().pop_front();
        let Some(what) = next else {
            // Nothing queued: park until a pusher wakes us (see `dispatch`).
            let notified = d.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            d.parked.fetch_add(1, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            let empty = d.queue.lock().is_empty();
            if empty && !d.closed.load(Ordering::SeqCst) {
                notified.await;
            }
            d.parked.fetch_sub(1, Ordering::SeqCst);
            if d.closed.load(Ordering::SeqCst) && d.queue.lock().is_empty() {
                return;
            }
            continue;
        };
        run_turn(what.turn()).await;
        since_yield += 1;
        if since_yield >= TURNS_PER_YIELD {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
    }
}

/// Polls `turn` once inline; if it is not done, spawns it as a task to finish there.
async fn run_turn(mut turn: Turn) {
    let pending = std::future::poll_fn(|cx| {
        Poll::Ready(
            match std::panic::catch_unwind(AssertUnwindSafe(|| turn.as_mut().poll(cx))) {
                Ok(poll) => poll.is_pending(),
                Err(panic) => {
                    // Handlers and hooks are guarded inside the turn; this is a runtime bug.
                    // Keep the dispatcher alive, like tokio keeps a worker alive.
                    tracing::error!(panic = %panic_message(&*panic), "actor turn panicked outside its guards");
                    false
                }
            },
        )
    })
    .await;
    if pending {
        tokio::spawn(turn);
    }
}

#[cfg(test)]
mod tests {
    use crate::{Actor, ActorError, ActorSystem, Context};

    struct Nop;

    impl Actor for Nop {
        type Msg = u32;
        async fn handle(&mut self, _m: u32, _c: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
    }

    /// The dispatcher tasks belong to their system: once it is shut down and dropped, they end
    /// (a process that creates systems over and over must not collect idle tasks).
    #[tokio::test]
    async fn dispatcher_tasks_end_with_their_system() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let system = ActorSystem::new("dispatch");
        let actor = system.spawn(Nop);
        actor.tell(1);
        tokio::task::yield_now().await;
        assert!(metrics.num_alive_tasks() > before, "a dispatcher runs");
        system.shutdown().await;
        drop(actor);
        drop(system);
        // Closing woke the parked dispatcher; give it its turn to end.
        for _ in 0..10 {
            if metrics.num_alive_tasks() == before {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(metrics.num_alive_tasks(), before);
    }
}
