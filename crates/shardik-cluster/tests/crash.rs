//! A crashed node (no goodbye) becomes unreachable, is downed by the split brain resolver
//! (keep-majority) and removed, within the configured times.

mod sim;

use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use sim::{uid, Sim};

#[test]
fn crashed_node_becomes_unreachable_then_down_then_removed() {
    let (mut sim, _) = Sim::cluster(5);
    sim.run_for(2_000);
    let crashed_at = sim.now;
    sim.crash(3);
    let survivors = [0, 1, 2, 4];
    let dead = uid(3, 1);
    let unreachable = sim.run_until(5_000, "unreachable", |s| {
        survivors.iter().all(|v| {
            s.node(*v)
                .node
                .gossip()
                .unreachable_members()
                .contains(&dead)
        })
    });
    // detection: last heartbeat at most 500 ms before the crash, phi 8 with a 1.5 s pause
    assert!(
        (1_500..=3_500).contains(&unreachable),
        "unreachable after {unreachable} ms"
    );
    let down = sim.run_until(5_000, "down on all survivors", |s| {
        survivors
            .iter()
            .all(|v| s.status(*v, &dead) != Some(MemberStatus::Up))
    });
    let to_down = sim.now - crashed_at;
    eprintln!("crash: unreachable after {unreachable} ms, Down after {to_down} ms");
    assert!(to_down < 5_500, "crash to Down took {to_down} ms");
    assert!(down >= 1_500, "downed before stable-after could pass");
    sim.run_until(5_000, "removed everywhere", |s| {
        survivors.iter().all(|v| s.status(*v, &dead).is_none())
    });
    let ids: Vec<_> = survivors.iter().map(|i| uid(*i, 1)).collect();
    assert!(sim.all_up(&survivors, &ids));
    for v in survivors {
        let ev = sim.events_of(v);
        let at = |f: &dyn Fn(&ClusterEvent) -> bool| ev.iter().position(f);
        let u = at(&|e| *e == ClusterEvent::Unreachable(dead.clone())).unwrap();
        let d = at(&|e| matches!(e, ClusterEvent::MemberDowned(m) if m.node == dead)).unwrap();
        let r = at(&|e| matches!(e, ClusterEvent::MemberRemoved { node, .. } if *node == dead))
            .unwrap();
        assert!(u < d && d < r, "order on {v}: {ev:?}");
        // no false downs of live nodes
        assert_eq!(
            ev.iter()
                .filter(|e| matches!(e, ClusterEvent::MemberDowned(_)))
                .count(),
            1
        );
    }
}

#[test]
fn crashed_leader_is_replaced_by_the_next_address() {
    let (mut sim, _) = Sim::cluster(3);
    sim.crash(0);
    sim.run_until(10_000, "old leader removed", |s| {
        [1, 2].iter().all(|v| s.status(*v, &uid(0, 1)).is_none())
    });
    for v in [1, 2] {
        assert_eq!(
            sim.node(v).node.gossip().leader(&uid(v, 1)),
            Some(uid(1, 1))
        );
        assert!(sim
            .events_of(v)
            .contains(&ClusterEvent::LeaderChanged(Some(uid(1, 1)))));
    }
}

#[test]
fn nobody_is_downed_while_everyone_is_alive() {
    let (mut sim, _) = Sim::cluster(5);
    sim.set_loss(10);
    sim.run_for(60_000);
    for v in 0..5 {
        assert!(sim.node(v).alive);
        assert!(!sim
            .events_of(v)
            .iter()
            .any(|e| matches!(e, ClusterEvent::MemberDowned(_))));
    }
}

#[test]
fn defaults_down_a_crashed_node_within_five_seconds_in_clusters_of_3_to_10() {
    let mut worst = 0;
    for k in 3..=10usize {
        // crash the leader, a middle node, the last node and the one before in turn
        for victim in [0, k / 2, k - 2, k - 1] {
            let (mut sim, _) = Sim::cluster(k);
            // crash at every phase of the 500 ms heartbeat cycle across the runs
            sim.run_for(3_000 + 50 * ((k + victim) % 10) as u64);
            let crashed_at = sim.now;
            sim.crash(victim);
            let dead = uid(victim, 1);
            let survivors: Vec<usize> = (0..k).filter(|i| *i != victim).collect();
            sim.run_until(5_000, "down on every survivor", |s| {
                survivors
                    .iter()
                    .all(|v| matches!(s.status(*v, &dead), Some(MemberStatus::Down) | None))
            });
            let took = sim.now - crashed_at;
            worst = worst.max(took);
            assert!(
                took < 5_000,
                "{k} nodes, victim {victim}: Down after {took} ms"
            );
            sim.run_until(5_000, "removed on every survivor", |s| {
                survivors.iter().all(|v| s.status(*v, &dead).is_none())
            });
            // nobody else was downed, and every survivor is still Up and running
            let ids: Vec<_> = survivors.iter().map(|i| uid(*i, 1)).collect();
            assert!(sim.all_up(&survivors, &ids), "{k} nodes, victim {victim}");
            for v in &survivors {
                let downs: Vec<_> = sim
                    .events_of(*v)
                    .into_iter()
                    .filter(|e| matches!(e, ClusterEvent::MemberDowned(_)))
                    .collect();
                assert_eq!(
                    downs.len(),
                    1,
                    "{k} nodes, victim {victim}, on {v}: {downs:?}"
                );
            }
        }
    }
    eprintln!("worst crash-to-Down on all survivors, 3 to 10 nodes: {worst} ms");
}

#[test]
fn no_false_down_with_jittery_lossy_heartbeats_in_ten_nodes() {
    // 20% of all messages lost for two simulated minutes: pauses of up to ~1.5 s between
    // heartbeats are common, and must flag (at most) but never down anyone.
    let (mut sim, _) = Sim::cluster(10);
    sim.set_loss(20);
    sim.run_for(120_000);
    for v in 0..10 {
        assert!(sim.node(v).alive, "node {v} stopped");
        assert!(
            !sim.events_of(v)
                .iter()
                .any(|e| matches!(e, ClusterEvent::MemberDowned(_))),
            "false down seen by {v}"
        );
    }
}
