//! A `HandOff` for a hand-off the region already stopped the shard for (a late or repeated
//! copy) stops nothing: it is answered with `ShardStopped` again.

use super::*;

#[test]
fn a_late_hand_off_does_not_stop_a_shard_hosted_again() {
    let mut a = registered("a", &[(1, "a")]);
    assert_eq!(hand_off(&mut a, vec![]), vec![RegionAction::StopShard(1)]);
    let mut out = Vec::new();
    a.handle(0, RegionInput::ShardStopped(1), &mut out);
    let stopped = RegionAction::ToCoordinator(ToCoordinator::ShardStopped { id: H, shard: 1 });
    assert_eq!(out, vec![stopped.clone()]);
    // The shard comes back here later (another hand-off, not traced here).
    let out = shard_1_home(&mut a, 10, "a");
    assert_eq!(out, vec![RegionAction::StartShard(1)]);
    // A copy of the old `HandOff` arrives now: answered, nothing stopped.
    let late = ToRegion::HandOff {
        id: H,
        shard: 1,
        fences: vec![],
    };
    let out = from_coord(&mut a, 20, late);
    assert_eq!(out, vec![stopped]);
    assert_eq!(a.shard_view(1), ShardView::Local);
}
