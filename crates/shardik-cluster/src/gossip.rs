//! The gossiped membership state: members, per-observer reachability, the seen set, the
//! version and tombstones, with a monotonic merge.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::member::{InvalidTransition, Member, MemberStatus, UniqueAddress};
use crate::reachability::Reachability;
use crate::vclock::{Ordering, VClock};

/// Why a join was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinRefused {
    /// This incarnation was removed (or downed) before; it must restart as a new incarnation.
    Tombstoned,
}

/// What receiving a gossip did to the local state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// Same version: only the seen sets were joined.
    Same,
    /// The remote gossip was older: the local one is kept (the sender should get ours).
    Older,
    /// The remote gossip was newer and replaced the local one.
    Newer,
    /// Both had concurrent changes: merged.
    Merged,
}

/// The membership state that nodes gossip.
///
/// ```
/// use std::collections::BTreeSet;
/// use shardik_cluster::gossip::Gossip;
/// use shardik_cluster::member::{MemberStatus, UniqueAddress};
///
/// let a = UniqueAddress::new("10.0.0.1:7000", "a", 1);
/// let mut g = Gossip::new();
/// g.add_joining(a.clone(), BTreeSet::new()).unwrap();
/// g.set_status(&a, MemberStatus::Up).unwrap();
/// g.touch(&a);
/// assert!(g.convergence(&a));
/// assert_eq!(g.leader(&a), Some(a));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gossip {
    members: BTreeMap<UniqueAddress, Member>,
    reachability: Reachability,
    seen: BTreeSet<UniqueAddress>,
    version: VClock,
    tombstones: BTreeSet<UniqueAddress>,
}

impl Gossip {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The members, in address order (removed members are not members).
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// One member.
    pub fn member(&self, node: &UniqueAddress) -> Option<&Member> {
        self.members.get(node)
    }

    /// The member currently at `address`, if any.
    pub fn member_at(&self, address: &str) -> Option<&Member> {
        self.members.values().find(|m| m.node.address == address)
    }

    /// The reachability table.
    pub fn reachability(&self) -> &Reachability {
        &self.reachability
    }

    /// The reachability table, to record the failure detector's opinion of `observer`. Call
    /// [`Gossip::touch`] after changing it.
    pub fn reachability_mut(&mut self) -> &mut Reachability {
        &mut self.reachability
    }

    /// The nodes that have seen this version.
    pub fn seen(&self) -> &BTreeSet<UniqueAddress> {
        &self.seen
    }

    /// The version.
    pub fn version(&self) -> &VClock {
        &self.version
    }

    /// Incarnations removed for good; never members again.
    pub fn tombstones(&self) -> &BTreeSet<UniqueAddress> {
        &self.tombstones
    }

    /// Records that `node` has seen this version.
    pub fn mark_seen(&mut self, node: &UniqueAddress) {
        self.seen.insert(node.clone());
    }

    /// `true` if `node` has seen this version.
    pub fn has_seen(&self, node: &UniqueAddress) -> bool {
        self.seen.contains(node)
    }

    /// Makes a new version authored by `by`: its clock entry goes up and only it has seen it.
    pub fn touch(&mut self, by: &UniqueAddress) {
        self.version.increment(&by.key());
        self.seen.clear();
        self.seen.insert(by.clone());
    }

    /// Adds `node` as `Joining`. A member at the same address (or with the same node id) but
    /// another incarnation is an earlier process of that node (incarnations are random, so
    /// they are only compared for equality, never ordered; two live processes cannot hold one
    /// address): it is marked `Down` so the leader removes it. Joining twice is a no-op; a
    /// downed or removed incarnation is refused.
    pub fn add_joining(
        &mut self,
        node: UniqueAddress,
        roles: BTreeSet<String>,
    ) -> Result<bool, JoinRefused> {
        if self.tombstones.contains(&node) {
            return Err(JoinRefused::Tombstoned);
        }
        if let Some(m) = self.members.get(&node) {
            return match m.status {
                MemberStatus::Down | MemberStatus::Removed => Err(JoinRefused::Tombstoned),
                _ => Ok(false),
            };
        }
        let earlier: Vec<Member> = self
            .members
            .values()
            .filter(|m| m.node.address == node.address || m.node.node_id == node.node_id)
            .filter(|m| m.status != MemberStatus::Down)
            .cloned()
            .collect();
        for old in earlier {
            // Every state a stored member can be in may go down (`Removed` members are not
            // stored); a state that cannot is left as it is rather than trusted blindly.
            if let Ok(down) = old.with_status(MemberStatus::Down) {
                self.members.insert(old.node.clone(), down);
            }
        }
        self.members
            .insert(node.clone(), Member::joining(node, roles));
        Ok(true)
    }

    /// Moves `node` to `to` following the transition table. `Removed` deletes the member,
    /// keeps a tombstone and forgets it in the version and the reachability table. Returns
    /// `Ok(false)` if `node` is not a member or already in that state.
    pub fn set_status(
        &mut self,
        node: &UniqueAddress,
        to: MemberStatus,
    ) -> Result<bool, InvalidTransition> {
        let Some(m) = self.members.get(node) else {
            return Ok(false);
        };
        if m.status == to {
            return Ok(false);
        }
        let next = m.with_status(to)?;
        if to == MemberStatus::Removed {
            self.remove(node);
        } else {
            self.members.insert(node.clone(), next);
        }
        Ok(true)
    }

    /// Sets the up-number of a member (the leader does it when moving it up).
    pub(crate) fn set_up_number(&mut self, node: &UniqueAddress, n: u64) {
        if let Some(m) = self.members.get_mut(node) {
            m.up_number = Some(n);
        }
    }

    fn remove(&mut self, node: &UniqueAddress) {
        self.members.remove(node);
        self.seen.remove(node);
        self.reachability.remove(node);
        self.version.prune(&node.key());
        self.tombstones.insert(node.clone());
    }

    /// The members whose state is `Down` (their own opinions no longer count).
    pub fn downed(&self) -> BTreeSet<UniqueAddress> {
        self.members
            .values()
            .filter(|m| m.status == MemberStatus::Down)
            .map(|m| m.node.clone())
            .collect()
    }

    /// `true` if no member outside the downed ones flagged `node`.
    pub fn is_reachable(&self, node: &UniqueAddress) -> bool {
        self.reachability
            .is_reachable_excluding(node, &self.downed())
    }

    /// The members flagged unreachable by some member that is not downed.
    pub fn unreachable_members(&self) -> BTreeSet<UniqueAddress> {
        let downed = self.downed();
        self.reachability
            .all_unreachable_excluding(&downed)
            .into_iter()
            .filter(|n| self.members.contains_key(n))
            .collect()
    }

    /// Convergence (Akka's rule): every unreachable member is `Down` or `Exiting`, and every
    /// `Up` or `Leaving` member has seen this version. `Joining`, `WeaklyUp`, `Exiting` and
    /// `Down` members need not have seen it. Nothing is decided by the leader without it.
    pub fn convergence(&self, _self_node: &UniqueAddress) -> bool {
        let unreachable = self.unreachable_members();
        let blocked_by_unreachable = unreachable.iter().any(|n| {
            !matches!(
                self.members[n].status,
                MemberStatus::Down | MemberStatus::Exiting
            )
        });
        if blocked_by_unreachable {
            return false;
        }
        self.members.values().all(|m| {
            !matches!(m.status, MemberStatus::Up | MemberStatus::Leaving)
                || self.seen.contains(&m.node)
        })
    }

    /// The leader as seen from `self_node` (Akka's rule): among reachable members (and
    /// `self_node`), the first `Up` or `Leaving` one in address order; if there is none, the
    /// first by state (`Down` and `Exiting` last) then address, so that a lone `Joining` node
    /// can move itself up.
    pub fn leader(&self, self_node: &UniqueAddress) -> Option<UniqueAddress> {
        let downed = self.downed();
        let reachable: Vec<&Member> = self
            .members
            .values()
            .filter(|m| {
                &m.node == self_node || self.reachability.is_reachable_excluding(&m.node, &downed)
            })
            .collect();
        if let Some(m) = reachable
            .iter()
            .find(|m| matches!(m.status, MemberStatus::Up | MemberStatus::Leaving))
        {
            return Some(m.node.clone());
        }
        reachable
            .iter()
            .min_by_key(|m| {
                let last = matches!(m.status, MemberStatus::Down | MemberStatus::Exiting);
                (last, &m.node)
            })
            .map(|m| m.node.clone())
    }

    /// The monotonic merge of two states: members joined with the later state winning, no
    /// tombstoned incarnation, reachability rows per observer by version, clocks merged. The
    /// seen set is emptied (the caller marks itself).
    pub fn merge(&self, other: &Gossip) -> Gossip {
        let tombstones: BTreeSet<UniqueAddress> =
            self.tombstones.union(&other.tombstones).cloned().collect();
        let mut members = BTreeMap::new();
        for (k, m) in self.members.iter().chain(other.members.iter()) {
            if tombstones.contains(k) {
                continue;
            }
            let merged = match members.get(k) {
                Some(prev) => Member::highest_priority(prev, m),
                None => m.clone(),
            };
            members.insert(k.clone(), merged);
        }
        let keys: BTreeSet<UniqueAddress> = members.keys().cloned().collect();
        let reachability = self.reachability.merge(&other.reachability, &keys);
        let mut version = self.version.merge(&other.version);
        for t in &tombstones {
            version.prune(&t.key());
        }
        Gossip {
            members,
            reachability,
            seen: BTreeSet::new(),
            version,
            tombstones,
        }
    }

    /// Checks a state received from another node before it is taken in: one that no node
    /// running this code can author (a stored `Removed` member, a member that is also
    /// tombstoned or stored under another key, a counter or up-number near overflow) is
    /// refused with the reason, so a corrupt or hostile message cannot break the membership
    /// state machine.
    pub fn check_received(&self) -> Result<(), String> {
        /// Far above anything a cluster counts to, far below overflow.
        const LIMIT: u64 = u64::MAX / 4;
        for (key, m) in &self.members {
            if *key != m.node {
                return Err(format!("member {} is stored under {key}", m.node));
            }
            if m.status == MemberStatus::Removed {
                return Err(format!("member {key} is stored as Removed"));
            }
            if self.tombstones.contains(key) {
                return Err(format!("member {key} is also tombstoned"));
            }
            if m.up_number.is_some_and(|n| n > LIMIT) {
                return Err(format!("member {key} has an impossible up-number"));
            }
        }
        if self.version.max_counter() > LIMIT {
            return Err("the version has an impossible counter".into());
        }
        let members: BTreeSet<&UniqueAddress> = self.members.keys().collect();
        self.reachability.check_received(&members)
    }

    /// `true` if both states hold the same members, reachability and tombstones (whatever
    /// their versions and seen sets).
    pub fn same_content(&self, other: &Gossip) -> bool {
        self.members == other.members
            && self.reachability == other.reachability
            && self.tombstones == other.tombstones
    }

    /// Takes in `remote` as `self_node` does: keeps the newer of both or merges concurrent
    /// ones (the merge is a new version authored by `self_node`), and marks `self_node` as
    /// having seen the result. Members this node already tombstoned never come back, even
    /// when the remote version is newer. A node the remote state removed takes it as is.
    pub fn receive(&mut self, remote: &Gossip, self_node: &UniqueAddress) -> Received {
        if self.tombstones.contains(self_node) {
            // Already removed: nothing more to learn, and nothing to author.
            return Received::Older;
        }
        if remote.tombstones.contains(self_node) {
            // We were removed: the remote state is the truth, and we must not author a mix of
            // both under a version we can no longer advance.
            *self = remote.clone();
            return Received::Newer;
        }
        // A remote state that holds a member we removed, or whose tombstones differ from ours,
        // is merged (never taken or dropped wholesale), so tombstones are never lost.
        let resurrects = remote.members.keys().any(|k| self.tombstones.contains(k))
            || self.tombstones != remote.tombstones;
        let outcome = match self.version.compare(&remote.version) {
            Ordering::Same if !resurrects && self.same_content(remote) => {
                self.seen.extend(remote.seen.iter().cloned());
                Received::Same
            }
            Ordering::After if !resurrects => Received::Older,
            Ordering::Before if !resurrects => {
                *self = remote.clone();
                Received::Newer
            }
            _ => {
                let merged = self.merge(remote);
                // The merged version is the entry-wise maximum of both (without the entries of
                // removed members), exactly as Akka does: no new entry, so two nodes that merge
                // the same pair of states at the same time end up with one state under one
                // version instead of two new concurrent ones (which, gossiped to each other,
                // would be merged again forever). Only if pruning made the merged version
                // equal to the version of an input whose content differs (a change authored
                // by a removed member) does the merge need a version of its own: otherwise
                // two different states would share one version and never be reconciled.
                let collides = |input: &Gossip| {
                    let mut v = input.version.clone();
                    for t in &merged.tombstones {
                        v.prune(&t.key());
                    }
                    v.compare(&merged.version) == Ordering::Same && !merged.same_content(input)
                };
                let needs_version = collides(self) || collides(remote);
                *self = merged;
                if needs_version {
                    self.version.increment(&self_node.key());
                }
                Received::Merged
            }
        };
        self.seen.insert(self_node.clone());
        outcome
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> UniqueAddress {
        UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)
    }

    fn up(nodes: &[u8]) -> Gossip {
        let mut g = Gossip::new();
        for (k, i) in nodes.iter().enumerate() {
            g.add_joining(n(*i), BTreeSet::new()).unwrap();
            g.set_status(&n(*i), MemberStatus::Up).unwrap();
            g.set_up_number(&n(*i), k as u64 + 1);
        }
        g.touch(&n(nodes[0]));
        g
    }

    /// States no node running this code authors are refused before they are taken in.
    #[test]
    fn received_states_no_node_authors_are_refused() {
        let good = up(&[0, 1]);
        assert_eq!(good.check_received(), Ok(()));
        let broken = |f: &dyn Fn(&mut Gossip)| {
            let mut g = good.clone();
            f(&mut g);
            g.check_received().unwrap_err()
        };
        let removed = broken(&|g| {
            let m = g.members.get_mut(&n(1)).unwrap();
            m.status = MemberStatus::Removed;
        });
        assert!(removed.contains("Removed"), "{removed}");
        let moved = broken(&|g| {
            let m = g.members.remove(&n(1)).unwrap();
            g.members.insert(n(2), m);
        });
        assert!(moved.contains("stored under"), "{moved}");
        let both = broken(&|g| {
            g.tombstones.insert(n(1));
        });
        assert!(both.contains("tombstoned"), "{both}");
        let old = broken(&|g| g.set_up_number(&n(1), u64::MAX));
        assert!(old.contains("up-number"), "{old}");
        let clock = broken(&|g| g.version.set(n(1).key(), u64::MAX));
        assert!(clock.contains("counter"), "{clock}");
        let stranger = broken(&|g| {
            g.reachability_mut().unreachable(&n(7), &n(1));
        });
        assert!(stranger.contains("not a member"), "{stranger}");
        let ghost = broken(&|g| {
            g.reachability_mut().unreachable(&n(0), &n(7));
        });
        assert!(ghost.contains("not a member"), "{ghost}");
        let rows = broken(&|g| {
            for _ in 0..3 {
                g.reachability_mut().unreachable(&n(0), &n(1));
                g.reachability_mut().reachable(&n(0), &n(1));
            }
            g.reachability_mut().set_version_for_test(&n(0), u64::MAX);
        });
        assert!(rows.contains("version"), "{rows}");
        // A flag between members is fine.
        let mut flagged = good.clone();
        flagged.reachability_mut().unreachable(&n(0), &n(1));
        assert_eq!(flagged.check_received(), Ok(()));
    }

    /// A join beside a stored member that cannot go down (which only a state that failed the
    /// check above could hold) leaves that member as it is instead of panicking.
    #[test]
    fn a_join_beside_a_member_that_cannot_go_down_does_not_panic() {
        let mut g = up(&[0, 1]);
        g.members.get_mut(&n(1)).unwrap().status = MemberStatus::Removed;
        let again = UniqueAddress::new("h:1", "n1", 2);
        assert_eq!(g.add_joining(again.clone(), BTreeSet::new()), Ok(true));
        assert_eq!(
            g.member(&again).map(|m| m.status),
            Some(MemberStatus::Joining)
        );
    }

    #[test]
    fn convergence_needs_every_up_member_to_have_seen() {
        let mut g = up(&[0, 1, 2]);
        assert!(!g.convergence(&n(0)));
        g.mark_seen(&n(1));
        assert!(!g.convergence(&n(0)));
        g.mark_seen(&n(2));
        assert!(g.convergence(&n(0)));
    }

    #[test]
    fn joining_members_need_not_have_seen() {
        let mut g = up(&[0]);
        g.add_joining(n(1), BTreeSet::new()).unwrap();
        assert!(g.convergence(&n(0)));
    }

    #[test]
    fn unreachable_blocks_convergence_unless_down_or_exiting() {
        let mut g = up(&[0, 1, 2]);
        g.reachability_mut().unreachable(&n(0), &n(2));
        g.touch(&n(0));
        g.mark_seen(&n(1));
        g.mark_seen(&n(2));
        assert!(!g.convergence(&n(0)));
        g.set_status(&n(2), MemberStatus::Down).unwrap();
        g.touch(&n(0));
        g.mark_seen(&n(1));
        assert!(g.convergence(&n(0)), "down unreachable member need not see");
    }

    #[test]
    fn leader_is_first_reachable_up_by_address() {
        let mut g = up(&[0, 1, 2]);
        assert_eq!(g.leader(&n(2)), Some(n(0)));
        g.reachability_mut().unreachable(&n(1), &n(0));
        assert_eq!(g.leader(&n(2)), Some(n(1)));
        // but a node always counts itself reachable
        assert_eq!(g.leader(&n(0)), Some(n(0)));
        // a downed observer's flags do not count
        g.set_status(&n(1), MemberStatus::Down).unwrap();
        assert_eq!(g.leader(&n(2)), Some(n(0)));
    }

    #[test]
    fn leader_among_joining_only_is_lowest_address() {
        let mut g = Gossip::new();
        g.add_joining(n(3), BTreeSet::new()).unwrap();
        g.add_joining(n(1), BTreeSet::new()).unwrap();
        assert_eq!(g.leader(&n(3)), Some(n(1)));
    }

    #[test]
    fn invalid_transitions_are_rejected() {
        let mut g = up(&[0, 1]);
        g.set_status(&n(1), MemberStatus::Down).unwrap();
        assert!(g.set_status(&n(1), MemberStatus::Up).is_err());
        assert!(g.set_status(&n(0), MemberStatus::Joining).is_err());
        assert_eq!(g.member(&n(1)).unwrap().status, MemberStatus::Down);
    }

    #[test]
    fn merge_never_brings_down_back() {
        let base = up(&[0, 1, 2]);
        let mut a = base.clone();
        a.set_status(&n(2), MemberStatus::Down).unwrap();
        a.touch(&n(0));
        let mut b = base.clone();
        b.set_status(&n(1), MemberStatus::Leaving).unwrap();
        b.touch(&n(1));
        for m in [a.merge(&b), b.merge(&a)] {
            assert_eq!(m.member(&n(2)).unwrap().status, MemberStatus::Down);
            assert_eq!(m.member(&n(1)).unwrap().status, MemberStatus::Leaving);
            assert_eq!(m.version().compare(a.version()), Ordering::After);
            assert_eq!(m.version().compare(b.version()), Ordering::After);
        }
        assert_eq!(a.merge(&b), b.merge(&a));
    }

    #[test]
    fn stale_gossip_never_brings_removed_back() {
        let base = up(&[0, 1, 2]);
        let mut a = base.clone();
        a.set_status(&n(2), MemberStatus::Down).unwrap();
        a.set_status(&n(2), MemberStatus::Removed).unwrap();
        a.touch(&n(0));
        assert!(a.tombstones().contains(&n(2)));
        // stale copy, even one made "newer" by a node that never saw the removal
        let mut stale = base.clone();
        stale.touch(&n(1));
        stale.touch(&n(1));
        let mut recv = a.clone();
        recv.receive(&stale, &n(0));
        assert!(recv.member(&n(2)).is_none());
        let mut other_way = stale.clone();
        other_way.receive(&a, &n(1));
        assert!(other_way.member(&n(2)).is_none());
        // and the cleaned state wins over the stale one when it comes back
        let mut stale_again = stale.clone();
        assert_ne!(stale_again.receive(&recv, &n(1)), Received::Older);
        assert!(stale_again.member(&n(2)).is_none());
        // a removed incarnation cannot join again
        assert_eq!(
            recv.add_joining(n(2), BTreeSet::new()),
            Err(JoinRefused::Tombstoned)
        );
    }

    #[test]
    fn stale_gossip_never_brings_a_down_member_back_up() {
        let base = up(&[0, 1, 2]);
        let mut downed = base.clone();
        downed.set_status(&n(2), MemberStatus::Down).unwrap();
        downed.touch(&n(0));
        // a stale copy that two others kept changing (so its version is concurrent)
        let mut stale = base.clone();
        stale.set_status(&n(1), MemberStatus::Leaving).unwrap();
        stale.touch(&n(1));
        for (mut a, b, me) in [
            (downed.clone(), stale.clone(), n(0)),
            (stale.clone(), downed.clone(), n(1)),
        ] {
            a.receive(&b, &me);
            assert_eq!(a.member(&n(2)).unwrap().status, MemberStatus::Down);
            assert_eq!(a.member(&n(1)).unwrap().status, MemberStatus::Leaving);
        }
        // a strictly older copy is ignored
        let mut d = downed.clone();
        assert_eq!(d.receive(&base, &n(0)), Received::Older);
        assert_eq!(d.member(&n(2)).unwrap().status, MemberStatus::Down);
    }

    #[test]
    fn crossing_merges_converge_on_one_version() {
        // Two nodes with concurrent changes receive each other's state at the same time:
        // both must end with the same state under the same version (no new version per
        // merge, which would make the two results concurrent again, forever).
        let base = up(&[0, 1, 2]);
        let mut a = base.clone();
        a.reachability_mut().unreachable(&n(0), &n(2));
        a.touch(&n(0));
        let mut b = base.clone();
        b.set_status(&n(1), MemberStatus::Leaving).unwrap();
        b.touch(&n(1));
        let (a0, b0) = (a.clone(), b.clone());
        assert_eq!(a.receive(&b0, &n(0)), Received::Merged);
        assert_eq!(b.receive(&a0, &n(1)), Received::Merged);
        assert_eq!(a.version(), b.version());
        assert!(a.same_content(&b));
        let a1 = a.clone();
        assert_eq!(b.receive(&a1, &n(1)), Received::Same);
        assert!(b.has_seen(&n(0)) && b.has_seen(&n(1)));
    }

    #[test]
    fn same_version_with_different_content_is_merged_under_a_new_version() {
        // Pruning a removed member's entry can leave two different states under one version
        // (a change only the removed member authored); they must not be taken as the same.
        let base = up(&[0, 1, 2]);
        let mut a = base.clone();
        a.set_status(&n(2), MemberStatus::Down).unwrap();
        a.set_status(&n(2), MemberStatus::Removed).unwrap();
        let mut b = a.clone();
        b.set_status(&n(1), MemberStatus::Leaving).unwrap();
        assert_eq!(a.version(), b.version());
        let before = a.version().clone();
        assert_eq!(a.receive(&b, &n(0)), Received::Merged);
        assert_eq!(a.member(&n(1)).unwrap().status, MemberStatus::Leaving);
        assert_eq!(a.version().compare(&before), Ordering::After);
    }

    #[test]
    fn remote_newer_with_our_tombstone_gets_a_newer_version() {
        let base = up(&[0, 1, 2]);
        let mut a = base.clone();
        a.set_status(&n(2), MemberStatus::Down).unwrap();
        a.set_status(&n(2), MemberStatus::Removed).unwrap();
        // no touch: simulates pruning making the remote look newer
        let mut remote = base.clone();
        remote.touch(&n(1));
        let before = remote.version().clone();
        assert_eq!(a.receive(&remote, &n(0)), Received::Merged);
        assert_eq!(a.version().compare(&before), Ordering::After);
        assert!(a.member(&n(2)).is_none());
    }

    #[test]
    fn new_incarnation_replaces_old_one() {
        let mut g = up(&[0, 1]);
        let reborn = UniqueAddress::new("h:1", "n1", 2);
        assert_eq!(g.add_joining(reborn.clone(), BTreeSet::new()), Ok(true));
        assert_eq!(g.member(&n(1)).unwrap().status, MemberStatus::Down);
        assert_eq!(g.member(&reborn).unwrap().status, MemberStatus::Joining);
        // the old incarnation may not come back
        assert_eq!(
            g.add_joining(n(1), BTreeSet::new()),
            Err(JoinRefused::Tombstoned)
        );
        // incarnations are random: a restart with a smaller number replaces the previous one
        let again = UniqueAddress::new("h:1", "n1", 0);
        assert_eq!(g.add_joining(again.clone(), BTreeSet::new()), Ok(true));
        assert_eq!(g.member(&reborn).unwrap().status, MemberStatus::Down);
        assert_eq!(g.member(&again).unwrap().status, MemberStatus::Joining);
        // the same node id on a new address is a restart too
        let moved = UniqueAddress::new("h:9", "n1", 7);
        assert_eq!(g.add_joining(moved.clone(), BTreeSet::new()), Ok(true));
        assert_eq!(g.member(&again).unwrap().status, MemberStatus::Down);
    }

    #[test]
    fn receive_outcomes() {
        let g = up(&[0, 1]);
        let mut same = g.clone();
        assert_eq!(same.receive(&g, &n(1)), Received::Same);
        assert!(same.has_seen(&n(0)) && same.has_seen(&n(1)));
        let mut newer = g.clone();
        newer.set_status(&n(1), MemberStatus::Leaving).unwrap();
        newer.touch(&n(1));
        let mut old = g.clone();
        assert_eq!(old.receive(&newer, &n(0)), Received::Newer);
        assert_eq!(old.member(&n(1)).unwrap().status, MemberStatus::Leaving);
        assert!(old.has_seen(&n(0)) && old.has_seen(&n(1)));
        let mut n2 = newer.clone();
        assert_eq!(n2.receive(&g, &n(1)), Received::Older);
    }
}
