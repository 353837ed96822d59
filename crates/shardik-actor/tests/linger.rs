//! Lingering run tasks: a hot actor keeps its task parked between turns and hands it back
//! when it goes quiet, without ever losing a message or running two turns at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shardik_actor::{Actor, ActorError, ActorRef, ActorSystem, Context, ReplyTo};

enum Msg {
    Add(u64),
    Total(ReplyTo<u64>),
}

/// Sums what it gets and fails loudly if two turns ever overlap.
struct Summer {
    total: u64,
    busy: Arc<AtomicBool>,
    handled: Arc<AtomicU64>,
}

impl Actor for Summer {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        assert!(
            !self.busy.swap(true, Ordering::SeqCst),
            "two turns of one actor ran at once"
        );
        // Give a concurrent turn, if the scheduling were wrong, the chance to show up.
        tokio::task::yield_now().await;
        // Counted and released before replying, so an asker sees its own request counted.
        self.handled.fetch_add(1, Ordering::SeqCst);
        self.busy.store(false, Ordering::SeqCst);
        match msg {
            Msg::Add(n) => self.total += n,
            Msg::Total(r) => r.reply(self.total),
        }
        Ok(())
    }
}

fn summer() -> (Summer, Arc<AtomicU64>) {
    let handled = Arc::new(AtomicU64::new(0));
    let actor = Summer {
        total: 0,
        busy: Arc::new(AtomicBool::new(false)),
        handled: handled.clone(),
    };
    (actor, handled)
}

/// A system with a started [`Summer`], the runtime's metrics, and the number of tasks the
/// system itself keeps (its dispatcher and ask ticker, started here), not counting any actor.
async fn started_summer() -> (
    ActorSystem,
    ActorRef<Msg>,
    tokio::runtime::RuntimeMetrics,
    usize,
) {
    let system = ActorSystem::new("linger");
    let metrics = tokio::runtime::Handle::current().metrics();
    let actor = system.spawn(summer().0);
    tokio::task::yield_now().await;
    // Start the system's ask ticker (a future pending at its first poll enlists with it).
    let _ = system
        .timeout(Duration::from_secs(60), tokio::task::yield_now())
        .await;
    let base = metrics.num_alive_tasks();
    (system, actor, metrics, base)
}

/// Senders on all workers, with pauses around the linger window so that the actor keeps
/// moving between running, parked, handed-over and idle while messages arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_is_lost_across_park_and_idle_transitions() {
    let system = ActorSystem::new("linger");
    let (actor, handled) = summer();
    let actor = system.spawn(actor);
    let senders = 4u64;
    let per_sender = 2_000u64;
    let mut tasks = Vec::new();
    for s in 0..senders {
        let actor = actor.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_sender {
                actor.tell(Msg::Add(1));
                match (i + s) % 500 {
                    // Quiet for longer than the linger window: the task is given up.
                    0 => tokio::time::sleep(Duration::from_millis(3)).await,
                    // Quiet for about the linger window: races the parked task's timer.
                    250 => tokio::time::sleep(Duration::from_millis(1)).await,
                    n if n % 7 == 0 => tokio::task::yield_now().await,
                    _ => {}
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = actor
        .ask(Msg::Total, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(total, senders * per_sender);
    assert_eq!(handled.load(Ordering::SeqCst), senders * per_sender + 1);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// A hot actor parks its task; once the linger window passes without work the task ends,
/// so a quiet actor costs no task. Time is paused: the window passes without real waiting.
#[tokio::test(start_paused = true)]
async fn a_quiet_actor_gives_its_task_up() {
    let (system, actor, metrics, base) = started_summer().await;
    // Two asks back to back: the second turn ends right after the first, so the actor is hot.
    for _ in 0..2 {
        actor.ask(Msg::Total, Duration::from_secs(1)).await.unwrap();
    }
    tokio::task::yield_now().await;
    assert_eq!(
        metrics.num_alive_tasks(),
        base + 1,
        "the hot actor's task lingers"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        metrics.num_alive_tasks(),
        base,
        "the quiet actor's task ended"
    );
    // And it still answers: a new task is spawned for the next message.
    actor.tell(Msg::Add(5));
    assert_eq!(
        actor.ask(Msg::Total, Duration::from_secs(1)).await.unwrap(),
        5
    );
    system.shutdown().await;
}

/// An actor that hears something about once per linger window (every few hundred
/// microseconds: a hot key among many) does not linger: a window would mostly pass without
/// work, and each such window costs a task, a timer and its expiry. Time is paused.
#[tokio::test(start_paused = true)]
async fn an_actor_messaged_every_few_hundred_microseconds_does_not_linger() {
    let (system, actor, metrics, base) = started_summer().await;
    for i in 0..5 {
        // Paused time stands still otherwise: the start's turn ended "just now".
        tokio::time::advance(Duration::from_micros(400)).await;
        actor.ask(Msg::Total, Duration::from_secs(1)).await.unwrap();
        tokio::task::yield_now().await;
        assert_eq!(
            metrics.num_alive_tasks(),
            base,
            "ask {i}: an actor messaged every 400 us keeps no task"
        );
    }
    // Back to back, it lingers again.
    for _ in 0..2 {
        actor.ask(Msg::Total, Duration::from_secs(1)).await.unwrap();
    }
    tokio::task::yield_now().await;
    assert_eq!(metrics.num_alive_tasks(), base + 1, "the hot actor lingers");
    system.shutdown().await;
}

/// Stopping an actor whose task is parked wakes the task, which runs the stop sequence.
#[tokio::test]
async fn a_parked_actor_stops_when_asked() {
    let system = ActorSystem::new("linger");
    let (actor, handled) = summer();
    let actor = system.spawn(actor);
    for _ in 0..3 {
        actor.ask(Msg::Total, Duration::from_secs(1)).await.unwrap();
    }
    actor.stop();
    actor.terminated().await;
    assert!(actor.is_terminated());
    assert_eq!(handled.load(Ordering::SeqCst), 3);
    assert_eq!(system.live_actors(), 0);
}
