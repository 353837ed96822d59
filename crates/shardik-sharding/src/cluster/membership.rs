//! What the sharding layer reads from a membership view.

use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::ClusterState;

/// The node that runs the coordinator of a type: the oldest `Up` member (the singleton rule)
/// among those with the type's `role` (if any) that host the type (`hosts`: started it and
/// not as a proxy, as the type directory says). `None` while an older member's answer is
/// unknown (`hosts` gives `None`): deciding then could pick two coordinators at once.
pub(crate) fn coordinator_node(
    state: &ClusterState,
    role: Option<&str>,
    hosts: impl Fn(&UniqueAddress) -> Option<bool>,
) -> Option<UniqueAddress> {
    let mut up: Vec<_> = state
        .members
        .iter()
        .filter(|m| m.status == MemberStatus::Up && m.has_role(role))
        .collect();
    up.sort_by(|a, b| a.age_key().cmp(&b.age_key()));
    for m in up {
        match hosts(&m.node) {
            Some(true) => return Some(m.node.clone()),
            Some(false) => continue,
            None => return None,
        }
    }
    None
}

/// The members whose replicas count for a majority: `Up` and `Leaving` ones with the type's
/// `role` (if any).
pub(crate) fn quorum_members(state: &ClusterState, role: Option<&str>) -> Vec<UniqueAddress> {
    state
        .members
        .iter()
        .filter(|m| {
            matches!(m.status, MemberStatus::Up | MemberStatus::Leaving) && m.has_role(role)
        })
        .map(|m| m.node.clone())
        .collect()
}

/// Whether `node` is a member with `role` (any member if `None`).
pub(crate) fn has_role(state: &ClusterState, node: &UniqueAddress, role: Option<&str>) -> bool {
    state.member(node).is_some_and(|m| m.has_role(role))
}

/// A majority of `n`.
pub(crate) fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// No member joining, weakly up or down, and everyone reachable: rebalance may run.
pub(crate) fn is_stable(state: &ClusterState) -> bool {
    state.unreachable.is_empty()
        && state.members.iter().all(|m| {
            !matches!(
                m.status,
                MemberStatus::Joining | MemberStatus::WeaklyUp | MemberStatus::Down
            )
        })
}

/// Whether `node` is gone for good: `Down`, or no longer a member.
pub(crate) fn is_gone(state: &ClusterState, node: &UniqueAddress) -> bool {
    state
        .member(node)
        .is_none_or(|m| matches!(m.status, MemberStatus::Down | MemberStatus::Removed))
}

/// Whether no new shard may go to `node` for its reachability: some member's failure
/// detector flagged it (the gossiped reachability), or it is gone ([`is_gone`]). A flagged
/// node that is removed without this view seeing it `Down` drops out of the view's
/// unreachable set (that set holds members only); counted reachable again, it could be
/// chosen as a leave target in the same pass before it is fed as gone (review on
/// 2026-12-01).
pub(crate) fn is_flagged(state: &ClusterState, node: &UniqueAddress) -> bool {
    state.unreachable.contains(node) || is_gone(state, node)
}

/// Whether `node` was replaced by a newer process: it is gone (see [`is_gone`]) and a
/// member with the same node id but another incarnation is in the view and not gone. The
/// membership downs an old incarnation as soon as a new one of its node id joins; that
/// process was restarted, so its entities no longer run (after a full cluster restart, every
/// region of the recovered coordinator state is such a one).
pub(crate) fn is_replaced(state: &ClusterState, node: &UniqueAddress) -> bool {
    is_gone(state, node)
        && state.members.iter().any(|m| {
            m.node.node_id == node.node_id
                && m.node.incarnation != node.incarnation
                && !matches!(m.status, MemberStatus::Down | MemberStatus::Removed)
        })
}

/// Whether `node` is missing from the view although this node never saw it as a member
/// (`seen`), and no newer process of it runs: its absence does not tell whether it left or
/// has yet to arrive here (it may have joined and registered elsewhere, the gossip bringing
/// it still on its way).
pub(crate) fn never_seen(
    state: &ClusterState,
    node: &UniqueAddress,
    seen: &std::collections::BTreeSet<UniqueAddress>,
) -> bool {
    state.member(node).is_none() && !seen.contains(node) && !is_replaced(state, node)
}

/// Whether `node` is leaving gracefully.
pub(crate) fn is_leaving(state: &ClusterState, node: &UniqueAddress) -> bool {
    state
        .member(node)
        .is_some_and(|m| matches!(m.status, MemberStatus::Leaving | MemberStatus::Exiting))
}

#[cfg(test)]
mod tests {
    use super::*;

    use shardik_cluster::member::Member;

    fn member(n: u64, up: u64, roles: &[&str]) -> Member {
        Member {
            node: UniqueAddress::new(format!("10.0.0.{n}:7000"), format!("n{n}"), 1),
            status: MemberStatus::Up,
            roles: roles.iter().map(|r| r.to_string()).collect(),
            up_number: Some(up),
        }
    }

    fn state(members: Vec<Member>) -> ClusterState {
        ClusterState {
            self_node: members[0].node.clone(),
            members,
            unreachable: Default::default(),
            leader: None,
            fenced: false,
            stopped: None,
        }
    }

    #[test]
    fn coordinator_is_the_oldest_up_member_hosting_the_type_with_the_role() {
        // n1 is the oldest, n2 next, n3 youngest (by up number, not address).
        let s = state(vec![
            member(1, 1, &["a"]),
            member(2, 2, &["b"]),
            member(3, 3, &["b"]),
        ]);
        let id = |n: u64| s.members[n as usize - 1].node.clone();
        let all = |_: &UniqueAddress| Some(true);
        assert_eq!(coordinator_node(&s, None, all), Some(id(1)));
        // Role: only members with it count.
        assert_eq!(coordinator_node(&s, Some("b"), all), Some(id(2)));
        assert_eq!(coordinator_node(&s, Some("c"), all), None);
        // A member that does not host the type is skipped...
        let not_n1 = |n: &UniqueAddress| Some(n.node_id != "n1");
        assert_eq!(coordinator_node(&s, None, not_n1), Some(id(2)));
        // ...but one whose set is unknown blocks the choice (else two could be chosen).
        let n1_unknown = |n: &UniqueAddress| (n.node_id != "n1").then_some(true);
        assert_eq!(coordinator_node(&s, None, n1_unknown), None);
        // Unknown younger members do not matter.
        let n3_unknown = |n: &UniqueAddress| (n.node_id != "n3").then_some(true);
        assert_eq!(coordinator_node(&s, None, n3_unknown), Some(id(1)));
        // The quorum is the members with the role.
        assert_eq!(quorum_members(&s, Some("b")), vec![id(2), id(3)]);
        assert_eq!(quorum_members(&s, None).len(), 3);
    }

    #[test]
    fn a_gone_incarnation_is_replaced_once_its_node_id_runs_again() {
        let s = state(vec![member(1, 1, &[]), member(2, 2, &[])]);
        let live = s.members[0].node.clone();
        assert!(!is_replaced(&s, &live));
        // An earlier incarnation of n1 (not in the view: e.g. before a full restart).
        let old = UniqueAddress::new("10.0.0.9:7000", "n1", 0);
        assert!(is_gone(&s, &old) && is_replaced(&s, &old));
        // A node id that does not run now: gone, but not known to be replaced.
        let other = UniqueAddress::new("10.0.0.9:7000", "n7", 0);
        assert!(is_gone(&s, &other) && !is_replaced(&s, &other));
    }

    #[test]
    fn a_missing_node_is_known_gone_only_if_it_was_seen_or_replaced() {
        let s = state(vec![member(1, 1, &[]), member(2, 2, &[])]);
        let mut seen: std::collections::BTreeSet<_> =
            s.members.iter().map(|m| m.node.clone()).collect();
        // In the view: not "never seen", whatever the set says.
        assert!(!never_seen(&s, &s.members[1].node, &Default::default()));
        // A node that joined elsewhere and is not in this view yet.
        let newcomer = UniqueAddress::new("10.0.0.3:7000", "n3", 1);
        assert!(is_gone(&s, &newcomer), "absent reads as gone");
        assert!(never_seen(&s, &newcomer, &seen), "but it may be on its way");
        // Seen before and missing now: it was removed.
        seen.insert(newcomer.clone());
        assert!(!never_seen(&s, &newcomer, &seen));
        // An older incarnation of a running node id is known to be replaced.
        let old = UniqueAddress::new("10.0.0.1:7000", "n1", 0);
        assert!(!never_seen(&s, &old, &Default::default()));
    }

    #[test]
    fn a_flagged_node_stays_flagged_once_it_is_gone() {
        let mut s = state(vec![
            member(1, 1, &[]),
            member(2, 2, &[]),
            member(3, 3, &[]),
        ]);
        let n2 = s.members[1].node.clone();
        let n3 = s.members[2].node.clone();
        assert!(!is_flagged(&s, &n2));
        s.unreachable.insert(n2.clone());
        assert!(is_flagged(&s, &n2) && !is_flagged(&s, &n3));
        // Downed: still flagged (in the set, as the reachability keeps its records).
        s.members[1].status = MemberStatus::Down;
        assert!(is_flagged(&s, &n2));
        // Removed without this view seeing it `Down`: the view's unreachable set, which
        // holds members only, no longer names it; it must not read as reachable again.
        s.members.remove(1);
        s.unreachable.remove(&n2);
        assert!(is_flagged(&s, &n2), "a removed node is not reachable again");
        // Nor does a node that was never flagged read as reachable once it is removed or down.
        s.members[1].status = MemberStatus::Removed;
        assert!(is_flagged(&s, &n3));
    }

    #[test]
    fn majority_of_n() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(2), 2);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
    }
}
