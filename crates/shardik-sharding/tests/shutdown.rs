//! System shutdown with entities in the middle of a message: the shutdown waits for the
//! handlers, every entity's `stopped` hook runs, queued messages become dead letters, and no
//! entity is started once the shutdown has begun.

mod common;

use std::future::Future;
use std::pin::{pin, Pin};

use common::{item, recorders, snapshot, Event, Msg, BLOCK};
use shardik_actor::{AskError, TellError};

/// Polls the shutdown once: that first poll tells every actor to stop (synchronously, on this
/// task), and the shutdown must then still wait for the parked handlers.
async fn poll_once(shutdown: Pin<&mut impl Future<Output = ()>>) {
    tokio::select! {
        biased;
        () = shutdown => panic!("the shutdown finished while handlers were parked"),
        () = std::future::ready(()) => {}
    }
}

const BUSY: usize = 6;
const IDLE: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_busy_entities_and_refuses_new_ones() {
    let (system, probe, region) = recorders("shutdown", |e| e);

    let busy: Vec<String> = (0..BUSY).map(|i| format!("busy-{i}")).collect();
    let idle: Vec<String> = (0..IDLE).map(|i| format!("idle-{i}")).collect();
    for id in &idle {
        region.tell(id, item(0, 0));
    }
    // The idle entities have handled their message (the ask queues behind it), so shutdown
    // finds them with empty mailboxes.
    for id in &idle {
        assert_eq!(snapshot(&region, id).await.handled, vec![(0, 0)]);
    }
    for id in &busy {
        region.tell(id, Msg::Block { gate: 1 });
        region.tell(id, item(0, 1)); // queued behind the parked handler
    }
    for _ in 0..BUSY {
        assert!(matches!(probe.next_event().await, Event::Entered { .. }));
    }

    let mut shutdown = pin!(system.shutdown());
    poll_once(shutdown.as_mut()).await;
    assert!(system.is_shutting_down());

    // Handlers are parked, so no busy entity can have stopped.
    for id in &busy {
        assert_eq!(probe.stopped(id), 0);
    }
    // No new entity starts during the shutdown: refused at once, and never created.
    let before = system.dead_letters().other;
    assert!(matches!(
        region.try_tell("late", item(0, 2)),
        Err(TellError::Stopped(_))
    ));
    region.tell("late", item(0, 3));
    assert_eq!(system.dead_letters().other, before + 1);
    assert_eq!(probe.created("late"), 0);

    probe.gate(1).open();
    shutdown.await;

    assert_eq!(system.live_actors(), 0);
    for id in busy.iter().chain(&idle) {
        assert_eq!(probe.stopped(id), 1, "{id}: stopped hook");
    }
    for id in &busy {
        assert_eq!(
            probe.journal(id),
            vec![(BLOCK, 1)],
            "{id}: the message in hand finished, the queued one did not run"
        );
    }
    // The queued item of every busy entity, plus the one late tell.
    let dead = system.dead_letters();
    assert_eq!(dead.other, BUSY as u64 + 1);
    assert_eq!(dead.total(), BUSY as u64 + 1);
    let stats = region.stats();
    assert_eq!(stats.active_entities + stats.stopping_entities, 0);
    assert_eq!(stats.spawned_total, (BUSY + IDLE) as u64);
    assert_eq!(probe.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn tells_after_shutdown_are_dead_letters_and_start_nothing() {
    let (system, probe, region) = recorders("after-shutdown", |e| e);
    region.tell("a", item(0, 0));
    system.shutdown().await;
    assert_eq!(probe.stopped("a"), 1);
    let spawned = region.stats().spawned_total;

    for id in ["a", "b"] {
        let before = system.dead_letters();
        region.tell(id, item(0, 1));
        let after = system.dead_letters();
        assert_eq!(after.other, before.other + 1, "{id}");
        assert_eq!(after.total(), before.total() + 1, "{id}");
        assert!(matches!(
            region.try_tell(id, item(0, 2)),
            Err(TellError::Stopped(_))
        ));
        assert!(matches!(
            region.entity_ref(id).try_tell(item(0, 3)),
            Err(TellError::Stopped(_))
        ));
        assert_eq!(
            region
                .ask(id, Msg::Get, common::PATIENCE)
                .await
                .map(|s| s.incarnation),
            Err(AskError::Stopped)
        );
    }
    assert_eq!(region.stats().spawned_total, spawned);
    assert_eq!(probe.created("a"), 1);
    assert_eq!(probe.created("b"), 0);
    assert_eq!(system.live_actors(), 0);
}

/// Messages buffered for an entity that is stopping when the shutdown begins are dead
/// letters too; no new incarnation is started for them.
#[tokio::test]
async fn messages_buffered_at_shutdown_become_dead_letters() {
    let (system, probe, region) = recorders("buffered-at-shutdown", |e| e);
    probe.hold_stops(1);

    region.tell("a", Msg::StopSelf);
    assert!(matches!(probe.next_event().await, Event::Stopping { .. }));
    region.tell("a", item(0, 1));
    region.tell("a", item(0, 2));
    assert_eq!(region.stats().buffered_messages, 2);

    let mut shutdown = pin!(system.shutdown());
    poll_once(shutdown.as_mut()).await;
    probe.gate(1).open();
    shutdown.await;

    assert_eq!(
        probe.created("a"),
        1,
        "no incarnation starts during shutdown"
    );
    assert_eq!(system.dead_letters().other, 2);
    assert_eq!(region.stats().rejected_total, 2);
    assert_eq!(region.stats().buffered_messages, 0);
    assert_eq!(system.live_actors(), 0);
}
