//! Persist before act, durably: while the sharding state stores of a majority of the nodes
//! refuse writes, the coordinator cannot take over (a replica stores its promise to the new
//! epoch before granting it, see `ReplicaStore::promise`), and even once taken over its state
//! would never be acknowledged by a majority; so it acts on nothing (no shard is allocated,
//! no entity starts). Once the stores heal, the takeover and the writes are retried and the
//! entity starts, once.

mod cluster_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, AskError, Context, ReplyTo};
use shardik_persistence::{FaultyStore, InMemoryStore};
use shardik_sharding::cluster::ShardingStateStore;
use shardik_sharding::{shard_of, EntityType};

use cluster_util::{coordinator_where, members, poll, stop_all};

const TYPE: &str = "gated";

#[derive(Serialize, Deserialize)]
enum Msg {
    Ping(ReplyTo<u32>),
}

struct Counted {
    starts: Arc<AtomicUsize>,
}

impl Actor for Counted {
    type Msg = Msg;
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Ping(r) => r.reply(1),
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_acts_only_once_a_majority_stored_its_state() {
    let faulty: Vec<Arc<FaultyStore<InMemoryStore>>> = (0..3)
        .map(|_| Arc::new(FaultyStore::new(Arc::new(InMemoryStore::new()))))
        .collect();
    let stores: Vec<Arc<dyn ShardingStateStore>> = faulty
        .iter()
        .map(|f| {
            let s: Arc<dyn ShardingStateStore> = f.clone();
            s
        })
        .collect();
    let nodes = members(&stores).await;
    // Two stores of three refuse every write: no majority can hold anything.
    faulty[1].fail_writes(true);
    faulty[2].fail_writes(true);
    let starts = Arc::new(AtomicUsize::new(0));
    let regions: Vec<_> = nodes
        .iter()
        .map(|m| {
            let starts = starts.clone();
            m.sharding
                .start(EntityType::new(TYPE, move |_: &str| Counted {
                    starts: starts.clone(),
                }))
                .expect("type starts")
        })
        .collect();
    // The coordinator's takeover (its promise, then its epoch start) is not durable on a
    // majority.
    poll(
        "writes refused on the failing stores",
        Duration::from_secs(20),
        || faulty[1].refused() > 0 && faulty[2].refused() > 0,
    )
    .await;
    let refused = regions[1].ask("a", Msg::Ping, Duration::from_secs(2)).await;
    assert!(matches!(refused, Err(AskError::Timeout(_))), "{refused:?}");
    assert_eq!(starts.load(Ordering::SeqCst), 0, "an entity started");
    for m in &nodes {
        if let Some(c) = m.sharding.coordinator(TYPE) {
            assert!(
                c.state.shards.is_empty(),
                "allocated without a majority: {c:?}"
            );
        }
    }

    // The stores heal: the coordinator's retries reach a majority and it acts.
    faulty[1].fail_writes(false);
    faulty[2].fail_writes(false);
    assert_eq!(
        regions[2]
            .ask("a", Msg::Ping, Duration::from_secs(15))
            .await,
        Ok(1)
    );
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    coordinator_where(&nodes, TYPE, "allocation durable", |c| {
        c.state.shards.contains_key(&shard_of("a", 100))
    })
    .await;
    // The allocation was acted on, so a majority of the stores held it before: an
    // acknowledgement is given only after the durable write.
    let mut holding = 0;
    for (f, m) in faulty.iter().zip(&nodes) {
        let records = f.inner().load_records(&m.id().node_id).await.unwrap();
        if !records.is_empty() {
            holding += 1;
        }
    }
    assert!(holding >= 2, "only {holding} stores hold the state");
    stop_all(&nodes).await;
}
