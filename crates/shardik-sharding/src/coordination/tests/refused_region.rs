//! A region the coordinator refuses after it registered (its node was downed, or the
//! coordinator moved to a node with another shard count or shard function) hosts nothing and
//! takes nothing from its peers: its shards stop at the refusal, and what peers forward to it
//! afterwards, or its stopped entities hand back, is handed back as refused (the IO layer
//! records dead letters). Found by an audit on 2026-11-30: peers' messages still reached the
//! entities of the refused region, which kept running.

use super::*;

/// `a` hosts shard 1 and is refused (downed) when it registers again.
fn hosting_then_refused() -> (RegionState<u32>, Acts) {
    let mut reg = registered("a", &[(1, "a")]);
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::RegisterRefused {
            epoch: 2,
            error: RegisterError::Downed(r("a")),
            attempt: 2,
        },
    );
    (reg, out)
}

fn refused_payloads(out: &Acts) -> Vec<u32> {
    out.iter()
        .filter_map(|a| match a {
            RegionAction::Rejected(Rejected {
                error: SendError::Refused(_),
                envelope,
            }) => Some(envelope.payload),
            _ => None,
        })
        .collect()
}

#[test]
fn a_refusal_stops_the_shards_hosted_here() {
    let (mut reg, out) = hosting_then_refused();
    assert!(out.contains(&RegionAction::StopShard(1)), "{out:?}");
    let mut out = Vec::new();
    reg.handle(0, RegionInput::ShardStopped(1), &mut out);
    assert!(reg.hosted_shards().is_empty());
    // Nothing tells the coordinator: it does not count the region as the shard's owner.
    assert!(out.is_empty(), "{out:?}");
    // A late `RegisterAck` (another coordinator's answer to the same attempt) hosts nothing.
    let out = from_coord(
        &mut reg,
        0,
        ToRegion::RegisterAck {
            epoch: 3,
            homes: vec![(1, r("a"))],
            tokens: vec![],
            attempt: 2,
        },
    );
    assert!(out.is_empty(), "{out:?}");
    assert!(reg.hosted_shards().is_empty() && !reg.is_registered());
}

#[test]
fn peers_messages_to_a_refused_region_are_handed_back() {
    let (mut reg, _) = hosting_then_refused();
    let mut out = Vec::new();
    for (shard, n) in [(1, 1), (2, 2)] {
        let msg = PeerMsg::Deliver(env("x", shard, n));
        reg.handle(0, RegionInput::FromPeer { from: r("b"), msg }, &mut out);
    }
    assert_eq!(refused_payloads(&out), vec![1, 2], "{out:?}");
    assert!(delivered(&out).is_empty() && forwarded(&out).is_empty());
    assert_eq!(reg.buffered(), 0);
}

#[test]
fn what_the_refused_regions_entities_had_not_handled_is_handed_back() {
    let (mut reg, _) = hosting_then_refused();
    let mut out = Vec::new();
    reg.handle(2_000, RegionInput::Tick, &mut out);
    assert!(out.contains(&RegionAction::ForceStopShard(1)), "{out:?}");
    let mut out = Vec::new();
    unhandled_1(&mut reg, 2_000, vec![env("x", 1, 1)], &mut out);
    held_1(&mut reg, 2_000, vec![env("x", 1, 2)], &mut out);
    assert_eq!(refused_payloads(&out), vec![1, 2], "{out:?}");
    assert_eq!(reg.buffered(), 0);
}

/// A shard stopping when the refusal comes, whose coordinator had homed it back here (the
/// stop's `next_home` is this region), stays stopped: a refused region never hosts a shard
/// again (the IO layer would restart its remembered entities as a second incarnation).
/// Found by a review on 2026-11-30: the stop's end started the shard here again.
#[test]
fn a_shard_stopping_at_the_refusal_is_not_hosted_here_again() {
    let mut reg = registered("a", &[(1, "a")]);
    // The coordinator moves shard 1 to `b`, then back here while it stops.
    let out = shard_1_home(&mut reg, 0, "b");
    assert!(out.contains(&RegionAction::StopShard(1)), "{out:?}");
    shard_1_home(&mut reg, 0, "a");
    let mut out = Vec::new();
    reg.handle(0, RegionInput::CoordinatorChanged, &mut out);
    from_coord(
        &mut reg,
        0,
        ToRegion::RegisterRefused {
            epoch: 2,
            error: RegisterError::Downed(r("a")),
            attempt: 2,
        },
    );
    let mut out = Vec::new();
    reg.handle(0, RegionInput::ShardStopped(1), &mut out);
    assert!(!out.contains(&RegionAction::StartShard(1)), "{out:?}");
    assert!(reg.hosted_shards().is_empty());
    // A message for the shard is refused, not delivered.
    let mut out = Vec::new();
    let msg = PeerMsg::Deliver(env("x", 1, 1));
    reg.handle(0, RegionInput::FromPeer { from: r("b"), msg }, &mut out);
    assert_eq!(refused_payloads(&out), vec![1], "{out:?}");
}

/// A `ShardHome` naming this region that reaches it after the refusal (the refusing
/// coordinator's epoch, sent before it learned of the refusal) hosts nothing either.
#[test]
fn a_home_after_the_refusal_hosts_nothing() {
    let mut reg = registered("a", &[(1, "b")]);
    from_coord(
        &mut reg,
        0,
        ToRegion::RegisterRefused {
            epoch: 1,
            error: RegisterError::Downed(r("a")),
            attempt: 1,
        },
    );
    let out = shard_1_home(&mut reg, 0, "a");
    assert!(!out.contains(&RegionAction::StartShard(1)), "{out:?}");
    assert!(reg.hosted_shards().is_empty());
}
