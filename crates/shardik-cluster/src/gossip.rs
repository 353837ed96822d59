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
#[serde(into = "GossipWire", try_from = "GossipWire")]
pub struct Gossip {
    members: BTreeMap<UniqueAddress, Member>,
    reachability: Reachability,
    seen: BTreeSet<UniqueAddress>,
    version: VClock,
    /// Removed incarnations, each with the wall-clock time of its removal in ms since the
    /// UNIX epoch (0: not known yet; the leader stamps it).
    tombstones: BTreeMap<UniqueAddress, u64>,
}

/// How a [`Gossip`] travels: the tombstones as the set they always were (so a node that does
/// not know removal times still reads the state) and their removal times beside them, in the
/// set's order.
#[derive(Serialize, Deserialize)]
struct GossipWire {
    members: BTreeMap<UniqueAddress, Member>,
    reachability: Reachability,
    seen: BTreeSet<UniqueAddress>,
    version: VClock,
    tombstones: BTreeSet<UniqueAddress>,
    /// One per tombstone, in order; absent from a node that does not record them.
    #[serde(default)]
    tombstone_times: Vec<u64>,
}

impl From<Gossip> for GossipWire {
    fn from(g: Gossip) -> Self {
        let tombstone_times = g.tombstones.values().copied().collect();
        GossipWire {
            members: g.members,
            reachability: g.reachability,
            seen: g.seen,
            version: g.version,
            tombstones: g.tombstones.into_keys().collect(),
            tombstone_times,
        }
    }
}

impl TryFrom<GossipWire> for Gossip {
    type Error = String;

    fn try_from(w: GossipWire) -> Result<Self, String> {
        let times = match w.tombstone_times.len() {
            0 => vec![0; w.tombstones.len()],
            n if n == w.tombstones.len() => w.tombstone_times,
            n => {
                return Err(format!(
                    "{} tombstones but {n} removal times",
                    w.tombstones.len()
                ))
            }
        };
        Ok(Gossip {
            members: w.members,
            reachability: w.reachability,
            seen: w.seen,
            version: w.version,
            tombstones: w.tombstones.into_iter().zip(times).collect(),
        })
    }
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

    /// Incarnations removed for good, each with the wall-clock time of its removal (ms since
    /// the UNIX epoch; 0 until the leader stamps it). Never members again, for as long as the
    /// tombstone is kept (see [`Gossip::settle_tombstones`]).
    pub fn tombstones(&self) -> &BTreeMap<UniqueAddress, u64> {
        &self.tombstones
    }

    /// `true` if `node` is a removed incarnation (while its tombstone is kept).
    pub fn is_tombstoned(&self, node: &UniqueAddress) -> bool {
        self.tombstones.contains_key(node)
    }

    /// The leader's upkeep of the tombstones at `now` (wall clock, ms since the UNIX epoch):
    /// stamps the removals not stamped yet with `now` and drops the tombstones removed at or
    /// before `drop_before`. Returns `true` if anything changed; the caller then makes a new
    /// version ([`Gossip::touch`]), which the other nodes take although it lacks tombstones
    /// they hold, as long as those are older than what they keep (see
    /// [`Gossip::receive_keeping`]).
    ///
    /// Without it every removed incarnation (each restart, each leave) would stay in every
    /// gossip for good.
    pub fn settle_tombstones(&mut self, now: u64, drop_before: u64) -> bool {
        let mut changed = false;
        for at in self.tombstones.values_mut() {
            if *at == 0 {
                *at = now.max(1);
                changed = true;
            }
        }
        let before = self.tombstones.len();
        self.tombstones.retain(|_, at| *at > drop_before);
        changed || self.tombstones.len() != before
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
        if self.tombstones.contains_key(&node) {
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
        self.tombstones.insert(node.clone(), 0);
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
        // The union; a removal stamped on both sides keeps the later time.
        let mut tombstones = self.tombstones.clone();
        for (k, at) in &other.tombstones {
            let mine = tombstones.entry(k.clone()).or_insert(0);
            *mine = (*mine).max(*at);
        }
        let mut members = BTreeMap::new();
        for (k, m) in self.members.iter().chain(other.members.iter()) {
            if tombstones.contains_key(k) {
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
        for t in tombstones.keys() {
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
            if self.tombstones.contains_key(key) {
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
    /// their versions, seen sets and removal times).
    ///
    /// Removal times are left out: a node that does not record them (an older release)
    /// passes a state on with every time unknown, and a time is no reason for a new version.
    /// [`Gossip::receive`] keeps the later of two times of one tombstone instead.
    pub fn same_content(&self, other: &Gossip) -> bool {
        self.members == other.members
            && self.reachability == other.reachability
            && self.tombstones.len() == other.tombstones.len()
            && self.tombstones.keys().eq(other.tombstones.keys())
    }

    /// Keeps the later removal time of every tombstone both states hold (an unknown time, 0,
    /// never replaces a known one). Not a change of content: no new version.
    fn absorb_removal_times(&mut self, other: &Gossip) {
        for (k, at) in &other.tombstones {
            if let Some(mine) = self.tombstones.get_mut(k) {
                *mine = (*mine).max(*at);
            }
        }
    }

    /// Takes in `remote` as `self_node` does: keeps the newer of both or merges concurrent
    /// ones (the merge is a new version authored by `self_node`), and marks `self_node` as
    /// having seen the result. Members this node already tombstoned never come back, even
    /// when the remote version is newer. A node the remote state removed takes it as is.
    /// No tombstone is ever dropped: [`Gossip::receive_keeping`] with `keep_since` 0.
    pub fn receive(&mut self, remote: &Gossip, self_node: &UniqueAddress) -> Received {
        self.receive_keeping(remote, self_node, 0)
    }

    /// [`Gossip::receive`], except that a newer `remote` state may lack tombstones this one
    /// holds that were removed before `keep_since` (wall clock, ms since the UNIX epoch): the
    /// leader dropped them ([`Gossip::settle_tombstones`]), and the newer state is taken as
    /// it is. A newer state that lacks a younger (or unstamped) tombstone is merged instead,
    /// as [`Gossip::receive`] does with any: pruned version entries can make a state that
    /// never saw a removal look newer than it.
    pub fn receive_keeping(
        &mut self,
        remote: &Gossip,
        self_node: &UniqueAddress,
        keep_since: u64,
    ) -> Received {
        if self.tombstones.contains_key(self_node) {
            // Already removed: nothing more to learn, and nothing to author.
            return Received::Older;
        }
        if remote.tombstones.contains_key(self_node) {
            // We were removed: the remote state is the truth, and we must not author a mix of
            // both under a version we can no longer advance.
            *self = remote.clone();
            return Received::Newer;
        }
        // A remote state that holds a member we removed, or whose tombstones differ from ours,
        // is merged (never taken or dropped wholesale), so tombstones are never lost; except
        // those old enough for the leader to have dropped them, which a newer state may lack.
        let kept = |at: u64| at == 0 || at >= keep_since;
        let resurrects = remote
            .members
            .keys()
            .any(|k| self.tombstones.contains_key(k))
            || self
                .tombstones
                .iter()
                .any(|(k, at)| kept(*at) && !remote.tombstones.contains_key(k))
            || remote
                .tombstones
                .iter()
                .any(|(k, at)| kept(*at) && !self.tombstones.contains_key(k));
        let outcome = match self.version.compare(&remote.version) {
            Ordering::Same if !resurrects && self.same_content(remote) => {
                self.seen.extend(remote.seen.iter().cloned());
                self.absorb_removal_times(remote);
                Received::Same
            }
            Ordering::After if !resurrects => {
                self.absorb_removal_times(remote);
                Received::Older
            }
            Ordering::Before if !resurrects => {
                let mine = std::mem::replace(self, remote.clone());
                self.absorb_removal_times(&mine);
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
                    for t in merged.tombstones.keys() {
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
            g.tombstones.insert(n(1), 5);
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
        assert!(a.is_tombstoned(&n(2)));
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

    /// `n(2)` removed from `up(&[0, 1, 2])` and stamped at `at`, as the leader `n(0)` does.
    fn removed_at(at: u64) -> Gossip {
        let mut g = up(&[0, 1, 2]);
        g.set_status(&n(2), MemberStatus::Down).unwrap();
        g.set_status(&n(2), MemberStatus::Removed).unwrap();
        assert_eq!(
            g.tombstones()[&n(2)],
            0,
            "unstamped until the leader stamps it"
        );
        assert!(g.settle_tombstones(at, 0));
        g.touch(&n(0));
        g
    }

    #[test]
    fn the_leader_stamps_removals_and_drops_old_tombstones() {
        let mut g = removed_at(1_000);
        assert_eq!(g.tombstones()[&n(2)], 1_000);
        // Nothing to do: stamped, and not old enough.
        assert!(!g.settle_tombstones(5_000, 999));
        assert!(g.is_tombstoned(&n(2)));
        assert!(g.settle_tombstones(5_000, 1_000));
        assert!(g.tombstones().is_empty());
        // A removed incarnation may join again only once its tombstone is gone (a process
        // does not rejoin with an incarnation it had: this is what pruning gives up).
        assert_eq!(g.add_joining(n(2), BTreeSet::new()), Ok(true));
    }

    #[test]
    fn a_newer_state_without_an_old_tombstone_is_taken_as_it_is() {
        let holder = removed_at(1_000);
        let mut pruned = holder.clone();
        assert!(pruned.settle_tombstones(30_000, 25_000));
        pruned.touch(&n(0));
        // Removed at 1 000, kept since 20 000: the leader's newer state wins, without it.
        let mut h = holder.clone();
        assert_eq!(h.receive_keeping(&pruned, &n(1), 20_000), Received::Newer);
        assert!(h.tombstones().is_empty());
        assert_eq!(h.version(), pruned.version());
        // The old state coming back (gossip still in flight) does not bring it back either.
        let mut p = pruned.clone();
        assert_eq!(p.receive_keeping(&holder, &n(0), 20_000), Received::Older);
        assert!(p.tombstones().is_empty());
        // A tombstone younger than what is kept is merged back in, under a newer version:
        // the newer-looking state may be one that never saw the removal.
        let mut young = holder.clone();
        assert_eq!(young.receive_keeping(&pruned, &n(1), 500), Received::Merged);
        assert!(young.is_tombstoned(&n(2)));
        assert_eq!(young.version().compare(pruned.version()), Ordering::After);
        // ... and so is one not stamped yet, however old the cut-off.
        let mut unstamped = holder.clone();
        unstamped.tombstones.insert(n(2), 0);
        assert_eq!(
            unstamped.receive_keeping(&pruned, &n(1), u64::MAX),
            Received::Merged
        );
        assert!(unstamped.is_tombstoned(&n(2)));
        // `receive` keeps every tombstone.
        let mut all = holder.clone();
        assert_eq!(all.receive(&pruned, &n(1)), Received::Merged);
        assert!(all.is_tombstoned(&n(2)));
    }

    #[test]
    fn merged_tombstones_keep_the_later_removal_time() {
        let a = removed_at(1_000);
        let mut b = up(&[0, 1, 2]);
        b.set_status(&n(2), MemberStatus::Down).unwrap();
        b.set_status(&n(2), MemberStatus::Removed).unwrap();
        b.settle_tombstones(3_000, 0);
        b.touch(&n(1));
        for m in [a.merge(&b), b.merge(&a)] {
            assert_eq!(m.tombstones()[&n(2)], 3_000);
        }
        let mut unstamped = b.clone();
        unstamped.tombstones.insert(n(2), 0);
        assert_eq!(a.merge(&unstamped).tombstones()[&n(2)], 1_000);
    }

    /// A node of an older release passes states on without removal times. That is no change
    /// of content: neither the same version nor a newer one it made loses the times, and no
    /// version is made for them (a new version per round made every such exchange churn, and
    /// the cluster never converged while the older node was a member).
    #[test]
    fn states_passed_on_without_removal_times_keep_them_and_make_no_version() {
        let stamped = removed_at(1_000);
        let mut from_old = stamped.clone();
        for at in from_old.tombstones.values_mut() {
            *at = 0;
        }
        let mut g = stamped.clone();
        assert_eq!(g.receive(&from_old, &n(1)), Received::Same);
        assert_eq!(g.version(), stamped.version());
        assert_eq!(g.tombstones()[&n(2)], 1_000);
        // A newer version the older node made (it flagged someone).
        let mut newer = from_old.clone();
        newer.reachability_mut().unreachable(&n(0), &n(1));
        newer.touch(&n(0));
        let mut g = stamped.clone();
        assert_eq!(g.receive(&newer, &n(1)), Received::Newer);
        assert_eq!(g.version(), newer.version());
        assert_eq!(g.tombstones()[&n(2)], 1_000);
        // An older one.
        let mut g = newer.clone();
        g.absorb_removal_times(&stamped);
        let mut old_and_stamped = g.clone();
        assert_eq!(old_and_stamped.receive(&from_old, &n(1)), Received::Older);
        assert_eq!(old_and_stamped.tombstones()[&n(2)], 1_000);
        // And the times that arrive are kept: the older node's state, once stamped here, is
        // the same state.
        let mut unstamped = from_old.clone();
        assert_eq!(unstamped.receive(&stamped, &n(1)), Received::Same);
        assert_eq!(unstamped.tombstones()[&n(2)], 1_000);
    }

    #[test]
    fn tombstones_travel_with_their_removal_times_and_older_forms_still_read() {
        let g = removed_at(1_234);
        let bytes = rmp_serde::to_vec_named(&g).unwrap();
        let back: Gossip = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, g);
        // The form without times (what nodes wrote before removal times existed): the
        // tombstones arrive unstamped, and the leader stamps them.
        #[derive(Serialize, Deserialize)]
        struct Before {
            members: BTreeMap<UniqueAddress, Member>,
            reachability: Reachability,
            seen: BTreeSet<UniqueAddress>,
            version: VClock,
            tombstones: BTreeSet<UniqueAddress>,
        }
        let before = Before {
            members: g.members.clone(),
            reachability: g.reachability.clone(),
            seen: g.seen.clone(),
            version: g.version.clone(),
            tombstones: g.tombstones.keys().cloned().collect(),
        };
        let old: Gossip =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&before).unwrap()).unwrap();
        assert_eq!(old.tombstones()[&n(2)], 0);
        assert_eq!(old.members, g.members);
        // And a node that does not know removal times reads ours (it ignores the times).
        let theirs: Before = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(theirs.tombstones, BTreeSet::from([n(2)]));
        assert_eq!(theirs.version, g.version);
        // Times that do not match the tombstones are refused with the reason.
        let mut wire = GossipWire::from(g.clone());
        wire.tombstone_times.push(7);
        let bad = rmp_serde::to_vec_named(&wire).unwrap();
        let err = rmp_serde::from_slice::<Gossip>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 tombstones but 2 removal times"), "{err}");
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
