//! A hand-off whose entities are slow to stop: each entity of the moving shard still has a
//! long backlog in its mailbox when the hand-off begins. After `entity_stop_timeout` the old
//! home stops them as soon as their current message is done, and the messages they had not
//! handled move with the shard: every message is handled exactly once, in order, part on
//! the old node and the rest on the new one, and never by two live incarnations at once.

mod cluster_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cluster_util::{poll, settings, start_member};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context};
use shardik_sharding::cluster::{ClusterSharding, ClusterShardingSettings};
use shardik_sharding::{EntityType, Region};

const SLOW: &str = "slow";
const MESSAGES: u64 = 100;
/// Time each message takes: a backlog of `MESSAGES` is 5 s, far longer than the stop timeout.
const WORK: Duration = Duration::from_millis(50);

#[derive(Debug, Serialize, Deserialize)]
struct Work {
    seq: u64,
}

/// What every incarnation on every node (all in this process) reports.
#[derive(Default)]
struct Seen {
    /// Per entity: (node, seq) in the order handled.
    handled: Mutex<HashMap<String, Vec<(String, u64)>>>,
    live: Mutex<HashMap<String, usize>>,
    max_live: AtomicUsize,
}

struct Slow {
    id: String,
    node: String,
    seen: Arc<Seen>,
}

impl Actor for Slow {
    type Msg = Work;
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let mut live = self.seen.live.lock();
        let n = live.entry(self.id.clone()).or_default();
        *n += 1;
        self.seen.max_live.fetch_max(*n, Ordering::SeqCst);
        Ok(())
    }
    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        *self.seen.live.lock().entry(self.id.clone()).or_default() -= 1;
    }
    async fn handle(&mut self, msg: Work, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        tokio::time::sleep(WORK).await;
        self.seen
            .handled
            .lock()
            .entry(self.id.clone())
            .or_default()
            .push((self.node.clone(), msg.seq));
        Ok(())
    }
}

fn start_slow(sharding: &ClusterSharding, node: &str, seen: &Arc<Seen>) -> Region<Work> {
    let node = node.to_string();
    let seen = seen.clone();
    let settings: ClusterShardingSettings =
        settings().entity_stop_timeout(Duration::from_millis(300));
    sharding
        .start_with(
            EntityType::new(SLOW, move |id: &str| Slow {
                id: id.to_string(),
                node: node.clone(),
                seen: seen.clone(),
            })
            .shards(2),
            settings,
        )
        .expect("type starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_entities_are_stopped_after_the_timeout_and_their_backlog_moves() {
    cluster_util::init_tracing();
    let seen = Arc::new(Seen::default());
    let (sys0, c0, s0) = start_member("n0", None, &[]).await;
    let region0 = start_slow(&s0, "n0", &seen);
    // Entities in both shards, all on n0 (the only node), each with a 5 s backlog.
    let ids: Vec<String> = (0..6).map(|i| format!("e{i}")).collect();
    let shards: std::collections::BTreeSet<u32> = ids
        .iter()
        .map(|id| shardik_sharding::shard_of(id, 2))
        .collect();
    assert_eq!(shards.len(), 2, "the ids cover both shards");
    for seq in 0..MESSAGES {
        for id in &ids {
            region0.tell(id, Work { seq });
        }
    }
    // A second node joins: the coordinator moves one of the two shards to it at once.
    let seed = c0.self_node().address.clone();
    let (sys1, c1, s1) = start_member("n1", Some(&seed), &[]).await;
    let _region1 = start_slow(&s1, "n1", &seen);
    // Every message handled exactly once, in order (polled: no event reports it).
    poll("every message handled", Duration::from_secs(30), || {
        let handled = seen.handled.lock();
        ids.iter()
            .all(|id| handled.get(id).is_some_and(|h| h.len() as u64 >= MESSAGES))
    })
    .await;
    let handled = seen.handled.lock().clone();
    let mut split = 0;
    for id in &ids {
        let h = &handled[id];
        let seqs: Vec<u64> = h.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            seqs,
            (0..MESSAGES).collect::<Vec<_>>(),
            "{id}: lost, doubled or reordered"
        );
        let on_n0 = h.iter().take_while(|(n, _)| n == "n0").count();
        if on_n0 < h.len() {
            // Moved mid-backlog: the old incarnation was stopped with messages left, which
            // the new home handled, all after the old ones.
            assert!(h[on_n0..].iter().all(|(n, _)| n == "n1"), "{id}: {h:?}");
            split += 1;
        }
    }
    assert!(
        split > 0,
        "the moved shard's entities were stopped before they had handled their backlog"
    );
    assert!(
        seen.max_live.load(Ordering::SeqCst) <= 1,
        "two live incarnations of one entity at once"
    );
    for (c, sys) in [(&c1, &sys1), (&c0, &sys0)] {
        c.shutdown().await;
        sys.shutdown().await;
    }
}
