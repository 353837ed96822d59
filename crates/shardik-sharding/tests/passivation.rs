//! Passivation loses nothing: messages that arrive while an entity stops (on request, or
//! because it called `ctx.stop()`) wait and reach the next incarnation, in order, exactly once,
//! however often the entity is cycled while senders keep sending.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{item, recorders, snapshot, snapshot_retry, tell_retry, Event, Msg, Probe, BLOCK};
use shardik_actor::{ActorSystem, MailboxConfig};
use shardik_sharding::ShardingExt;

const SENDERS: u32 = 4;
const CYCLES: usize = 200;

/// `SENDERS` tasks tell numbered items to four entities for as long as a passivator cycles
/// them `CYCLES` times, alternating `Region::passivate` and a self-stop (`Msg::StopSelf`).
/// Every cycle ends exactly one incarnation: the ask that closes it is answered by the next.
async fn cycle_under_load(name: &str, mailbox: Option<usize>) {
    let system = ActorSystem::new(name);
    let probe = Probe::new();
    let mut entity = probe.entity_type("recorder");
    if let Some(capacity) = mailbox {
        entity = entity.mailbox(MailboxConfig::bounded(capacity));
    }
    let region = system.sharding().start(entity).unwrap();
    let ids: Vec<String> = (0..4).map(|i| format!("entity-{i}")).collect();
    for id in &ids {
        assert_eq!(snapshot(&region, id).await.incarnation, 1);
    }

    let done = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let (region, ids, done) = (region.clone(), ids.clone(), done.clone());
        senders.push(tokio::spawn(async move {
            let mut sent: HashMap<String, Vec<u64>> = HashMap::new();
            let mut seq = 0u64;
            while !done.load(Ordering::Relaxed) || seq < 500 {
                // A different, irregular entity order per sender.
                let id = &ids[((seq * 7 + seq / 3 + u64::from(sender)) % 4) as usize];
                tell_retry(&region, id, item(sender, seq)).await;
                sent.entry(id.clone()).or_default().push(seq);
                seq += 1;
                if seq.is_multiple_of(16) {
                    tokio::task::yield_now().await;
                }
            }
            sent
        }));
    }

    let mut incarnation: HashMap<&str, u32> = ids.iter().map(|id| (id.as_str(), 1)).collect();
    for cycle in 0..CYCLES {
        let id = ids[cycle % ids.len()].as_str();
        if cycle % 2 == 0 {
            // The previous cycle's ask was answered by a live incarnation: it is active.
            assert!(region.passivate(id), "cycle {cycle}: {id} was not active");
        } else {
            tell_retry(&region, id, Msg::StopSelf).await;
        }
        let snap = snapshot_retry(&region, id).await;
        let expected = incarnation[id] + 1;
        assert_eq!(snap.incarnation, expected, "cycle {cycle}: {id}");
        incarnation.insert(id, expected);
    }
    done.store(true, Ordering::Relaxed);

    let mut sent: HashMap<String, HashMap<u32, Vec<u64>>> = HashMap::new();
    for (sender, task) in senders.into_iter().enumerate() {
        for (id, seqs) in task.await.unwrap() {
            sent.entry(id).or_default().insert(sender as u32, seqs);
        }
    }
    let mut total = 0;
    for id in &ids {
        // Queued behind everything the senders sent, so it is answered after all of it.
        snapshot_retry(&region, id).await;
        for sender in 0..SENDERS {
            let expected = sent[id].get(&sender).cloned().unwrap_or_default();
            total += expected.len();
            assert_eq!(
                probe.journal_of(id, sender),
                expected,
                "{id}: items of sender {sender} lost, duplicated or reordered"
            );
        }
    }
    assert!(total >= SENDERS as usize * 500);
    assert_eq!(probe.created_total(), ids.len() as u32 + CYCLES as u32);
    assert_eq!(probe.stopped_total(), CYCLES as u32);
    assert_eq!(probe.violations(), Vec::<String>::new());
    assert_eq!(system.dead_letters().total(), 0);
    let stats = region.stats();
    assert_eq!(stats.spawned_total, ids.len() as u64 + CYCLES as u64);
    assert_eq!(stats.active_entities, ids.len());
    assert_eq!(stats.stopping_entities, 0);
    assert_eq!(stats.buffered_messages, 0);
    if mailbox.is_none() {
        assert_eq!(stats.rejected_total, 0);
    }
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_passivation_under_concurrent_senders_loses_nothing() {
    cycle_under_load("passivation-cycles", None).await;
}

/// The same with a small bounded entity mailbox: senders retry refused messages, and the
/// backlog handed to each new incarnation (far more than its mailbox holds) is not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_passivation_with_a_bounded_mailbox_loses_nothing() {
    cycle_under_load("passivation-cycles-bounded", Some(8)).await;
}

/// Messages queued in the mailbox behind the message on which the entity calls `ctx.stop()`
/// are not handled by that incarnation; they go to the next one, in order.
#[tokio::test]
async fn messages_queued_behind_a_self_stop_reach_the_next_incarnation() {
    let (system, probe, region) = recorders("self-stop", |e| e);

    region.tell("a", item(0, 0));
    region.tell("a", Msg::Block { gate: 1 });
    assert_eq!(
        probe.next_event().await,
        Event::Entered {
            id: "a".into(),
            gate: 1
        }
    );
    // All of these wait in the mailbox while the handler is parked.
    region.tell("a", Msg::StopSelf);
    for seq in 1..=5 {
        region.tell("a", item(0, seq));
    }
    probe.gate(1).open();

    let Event::Stopped {
        incarnation,
        handled,
        ..
    } = probe.next_event().await
    else {
        panic!("expected the first incarnation to stop");
    };
    assert_eq!(incarnation, 1);
    assert_eq!(handled, vec![(0, 0), (BLOCK, 1)]);
    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, (1..=5).map(|s| (0, s)).collect::<Vec<_>>());
    assert_eq!(probe.journal_of("a", 0), (0..=5).collect::<Vec<_>>());
    assert_eq!(system.dead_letters().total(), 0);
    assert_eq!(region.stats().spawned_total, 2);
    system.shutdown().await;
}

/// While an incarnation is inside its `stopped` hook its mailbox is closed: new messages
/// wait in the shard's buffer, no second incarnation starts, and once the first has
/// terminated the next one gets its unhandled mailbox first, then the buffer.
#[tokio::test]
async fn messages_sent_while_an_entity_stops_wait_for_the_next_incarnation() {
    let (system, probe, region) = recorders("stopping-buffer", |e| e);
    probe.hold_stops(9);

    region.tell("a", item(0, 0));
    region.tell("a", Msg::StopSelf);
    assert_eq!(
        probe.next_event().await,
        Event::Stopping {
            id: "a".into(),
            incarnation: 1
        }
    );
    for seq in 1..=3 {
        region.tell("a", item(0, seq));
    }
    let stats = region.stats();
    assert_eq!(stats.active_entities, 0);
    assert_eq!(stats.stopping_entities, 1);
    assert_eq!(stats.buffered_messages, 3);
    assert!(!region.passivate("a"), "a stopping entity is not active");
    assert_eq!(
        probe.created("a"),
        1,
        "no second incarnation while one stops"
    );

    probe.gate(9).open();
    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, vec![(0, 1), (0, 2), (0, 3)]);
    assert_eq!(probe.journal_of("a", 0), vec![0, 1, 2, 3]);
    assert_eq!(probe.violations(), Vec::<String>::new());
    let stats = region.stats();
    assert_eq!((stats.active_entities, stats.stopping_entities), (1, 0));
    assert_eq!(stats.buffered_messages, 0);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// `Region::passivate` is graceful: the entity first handles what is already in its mailbox;
/// what arrives afterwards goes to the next incarnation.
#[tokio::test]
async fn passivate_finishes_the_mailbox_then_buffers_for_the_next_incarnation() {
    let (system, probe, region) = recorders("passivate", |e| e);

    assert!(!region.passivate("a"), "unknown entity");
    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    for seq in 1..=3 {
        region.tell("a", item(0, seq));
    }
    assert!(region.passivate("a"));
    assert!(!region.passivate("a"), "already stopping");
    for seq in 4..=6 {
        region.tell("a", item(0, seq));
    }
    assert_eq!(region.stats().buffered_messages, 3);
    probe.gate(1).open();

    let Event::Stopped {
        incarnation,
        handled,
        ..
    } = probe.next_event().await
    else {
        panic!("expected the first incarnation to stop");
    };
    assert_eq!(incarnation, 1);
    assert_eq!(handled, vec![(BLOCK, 1), (0, 1), (0, 2), (0, 3)]);
    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, vec![(0, 4), (0, 5), (0, 6)]);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
}

/// Passivating an entity that has nothing waiting removes it; the next message starts a
/// fresh incarnation from the factory.
#[tokio::test]
async fn a_passivated_entity_restarts_from_the_factory_on_its_next_message() {
    let (system, probe, region) = recorders("passivate-idle", |e| e);

    region.tell("a", item(0, 1));
    assert_eq!(snapshot(&region, "a").await.handled, vec![(0, 1)]);
    assert!(region.passivate("a"));
    assert!(matches!(
        probe.next_event().await,
        Event::Stopped { incarnation: 1, .. }
    ));
    // The termination has been processed by now (current-thread runtime: the stop hook and
    // the region's termination handling run in the same turn of the entity's task).
    let stats = region.stats();
    assert_eq!((stats.active_entities, stats.stopping_entities), (0, 0));
    assert_eq!(stats.active_shards, 0);

    let next = snapshot(&region, "a").await;
    assert_eq!(next.incarnation, 2);
    assert_eq!(next.handled, vec![], "state does not survive passivation");
    assert_eq!(probe.journal_of("a", 0), vec![1]);
    system.shutdown().await;
}

/// A backlog can stop the incarnation it is handed to: with `StopSelf` in a long backlog,
/// the new incarnation may run on the other worker thread and stop while the rest is still
/// being handed over. The rest then waits for the incarnation after it; nothing is dropped.
///
/// Runs of self-stops make that likely: each incarnation of a run stops at once and spawns
/// the next from its termination hook, and after three in a row tokio queues the next one
/// where the other worker can steal it, while this one is still handing over the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_that_stops_its_own_incarnation_is_carried_over() {
    const GROUPS: u64 = 8;
    const STOPS_PER_GROUP: u64 = 4;
    const ITEMS_PER_GROUP: u64 = 2_000;
    let (system, probe, region) = recorders("stopping-backlog", |e| e.buffer_limit(100_000));

    region.tell("a", Msg::Block { gate: 1 });
    probe.next_event().await; // entered
    assert!(region.passivate("a"));
    // Buffered while "a" stops: runs of self-stops, each followed by a tail of items.
    for group in 0..GROUPS {
        for _ in 0..STOPS_PER_GROUP {
            region.tell("a", Msg::StopSelf);
        }
        for seq in group * ITEMS_PER_GROUP..(group + 1) * ITEMS_PER_GROUP {
            region.tell("a", item(0, seq));
        }
    }
    probe.gate(1).open();

    // Incarnation 1 was passivated, each later one but the last stops on one `StopSelf`.
    let last = snapshot(&region, "a").await;
    assert_eq!(u64::from(last.incarnation), GROUPS * STOPS_PER_GROUP + 2);
    assert_eq!(
        probe.journal_of("a", 0),
        (0..GROUPS * ITEMS_PER_GROUP).collect::<Vec<_>>(),
        "items lost, duplicated or reordered"
    );
    assert_eq!(system.dead_letters().total(), 0);
    assert_eq!(probe.stopped("a"), last.incarnation - 1);
    assert_eq!(probe.violations(), Vec::<String>::new());
    system.shutdown().await;
}

/// An entity that stops itself in `started` before it handles anything, for its first
/// `quits` incarnations.
struct Quitter {
    starts: Arc<std::sync::atomic::AtomicU32>,
    quits: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum QuitterMsg {
    /// Answers how many incarnations were started before this one handled it.
    Starts(shardik_actor::ReplyTo<u32>),
}

impl shardik_actor::Actor for Quitter {
    type Msg = QuitterMsg;

    async fn started(
        &mut self,
        ctx: &mut shardik_actor::Context<Self>,
    ) -> Result<(), shardik_actor::ActorError> {
        if self.starts.fetch_add(1, Ordering::SeqCst) < self.quits {
            ctx.stop();
        }
        Ok(())
    }

    async fn handle(
        &mut self,
        msg: QuitterMsg,
        _ctx: &mut shardik_actor::Context<Self>,
    ) -> Result<(), shardik_actor::ActorError> {
        let QuitterMsg::Starts(reply) = msg;
        reply.reply(self.starts.load(Ordering::SeqCst));
        Ok(())
    }
}

/// A message waits for an entity that stops itself at its start a few times, and the
/// incarnation that stays handles it; one whose every incarnation stops at its start is not
/// started forever for its messages: after `MAX_STARTS_WITHOUT_PROGRESS` incarnations in a
/// row they are dead letters (the ask fails instead of waiting), and the next message starts
/// it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_that_keeps_stopping_at_its_start_gets_its_messages_given_up() {
    use shardik_sharding::shard::MAX_STARTS_WITHOUT_PROGRESS;
    let system = ActorSystem::new("quitter");
    let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (s, quits) = (starts.clone(), MAX_STARTS_WITHOUT_PROGRESS - 1);
    let reluctant = system
        .sharding()
        .start(shardik_sharding::EntityType::new(
            "reluctant",
            move |_: &str| Quitter {
                starts: s.clone(),
                quits,
            },
        ))
        .unwrap();
    let wait = std::time::Duration::from_secs(10);
    let n = reluctant.ask("r", QuitterMsg::Starts, wait).await.unwrap();
    assert_eq!(n, MAX_STARTS_WITHOUT_PROGRESS, "the last start handled it");

    let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let s = starts.clone();
    let quitter = system
        .sharding()
        .start(shardik_sharding::EntityType::new(
            "quitter",
            move |_: &str| Quitter {
                starts: s.clone(),
                quits: u32::MAX,
            },
        ))
        .unwrap();
    let before = system.dead_letters().total();
    let err = quitter
        .ask("q", QuitterMsg::Starts, wait)
        .await
        .unwrap_err();
    assert!(
        matches!(err, shardik_actor::AskError::NoReply),
        "given up, not left to time out: {err:?}"
    );
    assert_eq!(starts.load(Ordering::SeqCst), MAX_STARTS_WITHOUT_PROGRESS);
    assert_eq!(system.dead_letters().total(), before + 1);
    // The next message starts it again, with a fresh count.
    let err = quitter
        .ask("q", QuitterMsg::Starts, wait)
        .await
        .unwrap_err();
    assert!(matches!(err, shardik_actor::AskError::NoReply), "{err:?}");
    assert_eq!(
        starts.load(Ordering::SeqCst),
        2 * MAX_STARTS_WITHOUT_PROGRESS
    );
    system.shutdown().await;
}
