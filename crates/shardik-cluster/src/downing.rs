//! Split brain resolution: which side of a partition goes on and which downs itself.
//!
//! Decisions are pure functions of the membership, the reachability, the deciding node and how
//! long the membership has been stable. A decision is only taken once nothing has changed for
//! `stable_after`, so both sides of a clean partition see the same picture and reach
//! complementary decisions: the winners down the unreachable side, the losers down their own
//! (including themselves). The node that applies a decision is the leader of its side (see
//! [`crate::node`]); one observer's failure detector never downs anyone by itself.
//!
//! Only `Up`, `Leaving` and `Exiting` members are counted (with the configured role):
//! `Joining` and `WeaklyUp` members do not count toward a majority, but they are downed with
//! their side. If no member is counted, joining ones are.
//!
//! Two refinements, both Akka's:
//! - **Membership changes racing the partition.** The other side may have seen a change this
//!   side has not (a joining member moved up, an exiting one removed). A side that would go on
//!   checks that it still would when counting the fewest members it could have (no joining,
//!   no exiting) against the most the other side could (everything not down); if not, it
//!   downs all (safety over availability: never two sides going on).
//! - **Indirectly connected nodes.** Flags that are not a clean partition (an observer that is
//!   itself flagged, or a flagged node that still sees the current state) are a broken link,
//!   not a lost side. They are left out of the counting, and one end of each broken link (the
//!   node on most such flags, then a flagged node before one that only flags, then the
//!   youngest) is downed: a flaky link between two nodes
//!   costs one node, and never makes the healthy rest a "minority". (Akka downs both ends.)

use std::collections::BTreeSet;
use std::time::Duration;

use crate::gossip::Gossip;
use crate::member::{Member, MemberStatus, UniqueAddress};

/// A downing strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// The side with more counted members goes on; on a tie, the side holding the member with
    /// the lowest address.
    KeepMajority,
    /// The side with at least `quorum_size` counted members goes on; if the cluster has grown
    /// beyond `2 * quorum_size - 1` members, everyone is downed (two quorums could exist).
    StaticQuorum {
        /// Members a side needs to go on.
        quorum_size: usize,
    },
    /// The side with the oldest member goes on. With `down_if_alone`, if the oldest is alone
    /// on its side, it is downed and the other side goes on.
    KeepOldest {
        /// Down the oldest if it is cut off from every other member.
        down_if_alone: bool,
    },
    /// Everyone is downed when anything is unreachable.
    DownAll,
}

/// Settings of the split brain resolver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DowningConfig {
    /// The strategy (default keep-majority).
    pub strategy: Strategy,
    /// How long membership and reachability must be unchanged before deciding.
    pub stable_after: Duration,
    /// Count only members with this role.
    pub role: Option<String>,
    /// How long past `stable_after` the reachability picture may keep changing, with some
    /// member unreachable, before the leader of each side downs every member (itself
    /// included): Akka's `down-all-when-unstable`. A link that flaps, or cuts that come and
    /// go, keep the stability timer from ever running out, so no decision would be taken
    /// and the unreachable members' work would stay stranded, or each side would decide on
    /// a picture the other never saw. `None` turns it off. The measure starts when a member
    /// first becomes unreachable, and starts over once none is, or once the reachability
    /// picture has not changed for twice `stable_after` (a stable picture is decided the
    /// usual way), or after the leader downed a member. Membership changes alone (joins,
    /// leaves) never trigger it. Off (`None`) by default: downing the whole cluster is a
    /// choice for a deployment to make. Akka turns it on with three quarters of
    /// `stable-after`, at least 4 s; [`DowningConfig::akka_unstable_bound`] computes that.
    pub down_all_when_unstable: Option<Duration>,
}

impl Default for DowningConfig {
    /// Keep-majority, decided after 2 s of stability (Akka: 20 s; with a detection of about
    /// 2.5 s this keeps time to Down under 5 s, see the crate docs on tuning).
    fn default() -> Self {
        Self {
            strategy: Strategy::KeepMajority,
            stable_after: Duration::from_secs(2),
            role: None,
            down_all_when_unstable: None,
        }
    }
}

impl DowningConfig {
    /// Akka's bound for [`down_all_when_unstable`](Self::down_all_when_unstable): three
    /// quarters of `stable_after`, at least 4 s.
    pub fn akka_unstable_bound(&self) -> Duration {
        let three_quarters = match self.stable_after.checked_mul(3) {
            Some(d) => d / 4,
            None => self.stable_after / 4 * 3,
        };
        three_quarters.max(Duration::from_secs(4))
    }
}

/// Which side a decision downs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionKind {
    /// Down the unreachable members; this side goes on.
    DownUnreachable,
    /// Down this side (including the deciding node); the other side goes on.
    DownReachable,
    /// Down everyone.
    DownAll,
}

/// A decision and the members it downs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What was decided.
    pub kind: DecisionKind,
    /// The members to mark `Down`.
    pub down: BTreeSet<UniqueAddress>,
    /// The members of `down` downed as one end of a broken link (indirectly connected).
    /// They still talk to the rest, so the node applying the decision treats them apart: one
    /// that nobody flags (only its own flags make it an end) is left to down itself (see
    /// [`crate::node`]).
    pub broken_links: BTreeSet<UniqueAddress>,
}

/// The two sides as `self_node` sees them.
struct Sides<'a> {
    reachable: Vec<&'a Member>,
    unreachable: Vec<&'a Member>,
}

impl<'a> Sides<'a> {
    /// Live (not `Down`) members split by `unreachable`, leaving out `excluded`, as
    /// `self_node` sees them: its own side is the one it is on. A node that others flag
    /// (they cannot hear it, while it hears them and gets their flags) is on the flagged
    /// side, with the others flagged along with it; counting it with the side that
    /// cannot hear it would have it decide on a picture that neither side has.
    fn new(
        g: &'a Gossip,
        self_node: &UniqueAddress,
        unreachable_set: &BTreeSet<UniqueAddress>,
        excluded: &BTreeSet<UniqueAddress>,
    ) -> Self {
        let live = g
            .members()
            .filter(|m| m.status != MemberStatus::Down && !excluded.contains(&m.node));
        let (flagged, rest): (Vec<&Member>, Vec<&Member>) =
            live.partition(|m| unreachable_set.contains(&m.node));
        if unreachable_set.contains(self_node) {
            Sides {
                reachable: flagged,
                unreachable: rest,
            }
        } else {
            Sides {
                reachable: rest,
                unreachable: flagged,
            }
        }
    }

    fn counted(side: &[&'a Member], role: Option<&str>, joining_too: bool) -> Vec<&'a Member> {
        side.iter()
            .copied()
            .filter(|m| m.has_role(role))
            .filter(|m| {
                joining_too
                    || matches!(
                        m.status,
                        MemberStatus::Up | MemberStatus::Leaving | MemberStatus::Exiting
                    )
            })
            .collect()
    }
}

/// The decision `self_node` takes, or `None` if nothing is unreachable or membership has not
/// been stable for `stable_after` yet.
///
/// ```
/// use std::collections::BTreeSet;
/// use std::time::Duration;
/// use shardik_cluster::downing::{decide, DecisionKind, DowningConfig};
/// use shardik_cluster::gossip::Gossip;
/// use shardik_cluster::leader::leader_actions;
/// use shardik_cluster::member::UniqueAddress;
///
/// let n: Vec<_> = (0..3).map(|i| UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)).collect();
/// let mut g = Gossip::new();
/// for a in &n { g.add_joining(a.clone(), BTreeSet::new()).unwrap(); }
/// leader_actions(&mut g, &n[0], false);
/// g.reachability_mut().unreachable(&n[0], &n[2]);
/// let cfg = DowningConfig::default();
/// assert_eq!(decide(&g, &n[0], Duration::from_secs(1), &cfg), None); // not stable yet
/// let d = decide(&g, &n[0], cfg.stable_after, &cfg).unwrap();
/// assert_eq!(d.kind, DecisionKind::DownUnreachable);
/// assert_eq!(d.down, BTreeSet::from([n[2].clone()]));
/// ```
pub fn decide(
    gossip: &Gossip,
    self_node: &UniqueAddress,
    stable_for: Duration,
    config: &DowningConfig,
) -> Option<Decision> {
    if stable_for < config.stable_after {
        return None;
    }
    Picture::new(gossip, None)?.decision(gossip, self_node, config)
}

/// Whether a resolver deciding now on this view would down `node`: `node`'s own decision
/// ([`decide`] without waiting for stability) or, when the others flag `node`, the decision
/// of the side that flags it; each read both with `node`'s mark in the seen set and without
/// it. The resolver reads a flag whose subject has seen the current state as a broken link
/// (the subject still talks to the rest); a node has always seen its own view, but whether
/// the others have its mark depends on whether they hear it, which it cannot tell: a node
/// that can hear but not speak reads its flag as a broken link while the side flagging it
/// reads a lost node and downs it.
///
/// ```
/// use std::collections::BTreeSet;
/// use shardik_cluster::downing::{would_down, DowningConfig};
/// use shardik_cluster::gossip::Gossip;
/// use shardik_cluster::leader::leader_actions;
/// use shardik_cluster::member::UniqueAddress;
///
/// let n: Vec<_> = (0..3).map(|i| UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)).collect();
/// let mut g = Gossip::new();
/// for a in &n { g.add_joining(a.clone(), BTreeSet::new()).unwrap(); }
/// leader_actions(&mut g, &n[0], false);
/// // n1 cannot hear n0 any more (and n0's gossip does not get through either): the side of
/// // n1 and n2 downs n0, whatever n0 itself decides.
/// g.reachability_mut().unreachable(&n[1], &n[0]);
/// g.touch(&n[1]);
/// let cfg = DowningConfig::default();
/// assert!(would_down(&g, &n[0], &cfg));
/// assert!(!would_down(&g, &n[1], &cfg));
/// ```
pub fn would_down(gossip: &Gossip, node: &UniqueAddress, config: &DowningConfig) -> bool {
    [None, Some(node)].into_iter().any(|unseen| {
        let Some(picture) = Picture::new(gossip, unseen) else {
            return false;
        };
        let downs = |by: &UniqueAddress| {
            picture
                .decision(gossip, by, config)
                .is_some_and(|d| d.down.contains(node))
        };
        if downs(node) {
            return true;
        }
        if !picture.clean.contains(node) {
            return false;
        }
        // Every live member outside the flagged set and the cover sees the same two sides,
        // so one of them decides for that whole side.
        gossip
            .members()
            .find(|m| {
                m.status != MemberStatus::Down
                    && !picture.clean.contains(&m.node)
                    && !picture.cover.contains(&m.node)
            })
            .is_some_and(|m| downs(&m.node))
    })
}

/// The flags as one member reads them: the broken links' ends to down and the flagged set
/// that is left.
struct Picture {
    /// The indirectly connected nodes to down (see [`cover`]).
    cover: BTreeSet<UniqueAddress>,
    /// The nodes flagged once the cover is left out: the other side of a clean partition.
    clean: BTreeSet<UniqueAddress>,
    /// Cover nodes that a live member outside the broken links (not indirectly connected)
    /// flags as well: not only across a broken link, they are lost to the rest (a partition
    /// that cut across the link). The other end of a broken link flags its end too, but it is
    /// indirectly connected itself, so a plain flaky link leaves this empty.
    cover_lost: BTreeSet<UniqueAddress>,
}

impl Picture {
    /// The picture in `gossip`, read as if `unseen` (if any) had not seen the current state;
    /// `None` when no live member flags another.
    fn new(gossip: &Gossip, unseen: Option<&UniqueAddress>) -> Option<Picture> {
        let live = |n: &UniqueAddress| {
            gossip
                .member(n)
                .is_some_and(|m| m.status != MemberStatus::Down)
        };
        // The flags that count: by live observers, about live subjects.
        let records: Vec<(&UniqueAddress, &UniqueAddress)> = gossip
            .reachability()
            .records()
            .filter(|(o, s)| live(o) && live(s))
            .collect();
        if records.is_empty() {
            return None;
        }
        let indirect = indirectly_connected(gossip, &records, unseen);
        let cover = cover(gossip, &records, &indirect);
        // The clean picture: the flags left once the cover is downed. Every flag between two
        // indirectly connected nodes touches the cover, so what is left is about real
        // unreachability; it includes flags about (or by) indirectly connected nodes the
        // cover keeps: such a node, flagged by this side after a partition, is on the other
        // side, not on this one (counting it here let both sides of a partition that cut
        // across a broken link win).
        let clean = records
            .iter()
            .filter(|(o, s)| !cover.contains(*o) && !cover.contains(*s))
            .map(|(_, s)| (*s).clone())
            .collect();
        let cover_lost = records
            .iter()
            .filter(|(o, s)| !indirect.contains(*o) && cover.contains(*s))
            .map(|(_, s)| (*s).clone())
            .collect();
        Some(Picture {
            cover,
            clean,
            cover_lost,
        })
    }

    /// The decision `self_node` takes on this picture.
    fn decision(
        &self,
        gossip: &Gossip,
        self_node: &UniqueAddress,
        config: &DowningConfig,
    ) -> Option<Decision> {
        let sides = Sides::new(gossip, self_node, &self.clean, &self.cover);
        let pick = |s: &[&Member]| s.iter().map(|m| m.node.clone()).collect::<BTreeSet<_>>();
        let (kind, mut down) = if sides.unreachable.is_empty() && self.cover_lost.is_empty() {
            (DecisionKind::DownUnreachable, BTreeSet::new())
        } else if sides.unreachable.is_empty() {
            // Only broken links are left, but some of their ends are flagged by members
            // outside the cover too: downing them is going on against them, which this side
            // may do only if the strategy lets it win against them (their side may have
            // counted differently: a member removed there, still `Exiting` here).
            let rest: BTreeSet<UniqueAddress> =
                self.cover.difference(&self.cover_lost).cloned().collect();
            let against = Sides::new(gossip, self_node, &self.cover_lost, &rest);
            match decide_kind(&against, &[], config) {
                DecisionKind::DownUnreachable => (DecisionKind::DownUnreachable, BTreeSet::new()),
                DecisionKind::DownReachable => {
                    (DecisionKind::DownReachable, pick(&against.reachable))
                }
                DecisionKind::DownAll => (
                    DecisionKind::DownAll,
                    pick(&against.reachable)
                        .into_iter()
                        .chain(pick(&against.unreachable))
                        .collect(),
                ),
            }
        } else {
            // Ends of broken links that every member of this side flags while their own
            // flags, as this side holds them, are on members of the other side too: cut off
            // from both sides, which no split into two sides gives, so their flags are stale
            // (a partition healed too briefly for their clearing to spread). The other side
            // may hold their newer flags, in which they are not ends but its members, and
            // count them: left out here, they turned that side's majority into a tie this
            // side won, while that side, reading stale flags of this side's members the same
            // way, won too.
            //
            // So are ends with a flag on an `Exiting` member of this side: the other side may
            // have removed that member, and the link with it, so that there the end is a
            // member like any other (or the other end of its remaining links), which it
            // counts (2026-11-29: a side holding the oldest, `Exiting`, and a link from it to
            // the next oldest kept itself, while the other side, which had removed the
            // oldest, kept the next oldest).
            let flags = |o: &UniqueAddress, s: &UniqueAddress| {
                gossip.reachability().is_unreachable_by(o, s)
            };
            let beyond: Vec<&Member> = if sides.reachable.is_empty() {
                Vec::new()
            } else {
                gossip
                    .members()
                    .filter(|m| m.status != MemberStatus::Down && self.cover.contains(&m.node))
                    .filter(|m| sides.reachable.iter().all(|r| flags(&r.node, &m.node)))
                    .filter(|m| {
                        sides.unreachable.iter().any(|u| flags(&m.node, &u.node))
                            || sides.reachable.iter().any(|r| {
                                r.status == MemberStatus::Exiting && flags(&m.node, &r.node)
                            })
                    })
                    .collect()
            };
            let kind = decide_kind(&sides, &beyond, config);
            let down = match kind {
                DecisionKind::DownUnreachable => pick(&sides.unreachable),
                DecisionKind::DownReachable => pick(&sides.reachable),
                DecisionKind::DownAll => pick(&sides.reachable)
                    .into_iter()
                    .chain(pick(&sides.unreachable))
                    .collect(),
            };
            (kind, down)
        };
        down.extend(self.cover.iter().cloned());
        if down.is_empty() {
            return None;
        }
        Some(Decision {
            kind,
            down,
            broken_links: self.cover.clone(),
        })
    }
}

/// Nodes that are flagged, or flag others, although they are still connected to the rest
/// through other nodes (Akka's "indirectly connected"): a flaky link rather than a clean
/// partition or a crash. They are the observers that are themselves flagged (a cycle of
/// flags) and both ends of every flag whose subject has seen the current state (it still
/// talks to this side), leaving out the mark of `unseen`.
fn indirectly_connected(
    gossip: &Gossip,
    records: &[(&UniqueAddress, &UniqueAddress)],
    unseen: Option<&UniqueAddress>,
) -> BTreeSet<UniqueAddress> {
    let subjects: BTreeSet<&UniqueAddress> = records.iter().map(|(_, s)| *s).collect();
    let mut out = BTreeSet::new();
    for (o, s) in records {
        if subjects.contains(o) {
            out.insert((*o).clone());
        }
        if Some(*s) != unseen && gossip.has_seen(s) {
            out.insert((*o).clone());
            out.insert((*s).clone());
        }
    }
    out
}

/// The indirectly connected nodes to down: a small set that touches every flag between
/// them, picked greedily (the node on most remaining flags first, then a flagged node before
/// one that only flags others, then the youngest), so a
/// flaky link costs one of its two ends, not both and not the nodes around it. Akka downs
/// every indirectly connected node; this keeps more of the cluster and is just as
/// deterministic.
fn cover(
    gossip: &Gossip,
    records: &[(&UniqueAddress, &UniqueAddress)],
    indirect: &BTreeSet<UniqueAddress>,
) -> BTreeSet<UniqueAddress> {
    let mut edges: Vec<(&UniqueAddress, &UniqueAddress)> = records
        .iter()
        .copied()
        .filter(|(o, s)| indirect.contains(*o) && indirect.contains(*s))
        .collect();
    let mut out = BTreeSet::new();
    while !edges.is_empty() {
        let pick = indirect
            .iter()
            .filter_map(|n| {
                let degree = edges.iter().filter(|(o, s)| *o == n || *s == n).count();
                let flagged = edges.iter().any(|(_, s)| *s == n);
                let member = gossip.member(n)?;
                (degree > 0).then(|| (degree, flagged, member.age_key(), n))
            })
            // Most flags, then a flagged node before one that only flags others (a flagged
            // node learns of its flag and is fenced for it; an observer cannot know that its
            // flags make it the end to down, and its flags may be stale: cleared since, with
            // the news still on its way), then the youngest (largest age key).
            .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)).then_with(|| a.2.cmp(&b.2)))
            .map(|(_, _, _, n)| n.clone());
        let Some(pick) = pick else { break };
        edges.retain(|(o, s)| **o != pick && **s != pick);
        out.insert(pick);
    }
    out
}

/// The decision on `sides`; `beyond` are members left out of both sides that the other side
/// may count as its own (see the check against the most it could count).
fn decide_kind(sides: &Sides<'_>, beyond: &[&Member], config: &DowningConfig) -> DecisionKind {
    let role = config.role.as_deref();
    let mut joining_too = false;
    let mut reach = Sides::counted(&sides.reachable, role, false);
    let mut unreach = Sides::counted(&sides.unreachable, role, false);
    if reach.is_empty() && unreach.is_empty() {
        joining_too = true;
        reach = Sides::counted(&sides.reachable, role, true);
        unreach = Sides::counted(&sides.unreachable, role, true);
    }
    let decision = decide_counted(&reach, &unreach, &config.strategy);
    if decision != DecisionKind::DownUnreachable {
        return decision;
    }
    // The edge case of a membership change racing the partition (Akka's): the other side may
    // have seen a change this side has not. A `Joining`/`WeaklyUp` member may be `Up` there
    // (the leader moved it up at a convergence just before the split; everybody had seen it
    // joining, so this side knows it), and an `Exiting` member may be removed there (a
    // `Leaving` one can at most be `Exiting` there, as both had to see it leaving). So this
    // side goes on only if it also would with the fewest members it could count (no joining,
    // no exiting) against the most the other side could (everything not down, and the
    // broken-link ends in `beyond`); if not, the safe answer is to down everything on this
    // side.
    let this_min: Vec<&Member> = reach
        .iter()
        .copied()
        .filter(|m| joining_too || m.status != MemberStatus::Exiting)
        .collect();
    let mut other_max = Sides::counted(&sides.unreachable, role, true);
    other_max.extend(Sides::counted(beyond, role, true));
    if decide_counted(&this_min, &other_max, &config.strategy) == DecisionKind::DownUnreachable {
        DecisionKind::DownUnreachable
    } else {
        DecisionKind::DownAll
    }
}

/// The strategy's decision given the members counted on this side and on the other one.
fn decide_counted(reach: &[&Member], unreach: &[&Member], strategy: &Strategy) -> DecisionKind {
    match strategy {
        Strategy::DownAll => DecisionKind::DownAll,
        Strategy::KeepMajority => {
            use std::cmp::Ordering::*;
            match reach.len().cmp(&unreach.len()) {
                Greater => DecisionKind::DownUnreachable,
                Less => DecisionKind::DownReachable,
                Equal => {
                    let lowest = reach.iter().chain(unreach.iter()).map(|m| &m.node).min();
                    if lowest.is_some_and(|l| reach.iter().any(|m| &m.node == l)) {
                        DecisionKind::DownUnreachable
                    } else {
                        DecisionKind::DownReachable
                    }
                }
            }
        }
        Strategy::StaticQuorum { quorum_size } => {
            let total = reach.len() + unreach.len();
            if total > (2 * quorum_size).saturating_sub(1) {
                DecisionKind::DownAll
            } else if reach.len() >= *quorum_size {
                DecisionKind::DownUnreachable
            } else {
                DecisionKind::DownReachable
            }
        }
        Strategy::KeepOldest { down_if_alone } => {
            let oldest = reach
                .iter()
                .chain(unreach.iter())
                .min_by(|a, b| a.age_key().cmp(&b.age_key()));
            let Some(oldest) = oldest else {
                return DecisionKind::DownReachable;
            };
            let oldest_reachable = reach.iter().any(|m| m.node == oldest.node);
            let (own, other) = if oldest_reachable {
                (reach, unreach)
            } else {
                (unreach, reach)
            };
            let alone = own.len() == 1 && !other.is_empty();
            match (oldest_reachable, *down_if_alone && alone) {
                (true, false) => DecisionKind::DownUnreachable,
                (true, true) => DecisionKind::DownReachable,
                (false, false) => DecisionKind::DownReachable,
                (false, true) => DecisionKind::DownUnreachable,
            }
        }
    }
}

/// What the stability timer compares: member states, the flagged members, and which of them
/// flag others in turn. The last tells a lost node from a broken link: a member already
/// flagged that starts flagging others (its observers, say) turns a lost node into a broken
/// link (or the other way round), and a decision taken at once on the new picture would give the
/// nodes it downs no time to learn it. More observers flagging the same member (as after a
/// crash, each at its own time) change nothing.
type Snapshot = (
    Vec<(UniqueAddress, MemberStatus)>,
    BTreeSet<UniqueAddress>,
    BTreeSet<UniqueAddress>,
);

/// Who is flagged, and who flags while flagged itself: the reachability part of a
/// [`Snapshot`].
fn reachability_picture(gossip: &Gossip) -> (BTreeSet<UniqueAddress>, BTreeSet<UniqueAddress>) {
    let flagged = gossip.unreachable_members();
    let flagging: BTreeSet<UniqueAddress> = gossip
        .reachability()
        .records()
        .map(|(o, _)| o)
        .filter(|o| flagged.contains(*o))
        .cloned()
        .collect();
    (flagged, flagging)
}

/// Tracks how long the reachability picture has kept changing while some member is
/// unreachable, for [`DowningConfig::down_all_when_unstable`].
#[derive(Clone, Debug, Default)]
pub struct InstabilityTimer {
    last: Option<(BTreeSet<UniqueAddress>, BTreeSet<UniqueAddress>)>,
    changed_at: u64,
    since: Option<u64>,
}

impl InstabilityTimer {
    /// A timer that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the measure over: the leader has just downed a member (a decision was taken).
    pub fn reset(&mut self) {
        self.since = None;
    }

    /// Looks at the state at `now` (ms): true once the picture has been unstable for
    /// `stable_after` plus `down_all_when_unstable` since a member first became unreachable.
    /// Members already `Down` are dealt with: they are left out of the picture.
    pub fn observe(&mut self, gossip: &Gossip, now: u64, config: &DowningConfig) -> bool {
        let Some(extra) = config.down_all_when_unstable else {
            // Off: nothing to measure (and nothing carried over should it be turned on).
            self.last = None;
            self.since = None;
            return false;
        };
        let downed = gossip.downed();
        let (mut flagged, mut flagging) = reachability_picture(gossip);
        flagged.retain(|n| !downed.contains(n));
        flagging.retain(|n| !downed.contains(n));
        let picture = (flagged, flagging);
        let nobody_unreachable = picture.0.is_empty();
        if self.last.as_ref() != Some(&picture) {
            self.last = Some(picture);
            self.changed_at = now;
        }
        let stable_for = now.saturating_sub(self.changed_at);
        if nobody_unreachable || u128::from(stable_for) >= 2 * config.stable_after.as_millis() {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        u128::from(now.saturating_sub(since))
            >= config.stable_after.saturating_add(extra).as_millis()
    }
}

/// Tracks how long membership and reachability have been unchanged, for `stable_for`.
#[derive(Clone, Debug, Default)]
pub struct StabilityTimer {
    last: Option<Snapshot>,
    since: u64,
}

impl StabilityTimer {
    /// A timer that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks at the state at `now` (ms) and returns how long it has been unchanged.
    pub fn observe(&mut self, gossip: &Gossip, now: u64) -> Duration {
        let members = gossip
            .members()
            .map(|m| (m.node.clone(), m.status))
            .collect();
        let (flagged, flagging) = reachability_picture(gossip);
        let snapshot = (members, flagged, flagging);
        if self.last.as_ref() != Some(&snapshot) {
            self.last = Some(snapshot);
            self.since = now;
        }
        Duration::from_millis(now.saturating_sub(self.since))
    }
}

#[cfg(test)]
mod tests;
