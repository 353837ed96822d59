//! The failures peers shipped with failure detection (protocols.md): one node's detector
//! alone downed peers, and a burst of traffic that starved heartbeats downed a healthy
//! two-node cluster for good. Here a detector only flags; downing needs the split brain
//! resolver on the leader after `stable-after`, and pauses within the tolerance flag nothing.

mod sim;

use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use sim::{uid, Sim};

fn any_down(sim: &Sim, nodes: &[usize]) -> bool {
    nodes.iter().any(|v| {
        sim.events_of(*v)
            .iter()
            .any(|e| matches!(e, ClusterEvent::MemberDowned(_)))
    })
}

#[test]
fn heartbeat_gap_within_acceptable_pause_flags_nothing() {
    let (mut sim, _) = Sim::cluster(2);
    sim.run_for(10_000);
    // both directions starved for 1.5 s (the acceptable pause), gossip still flows
    sim.starve_heartbeats(0, 1);
    sim.starve_heartbeats(1, 0);
    sim.run_for(1_500);
    sim.heal();
    sim.run_for(10_000);
    for v in [0, 1] {
        assert!(!sim
            .events_of(v)
            .iter()
            .any(|e| matches!(e, ClusterEvent::Unreachable(_))));
    }
    assert!(!any_down(&sim, &[0, 1]));
}

#[test]
fn starved_heartbeats_that_recover_before_stable_after_down_nobody() {
    let (mut sim, _) = Sim::cluster(2);
    sim.run_for(10_000);
    sim.starve_heartbeats(0, 1);
    sim.starve_heartbeats(1, 0);
    sim.run_until(5_000, "flagged", |s| {
        !s.node(0).node.gossip().unreachable_members().is_empty()
    });
    // one observer's detector flagged the peer: nobody is down yet
    assert!(!any_down(&sim, &[0, 1]));
    sim.run_for(1_000); // < stable-after (2 s)
    sim.heal();
    sim.run_until(5_000, "reachable again", |s| {
        [0, 1]
            .iter()
            .all(|v| s.node(*v).node.gossip().unreachable_members().is_empty())
    });
    sim.run_for(10_000);
    assert!(!any_down(&sim, &[0, 1]));
    assert!(sim.all_up(&[0, 1], &[uid(0, 1), uid(1, 1)]));
}

#[test]
fn one_sided_flag_is_not_a_verdict_until_stable_and_applied_by_the_leader() {
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(5_000);
    // only node 1 stops hearing node 2 (heartbeats lost one way); gossip still flows
    sim.starve_heartbeats(2, 1);
    let t = sim.run_until(5_000, "node 1 flags node 2", |s| {
        s.node(1)
            .node
            .gossip()
            .reachability()
            .is_unreachable_by(&uid(1, 1), &uid(2, 1))
    });
    assert!(t >= 1_500);
    // the flag spreads, but within stable-after nobody is downed by it
    sim.run_for(1_500);
    assert!(!any_down(&sim, &[0, 1, 2]));
    assert_eq!(sim.status(0, &uid(2, 1)), Some(MemberStatus::Up));
}
