//! Control messages and fences are at most once: what a lost one must not leave stuck.

use super::*;

/// The owner's copy of the `ShardHome` that ends an aborted hand-off is lost: the owner,
/// still `Begun` (its local senders buffer), asks for the shard's home every retry interval;
/// the coordinator ignores the question while the hand-off runs and answers it after the
/// abort, and the owner delivers what waited. (Found by an audit on 2026-11-30: the owner
/// buffered its local senders' messages until its buffer was full, for good.)
#[test]
fn an_owner_whose_aborted_hand_off_answer_is_lost_asks_for_the_home() {
    let retry = 100; // of `region`
    let mut c = coordinator(4, &["a"]);
    let begins = start_rebalance(&mut c); // a holds 0..4, b none
    let ToRegion::BeginHandOff { id, shard } = begins[0].1 else {
        panic!("{begins:?}")
    };
    let homes: Vec<(u32, &str)> = (0..4).map(|s| (s, "a")).collect();
    let mut a = registered("a", &homes);
    let acts = from_coord(&mut a, 1_000, ToRegion::BeginHandOff { id, shard });
    let [.., RegionAction::ToCoordinator(ack)] = &acts[..] else {
        panic!("{acts:?}")
    };
    let _ = msg(&mut c, 1_000, "a", ack.clone()); // b's ack never comes
    let mut out = Vec::new();
    a.send(1_000, env("x", shard, 1), &mut out).unwrap();
    assert!(out.is_empty(), "a local sender buffers: {out:?}");
    // A retry interval later the owner asks; the coordinator ignores it while the hand-off runs.
    let mut out = Vec::new();
    a.handle(1_000 + retry - 1, RegionInput::Tick, &mut out);
    assert!(out.is_empty(), "not before the retry interval: {out:?}");
    a.handle(1_000 + retry, RegionInput::Tick, &mut out);
    assert_only_asks_home(&out, shard);
    let RegionAction::ToCoordinator(ask) = out.remove(0) else {
        unreachable!()
    };
    assert!(msg(&mut c, 1_000 + retry, "a", ask.clone()).is_empty());
    // The hand-off is aborted; the broadcast's copy for `a` is lost. (No new attempt: the
    // membership is not stable any more.)
    let mut out = Vec::new();
    c.handle(6_000, Input::MembershipStable(false), &mut out);
    c.handle(6_000, Input::Tick, &mut out);
    assert_eq!(c.stats().handoffs_aborted, 1);
    assert!(c.handoffs().all(|h| h.shard != shard));
    // The owner asks again and gets its answer.
    let mut out = Vec::new();
    a.handle(6_000, RegionInput::Tick, &mut out);
    assert_only_asks_home(&out, shard);
    let RegionAction::ToCoordinator(ask) = out.remove(0) else {
        unreachable!()
    };
    let answer = sends(&msg(&mut c, 6_000, "a", ask));
    let [(to, home)] = &answer[..] else {
        panic!("{answer:?}")
    };
    assert_eq!(to, &r("a"));
    let out = from_coord(&mut a, 6_000, home.clone());
    assert_eq!(delivered(&out), vec![("x".to_string(), 1)]);
    assert_eq!(a.shard_view(shard), ShardView::Local);
}

/// Region `a`'s user connection to the owner `b` is down for two minutes (every copy of its
/// fence is lost) while control messages and heartbeats get through, so nobody is downed:
/// `a` goes on sending the fence (less often as time passes) while shard 1's next home is
/// unknown to it, and the first copy after the connection healed ends `b`'s wait. (Found by
/// an audit on 2026-11-30: `a` gave up after a minute and `b` waited for good, holding the
/// shard's hand-off and every later rebalance of the type.)
#[test]
fn a_fence_lost_for_minutes_reaches_the_owner_once_the_connection_heals() {
    let healed = 120_000;
    let mut a = registered("a", &[(1, "b")]);
    let mut b = registered("b", &[(1, "b")]);
    from_coord(&mut a, 0, ToRegion::BeginHandOff { id: H, shard: 1 }); // lost
    assert!(
        hand_off(&mut b, vec![r("a")]).is_empty(),
        "b waits for a's fence"
    );
    let mut stopped_at = None;
    let mut t = 0;
    while t < 10 * 60_000 && stopped_at.is_none() {
        t += 100; // the tick
        let mut out = Vec::new();
        a.handle(t, RegionInput::Tick, &mut out);
        for act in out {
            let RegionAction::ToPeer { to, msg } = act else {
                panic!("{act:?}")
            };
            assert_eq!(to, r("b"));
            if t >= healed {
                let mut got = Vec::new();
                b.handle(t, RegionInput::FromPeer { from: r("a"), msg }, &mut got);
                if got == vec![RegionAction::StopShard(1)] {
                    stopped_at = Some(t);
                }
            }
        }
    }
    let stopped_at = stopped_at.expect("the owner stops the shard once a copy arrives");
    assert!(
        stopped_at < healed + FENCE_RESEND_MAX_INTERVAL_MS,
        "within one (longest) resend interval of the heal: {stopped_at}"
    );
}

/// The fence of region `a` to owner `b` is lost with a broken connection (the user lane is
/// at most once) and nobody is downed: `a` sends it again every retry interval while shard
/// 1's next home is unknown to it, the copy ends `b`'s wait, and once `a` learns the next
/// home it sends no more (found by an audit on 2026-11-29: the owner waited for good).
#[test]
fn a_lost_fence_is_sent_again_until_the_next_home_is_known() {
    // The retry interval of `region`.
    let retry = 100;
    let fence = |to: &str| RegionAction::<u32>::ToPeer {
        to: r(to),
        msg: PeerMsg::Fence { id: H, shard: 1 },
    };
    let mut a = registered("a", &[(1, "b")]);
    let mut b = registered("b", &[(1, "b")]);
    let first = from_coord(&mut a, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    assert_eq!(first[0], fence("b"));
    // The first fence never reaches `b`, which waits for it.
    let out = hand_off(&mut b, vec![r("a")]);
    assert!(out.is_empty(), "the owner waits for a's fence: {out:?}");
    let mut out = Vec::new();
    a.handle(retry - 1, RegionInput::Tick, &mut out);
    assert!(out.is_empty(), "not before the retry interval: {out:?}");
    a.handle(retry, RegionInput::Tick, &mut out);
    assert_eq!(out, vec![fence("b")], "the fence again");
    assert_eq!(a.stats().fences_resent, 1);
    // The copy ends the owner's wait; a second copy changes nothing.
    let mut out = Vec::new();
    fence_from(&mut b, "a", &mut out);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    fence_from(&mut b, "a", &mut out);
    assert!(out.is_empty(), "a duplicate fence is counted once: {out:?}");
    // Once `a` knows the next home it stops sending.
    shard_1_home(&mut a, 2 * retry, "c");
    let mut out = Vec::new();
    a.handle(10 * retry, RegionInput::Tick, &mut out);
    assert!(out.is_empty(), "no fence once the home is known: {out:?}");
    assert_eq!(a.stats().fences_resent, 1);
}

/// Copies of a fence go after one retry interval, then at doubling intervals up to
/// `FENCE_RESEND_MAX_INTERVAL_MS`, for as long as the shard's next home is unknown here
/// (a hand-off may wait for it that long; until 2026-11-30 they stopped after a minute).
#[test]
fn a_fence_is_sent_again_at_growing_intervals_for_as_long_as_the_home_is_unknown() {
    // The retry interval of `region`.
    let retry = 100;
    let mut a = registered("a", &[(1, "b")]);
    from_coord(&mut a, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    let mut sent = Vec::new();
    let mut t = 0;
    while t < 10 * 60_000 {
        t += retry;
        let mut out = Vec::new();
        a.handle(t, RegionInput::Tick, &mut out);
        if out.iter().any(|x| matches!(x, RegionAction::ToPeer { .. })) {
            sent.push(t);
        }
    }
    let gaps: Vec<u64> = std::iter::once(0)
        .chain(sent.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect();
    let cap = FENCE_RESEND_MAX_INTERVAL_MS;
    assert_eq!(&gaps[..8], [100, 200, 400, 800, 1_600, 3_200, 6_400, cap]);
    assert!(gaps[8..].iter().all(|g| *g == cap), "{gaps:?}");
    assert!(*sent.last().unwrap() > 10 * 60_000 - cap, "no last copy");
    assert_eq!(a.stats().fences_resent, sent.len() as u64);
}

/// A fence to a region reported down, or one of an earlier hand-off, is not sent again.
#[test]
fn a_fence_to_a_downed_region_or_of_an_earlier_hand_off_is_not_sent_again() {
    // The retry interval of `region`.
    let retry = 100;
    let mut a = registered("a", &[(1, "b")]);
    from_coord(&mut a, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    let mut out = Vec::new();
    a.handle(0, RegionInput::RegionDown(r("b")), &mut out);
    a.handle(retry, RegionInput::Tick, &mut out);
    assert!(
        !out.iter().any(|x| matches!(x, RegionAction::ToPeer { .. })),
        "no fence to a downed region: {out:?}"
    );
    let mut a = registered("a", &[(1, "b")]);
    from_coord(&mut a, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    let later = HandOffId { epoch: 1, seq: 8 };
    from_coord(
        &mut a,
        1,
        ToRegion::BeginHandOff {
            id: later,
            shard: 1,
        },
    );
    let mut out = Vec::new();
    a.handle(retry, RegionInput::Tick, &mut out);
    assert!(
        !out.iter().any(|x| matches!(x, RegionAction::ToPeer { .. })),
        "no fence of an earlier hand-off: {out:?}"
    );
    assert_eq!(a.stats().fences_resent, 0);
}
