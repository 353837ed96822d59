//! Many entities at once: thousands of entities fed by several tasks count everything, and
//! different entities (even of one shard) run concurrently rather than one after another.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{item, recorders, PATIENCE};
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
use shardik_sharding::{EntityType, ShardingExt};
use tokio::sync::Barrier;

const ENTITIES: usize = 10_000;
const SENDERS: u32 = 4;
const ROUNDS: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_entities_fed_by_several_tasks_count_everything() {
    let (system, probe, region) = recorders("many", |e| e);
    let ids: Arc<Vec<String>> = Arc::new((0..ENTITIES).map(|i| format!("user-{i}")).collect());

    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let (region, ids) = (region.clone(), ids.clone());
        senders.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                // Each sender walks the ids with its own stride, so the tasks collide on
                // different entities at different times.
                let stride = [1, 7, 13, 31][sender as usize];
                for k in 0..ENTITIES {
                    let id = &ids[(k * stride + sender as usize) % ENTITIES];
                    region.tell(id, item(sender, round));
                    if k % 256 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }

    // Read back through the entities themselves, from several tasks.
    let mut readers = Vec::new();
    for part in 0..4 {
        let (region, ids) = (region.clone(), ids.clone());
        readers.push(tokio::spawn(async move {
            for id in ids.iter().skip(part).step_by(4) {
                let snap = region.ask(id, common::Msg::Get, PATIENCE).await.unwrap();
                assert_eq!(snap.incarnation, 1, "{id}");
                assert_eq!(
                    snap.handled.len(),
                    (SENDERS as u64 * ROUNDS) as usize,
                    "{id}"
                );
                for sender in 0..SENDERS {
                    let seqs: Vec<u64> = snap
                        .handled
                        .iter()
                        .filter(|(s, _)| *s == sender)
                        .map(|(_, seq)| *seq)
                        .collect();
                    assert_eq!(seqs, (0..ROUNDS).collect::<Vec<_>>(), "{id} from {sender}");
                }
            }
        }));
    }
    for r in readers {
        r.await.unwrap();
    }

    let stats = region.stats();
    assert_eq!(stats.active_entities, ENTITIES);
    assert_eq!(stats.spawned_total, ENTITIES as u64);
    assert_eq!(stats.active_shards, 100);
    assert_eq!(stats.rejected_total, 0);
    assert_eq!(probe.created_total(), ENTITIES as u32);
    assert_eq!(system.dead_letters().total(), 0);
    system.shutdown().await;
    assert_eq!(probe.stopped_total(), ENTITIES as u32);
}

/// An entity whose handler waits on a barrier shared by all entities of its type.
#[derive(Serialize, Deserialize)]
enum MeetMsg {
    Meet(ReplyTo<()>),
    Spin(ReplyTo<(bool, String)>),
}

struct Meeter {
    barrier: Arc<Barrier>,
    arrived: Arc<AtomicUsize>,
}

impl Actor for Meeter {
    type Msg = MeetMsg;

    async fn handle(&mut self, msg: MeetMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            // Returns only once another entity is inside its handler too.
            MeetMsg::Meet(reply) => {
                self.barrier.wait().await;
                reply.reply(());
            }
            // Blocks its thread until another entity has arrived: succeeds only if two
            // entities run on two threads at the same time.
            MeetMsg::Spin(reply) => {
                self.arrived.fetch_add(1, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(10);
                while self.arrived.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                let met = self.arrived.load(Ordering::SeqCst) >= 2;
                reply.reply((met, format!("{:?}", std::thread::current().id())));
            }
        }
        Ok(())
    }
}

fn meeters(system: &ActorSystem) -> shardik_sharding::Region<MeetMsg> {
    let barrier = Arc::new(Barrier::new(2));
    let arrived = Arc::new(AtomicUsize::new(0));
    // One shard: the two entities share it, and still are not serialized.
    let entity = EntityType::new("meeter", move |_id: &str| Meeter {
        barrier: barrier.clone(),
        arrived: arrived.clone(),
    })
    .shards(1);
    system.sharding().start(entity).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_entities_waiting_on_one_barrier_both_pass() {
    let system = ActorSystem::new("barrier");
    let region = meeters(&system);
    assert_eq!(region.shard_of("left"), region.shard_of("right"));
    let (left, right) = tokio::join!(
        region.ask("left", MeetMsg::Meet, Duration::from_secs(10)),
        region.ask("right", MeetMsg::Meet, Duration::from_secs(10)),
    );
    assert_eq!(left, Ok(()));
    assert_eq!(right, Ok(()));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_entities_run_on_two_threads_at_once() {
    let system = ActorSystem::new("spin");
    let region = meeters(&system);
    let (left, right) = tokio::join!(
        region.ask("left", MeetMsg::Spin, Duration::from_secs(30)),
        region.ask("right", MeetMsg::Spin, Duration::from_secs(30)),
    );
    let (met_left, thread_left) = left.unwrap();
    let (met_right, thread_right) = right.unwrap();
    assert!(
        met_left && met_right,
        "the handlers did not overlap in time"
    );
    assert_ne!(thread_left, thread_right);
    system.shutdown().await;
}
