//! Dead letters: every message that cannot be delivered is counted by reason.

mod common;

use std::time::Duration;

use common::{worker, WorkMsg};
use shardik_actor::{
    ActorSystem, AskError, DeadLetterStats, MailboxConfig, OverflowPolicy, Props, ReplyTo,
    TellError,
};

#[tokio::test]
async fn tell_to_a_stopped_actor_counts_recipient_stopped() {
    let system = ActorSystem::new("dl-stopped");
    let (w, probe) = worker();
    let actor = system.spawn(w);
    actor.stop();
    actor.terminated().await;
    assert_eq!(system.dead_letters(), DeadLetterStats::default());
    for n in 0..3 {
        actor.tell(WorkMsg::Item(n));
    }
    assert_eq!(system.dead_letters().recipient_stopped, 3);
    // try_tell hands the message back; an ask fails and counts like a tell.
    assert!(matches!(
        actor.try_tell(WorkMsg::Item(7)),
        Err(TellError::Stopped(WorkMsg::Item(7)))
    ));
    assert_eq!(
        actor
            .ask(|r| WorkMsg::Echo(1, r), Duration::from_secs(1))
            .await,
        Err(AskError::Stopped)
    );
    assert!(matches!(
        actor.send(WorkMsg::Item(8)).await,
        Err(TellError::Stopped(WorkMsg::Item(8)))
    ));
    let dl = system.dead_letters();
    assert_eq!(dl.recipient_stopped, 4, "{dl:?}");
    assert_eq!(dl.total(), 4);
    assert!(probe.handled().is_empty());
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_drop_newest_counts_the_rejected_messages() {
    let system = ActorSystem::new("dl-newest");
    let (w, mut probe) = worker();
    let actor = system.spawn_props(Props::from_instance(w).mailbox(MailboxConfig::bounded(3)));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await; // Hold(0) has left the mailbox
    for n in 1..=10 {
        actor.tell(WorkMsg::Item(n));
    }
    assert_eq!(system.dead_letters().mailbox_full, 7);
    probe.gate.open();
    // The mailbox may still be full until the actor takes its next batch: queue the request
    // with back-pressure (an `ask` could be refused and would count as one more dead letter).
    let (reply, rx) = ReplyTo::channel();
    assert!(actor.send(WorkMsg::Echo(99, reply)).await.is_ok());
    assert_eq!(rx.await, Ok(99));
    assert_eq!(probe.handled(), vec![0, 1, 2, 3, 99]);
    assert_eq!(system.dead_letters().total(), 7);
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_drop_oldest_keeps_the_newest_and_counts_the_dropped() {
    let system = ActorSystem::new("dl-oldest");
    let (w, mut probe) = worker();
    let actor = system.spawn_props(Props::from_instance(w).mailbox(MailboxConfig::Bounded {
        capacity: 3,
        overflow: OverflowPolicy::DropOldest,
    }));
    actor.tell(WorkMsg::Hold(0));
    probe.wait_entered().await;
    for n in 1..=10 {
        // try_tell accepts: it is the oldest waiting message that goes.
        assert!(actor.try_tell(WorkMsg::Item(n)).is_ok());
    }
    assert_eq!(system.dead_letters().mailbox_full, 7);
    probe.gate.open();
    actor.graceful_stop();
    actor.terminated().await;
    assert_eq!(probe.handled(), vec![0, 8, 9, 10]);
    assert_eq!(system.dead_letters().total(), 7);
    system.shutdown().await;
}

#[tokio::test]
async fn higher_layers_can_record_dead_letters() {
    let system = ActorSystem::new("dl-other");
    system.record_dead_letter(&"shard 7", "SomeMsg", "buffer overflow");
    system.record_dead_letter(&"shard 7", "SomeMsg", "buffer overflow");
    let dl = system.dead_letters();
    assert_eq!(dl.other, 2);
    assert_eq!(dl.total(), 2);
    system.shutdown().await;
}
