//! Children spawned with `Context::spawn` stop with, and before, their parent.

mod common;

use std::time::Duration;

use common::{log, Log};
use shardik_actor::{
    Actor, ActorError, ActorRef, ActorSystem, Context, Props, ReplyTo, StopReason,
    SupervisorStrategy,
};

enum Msg {
    /// Spawn a child with this label (and `grandchildren` children of its own).
    Spawn(String, usize, ReplyTo<ActorRef<Msg>>),
    Fail,
}

/// Records "started X" / "stopped X" into a shared log, where X is its label.
struct Node {
    label: String,
    grandchildren: usize,
    events: Log<String>,
    /// Spawn a child from inside `stopped` (it must be stopped at once); its ref goes here.
    spawn_in_stopped: Option<tokio::sync::oneshot::Sender<ActorRef<Msg>>>,
}

impl Node {
    fn props(label: &str, grandchildren: usize, events: &Log<String>) -> Props<Node> {
        let label = label.to_string();
        let events = events.clone();
        Props::new(move || Node {
            label: label.clone(),
            grandchildren,
            events: events.clone(),
            spawn_in_stopped: None,
        })
    }
}

impl Actor for Node {
    type Msg = Msg;

    async fn started(&mut self, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.events.lock().push(format!("started {}", self.label));
        for i in 0..self.grandchildren {
            ctx.spawn(Node::props(&format!("{}.{i}", self.label), 0, &self.events));
        }
        Ok(())
    }

    async fn handle(&mut self, msg: Msg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Spawn(label, grandchildren, reply) => {
                reply.reply(ctx.spawn(Node::props(&label, grandchildren, &self.events)));
            }
            Msg::Fail => return Err("parent failed".into()),
        }
        Ok(())
    }

    async fn stopped(&mut self, ctx: &mut Context<Self>) {
        self.events.lock().push(format!("stopped {}", self.label));
        if let Some(tx) = self.spawn_in_stopped.take() {
            let events = self.events.clone();
            let late = ctx.spawn(Props::new(move || SlowStarter {
                events: events.clone(),
            }));
            let _ = tx.send(late);
        }
    }
}

/// A child whose `started` hook takes a second.
struct SlowStarter {
    events: Log<String>,
}

impl Actor for SlowStarter {
    type Msg = Msg;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.events.lock().push("started late".into());
        Ok(())
    }

    async fn handle(&mut self, _msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        Ok(())
    }

    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.events.lock().push("stopped late".into());
    }
}

async fn spawn_child(parent: &ActorRef<Msg>, label: &str, grandchildren: usize) -> ActorRef<Msg> {
    parent
        .ask(
            |r| Msg::Spawn(label.to_string(), grandchildren, r),
            Duration::from_secs(5),
        )
        .await
        .unwrap()
}

fn position(events: &[String], e: &str) -> usize {
    events
        .iter()
        .position(|x| x == e)
        .unwrap_or_else(|| panic!("{e:?} missing from {events:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_stop_before_the_parents_stopped_hook() {
    let system = ActorSystem::new("children");
    let events = log();
    let parent = system.spawn_props(Node::props("p", 0, &events));
    let a = spawn_child(&parent, "a", 2).await;
    let b = spawn_child(&parent, "b", 0).await;
    // a's children are spawned by its `started` hook, which may not have run yet; it will
    // have run (and they will be stopped first) by the time a terminates.

    parent.stop();
    assert_eq!(parent.terminated().await.reason, StopReason::Stopped);
    assert!(a.is_terminated() && b.is_terminated());
    assert_eq!(a.terminated().await.reason, StopReason::Stopped);
    assert_eq!(system.live_actors(), 0);

    let events = events.lock().clone();
    let p = position(&events, "stopped p");
    let sa = position(&events, "stopped a");
    assert!(
        position(&events, "stopped a.0") < sa,
        "grandchildren stop before their parent: {events:?}"
    );
    assert!(position(&events, "stopped a.1") < sa, "{events:?}");
    assert!(sa < p, "{events:?}");
    assert!(position(&events, "stopped b") < p, "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("stopped p"));
    system.shutdown().await;
}

#[tokio::test]
async fn a_parent_stopped_by_failure_stops_its_children() {
    let system = ActorSystem::new("children-fail");
    let events = log();
    let parent =
        system.spawn_props(Node::props("p", 0, &events).supervisor(SupervisorStrategy::Stop));
    let a = spawn_child(&parent, "a", 1).await;
    parent.tell(Msg::Fail);
    assert!(matches!(
        parent.terminated().await.reason,
        StopReason::Failed(_)
    ));
    // The children were asked to stop: they stopped normally, not failed.
    assert_eq!(a.terminated().await.reason, StopReason::Stopped);
    assert_eq!(system.live_actors(), 0);
    let events = events.lock().clone();
    assert!(position(&events, "stopped a") < position(&events, "stopped p"));
    system.shutdown().await;
}

#[tokio::test]
async fn a_child_that_stops_on_its_own_leaves_the_parent_running() {
    let system = ActorSystem::new("children-own");
    let events = log();
    let parent = system.spawn_props(Node::props("p", 0, &events));
    let a = spawn_child(&parent, "a", 0).await;
    a.stop();
    a.terminated().await;
    assert!(!parent.is_terminated());
    let b = spawn_child(&parent, "b", 0).await;
    assert!(!b.is_terminated());
    parent.stop();
    parent.terminated().await;
    assert!(b.is_terminated());
    assert_eq!(system.live_actors(), 0);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_child_spawned_while_the_parent_stops_is_stopped_at_once() {
    let system = ActorSystem::new("children-late");
    let events = log();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let parent = system.spawn(Node {
        label: "p".into(),
        grandchildren: 0,
        events: events.clone(),
        spawn_in_stopped: Some(tx),
    });
    parent.stop();
    parent.terminated().await;
    let late = rx.await.unwrap();
    assert!(
        late.is_terminated(),
        "a child spawned by the stopped hook terminates before its parent does"
    );
    let events = events.lock().clone();
    assert!(
        position(&events, "started late") < position(&events, "stopped late"),
        "{events:?}"
    );
    assert_eq!(late.terminated().await.reason, StopReason::Stopped);
    assert_eq!(system.live_actors(), 0);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_children_before_parents() {
    let system = ActorSystem::new("children-shutdown");
    let events = log();
    let parent = system.spawn_props(Node::props("p", 3, &events));
    let a = spawn_child(&parent, "a", 2).await;
    drop(a);
    system.shutdown().await;
    assert_eq!(system.live_actors(), 0);
    let events = events.lock().clone();
    let p = position(&events, "stopped p");
    for c in ["p.0", "p.1", "p.2", "a"] {
        assert!(position(&events, &format!("stopped {c}")) < p, "{events:?}");
    }
    for c in ["a.0", "a.1"] {
        assert!(
            position(&events, &format!("stopped {c}")) < position(&events, "stopped a"),
            "{events:?}"
        );
    }
}

/// A child waiting on a request that sits in its stopping parent's mailbox learns at once
/// that no answer will come (the parent has no termination hook: the request is a dead letter
/// and its `ReplyTo` is dropped), so the parent's stop, which waits for its children, is not
/// held up by it.
#[tokio::test(start_paused = true)]
async fn a_child_asking_its_stopping_parent_does_not_hold_the_stop_up() {
    enum P {
        SpawnAsker(ReplyTo<ActorRef<()>>),
        Block(tokio::sync::oneshot::Receiver<()>),
        Req(ReplyTo<u32>),
    }
    struct Parent {
        events: tokio::sync::mpsc::UnboundedSender<&'static str>,
    }
    struct Asker {
        parent: ActorRef<P>,
        events: tokio::sync::mpsc::UnboundedSender<&'static str>,
    }
    impl Actor for Asker {
        type Msg = ();
        async fn handle(&mut self, _m: (), _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            let (reply, answer) = ReplyTo::channel();
            self.parent.tell(P::Req(reply));
            let _ = self.events.send("asked");
            let got = answer.await;
            let _ = self
                .events
                .send(if got.is_ok() { "answered" } else { "no reply" });
            Ok(())
        }
    }
    impl Actor for Parent {
        type Msg = P;
        async fn handle(&mut self, msg: P, ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                P::SpawnAsker(r) => {
                    let asker = ctx.spawn(Props::from_instance(Asker {
                        parent: ctx.myself(),
                        events: self.events.clone(),
                    }));
                    r.reply(asker);
                }
                P::Block(gate) => {
                    let _ = gate.await;
                }
                P::Req(r) => r.reply(1),
            }
            Ok(())
        }
    }
    let system = ActorSystem::new("child-asks-parent");
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let parent = system.spawn(Parent { events: events_tx });
    let child = parent
        .ask(P::SpawnAsker, Duration::from_secs(5))
        .await
        .unwrap();
    let (open, gate) = tokio::sync::oneshot::channel();
    parent.tell(P::Block(gate));
    child.tell(());
    // The request waits in the blocked parent's mailbox; the parent is told to stop.
    assert_eq!(events.recv().await, Some("asked"));
    parent.stop();
    open.send(()).unwrap();
    let start = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(60), parent.terminated())
        .await
        .expect("the parent's stop is held up by its child waiting on the parent");
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(events.recv().await, Some("no reply"));
    system.shutdown().await;
}
