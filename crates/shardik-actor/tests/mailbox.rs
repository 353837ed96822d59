//! Bounded mailboxes: `try_tell` refusal, `send` back-pressure, and a stop while a sender
//! waits for room.

mod common;

use std::pin::pin;
use std::time::Duration;

use common::{worker, WorkMsg};
use futures_util::FutureExt;
use shardik_actor::{
    Actor, ActorError, ActorSystem, Context, MailboxConfig, Props, ReplyTo, TellError,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_tell_to_a_full_mailbox_returns_mailbox_full_with_the_message() {
    let system = ActorSystem::new("mb-full");
    let (w, mut probe) = worker();
    let actor = system.spawn_props(Props::from_instance(w).mailbox(MailboxConfig::bounded(2)));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await;
    assert!(actor.try_tell(WorkMsg::Item(1)).is_ok());
    assert!(actor.try_tell(WorkMsg::Item(2)).is_ok());
    match actor.try_tell(WorkMsg::Item(3)) {
        Err(TellError::MailboxFull(WorkMsg::Item(3))) => {}
        other => panic!("expected MailboxFull(Item(3)), got {other:?}"),
    }
    probe.gate.open();
    actor.send(WorkMsg::Item(4)).await.unwrap();
    actor.graceful_stop();
    actor.terminated().await;
    assert_eq!(probe.handled(), vec![0, 1, 2, 4]);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_waits_for_room_and_completes_after_the_actor_drains() {
    let system = ActorSystem::new("mb-send");
    let (w, mut probe) = worker();
    let actor = system.spawn_props(Props::from_instance(w).mailbox(MailboxConfig::bounded(2)));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await;
    actor.send(WorkMsg::Item(1)).await.unwrap();
    actor.send(WorkMsg::Item(2)).await.unwrap();

    let mut blocked = pin!(actor.send(WorkMsg::Item(3)));
    assert!(
        blocked.as_mut().now_or_never().is_none(),
        "send must wait while the mailbox is full"
    );
    probe.gate.open();
    blocked.await.unwrap();

    assert_eq!(
        actor
            .ask(|r| WorkMsg::Echo(4, r), Duration::from_secs(5))
            .await,
        Ok(4)
    );
    assert_eq!(probe.handled(), vec![0, 1, 2, 3, 4]);
    assert_eq!(
        system.dead_letters().total(),
        0,
        "back-pressure loses nothing"
    );
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_back_pressured_senders_lose_nothing_and_keep_their_order() {
    enum Msg {
        Item(usize, u32),
        Log(ReplyTo<Vec<(usize, u32)>>),
    }
    struct Sink(Vec<(usize, u32)>);
    impl Actor for Sink {
        type Msg = Msg;
        async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                Msg::Item(s, n) => self.0.push((s, n)),
                Msg::Log(r) => r.reply(std::mem::take(&mut self.0)),
            }
            Ok(())
        }
    }
    let system = ActorSystem::new("mb-many");
    let actor = system.spawn_props(
        Props::from_instance(Sink(Vec::new()))
            .mailbox(MailboxConfig::bounded(4))
            .throughput(1),
    );
    let senders: Vec<_> = (0..4)
        .map(|s| {
            let actor = actor.clone();
            tokio::spawn(async move {
                for n in 0..1_000 {
                    actor
                        .send(Msg::Item(s, n))
                        .await
                        .unwrap_or_else(|_| panic!("refused"));
                }
            })
        })
        .collect();
    for s in senders {
        s.await.unwrap();
    }
    // The mailbox is bounded and may still be full, so queue the request with back-pressure
    // too (an `ask` would be refused, and counted as a dead letter).
    let (reply, rx) = ReplyTo::channel();
    assert!(actor.send(Msg::Log(reply)).await.is_ok());
    let log = rx.await.unwrap();
    assert_eq!(log.len(), 4_000);
    for s in 0..4 {
        let seq: Vec<u32> = log
            .iter()
            .filter(|(x, _)| *x == s)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(seq, (0..1_000).collect::<Vec<_>>());
    }
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_waiting_for_room_is_released_when_the_actor_stops() {
    let system = ActorSystem::new("mb-send-stop");
    let (w, mut probe) = worker();
    let actor = system.spawn_props(Props::from_instance(w).mailbox(MailboxConfig::bounded(1)));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await;
    actor.tell(WorkMsg::Item(1));
    let mut blocked = pin!(actor.send(WorkMsg::Item(2)));
    assert!(blocked.as_mut().now_or_never().is_none());
    actor.stop();
    probe.gate.open();
    match blocked.await {
        Err(TellError::Stopped(WorkMsg::Item(2))) => {}
        other => panic!("expected Stopped(Item(2)), got {other:?}"),
    }
    assert_eq!(probe.handled(), vec![0]);
    system.shutdown().await;
}

#[tokio::test]
async fn send_to_an_unbounded_mailbox_never_waits() {
    let system = ActorSystem::new("mb-unbounded");
    let (w, probe) = worker();
    let actor = system.spawn(w);
    for n in 0..10_000 {
        let mut fut = pin!(actor.send(WorkMsg::Item(n)));
        assert!(matches!(fut.as_mut().now_or_never(), Some(Ok(()))));
    }
    actor.graceful_stop();
    actor.terminated().await;
    assert_eq!(probe.handled().len(), 10_000);
    system.shutdown().await;
}
