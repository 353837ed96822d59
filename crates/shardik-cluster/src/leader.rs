//! What the leader does to the membership, at convergence and without it.

use crate::gossip::Gossip;
use crate::member::{MemberStatus, UniqueAddress};

/// Applies the leader's actions to `gossip` if `self_node` is its leader, and makes a new
/// version if anything changed. Returns the changes as `(member, new state)`.
///
/// At convergence: `Joining`/`WeaklyUp` → `Up` (with the next up-number), `Leaving` →
/// `Exiting`, `Exiting`/`Down` → `Removed` (each member moves at most one step per call).
/// Without convergence, and only if `weakly_up` is set (the caller decides when the grace
/// period has passed): reachable `Joining` → `WeaklyUp`.
///
/// ```
/// use std::collections::BTreeSet;
/// use shardik_cluster::gossip::Gossip;
/// use shardik_cluster::leader::leader_actions;
/// use shardik_cluster::member::{MemberStatus, UniqueAddress};
///
/// let a = UniqueAddress::new("h:1", "a", 1);
/// let mut g = Gossip::new();
/// g.add_joining(a.clone(), BTreeSet::new()).unwrap();
/// let changes = leader_actions(&mut g, &a, false);
/// assert_eq!(changes, vec![(a.clone(), MemberStatus::Up)]);
/// assert_eq!(g.member(&a).unwrap().up_number, Some(1));
/// ```
pub fn leader_actions(
    gossip: &mut Gossip,
    self_node: &UniqueAddress,
    weakly_up: bool,
) -> Vec<(UniqueAddress, MemberStatus)> {
    if gossip.leader(self_node).as_ref() != Some(self_node) {
        return Vec::new();
    }
    let mut plan = Vec::new();
    if gossip.convergence(self_node) {
        for m in gossip.members() {
            let to = match m.status {
                MemberStatus::Joining | MemberStatus::WeaklyUp => MemberStatus::Up,
                MemberStatus::Leaving => MemberStatus::Exiting,
                MemberStatus::Exiting | MemberStatus::Down => MemberStatus::Removed,
                _ => continue,
            };
            plan.push((m.node.clone(), to));
        }
    } else if weakly_up {
        for m in gossip.members() {
            if m.status == MemberStatus::Joining && gossip.is_reachable(&m.node) {
                plan.push((m.node.clone(), MemberStatus::WeaklyUp));
            }
        }
    }
    let mut next_up = gossip
        .members()
        .filter_map(|m| m.up_number)
        .max()
        .unwrap_or(0);
    let mut done = Vec::new();
    for (node, to) in plan {
        if gossip.set_status(&node, to) == Ok(true) {
            if to == MemberStatus::Up {
                next_up = next_up.saturating_add(1);
                gossip.set_up_number(&node, next_up);
            }
            done.push((node, to));
        }
    }
    if !done.is_empty() {
        gossip.touch(self_node);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn n(i: u8) -> UniqueAddress {
        UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)
    }

    fn cluster(k: u8) -> Gossip {
        let mut g = Gossip::new();
        for i in 0..k {
            g.add_joining(n(i), BTreeSet::new()).unwrap();
        }
        leader_actions(&mut g, &n(0), false);
        for i in 0..k {
            g.mark_seen(&n(i));
        }
        g
    }

    #[test]
    fn joining_moves_up_in_address_order_with_up_numbers() {
        let g = cluster(3);
        let nums: Vec<_> = g.members().map(|m| (m.status, m.up_number)).collect();
        assert_eq!(
            nums,
            vec![
                (MemberStatus::Up, Some(1)),
                (MemberStatus::Up, Some(2)),
                (MemberStatus::Up, Some(3))
            ]
        );
    }

    #[test]
    fn only_the_leader_acts() {
        let mut g = cluster(2);
        g.add_joining(n(5), BTreeSet::new()).unwrap();
        assert!(leader_actions(&mut g, &n(1), false).is_empty());
        assert_eq!(
            leader_actions(&mut g, &n(0), false),
            vec![(n(5), MemberStatus::Up)]
        );
        assert_eq!(g.member(&n(5)).unwrap().up_number, Some(3));
    }

    #[test]
    fn nothing_without_convergence_but_weakly_up_if_allowed() {
        let mut g = cluster(3);
        g.add_joining(n(5), BTreeSet::new()).unwrap();
        g.reachability_mut().unreachable(&n(0), &n(2));
        g.touch(&n(0));
        assert!(leader_actions(&mut g, &n(0), false).is_empty());
        assert_eq!(
            leader_actions(&mut g, &n(0), true),
            vec![(n(5), MemberStatus::WeaklyUp)]
        );
        assert_eq!(g.member(&n(5)).unwrap().up_number, None);
    }

    #[test]
    fn leaving_goes_exiting_then_removed() {
        let mut g = cluster(3);
        g.set_status(&n(1), MemberStatus::Leaving).unwrap();
        g.touch(&n(1));
        assert!(
            leader_actions(&mut g, &n(0), false).is_empty(),
            "not converged"
        );
        g.mark_seen(&n(0));
        g.mark_seen(&n(2));
        assert_eq!(
            leader_actions(&mut g, &n(0), false),
            vec![(n(1), MemberStatus::Exiting)]
        );
        g.mark_seen(&n(2));
        assert_eq!(
            leader_actions(&mut g, &n(0), false),
            vec![(n(1), MemberStatus::Removed)]
        );
        assert!(g.member(&n(1)).is_none());
        assert!(g.is_tombstoned(&n(1)));
    }

    #[test]
    fn unreachable_down_member_is_removed_at_convergence() {
        let mut g = cluster(3);
        g.reachability_mut().unreachable(&n(0), &n(2));
        g.set_status(&n(2), MemberStatus::Down).unwrap();
        g.touch(&n(0));
        g.mark_seen(&n(1));
        assert_eq!(
            leader_actions(&mut g, &n(0), false),
            vec![(n(2), MemberStatus::Removed)]
        );
        assert!(g.reachability().all_unreachable().is_empty());
    }

    #[test]
    fn leaving_leader_hands_over_after_exiting() {
        let mut g = cluster(2);
        g.set_status(&n(0), MemberStatus::Leaving).unwrap();
        g.touch(&n(0));
        g.mark_seen(&n(1));
        assert_eq!(g.leader(&n(1)), Some(n(0)), "leaving still leads");
        leader_actions(&mut g, &n(0), false);
        assert_eq!(g.member(&n(0)).unwrap().status, MemberStatus::Exiting);
        assert_eq!(g.leader(&n(1)), Some(n(1)));
    }
}
