//! What the sharding layer reads from a membership view.

use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::{oldest_up, ClusterState};

/// The node that runs the coordinators: the oldest `Up` member (the singleton rule).
pub(crate) fn coordinator_node(state: &ClusterState) -> Option<UniqueAddress> {
    oldest_up(&state.members, None).map(|m| m.node.clone())
}

/// The members whose replicas count for a majority: `Up` and `Leaving` ones.
pub(crate) fn quorum_members(state: &ClusterState) -> Vec<UniqueAddress> {
    state
        .members
        .iter()
        .filter(|m| matches!(m.status, MemberStatus::Up | MemberStatus::Leaving))
        .map(|m| m.node.clone())
        .collect()
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

/// Whether `node` is leaving gracefully.
pub(crate) fn is_leaving(state: &ClusterState, node: &UniqueAddress) -> bool {
    state
        .member(node)
        .is_some_and(|m| matches!(m.status, MemberStatus::Leaving | MemberStatus::Exiting))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_of_n() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(2), 2);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
    }
}
