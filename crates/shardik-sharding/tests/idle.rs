//! Idle passivation, on tokio's paused clock: an entity that has received nothing for the
//! idle timeout is passivated (not earlier, and at most one sweeper tick later), an entity
//! that keeps receiving is not, and the next message starts a fresh incarnation.

mod common;

use std::time::Duration;

use common::{item, snapshot, Event, Probe};
use shardik_actor::ActorSystem;
use shardik_sharding::{Region, ShardingExt};
use tokio::time::Instant;

/// The idle timeout of these tests; the sweeper then runs every `TIMEOUT / 8`.
const TIMEOUT: Duration = Duration::from_secs(40);
const TICK: Duration = Duration::from_secs(5);
/// Longer than any timer these tests wait for (the paused clock jumps ahead while waiting).
const AGES: Duration = Duration::from_secs(3600);

fn start(system: &ActorSystem, probe: &std::sync::Arc<Probe>) -> Region<common::Msg> {
    system
        .sharding()
        .start(probe.entity_type("recorder").idle_timeout(TIMEOUT))
        .unwrap()
}

/// Asserts that `at` lies within the documented window after `last_message`: at least the
/// timeout, at most the timeout plus `slack`.
fn assert_passivated_in_window(at: Instant, last_message: Instant, slack: Duration) {
    let silent = at - last_message;
    assert!(
        silent >= TIMEOUT,
        "passivated after {silent:?} of silence, before the {TIMEOUT:?} idle timeout"
    );
    assert!(
        silent <= TIMEOUT + slack,
        "passivated only after {silent:?} of silence"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_entity_is_passivated_and_a_busy_one_is_not() {
    let system = ActorSystem::new("idle");
    let probe = Probe::new();
    let region = start(&system, &probe);

    let t0 = Instant::now();
    region.tell("idle", item(0, 0));
    region.tell("busy", item(0, 0));
    // 200 s, five timeouts; "busy" hears something every sweeper tick.
    for step in 1..=40 {
        tokio::time::advance(TICK).await;
        region.tell("busy", item(0, step));
    }

    let Event::Stopped {
        id,
        incarnation,
        handled,
        at,
    } = probe.next_event().await
    else {
        panic!("expected a stop");
    };
    assert_eq!((id.as_str(), incarnation), ("idle", 1));
    assert_eq!(handled, vec![(0, 0)]);
    // Observed at most one test step after the sweep that passivated it.
    assert_passivated_in_window(at, t0, 2 * TICK);

    let busy = snapshot(&region, "busy").await;
    assert_eq!(busy.incarnation, 1, "the busy entity was never passivated");
    assert_eq!(busy.handled.len(), 41);
    assert_eq!(probe.stopped("busy"), 0);
    assert_eq!(probe.try_event(), None, "nothing else stopped");
    let stats = region.stats();
    assert_eq!(stats.passivated_idle_total, 1);
    assert_eq!(stats.active_entities, 1);
    assert_eq!(stats.stopping_entities, 0);

    // The next message starts a new incarnation, with the factory's state.
    let idle = snapshot(&region, "idle").await;
    assert_eq!(idle.incarnation, 2);
    assert_eq!(idle.handled, vec![]);
    assert_eq!(region.stats().spawned_total, 3);
    assert_eq!(probe.violations(), Vec::<String>::new());
    system.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_entity_is_passivated_within_the_window_after_its_last_message() {
    let system = ActorSystem::new("idle-window");
    let probe = Probe::new();
    let region = start(&system, &probe);

    let first = Instant::now();
    region.tell("a", item(0, 0));
    // Nothing else happens: the paused clock jumps from sweep to sweep until it stops.
    let Event::Stopped { at, .. } = probe.next_event_within(AGES).await else {
        panic!("expected a stop");
    };
    assert_passivated_in_window(at, first, TICK);

    // A second incarnation that hears again half-way through the timeout stays until a full
    // timeout after that later message.
    region.tell("a", item(0, 1));
    for _ in 0..5 {
        tokio::time::advance(TICK).await;
    }
    let last = Instant::now();
    region.tell("a", item(0, 2));
    let Event::Stopped {
        incarnation,
        handled,
        at,
        ..
    } = probe.next_event_within(AGES).await
    else {
        panic!("expected a stop");
    };
    assert_eq!(incarnation, 2);
    assert_eq!(handled, vec![(0, 1), (0, 2)]);
    assert_passivated_in_window(at, last, TICK);
    assert_eq!(region.stats().passivated_idle_total, 2);
    system.shutdown().await;
}

/// The sweeper may run late (a busy runtime); a message that arrives while it lags is stamped
/// with the clock of its last run, and must still count from when it arrived.
#[tokio::test(start_paused = true)]
async fn a_lagging_sweeper_does_not_passivate_early() {
    let system = ActorSystem::new("idle-lag");
    let probe = Probe::new();
    let region = start(&system, &probe);
    region.tell("a", item(0, 0));
    tokio::task::yield_now().await; // the sweeper's first run

    // This task is queued before the test task yields in `advance`, so it runs after the
    // clock has jumped but before the sweeper's overdue tick: its message arrives 35 s after
    // the sweeper last ran.
    let late = {
        let region = region.clone();
        tokio::spawn(async move {
            region.tell("a", item(0, 1));
            Instant::now()
        })
    };
    tokio::time::advance(7 * TICK).await;
    let last = late.await.unwrap();

    let Event::Stopped { at, handled, .. } = probe.next_event_within(AGES).await else {
        panic!("expected a stop");
    };
    assert_eq!(handled, vec![(0, 0), (0, 1)]);
    // A late sweeper may add its lag on top, but never passivates before the timeout.
    assert_passivated_in_window(at, last, 7 * TICK + TICK);
    system.shutdown().await;
}

/// Messages that arrive while an idle entity is stopping are not lost either.
#[tokio::test(start_paused = true)]
async fn messages_for_an_entity_stopping_for_idleness_reach_its_next_incarnation() {
    let system = ActorSystem::new("idle-stopping");
    let probe = Probe::new();
    probe.hold_stops(1);
    let region = start(&system, &probe);

    region.tell("a", item(0, 0));
    let stopping = probe.next_event_within(AGES).await;
    assert_eq!(
        stopping,
        Event::Stopping {
            id: "a".into(),
            incarnation: 1
        }
    );
    region.tell("a", item(0, 1));
    region.tell("a", item(0, 2));
    assert_eq!(region.stats().buffered_messages, 2);
    probe.gate(1).open();

    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, vec![(0, 1), (0, 2)]);
    assert_eq!(probe.journal_of("a", 0), vec![0, 1, 2]);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}
