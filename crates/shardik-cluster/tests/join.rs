//! Joining: five nodes converge with everyone `Up`, in a fixed order, with events.

mod sim;

use std::collections::BTreeSet;
use std::time::Duration;

use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use sim::{addr, uid, Sim};

#[test]
fn five_nodes_join_and_all_are_up() {
    let (mut sim, took) = Sim::cluster(5);
    assert!(took <= 10_000, "took {took} ms");
    sim.run_until(5_000, "same converged version everywhere", |s| {
        let v0 = s.node(0).node.gossip().version().clone();
        (0..5).all(|v| {
            let g = s.node(v).node.gossip();
            g.convergence(&uid(v, 1)) && g.version() == &v0 && g.seen().len() == 5
        })
    });
    for v in 0..5 {
        let g = sim.node(v).node.gossip();
        assert_eq!(g.leader(&uid(v, 1)), Some(uid(0, 1)));
        // up-numbers are unique, 1..=5
        let mut nums: Vec<u64> = g.members().filter_map(|m| m.up_number).collect();
        nums.sort_unstable();
        assert_eq!(nums, vec![1, 2, 3, 4, 5]);
    }
    // node 4 saw everyone come up and node 0 become leader
    let ev = sim.events_of(4);
    for i in 0..5 {
        assert!(
            ev.iter()
                .any(|e| matches!(e, ClusterEvent::MemberUp(m) if m.node == uid(i, 1))),
            "no MemberUp for {i}: {ev:?}"
        );
    }
    assert!(ev.contains(&ClusterEvent::LeaderChanged(Some(uid(0, 1)))));
}

#[test]
fn join_is_retried_through_a_lossy_network() {
    let mut sim = Sim::new();
    sim.set_loss(30);
    for i in 0..5 {
        sim.start(i, 1);
    }
    let ids: Vec<_> = (0..5).map(|i| uid(i, 1)).collect();
    sim.run_until(30_000, "up despite 30% loss", |s| {
        s.all_up(&[0, 1, 2, 3, 4], &ids)
    });
}

#[test]
fn same_run_is_deterministic() {
    let (a, ta) = Sim::cluster(5);
    let (b, tb) = Sim::cluster(5);
    assert_eq!(ta, tb);
    for i in 0..5 {
        assert_eq!(a.node(i).node.gossip(), b.node(i).node.gossip());
    }
}

#[test]
fn graceful_leave_goes_exiting_then_removed_and_the_node_stops() {
    let (mut sim, _) = Sim::cluster(4);
    sim.input(&sim::addr(2), shardik_cluster::protocol::Input::Leave);
    sim.run_until(10_000, "leaver removed everywhere", |s| {
        [0, 1, 3].iter().all(|v| s.status(*v, &uid(2, 1)).is_none())
    });
    assert!(!sim.node(2).alive, "the leaver shut itself down");
    let ev = sim.events_of(0);
    let pos = |f: &dyn Fn(&ClusterEvent) -> bool| ev.iter().position(f).unwrap();
    let left = pos(&|e| matches!(e, ClusterEvent::MemberLeft(m) if m.node == uid(2, 1)));
    let exited = pos(&|e| matches!(e, ClusterEvent::MemberExited(m) if m.node == uid(2, 1)));
    let removed = pos(
        &|e| matches!(e, ClusterEvent::MemberRemoved { node, previous: MemberStatus::Exiting } if *node == uid(2, 1)),
    );
    assert!(left < exited && exited < removed);
    // nobody was downed on the way
    assert!(!ev
        .iter()
        .any(|e| matches!(e, ClusterEvent::MemberDowned(_))));
}

#[test]
fn joiner_goes_weakly_up_without_convergence_then_up() {
    // Downing never decides here (stable-after of an hour), so a crashed member blocks
    // convergence until an operator downs it: a node joining meanwhile goes
    // Joining -> WeaklyUp after 7 s, then Up once convergence is back.
    let mut sim = Sim::new();
    let config = |i: usize| {
        let mut c = Sim::config(uid(i, 1));
        c.downing.stable_after = std::time::Duration::from_secs(3_600);
        c
    };
    for i in 0..3 {
        sim.start_with(config(i));
    }
    let ids: Vec<_> = (0..3).map(|i| uid(i, 1)).collect();
    sim.run_until(20_000, "cluster up", |s| s.all_up(&[0, 1, 2], &ids));
    sim.crash(2);
    sim.run_until(5_000, "flagged", |s| {
        s.node(0)
            .node
            .gossip()
            .unreachable_members()
            .contains(&uid(2, 1))
    });
    sim.start_with(config(3));
    sim.run_until(5_000, "joining", |s| {
        s.status(0, &uid(3, 1)) == Some(MemberStatus::Joining)
    });
    let t = sim.run_until(10_000, "weakly up", |s| {
        [0, 1, 3]
            .iter()
            .all(|v| s.status(*v, &uid(3, 1)) == Some(MemberStatus::WeaklyUp))
    });
    assert!(t >= 4_000, "weakly up after {t} ms");
    assert_eq!(sim.status(0, &uid(2, 1)), Some(MemberStatus::Up));
    sim.input(
        &sim::addr(1),
        shardik_cluster::protocol::Input::Down(uid(2, 1)),
    );
    let ids = [uid(0, 1), uid(1, 1), uid(3, 1)];
    sim.run_until(5_000, "up after convergence", |s| {
        s.all_up(&[0, 1, 3], &ids)
    });
    let ev = sim.events_of(3);
    assert!(ev
        .iter()
        .any(|e| matches!(e, ClusterEvent::MemberWeaklyUp(m) if m.node == uid(3, 1))));
    assert!(ev
        .iter()
        .any(|e| matches!(e, ClusterEvent::MemberUp(m) if m.node == uid(3, 1))));
}

/// A joiner welcomed by a seed that crashes before anyone else heard of the joiner: the
/// joiner is a member in its own view only. The first member it gossips to takes that gossip
/// as its join, so it comes up once the seed is downed (it used to be ignored as a stranger
/// and, hearing nobody, ended up downing itself).
#[test]
fn a_joiner_whose_seed_crashes_right_after_the_welcome_still_comes_up() {
    let (mut sim, _) = Sim::cluster(4);
    // Node 2 welcomes the joiner but never gossips about it to the others.
    sim.cut_gossip(&[2], &[0, 1, 3]);
    sim.start_seeded(4, 1, &[2]);
    sim.run_until(2_000, "welcomed", |s| {
        s.node(4).node.gossip().member(&uid(4, 1)).is_some()
    });
    sim.crash(2);
    for i in [0, 1, 3] {
        assert!(sim.status(i, &uid(4, 1)).is_none(), "node {i} heard of it");
    }
    let live = [uid(0, 1), uid(1, 1), uid(3, 1), uid(4, 1)];
    sim.run_until(20_000, "joiner up, crashed seed removed", |s| {
        s.all_up(&[0, 1, 3, 4], &live)
    });
    assert!(sim.node(4).alive);
}

/// Two joiners welcomed by a member that crashes before telling anyone else: each one's
/// state holds the other, whom the others know nothing of, so neither's gossip counts as
/// its join there (a harmless state only). They ask the members that have not seen their
/// state to take them in (a join reminder, every `join_retry` while they are not `Up`), and
/// come up. Before, both stayed `Joining` for good.
#[test]
fn two_joiners_whose_seed_crashes_right_after_welcoming_both_still_come_up() {
    let (mut sim, _) = Sim::cluster(4);
    // Node 2 welcomes both joiners and tells only them; they tell nobody else.
    sim.cut_gossip(&[2, 4, 5], &[0, 1, 3]);
    sim.start_seeded(4, 1, &[2]);
    sim.start_seeded(5, 1, &[2]);
    sim.run_until(5_000, "welcomed, each knowing the other", |s| {
        s.node(4).node.gossip().member(&uid(5, 1)).is_some()
            && s.node(5).node.gossip().member(&uid(4, 1)).is_some()
    });
    sim.crash(2);
    // What node 2 sent before it crashed arrives (and is dropped) under the cut.
    sim.run_for(500);
    sim.heal();
    for i in [0, 1, 3] {
        assert!(sim.status(i, &uid(4, 1)).is_none(), "node {i} heard of 4");
        assert!(sim.status(i, &uid(5, 1)).is_none(), "node {i} heard of 5");
    }
    let live = [uid(0, 1), uid(1, 1), uid(3, 1), uid(4, 1), uid(5, 1)];
    sim.run_until(30_000, "joiners up, crashed seed removed", |s| {
        s.all_up(&[0, 1, 3, 4, 5], &live)
    });
}

/// A joiner reminds the members that have not seen its state to take it in, one at a time
/// every `join_retry` from two `join_retry` after its welcome on, and only during the first
/// half of the tombstones' lifetime after its welcome (a joiner removed meanwhile must meet
/// its tombstone, not come back).
#[test]
fn a_joiner_reminds_unaware_members_only_while_its_tombstone_would_stand() {
    use shardik_cluster::node::MembershipNode;
    use shardik_cluster::protocol::{Action, Input};
    let (sim, _) = Sim::cluster(3);
    let joiner = uid(3, 1);
    let mut welcome = sim.node(0).node.gossip().clone();
    welcome
        .add_joining(joiner.clone(), BTreeSet::new())
        .unwrap();
    welcome.touch(&uid(0, 1));
    let mut config = Sim::config(joiner.clone());
    config.join_retry = Duration::from_secs(1);
    config.prune_tombstones_after = Duration::from_secs(10);
    let mut node = MembershipNode::new(config);
    let joins = |out: Vec<Action>| -> Vec<String> {
        out.into_iter()
            .filter_map(|a| match a {
                Action::SendJoinReminder(to) => Some(to.address),
                Action::SendJoin(to) => panic!("a join request to {to}"),
                _ => None,
            })
            .collect()
    };
    node.handle(Input::Tick(1_000));
    node.handle(Input::Gossip(uid(0, 1), Box::new(welcome)));
    // Every 500 ms: heartbeats from the others (nobody is flagged), then a tick.
    let mut tick = |t: u64| {
        for i in 0..3 {
            node.handle(Input::HeartbeatFrom(uid(i, 1), t));
        }
        joins(node.handle(Input::Tick(t)))
    };
    for t in (1_000..3_000).step_by(500) {
        assert_eq!(
            tick(t),
            Vec::<String>::new(),
            "none within 2 s of the welcome"
        );
    }
    let mut asked = BTreeSet::new();
    for t in (3_000..=4_000).step_by(500) {
        let sent = tick(t);
        assert!(sent.len() <= 1, "one at a time: {sent:?}");
        asked.extend(sent);
    }
    assert_eq!(
        asked,
        BTreeSet::from([addr(1), addr(2)]),
        "the members that have not seen its state, in turn (not node 0, which welcomed it)"
    );
    // The window ends 5 s (half of 10 s) after the welcome at 1 s.
    let late: Vec<String> = (4_500..6_000).step_by(500).flat_map(&mut tick).collect();
    assert_eq!(late.len(), 1, "at 5 s: {late:?}");
    for t in (6_000..=20_000).step_by(500) {
        assert_eq!(tick(t), Vec::<String>::new(), "at {t} ms");
    }
}

/// A join reminder takes a joiner in like a join request, but never in place of a live
/// member with its node id or address (a reminder may come from a process that was paused
/// while a replacement joined), and never a removed incarnation (its tombstone).
#[test]
fn a_join_reminder_never_takes_the_place_of_a_live_member() {
    use shardik_cluster::protocol::Input;
    let (mut sim, _) = Sim::cluster(4);
    let live: Vec<UniqueAddress> = (0..4).map(|i| uid(i, 1)).collect();
    // An older process with node 3's node id, elsewhere: node 3 stays up.
    let older = UniqueAddress::new(addr(9), "n3", 7);
    sim.input(
        &addr(0),
        Input::JoinReminder(older.clone(), BTreeSet::new()),
    );
    sim.run_for(3_000);
    assert!(sim.status(0, &older).is_none());
    assert!(sim.all_up(&[0, 1, 2, 3], &live));
    // Node 3 crashes and is downed and removed: a reminder from it is refused.
    sim.crash(3);
    let rest = &live[..3];
    sim.run_until(30_000, "node 3 removed", |s| {
        s.all_up(&[0, 1, 2], rest) && s.status(0, &uid(3, 1)).is_none()
    });
    sim.input(&addr(0), Input::JoinReminder(uid(3, 1), BTreeSet::new()));
    sim.run_for(3_000);
    assert!(
        sim.status(0, &uid(3, 1)).is_none(),
        "its tombstone refused it"
    );
    // A joiner that replaces nobody is taken in.
    sim.input(&addr(0), Input::JoinReminder(uid(5, 1), BTreeSet::new()));
    assert_eq!(sim.status(0, &uid(5, 1)), Some(MemberStatus::Joining));
}

/// A joiner watches its peers from the welcome on, before they have heard of it. Heartbeats
/// go to the watchers in the sender's view, so the joiner asks for them: it never flags a
/// healthy peer while the news of its join spreads (it flagged them after about 2 s, which
/// held up its move to `Up` until they heard of it).
#[test]
fn a_joiner_does_not_flag_peers_that_have_not_heard_of_it_yet() {
    let (mut sim, _) = Sim::cluster(4);
    // For 5 s, only node 2 knows of the joiner.
    sim.cut_gossip(&[2, 4], &[0, 1, 3]);
    sim.start_seeded(4, 1, &[2]);
    let me = uid(4, 1);
    let end = sim.now + 5_000;
    while sim.now < end {
        sim.step();
        let g = sim.node(4).node.gossip();
        for peer in [0, 1, 3] {
            assert!(
                !g.reachability().is_unreachable_by(&me, &uid(peer, 1)),
                "the joiner flagged node {peer} at {} ms",
                sim.now
            );
            if g.member(&me).is_some() {
                assert!(sim.status(peer, &me).is_none(), "node {peer} heard of it");
            }
        }
    }
    assert!(
        sim.node(4).node.gossip().member(&me).is_some(),
        "not welcomed"
    );
    sim.heal();
    let all = [uid(0, 1), uid(1, 1), uid(2, 1), uid(3, 1), me];
    sim.run_until(10_000, "joiner up", |s| s.all_up(&[0, 1, 2, 3, 4], &all));
}

/// A joiner only known from its gossip joins through it with less than a join request: never
/// in place of a live process with its node id (a join marks that one `Down`), and never
/// with a state holding members this node knows nothing of.
#[test]
fn a_joiner_known_only_from_its_gossip_joins_only_with_a_harmless_state() {
    let (mut sim, _) = Sim::cluster(4);
    let live: Vec<UniqueAddress> = (0..4).map(|i| uid(i, 1)).collect();
    // What a joiner's state would be right after a welcome from node 1.
    let welcomed = |sim: &Sim, joiner: &UniqueAddress, extra: Option<&UniqueAddress>| {
        let mut g = sim.node(1).node.gossip().clone();
        g.add_joining(joiner.clone(), BTreeSet::new()).unwrap();
        if let Some(x) = extra {
            g.add_joining(x.clone(), BTreeSet::new()).unwrap();
        }
        g.touch(&uid(1, 1));
        g
    };
    // An older process with node 3's node id, elsewhere: node 3 stays up.
    let older = UniqueAddress::new(addr(9), "n3", 7);
    let g = welcomed(&sim, &older, None);
    sim.inject_gossip(older.clone(), 0, g);
    sim.run_for(3_000);
    assert!(sim.status(0, &older).is_none());
    assert!(sim.all_up(&[0, 1, 2, 3], &live));
    // A state with a member nobody here knows of.
    let joiner = uid(5, 1);
    let g = welcomed(&sim, &joiner, Some(&uid(6, 1)));
    sim.inject_gossip(joiner.clone(), 0, g);
    sim.run_for(3_000);
    assert!(sim.status(0, &joiner).is_none());
    assert!(sim.status(0, &uid(6, 1)).is_none());
    assert!(sim.all_up(&[0, 1, 2, 3], &live));
    // The same joiner with a state of known members only is taken in.
    let g = welcomed(&sim, &joiner, None);
    sim.inject_gossip(joiner.clone(), 0, g);
    sim.step();
    assert_eq!(sim.status(0, &joiner), Some(MemberStatus::Joining));
}

/// A node paused for longer than its tombstone lives (downed, removed and forgotten
/// meanwhile) wakes up as a member in its own view that nobody knows. Its requests for
/// heartbeats are not answered (it does not say it is joining), so its resolver sees
/// nobody and it downs itself instead of staying fenced for good.
#[test]
fn a_node_removed_and_forgotten_while_paused_downs_itself_when_it_wakes() {
    let mut sim = Sim::new();
    let config = |i: usize| {
        let mut c = Sim::config(uid(i, 1));
        c.prune_tombstones_after = Duration::from_secs(20);
        c
    };
    for i in 0..4 {
        sim.start_with(config(i));
    }
    let all: Vec<UniqueAddress> = (0..4).map(|i| uid(i, 1)).collect();
    sim.run_until(20_000, "cluster up", |s| s.all_up(&[0, 1, 2, 3], &all));
    // Pause node 3 (no ticks, nothing delivered) until it is removed and forgotten.
    sim.nodes.get_mut(&addr(3)).unwrap().alive = false;
    sim.run_until(60_000, "node 3 removed and forgotten", |s| {
        (0..3).all(|i| {
            let g = s.node(i).node.gossip();
            g.member(&uid(3, 1)).is_none() && !g.is_tombstoned(&uid(3, 1))
        })
    });
    sim.nodes.get_mut(&addr(3)).unwrap().alive = true;
    sim.run_until(20_000, "node 3 downed itself", |s| {
        s.node(3).node.is_shut_down()
    });
    assert!(sim.all_up(&[0, 1, 2], &all[..3]));
}

/// The sans-IO node takes any `NodeConfig` (only the runtime's `ClusterConfig` is
/// validated): durations near `Duration::MAX` mean "never" rather than overflowing the
/// deadlines computed from them (a panic in debug builds; in release builds a wrapped
/// deadline that fired at once, so the first seed formed a cluster right away).
#[test]
fn durations_near_the_maximum_mean_never() {
    use shardik_cluster::node::{MembershipNode, NodeConfig};
    use shardik_cluster::protocol::{Action, Input};
    let mut config = NodeConfig::new(uid(0, 1));
    config.seed_node_timeout = Duration::MAX;
    config.join_retry = Duration::MAX;
    config.gossip_interval = Duration::MAX;
    config.fence_after = Duration::MAX;
    config.weakly_up_after = Some(Duration::MAX);
    config.phi.first_heartbeat_estimate = Duration::MAX;
    let mut first = MembershipNode::new(config.clone());
    first.handle(Input::Tick(1_000));
    let out = first.handle(Input::JoinSeeds(vec![addr(0), addr(1)]));
    // Asks the other seed once, and waits for it "for ever".
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(&out[0], Action::SendJoin(a) if *a == addr(1)));
    for t in [2_000, 60_000, u64::MAX / 2, u64::MAX - 1] {
        let out = first.handle(Input::Tick(t));
        assert!(out.is_empty(), "at {t}: {out:?}");
        assert_eq!(first.status(), None, "formed a cluster at {t}");
    }
    // A member with such settings: detectors seeded with the huge estimate, the next gossip
    // round and the weakly-up deadline "never".
    config.self_node = uid(2, 1);
    let mut member = MembershipNode::new(config);
    member.handle(Input::Tick(1_000));
    member.handle(Input::Join(uid(2, 1), BTreeSet::new()));
    member.handle(Input::Tick(1_100));
    assert_eq!(member.status(), Some(MemberStatus::Up));
    member.handle(Input::Join(uid(3, 1), BTreeSet::new()));
    for t in [5_000, u64::MAX / 2, u64::MAX - 1] {
        member.handle(Input::HeartbeatTick(t));
        member.handle(Input::Tick(t));
    }
    assert!(!member.is_fenced());
}
