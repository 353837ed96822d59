//! Cluster sharding across OS processes, with SIGKILL: this process runs node `n0` (the oldest
//! member, so the coordinator) and two child processes run `c1` and `c2`, all hosting the
//! `counter` entity type. Traffic (tells from one sender, asks from another) goes through
//! `n0`'s region while `c2` is killed with SIGKILL: its entities answer again from a survivor
//! within a bound (their shards failed over once `c2` was `Down` plus `down_margin`), the
//! other entities never restart and lose nothing, and no entity ever handles a sender's
//! number twice or out of order (each checks on every message and says so in its answers).
//!
//! The children are this test binary re-run with the ignored test [`child_node`] selected
//! (see `tests/process_util`).

mod cluster_util;
mod process_util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_util::{config, init_tracing, poll, start_member, wait_state};
use process_util::ChildNode;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, AskError, Context, ReplyTo};
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::Cluster;
use shardik_sharding::cluster::{ClusterSharding, ClusterShardingSettings};
use shardik_sharding::{EntityType, Region};
use tokio::sync::mpsc;

/// Set to `"<node id> <seed address>"` in a child's environment.
const CHILD: &str = "SHARDIK_SHARDING_TEST_CHILD";
const TYPE: &str = "counter";
const SHARDS: u32 = 12;
const ENTITIES: usize = 24;
/// The tell stream's sender and the ask stream's sender.
const TELLS: u32 = 0;
const ASKS: u32 = 1;
/// Timeout of each ask of the ask stream (asks to a dead node fail with it).
const STREAM_ASK: Duration = Duration::from_millis(400);
/// From SIGKILL to a moved entity answering from a survivor: `Down` takes about 4.5 s with
/// the membership defaults, plus `down_margin` (2 s here) and a reallocation; the bound leaves
/// room for a loaded machine.
const FAILOVER_BOUND: Duration = Duration::from_secs(20);

/// The counter entity's messages.
#[derive(Serialize, Deserialize)]
enum Msg {
    /// Number `seq` of `sender`.
    Step { sender: u32, seq: u64 },
    /// Number `seq` of `sender`, answered with an [`Ack`].
    StepAsk {
        sender: u32,
        seq: u64,
        reply: ReplyTo<Ack>,
    },
    /// What this incarnation handled.
    Get(ReplyTo<Journal>),
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct Ack {
    node: String,
    incarnation: String,
    /// The `seq` of the request (an answer matches its request).
    seq: u64,
    /// The number of `sender` this incarnation handled before this one.
    prev: Option<u64>,
    /// Numbers this incarnation got twice or out of order (from any sender) so far.
    violations: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
struct Journal {
    node: String,
    incarnation: String,
    got: Vec<(u32, u64)>,
    violations: u64,
}

/// Counts incarnations made in this process, for unique incarnation names.
static INCARNATIONS: AtomicU64 = AtomicU64::new(0);

struct Counter {
    node: String,
    incarnation: String,
    last: HashMap<u32, u64>,
    got: Vec<(u32, u64)>,
    violations: u64,
}

impl Counter {
    /// Records `seq` of `sender`; returns the number of `sender` handled before it.
    fn record(&mut self, sender: u32, seq: u64) -> Option<u64> {
        let prev = self.last.insert(sender, seq);
        if prev.is_some_and(|p| seq <= p) {
            self.violations += 1;
        }
        self.got.push((sender, seq));
        prev
    }
}

impl Actor for Counter {
    type Msg = Msg;
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Step { sender, seq } => {
                self.record(sender, seq);
            }
            Msg::StepAsk { sender, seq, reply } => {
                let prev = self.record(sender, seq);
                reply.reply(Ack {
                    node: self.node.clone(),
                    incarnation: self.incarnation.clone(),
                    seq,
                    prev,
                    violations: self.violations,
                });
            }
            Msg::Get(reply) => reply.reply(Journal {
                node: self.node.clone(),
                incarnation: self.incarnation.clone(),
                got: self.got.clone(),
                violations: self.violations,
            }),
        }
        Ok(())
    }
}

fn counter_type(node: &str) -> EntityType<Counter> {
    let node = node.to_string();
    EntityType::new(TYPE, move |id: &str| Counter {
        node: node.clone(),
        incarnation: format!(
            "{node}/{id}/{}",
            INCARNATIONS.fetch_add(1, Ordering::SeqCst)
        ),
        last: HashMap::new(),
        got: Vec::new(),
        violations: 0,
    })
    .shards(SHARDS)
}

/// The same on every node: no rebalance during the test (homes change only by failover), and
/// a shorter `down_margin` (no partition here: the killed process runs no code).
fn settings() -> ClusterShardingSettings {
    ClusterShardingSettings::default()
        .rebalance_interval(Duration::from_secs(3600))
        .down_margin(Duration::from_secs(2))
}

/// The child's side: joins the cluster through the seed, starts the type, waits until its
/// region is registered, reports `READY` and serves until killed.
#[test]
#[ignore = "helper: a child process of the test below"]
fn child_node() {
    let Some(spec) = process_util::child_env(CHILD) else {
        return;
    };
    let (node_id, seed) = spec.split_once(' ').expect("\"<node id> <seed>\"");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (_system, cluster, _region) = rt.block_on(async {
        let system = shardik_actor::ActorSystem::new(node_id.to_string());
        let cluster = Cluster::start(&system, config(node_id).seed_nodes([seed.to_string()]))
            .await
            .expect("the child node starts");
        cluster.when_up().await.expect("the child joins");
        let sharding = ClusterSharding::get(&cluster);
        let region = sharding
            .start_with(counter_type(node_id), settings())
            .expect("the type starts");
        sharding
            .wait_registered(TYPE, Duration::from_secs(30))
            .await
            .expect("registered with the coordinator");
        (system, cluster, region)
    });
    let me = cluster.self_node();
    process_util::ready(&me.address, me.incarnation);
    process_util::serve_until_stdin_closes();
}

/// One answered (or failed) ask of the ask stream.
struct Outcome {
    entity: usize,
    seq: u64,
    at: Instant,
    res: Result<Ack, AskError>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_process_entities_answer_again_from_a_survivor() {
    init_tracing();
    let (system, cluster, sharding) = start_member("n0", None, &[]).await;
    let region: Region<Msg> = sharding.start_with(counter_type("n0"), settings()).unwrap();
    let seed = cluster.self_node().address.clone();
    let ready = Duration::from_secs(60);
    let (spec1, spec2) = (format!("c1 {seed}"), format!("c2 {seed}"));
    let (c1, mut c2) = tokio::join!(
        ChildNode::spawn("child_node", "c1", CHILD, &spec1, ready),
        ChildNode::spawn("child_node", "c2", CHILD, &spec2, ready),
    );
    let c2_id = UniqueAddress::new(c2.addr.clone(), "c2", c2.incarnation);
    let members = [
        cluster.self_node().clone(),
        UniqueAddress::new(c1.addr.clone(), "c1", c1.incarnation),
        c2_id.clone(),
    ];
    wait_state(&cluster, "all up", |s| s.all_up(&members)).await;
    poll("3 regions registered", Duration::from_secs(20), || {
        sharding
            .coordinator(TYPE)
            .is_some_and(|c| c.state.regions.len() == 3)
    })
    .await;

    // Placement: every node hosts some entities.
    let ids: Vec<String> = (0..ENTITIES).map(|i| format!("e{i}")).collect();
    let mut before: Vec<Journal> = Vec::new();
    for id in &ids {
        before.push(
            region
                .ask(id, Msg::Get, Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("{id}: {e}")),
        );
    }
    for node in ["n0", "c1", "c2"] {
        assert!(
            before.iter().any(|j| j.node == node),
            "{node} hosts an entity"
        );
    }
    let moved: Vec<bool> = before.iter().map(|j| j.node == "c2").collect();

    // The streams: tells from one task, asks (one task per entity, one at a time).
    let stop = Arc::new(AtomicBool::new(false));
    let teller = {
        let (region, ids, stop) = (region.clone(), ids.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for id in &ids {
                    region.tell(id, Msg::Step { sender: TELLS, seq });
                }
                seq += 1;
                // Pacing of the stream, not a wait.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seq
        })
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let askers: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(entity, id)| {
            let (entity_ref, stop, tx) = (region.entity_ref(id.as_str()), stop.clone(), tx.clone());
            tokio::spawn(async move {
                let mut seq = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let res = entity_ref
                        .ask(
                            |reply| Msg::StepAsk {
                                sender: ASKS,
                                seq,
                                reply,
                            },
                            STREAM_ASK,
                        )
                        .await;
                    let ok = res.is_ok();
                    let _ = tx.send(Outcome {
                        entity,
                        seq,
                        at: Instant::now(),
                        res,
                    });
                    seq += 1;
                    if ok {
                        // Pacing of the stream, not a wait.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                seq
            })
        })
        .collect();
    drop(tx);

    let mut outcomes: Vec<Vec<Outcome>> = (0..ENTITIES).map(|_| Vec::new()).collect();
    // Waits for outcomes until `done(outcomes)` holds or `deadline` passes.
    async fn collect(
        rx: &mut mpsc::UnboundedReceiver<Outcome>,
        outcomes: &mut [Vec<Outcome>],
        what: &str,
        deadline: Instant,
        done: impl Fn(&[Vec<Outcome>]) -> bool,
    ) {
        while !done(outcomes) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(o)) => outcomes[o.entity].push(o),
                Ok(None) => panic!("{what}: the askers ended"),
                Err(_) => panic!("{what}: not by the deadline"),
            }
        }
    }
    let ok_after =
        |o: &[Outcome], t: Instant| o.iter().filter(|o| o.at > t && o.res.is_ok()).count();
    let start = Instant::now();
    collect(
        &mut rx,
        &mut outcomes,
        "every entity answers 3 asks",
        start + Duration::from_secs(20),
        |out| out.iter().all(|o| ok_after(o, start) >= 3),
    )
    .await;

    // SIGKILL c2, which hosts some of the entities.
    let killed_at = Instant::now();
    c2.kill();
    collect(
        &mut rx,
        &mut outcomes,
        "the killed node's entities answer from a survivor",
        killed_at + FAILOVER_BOUND,
        |out| {
            out.iter().all(|o| {
                o.iter()
                    .any(|o| o.at > killed_at && o.res.as_ref().is_ok_and(|a| a.node != "c2"))
            })
        },
    )
    .await;
    let mut failover = Duration::ZERO;
    let mut recovered_at = vec![killed_at; ENTITIES];
    for (e, o) in outcomes.iter().enumerate() {
        if moved[e] {
            let first = o
                .iter()
                .find(|o| o.at > killed_at && o.res.as_ref().is_ok_and(|a| a.node != "c2"))
                .unwrap();
            recovered_at[e] = first.at;
            failover = failover.max(first.at - killed_at);
        }
    }
    eprintln!("SIGKILL to the last moved entity answering from a survivor: {failover:?}");
    // c2 is Down by now (its shards moved only after that).
    assert!(cluster
        .state()
        .member(&c2_id)
        .is_none_or(|m| m.status == MemberStatus::Down));

    // More traffic after the failover, then stop the streams.
    let after = Instant::now();
    collect(
        &mut rx,
        &mut outcomes,
        "every entity answers 5 more asks",
        after + Duration::from_secs(20),
        |out| out.iter().all(|o| ok_after(o, after) >= 5),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let tells = teller.await.unwrap();
    let mut asks = Vec::new();
    for a in askers {
        asks.push(a.await.unwrap());
    }
    while let Some(o) = rx.recv().await {
        outcomes[o.entity].push(o);
    }

    let mut failed = std::collections::BTreeMap::<String, usize>::new();
    for o in outcomes.iter().flatten() {
        if let Err(err) = &o.res {
            let kind = format!("{err:?}");
            *failed
                .entry(kind.split('(').next().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    eprintln!("failed asks by kind: {failed:?}");
    for (e, id) in ids.iter().enumerate() {
        let old = &before[e];
        // The answers: each matches its request; one incarnation before the kill, and for a
        // moved entity exactly one other one (on a survivor) after it, never back.
        let acks: Vec<&Ack> = outcomes[e]
            .iter()
            .filter_map(|o| o.res.as_ref().ok())
            .collect();
        for o in &outcomes[e] {
            match &o.res {
                Ok(a) => {
                    assert_eq!(a.seq, o.seq, "{id}: an answer matches its request");
                    assert!(a.prev.is_none_or(|p| p < a.seq), "{id}: {a:?} reordered");
                    assert_eq!(a.violations, 0, "{id}: duplicated or reordered: {a:?}");
                }
                // A survivor's entity may miss a short timeout on a loaded machine (its
                // message is still handled: checked below); the killed node's fail typed.
                Err(AskError::Timeout(_)) => {}
                Err(err) => {
                    assert!(moved[e], "{id} on a survivor: ask {} failed: {err}", o.seq);
                    assert!(
                        matches!(err, AskError::NoReply | AskError::Undeliverable(_)),
                        "{id}: {err}"
                    );
                }
            }
        }
        let switch = acks
            .iter()
            .position(|a| a.incarnation != old.incarnation)
            .unwrap_or(acks.len());
        assert!(acks[..switch].iter().all(|a| a.node == old.node));
        if moved[e] {
            let new = &acks[switch];
            assert_ne!(new.node, "c2", "{id}");
            assert!(
                acks[switch..]
                    .iter()
                    .all(|a| a.incarnation == new.incarnation),
                "{id}: one incarnation after the failover"
            );
        } else {
            assert_eq!(switch, acks.len(), "{id} on a survivor never restarted");
        }

        // What the (current) incarnation handled: every number of each stream exactly once
        // and in order; a moved entity lost what was sent to c2 (at most once across a
        // crash), so it has a suffix of each stream, including every ask since it answered
        // again.
        let now = region
            .ask(id, Msg::Get, Duration::from_secs(10))
            .await
            .unwrap_or_else(|err| panic!("{id}: {err}"));
        assert_eq!(now.violations, 0, "{id}");
        let of = |s: u32| -> Vec<u64> {
            now.got
                .iter()
                .filter(|(x, _)| *x == s)
                .map(|(_, q)| *q)
                .collect()
        };
        let (t, a) = (of(TELLS), of(ASKS));
        if moved[e] {
            assert_ne!(now.node, "c2");
            assert_eq!(now.incarnation, acks[switch].incarnation, "{id}");
            let from = t.first().copied().expect("tells after the failover");
            assert_eq!(t, (from..tells).collect::<Vec<_>>(), "{id}: tell stream");
            let first_answered = outcomes[e]
                .iter()
                .find(|o| o.at >= recovered_at[e] && o.res.is_ok())
                .unwrap()
                .seq;
            let from = a.first().copied().expect("asks after the failover");
            assert!(from <= first_answered, "{id}: {from} > {first_answered}");
            assert_eq!(a, (from..asks[e]).collect::<Vec<_>>(), "{id}: ask stream");
        } else {
            assert_eq!(now.incarnation, old.incarnation, "{id} never restarted");
            assert_eq!(t, (0..tells).collect::<Vec<_>>(), "{id}: tell stream");
            assert_eq!(a, (0..asks[e]).collect::<Vec<_>>(), "{id}: ask stream");
        }
    }
    assert!(failover < FAILOVER_BOUND, "failover took {failover:?}");
    drop(c1);
    cluster.shutdown().await;
    system.shutdown().await;
}
