use super::*;
use crate::leader::leader_actions;

fn n(i: u8) -> UniqueAddress {
    UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)
}

/// `k` members moved up in address order (n0 oldest).
fn cluster(k: u8) -> Gossip {
    let mut g = Gossip::new();
    for i in 0..k {
        g.add_joining(n(i), BTreeSet::new()).unwrap();
    }
    leader_actions(&mut g, &n(0), false);
    g
}

/// The gossip as seen by `side`, which cannot reach the others: every node of `side` flagged
/// every other node, in a version only `side` has seen.
fn split(g: &Gossip, side: &[u8], others: &[u8]) -> Gossip {
    let mut g = g.clone();
    for o in side {
        for u in others {
            g.reachability_mut().unreachable(&n(*o), &n(*u));
        }
    }
    g.touch(&n(side[0]));
    for o in side {
        g.mark_seen(&n(*o));
    }
    g
}

fn cfg(strategy: Strategy) -> DowningConfig {
    DowningConfig {
        strategy,
        ..DowningConfig::default()
    }
}

fn stable() -> Duration {
    DowningConfig::default().stable_after
}

fn decide_on(g: &Gossip, me: u8, c: &DowningConfig) -> Decision {
    decide(g, &n(me), stable(), c).expect("a decision")
}

fn set(ids: &[u8]) -> BTreeSet<UniqueAddress> {
    ids.iter().map(|i| n(*i)).collect()
}

#[test]
fn nothing_to_decide_when_all_reachable() {
    let g = cluster(3);
    assert_eq!(
        decide(&g, &n(0), stable(), &cfg(Strategy::KeepMajority)),
        None
    );
}

#[test]
fn no_decision_before_stable_after() {
    let g = split(&cluster(3), &[0, 1], &[2]);
    let c = cfg(Strategy::KeepMajority);
    assert_eq!(
        decide(&g, &n(0), stable() - Duration::from_millis(1), &c),
        None
    );
    assert!(decide(&g, &n(0), stable(), &c).is_some());
}

#[test]
fn keep_majority_2_3_both_sides_agree() {
    let base = cluster(5);
    let c = cfg(Strategy::KeepMajority);
    let major = split(&base, &[2, 3, 4], &[0, 1]);
    let minor = split(&base, &[0, 1], &[2, 3, 4]);
    let d = decide_on(&major, 2, &c);
    assert_eq!(d.kind, DecisionKind::DownUnreachable);
    assert_eq!(d.down, set(&[0, 1]));
    let d = decide_on(&minor, 0, &c);
    assert_eq!(d.kind, DecisionKind::DownReachable);
    assert_eq!(d.down, set(&[0, 1]), "the minority downs itself");
}

#[test]
fn keep_majority_tie_goes_to_lowest_address() {
    let base = cluster(4);
    let c = cfg(Strategy::KeepMajority);
    let with_lowest = split(&base, &[0, 3], &[1, 2]);
    let without = split(&base, &[1, 2], &[0, 3]);
    assert_eq!(
        decide_on(&with_lowest, 3, &c).kind,
        DecisionKind::DownUnreachable
    );
    let d = decide_on(&without, 1, &c);
    assert_eq!(d.kind, DecisionKind::DownReachable);
    assert_eq!(d.down, set(&[1, 2]));
}

#[test]
fn keep_majority_two_nodes_lowest_address_survives() {
    let base = cluster(2);
    let c = cfg(Strategy::KeepMajority);
    assert_eq!(
        decide_on(&split(&base, &[0], &[1]), 0, &c).kind,
        DecisionKind::DownUnreachable
    );
    assert_eq!(
        decide_on(&split(&base, &[1], &[0]), 1, &c).kind,
        DecisionKind::DownReachable
    );
}

#[test]
fn keep_majority_three_way_split_without_majority_downs_everyone() {
    let base = cluster(5);
    let c = cfg(Strategy::KeepMajority);
    for (side, others) in [
        (&[0u8, 1][..], &[2u8, 3, 4][..]),
        (&[2, 3], &[0, 1, 4]),
        (&[4], &[0, 1, 2, 3]),
    ] {
        let d = decide_on(&split(&base, side, others), side[0], &c);
        assert_eq!(d.kind, DecisionKind::DownReachable, "side {side:?}");
        assert_eq!(d.down, set(side));
    }
}

#[test]
fn keep_majority_three_way_split_with_a_majority() {
    let base = cluster(7);
    let c = cfg(Strategy::KeepMajority);
    let big = split(&base, &[0, 1, 2, 3], &[4, 5, 6]);
    assert_eq!(decide_on(&big, 0, &c).kind, DecisionKind::DownUnreachable);
    let mid = split(&base, &[4, 5], &[0, 1, 2, 3, 6]);
    assert_eq!(decide_on(&mid, 4, &c).kind, DecisionKind::DownReachable);
    let lone = split(&base, &[6], &[0, 1, 2, 3, 4, 5]);
    assert_eq!(decide_on(&lone, 6, &c).kind, DecisionKind::DownReachable);
}

#[test]
fn joining_members_do_not_count_but_go_down_with_their_side() {
    let mut base = cluster(5);
    // two more nodes join on what becomes the minority side
    base.add_joining(n(7), BTreeSet::new()).unwrap();
    base.add_joining(n(8), BTreeSet::new()).unwrap();
    let c = cfg(Strategy::KeepMajority);
    let minor = split(&base, &[0, 1, 7, 8], &[2, 3, 4]);
    let d = decide_on(&minor, 0, &c);
    assert_eq!(d.kind, DecisionKind::DownReachable, "2 counted vs 3");
    assert_eq!(d.down, set(&[0, 1, 7, 8]));
    // The majority knows 7 and 8 are joining: the minority's leader may have moved them up
    // just before the split (everybody had seen them joining), in which case the minority
    // counts 4 Up members and goes on. So the majority cannot safely go on either: 3 against
    // up to 4 is no majority, and it downs everything (Akka's edge case). Safety over
    // availability: never two sides.
    let major = split(&base, &[2, 3, 4], &[0, 1, 7, 8]);
    let d = decide_on(&major, 2, &c);
    assert_eq!(d.kind, DecisionKind::DownAll);
    // With the joiners known only to the minority (they joined through it after the split),
    // the majority goes on.
    let mut only_minor_knows = cluster(5);
    only_minor_knows.add_joining(n(9), BTreeSet::new()).unwrap();
    let minor = split(&only_minor_knows, &[0, 1, 9], &[2, 3, 4]);
    assert_eq!(decide_on(&minor, 0, &c).kind, DecisionKind::DownReachable);
    let major = split(&cluster(5), &[2, 3, 4], &[0, 1]);
    let d = decide_on(&major, 2, &c);
    assert_eq!(d.kind, DecisionKind::DownUnreachable);
    assert_eq!(d.down, set(&[0, 1]));
}

#[test]
fn joiner_moved_up_on_one_side_only_never_lets_both_sides_go_on() {
    // n0 (leader) moved joining n5 up at a convergence; only n0's side saw that before the
    // split {0, 5} | {1, 2}. Without the edge-case check the left side counts 2 (tie, lowest
    // address n0) and the right side counts 2 against 1: both would go on.
    let mut base = cluster(3);
    base.add_joining(n(5), BTreeSet::new()).unwrap();
    let mut left = base.clone();
    for i in 0..3 {
        left.mark_seen(&n(i));
    }
    leader_actions(&mut left, &n(0), false);
    assert_eq!(left.member(&n(5)).unwrap().status, MemberStatus::Up);
    let left = split(&left, &[0, 5], &[1, 2]);
    let right = split(&base, &[1, 2], &[0, 5]);
    let c = cfg(Strategy::KeepMajority);
    let l = decide_on(&left, 0, &c).kind;
    let r = decide_on(&right, 1, &c).kind;
    assert_eq!(l, DecisionKind::DownUnreachable);
    assert_ne!(r, DecisionKind::DownUnreachable);
}

#[test]
fn exiting_member_removed_on_one_side_only_never_lets_both_sides_go_on() {
    // n3 is Exiting; the left side's leader removed it just before the split {0, 1} | {2, 3}
    // (n3 has shut down but is not yet detected on the right side).
    let mut base = cluster(4);
    base.set_status(&n(3), MemberStatus::Leaving).unwrap();
    base.set_status(&n(3), MemberStatus::Exiting).unwrap();
    let mut left = base.clone();
    left.set_status(&n(3), MemberStatus::Removed).unwrap();
    let left = split(&left, &[0, 1], &[2]);
    let right = split(&base, &[2, 3], &[0, 1]);
    for strategy in [
        Strategy::KeepMajority,
        Strategy::KeepOldest {
            down_if_alone: false,
        },
    ] {
        let c = cfg(strategy);
        let l = decide_on(&left, 0, &c).kind;
        let r = decide_on(&right, 2, &c).kind;
        assert!(
            !(l == DecisionKind::DownUnreachable && r == DecisionKind::DownUnreachable),
            "{:?}: both sides go on",
            c.strategy
        );
    }
}

/// Found by `split_safety`: n0 is `Exiting` with a broken link to n1 that everybody saw;
/// n1's side removed n0 just before the split {n1} | {n0, n2}. n1 counts one against one
/// and wins the tie; n0's side read the partition as the broken link only (n1 its end to
/// down) and went on too. The covered end is flagged by n2 as well, so n0's side now weighs
/// it like any unreachable member, and loses the count without the exiting n0.
#[test]
fn a_partition_across_a_broken_link_with_an_exiting_end_lets_one_side_go_on() {
    let mut base = cluster(3);
    base.set_status(&n(0), MemberStatus::Leaving).unwrap();
    base.set_status(&n(0), MemberStatus::Exiting).unwrap();
    base.reachability_mut().unreachable(&n(0), &n(1));
    base.reachability_mut().unreachable(&n(1), &n(0));
    base.touch(&n(0));
    for i in 0..3 {
        base.mark_seen(&n(i));
    }
    let mut lone = base.clone();
    lone.set_status(&n(0), MemberStatus::Removed).unwrap();
    let lone = split(&lone, &[1], &[2]);
    let pair = split(&base, &[0, 2], &[1]);
    let c = cfg(Strategy::KeepMajority);
    let goes_on = |d: &Decision, side: &[u8]| {
        d.kind == DecisionKind::DownUnreachable && side.iter().any(|i| !d.down.contains(&n(*i)))
    };
    let l = decide_on(&lone, 1, &c);
    let p = decide_on(&pair, 0, &c);
    assert!(
        !(goes_on(&l, &[1]) && goes_on(&p, &[0, 2])),
        "both sides go on: {l:?} / {p:?}"
    );
    assert!(goes_on(&l, &[1]), "n1 wins the tie on its count: {l:?}");
}

/// A variant of the split-safety property's history that its generator does not make (one
/// broken pair only): an end with links to an `Exiting` member and to another member; one
/// side has removed the `Exiting` one. At most one side goes on.
#[test]
fn a_partition_across_broken_links_to_an_exiting_member_lets_at_most_one_side_go_on() {
    let strategies = [
        Strategy::KeepMajority,
        Strategy::KeepOldest {
            down_if_alone: false,
        },
        Strategy::KeepOldest {
            down_if_alone: true,
        },
        Strategy::StaticQuorum { quorum_size: 3 },
    ];
    let goes_on = |g: &Gossip, side: &[u8], c: &DowningConfig| {
        let d = decide_on(g, side[0], c);
        d.kind == DecisionKind::DownUnreachable && side.iter().any(|i| !d.down.contains(&n(*i)))
    };
    let linked = |g: &mut Gossip, pairs: &[(u8, u8)]| {
        for (a, b) in pairs {
            g.reachability_mut().unreachable(&n(*a), &n(*b));
            g.reachability_mut().unreachable(&n(*b), &n(*a));
        }
        g.touch(&n(0));
        for m in g.members().map(|m| m.node.clone()).collect::<Vec<_>>() {
            g.mark_seen(&m);
        }
    };
    // n1 is Exiting; n0 has broken links to n1 and to n2; one side has removed n1.
    let mut base = cluster(5);
    base.set_status(&n(1), MemberStatus::Leaving).unwrap();
    base.set_status(&n(1), MemberStatus::Exiting).unwrap();
    linked(&mut base, &[(0, 1), (0, 2)]);
    let mut removed = base.clone();
    removed.set_status(&n(1), MemberStatus::Removed).unwrap();
    let cases: [(&[u8], &[u8]); 2] = [(&[0, 4], &[1, 2, 3]), (&[0, 3, 4], &[1, 2])];
    for (a, b) in cases {
        let b_here: Vec<u8> = b.iter().copied().filter(|i| *i != 1).collect();
        let a_view = split(&removed, a, &b_here);
        let b_view = split(&base, b, a);
        for c in strategies.clone().map(cfg) {
            assert!(
                !(goes_on(&a_view, a, &c) && goes_on(&b_view, b, &c)),
                "{:?}, {a:?} | {b:?}: both go on: {:?} / {:?}",
                c.strategy,
                decide_on(&a_view, a[0], &c),
                decide_on(&b_view, b[0], &c)
            );
        }
    }
}

/// A flaky link (both ends flag each other, nobody else flags anyone) costs one of its ends
/// and nothing else, whatever the strategy, also with an `Exiting` member or a one-way cut
/// beside it: only a partition is weighed by the strategy.
#[test]
fn a_flaky_link_costs_one_end_under_every_strategy() {
    let strategies = [
        Strategy::KeepMajority,
        Strategy::StaticQuorum { quorum_size: 2 },
        Strategy::StaticQuorum { quorum_size: 3 },
        Strategy::KeepOldest {
            down_if_alone: false,
        },
        Strategy::KeepOldest {
            down_if_alone: true,
        },
        Strategy::DownAll,
    ];
    for exiting in [false, true] {
        for one_way in [false, true] {
            let mut g = cluster(3);
            if exiting {
                g.set_status(&n(0), MemberStatus::Leaving).unwrap();
                g.set_status(&n(0), MemberStatus::Exiting).unwrap();
            }
            g.reachability_mut().unreachable(&n(0), &n(1));
            if !one_way {
                g.reachability_mut().unreachable(&n(1), &n(0));
            }
            g.touch(&n(0));
            for i in 0..3 {
                g.mark_seen(&n(i));
            }
            for strategy in strategies.clone() {
                let d = decide_on(&g, 2, &cfg(strategy.clone()));
                assert_eq!(
                    d.down.len(),
                    1,
                    "{strategy:?}, exiting {exiting}, one way {one_way}: {d:?}"
                );
                assert!(
                    d.down.contains(&n(0)) || d.down.contains(&n(1)),
                    "{strategy:?}: an end goes: {d:?}"
                );
            }
        }
    }
}

mod split_safety {
    //! Whatever membership change raced a partition (seen by one side only), at most one side
    //! of a split goes on.
    use super::*;
    use proptest::prelude::{any, prop_assert, prop_oneof, proptest, Just, ProptestConfig};
    use proptest::strategy::Strategy as _;

    // Changes made just before the split, each seen only by the sides in its mask:
    // 0 a joining member (that everybody saw joining) moved up, 1 an up member leaves,
    // 2 a leaving member goes exiting, 3 an exiting member is removed, 4 a new member joins
    // through one side.

    fn strategy() -> impl proptest::strategy::Strategy<Value = super::Strategy> {
        prop_oneof![
            Just(super::Strategy::KeepMajority),
            (1usize..5).prop_map(|q| super::Strategy::StaticQuorum { quorum_size: q }),
            any::<bool>().prop_map(|a| super::Strategy::KeepOldest { down_if_alone: a }),
            Just(super::Strategy::DownAll),
        ]
    }

    proptest! {
        // A fixed seed, so that every run checks the same cases (a random one found a history
        // the rule missed in one run of many, which made the suite fail at random); more
        // cases than a random run would take instead. `proptest-regressions` replays the
        // histories found so far first.
        #![proptest_config(ProptestConfig {
            cases: 20_000,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_d0e5),
            ..ProptestConfig::default()
        })]

        #[test]
        fn at_most_one_side_goes_on(
            up in 2u8..7,
            joining in 0u8..3,
            statuses in proptest::collection::vec(0u8..4, 9),
            changes in proptest::collection::vec((0u8..5, 0u8..9, 0u8..8), 0..3),
            sides in proptest::collection::vec(0u8..3, 9),
            strategy in strategy(),
            broken in proptest::option::of((0u8..9, 0u8..9)),
        ) {
            // the agreed base state: `up` members moved up, some leaving or exiting,
            // `joining` more joining
            let mut base = cluster(up);
            for i in 0..up {
                match statuses[i as usize] {
                    1 => { base.set_status(&n(i), MemberStatus::Leaving).unwrap(); }
                    2 => {
                        base.set_status(&n(i), MemberStatus::Leaving).unwrap();
                        base.set_status(&n(i), MemberStatus::Exiting).unwrap();
                    }
                    _ => {}
                }
            }
            for j in 0..joining {
                base.add_joining(n(up + j), BTreeSet::new()).unwrap();
            }
            let known = up + joining;
            // Before the partition, maybe a broken link (both ends flag each other), seen by
            // everyone: the partition may cut across it.
            if let Some((a, b)) = broken {
                let (a, b) = (n(a % known), n(b % known));
                if a != b {
                    base.reachability_mut().unreachable(&a, &b);
                    base.reachability_mut().unreachable(&b, &a);
                    base.touch(&a);
                    for m in base.members().map(|m| m.node.clone()).collect::<Vec<_>>() {
                        base.mark_seen(&m);
                    }
                }
            }
            let mut views = [base.clone(), base.clone(), base.clone()];
            for (next_new, (kind, who, mask)) in (20u8..).zip(changes) {
                let target = n(who % known);
                let new = n(next_new);
                for (v, view) in views.iter_mut().enumerate() {
                    if mask & (1 << v) == 0 {
                        continue;
                    }
                    let status = base.member(&target).map(|m| m.status);
                    match kind {
                        0 if status == Some(MemberStatus::Joining) => {
                            let next = view.members().filter_map(|m| m.up_number).max().unwrap_or(0) + 1;
                            view.set_status(&target, MemberStatus::Up).unwrap();
                            view.set_up_number(&target, next);
                        }
                        1 if status == Some(MemberStatus::Up) => {
                            let _ = view.set_status(&target, MemberStatus::Leaving);
                        }
                        2 if status == Some(MemberStatus::Leaving) => {
                            let _ = view.set_status(&target, MemberStatus::Exiting);
                        }
                        3 if status == Some(MemberStatus::Exiting) => {
                            let _ = view.set_status(&target, MemberStatus::Removed);
                        }
                        // joins through this side only (the first side in the mask)
                        4 if (0..v).all(|u| mask & (1 << u) == 0) => {
                            view.add_joining(new.clone(), BTreeSet::new()).unwrap();
                        }
                        _ => {}
                    }
                }
            }
            // every member (and every new joiner) is on one of up to three sides
            let side_of = |m: &UniqueAddress| -> usize {
                let i: u8 = m.node_id[1..].parse().unwrap();
                usize::from(sides[usize::from(i % 9)])
            };
            let mut going_on = Vec::new();
            for (v, view) in views.iter().enumerate() {
                let mine: Vec<UniqueAddress> = view
                    .members()
                    .filter(|m| side_of(&m.node) == v)
                    .map(|m| m.node.clone())
                    .collect();
                let Some(decider) = mine.first() else { continue };
                let mut g = view.clone();
                for o in &mine {
                    for m in view.members() {
                        if side_of(&m.node) != v {
                            g.reachability_mut().unreachable(o, &m.node);
                        }
                    }
                }
                g.touch(decider);
                for o in &mine {
                    g.mark_seen(o);
                }
                let c = cfg(strategy.clone());
                if let Some(d) = decide(&g, decider, stable(), &c) {
                    // A side goes on if it keeps itself and some of its members (the cover
                    // of a broken link may down the decider itself, or the whole side).
                    if d.kind == DecisionKind::DownUnreachable
                        && mine.iter().any(|m| !d.down.contains(m))
                    {
                        going_on.push(v);
                    }
                }
            }
            prop_assert!(going_on.len() <= 1, "sides {:?} all go on", going_on);
        }
    }
}

#[test]
fn all_joining_cluster_counts_joining_members() {
    let mut g = Gossip::new();
    for i in 0..3 {
        g.add_joining(n(i), BTreeSet::new()).unwrap();
    }
    let g = split(&g, &[0, 1], &[2]);
    assert_eq!(
        decide_on(&g, 0, &cfg(Strategy::KeepMajority)).kind,
        DecisionKind::DownUnreachable
    );
}

#[test]
fn downed_members_are_not_counted() {
    let mut g = cluster(5);
    g.set_status(&n(4), MemberStatus::Down).unwrap();
    g.set_status(&n(3), MemberStatus::Down).unwrap();
    // 3 live: {0} | {1, 2}
    let d = decide_on(&split(&g, &[1, 2], &[0]), 1, &cfg(Strategy::KeepMajority));
    assert_eq!(d.kind, DecisionKind::DownUnreachable);
    assert_eq!(d.down, set(&[0]));
}

#[test]
fn static_quorum() {
    let base = cluster(5);
    let c = cfg(Strategy::StaticQuorum { quorum_size: 3 });
    assert_eq!(
        decide_on(&split(&base, &[0, 1, 2], &[3, 4]), 0, &c).kind,
        DecisionKind::DownUnreachable
    );
    assert_eq!(
        decide_on(&split(&base, &[3, 4], &[0, 1, 2]), 3, &c).kind,
        DecisionKind::DownReachable
    );
    // three-way split: nobody has a quorum, everyone downs itself
    for (side, others) in [(&[0u8, 1][..], &[2u8, 3, 4][..]), (&[2, 3], &[0, 1, 4])] {
        assert_eq!(
            decide_on(&split(&base, side, others), side[0], &c).kind,
            DecisionKind::DownReachable
        );
    }
    // too many members for the quorum: down all
    let big = cluster(6);
    let d = decide_on(&split(&big, &[0, 1, 2, 3], &[4, 5]), 0, &c);
    assert_eq!(d.kind, DecisionKind::DownAll);
    assert_eq!(d.down, set(&[0, 1, 2, 3, 4, 5]));
}

#[test]
fn keep_oldest() {
    let base = cluster(5); // n0 is oldest
    let c = cfg(Strategy::KeepOldest {
        down_if_alone: false,
    });
    assert_eq!(
        decide_on(&split(&base, &[0, 1], &[2, 3, 4]), 1, &c).kind,
        DecisionKind::DownUnreachable,
        "oldest's side goes on even as a minority"
    );
    assert_eq!(
        decide_on(&split(&base, &[2, 3, 4], &[0, 1]), 2, &c).kind,
        DecisionKind::DownReachable
    );
}

#[test]
fn keep_oldest_uses_up_number_not_address() {
    let mut g = cluster(3);
    // n9 has the lowest address but joined last
    let young = UniqueAddress::new("a:0", "n9", 1);
    g.add_joining(young.clone(), BTreeSet::new()).unwrap();
    leader_actions(&mut g, &young, false);
    let mut g2 = g.clone();
    for i in 0..3 {
        g2.reachability_mut().unreachable(&young, &n(i));
    }
    g2.touch(&young);
    let c = cfg(Strategy::KeepOldest {
        down_if_alone: false,
    });
    let d = decide(&g2, &young, stable(), &c).unwrap();
    assert_eq!(d.kind, DecisionKind::DownReachable);
}

#[test]
fn keep_oldest_alone() {
    let base = cluster(4);
    let alone = split(&base, &[0], &[1, 2, 3]);
    let rest = split(&base, &[1, 2, 3], &[0]);
    let keep = cfg(Strategy::KeepOldest {
        down_if_alone: false,
    });
    // without down-if-alone the lone oldest wins and the others down themselves
    assert_eq!(
        decide_on(&alone, 0, &keep).kind,
        DecisionKind::DownUnreachable
    );
    assert_eq!(decide_on(&rest, 1, &keep).kind, DecisionKind::DownReachable);
    // with it the oldest downs itself and the others remove it
    let alone_cfg = cfg(Strategy::KeepOldest {
        down_if_alone: true,
    });
    let d = decide_on(&alone, 0, &alone_cfg);
    assert_eq!((d.kind, d.down), (DecisionKind::DownReachable, set(&[0])));
    let d = decide_on(&rest, 1, &alone_cfg);
    assert_eq!((d.kind, d.down), (DecisionKind::DownUnreachable, set(&[0])));
}

#[test]
fn down_all() {
    let base = cluster(3);
    let d = decide_on(&split(&base, &[0, 1], &[2]), 0, &cfg(Strategy::DownAll));
    assert_eq!(d.kind, DecisionKind::DownAll);
    assert_eq!(d.down, set(&[0, 1, 2]));
}

#[test]
fn roles_restrict_counting() {
    let mut g = Gossip::new();
    for i in 0..5u8 {
        let roles = if i >= 3 {
            BTreeSet::from(["db".to_string()])
        } else {
            BTreeSet::new()
        };
        g.add_joining(n(i), roles).unwrap();
    }
    leader_actions(&mut g, &n(0), false);
    let c = DowningConfig {
        role: Some("db".into()),
        ..cfg(Strategy::KeepMajority)
    };
    // {0,1,2} has no db member; {3,4} has both
    let d = decide_on(&split(&g, &[0, 1, 2], &[3, 4]), 0, &c);
    assert_eq!(d.kind, DecisionKind::DownReachable);
}

#[test]
fn stability_timer_resets_on_change() {
    let g = cluster(3);
    let mut t = StabilityTimer::new();
    assert_eq!(t.observe(&g, 1000), Duration::ZERO);
    assert_eq!(t.observe(&g, 2500), Duration::from_millis(1500));
    let g2 = split(&g, &[0], &[2]);
    assert_eq!(t.observe(&g2, 3000), Duration::ZERO);
    assert_eq!(t.observe(&g2, 3700), Duration::from_millis(700));
}

#[test]
fn indirectly_connected_ends_of_a_broken_link_cost_one_node() {
    // n1 and n2 flag each other (their link broke) but both still talk to n0: not a
    // partition. The youngest end goes; n0 is not a "minority of one".
    let mut g = cluster(3);
    g.reachability_mut().unreachable(&n(1), &n(2));
    g.reachability_mut().unreachable(&n(2), &n(1));
    g.touch(&n(1));
    let c = cfg(Strategy::KeepMajority);
    for me in [0, 1, 2] {
        let d = decide_on(&g, me, &c);
        assert_eq!(d.down, set(&[2]), "decided by n{me}");
    }
    // one-way: n1 flags n2, and n2 has seen that (it still gossips with this side)
    let mut g = cluster(3);
    g.reachability_mut().unreachable(&n(1), &n(2));
    g.touch(&n(1));
    g.mark_seen(&n(0));
    g.mark_seen(&n(2));
    assert_eq!(decide_on(&g, 0, &c).down, set(&[2]));
}

#[test]
fn broken_link_inside_one_side_of_a_partition_is_decided_on_the_clean_rest() {
    // {0, 1, 2} | {3, 4}, and inside the majority the link 1 <-> 2 broke too.
    let mut g = split(&cluster(5), &[0, 1, 2], &[3, 4]);
    g.reachability_mut().unreachable(&n(1), &n(2));
    g.reachability_mut().unreachable(&n(2), &n(1));
    g.touch(&n(0));
    let d = decide_on(&g, 0, &cfg(Strategy::KeepMajority));
    // the clean picture is {0, 1} (2 is downed for the broken link) against {3, 4}: a tie
    // that n0 (lowest address) wins
    assert_eq!(d.kind, DecisionKind::DownUnreachable);
    assert_eq!(d.down, set(&[2, 3, 4]));
}

/// A broken link, then a partition that cuts across it: 0 <-> 2 broke (both ends flagged
/// each other, and everyone saw it), then {0, 1} | {2, 3, 4}. The cover downs 2 on both
/// sides; 0, kept by the cover, must count where it really is. Only one side may go on.
#[test]
fn a_partition_across_a_broken_link_lets_only_one_side_go_on() {
    let mut g = cluster(5);
    g.reachability_mut().unreachable(&n(0), &n(2));
    g.reachability_mut().unreachable(&n(2), &n(0));
    g.touch(&n(0));
    for i in 0..5 {
        g.mark_seen(&n(i));
    }
    let c = cfg(Strategy::KeepMajority);
    let left = split(&g, &[0, 1], &[2, 3, 4]);
    let right = split(&g, &[2, 3, 4], &[0, 1]);
    let goes_on = |g: &Gossip, me: u8| {
        let d = decide_on(g, me, &c);
        !d.down.contains(&n(me))
    };
    let left_on = goes_on(&left, 0) && goes_on(&left, 1);
    let right_on = [3, 4].iter().all(|&me| goes_on(&right, me));
    assert!(
        !(left_on && right_on),
        "both sides go on: left downs {:?}, right downs {:?}",
        decide_on(&left, 0, &c).down,
        decide_on(&right, 3, &c).down
    );
    assert!(left_on || right_on, "neither side goes on");
    // Each side's members agree with each other.
    assert_eq!(decide_on(&left, 0, &c).down, decide_on(&left, 1, &c).down);
    assert_eq!(decide_on(&right, 3, &c).down, decide_on(&right, 4, &c).down);
}

#[test]
fn a_node_that_cannot_speak_knows_that_the_side_flagging_it_downs_it() {
    // n1 no longer hears n0 and flagged it; n0 still hears everyone. The view of n1's side
    // has no mark from n0 (its gossip does not get there), n0's own view always has its own.
    let mut theirs = cluster(3);
    theirs.reachability_mut().unreachable(&n(1), &n(0));
    theirs.touch(&n(1));
    theirs.mark_seen(&n(2));
    let mut mine = theirs.clone();
    mine.mark_seen(&n(0));
    let c = cfg(Strategy::KeepMajority);
    // n1's side downs n0.
    assert_eq!(decide_on(&theirs, 1, &c).down, set(&[0]));
    assert_eq!(decide_on(&theirs, 2, &c).down, set(&[0]));
    // n0 reads a broken link on its own view (its own mark says it still talks to the
    // rest), whose flagged end goes: itself, as the other side decides.
    assert_eq!(decide_on(&mine, 0, &c).down, set(&[0]));
    // It knows that the others would down it.
    assert!(would_down(&mine, &n(0), &c));
    assert!(!would_down(&theirs, &n(1), &c));
    assert!(!would_down(&theirs, &n(2), &c));
}

/// Seed 341 of the 6-node partition schedules: {1, 2, 5} | {0, 3, 4} healed for 0.8 s, too
/// briefly for every cleared flag to spread, then {2, 3, 4} | {0, 5} (1 was down). Each side
/// still holds a stale row of a node now on the other side, flagging the nodes it was cut
/// off from before: 0 and 5 hold 2's (2 flags 0, 3, 4), 2, 3 and 4 hold 5's (5 flags 0, 3,
/// 4). Each side reads that node as a broken link's end and leaves it out: 0 and 5 counted
/// {0, 5} against {3, 4}, won the tie and downed 2, 3, 4, while 2, 3 and 4, three against
/// {0}, downed 0 and 5. Only one side may go on.
#[test]
fn stale_flags_of_a_node_now_on_the_other_side_let_only_one_side_go_on() {
    let mut base = cluster(6);
    base.set_status(&n(1), MemberStatus::Down).unwrap();
    let flagged = |rows: &[(u8, u8)], seen: &[u8]| {
        let mut g = base.clone();
        for (o, s) in rows {
            g.reachability_mut().unreachable(&n(*o), &n(*s));
        }
        g.touch(&n(seen[0]));
        for s in seen {
            g.mark_seen(&n(*s));
        }
        g
    };
    // 0's and 5's view: their own flags on 2, 3, 4, and 2's stale row.
    let left = flagged(
        &[
            (0, 2),
            (0, 3),
            (0, 4),
            (5, 2),
            (5, 3),
            (5, 4),
            (2, 0),
            (2, 3),
            (2, 4),
        ],
        &[0, 5],
    );
    // 2's, 3's and 4's view: their own flags on 0 and 5 (3's and 4's on 5 not yet in), and
    // 5's stale row.
    let right = flagged(
        &[(2, 0), (2, 5), (3, 0), (4, 0), (5, 0), (5, 3), (5, 4)],
        &[2],
    );
    let c = cfg(Strategy::KeepMajority);
    let goes_on = |g: &Gossip, me: u8| {
        let d = decide_on(g, me, &c);
        d.kind == DecisionKind::DownUnreachable && !d.down.contains(&n(me))
    };
    let left_on = [0, 5].iter().all(|&me| goes_on(&left, me));
    let right_on = [2, 3, 4].iter().all(|&me| goes_on(&right, me));
    assert!(!left_on, "0 and 5 go on: {:?}", decide_on(&left, 5, &c));
    assert!(right_on, "2, 3 and 4 stop: {:?}", decide_on(&right, 2, &c));
    // And 0 and 5 know it (they are fenced), while 3 and 4 do not stop.
    assert!(would_down(&left, &n(0), &c) && would_down(&left, &n(5), &c));
    assert!(!would_down(&right, &n(3), &c) && !would_down(&right, &n(4), &c));
}

/// The default settings with down-all-when-unstable on (Akka's bound: 4 s).
fn bounded() -> DowningConfig {
    let c = DowningConfig::default();
    DowningConfig {
        down_all_when_unstable: Some(c.akka_unstable_bound()),
        ..c
    }
}

/// Observes `g` at `t` ms with [`bounded`] settings.
fn unstable_at(timer: &mut InstabilityTimer, g: &Gossip, t: u64) -> bool {
    timer.observe(g, t, &bounded())
}

/// A flapping picture: n2 flagged by n0, then n1 flagged too, and so on, each for `every`
/// ms, from `from` to `until` (exclusive); returns what the timer said at each step.
fn flap(
    timer: &mut InstabilityTimer,
    g: &Gossip,
    every: u64,
    (from, until): (u64, u64),
) -> Vec<(u64, bool)> {
    let mut said = Vec::new();
    let mut t = from;
    let mut both = false;
    while t < until {
        let mut g = g.clone();
        g.reachability_mut().unreachable(&n(0), &n(2));
        if both {
            g.reachability_mut().unreachable(&n(0), &n(1));
        }
        said.push((t, unstable_at(timer, &g, t)));
        both = !both;
        t += every;
    }
    said
}

#[test]
fn a_picture_that_keeps_changing_trips_the_bound_after_stable_after_plus_it() {
    let g = cluster(3);
    let mut timer = InstabilityTimer::new();
    assert_eq!(
        DowningConfig::default().down_all_when_unstable,
        None,
        "off by default"
    );
    let bound = stable() + bounded().down_all_when_unstable.unwrap();
    assert_eq!(bound, std::time::Duration::from_secs(6));
    let said = flap(&mut timer, &g, 500, (0, 8_000));
    for (t, unstable) in said {
        assert_eq!(
            unstable,
            u128::from(t) >= bound.as_millis(),
            "at {t} ms (bound {bound:?})"
        );
    }
}

#[test]
fn a_stable_picture_or_a_healed_one_starts_the_measure_over() {
    let g = cluster(3);
    let mut flagged = g.clone();
    flagged.reachability_mut().unreachable(&n(0), &n(2));
    // Stable: decided the usual way; never unstable however long it lasts.
    let mut timer = InstabilityTimer::new();
    for t in (0..60_000).step_by(500) {
        assert!(!unstable_at(&mut timer, &flagged, t), "at {t} ms");
    }
    // Flapping for 5 s, healed, flapping again: the measure starts over at the second flap.
    let mut timer = InstabilityTimer::new();
    assert!(flap(&mut timer, &g, 500, (0, 5_000))
        .iter()
        .all(|(_, u)| !u));
    assert!(!unstable_at(&mut timer, &g, 5_000), "healed");
    let again = flap(&mut timer, &g, 500, (5_500, 11_000));
    assert!(again.iter().all(|(_, u)| !u), "{again:?}");
    assert!(
        flap(&mut timer, &g, 500, (11_500, 12_000))[0].1,
        "6 s into the second flap"
    );
    // Flapping that settles for twice `stable_after` starts over (and a picture that
    // settles is decided the usual way, `stable_after` after its last change).
    let mut timer = InstabilityTimer::new();
    flap(&mut timer, &g, 500, (0, 1_500));
    let mut still = g.clone();
    still.reachability_mut().unreachable(&n(0), &n(2));
    for t in (1_500..20_000).step_by(500) {
        assert!(!unstable_at(&mut timer, &still, t), "at {t} ms");
    }
    // Flapping 5 s and then still: the bound counts from the first flag.
    let mut timer = InstabilityTimer::new();
    flap(&mut timer, &g, 500, (0, 5_000));
    assert!(!unstable_at(&mut timer, &still, 5_500));
    assert!(unstable_at(&mut timer, &still, 6_000));
}

#[test]
fn membership_changes_alone_never_trip_the_bound_and_none_turns_it_off() {
    // A member joins every 500 ms while n2 stays flagged: the stability timer keeps
    // starting over, the instability measure does not see a change.
    let mut g = cluster(3);
    g.reachability_mut().unreachable(&n(0), &n(2));
    let mut timer = InstabilityTimer::new();
    for (i, t) in (0..20_000).step_by(500).enumerate() {
        let joiner = 10 + i as u8;
        g.add_joining(n(joiner), BTreeSet::new()).unwrap();
        assert!(!unstable_at(&mut timer, &g, t), "at {t} ms");
    }
    // Off: a flapping picture never trips it.
    let off = DowningConfig {
        down_all_when_unstable: None,
        ..DowningConfig::default()
    };
    let mut timer = InstabilityTimer::new();
    let g = cluster(3);
    for (i, t) in (0..30_000).step_by(500).enumerate() {
        let mut g = g.clone();
        g.reachability_mut().unreachable(&n(0), &n(2));
        if i % 2 == 1 {
            g.reachability_mut().unreachable(&n(0), &n(1));
        }
        assert!(!timer.observe(&g, t, &off), "at {t} ms");
    }
}

#[test]
fn a_decision_or_members_already_down_start_the_measure_over() {
    let g = cluster(4);
    // Flapping for 5 s, then the leader downs someone: the measure starts over.
    let mut timer = InstabilityTimer::new();
    flap(&mut timer, &g, 500, (0, 5_000));
    timer.reset();
    assert!(flap(&mut timer, &g, 500, (5_000, 10_500))
        .iter()
        .all(|(_, u)| !u));
    // n2 and n1 flagged and n2 downed (not removed yet): n2 counts as dealt with, so only
    // n1 coming and going changes the picture, and n1 flagged alone holds still.
    let mut timer = InstabilityTimer::new();
    let mut downed = g.clone();
    downed.set_status(&n(2), MemberStatus::Down).unwrap();
    for (i, t) in (0..20_000).step_by(500).enumerate() {
        let mut g = downed.clone();
        g.reachability_mut().unreachable(&n(0), &n(1));
        if i % 2 == 1 {
            g.reachability_mut().unreachable(&n(0), &n(2));
        }
        assert!(!unstable_at(&mut timer, &g, t), "at {t} ms");
    }
}
