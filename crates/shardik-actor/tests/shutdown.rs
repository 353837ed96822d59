//! `ActorSystem::shutdown`: actors finish the message in hand, every `stopped` hook runs,
//! nothing stays live; `shutdown_timeout` reports actors that never finish.

mod common;

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{worker, WorkMsg};
use futures_util::FutureExt;
use parking_lot::Mutex;
use shardik_actor::{
    Actor, ActorError, ActorSystem, Context, Props, ShutdownError, StopReason, Termination,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_actors_finish_the_message_in_hand() {
    let system = ActorSystem::new("shutdown");
    let mut parked = Vec::new();
    for _ in 0..6 {
        let (w, mut probe) = worker();
        let actor = system.spawn(w);
        actor.tell(WorkMsg::Hold(0));
        actor.tell(WorkMsg::Item(1)); // queued behind: not handled
        probe.wait_entered().await;
        parked.push((actor, probe));
    }
    // Idle actors too.
    let idle: Vec<_> = (0..10)
        .map(|_| worker())
        .map(|(w, p)| (system.spawn(w), p))
        .collect();
    assert_eq!(system.live_actors(), 16);

    // The first poll starts the shutdown (every actor is sent its stop) and then waits.
    let mut shutdown = pin!(system.shutdown());
    assert!(shutdown.as_mut().now_or_never().is_none());
    assert!(system.is_shutting_down());
    for (_, probe) in &parked {
        probe.gate.open();
    }
    shutdown.await;

    assert_eq!(system.live_actors(), 0);
    for (actor, probe) in parked.iter().chain(idle.iter()) {
        assert!(actor.is_terminated());
        assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
        assert_eq!(probe.stopped_hooks(), 1);
    }
    for (_, probe) in &parked {
        assert_eq!(
            probe.handled(),
            vec![0],
            "the message in hand finishes, queued ones do not run"
        );
    }
    assert_eq!(system.dead_letters().unhandled_at_stop, 6);
}

#[tokio::test(start_paused = true)]
async fn shutdown_timeout_reports_an_actor_that_never_finishes() {
    struct Stuck;
    impl Actor for Stuck {
        type Msg = tokio::sync::oneshot::Sender<()>;
        async fn handle(
            &mut self,
            entered: Self::Msg,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            let _ = entered.send(());
            std::future::pending::<()>().await;
            Ok(())
        }
    }
    let system = ActorSystem::new("shutdown-timeout");
    let stuck = system.spawn(Stuck);
    let (entered, in_handler) = tokio::sync::oneshot::channel();
    stuck.tell(entered);
    in_handler.await.unwrap();
    let (w, probe) = worker();
    let fine = system.spawn(w);
    let start = tokio::time::Instant::now();
    let res = system.shutdown_timeout(Duration::from_secs(5)).await;
    assert_eq!(
        res,
        Err(ShutdownError {
            timeout: Duration::from_secs(5),
            remaining: 1
        })
    );
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(fine.is_terminated());
    assert_eq!(probe.stopped_hooks(), 1);
    assert!(!stuck.is_terminated());
    assert_eq!(system.live_actors(), 1);
}

#[tokio::test]
async fn shutdown_timeout_succeeds_when_everyone_stops_in_time() {
    let system = ActorSystem::new("shutdown-in-time");
    let (w, _p) = worker();
    system.spawn(w);
    assert_eq!(
        system.shutdown_timeout(Duration::from_secs(5)).await,
        Ok(())
    );
    assert_eq!(system.live_actors(), 0);
}

#[tokio::test]
async fn shutdown_of_an_empty_system_returns_and_can_be_repeated() {
    let system = ActorSystem::new("shutdown-empty");
    system.shutdown().await;
    system.shutdown().await;
    assert!(system.is_shutting_down());
    system.shutdown_started().await;
}

#[tokio::test]
async fn actors_spawned_during_or_after_shutdown_are_stopped() {
    /// Spawns a fresh top-level actor from its `stopped` hook.
    struct Respawner(Arc<AtomicUsize>);
    impl Actor for Respawner {
        type Msg = ();
        async fn handle(&mut self, _m: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
        async fn stopped(&mut self, ctx: &mut Context<Self>) {
            let (w, _p) = worker();
            ctx.system().spawn(w);
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let system = ActorSystem::new("shutdown-respawn");
    let hooks = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        system.spawn(Respawner(hooks.clone()));
    }
    system.shutdown().await;
    assert_eq!(hooks.load(Ordering::SeqCst), 3);
    assert_eq!(system.live_actors(), 0);

    let (w, probe) = worker();
    let late = system.spawn(w);
    assert_eq!(late.terminated().await.reason, StopReason::Stopped);
    assert_eq!(probe.stopped_hooks(), 1);
    assert_eq!(system.live_actors(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_queued_messages_to_termination_hooks() {
    let system = ActorSystem::new("shutdown-hook");
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    let (w, mut probe) = worker();
    let actor = system.spawn_props(Props::from_instance(w).on_termination(
        move |t: Termination<WorkMsg>| {
            sink.lock().push(t.undelivered.len());
        },
    ));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await;
    for n in 1..=3 {
        actor.tell(WorkMsg::Item(n));
    }
    let mut shutdown = pin!(system.shutdown());
    assert!(shutdown.as_mut().now_or_never().is_none());
    probe.gate.open();
    shutdown.await;
    assert_eq!(*got.lock(), vec![3]);
    assert_eq!(system.dead_letters().total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_termination_hook_does_not_hang_watchers_or_shutdown() {
    let system = ActorSystem::new("shutdown-hook-panic");
    let (w, _probe) = worker();
    let actor = system.spawn_props(
        Props::from_instance(w).on_termination(|_t: Termination<WorkMsg>| panic!("hook bug")),
    );
    actor.tell(WorkMsg::Item(1));
    actor.stop();
    assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
    assert_eq!(system.live_actors(), 0);
    system
        .shutdown_timeout(std::time::Duration::from_secs(5))
        .await
        .expect("shutdown completes");
}

/// `Context::spawn` during a shutdown: the child is stopped at once, like a top-level actor
/// spawned then, while its parent still runs. It used to run on until its parent stopped.
#[tokio::test(start_paused = true)]
async fn a_child_spawned_during_shutdown_is_stopped_at_once() {
    use common::Gate;
    use shardik_actor::ActorRef;

    struct Child;
    impl Actor for Child {
        type Msg = ();
        async fn handle(&mut self, _m: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
    }
    /// Waits for `spawn`, spawns a child, hands it over, and waits for `finish`.
    struct Parent {
        spawn: Gate,
        finish: Gate,
        child: Option<tokio::sync::oneshot::Sender<ActorRef<()>>>,
    }
    impl Actor for Parent {
        type Msg = ();
        async fn handle(&mut self, _m: (), ctx: &mut Context<Self>) -> Result<(), ActorError> {
            self.spawn.wait().await;
            let child = ctx.spawn(Props::from_instance(Child));
            if let Some(tx) = self.child.take() {
                let _ = tx.send(child);
            }
            self.finish.wait().await;
            Ok(())
        }
    }

    let system = ActorSystem::new("shutdown-child");
    let (spawn, finish) = (Gate::new(), Gate::new());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let parent = system.spawn(Parent {
        spawn: spawn.clone(),
        finish: finish.clone(),
        child: Some(tx),
    });
    parent.tell(());
    let shutdown = tokio::spawn({
        let system = system.clone();
        async move { system.shutdown().await }
    });
    system.shutdown_started().await;
    spawn.open();
    let child = rx.await.expect("the parent spawned a child");
    // On the paused clock this timeout fires as soon as everything is idle.
    let t = tokio::time::timeout(Duration::from_secs(60), child.terminated())
        .await
        .expect("the child is stopped at once, not when its parent stops");
    assert_eq!(t.reason, StopReason::Stopped);
    assert!(
        !parent.is_terminated(),
        "the parent still handles its message"
    );
    finish.open();
    shutdown.await.unwrap();
    assert_eq!(system.live_actors(), 0);
}
