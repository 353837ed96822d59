//! Removed incarnations are kept as tombstones for `prune_tombstones_after`, then the leader
//! drops them and every node takes that state: a cluster that restarts its processes does
//! not grow its gossip for good, and no version churns once the tombstones are gone.

mod sim;

use std::collections::BTreeMap;
use std::time::Duration;

use shardik_cluster::member::UniqueAddress;
use shardik_cluster::node::NodeConfig;
use sim::{uid, Sim};

/// How long tombstones are kept in these tests.
const TTL: u64 = 20_000;
/// Wall-clock time at sim time 0 on node 0.
const ORIGIN: u64 = 1_800_000_000_000;

/// How far each node's clock is ahead of node 0's (the leader's): node 3's is behind by more
/// than half of `TTL`, so it merges the dropped tombstones back in for a while.
const SKEW: [i64; 5] = [0, 700, 1_400, -12_000, 2_800];

fn config(i: usize, inc: u64) -> NodeConfig {
    let mut c = Sim::config(uid(i, inc));
    c.prune_tombstones_after = Duration::from_millis(TTL);
    c.wall_clock_origin_ms = ORIGIN.saturating_add_signed(SKEW[i]);
    c
}

fn tombstones(sim: &Sim, i: usize) -> BTreeMap<UniqueAddress, u64> {
    sim.node(i).node.gossip().tombstones().clone()
}

#[test]
fn tombstones_are_kept_for_their_time_then_dropped_everywhere_without_churn() {
    let mut sim = Sim::new();
    for i in 0..5 {
        sim.start_with(config(i, 1));
    }
    let mut current: Vec<UniqueAddress> = (0..5).map(|i| uid(i, 1)).collect();
    let all = [0, 1, 2, 3, 4];
    sim.run_until(20_000, "cluster up", |s| s.all_up(&all, &current));
    let stale = sim.node(1).node.gossip().clone();

    // Four restarts: node 4 three times, node 3 once.
    for (i, inc) in [(4, 2), (4, 3), (3, 2), (4, 4)] {
        sim.crash(i);
        sim.start_with(config(i, inc));
        current[i] = uid(i, inc);
        sim.run_until(20_000, "restarted node up", |s| s.all_up(&all, &current));
    }
    let removed = [uid(4, 1), uid(4, 2), uid(4, 3), uid(3, 1)];
    sim.run_until(5_000, "every node holds every tombstone", |s| {
        all.iter().all(|&i| {
            removed
                .iter()
                .all(|r| s.node(i).node.gossip().is_tombstoned(r))
        })
    });
    // Stamped once, by the leader (node 0), with its clock; every node holds the same times.
    let times = tombstones(&sim, 0);
    assert_eq!(times.len(), 4, "{times:?}");
    for i in all {
        assert_eq!(tombstones(&sim, i), times, "node {i}");
    }
    for at in times.values() {
        assert!((ORIGIN..=ORIGIN + sim.now).contains(at), "{at}");
    }

    // Nothing is dropped before its time on the leader's clock...
    let first = *times.values().min().unwrap();
    let last = *times.values().max().unwrap();
    sim.run_for((first + TTL - ORIGIN - 100).saturating_sub(sim.now));
    for i in all {
        assert_eq!(tombstones(&sim, i).len(), 4, "node {i} dropped early");
    }
    // ... and after it, the leader drops them. Node 3, whose clock is 12 s behind, finds
    // them younger than half of `TTL` and merges them back in, until its clock has caught up
    // (2 s on the leader's clock); then every node takes the leader's state without them.
    sim.run_until(TTL, "the leader dropped them", |s| {
        tombstones(s, 0).is_empty()
    });
    let dropped = sim.now;
    let mut came_back = false;
    while !all.iter().all(|&i| tombstones(&sim, i).is_empty()) {
        assert!(sim.now - dropped <= TTL, "not dropped everywhere");
        sim.step();
        came_back |= !tombstones(&sim, 0).is_empty();
    }
    assert!(came_back, "node 3 never merged them back");
    assert!(
        sim.now + ORIGIN <= last + TTL + 2_000 + 3_000,
        "dropped late: {} ms after the last one's time",
        sim.now + ORIGIN - last - TTL
    );
    assert!(sim.all_up(&all, &current));

    // No churn: with nothing happening, no node makes a new version.
    let versions: Vec<_> = all
        .iter()
        .map(|&i| sim.node(i).node.gossip().version().clone())
        .collect();
    sim.run_for(10_000);
    for i in all {
        assert_eq!(
            sim.node(i).node.gossip().version(),
            &versions[i],
            "node {i}"
        );
    }

    // A state from before the restarts, gossiped again: older than every node's, so the
    // removed incarnations do not come back although their tombstones are gone.
    for to in all {
        sim.inject_gossip(uid(1, 1), to, stale.clone());
    }
    sim.run_for(5_000);
    assert!(sim.all_up(&all, &current));
    for i in all {
        assert!(tombstones(&sim, i).is_empty(), "node {i}");
    }
}
