//! Down all when unstable: a crashed member stays unreachable while links between the others
//! keep breaking and healing, one after another, so the reachability picture never holds
//! still for `stable_after` and the resolver never decides. Without a bound the crashed member would
//! never be downed (its work would stay stranded for as long as the links flap); with
//! `down_all_when_unstable` (off by default) every member is downed `stable_after` plus the
//! bound after the crash was first flagged.

mod sim;

use shardik_cluster::downing::DowningConfig;
use shardik_cluster::member::MemberStatus;
use sim::{overlaps, uid, Sim};

/// Four nodes up; node 3 crashes; then the links among 0, 1 and 2 break in turn (0-1, 1-2,
/// 0-2, 0-1, ...), a new one every 1.5 s, each healing 3 s after it broke, for
/// `flapping_ms`: a new flag or a cleared one every 2.5 s at most, so the tests decide
/// after 5 s of stability (`downing` gets that `stable_after`). Returns the simulation and when node 3 was first flagged.
fn crash_while_a_link_flaps(downing: DowningConfig, flapping_ms: u64) -> (Sim, u64) {
    let downing = DowningConfig {
        stable_after: STABLE_AFTER,
        ..downing
    };
    let mut sim = Sim::new();
    for i in 0..4 {
        let mut config = Sim::config(uid(i, 1));
        config.downing = downing.clone();
        sim.start_with(config);
    }
    let ids: Vec<_> = (0..4).map(|i| uid(i, 1)).collect();
    sim.run_until(20_000, "cluster up", |s| s.all_up(&[0, 1, 2, 3], &ids));
    sim.run_for(1_000);
    sim.crash(3);
    let crashed = sim.now;
    let mut flagged_at = None;
    let links = [(0, 1), (1, 2), (0, 2)];
    let mut step = 0;
    while sim.now < crashed + flapping_ms {
        // Every 1.5 s the next link breaks and the one broken 3 s ago heals: each stays
        // broken long enough to be flagged (about 2.5 s), and flags come and go in turn.
        let (a, b) = links[step % links.len()];
        sim.cut(&[a], &[b]);
        if step >= 2 {
            let (a, b) = links[(step - 2) % links.len()];
            sim.heal_between(&[a], &[b]);
        }
        step += 1;
        let until = sim.now + 1_500;
        while sim.now < until {
            sim.step();
            if flagged_at.is_none()
                && sim
                    .alive()
                    .any(|n| n.node.gossip().unreachable_members().contains(&uid(3, 1)))
            {
                flagged_at = Some(sim.now);
            }
            assert_eq!(overlaps(&sim, 4), [], "at {} ms", sim.now);
        }
    }
    sim.heal();
    (sim, flagged_at.expect("the crashed node was flagged"))
}

/// Longer than the longest the schedule below leaves the picture unchanged.
const STABLE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

#[test]
fn every_member_is_downed_when_the_picture_never_holds_still() {
    let downing = DowningConfig {
        down_all_when_unstable: Some(std::time::Duration::from_secs(4)),
        ..DowningConfig::default()
    };
    let bound = STABLE_AFTER + downing.down_all_when_unstable.unwrap();
    let (sim, flagged_at) = crash_while_a_link_flaps(downing, 20_000);
    let stopped: Vec<u64> = (0..3)
        .map(|i| {
            sim.node(i)
                .shutdown_at
                .unwrap_or_else(|| panic!("node {i} still runs at {} ms", sim.now))
        })
        .collect();
    for (i, at) in stopped.iter().enumerate() {
        // The bound, plus a tick and the gossip that carries the decision.
        assert!(
            *at >= flagged_at + bound.as_millis() as u64,
            "node {i} stopped at {at} ms, before the bound ({flagged_at} + {bound:?})"
        );
        assert!(
            *at <= flagged_at + bound.as_millis() as u64 + 2_000,
            "node {i} stopped at {at} ms, long after the bound ({flagged_at} + {bound:?})"
        );
    }
}

#[test]
fn without_the_bound_the_crashed_member_is_never_downed_while_the_link_flaps() {
    let downing = DowningConfig {
        down_all_when_unstable: None,
        ..DowningConfig::default()
    };
    let (sim, _) = crash_while_a_link_flaps(downing, 20_000);
    for i in 0..3 {
        assert!(sim.node(i).alive, "node {i} stopped");
        assert_eq!(
            sim.status(i, &uid(3, 1)),
            Some(MemberStatus::Up),
            "node {i} saw the crashed node downed: the picture held still after all"
        );
        assert!(sim
            .node(i)
            .node
            .gossip()
            .unreachable_members()
            .contains(&uid(3, 1)));
    }
}
