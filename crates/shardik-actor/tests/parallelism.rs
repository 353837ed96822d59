//! Different actors run in parallel; one actor never runs two handlers at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardik_actor::{Actor, ActorError, ActorSystem, Context, Props, ReplyTo};
use tokio::sync::{oneshot, Barrier};

struct Meeter {
    barrier: Arc<Barrier>,
}

impl Actor for Meeter {
    type Msg = ReplyTo<()>;

    async fn handle(
        &mut self,
        reply: ReplyTo<()>,
        _ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        // Only returns once the other actor is inside its handler too.
        self.barrier.wait().await;
        reply.reply(());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_actors_blocked_on_a_shared_barrier_both_reach_it() {
    let system = ActorSystem::new("parallel-barrier");
    let barrier = Arc::new(Barrier::new(2));
    let a = system.spawn(Meeter {
        barrier: barrier.clone(),
    });
    let b = system.spawn(Meeter { barrier });
    let (ra, rb) = tokio::join!(
        a.ask(|r| r, Duration::from_secs(10)),
        b.ask(|r| r, Duration::from_secs(10))
    );
    assert_eq!(ra, Ok(()));
    assert_eq!(rb, Ok(()));
    system.shutdown().await;
}

/// Stronger than the barrier above: the two handlers *block their threads* until both have
/// arrived, which only completes if the actors run on two worker threads at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_actors_run_on_two_threads_at_once() {
    struct Spinner {
        arrived: Arc<AtomicUsize>,
    }
    impl Actor for Spinner {
        type Msg = ReplyTo<(bool, std::thread::ThreadId)>;
        async fn handle(
            &mut self,
            reply: Self::Msg,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            self.arrived.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.arrived.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            reply.reply((
                self.arrived.load(Ordering::SeqCst) >= 2,
                std::thread::current().id(),
            ));
            Ok(())
        }
    }
    let system = ActorSystem::new("parallel-threads");
    let arrived = Arc::new(AtomicUsize::new(0));
    let a = system.spawn(Spinner {
        arrived: arrived.clone(),
    });
    let b = system.spawn(Spinner { arrived });
    let (ra, rb) = tokio::join!(
        a.ask(|r| r, Duration::from_secs(30)),
        b.ask(|r| r, Duration::from_secs(30))
    );
    let (met_a, thread_a) = ra.unwrap();
    let (met_b, thread_b) = rb.unwrap();
    assert!(met_a && met_b, "the handlers did not overlap in time");
    assert_ne!(thread_a, thread_b);
    system.shutdown().await;
}

enum CountMsg {
    Work,
    Stats(ReplyTo<(usize, usize)>),
}

/// Records how many of its handlers are running at once.
struct Exclusive {
    in_flight: Arc<AtomicUsize>,
    max_seen: Arc<AtomicUsize>,
    handled: usize,
}

impl Actor for Exclusive {
    type Msg = CountMsg;

    async fn handle(&mut self, msg: CountMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_seen.fetch_max(now, Ordering::SeqCst);
        // Suspend inside the handler so a second run task, if one were wrongly started,
        // would get the chance to enter meanwhile.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        match msg {
            CountMsg::Work => self.handled += 1,
            CountMsg::Stats(reply) => {
                reply.reply((self.handled, self.max_seen.load(Ordering::SeqCst)))
            }
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_actor_never_runs_two_handlers_at_once() {
    for throughput in [1, 2, 64] {
        let system = ActorSystem::new("exclusive");
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let actor = system.spawn_props(
            Props::from_instance(Exclusive {
                in_flight: in_flight.clone(),
                max_seen: max_seen.clone(),
                handled: 0,
            })
            .throughput(throughput),
        );
        let mut senders = Vec::new();
        for _ in 0..8 {
            let actor = actor.clone();
            senders.push(tokio::spawn(async move {
                for i in 0..500 {
                    actor.tell(CountMsg::Work);
                    if i % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for s in senders {
            s.await.unwrap();
        }
        let (handled, max) = actor
            .ask(CountMsg::Stats, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(handled, 8 * 500, "throughput {throughput}");
        assert_eq!(
            max, 1,
            "two handlers of one actor overlapped (throughput {throughput})"
        );
        system.shutdown().await;
    }
}

/// A handler that awaits does not block other actors: while one actor waits inside a
/// handler, another one answers asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_waiting_in_a_handler_does_not_block_others() {
    struct Waiter;
    impl Actor for Waiter {
        type Msg = oneshot::Receiver<()>;
        async fn handle(
            &mut self,
            rx: Self::Msg,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            let _ = rx.await;
            Ok(())
        }
    }
    struct Echo;
    impl Actor for Echo {
        type Msg = (u32, ReplyTo<u32>);
        async fn handle(
            &mut self,
            (n, r): Self::Msg,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            r.reply(n);
            Ok(())
        }
    }
    let system = ActorSystem::new("independent");
    let waiters: Vec<_> = (0..4).map(|_| system.spawn(Waiter)).collect();
    let mut releases = Vec::new();
    for w in &waiters {
        let (tx, rx) = oneshot::channel();
        w.tell(rx);
        releases.push(tx);
    }
    let echo = system.spawn(Echo);
    for n in 0..100 {
        assert_eq!(echo.ask(|r| (n, r), Duration::from_secs(10)).await, Ok(n));
    }
    drop(releases);
    system.shutdown().await;
    assert_eq!(system.live_actors(), 0);
}
