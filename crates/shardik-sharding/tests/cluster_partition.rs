//! A partition isolates one node while three senders (one on each node) stream to 20
//! entities. The isolated node is fenced and stops its entities at once, and later downs
//! itself; the majority downs it and, after `down_margin`, restarts its entities. The shared registry checks that no entity id
//! ever has two live incarnations, and no sender's numbers are duplicated or reordered.

mod cluster_util;

use std::sync::Arc;
use std::time::Duration;

use cluster_util::*;
use shardik_cluster::runtime::NodeStopReason;
use shardik_remote::{FaultInjector, Lane};
use shardik_sharding::coordination::{
    AllocationStrategy, AllocationView, LeastShards, Move, RegionId,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_node_stops_its_entities_before_the_majority_restarts_them() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let nodes = cluster_with(3, 12, &reg, Some(&faults)).await;
    let ids: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
    let mut on_n2 = Vec::new();
    for id in &ids {
        if where_is(&nodes[0], id).await == "n2" {
            on_n2.push(id.clone());
        }
    }
    assert!(!on_n2.is_empty());
    let streams = Streams::start(&nodes, &[(0, 0), (1, 1), (2, 2)], &ids);
    for other in ["n0", "n1"] {
        faults.cut_both("n2", other);
    }
    // Fenced first (about when it could first suspect the others), while still a member:
    // the majority has not even started its `stable_after` yet.
    let s = wait_state(&nodes[2].cluster, "n2 fenced", |s| s.fenced).await;
    assert_eq!(s.stopped, None, "fenced only when stopped");
    poll("n2's entities stopped", Duration::from_secs(5), || {
        nodes[2].hosted().is_empty()
    })
    .await;
    for n in &nodes[..2] {
        let s = n.cluster.state();
        assert!(!s.fenced, "majority node fenced");
        assert!(
            s.member(nodes[2].id())
                .is_some_and(|m| m.status == shardik_cluster::member::MemberStatus::Up),
            "n2 downed before its entities stopped"
        );
    }
    let s = wait_state(&nodes[2].cluster, "n2 downs itself", |s| {
        s.stopped.is_some()
    })
    .await;
    assert_eq!(s.stopped, Some(NodeStopReason::Downed));
    let n2 = nodes[2].id().clone();
    for n in &nodes[..2] {
        wait_state(&n.cluster, "n2 removed", |s| s.member(&n2).is_none()).await;
    }
    region_dropped(&nodes[0], "n2").await;
    poll(
        "n2's entities run on the majority",
        Duration::from_secs(20),
        || {
            let homes = reg.homes.lock();
            on_n2.iter().all(|id| homes[id.as_str()].len() >= 2)
        },
    )
    .await;
    streams.stop().await;
    for id in &ids {
        where_is(&nodes[0], id).await;
        reg.assert_ordered(id, &[0, 1, 2]);
    }
    assert!(
        nodes[2].hosted().is_empty(),
        "the isolated node hosts nothing"
    );
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// A fenced node stops an entity after the message it is handling, not after its whole
/// backlog: the majority starts the entity again `down_margin` after downing the node, and a
/// copy still working through its mailbox here then would be a second live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_stops_a_busy_entity_after_its_current_message() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let nodes = cluster_with(3, 12, &reg, Some(&faults)).await;
    let busy = entity_on(&nodes[0], "n2").await;
    // 400 messages of 50 ms each: a 20 s backlog.
    fence_n2_while_busy(&nodes, &faults, &reg, &busy, 400, 50).await;
    let handled = || handled(&reg, &busy);
    let at_fence = handled();
    poll("n2's entities stopped", Duration::from_secs(5), || {
        nodes[2].hosted().is_empty()
    })
    .await;
    let after = handled() - at_fence;
    assert!(
        after <= 3,
        "{after} messages handled after the fence (a graceful stop drains the mailbox)"
    );
    assert!(handled() < 400, "the whole backlog was handled");
    reg.assert_ordered(&busy, &[9]);
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// A partition that heals before anyone is downed: the fenced node stops its busy entity at
/// once, holds what it had not handled ahead of what arrives meanwhile, and after the fence is
/// lifted the entity handles every message exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_healed_partition_held_messages_are_handled_once_in_order() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    // Downing waits long enough for the partition to heal first, on any machine.
    let tune = |c: shardik_cluster::runtime::ClusterConfig| c.stable_after(Duration::from_secs(20));
    let nodes = cluster_tuned(3, 12, &reg, Some(&faults), &|t| t, &tune).await;
    let busy = entity_on(&nodes[0], "n2").await;
    let region = &nodes[2].region;
    fence_n2_while_busy(&nodes, &faults, &reg, &busy, 40, 20).await;
    let handled = || handled(&reg, &busy);
    // Held while fenced, behind what the stopped entity had not handled.
    for seq in 40..60 {
        region.tell(&busy, Msg::Add { sender: 9, seq });
    }
    poll("n2's entities stopped", Duration::from_secs(5), || {
        nodes[2].hosted().is_empty()
    })
    .await;
    faults.heal_all();
    wait_state(&nodes[2].cluster, "n2 unfenced", |s| !s.fenced).await;
    for seq in 60..70 {
        region.tell(&busy, Msg::Add { sender: 9, seq });
    }
    poll("every message handled", Duration::from_secs(20), || {
        handled() >= 70
    })
    .await;
    reg.assert_stream(&busy, &[9], 70);
    reg.assert_single_writer();
    for n in &nodes {
        assert_eq!(n.cluster.state().stopped, None, "nobody was downed");
    }
    stop_all(&nodes).await;
}

/// A remembered entity still in its last message when the fence lifts (so still stopping)
/// starts again once that message is done, without any message for it: remember entities
/// promises it runs while its shard is hosted. Its shard mate, already stopped, restarts at
/// once; ids are started in order, so by then the busy one has been asked for too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_entity_still_stopping_when_the_fence_lifts_starts_again() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let tune = |c: shardik_cluster::runtime::ClusterConfig| c.stable_after(Duration::from_secs(20));
    let nodes = remembering_cluster_tuned(3, 12, &reg, Some(&faults), settings(), &tune).await;
    // Two entities of one shard hosted on n2, `busy` first in id order.
    let region = &nodes[2].region;
    let mut on_n2: Vec<String> = Vec::new();
    for i in 0..100 {
        let id = format!("e{i:02}");
        if where_is(&nodes[0], &id).await == "n2" {
            on_n2.push(id);
        }
    }
    let (busy, mate) = on_n2
        .iter()
        .flat_map(|a| on_n2.iter().map(move |b| (a, b)))
        .find(|(a, b)| a < b && region.shard_of(a) == region.shard_of(b))
        .map(|(a, b)| (a.clone(), b.clone()))
        .expect("two of e00..e99 share a shard on n2");
    poll("both remembered", Duration::from_secs(20), || {
        let ids = nodes[2].sharding.remembered_entities(TYPE);
        ids.contains(&busy) && ids.contains(&mate)
    })
    .await;
    fence_n2_while_gated(&nodes, &faults, &reg, &busy, 0).await;
    poll("the idle mate stopped", Duration::from_secs(5), || {
        reg.live_of(&mate) == 0
    })
    .await;
    assert_eq!(reg.live_of(&busy), 1, "held in its message by the gate");
    faults.heal_all();
    wait_state(&nodes[2].cluster, "n2 unfenced", |s| !s.fenced).await;
    poll("the mate restarted", Duration::from_secs(20), || {
        reg.live_of(&mate) == 1
    })
    .await;
    assert_eq!(
        reg.homes.lock()[&busy].len(),
        1,
        "still its first incarnation"
    );
    reg.gate.open();
    poll("the busy entity restarted", Duration::from_secs(20), || {
        reg.homes.lock()[&busy].len() == 2 && reg.live_of(&busy) == 1
    })
    .await;
    assert_eq!(reg.homes.lock()[&busy], ["n2", "n2"]);
    reg.assert_stream(&busy, &[9], 1);
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// Messages held while fenced for an entity still finishing its message when the fence
/// lifts wait for its next incarnation even past the type's cap on what a stopping entity
/// buffers: they were accepted. Before 2026-11-29 the cap made all but the first two of them
/// dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_messages_for_an_entity_still_stopping_at_the_lift_are_not_capped() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let tune = |c: shardik_cluster::runtime::ClusterConfig| c.stable_after(Duration::from_secs(20));
    let cap = |t: shardik_sharding::EntityType<Probe>| t.buffer_limit(2);
    let nodes = cluster_tuned(3, 12, &reg, Some(&faults), &cap, &tune).await;
    let (busy, other) = two_on_n2(&nodes).await;
    let region = &nodes[2].region;
    fence_n2_while_gated(&nodes, &faults, &reg, &busy, 0).await;
    // Held by the fence as they are sent (n2's region takes them while fenced).
    for seq in 1..=5 {
        region.tell(&busy, Msg::Add { sender: 9, seq });
    }
    region.tell(&other, Msg::Add { sender: 9, seq: 0 });
    faults.heal_all();
    wait_state(&nodes[2].cluster, "n2 unfenced", |s| !s.fenced).await;
    // The lift delivers everything it held at once: `other`'s message marks it done.
    poll("the lift delivered", Duration::from_secs(20), || {
        handled(&reg, &other) == 1
    })
    .await;
    assert_eq!(reg.live_of(&busy), 1, "held in its message by the gate");
    assert_eq!(handled(&reg, &busy), 0);
    reg.gate.open();
    poll(
        "the busy entity handled all",
        Duration::from_secs(20),
        || handled(&reg, &busy) == 6,
    )
    .await;
    assert_eq!(reg.homes.lock()[&busy], ["n2", "n2"]);
    reg.assert_stream(&busy, &[9], 6);
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// What a fenced node holds for entities it stopped (their unhandled messages) does not use
/// up the bound on what it holds for senders: with a bound of 2 and a backlog of 3 handed
/// back, senders still get 2 messages held (the third is a dead letter), and everything held
/// is handled after the lift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhandled_messages_held_by_a_fence_leave_senders_their_bound() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let tune = |c: shardik_cluster::runtime::ClusterConfig| c.stable_after(Duration::from_secs(20));
    let bound = settings().buffer_limit(2);
    let nodes = cluster_set(3, 12, &reg, Some(&faults), &|t| t, &tune, &bound).await;
    let (busy, other) = two_on_n2(&nodes).await;
    let region = &nodes[2].region;
    fence_n2_while_gated(&nodes, &faults, &reg, &busy, 3).await;
    // Its current message done, the force-stopped entity hands its backlog back.
    reg.gate.open();
    poll("the backlog handed back", Duration::from_secs(5), || {
        region.stats().buffered_messages == 3
    })
    .await;
    for seq in 0..3 {
        region.tell(&other, Msg::Add { sender: 9, seq });
    }
    assert_eq!(region.stats().buffered_messages, 5, "two of the three held");
    faults.heal_all();
    wait_state(&nodes[2].cluster, "n2 unfenced", |s| !s.fenced).await;
    poll("everything held handled", Duration::from_secs(20), || {
        handled(&reg, &busy) == 4 && handled(&reg, &other) == 2
    })
    .await;
    reg.assert_stream(&busy, &[9], 4);
    reg.assert_stream(&other, &[9], 2);
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// The bound on what a fenced node holds for senders is per shard, as `buffer_limit` says:
/// with a bound of 2, three messages to each of two entities of two shards hosted there leave
/// two held for each (the third of each a dead letter, counted as rejected), and both pairs
/// are handled after the lift. (Before 2026-11-29 the bound was the region's: two held in
/// all, for whichever shard was sent to first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_holds_up_to_the_buffer_limit_per_shard() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let tune = |c: shardik_cluster::runtime::ClusterConfig| c.stable_after(Duration::from_secs(20));
    let bound = settings().buffer_limit(2);
    let nodes = cluster_set(3, 12, &reg, Some(&faults), &|t| t, &tune, &bound).await;
    let region = &nodes[2].region;
    let (a, b) = two_shards_on_n2(&nodes).await;
    for peer in ["n0", "n1"] {
        faults.cut_both("n2", peer);
    }
    wait_state(&nodes[2].cluster, "n2 fenced", |s| s.fenced).await;
    // The region takes the fence in on its own task, stopping the entities `where_is` started.
    poll(
        "the fence stopped n2's entities",
        Duration::from_secs(5),
        || {
            let s = region.stats();
            s.active_entities == 0 && s.stopping_entities == 0
        },
    )
    .await;
    let rejected = region.stats().rejected_total;
    for id in [&a, &b] {
        for seq in 0..3 {
            region.tell(id, Msg::Add { sender: 9, seq });
        }
    }
    let s = region.stats();
    assert_eq!(s.buffered_messages, 4, "two held per shard");
    assert_eq!(s.rejected_total - rejected, 2, "the third of each refused");
    faults.heal_all();
    wait_state(&nodes[2].cluster, "n2 unfenced", |s| !s.fenced).await;
    poll("everything held handled", Duration::from_secs(20), || {
        handled(&reg, &a) == 2 && handled(&reg, &b) == 2
    })
    .await;
    reg.assert_stream(&a, &[9], 2);
    reg.assert_stream(&b, &[9], 2);
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// Two entity ids (of e00..e99) hosted on n2, in two different shards.
async fn two_shards_on_n2(nodes: &[Node]) -> (String, String) {
    let region = &nodes[2].region;
    let mut first: Option<String> = None;
    for i in 0..100 {
        let id = format!("e{i:02}");
        if where_is(&nodes[0], &id).await != "n2" {
            continue;
        }
        match &first {
            None => first = Some(id),
            Some(f) if region.shard_of(f) != region.shard_of(&id) => return (f.clone(), id),
            Some(_) => {}
        }
    }
    panic!("no two of e00..e99 in two shards on n2");
}

/// Has `busy` (hosted on n2) start a message from sender 9 (seq 0) that waits on the
/// registry's gate, waits until it works on it, queues `backlog` more (seqs 1..), then cuts
/// n2 off from the others and waits until n2 is fenced.
async fn fence_n2_while_gated(
    nodes: &[Node],
    faults: &FaultInjector,
    reg: &Registry,
    busy: &str,
    backlog: u64,
) {
    nodes[2].region.tell(
        busy,
        Msg::Slow {
            sender: 9,
            seq: 0,
            ms: u64::MAX,
        },
    );
    poll("the busy entity works", Duration::from_secs(5), || {
        reg.slow_started.lock().contains(busy)
    })
    .await;
    for seq in 1..=backlog {
        nodes[2].region.tell(busy, Msg::Add { sender: 9, seq });
    }
    for peer in ["n0", "n1"] {
        faults.cut_both("n2", peer);
    }
    wait_state(&nodes[2].cluster, "n2 fenced", |s| s.fenced).await;
    // The region takes the fence in on its own task: `busy` is told to stop once it has
    // (`stats` takes the region's lock, which the fence holds until it has stopped every
    // hosted shard's entities, so a count seen here means the forced stops were issued).
    poll(
        "the busy entity told to stop",
        Duration::from_secs(5),
        || nodes[2].region.stats().stopping_entities >= 1,
    )
    .await;
}

/// Two entity ids (of e00..e99) hosted on n2.
async fn two_on_n2(nodes: &[Node]) -> (String, String) {
    let mut on_n2: Vec<String> = Vec::new();
    for i in 0..100 {
        let id = format!("e{i:02}");
        if where_is(&nodes[0], &id).await == "n2" {
            on_n2.push(id);
        }
        if on_n2.len() == 2 {
            return (on_n2.remove(0), on_n2.remove(0));
        }
    }
    panic!("fewer than two of e00..e99 on n2");
}

/// The id of an entity hosted on node `name` (asked through `via`).
async fn entity_on(via: &Node, name: &str) -> String {
    for i in 0..100 {
        let id = format!("e{i}");
        if where_is(via, &id).await == name {
            return id;
        }
    }
    panic!("no entity of e0..e99 is hosted on {name}");
}

/// Messages `busy` (hosted on n2) handled so far.
fn handled(reg: &Registry, busy: &str) -> usize {
    reg.journal.lock().get(busy).map_or(0, Vec::len)
}

/// Gives `busy` (hosted on n2) a backlog of `n` messages of `ms` each, waits until it works on
/// them, then cuts n2 off from the others and waits until n2 is fenced.
async fn fence_n2_while_busy(
    nodes: &[Node],
    faults: &FaultInjector,
    reg: &Registry,
    busy: &str,
    n: u64,
    ms: u64,
) {
    for seq in 0..n {
        nodes[2].region.tell(busy, Msg::Slow { sender: 9, seq, ms });
    }
    poll("the busy entity works", Duration::from_secs(5), || {
        handled(reg, busy) > 0
    })
    .await;
    for other in ["n0", "n1"] {
        faults.cut_both("n2", other);
    }
    wait_state(&nodes[2].cluster, "n2 fenced", |s| s.fenced).await;
}

/// Moves one shard, once armed, from wherever it is to one region: deterministic in its
/// arguments once armed (the test arms it once, before the move it asks for). Clones share
/// the switch.
#[derive(Clone, Debug, Default)]
struct MoveWhenArmed(Arc<parking_lot::Mutex<Option<(shardik_sharding::ShardId, RegionId)>>>);

impl AllocationStrategy for MoveWhenArmed {
    fn name(&self) -> &str {
        "move-when-armed"
    }

    fn allocate(
        &self,
        shard: shardik_sharding::ShardId,
        requester: Option<&RegionId>,
        view: &AllocationView<'_>,
    ) -> Option<RegionId> {
        LeastShards.allocate(shard, requester, view)
    }

    fn rebalance(&self, view: &AllocationView<'_>, _limit: usize) -> Vec<Move> {
        let Some((shard, to)) = self.0.lock().clone() else {
            return Vec::new();
        };
        view.regions
            .iter()
            .find(|(r, shards)| **r != to && shards.contains(&shard))
            .map(|(from, _)| Move {
                shard,
                from: from.clone(),
                to,
            })
            .into_iter()
            .collect()
    }
}

/// A node fenced while one of its shards is being handed off (the hand-off has begun, its
/// entities still run here) keeps a stopped entity's unhandled messages ahead of the newer
/// ones it holds for the same entity: a peer's older messages waited in the entity's
/// mailbox, its newer ones reached the fenced node behind them, and after the lift and the
/// move every sender's messages were handled once each, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_during_a_hand_off_keeps_unhandled_messages_ahead_of_newer_held_ones() {
    let faults = FaultInjector::new();
    let reg = Arc::new(Registry::default());
    let tune = |c: shardik_cluster::runtime::ClusterConfig| c.stable_after(Duration::from_secs(30));
    let strategy = MoveWhenArmed::default();
    let mut set = settings()
        .rebalance_interval(Duration::from_millis(100))
        .allocation_strategy(strategy.clone());
    // The hand-off waits for the fenced node's acknowledgement instead of being aborted.
    set.handoff_ack_timeout = Duration::from_secs(60);
    let nodes = cluster_set(3, 12, &reg, Some(&faults), &|t| t, &tune, &set).await;
    let coordinator = nodes[0].sharding.coordinator(TYPE).expect("n0 coordinates");
    let n0 = coordinator
        .state
        .regions
        .keys()
        .find(|r| r.0.contains("#n0#"))
        .expect("n0's region")
        .clone();
    let (busy, other) = two_on_n2(&nodes).await;
    let shard = shardik_sharding::shard_of(&busy, 12);
    let (r0, r1, r2) = (&nodes[0].region, &nodes[1].region, &nodes[2].region);
    // n1 routes to n2 for the shard, so the hand-off waits for n1's fence too.
    r1.tell(&busy, Msg::Add { sender: 8, seq: 0 });
    poll("n1's message handled", Duration::from_secs(5), || {
        handled(&reg, &busy) == 1
    })
    .await;
    r2.tell(
        &busy,
        Msg::Slow {
            sender: 9,
            seq: 0,
            ms: u64::MAX,
        },
    );
    poll("the busy entity works", Duration::from_secs(5), || {
        reg.slow_started.lock().contains(&busy)
    })
    .await;
    // Older messages in busy's mailbox: n0's (sender 7) and n2's own (sender 9). n0's message
    // to `other` follows n0's on the same connection: once handled, they were delivered.
    for seq in 0..3 {
        r0.tell(&busy, Msg::Add { sender: 7, seq });
    }
    r0.tell(&other, Msg::Add { sender: 7, seq: 0 });
    poll(
        "n0's older messages delivered",
        Duration::from_secs(5),
        || handled(&reg, &other) == 1,
    )
    .await;
    for seq in 1..=3 {
        r2.tell(&busy, Msg::Add { sender: 9, seq });
    }
    // Newer messages from n0, and both peers' fences later, held at n2 until released.
    faults.hold("n0", "n2", Lane::User);
    faults.hold("n1", "n2", Lane::User);
    for seq in 3..6 {
        r0.tell(&busy, Msg::Add { sender: 7, seq });
    }
    *strategy.0.lock() = Some((shard, n0));
    // Once the hand-off has begun at n2, n2's own messages for the shard wait for its next
    // home instead of going to the entity.
    let mut next9 = 4;
    poll("the hand-off began at n2", Duration::from_secs(10), || {
        if r2.stats().buffered_messages > 0 {
            return true;
        }
        r2.tell(
            &busy,
            Msg::Add {
                sender: 9,
                seq: next9,
            },
        );
        next9 += 1;
        false
    })
    .await;
    let waiting = r2.stats().buffered_messages;
    // n2 hears from nobody: it fences itself, the hand-off still under way.
    faults.hold("n2", "n0", Lane::Control);
    faults.hold("n2", "n1", Lane::Control);
    wait_state(&nodes[2].cluster, "n2 fenced", |s| s.fenced).await;
    poll(
        "the busy entity told to stop",
        Duration::from_secs(5),
        || r2.stats().stopping_entities >= 1,
    )
    .await;
    // n0's newer messages arrive while fenced (n1's fence stays held, so the hand-off does
    // not move on to stopping the shard): held.
    faults.release("n0", "n2", Lane::User);
    poll("n0's newer messages held", Duration::from_secs(5), || {
        r2.stats().buffered_messages == waiting + 3
    })
    .await;
    // Its message done, the busy entity stops and hands back its mailbox: ahead of them.
    reg.gate.open();
    poll("the mailbox handed back", Duration::from_secs(5), || {
        r2.stats().buffered_messages >= waiting + 3 + 6
    })
    .await;
    // The hand-off still runs (the coordinator has not aborted it for a missing
    // acknowledgement): n2 handed the mailbox back while handing the shard off.
    let running = nodes[0].sharding.coordinator(TYPE).expect("n0 coordinates");
    assert_eq!(running.handoffs, 1, "the hand-off was aborted");
    faults.heal_all();
    wait_state(&nodes[2].cluster, "n2 unfenced", |s| !s.fenced).await;
    poll("the shard moved to n0", Duration::from_secs(20), || {
        nodes[0].hosted().contains(&shard) && !nodes[2].hosted().contains(&shard)
    })
    .await;
    for seq in 6..9 {
        r0.tell(&busy, Msg::Add { sender: 7, seq });
    }
    for seq in 1..4 {
        r1.tell(&busy, Msg::Add { sender: 8, seq });
    }
    for seq in next9..next9 + 3 {
        r2.tell(&busy, Msg::Add { sender: 9, seq });
    }
    let total = 9 + 4 + (next9 as usize + 3);
    poll("every message handled", Duration::from_secs(20), || {
        handled(&reg, &busy) >= total
    })
    .await;
    reg.assert_stream(&busy, &[7], 9);
    reg.assert_stream(&busy, &[8], 4);
    reg.assert_stream(&busy, &[9], next9 + 3);
    assert_eq!(
        reg.homes.lock()[&busy].last().map(String::as_str),
        Some("n0")
    );
    reg.assert_single_writer();
    stop_all(&nodes).await;
}
