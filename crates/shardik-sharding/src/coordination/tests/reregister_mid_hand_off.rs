//! An owner that registers again with the coordinator that runs its shard's hand-off (a
//! coordinator change seen and called off, a `StaleEpoch` call) is not told the shard's home
//! (the `RegisterAck` leaves moving shards out): it leaves the shard to the hand-off, which
//! waits for the fences and answers `ShardStopped`. Found by an audit on 2026-11-30: the
//! owner stopped the shard at once, skipping the fences (later messages of the fencing
//! regions could overtake earlier ones) and sent no `ShardStopped`.

use super::*;

/// `reg` registers again (attempt 2) with the coordinator of epoch 1, which lists no home.
fn register_again(reg: &mut RegionState<u32>) -> Acts {
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    let ack = ToRegion::RegisterAck {
        epoch: 1,
        homes: vec![],
        tokens: vec![],
        attempt: 2,
    };
    out.extend(from_coord(reg, 0, ack));
    out
}

/// After the fence of `b`, the shard stops; once stopped, the coordinator hears of it.
#[track_caller]
fn stops_after_the_fence(reg: &mut RegionState<u32>) {
    let mut out = Vec::new();
    let msg = PeerMsg::Deliver(env("x", 1, 1));
    reg.handle(0, RegionInput::FromPeer { from: r("b"), msg }, &mut out);
    assert_eq!(delivered(&out), vec![("x".to_string(), 1)], "{out:?}");
    let mut out = Vec::new();
    fence_from(reg, "b", &mut out);
    assert_eq!(out, vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::ShardStopped(1), &mut out);
    assert!(
        out.contains(&RegionAction::ToCoordinator(ToCoordinator::ShardStopped {
            id: H,
            shard: 1
        })),
        "{out:?}"
    );
}

#[test]
fn a_registration_after_begin_hand_off_leaves_the_shard_to_the_hand_off() {
    let mut reg = registered("a", &[(1, "a")]);
    from_coord(&mut reg, 0, ToRegion::BeginHandOff { id: H, shard: 1 });
    let out = register_again(&mut reg);
    assert!(!out.contains(&RegionAction::StopShard(1)), "{out:?}");
    assert_eq!(reg.shard_view(1), ShardView::HandingOff);
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::HandOff {
            id: H,
            shard: 1,
            fences: vec![r("b")],
        },
    );
    assert!(out.is_empty(), "waits for b's fence: {out:?}");
    stops_after_the_fence(&mut reg);
}

#[test]
fn a_registration_while_fences_are_awaited_leaves_the_shard_to_the_hand_off() {
    let mut reg = registered("a", &[(1, "a")]);
    let out = hand_off(&mut reg, vec![r("b")]);
    assert!(out.is_empty(), "{out:?}");
    let out = register_again(&mut reg);
    assert!(!out.contains(&RegionAction::StopShard(1)), "{out:?}");
    stops_after_the_fence(&mut reg);
}

/// A coordinator of a newer epoch that does not list the shard: the hand-off of the old one
/// is over for it, and the shard stops as before.
#[test]
fn a_newer_coordinator_that_does_not_list_the_shard_stops_it() {
    let mut reg = registered("a", &[(1, "a")]);
    hand_off(&mut reg, vec![r("b")]);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    let ack = ToRegion::RegisterAck {
        epoch: 2,
        homes: vec![],
        tokens: vec![],
        attempt: 2,
    };
    let out = from_coord(&mut reg, 0, ack);
    assert!(out.contains(&RegionAction::StopShard(1)), "{out:?}");
}
