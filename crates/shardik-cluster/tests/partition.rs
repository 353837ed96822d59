//! Partitions: a 2|3 split ends with the minority down and stopped and the majority going on;
//! a short split heals without anyone downed; both sides never keep going.

mod sim;

use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use sim::{uid, Sim};

fn downed_count(sim: &Sim, v: usize) -> usize {
    sim.events_of(v)
        .iter()
        .filter(|e| matches!(e, ClusterEvent::MemberDowned(_)))
        .count()
}

#[test]
fn partition_2_3_minority_downs_itself_majority_removes_it() {
    let (mut sim, _) = Sim::cluster(5);
    sim.run_for(1_000);
    let start = sim.now;
    sim.cut(&[0, 1], &[2, 3, 4]);
    sim.run_until(10_000, "minority stopped", |s| {
        !s.node(0).alive && !s.node(1).alive
    });
    // Each member of the losing side downs itself when it leads what is left of that side
    // (a fenced node downs no other), so node 1 follows node 0 one `stable_after` later;
    // both were fenced long before.
    for (v, within) in [(0, 6_000), (1, 9_000)] {
        let n = sim.node(v);
        assert_eq!(n.node.status(), Some(MemberStatus::Down), "node {v}");
        let took = n.shutdown_at.unwrap() - start;
        assert!(took < within, "node {v} stopped after {took} ms");
        assert!(n
            .events
            .iter()
            .any(|(t, e)| matches!(e, ClusterEvent::Fenced) && t - start < 2_100));
    }
    let majority = [2, 3, 4];
    sim.run_until(10_000, "minority removed by the majority", |s| {
        majority
            .iter()
            .all(|v| s.status(*v, &uid(0, 1)).is_none() && s.status(*v, &uid(1, 1)).is_none())
    });
    let ids: Vec<_> = majority.iter().map(|i| uid(*i, 1)).collect();
    assert!(sim.all_up(&majority, &ids));
    for v in majority {
        assert!(sim.node(v).alive);
        assert_eq!(
            sim.node(v).node.gossip().leader(&uid(v, 1)),
            Some(uid(2, 1))
        );
        assert_eq!(downed_count(&sim, v), 2);
    }

    // Heal: the stopped minority stays out; restarted as new incarnations they join again.
    sim.heal();
    sim.run_for(3_000);
    assert!(sim.all_up(&majority, &ids));
    sim.start(0, 2);
    sim.start(1, 2);
    let all: Vec<_> = vec![uid(0, 2), uid(1, 2), uid(2, 1), uid(3, 1), uid(4, 1)];
    sim.run_until(15_000, "all five up again", |s| {
        s.all_up(&[0, 1, 2, 3, 4], &all)
    });
}

#[test]
fn both_sides_of_a_partition_never_keep_going() {
    // Every split of 4 nodes, including the 2|2 tie: exactly one side survives.
    for side in [
        vec![0],
        vec![1],
        vec![0, 1],
        vec![0, 3],
        vec![1, 2],
        vec![0, 1, 2],
    ] {
        let (mut sim, _) = Sim::cluster(4);
        let other: Vec<usize> = (0..4).filter(|i| !side.contains(i)).collect();
        sim.cut(&side, &other);
        sim.run_for(15_000);
        let side_alive = side.iter().all(|i| sim.node(*i).alive);
        let other_alive = other.iter().all(|i| sim.node(*i).alive);
        let side_dead = side.iter().all(|i| !sim.node(*i).alive);
        let other_dead = other.iter().all(|i| !sim.node(*i).alive);
        assert!(
            (side_alive && other_dead) || (side_dead && other_alive),
            "split {side:?}|{other:?}: alive {:?}",
            (0..4).map(|i| sim.node(i).alive).collect::<Vec<_>>()
        );
        // keep-majority: the bigger side, or on a tie the side with the lowest address
        let side_should_win =
            side.len() > other.len() || (side.len() == other.len() && side.contains(&0));
        assert_eq!(side_alive, side_should_win, "split {side:?}");
    }
}

#[test]
fn short_partition_heals_without_downing() {
    let (mut sim, _) = Sim::cluster(5);
    sim.cut(&[0, 1], &[2, 3, 4]);
    // long enough to be detected, shorter than detection + stable-after
    sim.run_until(5_000, "detected", |s| {
        !s.node(2).node.gossip().unreachable_members().is_empty()
    });
    sim.run_for(1_000);
    sim.heal();
    sim.run_until(10_000, "reachable again everywhere", |s| {
        (0..5).all(|v| s.node(v).node.gossip().unreachable_members().is_empty())
    });
    sim.run_for(5_000);
    let ids: Vec<_> = (0..5).map(|i| uid(i, 1)).collect();
    assert!(sim.all_up(&[0, 1, 2, 3, 4], &ids));
    for v in 0..5 {
        assert_eq!(downed_count(&sim, v), 0, "node {v}");
        assert!(sim
            .events_of(v)
            .iter()
            .any(|e| matches!(e, ClusterEvent::Reachable(_))));
    }
}

#[test]
fn three_way_split_without_majority_stops_everyone() {
    let (mut sim, _) = Sim::cluster(5);
    sim.cut(&[0, 1], &[2, 3, 4]);
    sim.cut(&[2, 3], &[4]);
    sim.run_for(15_000);
    for v in 0..5 {
        assert!(!sim.node(v).alive, "node {v} kept going without a majority");
    }
}

#[test]
fn joining_node_on_the_minority_side_does_not_tip_the_balance() {
    let (mut sim, _) = Sim::cluster(4);
    // nodes 5 and 6 join but are cut off with 0 before they are moved up
    sim.cut(&[0], &[1, 2, 3]);
    sim.start(5, 1);
    sim.start(6, 1);
    sim.cut(&[0, 5, 6], &[1, 2, 3]);
    sim.run_for(15_000);
    // {0 + 2 joining} vs {1, 2, 3}: 1 counted vs 3
    assert!(!sim.node(0).alive);
    for v in [1, 2, 3] {
        assert!(sim.node(v).alive, "node {v}");
        assert!(sim.status(v, &uid(0, 1)).is_none());
    }
}

#[test]
fn a_broken_link_between_two_nodes_downs_one_end_not_the_healthy_rest() {
    // 3 nodes; only the link 1 <-> 2 fails. Both flag each other while gossip still flows
    // through node 0: indirectly connected, not a partition. Counting {1, 2} as "the other
    // side" would make node 0 a minority of one and down the healthy node; instead one end of
    // the broken link (the youngest, node 2) is downed and {0, 1} go on.
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(2_000);
    sim.cut(&[1], &[2]);
    sim.run_until(15_000, "one end downed and removed", |s| {
        [0, 1].iter().all(|v| s.status(*v, &uid(2, 1)).is_none())
    });
    sim.run_for(10_000);
    assert!(sim.node(0).alive && sim.node(1).alive);
    assert!(!sim.node(2).alive);
    assert!(sim.all_up(&[0, 1], &[uid(0, 1), uid(1, 1)]));
    for v in [0, 1] {
        assert_eq!(downed_count(&sim, v), 1, "node {v}");
    }
}

#[test]
fn a_broken_link_in_five_nodes_costs_one_node() {
    let (mut sim, _) = Sim::cluster(5);
    sim.run_for(2_000);
    sim.cut(&[0], &[3]);
    sim.run_for(20_000);
    let alive: Vec<usize> = (0..5).filter(|i| sim.node(*i).alive).collect();
    assert_eq!(
        alive,
        vec![0, 1, 2, 4],
        "the youngest end of the link (3) goes"
    );
    let ids: Vec<_> = alive.iter().map(|i| uid(*i, 1)).collect();
    assert!(sim.all_up(&alive, &ids));
}

#[test]
fn heartbeats_lost_one_way_for_good_down_one_end_only() {
    // Node 2's heartbeats to node 1 are lost for good (gossip still flows): node 1's flag is
    // not a partition; one end of the link goes (node 2, the youngest), the rest stays up.
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(2_000);
    sim.starve_heartbeats(2, 1);
    sim.run_for(20_000);
    assert!(sim.node(0).alive && sim.node(1).alive);
    assert!(!sim.node(2).alive);
    assert!(sim.all_up(&[0, 1], &[uid(0, 1), uid(1, 1)]));
}
