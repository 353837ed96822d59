//! What a peer sends is range-checked against the shard count, fences as envelopes: a fence
//! for a shard out of range is ignored, so the fences a region keeps stay bounded by its
//! shard count (found by an audit on 2026-11-30: one entry per shard value a peer named).

use super::*;

#[test]
fn fences_for_shards_out_of_range_are_not_kept() {
    let mut reg = registered("a", &[(1, "a")]);
    let mut out = Vec::new();
    for shard in [8, 999, u32::MAX] {
        let msg = PeerMsg::Fence { id: H, shard };
        reg.handle(0, RegionInput::FromPeer { from: r("b"), msg }, &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(reg.fenced_shards(), 0);
    // In range, a fence is kept as before.
    fence_from(&mut reg, "b", &mut out);
    assert_eq!(reg.fenced_shards(), 1);
}

#[test]
fn cached_homes_are_the_remote_slots() {
    let mut reg = registered("a", &[(1, "b"), (2, "c"), (3, "a"), (4, "b")]);
    assert_eq!(
        reg.cached_homes().into_iter().collect::<Vec<_>>(),
        vec![r("b"), r("c")]
    );
    reg.handle(0, RegionInput::RegionDown(r("b")), &mut Vec::new());
    assert_eq!(
        reg.cached_homes().into_iter().collect::<Vec<_>>(),
        vec![r("c")]
    );
}
