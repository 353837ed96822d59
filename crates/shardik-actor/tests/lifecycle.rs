//! Lifecycle bookkeeping: `started`/`stopped` hooks run once per incarnation/actor, and an
//! actor whose termination has been observed is no longer counted as live.

mod common;

use common::{worker, WorkMsg};
use shardik_actor::{ActorSystem, Props};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_actor_is_no_longer_counted_as_live() {
    let system = ActorSystem::new("live-count");
    for round in 0..2_000 {
        let (w, _probe) = worker();
        let a = system.spawn(w);
        a.tell(WorkMsg::Item(1));
        a.stop();
        a.terminated().await;
        assert_eq!(system.live_actors(), 0, "round {round}");
    }
    system.shutdown().await;
}

/// Whenever `terminated()` is called, early or late, once it resolves the actor's leftovers
/// have been accounted for (dead letters or termination hook).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_is_observed_only_after_the_leftovers_are_accounted_for() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let system = ActorSystem::new("leftovers");
    let hooked = Arc::new(AtomicUsize::new(0));
    for round in 0..2_000u64 {
        let (w, mut probe) = worker();
        let with_hook = round % 2 == 0;
        let props = if with_hook {
            let hooked = hooked.clone();
            Props::from_instance(w).on_termination(move |t| {
                hooked.fetch_add(t.undelivered.len(), Ordering::SeqCst);
            })
        } else {
            Props::from_instance(w)
        };
        let a = system.spawn_props(props);
        a.tell(WorkMsg::Hold(0));
        probe.wait_entered().await;
        let mut replies = Vec::new();
        for n in 1..=3 {
            let (reply, rx) = shardik_actor::ReplyTo::channel();
            a.tell(WorkMsg::Echo(n, reply));
            replies.push(rx);
        }
        a.stop();
        probe.gate.open();
        // Call `terminated()` at the moment the actor is disposing of its leftovers: right
        // after the first one was dropped.
        assert!(replies.remove(0).await.is_err());
        a.terminated().await;
        let accounted =
            system.dead_letters().unhandled_at_stop + hooked.load(Ordering::SeqCst) as u64;
        assert_eq!(accounted, 3 * (round + 1), "round {round}");
    }
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_parent_counts_none_of_its_children_as_live() {
    use shardik_actor::{Actor, ActorError, Context, ReplyTo};
    use std::time::Duration;
    struct Parent;
    impl Actor for Parent {
        type Msg = ReplyTo<()>;
        async fn handle(
            &mut self,
            r: ReplyTo<()>,
            ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            for _ in 0..3 {
                let (w, _probe) = worker();
                ctx.spawn(Props::from_instance(w));
            }
            r.reply(());
            Ok(())
        }
    }
    let system = ActorSystem::new("live-count-children");
    for round in 0..500 {
        let p = system.spawn(Parent);
        p.ask(|r| r, Duration::from_secs(5)).await.unwrap();
        assert_eq!(system.live_actors(), 4);
        p.stop();
        p.terminated().await;
        assert_eq!(system.live_actors(), 0, "round {round}");
    }
    system.shutdown().await;
}

mod hooks {
    use std::time::Duration;

    use super::common::{log, Log};
    use shardik_actor::{Actor, ActorError, ActorSystem, Context, Props, ReplyTo, StopReason};

    enum Msg {
        Ready(ReplyTo<bool>),
        WhoAmI(ReplyTo<(u64, Option<String>, bool)>),
        StopSelf,
    }

    struct Hooked {
        ready: bool,
        events: Log<String>,
    }

    impl Actor for Hooked {
        type Msg = Msg;

        async fn started(&mut self, ctx: &mut Context<Self>) -> Result<(), ActorError> {
            self.events.lock().push(format!("started {:?}", ctx.name()));
            // Give the handler something to observe: `started` runs before any message.
            tokio::task::yield_now().await;
            self.ready = true;
            Ok(())
        }

        async fn handle(&mut self, msg: Msg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                Msg::Ready(r) => r.reply(self.ready),
                Msg::WhoAmI(r) => r.reply((
                    ctx.id().as_u64(),
                    ctx.name().map(str::to_string),
                    ctx.myself().id() == ctx.id(),
                )),
                Msg::StopSelf => ctx.stop(),
            }
            Ok(())
        }

        async fn stopped(&mut self, ctx: &mut Context<Self>) {
            self.events.lock().push(format!("stopped {:?}", ctx.name()));
        }
    }

    fn props(events: &Log<String>) -> Props<Hooked> {
        let events = events.clone();
        Props::new(move || Hooked {
            ready: false,
            events: events.clone(),
        })
        .name("hooked")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn started_runs_before_the_first_message_and_stopped_runs_once() {
        let system = ActorSystem::new("hooks");
        let events = log();
        let a = system.spawn_props(props(&events));
        // Told immediately after spawn, before `started` can have finished.
        assert_eq!(a.ask(Msg::Ready, Duration::from_secs(5)).await, Ok(true));
        let (id, name, same) = a.ask(Msg::WhoAmI, Duration::from_secs(5)).await.unwrap();
        assert_eq!(id, a.id().as_u64());
        assert_eq!(name.as_deref(), Some("hooked"));
        assert_eq!(a.name(), Some("hooked"));
        assert!(same);
        a.stop();
        a.stop(); // stopping twice is harmless
        let t = a.terminated().await;
        assert_eq!(t.reason, StopReason::Stopped);
        assert_eq!(t.name.as_deref(), Some("hooked"));
        system.shutdown().await;
        assert_eq!(
            *events.lock(),
            [r#"started Some("hooked")"#, r#"stopped Some("hooked")"#]
        );
    }

    #[tokio::test]
    async fn context_stop_runs_the_stopped_hook_once() {
        let system = ActorSystem::new("hooks-ctx");
        let events = log();
        let a = system.spawn_props(props(&events));
        a.tell(Msg::StopSelf);
        assert_eq!(a.terminated().await.reason, StopReason::Stopped);
        a.stop();
        system.shutdown().await;
        assert_eq!(events.lock().len(), 2, "{:?}", events.lock());
    }

    #[tokio::test]
    async fn actor_ids_are_unique() {
        let system = ActorSystem::new("ids");
        let events = log();
        let mut ids: Vec<_> = (0..100)
            .map(|_| system.spawn_props(props(&events)).id())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 100);
        system.shutdown().await;
    }
}

/// The termination hook runs before the termination is published: while it runs,
/// `is_terminated()` is still false (it used to turn true, and the actor left its system's
/// registry, before the hook ran), so whoever sees an actor terminated also sees its
/// undelivered messages handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_terminated_turns_true_only_after_the_termination_hook() {
    use parking_lot::Mutex;
    use shardik_actor::{ActorRef, Termination};
    use std::sync::Arc;

    let system = ActorSystem::new("terminated-order");
    let me: Arc<Mutex<Option<ActorRef<WorkMsg>>>> = Arc::default();
    let seen: Arc<Mutex<Option<(bool, usize)>>> = Arc::default();
    let (w, _probe) = worker();
    let props = {
        let (me, seen) = (me.clone(), seen.clone());
        Props::new(move || w.clone()).on_termination(move |t: Termination<WorkMsg>| {
            // Taken, so the hook does not keep its own actor alive.
            if let Some(me) = me.lock().take() {
                *seen.lock() = Some((me.is_terminated(), t.undelivered.len()));
            }
        })
    };
    let a = system.spawn_props(props);
    *me.lock() = Some(a.clone());
    a.stop();
    a.terminated().await;
    assert!(a.is_terminated());
    assert_eq!(
        *seen.lock(),
        Some((false, 0)),
        "is_terminated() was already true in the termination hook"
    );
    system.shutdown().await;
}
