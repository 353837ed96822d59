//! Supervision of entities. By default a failing handler restarts the entity with fresh state
//! from the factory and the following messages are handled. If the entity stops because it
//! failed for good, the messages it had accepted become dead letters, while messages that
//! arrive afterwards (or while it stops) start a new incarnation.
//!
//! The panics below are deliberate; their messages in the test output are expected.

mod common;

use std::time::Duration;

use common::{item, recorders, snapshot, Event, Msg, BLOCK};
use shardik_actor::{RestartPolicy, SupervisorStrategy};

#[tokio::test]
async fn a_failing_entity_restarts_with_fresh_state_and_keeps_handling() {
    let (system, probe, region) = recorders("restart", |e| e);

    region.tell("a", item(0, 1));
    region.tell("a", Msg::Panic);
    region.tell("a", item(0, 2));
    let after_panic = snapshot(&region, "a").await;
    assert_eq!(
        after_panic.incarnation, 2,
        "the factory made a fresh instance"
    );
    assert_eq!(after_panic.handled, vec![(0, 2)], "state was not kept");

    region.tell("a", Msg::Fail);
    region.tell("a", item(0, 3));
    let after_error = snapshot(&region, "a").await;
    assert_eq!(after_error.incarnation, 3);
    assert_eq!(after_error.handled, vec![(0, 3)]);

    assert_eq!(probe.journal_of("a", 0), vec![1, 2, 3], "nothing skipped");
    assert_eq!(probe.stopped("a"), 0, "a restart is not a stop");
    let stats = region.stats();
    assert_eq!(
        stats.spawned_total, 1,
        "restarts happen inside one entity actor"
    );
    assert_eq!(stats.active_entities, 1);
    assert_eq!(system.dead_letters().total(), 0);
    assert_eq!(probe.violations(), Vec::<String>::new());
    system.shutdown().await;
}

#[tokio::test]
async fn under_stop_the_failed_entitys_messages_are_dead_and_the_next_one_starts_anew() {
    let (system, probe, region) = recorders("stop-on-failure", |e| {
        e.supervisor(SupervisorStrategy::Stop)
    });

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    region.tell("a", Msg::Panic);
    region.tell("a", item(0, 1));
    region.tell("a", item(0, 2));
    probe.gate(1).open();

    let Event::Stopped {
        incarnation,
        handled,
        ..
    } = probe.next_event().await
    else {
        panic!("expected a stop");
    };
    assert_eq!(incarnation, 1);
    assert_eq!(handled, vec![(BLOCK, 1)]);
    // The region has handled the termination in the same turn: the two messages queued
    // behind the panic are dead letters and the entity is gone.
    assert_eq!(system.dead_letters().other, 2);
    assert_eq!(system.dead_letters().total(), 2);
    let stats = region.stats();
    assert_eq!(stats.rejected_total, 2);
    assert_eq!((stats.active_entities, stats.stopping_entities), (0, 0));

    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, vec![]);
    region.tell("a", item(0, 3));
    assert_eq!(snapshot(&region, "a").await.handled, vec![(0, 3)]);
    assert_eq!(probe.journal_of("a", 0), vec![3]);
    assert_eq!(region.stats().spawned_total, 2);
    system.shutdown().await;
}

/// Messages that arrive while a failed entity is still stopping are not its backlog: they
/// start the next incarnation. Only what the failed one had accepted is dropped.
#[tokio::test]
async fn messages_arriving_while_a_failed_entity_stops_start_the_next_incarnation() {
    let (system, probe, region) = recorders("stop-on-failure-buffer", |e| {
        e.supervisor(SupervisorStrategy::Stop)
    });
    probe.hold_stops(9);

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    region.tell("a", Msg::Panic);
    region.tell("a", item(0, 1)); // accepted by the failing incarnation
    probe.gate(1).open();
    assert_eq!(
        probe.next_event().await,
        Event::Stopping {
            id: "a".into(),
            incarnation: 1
        }
    );
    region.tell("a", item(0, 2)); // arrives while it stops
    assert_eq!(region.stats().buffered_messages, 1);
    probe.gate(9).open();

    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, vec![(0, 2)]);
    assert_eq!(probe.journal_of("a", 0), vec![2]);
    assert_eq!(system.dead_letters().other, 1);
    assert_eq!(region.stats().rejected_total, 1);
    system.shutdown().await;
}

/// Past the restart limit the entity stops for good; the next message starts a new one.
#[tokio::test]
async fn past_the_restart_limit_the_entity_stops_and_comes_back_on_the_next_message() {
    let (system, probe, region) = recorders("restart-limit", |e| {
        e.supervisor(SupervisorStrategy::Restart(RestartPolicy::new(
            1,
            Duration::from_secs(600),
        )))
    });

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    region.tell("a", Msg::Panic); // restarted: incarnation 2
    region.tell("a", Msg::Panic); // second failure within the window: stopped
    region.tell("a", item(0, 1)); // dead letter
    probe.gate(1).open();

    assert!(matches!(
        probe.next_event().await,
        Event::Stopped { incarnation: 2, .. }
    ));
    assert_eq!(system.dead_letters().other, 1);
    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 3);
    assert_eq!(next.handled, vec![]);
    assert_eq!(region.stats().spawned_total, 2);
    system.shutdown().await;
}
