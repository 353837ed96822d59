//! Death watch: `Context::watch`, `watch_with`, `unwatch`, and `ActorRef::terminated`.

mod common;

use std::time::Duration;

use common::{worker, Gate, WorkMsg, Worker};
use shardik_actor::{
    Actor, ActorError, ActorRef, ActorSystem, Context, Props, ReplyTo, StopReason,
    SupervisorStrategy, Terminated,
};
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Terminated(Terminated),
    Note(String),
    Item(u32),
}

enum WMsg {
    Watch(ActorRef<WorkMsg>),
    WatchWith(ActorRef<WorkMsg>, String),
    Unwatch(ActorRef<WorkMsg>),
    /// In one handler: stop `target`, wait until it has terminated (so its notice is already
    /// on its way to us), then unwatch it, then acknowledge.
    StopThenUnwatch(ActorRef<WorkMsg>, ReplyTo<()>),
    /// Wait for the gate inside the handler.
    Hold(Gate),
    Item(u32),
    Note(String),
    Log(ReplyTo<Vec<Event>>),
}

struct Watcher {
    log: Vec<Event>,
    events: mpsc::UnboundedSender<Event>,
    /// Fail in `terminated` (to test that such a failure is supervised).
    fail_on_terminated: bool,
}

impl Watcher {
    fn record(&mut self, e: Event) {
        let _ = self.events.send(e.clone());
        self.log.push(e);
    }
}

impl Actor for Watcher {
    type Msg = WMsg;

    async fn handle(&mut self, msg: WMsg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            WMsg::Watch(t) => ctx.watch(&t),
            WMsg::WatchWith(t, note) => ctx.watch_with(&t, WMsg::Note(note)),
            WMsg::Unwatch(t) => ctx.unwatch(&t),
            WMsg::StopThenUnwatch(t, done) => {
                t.stop();
                t.terminated().await;
                ctx.unwatch(&t);
                done.reply(());
            }
            WMsg::Hold(gate) => gate.wait().await,
            WMsg::Item(n) => self.record(Event::Item(n)),
            WMsg::Note(s) => self.record(Event::Note(s)),
            WMsg::Log(r) => r.reply(self.log.clone()),
        }
        Ok(())
    }

    async fn terminated(
        &mut self,
        _ctx: &mut Context<Self>,
        t: Terminated,
    ) -> Result<(), ActorError> {
        self.record(Event::Terminated(t));
        if self.fail_on_terminated {
            return Err("watched actor died".into());
        }
        Ok(())
    }
}

fn watcher(system: &ActorSystem) -> (ActorRef<WMsg>, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let w = system.spawn(Watcher {
        log: Vec::new(),
        events: tx,
        fail_on_terminated: false,
    });
    (w, rx)
}

/// Asks for the watcher's log; since the ask queues behind everything told before, it also
/// acknowledges those messages. System messages (Terminated notices) already queued are
/// handled before it.
async fn log_of(w: &ActorRef<WMsg>) -> Vec<Event> {
    w.ask(WMsg::Log, Duration::from_secs(5)).await.unwrap()
}

fn target(system: &ActorSystem, name: &str) -> ActorRef<WorkMsg> {
    let (w, _probe) = worker();
    system.spawn_props(Props::new(move || w.clone()).name(name.to_string()))
}

#[tokio::test]
async fn watch_delivers_terminated_with_id_name_and_reason() {
    let system = ActorSystem::new("watch");
    let (w, mut events) = watcher(&system);
    let t = target(&system, "target");
    w.tell(WMsg::Watch(t.clone()));
    assert!(log_of(&w).await.is_empty());
    t.stop();
    let got = events.recv().await.unwrap();
    assert_eq!(
        got,
        Event::Terminated(Terminated {
            id: t.id(),
            name: Some("target".into()),
            reason: StopReason::Stopped,
        })
    );
    system.shutdown().await;
}

#[tokio::test]
async fn watch_reports_a_failure_as_the_reason() {
    struct Doomed;
    impl Actor for Doomed {
        type Msg = WorkMsg;
        async fn handle(
            &mut self,
            _m: WorkMsg,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            Err("doomed".into())
        }
    }
    let system = ActorSystem::new("watch-failed");
    let (w, mut events) = watcher(&system);
    let t = system.spawn_props(Props::new(|| Doomed).supervisor(SupervisorStrategy::Stop));
    w.tell(WMsg::Watch(t.clone()));
    log_of(&w).await;
    t.tell(WorkMsg::Item(1));
    match events.recv().await.unwrap() {
        Event::Terminated(Terminated {
            id,
            name: None,
            reason: StopReason::Failed(why),
        }) => {
            assert_eq!(id, t.id());
            assert!(why.contains("doomed"), "{why}");
        }
        other => panic!("unexpected {other:?}"),
    }
    system.shutdown().await;
}

#[tokio::test]
async fn watch_with_delivers_the_user_message() {
    let system = ActorSystem::new("watch-with");
    let (w, mut events) = watcher(&system);
    let t = target(&system, "t");
    w.tell(WMsg::WatchWith(t.clone(), "t is gone".into()));
    log_of(&w).await;
    t.stop();
    assert_eq!(
        events.recv().await.unwrap(),
        Event::Note("t is gone".into())
    );
    // Exactly once, and not also as a Terminated notice.
    assert_eq!(log_of(&w).await, vec![Event::Note("t is gone".into())]);
    system.shutdown().await;
}

#[tokio::test]
async fn watching_an_already_terminated_actor_notifies_at_once() {
    let system = ActorSystem::new("watch-dead");
    let (w, mut events) = watcher(&system);
    let t = target(&system, "dead");
    t.stop();
    t.terminated().await;
    w.tell(WMsg::Watch(t.clone()));
    match events.recv().await.unwrap() {
        Event::Terminated(n) => {
            assert_eq!(n.id, t.id());
            assert_eq!(n.reason, StopReason::Stopped);
        }
        other => panic!("unexpected {other:?}"),
    }
    w.tell(WMsg::WatchWith(t.clone(), "late".into()));
    assert_eq!(events.recv().await.unwrap(), Event::Note("late".into()));
    system.shutdown().await;
}

#[tokio::test]
async fn unwatch_suppresses_the_notice() {
    let system = ActorSystem::new("unwatch");
    let (w, _events) = watcher(&system);
    let a = target(&system, "a");
    let b = target(&system, "b");
    w.tell(WMsg::Watch(a.clone()));
    w.tell(WMsg::WatchWith(b.clone(), "b gone".into()));
    w.tell(WMsg::Unwatch(a.clone()));
    w.tell(WMsg::Unwatch(b.clone()));
    log_of(&w).await;
    a.stop();
    b.stop();
    // Watchers are notified in registration order, so had the watcher still been registered
    // its notice would be queued by the time these return, and handled before the next ask.
    a.terminated().await;
    b.terminated().await;
    assert_eq!(log_of(&w).await, vec![]);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// Watches a target (with `watch` or `watch_with`, per `watch`), then has the watcher stop
/// the target and unwatch it in one handler, so that a notice may already be queued when the
/// unwatch happens; no notice may be delivered afterwards.
async fn unwatch_after_stop_delivers_nothing(name: &str, watch: fn(ActorRef<WorkMsg>) -> WMsg) {
    let system = ActorSystem::new(name);
    let (w, _events) = watcher(&system);
    let a = target(&system, "a");
    w.tell(watch(a.clone()));
    let done = w
        .ask(
            |r| WMsg::StopThenUnwatch(a.clone(), r),
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(done, Ok(()));
    // A notice (system message or `watch_with` user message) queued before the unwatch would
    // be handled before this ask.
    assert_eq!(
        log_of(&w).await,
        vec![],
        "no notice may be delivered after unwatch returns"
    );
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwatch_suppresses_a_notice_that_is_already_queued() {
    unwatch_after_stop_delivers_nothing("unwatch-queued", WMsg::Watch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwatch_suppresses_a_watch_with_message_that_is_already_queued() {
    unwatch_after_stop_delivers_nothing("unwatch-queued-with", |a| {
        WMsg::WatchWith(a, "a gone".into())
    })
    .await;
}

#[tokio::test]
async fn a_stopped_watcher_is_no_longer_notified() {
    let system = ActorSystem::new("watcher-stops");
    let (w, _events) = watcher(&system);
    let a = target(&system, "a");
    let b = target(&system, "b");
    w.tell(WMsg::Watch(a.clone()));
    w.tell(WMsg::WatchWith(b.clone(), "b gone".into()));
    log_of(&w).await;
    w.stop();
    w.terminated().await;
    a.stop();
    b.stop();
    a.terminated().await;
    b.terminated().await;
    // A surviving `watch_with` registration would have told the stopped watcher: a dead letter.
    assert_eq!(system.dead_letters().total(), 0);
    assert_eq!(system.live_actors(), 0);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminated_notice_overtakes_queued_user_messages() {
    let system = ActorSystem::new("watch-overtake");
    let (w, _events) = watcher(&system);
    let a = target(&system, "a");
    w.tell(WMsg::Watch(a.clone()));
    log_of(&w).await;
    let gate = Gate::new();
    w.tell(WMsg::Hold(gate.clone()));
    w.tell(WMsg::Item(1));
    w.tell(WMsg::Item(2));
    a.stop();
    a.terminated().await; // the notice is now queued behind Hold, Item(1), Item(2)
    gate.open();
    let log = log_of(&w).await;
    assert!(
        matches!(log[0], Event::Terminated(ref t) if t.id == a.id()),
        "{log:?}"
    );
    assert_eq!(log[1..], [Event::Item(1), Event::Item(2)]);
    system.shutdown().await;
}

#[tokio::test]
async fn one_actor_watches_many_and_many_watch_one() {
    let system = ActorSystem::new("watch-many");
    let targets: Vec<_> = (0..5).map(|i| target(&system, &format!("t{i}"))).collect();
    let watchers: Vec<_> = (0..3).map(|_| watcher(&system)).collect();
    for (w, _) in &watchers {
        for t in &targets {
            w.tell(WMsg::Watch(t.clone()));
        }
        log_of(w).await;
    }
    for t in &targets {
        t.stop();
    }
    for (w, mut events) in watchers {
        let mut ids = Vec::new();
        for _ in 0..targets.len() {
            match events.recv().await.unwrap() {
                Event::Terminated(t) => ids.push(t.id),
                other => panic!("unexpected {other:?}"),
            }
        }
        ids.sort();
        let mut want: Vec<_> = targets.iter().map(|t| t.id()).collect();
        want.sort();
        assert_eq!(ids, want);
        assert_eq!(
            log_of(&w).await.len(),
            targets.len(),
            "each notice exactly once"
        );
    }
    system.shutdown().await;
}

#[tokio::test]
async fn a_failing_terminated_hook_is_supervised() {
    let system = ActorSystem::new("watch-fail");
    let (tx, mut events) = mpsc::unbounded_channel();
    let w = system.spawn_props(
        Props::new(move || Watcher {
            log: Vec::new(),
            events: tx.clone(),
            fail_on_terminated: true,
        })
        .supervisor(SupervisorStrategy::restart()),
    );
    let a = target(&system, "a");
    w.tell(WMsg::Watch(a.clone()));
    w.tell(WMsg::Item(1));
    log_of(&w).await;
    a.stop();
    assert_eq!(events.recv().await.unwrap(), Event::Item(1));
    assert!(matches!(events.recv().await.unwrap(), Event::Terminated(_)));
    // Restarted: fresh state (the log of the old incarnation is gone), still running.
    assert_eq!(log_of(&w).await, vec![]);
    assert!(!w.is_terminated());
    system.shutdown().await;
}

#[tokio::test]
async fn terminated_resolves_for_every_waiter_and_after_the_fact() {
    let system = ActorSystem::new("terminated");
    let (wk, _probe): (Worker, _) = worker();
    let a = system.spawn(wk);
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move { a.terminated().await })
        })
        .collect();
    tokio::task::yield_now().await;
    a.stop();
    for w in waiters {
        let t = w.await.unwrap();
        assert_eq!(t.id, a.id());
        assert_eq!(t.reason, StopReason::Stopped);
    }
    assert!(a.is_terminated());
    assert_eq!(a.terminated().await.id, a.id());
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_again_after_unwatch_delivers_exactly_one_notice() {
    let system = ActorSystem::new("rewatch");
    let (w, _events) = watcher(&system);
    let a = target(&system, "a");
    w.tell(WMsg::Watch(a.clone()));
    // The first notice is queued, then cancelled; the new watch of the dead actor notifies
    // at once. Only one notice may come through.
    w.ask(
        |r| WMsg::StopThenUnwatch(a.clone(), r),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    w.tell(WMsg::Watch(a.clone()));
    let log = log_of(&w).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(matches!(log[0], Event::Terminated(ref t) if t.id == a.id()));
    system.shutdown().await;
}

/// Actor ids are unique in the process, not only within one system. They were counted per
/// system, and watch bookkeeping keys on them: here the second actor of `s1` unwatching `b`
/// in `s2` (which it never watched) withdrew the `terminated()` wait that had the same
/// number in `s2`, and that wait then panicked ("termination notice is always sent").
#[tokio::test]
async fn ids_are_unique_across_systems_and_a_foreign_unwatch_removes_no_other_watch() {
    use futures_util::FutureExt;
    let s1 = ActorSystem::new("ids-one");
    let s2 = ActorSystem::new("ids-two");
    let b = target(&s2, "b");
    // Waits on `b` under the next id (in `s2`'s own count, the second one).
    let mut waiting = Box::pin(b.terminated());
    assert!(waiting.as_mut().now_or_never().is_none(), "b still runs");
    let watchers: Vec<_> = (0..4).map(|_| watcher(&s1).0).collect();
    let mut ids: Vec<_> = watchers.iter().map(|w| w.id()).chain([b.id()]).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "two systems handed out the same id");
    for w in &watchers {
        w.tell(WMsg::Unwatch(b.clone()));
        log_of(w).await;
    }
    b.stop();
    let t = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wait on b was kept");
    assert_eq!(t.id, b.id());
    s1.shutdown().await;
    s2.shutdown().await;
}
