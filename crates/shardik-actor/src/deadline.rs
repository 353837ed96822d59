//! Ask timeouts whose timer is armed only for the asks that need one.
//!
//! Nearly every ask is answered long before its timeout, yet `tokio::time::timeout` registers
//! a timer in the runtime's wheel on the first `Pending` poll and removes it again when the
//! answer comes: two locked wheel operations, the runtime handle looked up, and the clock read
//! by the driver, per ask. On the sharded ask benchmark (`shardik-bench local`) that was about
//! a fifth of the CPU an ask cost.
//!
//! [`ActorSystem::timeout`](crate::ActorSystem::timeout), used by asks that stay in the
//! process, defers the timer. On its first `Pending` poll the future enlists a small *grace
//! slot* with its actor system's ticker and registers no timer. Every [`GRACE`] the ticker
//! (one tokio task per system, asleep while nothing is enlisted) takes the slots enlisted
//! since its last tick: a slot whose future is done is gone (only a weak reference was
//! enlisted) and costs nothing more; a slot whose future still waits is marked and its task
//! woken, and on that poll the future arms a real tokio timer for its deadline. The deadline is read from the runtime's clock when the future
//! is created and the ticker sleeps on the runtime's timer, so the timeout fires exactly when
//! `tokio::time::timeout` would have fired, paused time in tests included, for any timeout
//! longer than twice the grace period. Shorter timeouts arm at once.
//!
//! A future that waits costs one small allocation and a push onto the ticker's list; one that
//! finishes within [`GRACE`] costs nothing else.
//!
//! The ticker task runs on the runtime of the future that started it. If that runtime shuts
//! down while the system lives on (a system used from several runtimes), the next future to
//! enlist starts a new ticker where it runs; futures enlisted in between are served from then
//! on, not before.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// How long a future under [`ActorSystem::timeout`](crate::ActorSystem::timeout) may wait
/// before it arms a real timer. Timeouts up to twice this are armed at once.
pub const GRACE: Duration = Duration::from_millis(10);

/// The error of a [`Within`] future whose timeout passed first; holds the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed(pub Duration);

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "deadline of {:?} elapsed", self.0)
    }
}

impl std::error::Error for Elapsed {}

pin_project! {
    /// A future that must complete within a timeout: see
    /// [`ActorSystem::timeout`](crate::ActorSystem::timeout).
    #[must_use = "futures do nothing unless polled"]
    pub struct Within<'a, F> {
        #[pin]
        fut: F,
        ticker: &'a Arc<Ticker>,
        timeout: Duration,
        start: Instant,
        timer: Timer,
    }
}

pub(crate) fn within<F: Future>(ticker: &Arc<Ticker>, timeout: Duration, fut: F) -> Within<'_, F> {
    Within {
        fut,
        ticker,
        timeout,
        start: Instant::now(),
        timer: Timer::Unarmed,
    }
}

enum Timer {
    /// Not polled to `Pending` yet.
    Unarmed,
    /// Enlisted with the ticker; no timer yet.
    Grace(Arc<GraceSlot>),
    /// A real timer runs.
    Armed(Pin<Box<Sleep>>),
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        loop {
            match this.timer {
                Timer::Unarmed if *this.timeout <= 2 * GRACE => {
                    *this.timer = arm(*this.start, *this.timeout);
                }
                Timer::Unarmed => {
                    let slot = Arc::new(GraceSlot {
                        ticked: AtomicBool::new(false),
                        waker: AtomicWaker::new(),
                    });
                    slot.waker.register(cx.waker());
                    this.ticker.enlist(Arc::downgrade(&slot));
                    *this.timer = Timer::Grace(slot);
                    return Poll::Pending;
                }
                Timer::Grace(slot) => {
                    if !slot.ticked.load(Ordering::Acquire) {
                        slot.waker.register(cx.waker());
                        // The tick may have come between the check and the registration.
                        if !slot.ticked.load(Ordering::Acquire) {
                            return Poll::Pending;
                        }
                    }
                    *this.timer = arm(*this.start, *this.timeout);
                }
                Timer::Armed(sleep) => {
                    return match sleep.as_mut().poll(cx) {
                        Poll::Ready(()) => Poll::Ready(Err(Elapsed(*this.timeout))),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }
}

fn arm(start: Instant, timeout: Duration) -> Timer {
    Timer::Armed(Box::pin(tokio::time::sleep_until(instant_after(
        start, timeout,
    ))))
}

/// `start + d`, or about 30 years after `start` where that overflows (a timeout such as
/// `Duration::MAX` meaning "wait forever"), as `tokio::time::sleep` does.
pub(crate) fn instant_after(start: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    start
        .checked_add(d.min(FAR))
        .unwrap_or_else(|| start + Duration::from_secs(24 * 3600))
}

/// What a future in its grace period shares with the ticker.
struct GraceSlot {
    /// Set by the ticker: the grace period is over, arm the timer.
    ticked: AtomicBool,
    waker: AtomicWaker,
}

/// An actor system's ticker: the futures in their grace period, and the task that ends it.
pub(crate) struct Ticker {
    enlisted: Mutex<Vec<Weak<GraceSlot>>>,
    wake: Notify,
    closed: AtomicBool,
    /// True while a ticker task runs. It clears this when it ends, also when its runtime
    /// shuts down and drops it; the next enlisting then starts another one.
    running: AtomicBool,
}

impl std::fmt::Debug for Ticker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticker")
            .field("enlisted", &self.enlisted.lock().len())
            .finish()
    }
}

impl Ticker {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Ticker {
            enlisted: Mutex::new(Vec::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            running: AtomicBool::new(false),
        })
    }

    /// Enlists a future in its grace period. Called from its poll, so inside the runtime
    /// whose clock its deadline is on: the ticker task is started there, and sleeps on the
    /// same clock.
    fn enlist(self: &Arc<Self>, slot: Weak<GraceSlot>) {
        if !self.running.load(Ordering::Acquire) && !self.running.swap(true, Ordering::AcqRel) {
            tokio::spawn(run_ticker(Running(self.clone())));
        }
        let first = {
            let mut enlisted = self.enlisted.lock();
            enlisted.push(slot);
            enlisted.len() == 1
        };
        if first {
            // Stores a permit if the ticker is not waiting yet.
            self.wake.notify_one();
        }
    }

    /// Ends the ticker task (its system is gone, so nothing can be enlisted any more).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

/// The ticker task's hold on its ticker; marks it stopped when the task ends or is dropped.
struct Running(Arc<Ticker>);

impl Drop for Running {
    fn drop(&mut self) {
        // Anything enlisted meanwhile is served by the task the next enlisting starts.
        self.0.running.store(false, Ordering::Release);
    }
}

async fn run_ticker(running: Running) {
    let ticker = &running.0;
    let mut taken = Vec::new();
    loop {
        while ticker.enlisted.lock().is_empty() {
            if ticker.closed.load(Ordering::SeqCst) {
                return;
            }
            ticker.wake.notified().await;
        }
        tokio::time::sleep(GRACE).await;
        std::mem::swap(&mut *ticker.enlisted.lock(), &mut taken);
        tick(&mut taken);
    }
}

/// Ends the grace period of every enlisted future still waiting; forgets the rest.
fn tick(taken: &mut Vec<Weak<GraceSlot>>) {
    for slot in taken.drain(..) {
        if let Some(slot) = slot.upgrade() {
            slot.ticked.store(true, Ordering::Release);
            slot.waker.wake();
        }
    }
    // Keep the buffer for the next tick unless a burst made it large.
    if taken.capacity() > 1 << 16 {
        *taken = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    async fn poll_once<F: Future>(mut fut: Pin<&mut F>) -> Poll<F::Output> {
        std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
    }

    fn ticker() -> Arc<Ticker> {
        Ticker::new()
    }

    /// Under paused time the timeout fires exactly at its deadline, and the grace period runs
    /// on the same clock: a timer that is due later (here a reply due after the deadline)
    /// cannot be reached first by auto-advance.
    #[tokio::test(start_paused = true)]
    async fn a_long_timeout_fires_at_its_deadline_under_paused_time() {
        let t = ticker();
        let start = Instant::now();
        let (tx, rx) = oneshot::channel::<u32>();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            let _ = tx.send(1);
        });
        let res = within(&t, Duration::from_secs(30), rx).await;
        assert_eq!(res, Err(Elapsed(Duration::from_secs(30))));
        assert_eq!(Instant::now() - start, Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_timeout_is_armed_at_once() {
        let t = ticker();
        let start = Instant::now();
        let mut fut = Box::pin(within(&t, 2 * GRACE, std::future::pending::<()>()));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        assert!(matches!(fut.timer, Timer::Armed(_)));
        assert_eq!(fut.await, Err(Elapsed(2 * GRACE)));
        assert_eq!(Instant::now() - start, 2 * GRACE);
    }

    #[tokio::test]
    async fn an_answer_within_the_grace_period_arms_nothing() {
        let t = ticker();
        let (tx, rx) = oneshot::channel();
        let mut fut = Box::pin(within(&t, Duration::from_secs(60), rx));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        assert!(matches!(fut.timer, Timer::Grace(_)));
        tx.send(5).unwrap();
        assert_eq!(fut.await, Ok(Ok(5)));
    }

    /// Real time: the future still waits after the grace period, so the ticker task wakes it,
    /// it arms its timer, and the answer that comes later still wins over the deadline.
    #[tokio::test]
    async fn a_waiting_future_is_armed_after_the_grace_period() {
        let t = ticker();
        let (tx, rx) = oneshot::channel();
        let mut fut = Box::pin(within(&t, Duration::from_secs(60), rx));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
            Poll::Pending if matches!(fut.timer, Timer::Armed(_)) => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => panic!("finished early: {r:?}"),
        })
        .await;
        tx.send(9).unwrap();
        assert_eq!(fut.await, Ok(Ok(9)));
    }

    #[test]
    fn a_tick_wakes_the_waiting_and_forgets_the_finished() {
        let slot = || {
            Arc::new(GraceSlot {
                ticked: AtomicBool::new(false),
                waker: AtomicWaker::new(),
            })
        };
        let (waiting, finished) = (slot(), slot());
        let mut taken = vec![Arc::downgrade(&waiting), Arc::downgrade(&finished)];
        drop(finished);
        tick(&mut taken);
        assert!(waiting.ticked.load(Ordering::Acquire));
        assert!(taken.is_empty());
        assert_eq!(
            Arc::weak_count(&waiting),
            0,
            "the ticker keeps no reference"
        );
    }

    /// The ticker task ends with its system (a process that makes systems over and over must
    /// not collect idle tasks).
    #[tokio::test]
    async fn the_ticker_task_ends_when_closed() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let t = ticker();
        let (tx, rx) = oneshot::channel();
        let mut fut = Box::pin(within(&t, Duration::from_secs(60), rx));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        assert_eq!(metrics.num_alive_tasks(), before + 1);
        tx.send(()).unwrap();
        assert_eq!(fut.await, Ok(Ok(())));
        t.close();
        while metrics.num_alive_tasks() > before {
            tokio::task::yield_now().await;
        }
    }
}
