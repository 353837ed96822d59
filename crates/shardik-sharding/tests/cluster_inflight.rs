//! Asks in flight across a crash: many asks to entities of a node that crashes — answered
//! ones, ones queued behind slow handlers, ones the entities hold unanswered, ones sent after
//! the crash to the dead node, and ones sent while its shards have no home (buffered) — every
//! ask completes or fails with a typed error no later than its timeout (plus scheduling
//! slack); none hangs. Asks to entities on the survivors all succeed meanwhile.

mod cluster_util;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_util::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, AskError, Context, ReplyTo};
use shardik_cluster::member::MemberStatus;
use shardik_sharding::{EntityType, Region};
use tokio::task::JoinHandle;

const SLOW: &str = "slow";
/// How late after its timeout an ask may end (scheduling on a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
enum SlowMsg {
    /// Answers with the node's name after `delay_ms`.
    Echo {
        delay_ms: u64,
        reply: ReplyTo<String>,
    },
    /// Keeps the reply handle and never answers.
    Hold(ReplyTo<String>),
}

struct SlowEntity {
    node: String,
    held: Vec<ReplyTo<String>>,
    holding: Arc<AtomicUsize>,
}

impl Actor for SlowEntity {
    type Msg = SlowMsg;
    async fn handle(&mut self, msg: SlowMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            SlowMsg::Echo { delay_ms, reply } => {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                reply.reply(self.node.clone());
            }
            SlowMsg::Hold(reply) => {
                self.held.push(reply);
                self.holding.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// One ask: what it was, when it was sent, its timeout, and when and how it ended.
struct Ended {
    what: &'static str,
    id: String,
    timeout: Duration,
    took: Duration,
    res: Result<String, AskError>,
}

fn ask(
    region: &Region<SlowMsg>,
    what: &'static str,
    id: &str,
    timeout: Duration,
    make: impl FnOnce(ReplyTo<String>) -> SlowMsg + Send + 'static,
) -> JoinHandle<Ended> {
    let entity = region.entity_ref(id);
    let id = id.to_string();
    tokio::spawn(async move {
        let t = Instant::now();
        let res = entity.ask(make, timeout).await;
        Ended {
            what,
            id,
            timeout,
            took: t.elapsed(),
            res,
        }
    })
}

fn echo(delay_ms: u64) -> impl FnOnce(ReplyTo<String>) -> SlowMsg + Send + 'static {
    move |reply| SlowMsg::Echo { delay_ms, reply }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_in_flight_across_a_crash_end_by_their_timeout() {
    let reg = Arc::new(Registry::default());
    let nodes = cluster_of(3, 12, &reg).await;
    let holding = Arc::new(AtomicUsize::new(0));
    let regions: Vec<Region<SlowMsg>> = nodes
        .iter()
        .map(|n| {
            let (node, holding) = (n.name(), holding.clone());
            n.sharding
                .start_with(
                    EntityType::new(SLOW, move |_id: &str| SlowEntity {
                        node: node.clone(),
                        held: Vec::new(),
                        holding: holding.clone(),
                    })
                    .shards(12),
                    settings(),
                )
                .expect("the type starts")
        })
        .collect();
    for n in &nodes {
        n.sharding
            .wait_registered(SLOW, Duration::from_secs(20))
            .await
            .expect("registered");
    }
    // Where the entities live (asked from n0).
    let mut on_n2 = Vec::new();
    let mut elsewhere = Vec::new();
    for i in 0..30 {
        let id = format!("s{i}");
        let home = regions[0].ask(&id, echo(0), ASK).await.expect("placement");
        if home == "n2" {
            on_n2.push(id);
        } else {
            elsewhere.push(id);
        }
    }
    assert!(on_n2.len() >= 3 && elsewhere.len() >= 3, "{on_n2:?}");

    // In flight when n2 crashes, from n0 and n1: held unanswered, queued behind 20 ms
    // handlers, and quick ones.
    let mut asks: Vec<JoinHandle<Ended>> = Vec::new();
    let t = Duration::from_secs(2);
    let mut held = 0;
    for region in &regions[..2] {
        for id in &on_n2 {
            for _ in 0..5 {
                asks.push(ask(region, "held", id, t, SlowMsg::Hold));
                held += 1;
            }
            for _ in 0..20 {
                asks.push(ask(region, "queued", id, t, echo(20)));
            }
            for _ in 0..5 {
                asks.push(ask(region, "quick", id, t, echo(0)));
            }
        }
    }
    poll(
        "n2's entities hold their asks",
        Duration::from_secs(20),
        || holding.load(Ordering::SeqCst) == held,
    )
    .await;
    nodes[2].crash().await;
    let crashed_at = Instant::now();
    // Sent to the dead node before anyone knows it is down.
    for region in &regions[..2] {
        for id in &on_n2 {
            for _ in 0..5 {
                asks.push(ask(
                    region,
                    "after crash",
                    id,
                    Duration::from_secs(1),
                    echo(0),
                ));
            }
        }
    }
    // Once n0 sees n2 Down, n2's shards have no home for `down_margin`: asks wait in the
    // region's buffers and end by their timeout (or are answered by the new home).
    let n2 = nodes[2].id().clone();
    wait_state(&nodes[0].cluster, "n2 down", |s| {
        s.member(&n2).is_none_or(|m| m.status == MemberStatus::Down)
    })
    .await;
    let down_after = crashed_at.elapsed();
    for id in &on_n2 {
        for _ in 0..5 {
            asks.push(ask(
                &regions[0],
                "homeless",
                id,
                Duration::from_secs(1),
                echo(0),
            ));
        }
    }
    // Control: the survivors' entities answer throughout.
    let mut control = Vec::new();
    for region in &regions[..2] {
        for id in &elsewhere {
            control.push(ask(region, "survivor", id, ASK, echo(0)));
        }
    }

    let mut kinds = std::collections::BTreeMap::<(&str, String), usize>::new();
    for a in asks {
        let e = tokio::time::timeout(Duration::from_secs(10), a)
            .await
            .expect("an ask hangs")
            .expect("ask task");
        assert!(
            e.took <= e.timeout + SLACK,
            "{} ask to {} ended after {:?} (timeout {:?}): {:?}",
            e.what,
            e.id,
            e.took,
            e.timeout,
            e.res
        );
        let kind = match &e.res {
            Ok(node) => {
                // Answered before the crash by n2, or (homeless ones) by the new home.
                assert!(
                    node == "n2" || e.what == "homeless",
                    "{} ask to {} answered by {node}",
                    e.what,
                    e.id
                );
                assert_ne!(e.what, "held", "a held ask is never answered");
                format!(
                    "answered by {}",
                    if node == "n2" { "n2" } else { "survivor" }
                )
            }
            Err(err @ (AskError::Timeout(_) | AskError::NoReply | AskError::Stopped)) => {
                format!("{err:?}").split('(').next().unwrap().to_string()
            }
            Err(AskError::Undeliverable(why)) => format!("Undeliverable ({why})"),
            Err(err) => panic!("{} ask to {}: unexpected failure {err}", e.what, e.id),
        };
        *kinds.entry((e.what, kind)).or_default() += 1;
    }
    for c in control {
        let e = c.await.expect("ask task");
        let node = e
            .res
            .unwrap_or_else(|err| panic!("{} answers: {err}", e.id));
        assert_ne!(node, "n2");
    }
    eprintln!("n2 Down on n0 {down_after:?} after the crash; outcomes: {kinds:#?}");
    // Every held ask failed, typed; the dead node answered nothing sent after the crash.
    for (what, kind) in kinds.keys() {
        if *what == "held" || *what == "after crash" {
            assert!(!kind.starts_with("answered"), "{what}: {kind}");
        }
    }
    reg.assert_single_writer();
    stop_all(&nodes[..2]).await;
}
