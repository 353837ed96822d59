//! Supervisor strategies: restart (fresh state, limits, backoff), stop, resume, and failures
//! of the `started` hook and of the factory.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{log, Log};
use shardik_actor::{
    Actor, ActorError, ActorRef, ActorSystem, AskError, Context, Props, ReplyTo, RestartPolicy,
    StopReason, SupervisorStrategy,
};
use tokio::time::Instant;

enum Msg {
    Add(u64),
    Fail,
    Panic,
    Get(ReplyTo<u64>),
}

/// What both test actors do with a message.
fn apply(total: &mut u64, msg: Msg) -> Result<(), ActorError> {
    match msg {
        Msg::Add(n) => *total += n,
        Msg::Fail => return Err("boom".into()),
        Msg::Panic => panic!("kaboom"),
        Msg::Get(r) => r.reply(*total),
    }
    Ok(())
}

struct Flaky {
    total: u64,
    incarnation: usize,
    events: Log<String>,
    /// Remaining `started` calls that fail (shared across incarnations).
    failing_starts: Arc<AtomicUsize>,
}

impl Actor for Flaky {
    type Msg = Msg;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let fail = self
            .failing_starts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            self.events
                .lock()
                .push(format!("start failed {}", self.incarnation));
            return Err("cannot start".into());
        }
        self.events
            .lock()
            .push(format!("started {}", self.incarnation));
        Ok(())
    }

    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        apply(&mut self.total, msg)
    }

    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.events
            .lock()
            .push(format!("stopped {}", self.incarnation));
    }
}

struct Harness {
    events: Log<String>,
    failing_starts: Arc<AtomicUsize>,
}

/// A first incarnation made by hand (for `Props::from_instance`), sharing a harness.
fn flaky_instance() -> (Flaky, Harness) {
    let (props, h) = flaky(SupervisorStrategy::Stop, 0);
    drop(props);
    let instance = Flaky {
        total: 0,
        incarnation: 1,
        events: h.events.clone(),
        failing_starts: h.failing_starts.clone(),
    };
    (instance, h)
}

fn flaky(strategy: SupervisorStrategy, failing_starts: usize) -> (Props<Flaky>, Harness) {
    let events = log();
    let failing_starts = Arc::new(AtomicUsize::new(failing_starts));
    let made = Arc::new(AtomicUsize::new(0));
    let props = {
        let events = events.clone();
        let failing_starts = failing_starts.clone();
        Props::new(move || Flaky {
            total: 0,
            incarnation: made.fetch_add(1, Ordering::SeqCst) + 1,
            events: events.clone(),
            failing_starts: failing_starts.clone(),
        })
        .supervisor(strategy)
    };
    (
        props,
        Harness {
            events,
            failing_starts,
        },
    )
}

impl Harness {
    fn events(&self) -> Vec<String> {
        self.events.lock().clone()
    }
}

async fn get(actor: &ActorRef<Msg>) -> Result<u64, AskError> {
    actor.ask(Msg::Get, Duration::from_secs(5)).await
}

fn restart(max: u32) -> SupervisorStrategy {
    SupervisorStrategy::Restart(RestartPolicy::new(max, Duration::from_secs(60)))
}

#[tokio::test]
async fn restart_after_an_error_starts_from_fresh_state() {
    let system = ActorSystem::new("sup-restart-err");
    let (props, h) = flaky(restart(10), 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(5));
    assert_eq!(get(&actor).await, Ok(5));
    actor.tell(Msg::Fail);
    assert_eq!(
        get(&actor).await,
        Ok(0),
        "state must come fresh from the factory"
    );
    actor.tell(Msg::Add(2));
    assert_eq!(
        get(&actor).await,
        Ok(2),
        "messages after the restart are processed"
    );
    // `stopped` does not run between restarts.
    assert_eq!(h.events(), ["started 1", "started 2"]);
    actor.stop();
    assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
    assert_eq!(h.events(), ["started 1", "started 2", "stopped 2"]);
    system.shutdown().await;
}

#[tokio::test]
async fn restart_after_a_panic_starts_from_fresh_state() {
    let system = ActorSystem::new("sup-restart-panic");
    let (props, h) = flaky(restart(10), 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(7));
    actor.tell(Msg::Panic);
    actor.tell(Msg::Add(1));
    assert_eq!(get(&actor).await, Ok(1));
    actor.tell(Msg::Panic);
    assert_eq!(get(&actor).await, Ok(0));
    assert_eq!(h.events(), ["started 1", "started 2", "started 3"]);
    assert!(!actor.is_terminated());
    system.shutdown().await;
    assert_eq!(h.events().last().map(String::as_str), Some("stopped 3"));
}

#[tokio::test]
async fn exceeding_the_restart_limit_stops_the_actor_as_failed() {
    let system = ActorSystem::new("sup-limit");
    let (props, h) = flaky(restart(2), 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Fail);
    actor.tell(Msg::Fail);
    actor.tell(Msg::Fail);
    actor.tell(Msg::Add(1));
    let t = actor.terminated().await;
    assert_eq!(t.id, actor.id());
    match t.reason {
        StopReason::Failed(why) => {
            assert!(why.contains("restart limit"), "{why}");
            assert!(why.contains("boom"), "{why}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(
        h.events(),
        ["started 1", "started 2", "started 3", "stopped 3"]
    );
    // The message queued behind the fatal failure was never handled.
    assert_eq!(system.dead_letters().unhandled_at_stop, 1);
    assert_eq!(system.live_actors(), 0);
    system.shutdown().await;
}

#[tokio::test]
async fn stop_strategy_stops_at_the_first_failure() {
    let system = ActorSystem::new("sup-stop");
    let (props, h) = flaky(SupervisorStrategy::Stop, 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(1));
    actor.tell(Msg::Fail);
    actor.tell(Msg::Add(2));
    match actor.terminated().await.reason {
        StopReason::Failed(why) => assert!(why.contains("boom"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(h.events(), ["started 1", "stopped 1"]);
    assert_eq!(system.dead_letters().unhandled_at_stop, 1);
    assert_eq!(get(&actor).await, Err(AskError::Stopped));
    system.shutdown().await;
}

#[tokio::test]
async fn stop_strategy_stops_at_a_panic() {
    let system = ActorSystem::new("sup-stop-panic");
    let (props, _h) = flaky(SupervisorStrategy::Stop, 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Panic);
    match actor.terminated().await.reason {
        StopReason::Failed(why) => assert!(why.contains("kaboom"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    system.shutdown().await;
}

#[tokio::test]
async fn resume_keeps_the_state_and_drops_only_the_failed_message() {
    let system = ActorSystem::new("sup-resume");
    let (props, h) = flaky(SupervisorStrategy::Resume, 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(5));
    actor.tell(Msg::Fail);
    actor.tell(Msg::Add(1));
    actor.tell(Msg::Panic);
    actor.tell(Msg::Add(1));
    assert_eq!(get(&actor).await, Ok(7));
    assert_eq!(h.events(), ["started 1"]);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn backoff_delays_each_restart() {
    let system = ActorSystem::new("sup-backoff");
    let policy = RestartPolicy::new(10, Duration::from_secs(60))
        .with_backoff(Duration::from_millis(100), Duration::from_secs(1));
    let (props, h) = flaky(SupervisorStrategy::Restart(policy), 0);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(3));
    assert_eq!(get(&actor).await, Ok(3));

    let start = Instant::now();
    actor.tell(Msg::Fail);
    actor.tell(Msg::Add(1)); // queues during the backoff, handled by the new incarnation
    assert_eq!(get(&actor).await, Ok(1));
    let first = start.elapsed();
    assert!(
        first >= Duration::from_millis(100) && first < Duration::from_millis(150),
        "first restart after {first:?}"
    );

    actor.tell(Msg::Fail);
    assert_eq!(get(&actor).await, Ok(0));
    let second = start.elapsed() - first;
    assert!(
        second >= Duration::from_millis(200) && second < Duration::from_millis(250),
        "second restart after {second:?} (backoff doubles)"
    );
    assert_eq!(h.events(), ["started 1", "started 2", "started 3"]);
    system.shutdown().await;
}

/// A stop during a restart backoff takes effect at once: the actor does not wait out the
/// backoff, and no new instance is built only to be stopped.
#[tokio::test(start_paused = true)]
async fn a_stop_during_a_restart_backoff_stops_at_once_without_a_new_instance() {
    let system = ActorSystem::new("sup-backoff-stop");
    let policy = RestartPolicy::new(10, Duration::from_secs(60))
        .with_backoff(Duration::from_secs(30), Duration::from_secs(30));
    let (props, h) = flaky(SupervisorStrategy::Restart(policy), 0);
    let actor = system.spawn_props(props);
    assert_eq!(get(&actor).await, Ok(0));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let watcher = system.spawn(Watcher {
        target: actor.clone(),
        done: Some(tx),
    });
    actor.tell(Msg::Fail);
    // On the paused clock this timer fires only once every task is idle: the failure has
    // been handled and the run task waits in its 30 s backoff.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    actor.stop();
    let reason = rx.await.expect("the watcher is told");
    assert_eq!(reason, StopReason::Stopped);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the stop waited {:?} (the backoff is 30 s)",
        start.elapsed()
    );
    assert_eq!(h.events(), ["started 1"], "no second instance");
    drop(watcher);
    system.shutdown().await;
}

/// A `terminated` hook that fails, between two messages of a batch, while a stop is on its
/// way: the actor stops (as `Stopped`) without a new instance, and the rest of the batch
/// becomes dead letters instead of being handled by no instance.
#[tokio::test]
async fn a_stop_sent_while_a_failing_terminated_hook_runs_stops_the_actor() {
    let system = ActorSystem::new("sup-hook-stop");
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let made = Arc::new(AtomicUsize::new(0));
    let (open_item, item_gate) = tokio::sync::oneshot::channel();
    let (open_hook, hook_gate) = tokio::sync::oneshot::channel();
    let gates = Arc::new(parking_lot::Mutex::new((Some(item_gate), Some(hook_gate))));
    let props = {
        let made = made.clone();
        Props::new(move || {
            made.fetch_add(1, Ordering::SeqCst);
            HookFails {
                events: events_tx.clone(),
                gates: gates.clone(),
            }
        })
        .supervisor(restart(10))
    };
    let w = system.spawn_props(props);
    let target = system.spawn(HookTarget);
    w.tell(HookMsg::Watch(target.clone()));
    assert_eq!(events.recv().await, Some("watching"));
    // Three messages taken as one batch; the first waits for the test.
    for block in [true, false, false] {
        w.tell(HookMsg::Item { block });
    }
    assert_eq!(events.recv().await, Some("item"));
    target.stop();
    target.terminated().await;
    open_item.send(()).unwrap();
    // The notice is taken before the batch's second message; the hook waits for the test.
    assert_eq!(events.recv().await, Some("in hook"));
    w.stop();
    open_hook.send(()).unwrap();
    let t = tokio::time::timeout(Duration::from_secs(10), w.terminated())
        .await
        .expect("the actor terminates (it was stranded without an instance)");
    assert_eq!(t.reason, StopReason::Stopped);
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "no new instance for a stopping actor"
    );
    assert_eq!(
        system.dead_letters().total(),
        2,
        "the rest of the batch is dead letters"
    );
    assert!(
        events.try_recv().is_err(),
        "no message handled without an instance"
    );
    system.shutdown().await;
}

enum HookMsg {
    Watch(ActorRef<()>),
    Item { block: bool },
}

type Gates = (
    Option<tokio::sync::oneshot::Receiver<()>>,
    Option<tokio::sync::oneshot::Receiver<()>>,
);

struct HookFails {
    events: tokio::sync::mpsc::UnboundedSender<&'static str>,
    /// The first blocking item's gate, then the hook's.
    gates: Arc<parking_lot::Mutex<Gates>>,
}

impl Actor for HookFails {
    type Msg = HookMsg;
    async fn handle(&mut self, msg: HookMsg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            HookMsg::Watch(a) => {
                ctx.watch(&a);
                let _ = self.events.send("watching");
            }
            HookMsg::Item { block } => {
                let _ = self.events.send("item");
                let gate = if block {
                    self.gates.lock().0.take()
                } else {
                    None
                };
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
            }
        }
        Ok(())
    }
    async fn terminated(
        &mut self,
        _ctx: &mut Context<Self>,
        _t: shardik_actor::Terminated,
    ) -> Result<(), ActorError> {
        let _ = self.events.send("in hook");
        let gate = self.gates.lock().1.take();
        if let Some(gate) = gate {
            let _ = gate.await;
        }
        Err("the watched actor is gone".into())
    }
}

struct HookTarget;

impl Actor for HookTarget {
    type Msg = ();
    async fn handle(&mut self, _msg: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        Ok(())
    }
}

/// Tells its owner how the watched actor ended.
struct Watcher {
    target: ActorRef<Msg>,
    done: Option<tokio::sync::oneshot::Sender<StopReason>>,
}

impl Actor for Watcher {
    type Msg = ();
    async fn started(&mut self, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        ctx.watch(&self.target);
        Ok(())
    }
    async fn handle(&mut self, _msg: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        Ok(())
    }
    async fn terminated(
        &mut self,
        _ctx: &mut Context<Self>,
        t: shardik_actor::Terminated,
    ) -> Result<(), ActorError> {
        if let Some(done) = self.done.take() {
            let _ = done.send(t.reason);
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_failing_started_hook_is_restarted_until_it_succeeds() {
    let system = ActorSystem::new("sup-started-restart");
    let (props, h) = flaky(restart(10), 2);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(4));
    assert_eq!(get(&actor).await, Ok(4));
    assert_eq!(
        h.events(),
        ["start failed 1", "start failed 2", "started 3"]
    );
    assert_eq!(h.failing_starts.load(Ordering::SeqCst), 0);
    system.shutdown().await;
}

#[tokio::test]
async fn a_started_hook_that_keeps_failing_hits_the_restart_limit() {
    let system = ActorSystem::new("sup-started-limit");
    let (props, h) = flaky(restart(3), usize::MAX);
    let actor = system.spawn_props(props);
    actor.tell(Msg::Add(4));
    match actor.terminated().await.reason {
        StopReason::Failed(why) => {
            assert!(why.contains("restart limit"), "{why}");
            assert!(why.contains("cannot start"), "{why}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    let starts = h
        .events()
        .iter()
        .filter(|e| e.starts_with("start failed"))
        .count();
    assert_eq!(starts, 4, "one start plus three restarts: {:?}", h.events());
    assert_eq!(system.dead_letters().unhandled_at_stop, 1);
    system.shutdown().await;
}

#[tokio::test]
async fn a_failing_started_hook_with_stop_strategy_stops_the_actor() {
    let system = ActorSystem::new("sup-started-stop");
    let (props, _h) = flaky(SupervisorStrategy::Stop, 1);
    let actor = system.spawn_props(props);
    let asked = actor.ask(Msg::Get, Duration::from_secs(5)).await;
    assert_eq!(
        asked,
        Err(AskError::NoReply),
        "the queued request is dropped at stop"
    );
    match actor.terminated().await.reason {
        StopReason::Failed(why) => assert!(why.contains("cannot start"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    system.shutdown().await;
}

#[tokio::test]
async fn a_factory_that_panics_on_restart_is_retried() {
    struct Plain(u64);
    impl Actor for Plain {
        type Msg = Msg;
        async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                Msg::Add(n) => self.0 += n,
                Msg::Fail => return Err("boom".into()),
                Msg::Panic => panic!("kaboom"),
                Msg::Get(r) => r.reply(self.0),
            }
            Ok(())
        }
    }
    let system = ActorSystem::new("sup-factory");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let actor = system.spawn_props(
        Props::new(move || {
            if counted.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("factory hiccup");
            }
            Plain(100)
        })
        .supervisor(restart(5)),
    );
    actor.tell(Msg::Add(1));
    actor.tell(Msg::Fail);
    assert_eq!(get(&actor).await, Ok(100));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    system.shutdown().await;
}

#[tokio::test]
async fn an_actor_from_an_instance_cannot_restart_and_stops() {
    let system = ActorSystem::new("sup-instance");
    let (instance, _h) = flaky_instance();
    let actor = system.spawn_props(Props::from_instance(instance).supervisor(restart(10)));
    actor.tell(Msg::Add(1));
    actor.tell(Msg::Fail);
    match actor.terminated().await.reason {
        StopReason::Failed(why) => assert!(why.contains("cannot be recreated"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    system.shutdown().await;
}

/// An actor whose `handle` and `started` are plain functions returning a future, with code
/// that panics before the future is made.
struct Eager {
    panic_in_started: bool,
    total: u64,
}

impl Actor for Eager {
    type Msg = Msg;

    #[allow(clippy::manual_async_fn)]
    fn started(
        &mut self,
        _ctx: &mut Context<Self>,
    ) -> impl std::future::Future<Output = Result<(), ActorError>> + Send {
        assert!(!self.panic_in_started, "started panics before its future");
        async { Ok(()) }
    }

    #[allow(clippy::manual_async_fn)]
    fn handle(
        &mut self,
        msg: Msg,
        _ctx: &mut Context<Self>,
    ) -> impl std::future::Future<Output = Result<(), ActorError>> + Send {
        match msg {
            Msg::Panic => panic!("handle panics before its future"),
            Msg::Add(n) => self.total += n,
            Msg::Get(r) => r.reply(self.total),
            Msg::Fail => {}
        }
        async { Ok(()) }
    }
}

/// A panic while a handler or hook builds its future is a failure like any other: the
/// supervisor restarts or stops the actor. It used to escape the turn and leave the actor
/// scheduled for good: its messages never handled, `stop` ignored, shutdown hanging.
#[tokio::test]
async fn a_panic_before_the_handlers_future_is_a_failure() {
    let system = ActorSystem::new("sup-eager");
    let restarting = system.spawn_props(
        Props::new(|| Eager {
            panic_in_started: false,
            total: 0,
        })
        .supervisor(restart(5)),
    );
    restarting.tell(Msg::Add(1));
    restarting.tell(Msg::Panic);
    restarting.tell(Msg::Add(2));
    assert_eq!(get(&restarting).await, Ok(2), "restarted with fresh state");

    let stopping = system.spawn(Eager {
        panic_in_started: false,
        total: 0,
    });
    stopping.tell(Msg::Panic);
    match stopping.terminated().await.reason {
        StopReason::Failed(why) => assert!(why.contains("before its future"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }

    let not_starting = system.spawn(Eager {
        panic_in_started: true,
        total: 0,
    });
    match not_starting.terminated().await.reason {
        StopReason::Failed(why) => assert!(why.contains("started panics"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    system.shutdown().await;
}

/// Panics when dropped, like an instance whose `Drop` impl has a bug.
struct PanicsOnDrop {
    total: u64,
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("drop of total {} panicked", self.total);
        }
    }
}

impl Actor for PanicsOnDrop {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        apply(&mut self.total, msg)
    }
}

/// An instance whose `Drop` panics, discarded for a restart and dropped at the stop, wedges
/// nothing: the restarted instance handles the next messages, and the actor stops (and the
/// system shuts down) as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_drop_panics_neither_wedges_a_restart_nor_the_stop() {
    let system = ActorSystem::new("drop-panics");
    let actor = system.spawn_props(Props::new(|| PanicsOnDrop { total: 0 }));
    actor.tell(Msg::Add(5));
    actor.tell(Msg::Fail);
    actor.tell(Msg::Add(2));
    let total = actor.ask(Msg::Get, Duration::from_secs(5)).await;
    assert_eq!(
        total,
        Ok(2),
        "restarted with fresh state, then handled what followed"
    );
    actor.stop();
    tokio::time::timeout(Duration::from_secs(5), actor.terminated())
        .await
        .expect("the actor stops");
    tokio::time::timeout(Duration::from_secs(5), system.shutdown())
        .await
        .expect("the system shuts down");
}

/// Where [`StopsThenFails`] calls `ctx.stop()` and then fails.
#[derive(Clone, Copy, Debug)]
enum StopThenFail {
    Started,
    Handle,
    Terminated,
}

struct StopsThenFails {
    at: StopThenFail,
    watch: Option<ActorRef<()>>,
}

impl Actor for StopsThenFails {
    type Msg = ();
    async fn started(&mut self, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        if let Some(target) = &self.watch {
            ctx.watch(target);
        }
        if let StopThenFail::Started = self.at {
            ctx.stop();
            return Err("failed after ctx.stop()".into());
        }
        Ok(())
    }
    async fn handle(&mut self, _msg: (), ctx: &mut Context<Self>) -> Result<(), ActorError> {
        ctx.stop();
        Err("failed after ctx.stop()".into())
    }
    async fn terminated(
        &mut self,
        ctx: &mut Context<Self>,
        _t: shardik_actor::Terminated,
    ) -> Result<(), ActorError> {
        ctx.stop();
        Err("failed after ctx.stop()".into())
    }
}

/// `ctx.stop()` and then a failure, under a restart strategy: the actor stops (as
/// `Stopped`) without a new instance, whether the failure is in `handle`, in `terminated` or
/// in `started`. A new instance used to be built and started first (and a `started` that
/// did this was restarted up to the limit).
#[tokio::test]
async fn a_failure_after_ctx_stop_stops_without_a_new_instance() {
    for at in [
        StopThenFail::Handle,
        StopThenFail::Terminated,
        StopThenFail::Started,
    ] {
        let system = ActorSystem::new("sup-stop-then-fail");
        let made = Arc::new(AtomicUsize::new(0));
        let target = system.spawn(HookTarget);
        let props = {
            let made = made.clone();
            let watch = matches!(at, StopThenFail::Terminated).then(|| target.clone());
            Props::new(move || {
                made.fetch_add(1, Ordering::SeqCst);
                StopsThenFails {
                    at,
                    watch: watch.clone(),
                }
            })
            .supervisor(restart(10))
        };
        let actor = system.spawn_props(props);
        match at {
            StopThenFail::Handle => actor.tell(()),
            StopThenFail::Terminated => target.stop(),
            StopThenFail::Started => {}
        }
        let t = tokio::time::timeout(Duration::from_secs(10), actor.terminated())
            .await
            .unwrap_or_else(|_| panic!("{at:?}: the actor terminates"));
        assert_eq!(t.reason, StopReason::Stopped, "{at:?}");
        assert_eq!(made.load(Ordering::SeqCst), 1, "{at:?}: no new instance");
        system.shutdown().await;
    }
}

/// Fails in `started`, every time, at once.
struct NeverStarts {
    failures: tokio::sync::mpsc::UnboundedSender<()>,
}

impl Actor for NeverStarts {
    type Msg = ();
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let _ = self.failures.send(());
        Err("cannot start".into())
    }
    async fn handle(&mut self, _msg: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        Ok(())
    }
}

/// An actor whose `started` always fails at once, restarted without backoff and without a
/// limit that it could reach, on a current-thread runtime: its restarts yield to the runtime,
/// so `stop()` and the shutdown still get their turn. The restart loop used to run without
/// ever returning `Pending`, and the runtime's only thread never ran anything else again.
/// (On its own thread, so that a regression fails on the timeout instead of hanging.)
#[test]
fn restarts_without_backoff_still_let_a_current_thread_runtime_stop_the_actor() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let system = ActorSystem::new("sup-tight-restarts");
            let (failures_tx, mut failures) = tokio::sync::mpsc::unbounded_channel();
            let policy = RestartPolicy::new(u32::MAX, Duration::from_secs(60));
            let actor = system.spawn_props(
                Props::new(move || NeverStarts {
                    failures: failures_tx.clone(),
                })
                .supervisor(SupervisorStrategy::Restart(policy)),
            );
            // It failed once: it is in its restart loop now.
            failures.recv().await;
            actor.stop();
            let t = actor.terminated().await;
            system.shutdown().await;
            let _ = done.send(t.reason);
        });
    });
    let reason = finished.recv_timeout(Duration::from_secs(30)).expect(
        "the actor stopped and the system shut down (the restart loop starved the runtime)",
    );
    assert_eq!(reason, StopReason::Stopped);
}

/// An actor spawned from an instance has no factory to restart from: under a restart
/// strategy it stops at its first failure, like with `Stop` (its `stopped` hook runs), with
/// the failure in the reason. It used to wait out the restart backoff and count a restart
/// first, and its reason lost the original error.
#[tokio::test(start_paused = true)]
async fn an_instance_actor_under_a_restart_strategy_stops_at_its_first_failure() {
    let system = ActorSystem::new("sup-instance-restart");
    let (instance, h) = flaky_instance();
    let policy = RestartPolicy::new(10, Duration::from_secs(60))
        .with_backoff(Duration::from_secs(30), Duration::from_secs(30));
    let actor = system.spawn_props(
        Props::from_instance(instance).supervisor(SupervisorStrategy::Restart(policy)),
    );
    assert_eq!(get(&actor).await, Ok(0));
    let start = Instant::now();
    actor.tell(Msg::Fail);
    let t = actor.terminated().await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "it waited {:?} (the backoff is 30 s)",
        start.elapsed()
    );
    match t.reason {
        StopReason::Failed(why) => {
            assert!(why.contains("boom"), "{why}");
            assert!(why.contains("cannot be recreated"), "{why}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(h.events(), ["started 1", "stopped 1"]);
    system.shutdown().await;
}
