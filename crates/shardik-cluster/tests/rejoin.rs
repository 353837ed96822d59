//! A restarted process is a new incarnation: the old one is removed, and stale gossip (from
//! before the restart, or from the old incarnation itself) never brings it back.

mod sim;

use shardik_cluster::member::MemberStatus;
use sim::{addr, uid, Sim};

#[test]
fn restart_with_new_incarnation_replaces_the_old_one() {
    let (mut sim, _) = Sim::cluster(5);
    sim.run_for(1_000);
    // a gossip from before the restart, with node 4's first incarnation Up
    let stale = sim.node(1).node.gossip().clone();
    assert_eq!(
        stale.member(&uid(4, 1)).map(|m| m.status),
        Some(MemberStatus::Up)
    );
    // restart node 4 at once (no time to be detected)
    sim.crash(4);
    sim.start(4, 2);
    let all = [uid(0, 1), uid(1, 1), uid(2, 1), uid(3, 1), uid(4, 2)];
    sim.run_until(15_000, "new incarnation up, old one removed", |s| {
        s.all_up(&[0, 1, 2, 3, 4], &all)
    });
    for v in 0..4 {
        assert!(sim.node(v).node.gossip().is_tombstoned(&uid(4, 1)));
    }

    // Stale gossip, sent again by a live member: the old incarnation stays gone.
    for to in 0..5 {
        sim.inject_gossip(uid(1, 1), to, stale.clone());
    }
    sim.run_for(5_000);
    assert!(sim.all_up(&[0, 1, 2, 3, 4], &all));

    // Stale gossip from the old incarnation itself: ignored, and it is told it is gone.
    let mut from_old = stale.clone();
    from_old.touch(&uid(4, 1));
    for to in 0..4 {
        sim.inject_gossip(uid(4, 1), to, from_old.clone());
    }
    sim.run_for(5_000);
    assert!(sim.all_up(&[0, 1, 2, 3, 4], &all));
    assert!(sim.node(4).alive);
}

#[test]
fn old_incarnation_cannot_join_again() {
    let (mut sim, _) = Sim::cluster(3);
    sim.crash(2);
    sim.start(2, 2);
    let all = [uid(0, 1), uid(1, 1), uid(2, 2)];
    sim.run_until(15_000, "new incarnation up", |s| s.all_up(&[0, 1, 2], &all));
    // a zombie of incarnation 1 asks to join: refused, membership unchanged
    let before = sim.node(0).node.gossip().clone();
    sim.input(
        &addr(0),
        shardik_cluster::protocol::Input::Join(uid(2, 1), Default::default()),
    );
    assert_eq!(sim.node(0).node.gossip(), &before);
    sim.run_for(3_000);
    assert!(sim.all_up(&[0, 1, 2], &all));
}

#[test]
fn restarted_seed_never_forms_a_second_cluster() {
    let (mut sim, _) = Sim::cluster(3);
    sim.crash(0);
    sim.run_until(10_000, "old seed removed", |s| {
        [1, 2].iter().all(|v| s.status(*v, &uid(0, 1)).is_none())
    });
    // the seed restarts; its seed list includes its own address
    sim.start(0, 2);
    let all = [uid(0, 2), uid(1, 1), uid(2, 1)];
    sim.run_until(10_000, "seed rejoined the existing cluster", |s| {
        s.all_up(&[0, 1, 2], &all)
    });
    assert_eq!(sim.clusters().len(), 1);
}

#[test]
fn restarted_first_seed_started_with_seed_lists_joins_the_running_cluster() {
    // Every node started the production way (seed list, no explicit self-join).
    let mut sim = Sim::new();
    for i in 0..4 {
        sim.start_seeded(i, 1, &[0, 1, 2]);
    }
    let ids: Vec<_> = (0..4).map(|i| uid(i, 1)).collect();
    sim.run_until(20_000, "formed by the first seed", |s| {
        s.all_up(&[0, 1, 2, 3], &ids)
    });
    // The first seed crashes and restarts at once: the other seeds answer, so it joins them
    // instead of forming a second cluster after its seed-node timeout.
    sim.crash(0);
    sim.start_seeded(0, 2, &[0, 1, 2]);
    let all = [uid(0, 2), uid(1, 1), uid(2, 1), uid(3, 1)];
    sim.run_until(10_000, "first seed rejoined", |s| {
        s.all_up(&[0, 1, 2, 3], &all)
    });
    sim.run_for(10_000);
    assert!(sim.all_up(&[0, 1, 2, 3], &all));
    assert_eq!(sim.clusters().len(), 1);
}

#[test]
fn only_the_first_seed_forms_and_only_when_no_other_seed_answers() {
    use shardik_cluster::node::MembershipNode;
    use shardik_cluster::protocol::{Action, Input};
    // A node that is not the first seed never forms, however long nobody answers.
    let mut second = MembershipNode::new(Sim::config(uid(1, 1)));
    let out = second.handle(Input::JoinSeeds(vec![addr(0), addr(1)]));
    assert_eq!(out, vec![Action::SendJoin(addr(0))]);
    for t in 1..=60 {
        second.handle(Input::Tick(t * 1_000));
    }
    assert_eq!(second.status(), None);
    // The first seed asks the other seeds first, and forms only after the seed-node timeout.
    let mut first = MembershipNode::new(Sim::config(uid(0, 1)));
    let out = first.handle(Input::JoinSeeds(vec![addr(0), addr(1), addr(2)]));
    assert_eq!(
        out,
        vec![Action::SendJoin(addr(1)), Action::SendJoin(addr(2))]
    );
    first.handle(Input::Tick(4_900));
    assert_eq!(first.status(), None, "formed before the seed-node timeout");
    first.handle(Input::Tick(5_000));
    assert_eq!(first.status(), Some(MemberStatus::Joining));
    first.handle(Input::Tick(5_100));
    assert_eq!(first.status(), Some(MemberStatus::Up));
    // A node whose seed list is only itself is a single-node cluster: it forms at once.
    let mut lone = MembershipNode::new(Sim::config(uid(7, 1)));
    lone.handle(Input::JoinSeeds(vec![addr(7)]));
    lone.handle(Input::Tick(0));
    assert_eq!(lone.status(), Some(MemberStatus::Up));
}

#[test]
fn seeds_started_together_form_exactly_one_cluster() {
    // All seeds and two more nodes start at once, in reverse order, with 20% loss: the
    // non-first seeds cannot form, so there is one cluster, formed by node 0.
    let mut sim = Sim::new();
    sim.set_loss(20);
    for i in (0..5).rev() {
        sim.start_seeded(i, 1, &[0, 1, 2]);
    }
    let ids: Vec<_> = (0..5).map(|i| uid(i, 1)).collect();
    sim.run_until(40_000, "one cluster of five", |s| {
        s.all_up(&[0, 1, 2, 3, 4], &ids)
    });
    assert_eq!(sim.clusters().len(), 1);
}

#[test]
fn first_seed_alone_with_the_others_down_stays_single_but_non_seeds_never_form() {
    // Only non-first nodes are started: nobody forms a cluster, they keep asking.
    let mut sim = Sim::new();
    for i in 1..5 {
        sim.start_seeded(i, 1, &[0, 1, 2]);
    }
    sim.run_for(30_000);
    assert!(sim.clusters().is_empty());
    // Once the first seed starts, it forms (no other seed answers) and all join it.
    sim.start_seeded(0, 1, &[0, 1, 2]);
    let ids: Vec<_> = (0..5).map(|i| uid(i, 1)).collect();
    sim.run_until(15_000, "all up", |s| s.all_up(&[0, 1, 2, 3, 4], &ids));
    assert_eq!(sim.clusters().len(), 1);
}

#[test]
fn operator_down_stops_the_node_and_removes_it() {
    let (mut sim, _) = Sim::cluster(4);
    sim.input(&addr(1), shardik_cluster::protocol::Input::Down(uid(3, 1)));
    sim.run_until(5_000, "downed node removed everywhere", |s| {
        [0, 1, 2].iter().all(|v| s.status(*v, &uid(3, 1)).is_none())
    });
    assert!(!sim.node(3).alive, "the downed node shut itself down");
    assert!(sim.all_up(&[0, 1, 2], &[uid(0, 1), uid(1, 1), uid(2, 1)]));
}

#[test]
fn restart_with_a_smaller_random_incarnation_replaces_the_old_one_at_once() {
    // Incarnations are random (shardik-remote draws them): a restart may well get a smaller
    // number. It must still replace the old process at once, not wait for it to be detected.
    let (mut sim, _) = Sim::cluster(4);
    sim.run_for(1_000);
    sim.crash(3);
    sim.start(3, 0);
    let all = [uid(0, 1), uid(1, 1), uid(2, 1), uid(3, 0)];
    let took = sim.run_until(15_000, "restarted node up, old one removed", |s| {
        s.all_up(&[0, 1, 2, 3], &all)
    });
    // without waiting for the old process to be detected and downed (about 4.5 s)
    assert!(took < 3_500, "took {took} ms");
    for v in 0..3 {
        assert!(sim.node(v).node.gossip().is_tombstoned(&uid(3, 1)));
    }
}
