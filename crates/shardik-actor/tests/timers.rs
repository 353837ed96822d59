//! Timers (on paused tokio time): one-shot, periodic, cancellation, and cancellation at stop.

use std::time::Duration;

use shardik_actor::{Actor, ActorError, ActorRef, ActorSystem, Context, ReplyTo, TimerId};
use tokio::sync::mpsc;
use tokio::time::Instant;

enum Msg {
    Once(Duration, &'static str, ReplyTo<TimerId>),
    Periodic(Duration, ReplyTo<TimerId>),
    Cancel(TimerId, ReplyTo<bool>),
    Fired(&'static str),
    Tick,
}

struct Timed {
    events: mpsc::UnboundedSender<(&'static str, Instant)>,
}

impl Actor for Timed {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Once(d, label, r) => r.reply(ctx.schedule_once(d, Msg::Fired(label))),
            Msg::Periodic(d, r) => r.reply(ctx.schedule_periodic(d, || Msg::Tick)),
            Msg::Cancel(id, r) => r.reply(ctx.cancel_timer(id)),
            Msg::Fired(label) => {
                let _ = self.events.send((label, Instant::now()));
            }
            Msg::Tick => {
                let _ = self.events.send(("tick", Instant::now()));
            }
        }
        Ok(())
    }
}

type Events = mpsc::UnboundedReceiver<(&'static str, Instant)>;

fn timed(system: &ActorSystem) -> (ActorRef<Msg>, Events) {
    let (tx, rx) = mpsc::unbounded_channel();
    (system.spawn(Timed { events: tx }), rx)
}

const T: Duration = Duration::from_secs(5);

async fn once(a: &ActorRef<Msg>, d: Duration, label: &'static str) -> TimerId {
    a.ask(|r| Msg::Once(d, label, r), T).await.unwrap()
}

async fn cancel(a: &ActorRef<Msg>, id: TimerId) -> bool {
    a.ask(|r| Msg::Cancel(id, r), T).await.unwrap()
}

/// Lets a long stretch of virtual time pass, then asserts nothing more arrived.
async fn assert_quiet(events: &mut Events) {
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(events.try_recv().is_err(), "unexpected timer event");
}

fn close_to(actual: Duration, expected: Duration) -> bool {
    actual >= expected && actual <= expected + Duration::from_millis(2)
}

#[tokio::test(start_paused = true)]
async fn schedule_once_fires_once_after_its_delay() {
    let system = ActorSystem::new("timer-once");
    let (a, mut events) = timed(&system);
    let start = Instant::now();
    once(&a, Duration::from_millis(100), "a").await;
    once(&a, Duration::from_millis(300), "b").await;
    let (label, at) = events.recv().await.unwrap();
    assert_eq!(label, "a");
    assert!(
        close_to(at - start, Duration::from_millis(100)),
        "{:?}",
        at - start
    );
    let (label, at) = events.recv().await.unwrap();
    assert_eq!(label, "b");
    assert!(
        close_to(at - start, Duration::from_millis(300)),
        "{:?}",
        at - start
    );
    assert_quiet(&mut events).await;
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn schedule_periodic_fires_repeatedly_until_cancelled() {
    let system = ActorSystem::new("timer-periodic");
    let (a, mut events) = timed(&system);
    let start = Instant::now();
    let id = a
        .ask(|r| Msg::Periodic(Duration::from_millis(100), r), T)
        .await
        .unwrap();
    for i in 1..=5u32 {
        let (label, at) = events.recv().await.unwrap();
        assert_eq!(label, "tick");
        assert!(
            close_to(at - start, Duration::from_millis(100) * i),
            "tick {i} at {:?}",
            at - start
        );
    }
    assert!(cancel(&a, id).await);
    assert!(
        !cancel(&a, id).await,
        "a cancelled timer cannot be cancelled again"
    );
    assert_quiet(&mut events).await;
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_timer_prevents_firing() {
    let system = ActorSystem::new("timer-cancel");
    let (a, mut events) = timed(&system);
    let doomed = once(&a, Duration::from_millis(100), "doomed").await;
    let kept = once(&a, Duration::from_millis(200), "kept").await;
    assert_ne!(doomed, kept);
    assert!(cancel(&a, doomed).await);
    assert_eq!(events.recv().await.unwrap().0, "kept");
    assert!(
        !cancel(&a, kept).await,
        "a one-shot timer that fired cannot be cancelled"
    );
    assert_quiet(&mut events).await;
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_zero_delay_timer_fires() {
    let system = ActorSystem::new("timer-zero");
    let (a, mut events) = timed(&system);
    once(&a, Duration::ZERO, "now").await;
    assert_eq!(events.recv().await.unwrap().0, "now");
    assert_quiet(&mut events).await;
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn timers_stop_when_the_actor_stops() {
    let system = ActorSystem::new("timer-stop");
    let (a, mut events) = timed(&system);
    a.ask(|r| Msg::Periodic(Duration::from_millis(100), r), T)
        .await
        .unwrap();
    once(&a, Duration::from_secs(1), "later").await;
    assert_eq!(events.recv().await.unwrap().0, "tick");
    assert_eq!(events.recv().await.unwrap().0, "tick");
    a.stop();
    a.terminated().await;
    assert_quiet(&mut events).await;
    // Cancelled, not fired into the closed mailbox.
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn timers_of_a_failed_incarnation_are_cancelled_on_restart() {
    use shardik_actor::Props;
    enum RMsg {
        Tick,
        Fail,
    }
    /// Starts a periodic timer in `started`, the usual place.
    struct Ticker(mpsc::UnboundedSender<&'static str>);
    impl Actor for Ticker {
        type Msg = RMsg;
        async fn started(&mut self, ctx: &mut Context<Self>) -> Result<(), ActorError> {
            let _ = self.0.send("started");
            ctx.schedule_periodic(Duration::from_millis(100), || RMsg::Tick);
            Ok(())
        }
        async fn handle(&mut self, msg: RMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                RMsg::Tick => {
                    let _ = self.0.send("tick");
                    Ok(())
                }
                RMsg::Fail => Err("fail".into()),
            }
        }
    }
    let system = ActorSystem::new("timer-restart");
    let (tx, mut events) = mpsc::unbounded_channel();
    let a = system.spawn_props(Props::new(move || Ticker(tx.clone())));
    assert_eq!(events.recv().await, Some("started"));
    a.tell(RMsg::Fail);
    assert_eq!(events.recv().await, Some("started"));
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let mut ticks = 0;
    while let Ok(e) = events.try_recv() {
        assert_eq!(e, "tick");
        ticks += 1;
    }
    assert_eq!(
        ticks, 10,
        "one timer ticking every 100 ms, not one per incarnation"
    );
    system.shutdown().await;
}

/// A timer that the `stopped` hook itself starts is cancelled with the actor: no tick turns
/// into a dead letter afterwards.
#[tokio::test(start_paused = true)]
async fn a_timer_started_by_the_stopped_hook_dies_with_the_actor() {
    struct LateTicker;
    impl Actor for LateTicker {
        type Msg = ();
        async fn handle(&mut self, _msg: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
        async fn stopped(&mut self, ctx: &mut Context<Self>) {
            ctx.schedule_periodic(Duration::from_millis(10), || ());
        }
    }
    let system = ActorSystem::new("late-ticker");
    let actor = system.spawn(LateTicker);
    actor.stop();
    actor.terminated().await;
    // On the paused clock: a second of ticks, had the timer survived.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}
