//! Cluster events: what changed between two membership states.

use serde::{Deserialize, Serialize};

use crate::gossip::Gossip;
use crate::member::{Member, MemberStatus, UniqueAddress};

/// A change of membership, reachability or leadership, as subscribers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterEvent {
    /// A member joined (state `Joining`).
    MemberJoined(Member),
    /// A member was moved to `WeaklyUp`.
    MemberWeaklyUp(Member),
    /// A member was moved to `Up`.
    MemberUp(Member),
    /// A member asked to leave (`Leaving`).
    MemberLeft(Member),
    /// A member is `Exiting`.
    MemberExited(Member),
    /// A member was marked `Down`. Not published when this node learns of the `Down` and
    /// the removal at once (see [`MemberRemoved`](ClusterEvent::MemberRemoved)).
    MemberDowned(Member),
    /// A member was removed. Events describe the difference between two consecutive views
    /// of this node, and one gossip may take a member through several statuses: a member
    /// downed and removed in one step yields only `MemberRemoved { previous: Up, .. }` (no
    /// [`MemberDowned`](ClusterEvent::MemberDowned)); likewise a member that left may be
    /// removed without its `MemberLeft` or `MemberExited` published here.
    MemberRemoved {
        /// Who.
        node: UniqueAddress,
        /// The last status this node saw it in (not necessarily `Down` or `Exiting`).
        previous: MemberStatus,
    },
    /// Some member flagged this one unreachable.
    Unreachable(UniqueAddress),
    /// Every member reaches this one again.
    Reachable(UniqueAddress),
    /// The leader changed (`None`: no leader).
    LeaderChanged(Option<UniqueAddress>),
    /// This node is fenced: on its view the split brain resolver would down it, so what must
    /// never run twice (shard hosting, singletons) stops here now (see
    /// [`MembershipNode::is_fenced`](crate::node::MembershipNode::is_fenced)).
    Fenced,
    /// This node is no longer fenced.
    Unfenced,
}

/// The events that take `old` to `new`, as `self_node` sees them.
pub fn diff(old: &Gossip, new: &Gossip, self_node: &UniqueAddress) -> Vec<ClusterEvent> {
    let mut out = Vec::new();
    for m in new.members() {
        let before = old.member(&m.node).map(|o| o.status);
        if before == Some(m.status) {
            continue;
        }
        out.push(match m.status {
            MemberStatus::Joining => ClusterEvent::MemberJoined(m.clone()),
            MemberStatus::WeaklyUp => ClusterEvent::MemberWeaklyUp(m.clone()),
            MemberStatus::Up => ClusterEvent::MemberUp(m.clone()),
            MemberStatus::Leaving => ClusterEvent::MemberLeft(m.clone()),
            MemberStatus::Exiting => ClusterEvent::MemberExited(m.clone()),
            MemberStatus::Down => ClusterEvent::MemberDowned(m.clone()),
            MemberStatus::Removed => continue,
        });
    }
    for m in old.members() {
        if new.member(&m.node).is_none() {
            out.push(ClusterEvent::MemberRemoved {
                node: m.node.clone(),
                previous: m.status,
            });
        }
    }
    let old_unreachable = old.unreachable_members();
    let new_unreachable = new.unreachable_members();
    for n in new_unreachable.difference(&old_unreachable) {
        out.push(ClusterEvent::Unreachable(n.clone()));
    }
    for n in old_unreachable.difference(&new_unreachable) {
        if new.member(n).is_some() {
            out.push(ClusterEvent::Reachable(n.clone()));
        }
    }
    let (ol, nl) = (old.leader(self_node), new.leader(self_node));
    if ol != nl {
        out.push(ClusterEvent::LeaderChanged(nl));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::leader_actions;
    use std::collections::BTreeSet;

    #[test]
    fn diff_reports_up_unreachable_removed_and_leader() {
        let a = UniqueAddress::new("h:1", "a", 1);
        let b = UniqueAddress::new("h:2", "b", 1);
        let empty = Gossip::new();
        let mut g = Gossip::new();
        g.add_joining(a.clone(), BTreeSet::new()).unwrap();
        g.add_joining(b.clone(), BTreeSet::new()).unwrap();
        leader_actions(&mut g, &a, false);
        let ev = diff(&empty, &g, &a);
        assert!(matches!(&ev[0], ClusterEvent::MemberUp(m) if m.node == a));
        assert!(matches!(&ev[1], ClusterEvent::MemberUp(m) if m.node == b));
        assert_eq!(ev[2], ClusterEvent::LeaderChanged(Some(a.clone())));
        let mut h = g.clone();
        h.reachability_mut().unreachable(&b, &a);
        h.touch(&b);
        assert_eq!(
            diff(&g, &h, &b),
            vec![
                ClusterEvent::Unreachable(a.clone()),
                ClusterEvent::LeaderChanged(Some(b.clone()))
            ]
        );
        let mut r = h.clone();
        r.set_status(&a, MemberStatus::Down).unwrap();
        r.set_status(&a, MemberStatus::Removed).unwrap();
        let ev = diff(&h, &r, &b);
        assert_eq!(
            ev,
            vec![ClusterEvent::MemberRemoved {
                node: a,
                previous: MemberStatus::Up
            }]
        );
    }
}
