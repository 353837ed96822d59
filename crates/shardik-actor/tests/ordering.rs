//! Per-sender FIFO: whatever one sender tells one actor arrives in the order sent, with
//! nothing lost, however many senders race and however the actor's turns are batched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use shardik_actor::{Actor, ActorError, ActorRef, ActorSystem, Context, Props, ReplyTo};
use tokio::sync::Barrier;

enum Msg {
    Item { sender: usize, seq: u64 },
    Log(ReplyTo<Vec<(usize, u64)>>),
}

#[derive(Default)]
struct Recorder {
    log: Vec<(usize, u64)>,
}

impl Actor for Recorder {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Item { sender, seq } => self.log.push((sender, seq)),
            Msg::Log(reply) => reply.reply(std::mem::take(&mut self.log)),
        }
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Spawns one task per sender; sender `s` sends `counts[s]` messages, message `seq` going to
/// actor `(s + seq) % actors.len()`. Returns each actor's log once every sender is done.
async fn race(
    system: &ActorSystem,
    actors: &[ActorRef<Msg>],
    counts: &[u64],
    yield_every: u64,
) -> Vec<Vec<(usize, u64)>> {
    let start = Arc::new(Barrier::new(counts.len()));
    let mut tasks = Vec::new();
    for (sender, &count) in counts.iter().enumerate() {
        let actors = actors.to_vec();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for seq in 0..count {
                let target = &actors[(sender + seq as usize) % actors.len()];
                target
                    .try_tell(Msg::Item { sender, seq })
                    .expect("unbounded mailbox accepts");
                if seq % yield_every == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Every tell has returned, so an ask now queues behind all of them.
    let mut logs = Vec::new();
    for a in actors {
        logs.push(a.ask(Msg::Log, Duration::from_secs(30)).await.unwrap());
    }
    assert_eq!(system.dead_letters().total(), 0);
    logs
}

/// Checks that, per actor, each sender's messages arrive in increasing order, and that the
/// union over all actors is exactly `0..count` for every sender.
fn check(logs: &[Vec<(usize, u64)>], counts: &[u64], n_actors: usize) -> Result<(), TestCaseError> {
    let mut seen: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for (actor, log) in logs.iter().enumerate() {
        let mut last: BTreeMap<usize, u64> = BTreeMap::new();
        for &(sender, seq) in log {
            prop_assert_eq!(
                (sender + seq as usize) % n_actors,
                actor,
                "message delivered to the wrong actor"
            );
            if let Some(prev) = last.insert(sender, seq) {
                prop_assert!(
                    prev < seq,
                    "actor {} got seq {} of sender {} after {}",
                    actor,
                    seq,
                    sender,
                    prev
                );
            }
            seen.entry(sender).or_default().push(seq);
        }
    }
    for (sender, &count) in counts.iter().enumerate() {
        let mut got = seen.remove(&sender).unwrap_or_default();
        got.sort_unstable();
        prop_assert_eq!(
            got,
            (0..count).collect::<Vec<_>>(),
            "sender {} lost or duplicated messages",
            sender
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn each_senders_sequence_arrives_in_order_at_one_actor(
        counts in prop::collection::vec(1u64..400, 1..8),
        throughput in prop_oneof![Just(1usize), Just(3), Just(64)],
        yield_every in 1u64..50,
    ) {
        let logs = runtime().block_on(async {
            let system = ActorSystem::new("ordering-one");
            let actor = system.spawn_props(Props::new(Recorder::default).throughput(throughput));
            let logs = race(&system, std::slice::from_ref(&actor), &counts, yield_every).await;
            system.shutdown().await;
            assert_eq!(system.live_actors(), 0);
            logs
        });
        check(&logs, &counts, 1)?;
    }

    #[test]
    fn each_senders_sequence_arrives_in_order_at_several_actors(
        counts in prop::collection::vec(1u64..300, 1..8),
        n_actors in 2usize..6,
        throughput in prop_oneof![Just(1usize), Just(2), Just(64)],
        yield_every in 1u64..50,
    ) {
        let logs = runtime().block_on(async {
            let system = ActorSystem::new("ordering-many");
            let actors: Vec<_> = (0..n_actors)
                .map(|_| system.spawn_props(Props::new(Recorder::default).throughput(throughput)))
                .collect();
            let logs = race(&system, &actors, &counts, yield_every).await;
            system.shutdown().await;
            assert_eq!(system.live_actors(), 0);
            logs
        });
        check(&logs, &counts, n_actors)?;
    }
}

/// The same guarantee for messages an actor sends to itself while others send to it: the
/// self-sent chain stays in order, interleaved with the external senders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_sends_interleave_in_order_with_external_senders() {
    struct Chain {
        log: Vec<(usize, u64)>,
        until: u64,
        done: Option<tokio::sync::oneshot::Sender<()>>,
    }
    impl Actor for Chain {
        type Msg = Msg;
        async fn handle(&mut self, msg: Msg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
            match msg {
                Msg::Item { sender, seq } => {
                    self.log.push((sender, seq));
                    if sender == 0 {
                        if seq + 1 < self.until {
                            ctx.myself().tell(Msg::Item {
                                sender: 0,
                                seq: seq + 1,
                            });
                        } else if let Some(done) = self.done.take() {
                            let _ = done.send(());
                        }
                    }
                }
                Msg::Log(reply) => reply.reply(self.log.clone()),
            }
            Ok(())
        }
    }
    let system = ActorSystem::new("ordering-self");
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let actor = system.spawn_props(
        Props::from_instance(Chain {
            log: Vec::new(),
            until: 2_000,
            done: Some(done_tx),
        })
        .throughput(4),
    );
    actor.tell(Msg::Item { sender: 0, seq: 0 });
    let mut tasks = Vec::new();
    for sender in 1..=3 {
        let actor = actor.clone();
        tasks.push(tokio::spawn(async move {
            for seq in 0..2_000 {
                actor.tell(Msg::Item { sender, seq });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done_rx.await.unwrap();
    let log = actor.ask(Msg::Log, Duration::from_secs(10)).await.unwrap();
    assert_eq!(log.len(), 4 * 2_000);
    check(&[log], &[2_000, 2_000, 2_000, 2_000], 1).unwrap();
    system.shutdown().await;
}
