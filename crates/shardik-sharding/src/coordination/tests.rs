//! Unit tests of the coordinator and the region, one protocol step at a time.

use super::*;
use crate::ShardId;

fn r(s: &str) -> RegionId {
    RegionId::new(s)
}

fn cfg(shards: u32) -> CoordinatorConfig {
    let mut c = CoordinatorConfig::new(shards);
    c.rebalance_interval_ms = 1_000;
    c.handoff_ack_timeout_ms = 5_000;
    c.handoff_stop_retry_ms = 5_000;
    c
}

/// A coordinator with its epoch persisted and the given regions registered (all persisted).
fn coordinator(shards: u32, regions: &[&str]) -> Coordinator {
    let (mut c, _) = Coordinator::new(cfg(shards));
    let mut out = Vec::new();
    c.handle(0, Input::Persisted(1), &mut out);
    for name in regions {
        register(&mut c, name);
    }
    c
}

fn register(c: &mut Coordinator, name: &str) -> Vec<Action> {
    let mut out = register_unstored(c, name);
    persist_all(c, &mut out);
    out
}

/// `name` registers (attempt 1); its registration is not stored yet.
fn register_unstored(c: &mut Coordinator, name: &str) -> Vec<Action> {
    let shard_count = c.state().shard_count;
    msg(
        c,
        0,
        name,
        ToCoordinator::Register {
            shard_count,
            proxy: false,
            shard_fn: None,
            attempt: 1,
        },
    )
}

/// Acknowledge every emitted update.
fn persist_all(c: &mut Coordinator, out: &mut Vec<Action>) {
    let v = c.working_state().version;
    c.handle(0, Input::Persisted(v), out);
}

fn msg(c: &mut Coordinator, now: u64, from: &str, m: ToCoordinator) -> Vec<Action> {
    let mut out = Vec::new();
    c.handle(
        now,
        Input::Message {
            from: r(from),
            msg: m,
        },
        &mut out,
    );
    out
}

/// The messages sent, with fencing tokens zeroed (tokens have tests of their own).
fn sends(out: &[Action]) -> Vec<(RegionId, ToRegion)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Send { to, msg } => Some((to.clone(), without_token(msg.clone()))),
            Action::Persist(_) => None,
        })
        .collect()
}

fn without_token(msg: ToRegion) -> ToRegion {
    match msg {
        ToRegion::ShardHome {
            epoch,
            shard,
            region,
            ..
        } => ToRegion::ShardHome {
            epoch,
            shard,
            region,
            token: 0,
        },
        ToRegion::RegisterAck {
            epoch,
            homes,
            attempt,
            ..
        } => ToRegion::RegisterAck {
            epoch,
            homes,
            tokens: vec![],
            attempt,
        },
        other => other,
    }
}

/// The changes persisted, with fencing tokens zeroed.
fn persists(out: &[Action]) -> Vec<Change> {
    out.iter()
        .filter_map(|a| match a {
            Action::Persist(u) => Some(match u.change.clone() {
                Change::ShardAllocated { shard, region, .. } => Change::ShardAllocated {
                    shard,
                    region,
                    token: 0,
                },
                other => other,
            }),
            Action::Send { .. } => None,
        })
        .collect()
}

fn get_home(c: &mut Coordinator, from: &str, shard: u32) -> Vec<Action> {
    let epoch = c.epoch();
    msg(c, 0, from, ToCoordinator::GetShardHome { epoch, shard })
}

/// Allocate shards by asking, persisting after each.
fn allocate(c: &mut Coordinator, shards: impl IntoIterator<Item = u32>) {
    for s in shards {
        let mut out = get_home(c, "a", s);
        persist_all(c, &mut out);
    }
}

// ---- coordinator: registration ----------------------------------------------------------------

#[test]
fn registration_is_persisted_before_ack_and_idempotent() {
    let (mut c, first) = Coordinator::new(cfg(4));
    assert_eq!(persists(&first), vec![Change::EpochStarted]);
    let out = msg(
        &mut c,
        0,
        "a",
        ToCoordinator::Register {
            shard_count: 4,
            proxy: false,
            shard_fn: None,
            attempt: 1,
        },
    );
    assert_eq!(persists(&out).len(), 1);
    assert!(sends(&out).is_empty(), "no ack before persistence");
    let mut out = Vec::new();
    c.handle(0, Input::Persisted(1), &mut out);
    assert!(sends(&out).is_empty(), "registration not yet durable");
    c.handle(0, Input::Persisted(2), &mut out);
    assert!(matches!(
        &sends(&out)[..],
        [(_, ToRegion::RegisterAck { epoch: 1, .. })]
    ));
    // A retry: acknowledged again, nothing persisted.
    let out = msg(
        &mut c,
        0,
        "a",
        ToCoordinator::Register {
            shard_count: 4,
            proxy: false,
            shard_fn: None,
            attempt: 1,
        },
    );
    assert!(persists(&out).is_empty());
    assert!(matches!(
        &sends(&out)[..],
        [(_, ToRegion::RegisterAck { .. })]
    ));
}

#[test]
fn shard_count_mismatch_is_refused_with_a_clear_error() {
    let mut c = coordinator(4, &[]);
    let out = msg(
        &mut c,
        0,
        "a",
        ToCoordinator::Register {
            shard_count: 8,
            proxy: false,
            shard_fn: None,
            attempt: 1,
        },
    );
    let [(_, ToRegion::RegisterRefused { error, .. })] = &sends(&out)[..] else {
        panic!("{out:?}")
    };
    assert_eq!(
        *error,
        RegisterError::ShardCountMismatch {
            coordinator: 4,
            region: 8
        }
    );
    assert!(error.to_string().contains("same shard count"));
    assert!(persists(&out).is_empty());
    // And the region side turns it into an error for every sender.
    let mut region: RegionState<u8> = RegionState::new(r("a"), RegionConfig::new(8));
    let mut acts = Vec::new();
    region.handle(0, RegionInput::CoordinatorChanged, &mut Vec::new());
    region.handle(
        0,
        RegionInput::FromCoordinator(sends(&out)[0].1.clone()),
        &mut acts,
    );
    assert!(matches!(acts[..], [RegionAction::Refused(_)]));
    let err = region
        .send(0, Envelope::new("x", 1, 0), &mut acts)
        .unwrap_err();
    assert!(matches!(err.error, SendError::Refused(_)));
}

// ---- coordinator: allocation ------------------------------------------------------------------

#[test]
fn allocation_is_least_shards_first_with_ties_by_region_id() {
    let mut c = coordinator(8, &["b", "c", "a"]);
    // Ask for four shards without persisting in between: decisions count pending allocations.
    let mut chosen = Vec::new();
    for s in 0..6 {
        for ch in persists(&get_home(&mut c, "a", s)) {
            if let Change::ShardAllocated { region, .. } = ch {
                chosen.push(region.0);
            }
        }
    }
    assert_eq!(chosen, ["a", "b", "c", "a", "b", "c"]);
    // No reply before persistence; then a broadcast per allocation.
    let mut out = Vec::new();
    persist_all(&mut c, &mut out);
    let homes = sends(&out)
        .into_iter()
        .filter(|(_, m)| matches!(m, ToRegion::ShardHome { .. }))
        .count();
    assert_eq!(homes, 6 * 3);
}

#[test]
fn requests_for_a_shard_being_persisted_wait() {
    let mut c = coordinator(4, &["a"]);
    let first = get_home(&mut c, "a", 0);
    assert_eq!(persists(&first).len(), 1);
    let second = get_home(&mut c, "a", 0);
    assert!(second.is_empty(), "queued until persisted: {second:?}");
    let mut out = Vec::new();
    persist_all(&mut c, &mut out);
    let s = sends(&out);
    assert!(s.len() >= 2, "broadcast and the queued answer: {s:?}");
    assert!(s
        .iter()
        .all(|(_, m)| matches!(m, ToRegion::ShardHome { shard: 0, .. })));
    // Once durable, answered at once.
    let third = get_home(&mut c, "a", 0);
    assert!(matches!(
        &sends(&third)[..],
        [(_, ToRegion::ShardHome { .. })]
    ));
}

#[test]
fn deferred_replies_are_bounded() {
    let mut config = cfg(4);
    config.max_deferred = 2;
    let (mut c, _) = Coordinator::new(config);
    let mut out = Vec::new();
    c.handle(0, Input::Persisted(1), &mut out);
    register(&mut c, "a");
    let _ = get_home(&mut c, "a", 0); // pending allocation
    for _ in 0..5 {
        let _ = get_home(&mut c, "a", 0);
    }
    // One reply waits (the allocation's broadcast is the other deferred item); four are dropped.
    assert_eq!(c.stats().deferred_dropped, 4);
    // The bound is full, but a further allocation's broadcast (a step of a state change, which
    // nobody retries) still waits for its persistence and goes out.
    let mut out = get_home(&mut c, "a", 1);
    assert_eq!(c.stats().deferred_dropped, 4, "the broadcast was kept");
    persist_all(&mut c, &mut out);
    assert!(
        sends(&out)
            .iter()
            .any(|(to, m)| *to == r("a") && matches!(m, ToRegion::ShardHome { shard: 1, .. })),
        "shard 1's home was broadcast: {out:?}"
    );
}

// ---- coordinator: hand-off ----------------------------------------------------------------------

/// `a` holds shards 0..4, `b` none; a rebalance tick starts hand-offs. Returns them.
fn start_rebalance(c: &mut Coordinator) -> Vec<(RegionId, ToRegion)> {
    allocate(c, 0..4);
    register(c, "b");
    let mut out = Vec::new();
    c.handle(0, Input::MembershipStable(true), &mut out);
    c.handle(1_000, Input::Tick, &mut out);
    sends(&out)
}

#[test]
fn rebalance_waits_for_stable_membership() {
    let mut c = coordinator(4, &["a"]);
    allocate(&mut c, 0..4);
    register(&mut c, "b");
    let mut out = Vec::new();
    c.handle(1_000, Input::Tick, &mut out);
    assert!(out.is_empty());
    c.handle(1_000, Input::MembershipStable(true), &mut out);
    c.handle(2_000, Input::Tick, &mut out);
    let begins = sends(&out)
        .into_iter()
        .filter(|(_, m)| matches!(m, ToRegion::BeginHandOff { .. }))
        .count();
    // 4 shards: the round limit is max(1, 25 % of 4) = 1 shard, announced to both regions.
    assert_eq!(begins, 2);
}

#[test]
fn balanced_coordinator_rebalances_as_soon_as_a_region_joins() {
    let mut c = coordinator(4, &["a"]);
    allocate(&mut c, 0..4);
    let mut out = Vec::new();
    c.handle(0, Input::MembershipStable(true), &mut out);
    // Ticks while balanced (one region) start no round and do not restart the interval.
    for t in [100, 500, 900] {
        c.handle(t, Input::Tick, &mut out);
    }
    assert!(sends(&out).is_empty());
    register(&mut c, "b");
    let mut out = Vec::new();
    c.handle(1_000, Input::Tick, &mut out);
    let begins = |out: &[Action]| {
        sends(out)
            .into_iter()
            .filter(|(_, m)| matches!(m, ToRegion::BeginHandOff { .. }))
            .count()
    };
    assert_eq!(
        begins(&out),
        2,
        "the first round starts at the first tick after the join"
    );
    assert_eq!(c.stats().rebalance_rounds, 1);
}

#[test]
fn full_hand_off_persists_before_the_new_home_is_announced() {
    let mut c = coordinator(4, &["a"]);
    let begins = start_rebalance(&mut c);
    let (id, shard) = match begins[0].1 {
        ToRegion::BeginHandOff { id, shard } => (id, shard),
        ref m => panic!("{m:?}"),
    };
    // `b` had `a` cached and fenced it; `a` is the owner.
    let out = msg(
        &mut c,
        1_000,
        "b",
        ToCoordinator::BeginHandOffAck {
            id,
            shard,
            fenced: Some(r("a")),
        },
    );
    assert!(out.is_empty());
    let out = msg(
        &mut c,
        1_000,
        "a",
        ToCoordinator::BeginHandOffAck {
            id,
            shard,
            fenced: None,
        },
    );
    assert_eq!(
        sends(&out),
        vec![(
            r("a"),
            ToRegion::HandOff {
                id,
                shard,
                fences: vec![r("b")]
            }
        )]
    );
    let out = msg(
        &mut c,
        1_000,
        "a",
        ToCoordinator::ShardStopped { id, shard },
    );
    assert_eq!(
        persists(&out),
        vec![
            Change::ShardDeallocated { shard },
            Change::ShardAllocated {
                shard,
                region: r("b"),
                token: 0,
            }
        ]
    );
    assert!(
        sends(&out).is_empty(),
        "nothing announced before persistence"
    );
    let mut out = Vec::new();
    persist_all(&mut c, &mut out);
    let s = sends(&out);
    assert!(s.contains(&(
        r("a"),
        ToRegion::ShardHome {
            epoch: 1,
            shard,
            region: r("b"),
            token: 0,
        }
    )));
    assert_eq!(c.stats().handoffs_completed, 1);
    // A late duplicate ShardStopped is ignored.
    let out = msg(
        &mut c,
        1_000,
        "a",
        ToCoordinator::ShardStopped { id, shard },
    );
    assert!(out.is_empty());
    assert_eq!(c.stats().stray_handoff_messages, 1);
}

#[test]
fn missing_acks_abort_the_hand_off_and_the_owner_keeps_the_shard() {
    let mut c = coordinator(4, &["a"]);
    let begins = start_rebalance(&mut c);
    let ToRegion::BeginHandOff { id, shard } = begins[0].1 else {
        panic!()
    };
    let _ = msg(
        &mut c,
        1_000,
        "a",
        ToCoordinator::BeginHandOffAck {
            id,
            shard,
            fenced: None,
        },
    );
    let mut out = Vec::new();
    c.handle(5_999, Input::Tick, &mut out);
    assert!(out.iter().all(|a| !matches!(
        a,
        Action::Send {
            msg: ToRegion::ShardHome { .. },
            ..
        }
    )));
    c.handle(6_000, Input::Tick, &mut out);
    assert_eq!(c.stats().handoffs_aborted, 1);
    // The attempt is gone (the same tick may start a fresh attempt with a new id: the retry).
    assert!(c.handoffs().all(|h| h.id != id));
    assert!(persists(&out).is_empty(), "abort changes no allocation");
    assert!(sends(&out).contains(&(
        r("b"),
        ToRegion::ShardHome {
            epoch: 1,
            shard,
            region: r("a"),
            token: 0,
        }
    )));
    // The late ack of the aborted attempt is ignored.
    let out = msg(
        &mut c,
        6_000,
        "b",
        ToCoordinator::BeginHandOffAck {
            id,
            shard,
            fenced: None,
        },
    );
    assert!(out.is_empty());
    assert_eq!(c.state().home(shard), Some(&r("a")));
}

#[test]
fn missing_shard_stopped_retries_hand_off_and_never_reallocates() {
    let mut c = coordinator(4, &["a"]);
    let begins = start_rebalance(&mut c);
    let ToRegion::BeginHandOff { id, shard } = begins[0].1 else {
        panic!()
    };
    for from in ["a", "b"] {
        let _ = msg(
            &mut c,
            1_000,
            from,
            ToCoordinator::BeginHandOffAck {
                id,
                shard,
                fenced: None,
            },
        );
    }
    for t in [6_000, 11_000, 16_000] {
        let mut out = Vec::new();
        c.handle(t, Input::Tick, &mut out);
        assert!(sends(&out).contains(&(
            r("a"),
            ToRegion::HandOff {
                id,
                shard,
                fences: vec![]
            }
        )));
        assert!(persists(&out).is_empty());
    }
    assert_eq!(c.stats().handoff_retries, 3);
    assert_eq!(c.working_state().home(shard), Some(&r("a")));
    // The owner's node is downed: its entities are stopped, so the shard is freed.
    let mut out = Vec::new();
    c.handle(17_000, Input::RegionDown(r("a")), &mut out);
    assert_eq!(
        persists(&out),
        vec![Change::RegionRemoved { region: r("a") }]
    );
    assert!(c.handoffs().all(|h| h.shard != shard));
}

/// A region taken for gone that turns out to be there (`RegionBack`: the view did not hold
/// its node yet) keeps its shards: the held request is answered with its home, and it gets
/// new shards again.
#[test]
fn a_region_back_from_gone_keeps_its_shards_and_answers_held_requests() {
    let mut c = coordinator(8, &["a", "b"]);
    allocate(&mut c, 0..2);
    let shard = (0..2)
        .find(|s| c.state().home(*s) == Some(&r("a")))
        .expect("a shard on a");
    let mut out = Vec::new();
    c.handle(1_000, Input::RegionGone(r("a")), &mut out);
    assert!(get_home(&mut c, "b", shard).is_empty(), "held while gone");
    let mut out = Vec::new();
    c.handle(1_100, Input::RegionBack(r("a")), &mut out);
    assert!(persists(&out).is_empty(), "nothing moves");
    assert_eq!(
        sends(&out),
        vec![(
            r("b"),
            ToRegion::ShardHome {
                epoch: c.epoch(),
                shard,
                region: r("a"),
                token: 0,
            }
        )]
    );
    assert_eq!(c.state().home(shard), Some(&r("a")));
    // A region that is down stays down.
    let mut out = Vec::new();
    c.handle(1_200, Input::RegionDown(r("a")), &mut out);
    persist_all(&mut c, &mut out);
    let mut out = Vec::new();
    c.handle(1_300, Input::RegionBack(r("a")), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_ne!(c.state().home(shard), Some(&r("a")));
}

/// Between `RegionGone` (its node is down, its entities may still be stopping) and
/// `RegionDown`, a region asking for the home of a gone region's shard is not answered with
/// that home (it would ignore it and ask again after its retry interval): the request is held,
/// and `RegionDown` reallocates the shard at once; the broadcast of the new home answers every
/// asker without a retry. Nothing is allocated to the gone region meanwhile.
#[test]
fn home_requests_during_the_down_margin_are_answered_on_region_down() {
    let mut c = coordinator(8, &["a", "b", "c"]);
    allocate(&mut c, 0..3);
    let lost: Vec<u32> = (0..3)
        .filter(|s| c.state().home(*s) == Some(&r("a")))
        .collect();
    let [shard] = lost[..] else {
        panic!("one shard on a: {:?}", c.state().shards)
    };
    let mut out = Vec::new();
    c.handle(1_000, Input::RegionGone(r("a")), &mut out);
    assert!(out.is_empty(), "{out:?}");
    // During the margin: b and c (twice: a retry) ask; nothing is answered, nothing persisted.
    for asker in ["b", "c", "c"] {
        let out = get_home(&mut c, asker, shard);
        assert!(out.is_empty(), "{asker}: {out:?}");
    }
    // A new shard is not allocated to the gone region (b and c hold one each, a one).
    for (asker, new) in [("b", 5), ("c", 6)] {
        let mut out = get_home(&mut c, asker, new);
        persist_all(&mut c, &mut out);
        assert_ne!(c.state().home(new), Some(&r("a")), "shard {new}");
    }
    // The margin is over: the shard is reallocated at once and its home broadcast.
    let mut out = Vec::new();
    c.handle(1_500, Input::RegionDown(r("a")), &mut out);
    let p = persists(&out);
    assert_eq!(p[0], Change::RegionRemoved { region: r("a") });
    let [Change::ShardAllocated {
        shard: s,
        region: to,
        ..
    }] = &p[1..]
    else {
        panic!("{p:?}")
    };
    assert_eq!(*s, shard);
    assert!(*to == r("b") || *to == r("c"), "{to}");
    assert!(sends(&out).is_empty(), "nothing before it is durable");
    let mut out = Vec::new();
    persist_all(&mut c, &mut out);
    let answered: Vec<RegionId> = sends(&out)
        .into_iter()
        .filter(|(_, m)| {
            matches!(m, ToRegion::ShardHome { shard: s, region, .. } if *s == shard && region == to)
        })
        .map(|(r, _)| r)
        .collect();
    assert_eq!(answered, [r("b"), r("c")]);
    assert!(c.state().shards.values().all(|h| *h != r("a")));
    // Held requests are answered once: a later request gets the (durable) home as usual.
    let out = get_home(&mut c, "b", shard);
    assert!(matches!(
        &sends(&out)[..],
        [(_, ToRegion::ShardHome { region, .. })] if region == to
    ));
}

#[test]
fn region_down_reallocates_remembered_shards_eagerly() {
    let mut config = cfg(4);
    config.remember_shards = true;
    let (mut c, _) = Coordinator::new(config);
    let mut out = Vec::new();
    c.handle(0, Input::Persisted(1), &mut out);
    register(&mut c, "a");
    register(&mut c, "b");
    allocate(&mut c, 0..4);
    let mut out = Vec::new();
    c.handle(0, Input::RegionDown(r("a")), &mut out);
    let p = persists(&out);
    assert_eq!(p[0], Change::RegionRemoved { region: r("a") });
    assert_eq!(
        p[1..]
            .iter()
            .filter(|c| matches!(c, Change::ShardAllocated { region, .. } if *region == r("b")))
            .count(),
        2
    );
    let mut out = Vec::new();
    persist_all(&mut c, &mut out);
    assert_eq!(c.state().shards.len(), 4);
    // `b` learns it hosts them without any message for their entities.
    assert_eq!(
        sends(&out)
            .iter()
            .filter(|(to, m)| *to == r("b")
                && matches!(m, ToRegion::ShardHome { region, .. } if *region == r("b")))
            .count(),
        2
    );
    // A downed region may not come back.
    let out = register(&mut c, "a");
    assert!(matches!(
        &sends(&out)[..],
        [(
            _,
            ToRegion::RegisterRefused {
                error: RegisterError::Downed(_),
                ..
            }
        )]
    ));
}

#[test]
fn graceful_leave_hands_off_all_shards_then_completes() {
    let mut c = coordinator(4, &["a", "b"]);
    allocate(&mut c, 0..4);
    let mut out = Vec::new();
    c.handle(0, Input::RegionLeaving(r("a")), &mut out);
    let begun: Vec<_> = sends(&out)
        .into_iter()
        .filter_map(|(to, m)| match m {
            ToRegion::BeginHandOff { id, shard } if to == r("a") => Some((id, shard)),
            _ => None,
        })
        .collect();
    assert_eq!(begun.len(), 2);
    for (id, shard) in &begun {
        for from in ["a", "b"] {
            let _ = msg(
                &mut c,
                0,
                from,
                ToCoordinator::BeginHandOffAck {
                    id: *id,
                    shard: *shard,
                    fenced: None,
                },
            );
        }
        let _ = msg(
            &mut c,
            0,
            "a",
            ToCoordinator::ShardStopped {
                id: *id,
                shard: *shard,
            },
        );
    }
    let mut out = Vec::new();
    persist_all(&mut c, &mut out);
    assert!(c.state().shards.values().all(|h| *h == r("b")));
    assert!(sends(&out).contains(&(r("a"), ToRegion::LeaveComplete { epoch: 1 })));
}

/// `LeaveComplete` is a control message that may be lost: every `Leaving` of a region that
/// owns no shard is answered (before 2026-11-29 only the first was, and a region whose answer
/// was lost asked until its leave timed out), and ticks do not repeat it.
#[test]
fn every_leaving_of_a_region_without_shards_is_answered() {
    let mut c = coordinator(4, &["a", "b"]);
    allocate(&mut c, 0..4); // least shards first: two each
    let done = (r("b"), ToRegion::LeaveComplete { epoch: 1 });
    let mut out = Vec::new();
    c.handle(0, Input::RegionLeaving(r("b")), &mut out);
    assert!(!sends(&out).contains(&done), "b still owns shards");
    let begun: Vec<_> = sends(&out)
        .into_iter()
        .filter_map(|(to, m)| match m {
            ToRegion::BeginHandOff { id, shard } if to == r("b") => Some((id, shard)),
            _ => None,
        })
        .collect();
    assert_eq!(begun.len(), 2);
    let mut out = Vec::new();
    for (id, shard) in begun {
        for from in ["a", "b"] {
            out.extend(msg(
                &mut c,
                0,
                from,
                ToCoordinator::BeginHandOffAck {
                    id,
                    shard,
                    fenced: None,
                },
            ));
        }
        out.extend(msg(
            &mut c,
            0,
            "b",
            ToCoordinator::ShardStopped { id, shard },
        ));
    }
    persist_all(&mut c, &mut out);
    assert_eq!(sends(&out).iter().filter(|s| **s == done).count(), 1);
    // The answer was lost: the region asks again, and again.
    for round in 1..=2 {
        let mut out = Vec::new();
        c.handle(round, Input::RegionLeaving(r("b")), &mut out);
        assert_eq!(sends(&out), vec![done.clone()], "round {round}");
    }
    let mut out = Vec::new();
    c.handle(3, Input::Tick, &mut out);
    assert!(!sends(&out).contains(&done), "{out:?}");
}

/// A leave's hand-offs wait while a region's `RegisterAck` waits for its registration to be
/// stored: that region would ignore a `BeginHandOff` (it is not registered with the epoch
/// yet) and the hand-off would wait `handoff_ack_timeout` for its answer. Once stored, the
/// region gets its `RegisterAck` first and the `BeginHandOff` after it. (Before 2026-11-29
/// the hand-off began at once.)
#[test]
fn a_leave_waits_for_a_deferred_register_ack_before_its_hand_offs() {
    let mut c = coordinator(4, &["a", "b"]);
    allocate(&mut c, 0..4); // two each
    let out = register_unstored(&mut c, "c");
    assert!(
        sends(&out).is_empty(),
        "c's ack waits for its registration: {out:?}"
    );
    let mut out = Vec::new();
    c.handle(0, Input::RegionLeaving(r("b")), &mut out);
    c.handle(1, Input::Tick, &mut out);
    assert!(
        !sends(&out)
            .iter()
            .any(|(_, m)| matches!(m, ToRegion::BeginHandOff { .. })),
        "no hand-off while c is not told: {out:?}"
    );
    persist_all(&mut c, &mut out);
    let to_c: Vec<&'static str> = sends(&out)
        .into_iter()
        .filter(|(to, _)| *to == r("c"))
        .map(|(_, m)| match m {
            ToRegion::RegisterAck { .. } => "ack",
            ToRegion::BeginHandOff { .. } => "begin",
            _ => "other",
        })
        .collect();
    assert_eq!(to_c.first(), Some(&"ack"), "{to_c:?}");
    assert_eq!(
        to_c.iter().filter(|m| **m == "begin").count(),
        2,
        "b's two shards: {to_c:?}"
    );
}

// ---- coordinator: failover ----------------------------------------------------------------------

#[test]
fn recovery_bumps_the_epoch_and_waits_for_regions_before_hand_offs() {
    let mut c = coordinator(4, &["a", "b"]);
    allocate(&mut c, 0..4);
    // An update emitted but never persisted is not assumed by the successor.
    let _ = register_unstored(&mut c, "c");
    let state = c.state().clone();
    assert!(!state.regions.contains_key(&r("c")));
    assert!(matches!(
        Coordinator::recover(cfg(4), state.clone(), 1),
        Err(RecoverError::EpochNotIncreasing { .. })
    ));
    assert!(matches!(
        Coordinator::recover(cfg(5), state.clone(), 2),
        Err(RecoverError::ShardCountMismatch { .. })
    ));
    let (mut n, first) = Coordinator::recover(cfg(4), state, 2).unwrap();
    assert_eq!(persists(&first), vec![Change::EpochStarted]);
    assert_eq!(n.epoch(), 2);
    let mut out = Vec::new();
    n.handle(
        0,
        Input::Persisted(first.len() as u64 + c.state().version),
        &mut out,
    );
    // Old-epoch messages are refused.
    let out = msg(
        &mut n,
        0,
        "a",
        ToCoordinator::GetShardHome { epoch: 1, shard: 0 },
    );
    assert!(matches!(
        &sends(&out)[..],
        [(_, ToRegion::StaleEpoch { epoch: 2 })]
    ));
    // Only `a` re-registered: no rebalance or leave hand-off yet.
    let out = register(&mut n, "a");
    let [(_, ToRegion::RegisterAck { homes, .. })] = &sends(&out)[..] else {
        panic!("{out:?}")
    };
    assert_eq!(homes.len(), 4, "every durable home is sent on registration");
    assert!(!n.all_registered());
    let mut out = Vec::new();
    n.handle(0, Input::MembershipStable(true), &mut out);
    n.handle(0, Input::RegionLeaving(r("a")), &mut out);
    n.handle(5_000, Input::Tick, &mut out);
    assert!(n.handoffs().next().is_none());
    register(&mut n, "b");
    let mut out = Vec::new();
    n.handle(6_000, Input::Tick, &mut out);
    assert_eq!(n.handoffs().count(), 2);
}

/// A recovered coordinator calls the regions of its state that have not registered with its
/// epoch, every `REREGISTER_CALL_MS` until they have: a region that sends nothing (every home
/// cached) would otherwise keep the old epoch, and hand-offs wait for it (a coordinator that
/// recovers again on the same node changes no region's view of where it runs). Found by an
/// audit on 2026-11-29.
#[test]
fn a_recovered_coordinator_calls_the_regions_that_have_not_registered_again() {
    let mut c = coordinator(4, &["a", "b"]);
    allocate(&mut c, 0..4);
    let (mut n, first) = Coordinator::recover(cfg(4), c.state().clone(), 2).unwrap();
    let mut out = Vec::new();
    n.handle(0, Input::Tick, &mut out);
    assert!(
        sends(&out).is_empty(),
        "not before the epoch is durable: {out:?}"
    );
    n.handle(
        0,
        Input::Persisted(first.len() as u64 + c.state().version),
        &mut out,
    );
    let stale = ToRegion::StaleEpoch { epoch: 2 };
    let mut out = Vec::new();
    n.handle(10, Input::Tick, &mut out);
    assert_eq!(
        sends(&out),
        vec![(r("a"), stale.clone()), (r("b"), stale.clone())]
    );
    register(&mut n, "a");
    let mut out = Vec::new();
    n.handle(500, Input::Tick, &mut out);
    assert!(
        sends(&out).is_empty(),
        "not again within the interval: {out:?}"
    );
    n.handle(10 + REREGISTER_CALL_MS, Input::Tick, &mut out);
    assert_eq!(
        sends(&out),
        vec![(r("b"), stale.clone())],
        "only b is silent"
    );
    register(&mut n, "b");
    let mut out = Vec::new();
    n.handle(10 * REREGISTER_CALL_MS, Input::Tick, &mut out);
    assert!(sends(&out).is_empty(), "everyone registered: {out:?}");
    assert_eq!(n.stats().reregister_calls, 3);
    // A region of the old epoch answers the call by registering again.
    let mut reg = registered("a", &[(1, "a")]);
    let out = from_coord(&mut reg, 0, stale);
    assert!(
        matches!(
            &out[..],
            [RegionAction::ToCoordinator(ToCoordinator::Register { .. })]
        ),
        "{out:?}"
    );
}

// ---- region -------------------------------------------------------------------------------------

type Acts = Vec<RegionAction<u32>>;

fn region(name: &str) -> RegionState<u32> {
    let mut c = RegionConfig::new(8);
    c.retry_interval_ms = 100;
    c.stop_timeout_ms = 1_000;
    c.buffer_limit = 3;
    RegionState::new(r(name), c)
}

fn from_coord(reg: &mut RegionState<u32>, now: u64, m: ToRegion) -> Acts {
    let mut out = Vec::new();
    reg.handle(now, RegionInput::FromCoordinator(m), &mut out);
    out
}

fn registered(name: &str, homes: &[(u32, &str)]) -> RegionState<u32> {
    registered_as(region(name), homes)
}

/// `reg`, registered with the coordinator of epoch 1, which gave it `homes`.
fn registered_as(mut reg: RegionState<u32>, homes: &[(u32, &str)]) -> RegionState<u32> {
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    let homes = homes.iter().map(|(s, h)| (*s, r(h))).collect();
    from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 1,
            homes,
            attempt: 1,
            tokens: vec![],
        },
    );
    reg
}

fn env(id: &str, shard: u32, n: u32) -> Envelope<u32> {
    Envelope::new(id, shard, n)
}

const H: HandOffId = HandOffId { epoch: 1, seq: 7 };

/// `BeginHandOff` then `HandOff` of shard 1 (hand-off `H`) waiting for `fences`; returns what
/// the `HandOff` led to.
fn hand_off(reg: &mut RegionState<u32>, fences: Vec<RegionId>) -> Acts {
    from_coord(reg, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    from_coord(
        reg,
        0,
        ToRegion::HandOff {
            id: H,
            shard: 1,
            fences,
        },
    )
}

/// A stopping node takes what waits for a home out of the region, in order per shard, so
/// nothing forwards it after it was recorded as a dead letter.
#[test]
fn taking_the_buffered_messages_leaves_nothing_to_forward() {
    let mut reg = registered("a", &[]);
    let mut out = Vec::new();
    for n in 1..=3 {
        reg.send(0, env("x", 1, n), &mut out).unwrap();
    }
    reg.send(0, env("y", 2, 4), &mut out).unwrap();
    assert_eq!(reg.buffered(), 4);
    let mut taken: Vec<(u32, u32)> = reg
        .take_buffered()
        .into_iter()
        .map(|e| (e.shard, e.payload))
        .collect();
    taken.sort_by_key(|(shard, _)| *shard); // shards in any order, each in its own order
    assert_eq!(taken, vec![(1, 1), (1, 2), (1, 3), (2, 4)]);
    assert_eq!(reg.buffered(), 0);
    // A home arriving now forwards nothing.
    let out = shard_1_home(&mut reg, 0, "b");
    assert!(forwarded(&out).is_empty(), "{out:?}");
}

/// A forwarded message for a shard this region's shard count does not have is handed back
/// (the IO layer records it as a dead letter), not dropped silently.
#[test]
fn a_forwarded_message_for_an_unknown_shard_is_rejected() {
    let mut reg = registered("a", &[]);
    let mut out = Vec::new();
    reg.handle(
        0,
        RegionInput::FromPeer {
            from: r("b"),
            msg: PeerMsg::Deliver(env("x", 999, 1)),
        },
        &mut out,
    );
    match &out[..] {
        [RegionAction::Rejected(Rejected { error, envelope })] => {
            assert!(
                matches!(error, SendError::BadShard { shard: 999, .. }),
                "{error:?}"
            );
            assert_eq!(envelope.entity_id, "x");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Region `from`'s fence of shard 1 for hand-off `H` arrives at time 0.
fn fence_from(reg: &mut RegionState<u32>, from: &str, out: &mut Acts) {
    let msg = PeerMsg::Fence { id: H, shard: 1 };
    reg.handle(0, RegionInput::FromPeer { from: r(from), msg }, out);
}

/// The coordinator tells `reg` at `now` that shard 1's home is `region` (epoch 1, no token).
fn shard_1_home(reg: &mut RegionState<u32>, now: u64, region: &str) -> Acts {
    let home = ToRegion::ShardHome {
        epoch: 1,
        shard: 1,
        region: r(region),
        token: 0,
    };
    from_coord(reg, now, home)
}

/// `RegionInput::Unhandled` of shard 1 at `now`.
fn unhandled_1(
    reg: &mut RegionState<u32>,
    now: u64,
    envelopes: Vec<Envelope<u32>>,
    out: &mut Acts,
) {
    reg.handle(
        now,
        RegionInput::Unhandled {
            shard: 1,
            envelopes,
        },
        out,
    );
}

/// `RegionInput::Held` of shard 1 at `now`.
fn held_1(reg: &mut RegionState<u32>, now: u64, envelopes: Vec<Envelope<u32>>, out: &mut Acts) {
    reg.handle(
        now,
        RegionInput::Held {
            shard: 1,
            envelopes,
        },
        out,
    );
}

/// The payloads `out` forwards to other regions, in order.
fn forwarded_payloads(out: &Acts) -> Vec<u32> {
    forwarded(out).iter().map(|e| e.payload).collect()
}

/// The envelopes `out` forwards to other regions, in order.
fn forwarded(out: &Acts) -> Vec<&Envelope<u32>> {
    out.iter()
        .filter_map(|a| match a {
            RegionAction::ToPeer {
                msg: PeerMsg::Deliver(e),
                ..
            } => Some(e),
            _ => None,
        })
        .collect()
}

#[test]
fn registration_is_retried_until_acknowledged() {
    let mut reg = region("a");
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    reg.handle(50, RegionInput::Tick, &mut out);
    reg.handle(100, RegionInput::Tick, &mut out);
    reg.handle(150, RegionInput::Tick, &mut out);
    reg.handle(200, RegionInput::Tick, &mut out);
    assert_eq!(reg.stats().register_attempts, 3);
    from_coord(
        &mut reg,
        200,
        ToRegion::RegisterAck {
            epoch: 1,
            homes: vec![],
            attempt: 1,
            tokens: vec![],
        },
    );
    assert!(reg.is_registered());
    let mut out = Vec::new();
    reg.handle(1_000, RegionInput::Tick, &mut out);
    assert!(out.is_empty());
    // A duplicate ack of the same epoch changes nothing.
    let out = from_coord(
        &mut reg,
        1_000,
        ToRegion::RegisterAck {
            epoch: 1,
            homes: vec![(0, r("a"))],
            attempt: 1,
            tokens: vec![],
        },
    );
    assert!(out.is_empty());
    assert_eq!(reg.shard_view(0), ShardView::Unknown);
}

#[test]
fn hot_path_never_involves_the_coordinator() {
    let mut reg = registered("a", &[(0, "a"), (1, "b")]);
    let mut out = Vec::new();
    reg.send(0, env("x", 0, 1), &mut out).unwrap();
    reg.send(0, env("y", 1, 2), &mut out).unwrap();
    assert!(matches!(out[0], RegionAction::DeliverLocal(_)));
    assert!(
        matches!(&out[1], RegionAction::ToPeer { to, msg: PeerMsg::Deliver(e) } if *to == r("b") && e.hops == 1)
    );
    assert!(!out
        .iter()
        .any(|a| matches!(a, RegionAction::ToCoordinator(_))));
}

#[test]
fn send_local_takes_only_shards_hosted_here() {
    let mut reg = registered("a", &[(0, "a"), (1, "b")]);
    assert!(reg.send_local(0));
    assert!(!reg.send_local(1), "hosted by b");
    assert!(!reg.send_local(2), "home unknown");
    assert!(!reg.send_local(99), "no such shard");
    assert_eq!(reg.stats().delivered_local, 1);
    // Once the shard is being handed off, messages take the state machine's path again.
    let mut out = Vec::new();
    reg.handle(
        0,
        RegionInput::FromCoordinator(ToRegion::BeginHandOff { id: H, shard: 0 }),
        &mut out,
    );
    assert!(!reg.send_local(0));
}

#[test]
fn unknown_home_buffers_bounded_asks_once_and_retries() {
    let mut reg = registered("a", &[]);
    let mut out = Vec::new();
    for n in 0..3 {
        reg.send(0, env("x", 2, n), &mut out).unwrap();
    }
    let asks = out
        .iter()
        .filter(|a| {
            matches!(
                a,
                RegionAction::ToCoordinator(ToCoordinator::GetShardHome { .. })
            )
        })
        .count();
    assert_eq!(asks, 1);
    let err = reg.send(0, env("x", 2, 3), &mut out).unwrap_err();
    assert_eq!(err.error, SendError::BufferFull { shard: 2, limit: 3 });
    assert_eq!(err.envelope.payload, 3);
    assert_eq!(reg.stats().overflow_total, 1);
    let mut out = Vec::new();
    reg.handle(100, RegionInput::Tick, &mut out);
    assert_eq!(out.len(), 1, "retried GetShardHome: {out:?}");
    let out = from_coord(
        &mut reg,
        150,
        ToRegion::ShardHome {
            epoch: 1,
            shard: 2,
            region: r("b"),
            token: 0,
        },
    );
    let order: Vec<u32> = out
        .iter()
        .filter_map(|a| match a {
            RegionAction::ToPeer {
                msg: PeerMsg::Deliver(e),
                ..
            } => Some(e.payload),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec![0, 1, 2], "flushed in order");
    assert_eq!(reg.buffered(), 0);
}

#[test]
fn begin_hand_off_fences_the_cached_home_and_buffers() {
    let mut reg = registered("a", &[(1, "b")]);
    let out = from_coord(&mut reg, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    assert_eq!(
        out,
        vec![
            RegionAction::ToPeer {
                to: r("b"),
                msg: PeerMsg::Fence { id: H, shard: 1 }
            },
            RegionAction::ToCoordinator(ToCoordinator::BeginHandOffAck {
                id: H,
                shard: 1,
                fenced: Some(r("b"))
            }),
        ]
    );
    let mut out = Vec::new();
    reg.send(0, env("x", 1, 9), &mut out).unwrap();
    assert!(out.is_empty(), "buffered, the new home will be broadcast");
    let out = shard_1_home(&mut reg, 10, "c");
    assert!(matches!(&out[..], [RegionAction::ToPeer { to, .. }] if *to == r("c")));
}

/// Messages sent before the coordinator's refusal came, buffered while the region waited to
/// register, are handed back as refused at the refusal like those sent after it, in order
/// (they used to wait in the buffers until the node stopped; found by an audit, 2026-11-29).
#[test]
fn messages_buffered_before_a_refusal_are_refused_with_it() {
    let mut reg = region("a");
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    for n in 0..2 {
        reg.send(0, env("x", 1, n), &mut out).unwrap();
    }
    assert_eq!(reg.buffered(), 2);
    let error = RegisterError::ShardCountMismatch {
        coordinator: 12,
        region: 8,
    };
    let out = from_coord(
        &mut reg,
        1,
        ToRegion::RegisterRefused {
            epoch: 1,
            error: error.clone(),
            attempt: 1,
        },
    );
    let rejected: Vec<u32> = out
        .iter()
        .filter_map(|a| match a {
            RegionAction::Rejected(Rejected {
                error: SendError::Refused(e),
                envelope,
            }) if *e == error => Some(envelope.payload),
            _ => None,
        })
        .collect();
    assert_eq!(out[0], RegionAction::Refused(error));
    assert_eq!(rejected, vec![0, 1], "both handed back, in order: {out:?}");
    assert_eq!(reg.buffered(), 0);
}

#[test]
fn owner_waits_for_fences_then_stops_with_forced_timeout() {
    let mut reg = registered("a", &[(1, "a")]);
    assert_eq!(reg.hosted_shards().into_iter().collect::<Vec<_>>(), vec![1]);
    let out = from_coord(&mut reg, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    assert!(matches!(
        &out[..],
        [RegionAction::ToCoordinator(
            ToCoordinator::BeginHandOffAck { fenced: None, .. }
        )]
    ));
    // Local senders buffer; messages forwarded before the peer's fence are still delivered.
    let mut out = Vec::new();
    reg.send(0, env("x", 1, 1), &mut out).unwrap();
    assert!(out.is_empty());
    reg.handle(
        0,
        RegionInput::FromPeer {
            from: r("b"),
            msg: PeerMsg::Deliver(env("y", 1, 2)),
        },
        &mut out,
    );
    assert!(matches!(out[..], [RegionAction::DeliverLocal(_)]));
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::HandOff {
            id: H,
            shard: 1,
            fences: vec![r("b"), r("c")],
        },
    );
    assert!(out.is_empty(), "waits for fences");
    let mut out = Vec::new();
    fence_from(&mut reg, "b", &mut out);
    assert!(out.is_empty());
    reg.handle(10, RegionInput::RegionDown(r("c")), &mut out);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    assert_eq!(reg.shard_view(1), ShardView::Stopping);
    // Forwarded messages now buffer too.
    let mut out = Vec::new();
    reg.handle(
        20,
        RegionInput::FromPeer {
            from: r("b"),
            msg: PeerMsg::Deliver(env("y", 1, 3)),
        },
        &mut out,
    );
    assert!(out.is_empty());
    reg.handle(500, RegionInput::Tick, &mut out);
    assert!(out.is_empty());
    reg.handle(1_010, RegionInput::Tick, &mut out);
    reg.handle(2_000, RegionInput::Tick, &mut out);
    assert_eq!(out, vec![RegionAction::ForceStopShard(1)], "forced once");
    assert_eq!(reg.stats().forced_stops, 1);
    let mut out = Vec::new();
    reg.handle(2_000, RegionInput::ShardStopped(1), &mut out);
    assert_eq!(
        out,
        vec![RegionAction::ToCoordinator(ToCoordinator::ShardStopped {
            id: H,
            shard: 1
        })]
    );
    assert!(reg.hosted_shards().is_empty());
    // A repeated HandOff (the coordinator's retry) is answered again.
    let out = from_coord(
        &mut reg,
        3_000,
        ToRegion::HandOff {
            id: H,
            shard: 1,
            fences: vec![],
        },
    );
    assert_eq!(
        out,
        vec![RegionAction::ToCoordinator(ToCoordinator::ShardStopped {
            id: H,
            shard: 1
        })]
    );
    // The new home flushes local and forwarded messages in arrival order.
    let out = shard_1_home(&mut reg, 3_000, "b");
    assert_eq!(forwarded_payloads(&out), vec![1, 3]);
}

#[test]
fn a_forced_stops_unhandled_messages_go_first_to_the_next_home() {
    let mut reg = registered("a", &[(1, "a")]);
    let out = hand_off(&mut reg, vec![]);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    // Sent while the entities stop: buffered (limit 3).
    let mut out = Vec::new();
    reg.send(10, env("x", 1, 10), &mut out).unwrap();
    reg.send(10, env("y", 1, 20), &mut out).unwrap();
    assert!(out.is_empty());
    reg.handle(1_000, RegionInput::Tick, &mut out);
    assert_eq!(out, vec![RegionAction::ForceStopShard(1)]);
    // The entities' mailboxes still held older messages: they go ahead of the buffer, even
    // past its limit (they were accepted before it).
    let mut out = Vec::new();
    unhandled_1(
        &mut reg,
        1_001,
        vec![env("x", 1, 1), env("x", 1, 2)],
        &mut out,
    );
    unhandled_1(&mut reg, 1_002, vec![env("y", 1, 5)], &mut out);
    assert!(out.is_empty());
    reg.handle(1_003, RegionInput::ShardStopped(1), &mut out);
    let out = shard_1_home(&mut reg, 1_100, "b");
    let flushed: Vec<(String, u32)> = forwarded(&out)
        .into_iter()
        .map(|e| (e.entity_id.clone(), e.payload))
        .collect();
    let of = |id: &str| -> Vec<u32> {
        flushed
            .iter()
            .filter(|(e, _)| e == id)
            .map(|(_, n)| *n)
            .collect()
    };
    assert_eq!(
        of("x"),
        vec![1, 2, 10],
        "per entity: mailbox first, then buffer"
    );
    assert_eq!(of("y"), vec![5, 20]);
    assert_eq!(flushed.len(), 5, "nothing lost or doubled");
    // Once the shard has moved, late ones are routed to the new home like any message.
    let mut out = Vec::new();
    unhandled_1(&mut reg, 1_200, vec![env("z", 1, 9)], &mut out);
    assert!(matches!(
        &out[..],
        [RegionAction::ToPeer { msg: PeerMsg::Deliver(e), .. }] if e.payload == 9
    ));
}

/// Region "a" hosting shard 1, with room for 10 buffered messages per shard.
fn hosting_shard_1() -> RegionState<u32> {
    let mut c = RegionConfig::new(8);
    c.buffer_limit = 10;
    registered_as(RegionState::new(r("a"), c), &[(1, "a")])
}

/// The payloads `out` delivers here, in order, with their entity ids (accepted ones too).
fn delivered(out: &Acts) -> Vec<(String, u32)> {
    out.iter()
        .filter_map(|a| match a {
            RegionAction::DeliverLocal(e) | RegionAction::DeliverAccepted(e) => {
                Some((e.entity_id.clone(), e.payload))
            }
            _ => None,
        })
        .collect()
}

/// The payloads `out` delivers here as accepted earlier ([`RegionAction::DeliverAccepted`]).
fn delivered_accepted(out: &Acts) -> Vec<u32> {
    out.iter()
        .filter_map(|a| match a {
            RegionAction::DeliverAccepted(e) => Some(e.payload),
            _ => None,
        })
        .collect()
}

/// While a hand-off has not stopped the shard its entities run here: messages the node
/// accepted earlier (an entity's unhandled ones, those a fence held) are delivered to them at
/// once, ahead of what local senders buffer since the hand-off began (that goes to the next
/// home). Once the hand-off stops the shard they go ahead of its buffer instead: unhandled
/// ones first, then held ones, then what senders added.
#[test]
fn accepted_messages_reach_running_entities_or_go_ahead_of_a_stopping_shards_buffer() {
    let mut reg = hosting_shard_1();
    let out = hand_off(&mut reg, vec![r("b")]);
    assert!(out.is_empty(), "waits for b's fence");
    let mut out = Vec::new();
    reg.send(1, env("x", 1, 10), &mut out).unwrap();
    assert!(
        out.is_empty(),
        "a local sender buffers once the hand-off began"
    );
    unhandled_1(&mut reg, 2, vec![env("x", 1, 1), env("x", 1, 2)], &mut out);
    held_1(&mut reg, 3, vec![env("x", 1, 3)], &mut out);
    let msg = PeerMsg::Deliver(env("x", 1, 4));
    reg.handle(4, RegionInput::FromPeer { from: r("b"), msg }, &mut out);
    let x = |n: u32| ("x".to_string(), n);
    assert_eq!(delivered(&out), vec![x(1), x(2), x(3), x(4)]);
    assert_eq!(delivered_accepted(&out), vec![1, 2, 3]);
    let mut out = Vec::new();
    fence_from(&mut reg, "b", &mut out);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    // Stopping: a fence's held messages (taken along by the stop), then the unhandled ones
    // of an entity the fence stopped, which arrive later but were accepted earlier.
    let mut out = Vec::new();
    reg.send(5, env("x", 1, 11), &mut out).unwrap();
    held_1(&mut reg, 6, vec![env("x", 1, 6), env("y", 1, 30)], &mut out);
    unhandled_1(&mut reg, 7, vec![env("x", 1, 5)], &mut out);
    unhandled_1(&mut reg, 8, vec![env("z", 1, 40)], &mut out);
    assert!(out.is_empty(), "nothing delivered while the shard stops");
    reg.handle(9, RegionInput::ShardStopped(1), &mut out);
    let out = shard_1_home(&mut reg, 10, "b");
    assert_eq!(forwarded_payloads(&out), vec![5, 40, 6, 30, 10, 11]);
}

/// A stopped shard that comes back here (its next home is this region again) delivers the
/// accepted messages of its buffer as accepted, ahead of what senders buffered.
#[test]
fn a_shard_hosted_again_after_its_stop_delivers_accepted_messages_first() {
    let mut reg = hosting_shard_1();
    let out = hand_off(&mut reg, vec![]);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    reg.send(1, env("x", 1, 10), &mut out).unwrap();
    held_1(&mut reg, 2, vec![env("x", 1, 3)], &mut out);
    unhandled_1(&mut reg, 3, vec![env("x", 1, 1)], &mut out);
    assert!(out.is_empty());
    let out = shard_1_home(&mut reg, 4, "a");
    assert!(out.is_empty(), "hosted again once stopped");
    let mut out = Vec::new();
    reg.handle(5, RegionInput::ShardStopped(1), &mut out);
    assert!(out.contains(&RegionAction::StartShard(1)));
    let x = |n: u32| ("x".to_string(), n);
    assert_eq!(delivered(&out), vec![x(1), x(3), x(10)]);
    assert_eq!(
        delivered_accepted(&out),
        vec![1, 3],
        "no cap may refuse what was accepted already; a sender's buffered one is a delivery"
    );
    assert_eq!(reg.shard_view(1), ShardView::Local);
    // Nothing is counted for the shard any more: the next stop (of a later hand-off) starts
    // afresh.
    let next = HandOffId { epoch: 1, seq: 8 };
    from_coord(&mut reg, 5, ToRegion::BeginHandOff { id: next, shard: 1 });
    let fences = vec![];
    let out = from_coord(
        &mut reg,
        5,
        ToRegion::HandOff {
            id: next,
            shard: 1,
            fences,
        },
    );
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    reg.send(6, env("x", 1, 12), &mut out).unwrap();
    unhandled_1(&mut reg, 7, vec![env("x", 1, 11)], &mut out);
    reg.handle(8, RegionInput::ShardStopped(1), &mut out);
    let out = shard_1_home(&mut reg, 9, "b");
    assert_eq!(forwarded_payloads(&out), vec![11, 12]);
}

/// Accepted messages for a shard hosted here are delivered at once, as accepted ones.
#[test]
fn accepted_messages_for_a_hosted_shard_are_delivered_as_accepted() {
    let mut reg = hosting_shard_1();
    let mut out = Vec::new();
    held_1(&mut reg, 1, vec![env("x", 1, 1), env("x", 1, 2)], &mut out);
    unhandled_1(&mut reg, 2, vec![env("y", 1, 3)], &mut out);
    assert_eq!(delivered_accepted(&out), vec![1, 2, 3]);
    assert_eq!(out.len(), 3);
    assert_eq!(reg.buffered(), 0);
}

/// Accepted messages go into a stopping shard's buffer past its limit and do not count
/// toward it: senders still have the whole limit.
#[test]
fn accepted_messages_do_not_use_up_the_buffer_limit() {
    let mut reg = registered("a", &[(1, "a")]);
    let out = hand_off(&mut reg, vec![]);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    unhandled_1(
        &mut reg,
        1,
        (1..=4).map(|n| env("x", 1, n)).collect(),
        &mut out,
    );
    held_1(
        &mut reg,
        2,
        (5..=8).map(|n| env("x", 1, n)).collect(),
        &mut out,
    );
    assert_eq!(reg.buffered(), 8, "past the limit of 3");
    for n in 9..=11 {
        reg.send(3, env("x", 1, n), &mut out).unwrap();
    }
    let refused = reg.send(3, env("x", 1, 12), &mut out).unwrap_err();
    assert!(matches!(
        refused.error,
        SendError::BufferFull { shard: 1, limit: 3 }
    ));
    assert!(out.is_empty());
    reg.handle(4, RegionInput::ShardStopped(1), &mut out);
    let out = shard_1_home(&mut reg, 5, "b");
    assert_eq!(forwarded_payloads(&out), (1..=11).collect::<Vec<u32>>());
}

/// Accepted messages for a shard whose home is unknown go ahead of what local senders
/// buffered meanwhile, and the home is asked for.
#[test]
fn accepted_messages_go_ahead_of_an_unknown_shards_buffer() {
    let mut reg = hosting_shard_1();
    let mut out = Vec::new();
    reg.send(1, env("x", 2, 10), &mut out).unwrap();
    assert!(matches!(
        &out[..],
        [RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
            shard: 2,
            ..
        })]
    ));
    let mut out = Vec::new();
    reg.handle(
        2,
        RegionInput::Unhandled {
            shard: 2,
            envelopes: vec![env("x", 2, 1)],
        },
        &mut out,
    );
    assert!(out.is_empty(), "asked once already");
    let out = from_coord(
        &mut reg,
        3,
        ToRegion::ShardHome {
            epoch: 1,
            shard: 2,
            region: r("b"),
            token: 0,
        },
    );
    assert_eq!(forwarded_payloads(&out), vec![1, 10]);
    // A shard never heard of: buffered and its home asked for.
    let mut out = Vec::new();
    reg.handle(
        4,
        RegionInput::Held {
            shard: 3,
            envelopes: vec![env("q", 3, 7)],
        },
        &mut out,
    );
    assert!(matches!(
        &out[..],
        [RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
            shard: 3,
            ..
        })]
    ));
    assert_eq!(reg.buffered(), 1);
}

#[test]
fn fence_that_arrives_before_the_hand_off_counts() {
    let mut reg = registered("a", &[(1, "a")]);
    let mut out = Vec::new();
    fence_from(&mut reg, "b", &mut out);
    let out = hand_off(&mut reg, vec![r("b")]);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
}

#[test]
fn configured_fence_timeout_stops_anyway() {
    let mut c = RegionConfig::new(8);
    c.fence_timeout_ms = Some(500);
    let mut reg = registered_as(RegionState::new(r("a"), c), &[(1, "a")]);
    from_coord(&mut reg, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    from_coord(
        &mut reg,
        0,
        ToRegion::HandOff {
            id: H,
            shard: 1,
            fences: vec![r("b")],
        },
    );
    let mut out = Vec::new();
    reg.handle(499, RegionInput::Tick, &mut out);
    assert!(out.is_empty());
    reg.handle(500, RegionInput::Tick, &mut out);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    assert_eq!(reg.stats().fence_timeouts, 1);
}

#[test]
fn aborted_hand_off_resumes_local_delivery_in_order() {
    let mut reg = registered("a", &[(1, "a")]);
    from_coord(&mut reg, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    let mut out = Vec::new();
    reg.send(0, env("x", 1, 1), &mut out).unwrap();
    reg.send(0, env("x", 1, 2), &mut out).unwrap();
    let out = shard_1_home(&mut reg, 0, "a");
    let got: Vec<u32> = out
        .iter()
        .filter_map(|a| match a {
            RegionAction::DeliverLocal(e) => Some(e.payload),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![1, 2]);
    assert_eq!(reg.shard_view(1), ShardView::Local);
    assert!(
        !out.iter().any(|a| matches!(a, RegionAction::StartShard(_))),
        "still running"
    );
}

#[test]
fn stale_epoch_messages_are_ignored_and_new_coordinator_means_re_register() {
    let mut reg = registered("a", &[(1, "a")]);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    assert!(!reg.is_registered());
    from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 2,
            homes: vec![(1, r("a"))],
            attempt: 2,
            tokens: vec![],
        },
    );
    assert_eq!(reg.epoch(), 2);
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::HandOff {
            id: H,
            shard: 1,
            fences: vec![],
        },
    );
    assert!(out.is_empty());
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 1,
            homes: vec![],
            attempt: 1,
            tokens: vec![],
        },
    );
    assert!(out.is_empty());
    assert_eq!(reg.stats().stale_ignored, 2);
    assert_eq!(reg.shard_view(1), ShardView::Local);
    // A coordinator saying our epoch is stale makes us register again.
    let out = from_coord(&mut reg, 0, ToRegion::StaleEpoch { epoch: 3 });
    assert!(matches!(
        out[..],
        [RegionAction::ToCoordinator(ToCoordinator::Register { .. })]
    ));
}

/// A region registers with coordinator A, the coordinator moves to B before A's answer
/// arrives, and B drops the region's `Register` (not active yet). A's late answers (ack or
/// refusal, even of the epoch the region last knew) answer an earlier attempt: ignored, the
/// region keeps retrying until B answers the current one.
#[test]
fn late_answers_of_a_previous_registration_attempt_are_ignored() {
    let mut reg = region("a");
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    let attempt = |out: &Acts| -> Vec<u64> {
        out.iter()
            .filter_map(|a| match a {
                RegionAction::ToCoordinator(ToCoordinator::Register { attempt, .. }) => {
                    Some(*attempt)
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(attempt(&out), [1], "the first attempt, to A");
    let mut out = Vec::new();
    reg.handle(10, RegionInput::CoordinatorChanged, &mut out);
    assert_eq!(attempt(&out), [2], "a new attempt, to B (dropped)");
    for late in [
        ToRegion::RegisterAck {
            epoch: 1,
            homes: vec![(0, r("a"))],
            attempt: 1,
            tokens: vec![],
        },
        ToRegion::RegisterRefused {
            epoch: 1,
            error: RegisterError::Downed(r("a")),
            attempt: 1,
        },
    ] {
        let out = from_coord(&mut reg, 20, late);
        assert!(out.is_empty(), "{out:?}");
    }
    assert!(!reg.is_registered());
    assert!(reg.refused().is_none());
    assert_eq!(reg.shard_view(0), ShardView::Unknown);
    assert_eq!(reg.stats().stale_ignored, 2);
    // Retries repeat the current attempt until B answers it.
    let mut out = Vec::new();
    reg.handle(110, RegionInput::Tick, &mut out);
    reg.handle(210, RegionInput::Tick, &mut out);
    assert_eq!(attempt(&out), [2, 2]);
    let out = from_coord(
        &mut reg,
        220,
        ToRegion::RegisterAck {
            epoch: 2,
            homes: vec![(0, r("a"))],
            attempt: 2,
            tokens: vec![],
        },
    );
    assert!(reg.is_registered());
    assert_eq!(reg.epoch(), 2);
    assert_eq!(out, [RegionAction::StartShard(0)]);
    let mut out = Vec::new();
    reg.handle(1_000, RegionInput::Tick, &mut out);
    assert!(out.is_empty(), "no more retries: {out:?}");
}

/// The coordinator echoes the region's registration attempt in its answers.
#[test]
fn the_coordinator_echoes_the_registration_attempt() {
    let mut c = coordinator(4, &[]);
    for (attempt, shard_count) in [(5, 4), (6, 9)] {
        let mut out = msg(
            &mut c,
            0,
            "a",
            ToCoordinator::Register {
                shard_count,
                proxy: false,
                shard_fn: None,
                attempt,
            },
        );
        persist_all(&mut c, &mut out);
        let echoed = match &sends(&out)[..] {
            [(_, ToRegion::RegisterAck { attempt, .. })]
            | [(_, ToRegion::RegisterRefused { attempt, .. })] => *attempt,
            other => panic!("{other:?}"),
        };
        assert_eq!(echoed, attempt);
    }
}

#[test]
fn registration_with_a_new_coordinator_reconciles_the_cache() {
    let mut reg = registered("a", &[(1, "a"), (2, "b"), (3, "b")]);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    // The new coordinator's durable state: 1 is elsewhere (never happens with persist-before-act,
    // but the region obeys), 2 moved to us, 3 unknown.
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 2,
            homes: vec![(1, r("c")), (2, r("a"))],
            attempt: 2,
            tokens: vec![],
        },
    );
    assert!(out.contains(&RegionAction::StopShard(1)));
    assert!(out.contains(&RegionAction::StartShard(2)));
    assert_eq!(reg.shard_view(3), ShardView::Unknown);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::ShardStopped(1), &mut out);
    assert_eq!(reg.shard_view(1), ShardView::Remote(r("c")));
}

#[test]
fn region_down_drops_cached_homes() {
    let mut reg = registered("a", &[(1, "b")]);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::RegionDown(r("b")), &mut out);
    assert_eq!(reg.shard_view(1), ShardView::Unknown);
    reg.send(0, env("x", 1, 1), &mut out).unwrap();
    assert!(matches!(
        out[..],
        [RegionAction::ToCoordinator(ToCoordinator::GetShardHome {
            shard: 1,
            ..
        })]
    ));
}

#[test]
fn forwarding_loops_are_cut_by_the_hop_limit() {
    let mut reg = registered("a", &[(1, "b")]);
    let mut out = Vec::new();
    let mut e = env("x", 1, 1);
    e.hops = 3;
    reg.handle(
        0,
        RegionInput::FromPeer {
            from: r("b"),
            msg: PeerMsg::Deliver(e),
        },
        &mut out,
    );
    assert!(matches!(
        out[..],
        [RegionAction::ToCoordinator(
            ToCoordinator::GetShardHome { .. }
        )]
    ));
    assert_eq!(reg.buffered(), 1);
    // A local sender's message waits behind it.
    let mut out = Vec::new();
    reg.send(1, env("y", 1, 2), &mut out).unwrap();
    assert!(out.is_empty(), "asked already: {out:?}");
    // The coordinator's fresh answer (here the same home) sends both on, in order, instead
    // of buffering the first again and asking again, for good (before 2026-11-29).
    let out = shard_1_home(&mut reg, 2, "b");
    let sent: Vec<(u32, u8)> = forwarded(&out)
        .iter()
        .map(|e| (e.payload, e.hops))
        .collect();
    assert_eq!(sent, vec![(1, 4), (2, 1)], "{out:?}");
    assert_eq!(out.len(), 2, "no new GetShardHome: {out:?}");
    assert_eq!(reg.buffered(), 0);
    assert_eq!(reg.shard_view(1), ShardView::Remote(r("b")));
    // A genuine loop is still cut: a region whose cached home disagrees does not forward a
    // message past the limit on that cache; it asks afresh first.
    let mut b = registered("b", &[(1, "a")]);
    let mut out = Vec::new();
    let mut e = env("x", 1, 1);
    e.hops = 4;
    b.handle(
        3,
        RegionInput::FromPeer {
            from: r("a"),
            msg: PeerMsg::Deliver(e),
        },
        &mut out,
    );
    assert_only_asks_home(&out, 1);
    assert_eq!(b.buffered(), 1);
}

/// Accepted messages that made too many hops wait for a fresh home as accepted ones: ahead
/// of what senders add and outside the buffer limit.
#[test]
fn accepted_messages_past_the_hop_limit_keep_their_place_while_the_home_is_asked() {
    let mut reg = registered("a", &[(1, "b")]);
    let mut out = Vec::new();
    let mut held: Vec<Envelope<u32>> = (1..=2).map(|n| env("x", 1, n)).collect();
    held[1].hops = 3;
    held_1(&mut reg, 0, held, &mut out);
    assert_only_asks_home(&out, 1);
    assert_eq!(reg.buffered(), 2);
    // Senders have the whole limit (3).
    for n in 3..=5 {
        reg.send(1, env("y", 1, n), &mut out).unwrap();
    }
    assert!(reg.send(1, env("y", 1, 6), &mut out).is_err());
    let out = shard_1_home(&mut reg, 2, "b");
    assert_eq!(forwarded_payloads(&out), vec![1, 2, 3, 4, 5]);
    assert_eq!(reg.buffered(), 0);
}

/// A stopped shard's unhandled messages that reached it past the hop limit go on to the next
/// home with the rest once the coordinator names it.
#[test]
fn unhandled_messages_past_the_hop_limit_reach_the_next_home() {
    let mut reg = hosting_shard_1();
    assert_eq!(hand_off(&mut reg, vec![]), vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    let mut late = env("x", 1, 1);
    late.hops = 3;
    unhandled_1(&mut reg, 1, vec![late], &mut out);
    reg.send(1, env("x", 1, 2), &mut out).unwrap();
    reg.handle(2, RegionInput::ShardStopped(1), &mut out);
    let out = shard_1_home(&mut reg, 3, "b");
    assert_eq!(forwarded_payloads(&out), vec![1, 2], "{out:?}");
    assert_eq!(reg.buffered(), 0);
    let out = shard_1_home(&mut reg, 4, "b");
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn proxies_never_host() {
    let mut c = RegionConfig::new(8);
    c.proxy = true;
    let mut reg: RegionState<u32> = RegionState::new(r("p"), c);
    reg.handle(0, RegionInput::CoordinatorChanged, &mut Vec::new());
    from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 1,
            homes: vec![(1, r("p"))],
            attempt: 1,
            tokens: vec![],
        },
    );
    assert!(reg.hosted_shards().is_empty());
    let mut coord = coordinator(4, &[]);
    let _ = msg(
        &mut coord,
        0,
        "p",
        ToCoordinator::Register {
            shard_count: 4,
            proxy: true,
            shard_fn: None,
            attempt: 1,
        },
    );
    let mut out = Vec::new();
    persist_all(&mut coord, &mut out);
    let out = get_home(&mut coord, "p", 0);
    assert!(out.is_empty());
    assert_eq!(coord.stats().no_region_available, 1);
}

// ---- coordinator: allocation strategies ---------------------------------------------------------

fn coordinator_with(
    shards: u32,
    strategy: impl AllocationStrategy,
    regions: &[&str],
) -> Coordinator {
    let mut config = cfg(shards);
    config.allocation_strategy = std::sync::Arc::new(strategy);
    let (mut c, _) = Coordinator::new(config);
    let mut out = Vec::new();
    c.handle(0, Input::Persisted(1), &mut out);
    for name in regions {
        register(&mut c, name);
    }
    c
}

/// The regions chosen by the `ShardAllocated` changes in `out`.
fn allocated_to(out: &[Action]) -> Vec<String> {
    persists(out)
        .into_iter()
        .filter_map(|ch| match ch {
            Change::ShardAllocated { region, .. } => Some(region.0),
            _ => None,
        })
        .collect()
}

#[test]
fn local_first_allocates_to_the_requester_up_to_the_ceiling_of_the_working_state() {
    // 9 shards over 3 regions: ceiling 3.
    let mut c = coordinator_with(9, LocalFirst, &["a", "b", "c"]);
    let mut chosen = Vec::new();
    // Nothing persisted in between: the strategy must see the pending allocations.
    for s in 0..6 {
        chosen.extend(allocated_to(&get_home(&mut c, "b", s)));
    }
    assert_eq!(chosen, ["b", "b", "b", "a", "c", "a"]);
    assert_eq!(c.stats().allocation_rejected, 0);
    // A proxy asking: not a hosting region, so least loaded.
    let mut out = msg(
        &mut c,
        0,
        "p",
        ToCoordinator::Register {
            shard_count: 9,
            proxy: true,
            shard_fn: None,
            attempt: 1,
        },
    );
    persist_all(&mut c, &mut out);
    assert_eq!(allocated_to(&get_home(&mut c, "p", 6)), ["c"]);
}

/// Always names `to`; plans `moves`.
#[derive(Debug)]
struct Scripted {
    to: &'static str,
    moves: Vec<Move>,
}

impl AllocationStrategy for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn allocate(
        &self,
        _shard: u32,
        _requester: Option<&RegionId>,
        _view: &AllocationView<'_>,
    ) -> Option<RegionId> {
        Some(r(self.to))
    }
    fn rebalance(&self, _view: &AllocationView<'_>, _limit: usize) -> Vec<Move> {
        self.moves.clone()
    }
}

#[test]
fn a_strategy_naming_a_region_that_may_not_host_is_refused() {
    for to in ["ghost", "p", "down", "leaving"] {
        let mut c = coordinator_with(
            8,
            Scripted {
                to,
                moves: Vec::new(),
            },
            &["b", "a", "down", "leaving"],
        );
        let mut out = msg(
            &mut c,
            0,
            "p",
            ToCoordinator::Register {
                shard_count: 8,
                proxy: true,
                shard_fn: None,
                attempt: 1,
            },
        );
        persist_all(&mut c, &mut out);
        c.handle(0, Input::RegionDown(r("down")), &mut out);
        c.handle(0, Input::RegionLeaving(r("leaving")), &mut out);
        persist_all(&mut c, &mut out);
        // Never obeyed: least shards (ties by id) instead, and counted.
        assert_eq!(allocated_to(&get_home(&mut c, "b", 0)), ["a"], "{to}");
        assert_eq!(allocated_to(&get_home(&mut c, "b", 1)), ["b"], "{to}");
        assert_eq!(c.stats().allocation_rejected, 2, "{to}");
    }
    // A valid choice is obeyed.
    let mut c = coordinator_with(
        8,
        Scripted {
            to: "b",
            moves: Vec::new(),
        },
        &["a", "b"],
    );
    assert_eq!(allocated_to(&get_home(&mut c, "a", 0)), ["b"]);
    assert_eq!(allocated_to(&get_home(&mut c, "a", 1)), ["b"]);
    assert_eq!(c.stats().allocation_rejected, 0);
}

#[test]
fn invalid_rebalance_moves_are_dropped_and_valid_ones_carried_out() {
    let mv = |shard, from: &str, to: &str| Move {
        shard,
        from: r(from),
        to: r(to),
    };
    let mut c = coordinator_with(
        8,
        Scripted {
            to: "a",
            moves: vec![mv(0, "a", "ghost"), mv(1, "b", "a"), mv(2, "a", "b")],
        },
        &["a", "b"],
    );
    allocate(&mut c, 0..4);
    assert!(c.state().shards.values().all(|h| *h == r("a")));
    let mut out = Vec::new();
    c.handle(0, Input::MembershipStable(true), &mut out);
    c.handle(1_000, Input::Tick, &mut out);
    let begun: Vec<u32> = sends(&out)
        .into_iter()
        .filter_map(|(to, m)| match m {
            ToRegion::BeginHandOff { shard, .. } if to == r("a") => Some(shard),
            _ => None,
        })
        .collect();
    assert_eq!(begun, [2]);
    assert_eq!(c.stats().allocation_rejected, 2);
    assert_eq!(
        c.handoffs().map(|h| h.target.clone()).collect::<Vec<_>>(),
        [Some(r("b"))]
    );
}

#[test]
fn a_region_with_another_shard_function_is_refused() {
    let mut config = cfg(8);
    config.shard_fn_fingerprint = Some(7);
    let (mut c, _) = Coordinator::new(config);
    let mut out = Vec::new();
    c.handle(0, Input::Persisted(1), &mut out);
    let reg = |fp| ToCoordinator::Register {
        shard_count: 8,
        proxy: false,
        shard_fn: fp,
        attempt: 1,
    };
    let out = msg(&mut c, 0, "a", reg(Some(8)));
    assert_eq!(
        sends(&out),
        [(
            r("a"),
            ToRegion::RegisterRefused {
                epoch: 1,
                error: RegisterError::ShardFnMismatch {
                    coordinator: 7,
                    region: 8
                },
                attempt: 1,
            }
        )]
    );
    assert!(persists(&out).is_empty());
    // The same rule (or a region that does not say) is accepted.
    for (name, fp) in [("b", Some(7)), ("c", None)] {
        let mut out = msg(&mut c, 0, name, reg(fp));
        persist_all(&mut c, &mut out);
        assert!(matches!(
            &sends(&out)[..],
            [(_, ToRegion::RegisterAck { .. })]
        ));
    }
}

// ---- fencing tokens -------------------------------------------------------------------------------

/// The `(to, shard, token)` of every `ShardHome` sent, tokens as they are.
fn home_tokens(out: &[Action]) -> Vec<(RegionId, ShardId, FencingToken)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Send {
                to,
                msg: ToRegion::ShardHome { shard, token, .. },
            } => Some((to.clone(), *shard, *token)),
            _ => None,
        })
        .collect()
}

/// Asks for `shard`'s home from `a` and persists; returns the token `a` was told.
fn allocate_one(c: &mut Coordinator, shard: ShardId) -> FencingToken {
    let mut out = get_home(c, "a", shard);
    persist_all(c, &mut out);
    let told = home_tokens(&out);
    assert_eq!(told.len(), 1, "{out:?}");
    assert_eq!(
        c.state().token(shard),
        told[0].2,
        "the state holds what was sent"
    );
    told[0].2
}

#[test]
fn every_allocation_gets_a_token_above_all_before_it() {
    let mut c = coordinator(8, &["a"]);
    c.set_wall_clock(5_000_000);
    assert_eq!(allocate_one(&mut c, 0), 5_000_000, "the wall clock");
    assert_eq!(allocate_one(&mut c, 1), 5_000_001, "same clock: one more");
    c.set_wall_clock(1_000);
    assert_eq!(
        allocate_one(&mut c, 2),
        5_000_002,
        "clock stepped back: one more"
    );
    c.set_wall_clock(9_000_000);
    assert_eq!(allocate_one(&mut c, 3), 9_000_000, "clock ahead again");
    assert_eq!(c.state().last_token, 9_000_000);
    // Asking again for a home already allocated repeats its token; nothing new is handed out.
    let out = get_home(&mut c, "a", 1);
    assert_eq!(home_tokens(&out), vec![(r("a"), 1, 5_000_001)]);
    assert!(persists(&out).is_empty());
}

#[test]
fn a_shard_that_moves_gets_a_higher_token_and_every_region_hears_it() {
    let mut c = coordinator(4, &["a"]);
    c.set_wall_clock(1_000);
    let begins = start_rebalance(&mut c);
    let (id, shard) = match begins[0].1 {
        ToRegion::BeginHandOff { id, shard } => (id, shard),
        ref m => panic!("{m:?}"),
    };
    let before = c.state().token(shard);
    assert!(before >= 1_000);
    for from in ["a", "b"] {
        let fenced = None;
        msg(
            &mut c,
            1_000,
            from,
            ToCoordinator::BeginHandOffAck { id, shard, fenced },
        );
    }
    let mut out = msg(
        &mut c,
        1_000,
        "a",
        ToCoordinator::ShardStopped { id, shard },
    );
    persist_all(&mut c, &mut out);
    assert_eq!(c.state().home(shard), Some(&r("b")));
    let after = c.state().token(shard);
    assert!(after > before, "{after} > {before}");
    assert!(
        after
            > c.state()
                .tokens
                .values()
                .filter(|t| **t != after)
                .max()
                .copied()
                .unwrap()
    );
    assert_eq!(
        home_tokens(&out),
        vec![(r("a"), shard, after), (r("b"), shard, after)]
    );
}

#[test]
fn register_ack_tells_a_region_the_tokens_of_its_own_shards() {
    let mut c = coordinator(4, &["a", "b"]);
    c.set_wall_clock(7_000);
    for shard in 0..4 {
        // Least-shards-first with ties by id: a, b, a, b.
        let mut out = get_home(&mut c, "a", shard);
        persist_all(&mut c, &mut out);
    }
    let out = register(&mut c, "b");
    let acks: Vec<_> = out
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                msg: ToRegion::RegisterAck { homes, tokens, .. },
                ..
            } => Some((homes.clone(), tokens.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(acks.len(), 1, "{out:?}");
    let (homes, tokens) = &acks[0];
    let of_b: Vec<(ShardId, FencingToken)> = homes
        .iter()
        .filter(|(_, h)| *h == r("b"))
        .map(|(s, _)| (*s, c.state().token(*s)))
        .collect();
    assert_eq!(of_b.len(), 2);
    assert_eq!(tokens, &of_b, "b's shards only, with their tokens");
}

#[test]
fn a_recovered_coordinator_hands_out_tokens_above_the_last_one() {
    let mut c = coordinator(4, &["a"]);
    c.set_wall_clock(8_000_000);
    allocate_one(&mut c, 0);
    let state = c.state().clone();
    // The next coordinator's clock is behind (another node, or a restart with a bad clock).
    let (mut next, mut out) = Coordinator::recover(cfg(4), state, 2).unwrap();
    next.set_wall_clock(10);
    let v = next.working_state().version;
    next.handle(0, Input::Persisted(v), &mut out);
    register(&mut next, "a");
    let mut out = get_home(&mut next, "a", 1);
    persist_all(&mut next, &mut out);
    assert_eq!(next.state().token(1), 8_000_001);
    assert_eq!(
        next.state().token(0),
        8_000_000,
        "kept from the replicated state"
    );
}

#[test]
fn the_region_keeps_the_newest_token_of_each_shard_allocated_to_it() {
    let mut reg = registered("a", &[]);
    let home = |shard, region: &str, token| ToRegion::ShardHome {
        epoch: 1,
        shard,
        region: r(region),
        token,
    };
    let out = from_coord(&mut reg, 0, home(3, "a", 42));
    assert!(out.contains(&RegionAction::StartShard(3)));
    assert_eq!(reg.fencing_token(3), Some(42));
    from_coord(&mut reg, 0, home(4, "b", 43));
    assert_eq!(reg.fencing_token(4), None, "another region's allocation");
    // An older coordinator's message without a token leaves the known one alone.
    from_coord(&mut reg, 0, home(3, "a", 0));
    assert_eq!(reg.fencing_token(3), Some(42));
    // The shard moves away and comes back under a newer allocation.
    from_coord(&mut reg, 0, home(3, "b", 50));
    assert_eq!(
        reg.fencing_token(3),
        Some(42),
        "not hosted here: the old token stays"
    );
    from_coord(&mut reg, 0, home(3, "a", 60));
    assert_eq!(reg.fencing_token(3), Some(60));
    // A registration answer carries the tokens of the shards it homes here.
    let mut reg = region("c");
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 1,
            homes: vec![(1, r("c")), (2, r("a"))],
            tokens: vec![(1, 77)],
            attempt: 1,
        },
    );
    assert_eq!(reg.fencing_token(1), Some(77));
    assert_eq!(reg.fencing_token(2), None);
}

/// `out` is one `GetShardHome` for `shard`, nothing else.
#[track_caller]
fn assert_only_asks_home<M: std::fmt::Debug>(out: &[RegionAction<M>], shard: ShardId) {
    assert!(
        matches!(
            out,
            [RegionAction::ToCoordinator(ToCoordinator::GetShardHome { shard: s, .. })] if *s == shard
        ),
        "{out:?}"
    );
}

// ---- further tests, by topic (`tests/`) ----------------------------------------------------------

mod leave_after_failover;
mod lost_messages;
mod peer_input_bounds;
mod refused_region;
mod repeated_hand_off;
mod reregister_mid_hand_off;
mod unreachable;
