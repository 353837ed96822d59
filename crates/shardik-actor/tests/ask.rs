//! `ActorRef::ask`: replies, timeouts, stopped recipients and unanswered requests.

mod common;

use std::pin::pin;
use std::time::Duration;

use common::{worker, WorkMsg};
use futures_util::FutureExt;
use shardik_actor::{
    Actor, ActorError, ActorSystem, AskError, Context, MailboxConfig, Props, ReplyTo,
};
use tokio::time::Instant;

enum Msg {
    Double(u64, ReplyTo<u64>),
    /// Keeps the reply handle without answering.
    Hoard(ReplyTo<u64>),
    /// Drops the reply handle without answering.
    Ignore(ReplyTo<u64>),
    /// Answers every hoarded handle; replies with how many of their askers had gone.
    Flush(ReplyTo<usize>),
    /// Answers after asking another actor from inside the handler.
    Relay(shardik_actor::ActorRef<Msg>, u64, ReplyTo<u64>),
}

#[derive(Default)]
struct Server {
    hoard: Vec<ReplyTo<u64>>,
}

impl Actor for Server {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Double(n, r) => r.reply(n * 2),
            Msg::Hoard(r) => self.hoard.push(r),
            Msg::Ignore(r) => drop(r),
            Msg::Flush(r) => {
                let closed = self.hoard.iter().filter(|h| h.is_closed()).count();
                for h in self.hoard.drain(..) {
                    h.reply(0);
                }
                r.reply(closed);
            }
            Msg::Relay(other, n, r) => {
                let v = other
                    .ask(|r2| Msg::Double(n, r2), Duration::from_secs(5))
                    .await?;
                r.reply(v + 1);
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn ask_returns_the_reply() {
    let system = ActorSystem::new("ask");
    let server = system.spawn(Server::default());
    for n in 0..10 {
        assert_eq!(
            server
                .ask(|r| Msg::Double(n, r), Duration::from_secs(5))
                .await,
            Ok(n * 2)
        );
    }
    // An actor may ask another actor from inside its handler.
    let other = system.spawn(Server::default());
    let relayed = server
        .ask(|r| Msg::Relay(other.clone(), 20, r), Duration::from_secs(5))
        .await;
    assert_eq!(relayed, Ok(41));
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn ask_without_reply_times_out_after_the_timeout() {
    let system = ActorSystem::new("ask-timeout");
    let server = system.spawn(Server::default());
    let start = Instant::now();
    let res = server.ask(Msg::Hoard, Duration::from_secs(5)).await;
    assert_eq!(res, Err(AskError::Timeout(Duration::from_secs(5))));
    assert!(start.elapsed() >= Duration::from_secs(5));
    assert!(start.elapsed() < Duration::from_secs(6));
    // The actor is still fine.
    assert_eq!(
        server
            .ask(|r| Msg::Double(4, r), Duration::from_secs(5))
            .await,
        Ok(8)
    );
    system.shutdown().await;
}

/// `Duration::MAX` as a timeout ("wait as long as it takes") waits for a late answer; it
/// used to panic once the answer took longer than the lazy timeout's grace period (the
/// deadline overflowed the clock).
#[tokio::test(start_paused = true)]
async fn an_ask_with_the_longest_timeout_waits_for_a_late_answer() {
    let system = ActorSystem::new("ask-forever");
    let server = system.spawn(Server::default());
    let (answer, flushed) = tokio::join!(server.ask(Msg::Hoard, Duration::MAX), async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        server.ask(Msg::Flush, Duration::from_secs(5)).await
    });
    assert_eq!(flushed, Ok(0), "the asker still waited");
    assert_eq!(answer, Ok(0));
    system.shutdown().await;
}

#[tokio::test]
async fn ask_to_a_stopped_actor_fails_with_stopped() {
    let system = ActorSystem::new("ask-stopped");
    let server = system.spawn(Server::default());
    server.stop();
    server.terminated().await;
    let res = server
        .ask(|r| Msg::Double(1, r), Duration::from_secs(5))
        .await;
    assert_eq!(res, Err(AskError::Stopped));
    assert_eq!(system.dead_letters().recipient_stopped, 1);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_reply_handle_fails_the_ask_at_once() {
    let system = ActorSystem::new("ask-noreply");
    let server = system.spawn(Server::default());
    let start = Instant::now();
    let res = server.ask(Msg::Ignore, Duration::from_secs(3600)).await;
    assert_eq!(res, Err(AskError::NoReply));
    // Paused time only moves when everything is idle waiting on a timer: no virtual time
    // passing means the ask did not wait for its timeout.
    assert_eq!(start.elapsed(), Duration::ZERO);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_handler_fails_the_ask_with_no_reply() {
    struct Failer;
    impl Actor for Failer {
        type Msg = ReplyTo<u64>;
        async fn handle(
            &mut self,
            _r: ReplyTo<u64>,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            Err("refusing".into())
        }
    }
    let system = ActorSystem::new("ask-fail");
    let failer = system.spawn_props(Props::new(|| Failer));
    let start = Instant::now();
    assert_eq!(
        failer.ask(|r| r, Duration::from_secs(3600)).await,
        Err(AskError::NoReply)
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_queued_behind_a_stop_fails_with_no_reply() {
    let system = ActorSystem::new("ask-queued");
    let (w, mut probe) = worker();
    let actor = system.spawn(w);
    actor.tell(WorkMsg::Hold(0));
    assert_eq!(probe.wait_entered().await, 0);

    // Queue the request: the first poll of `ask` puts it into the mailbox.
    let mut ask = pin!(actor.ask(|r| WorkMsg::Echo(1, r), Duration::from_secs(3600)));
    assert!(ask.as_mut().now_or_never().is_none());

    actor.stop();
    probe.gate.open();
    assert_eq!(ask.await, Err(AskError::NoReply));
    actor.terminated().await;
    assert_eq!(probe.handled(), vec![0]);
    assert_eq!(system.dead_letters().unhandled_at_stop, 1);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_to_a_full_bounded_mailbox_fails_with_mailbox_full() {
    let system = ActorSystem::new("ask-full");
    let (w, mut probe) = worker();
    let actor =
        system.spawn_props(Props::new(move || w.clone()).mailbox(MailboxConfig::bounded(2)));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await;
    actor.tell(WorkMsg::Item(1));
    actor.tell(WorkMsg::Item(2));
    let res = actor
        .ask(|r| WorkMsg::Echo(9, r), Duration::from_secs(5))
        .await;
    assert_eq!(res, Err(AskError::MailboxFull));
    probe.gate.open();
    // `send` waits for room, so once it returns the ask fits (at most one message waits).
    actor.send(WorkMsg::Item(3)).await.unwrap();
    assert_eq!(
        actor
            .ask(|r| WorkMsg::Echo(4, r), Duration::from_secs(5))
            .await,
        Ok(4)
    );
    assert_eq!(probe.handled(), vec![0, 1, 2, 3, 4]);
    assert_eq!(system.dead_letters().mailbox_full, 1);
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_late_reply_after_a_timeout_is_harmless() {
    let system = ActorSystem::new("ask-late");
    let server = system.spawn(Server::default());
    assert!(matches!(
        server.ask(Msg::Hoard, Duration::from_millis(10)).await,
        Err(AskError::Timeout(_))
    ));
    // The actor sees that the asker has gone, and replying anyway does nothing bad.
    assert_eq!(server.ask(Msg::Flush, Duration::from_secs(5)).await, Ok(1));
    assert_eq!(
        server
            .ask(|r| Msg::Double(5, r), Duration::from_secs(5))
            .await,
        Ok(10)
    );
    system.shutdown().await;
}
