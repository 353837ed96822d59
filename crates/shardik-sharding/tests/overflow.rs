//! Bounded buffering: while an entity stops, at most `buffer_limit` messages wait for it.
//! Beyond that `try_tell` hands the message back, `tell` records a dead letter and `ask`
//! fails, all counted in `RegionStats::rejected_total`; everything within the limit reaches
//! the next incarnation. A bounded entity mailbox refuses the same way.

mod common;

use common::{item, recorders, snapshot, snapshot_retry, Event, Msg, BLOCK, PATIENCE};
use shardik_actor::{AskError, MailboxConfig, TellError};

const LIMIT: u64 = 4;

/// Asserts that `result` is a `MailboxFull` refusal handing back item `seq`.
fn assert_refused(result: Result<(), TellError<Msg>>, seq: u64) {
    match result {
        Err(TellError::MailboxFull(Msg::Item { seq: back, .. })) => assert_eq!(back, seq),
        Err(TellError::MailboxFull(_)) => panic!("a different message came back"),
        Err(TellError::Stopped(_)) => panic!("refused as stopped, not as full"),
        Ok(()) => panic!("item {seq} was accepted past the limit"),
    }
}

#[tokio::test]
async fn the_buffer_of_a_passivating_entity_holds_buffer_limit_messages() {
    let (system, probe, region) = recorders("overflow", |e| e.buffer_limit(LIMIT as usize));

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    assert!(region.passivate("a"));
    for seq in 1..=LIMIT {
        assert!(region.try_tell("a", item(0, seq)).is_ok(), "item {seq}");
    }
    let stats = region.stats();
    assert_eq!(stats.stopping_entities, 1);
    assert_eq!(stats.buffered_messages, LIMIT as usize);
    assert_eq!(stats.rejected_total, 0);

    // One past the limit, by every way of sending.
    assert_refused(region.try_tell("a", item(0, 100)), 100);
    assert_refused(region.entity_ref("a").try_tell(item(0, 101)), 101);
    assert_eq!(
        system.dead_letters().total(),
        0,
        "try_tell hands back, records nothing"
    );
    region.tell("a", item(0, 102));
    region.entity_ref("a").tell(item(0, 103));
    assert_eq!(system.dead_letters().other, 2);
    assert_eq!(system.dead_letters().total(), 2);
    assert_eq!(
        region
            .ask("a", Msg::Get, PATIENCE)
            .await
            .map(|s| s.incarnation),
        Err(AskError::MailboxFull)
    );
    let stats = region.stats();
    assert_eq!(stats.rejected_total, 5);
    assert_eq!(
        stats.buffered_messages, LIMIT as usize,
        "refusals change nothing"
    );

    // Everything within the limit reaches the next incarnation, in order.
    probe.gate(1).open();
    assert!(matches!(
        probe.next_event().await,
        Event::Stopped { incarnation: 1, .. }
    ));
    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(
        next.handled,
        (1..=LIMIT).map(|s| (0, s)).collect::<Vec<_>>()
    );
    // And the buffer is free again.
    assert!(region.try_tell("a", item(0, 5)).is_ok());
    assert_eq!(
        snapshot(&region, "a").await.handled.len(),
        LIMIT as usize + 1
    );
    assert_eq!(probe.journal("a")[0], (BLOCK, 1));
    assert_eq!(
        probe.journal_of("a", 0),
        vec![1, 2, 3, 4, 5],
        "no refused item was handled"
    );
    assert_eq!(system.dead_letters().total(), 2);
    system.shutdown().await;
}

/// The same limit applies when the entity stopped itself (its mailbox closed first) and per
/// entity: a full buffer of one entity does not refuse messages for another.
#[tokio::test]
async fn the_limit_holds_for_self_stops_and_per_entity() {
    let (system, probe, region) =
        recorders("overflow-self-stop", |e| e.buffer_limit(LIMIT as usize));
    probe.hold_stops(1);

    for id in ["a", "b"] {
        region.tell(id, Msg::StopSelf);
        assert_eq!(
            probe.next_event().await,
            Event::Stopping {
                id: id.into(),
                incarnation: 1
            }
        );
    }
    for seq in 1..=LIMIT {
        assert!(region.try_tell("a", item(0, seq)).is_ok());
    }
    assert_refused(region.try_tell("a", item(0, 99)), 99);
    for seq in 1..=LIMIT {
        assert!(region.try_tell("b", item(0, seq)).is_ok(), "b is not full");
    }
    assert_refused(region.try_tell("b", item(0, 99)), 99);
    let stats = region.stats();
    assert_eq!(stats.stopping_entities, 2);
    assert_eq!(stats.buffered_messages, 2 * LIMIT as usize);
    assert_eq!(stats.rejected_total, 2);

    probe.gate(1).open();
    for _ in ["a", "b"] {
        // Both buffers are handed over once their old incarnations have stopped.
        assert!(matches!(
            probe.next_event().await,
            Event::Stopped { incarnation: 1, .. }
        ));
    }
    for id in ["a", "b"] {
        let next = snapshot(&region, id).await;
        assert_eq!(next.incarnation, 2);
        assert_eq!(
            next.handled,
            (1..=LIMIT).map(|s| (0, s)).collect::<Vec<_>>()
        );
    }
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// A bounded entity mailbox refuses like a full buffer.
#[tokio::test]
async fn a_full_bounded_mailbox_refuses() {
    let (system, probe, region) =
        recorders("overflow-mailbox", |e| e.mailbox(MailboxConfig::bounded(2)));

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered: its mailbox is empty again
    assert!(region.try_tell("a", item(0, 1)).is_ok());
    assert!(region.try_tell("a", item(0, 2)).is_ok());
    assert_refused(region.try_tell("a", item(0, 3)), 3);
    region.tell("a", item(0, 4));
    assert_eq!(system.dead_letters().other, 1);
    assert_eq!(region.stats().rejected_total, 2);
    assert_eq!(region.stats().active_entities, 1, "still active, just full");

    probe.gate(1).open();
    let snap = snapshot_retry(&region, "a").await;
    assert_eq!(snap.handled, vec![(BLOCK, 1), (0, 1), (0, 2)]);
    system.shutdown().await;
}

/// A backlog larger than a bounded mailbox, accepted into the buffer while the entity
/// stopped, is handed to the next incarnation whole: the mailbox bound limits what senders
/// may add, not what the region already accepted.
#[tokio::test]
async fn a_buffered_backlog_larger_than_a_bounded_mailbox_is_not_dropped() {
    let (system, probe, region) = recorders("overflow-handover", |e| {
        e.mailbox(MailboxConfig::bounded(2)).buffer_limit(5)
    });

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    assert!(region.passivate("a"));
    for seq in 1..=5 {
        assert!(region.try_tell("a", item(0, seq)).is_ok(), "item {seq}");
    }
    probe.gate(1).open();
    assert!(matches!(
        probe.next_event().await,
        Event::Stopped { incarnation: 1, .. }
    ));

    let next = snapshot_retry(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, (1..=5).map(|s| (0, s)).collect::<Vec<_>>());
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}
