//! Fencing: the losing side of a partition knows it at detection time, `stable_after` before
//! the winning side downs it; the winning side and the survivors of a crash are never
//! fenced; a partition that heals lifts the fence only after gossip from a majority.

mod sim;

use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use sim::{uid, Sim};

/// When node `i` was first fenced (`None`: never).
fn fenced_at(sim: &Sim, i: usize) -> Option<u64> {
    sim.node(i)
        .events
        .iter()
        .find(|(_, e)| matches!(e, ClusterEvent::Fenced))
        .map(|(t, _)| *t)
}

/// When node `viewer` first saw `subject` (incarnation 1) downed.
fn downed_at(sim: &Sim, viewer: usize, subject: usize) -> Option<u64> {
    sim.node(viewer)
        .events
        .iter()
        .find(|(_, e)| matches!(e, ClusterEvent::MemberDowned(m) if m.node == uid(subject, 1)))
        .map(|(t, _)| *t)
}

#[test]
fn minority_is_fenced_long_before_the_majority_downs_it() {
    let (mut sim, _) = Sim::cluster(5);
    sim.run_for(1_000);
    let cut = sim.now;
    sim.cut(&[0, 1], &[2, 3, 4]);
    sim.run_until(10_000, "majority downed the minority", |s| {
        [2, 3, 4].iter().all(|v| {
            s.status(*v, &uid(0, 1)) == Some(MemberStatus::Down)
                && s.status(*v, &uid(1, 1)) == Some(MemberStatus::Down)
        })
    });
    let first_down = (2..5)
        .flat_map(|v| [downed_at(&sim, v, 0), downed_at(&sim, v, 1)])
        .map(|t| t.expect("downed"))
        .min()
        .unwrap();
    for v in [0, 1] {
        let f = fenced_at(&sim, v).expect("minority node fenced");
        assert!(f > cut, "fenced before the cut");
        // Silent for `fence_after` (1.5 s) plus up to a heartbeat interval and a step.
        assert!(
            f - cut <= 2_100,
            "node {v} fenced {} ms after the cut",
            f - cut
        );
        // The resolver waits `stable_after` (2 s) after the last change; the minority needs
        // no wait, so it is fenced well before (detection skew is a heartbeat or two).
        assert!(
            first_down >= f + 1_500,
            "node {v} fenced at {f}, first down at {first_down}"
        );
    }
    for v in [2, 3, 4] {
        assert_eq!(fenced_at(&sim, v), None, "majority node {v} fenced");
        assert!(!sim.node(v).node.is_fenced());
    }
}

#[test]
fn survivors_of_a_crash_are_never_fenced() {
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(1_000);
    sim.crash(2);
    sim.run_until(10_000, "crashed node downed", |s| {
        s.status(0, &uid(2, 1)) == Some(MemberStatus::Down)
    });
    sim.run_for(2_000);
    for v in [0, 1] {
        assert_eq!(fenced_at(&sim, v), None, "survivor {v} fenced");
    }
}

#[test]
fn healed_partition_lifts_the_fence_after_gossip_from_a_majority() {
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(1_000);
    sim.cut(&[0], &[1, 2]);
    sim.run_until(5_000, "isolated node fenced", |s| {
        s.node(0).node.is_fenced()
    });
    // Heal before the majority's resolver decides (it waits `stable_after` after its own
    // detection, which came at about the same time).
    sim.heal();
    let lifted = sim.run_until(5_000, "fence lifted", |s| !s.node(0).node.is_fenced());
    assert!(lifted > 0, "lifted without any gossip");
    let unfenced = sim
        .node(0)
        .events
        .iter()
        .any(|(_, e)| matches!(e, ClusterEvent::Unfenced));
    assert!(unfenced);
    sim.run_for(5_000);
    let ids: Vec<_> = (0..3).map(|i| uid(i, 1)).collect();
    assert!(sim.all_up(&[0, 1, 2], &ids), "nobody downed");
    assert!((0..3).all(|v| !sim.node(v).node.is_fenced()));
}

#[test]
fn isolated_node_with_a_partial_ring_is_fenced() {
    // 12 nodes, each watched by 9: node 0's own flags cover only the peers it watches, so
    // the resolver's view alone would let it "win"; losing most of them fences it.
    let (mut sim, _) = Sim::cluster(12);
    sim.run_for(1_000);
    let rest: Vec<usize> = (1..12).collect();
    sim.cut(&[0], &rest);
    sim.run_until(6_000, "isolated node fenced", |s| {
        s.node(0).node.is_fenced()
    });
    for v in rest {
        assert!(!sim.node(v).node.is_fenced(), "node {v} fenced");
    }
}

#[test]
fn two_nodes_only_the_tie_breaks_loser_is_fenced() {
    // Keep-majority on a 1|1 tie keeps the side with the lowest address (node 0).
    let (mut sim, _) = Sim::cluster(2);
    sim.run_for(1_000);
    sim.cut(&[0], &[1]);
    sim.run_until(6_000, "node 1 fenced", |s| s.node(1).node.is_fenced());
    sim.run_for(5_000);
    assert_eq!(fenced_at(&sim, 0), None);
    assert!(!sim.node(1).alive, "node 1 downed itself");
}

#[test]
fn node_that_can_hear_but_not_speak_is_fenced_before_it_is_downed() {
    // Node 0's frames to the others are lost; theirs reach it. It hears every heartbeat, so
    // only the others' flags (arriving by gossip) can tell it that it is cut off.
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(1_000);
    sim.cut_one_way(&[0], &[1, 2]);
    sim.run_until(15_000, "node 0 stopped", |s| !s.node(0).alive);
    let f = fenced_at(&sim, 0).expect("node 0 fenced");
    let first_down = [1, 2]
        .iter()
        .filter_map(|v| downed_at(&sim, *v, 0))
        .min()
        .expect("downed");
    // The flags reach it with the next gossip round (1 s), before the decision (2 s).
    assert!(
        first_down >= f + 1_000,
        "fenced at {f}, downed at {first_down}"
    );
    for v in [1, 2] {
        assert_eq!(fenced_at(&sim, v), None, "node {v} fenced");
    }
}

#[test]
fn node_that_can_speak_but_not_hear_is_fenced_before_it_is_downed() {
    // The others' frames to node 0 are lost; its own reach them. It hears nobody: silent
    // peers fence it; its flags of the others reach them and the broken links cost it.
    let (mut sim, _) = Sim::cluster(3);
    sim.run_for(1_000);
    let cut = sim.now;
    sim.cut_one_way(&[1, 2], &[0]);
    sim.run_until(15_000, "majority downed node 0", |s| {
        [1, 2]
            .iter()
            .all(|v| s.status(*v, &uid(0, 1)) == Some(MemberStatus::Down))
    });
    let f = fenced_at(&sim, 0).expect("node 0 fenced");
    assert!(f - cut <= 2_100, "fenced {} ms after the cut", f - cut);
    let first_down = [1, 2]
        .iter()
        .filter_map(|v| downed_at(&sim, *v, 0))
        .min()
        .expect("downed");
    assert!(
        first_down >= f + 1_500,
        "fenced at {f}, downed at {first_down}"
    );
    // While node 0's flags arrive one by one, a flagged node may be the end of a broken link
    // the resolver would down (briefly fenced, never downed); once node 0 is down, both are
    // hosting again.
    sim.run_until(5_000, "majority not fenced", |s| {
        [1, 2].iter().all(|v| !s.node(*v).node.is_fenced())
    });
    let ids = [uid(1, 1), uid(2, 1)];
    sim.run_until(10_000, "majority up without node 0", |s| {
        s.all_up(&[1, 2], &ids)
    });
}
