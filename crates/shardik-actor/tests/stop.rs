//! Stop semantics: `ActorRef::stop` overtakes queued messages, `graceful_stop` drains them,
//! `Context::stop`, and the termination hook that receives undelivered messages.

mod common;

use std::sync::Arc;

use common::{worker, WorkMsg, Worker, WorkerProbe};
use parking_lot::Mutex;
use shardik_actor::{ActorRef, ActorSystem, Props, StopReason, TellError, Termination};

/// Spawns a worker and parks it inside the handler of `Hold(0)`.
async fn parked(
    system: &ActorSystem,
    props: impl FnOnce(Worker) -> Props<Worker>,
) -> (ActorRef<WorkMsg>, WorkerProbe) {
    let (w, mut probe) = worker();
    let actor = system.spawn_props(props(w));
    actor.tell(WorkMsg::Hold(0));
    assert_eq!(probe.wait_entered().await, 0);
    (actor, probe)
}

fn plain(w: Worker) -> Props<Worker> {
    Props::from_instance(w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_overtakes_queued_messages_which_become_dead_letters() {
    let system = ActorSystem::new("stop");
    let (actor, probe) = parked(&system, plain).await;
    for n in 1..=5 {
        actor.tell(WorkMsg::Item(n));
    }
    actor.stop();
    probe.gate.open();
    assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
    assert_eq!(
        probe.handled(),
        vec![0],
        "the current message finishes, queued ones are skipped"
    );
    assert_eq!(probe.stopped_hooks(), 1);
    let dl = system.dead_letters();
    assert_eq!(dl.unhandled_at_stop, 5);
    assert_eq!(dl.total(), 5);
    // Afterwards the mailbox refuses, handing the message back.
    assert!(matches!(
        actor.try_tell(WorkMsg::Item(9)),
        Err(TellError::Stopped(WorkMsg::Item(9)))
    ));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_handles_everything_queued_first() {
    let system = ActorSystem::new("graceful");
    let (actor, probe) = parked(&system, plain).await;
    for n in 1..=5 {
        actor.tell(WorkMsg::Item(n));
    }
    actor.graceful_stop();
    actor.tell(WorkMsg::Item(6)); // queued after the stop marker: not handled
    probe.gate.open();
    assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
    assert_eq!(probe.handled(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(system.dead_letters().total(), 1);
    assert_eq!(probe.stopped_hooks(), 1);
    system.shutdown().await;
}

#[tokio::test]
async fn graceful_stop_of_an_idle_actor_stops_it() {
    let system = ActorSystem::new("graceful-idle");
    let (w, probe) = worker();
    let actor = system.spawn(w);
    actor.graceful_stop();
    assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
    assert_eq!(probe.stopped_hooks(), 1);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_overtakes_a_pending_graceful_stop() {
    let system = ActorSystem::new("graceful-then-stop");
    let (actor, probe) = parked(&system, plain).await;
    actor.tell(WorkMsg::Item(1));
    actor.graceful_stop();
    actor.stop();
    probe.gate.open();
    actor.terminated().await;
    assert_eq!(probe.handled(), vec![0]);
    assert_eq!(system.dead_letters().unhandled_at_stop, 1);
    system.shutdown().await;
}

#[tokio::test]
async fn context_stop_skips_the_rest_of_the_mailbox() {
    use shardik_actor::{Actor, ActorError, Context};
    struct StopsAt(u32, Vec<u32>, Arc<Mutex<Vec<u32>>>);
    impl Actor for StopsAt {
        type Msg = u32;
        async fn handle(&mut self, n: u32, ctx: &mut Context<Self>) -> Result<(), ActorError> {
            self.1.push(n);
            if n == self.0 {
                ctx.stop();
            }
            Ok(())
        }
        async fn stopped(&mut self, _ctx: &mut Context<Self>) {
            *self.2.lock() = std::mem::take(&mut self.1);
        }
    }
    let system = ActorSystem::new("ctx-stop");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let actor = system.spawn(StopsAt(3, Vec::new(), seen.clone()));
    for n in 1..=6 {
        actor.tell(n);
    }
    assert_eq!(actor.terminated().await.reason, StopReason::Stopped);
    assert_eq!(*seen.lock(), vec![1, 2, 3]);
    assert_eq!(system.dead_letters().unhandled_at_stop, 3);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_termination_hook_receives_undelivered_messages_in_order() {
    let system = ActorSystem::new("termination-hook");
    /// (reason, name, undelivered items) per hook call.
    type Seen = (StopReason, Option<String>, Vec<u32>);
    let got: Arc<Mutex<Vec<Seen>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    let (actor, probe) = parked(&system, move |w| {
        Props::from_instance(w)
            .name("hooked")
            .on_termination(move |t: Termination<WorkMsg>| {
                let items = t
                    .undelivered
                    .into_iter()
                    .map(|m| match m {
                        WorkMsg::Item(n) => n,
                        _ => u32::MAX,
                    })
                    .collect();
                sink.lock()
                    .push((t.reason, t.name.map(|n| n.to_string()), items));
            })
    })
    .await;
    for n in 1..=5 {
        actor.tell(WorkMsg::Item(n));
    }
    actor.stop();
    probe.gate.open();
    let t = actor.terminated().await;
    assert_eq!(t.reason, StopReason::Stopped);
    // The hook ran before watchers were notified.
    assert_eq!(
        *got.lock(),
        vec![(
            StopReason::Stopped,
            Some("hooked".to_string()),
            vec![1, 2, 3, 4, 5]
        )]
    );
    assert_eq!(
        system.dead_letters().total(),
        0,
        "handed to the hook instead of dead letters"
    );
    system.shutdown().await;
}

#[tokio::test]
async fn the_termination_hook_runs_once_even_with_nothing_undelivered() {
    let system = ActorSystem::new("termination-hook-empty");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sink = calls.clone();
    let (w, _probe) = worker();
    let hook =
        move |t: Termination<WorkMsg>| sink.lock().push((t.undelivered.len(), t.handled_any));
    let actor = system.spawn_props(Props::from_instance(w).on_termination(hook.clone()));
    actor.tell(WorkMsg::Item(1));
    actor.graceful_stop();
    actor.terminated().await;
    assert_eq!(*calls.lock(), vec![(0, true)], "it handled its message");
    // One stopped before it handled anything says so (sharding gives up on an entity whose
    // incarnations all end that way while messages wait).
    let (w, _probe) = worker();
    let idle = system.spawn_props(Props::from_instance(w).on_termination(hook));
    idle.graceful_stop();
    idle.terminated().await;
    assert_eq!(*calls.lock(), vec![(0, true), (0, false)]);
    system.shutdown().await;
}
