//! Per-entity, per-sender FIFO under concurrent senders, across passivations and self-stops:
//! each entity sees every sender's items exactly once and in the order sent.

mod common;

use std::collections::HashMap;

use common::{item, snapshot, Msg, Probe};
use proptest::prelude::*;
use shardik_actor::ActorSystem;
use shardik_sharding::ShardingExt;

const IDS: [&str; 4] = ["alice", "bob", "carol", "dave"];

#[derive(Clone, Debug)]
enum Op {
    /// Tell the next item of this sender to entity `IDS[.0]`.
    Send(usize),
    /// Ask the region to passivate `IDS[.0]`.
    Passivate(usize),
    /// Tell `IDS[.0]` to stop itself.
    StopSelf(usize),
    /// Let other tasks run.
    Yield,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..IDS.len()).prop_map(Op::Send),
        1 => (0..IDS.len()).prop_map(Op::Passivate),
        1 => (0..IDS.len()).prop_map(Op::StopSelf),
        2 => Just(Op::Yield),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs every sender's script concurrently, then checks that each entity's journal holds,
/// per sender, exactly the items sent to it in sending order.
async fn run(scripts: Vec<Vec<Op>>) {
    let system = ActorSystem::new("ordering");
    let probe = Probe::new();
    // The default buffer limit is far above what a script sends: nothing is refused.
    let region = system
        .sharding()
        .start(probe.entity_type("recorder"))
        .unwrap();
    let mut tasks = Vec::new();
    for (sender, script) in scripts.into_iter().enumerate() {
        let region = region.clone();
        let sender = sender as u32;
        tasks.push(tokio::spawn(async move {
            let mut sent: HashMap<(usize, u32), Vec<u64>> = HashMap::new();
            for (seq, op) in script.into_iter().enumerate() {
                match op {
                    Op::Send(e) => {
                        region.tell(IDS[e], item(sender, seq as u64));
                        sent.entry((e, sender)).or_default().push(seq as u64);
                    }
                    Op::Passivate(e) => {
                        region.passivate(IDS[e]);
                    }
                    Op::StopSelf(e) => region.tell(IDS[e], Msg::StopSelf),
                    Op::Yield => tokio::task::yield_now().await,
                }
            }
            sent
        }));
    }
    let mut sent = HashMap::new();
    for t in tasks {
        sent.extend(t.await.unwrap());
    }
    let mut seen = HashMap::new();
    for (e, id) in IDS.iter().enumerate() {
        // Queued behind everything sent to this entity, so answered after all of it.
        snapshot(&region, id).await;
        for sender in 0..8 {
            let got = probe.journal_of(id, sender);
            if !got.is_empty() {
                seen.insert((e, sender), got);
            }
        }
    }
    assert_eq!(probe.violations(), Vec::<String>::new());
    assert_eq!(system.dead_letters().total(), 0);
    assert_eq!(region.stats().rejected_total, 0);
    system.shutdown().await;
    assert_eq!(seen, sent, "items lost, duplicated or reordered");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_sender_is_seen_in_order_by_every_entity(
        scripts in prop::collection::vec(prop::collection::vec(op(), 0..120), 1..6),
    ) {
        runtime().block_on(run(scripts));
    }
}
