//! A leaving region that owns nothing is answered at once, also while the coordinator waits
//! for other regions to re-register after a failover (hand-offs wait for them; a region with
//! nothing to hand off does not). Found by an audit on 2026-11-30: it waited until every
//! region had re-registered, up to 10 s after a failover (`UNSEEN_GRACE`) or for good.

use super::*;

#[test]
fn a_leaving_region_without_shards_is_answered_before_every_region_re_registered() {
    let mut c = coordinator(4, &["b", "c"]);
    for s in 0..4 {
        let mut out = get_home(&mut c, "b", s);
        persist_all(&mut c, &mut out);
    }
    register(&mut c, "a"); // owns nothing
    assert_eq!(c.state().shards.len(), 4, "two each for b and c");
    let (mut n, first) = Coordinator::recover(cfg(4), c.state().clone(), 2).unwrap();
    let mut out = Vec::new();
    n.handle(
        0,
        Input::Persisted(first.len() as u64 + c.state().version),
        &mut out,
    );
    register(&mut n, "a");
    register(&mut n, "b"); // `c` has not re-registered yet
    assert!(!n.all_registered());
    let mut out = Vec::new();
    n.handle(0, Input::RegionLeaving(r("a")), &mut out);
    assert_eq!(
        sends(&out),
        vec![(r("a"), ToRegion::LeaveComplete { epoch: 2 })]
    );
    // One that owns shards still waits for every region before its hand-offs begin.
    let mut out = Vec::new();
    n.handle(0, Input::RegionLeaving(r("b")), &mut out);
    assert!(sends(&out).is_empty(), "{out:?}");
    assert!(n.handoffs().next().is_none());
}
