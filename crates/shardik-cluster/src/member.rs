//! Members: who is in the cluster, in which state, since when.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::vclock::NodeKey;

/// The identity of one process of the cluster: its address, its node id and the incarnation
/// of the process (a restart makes a new incarnation, so a new `UniqueAddress`).
///
/// Ordered by address first; that order picks the leader and breaks keep-majority ties.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UniqueAddress {
    /// Where the node listens (`host:port`).
    pub address: String,
    /// The node id, stable across restarts.
    pub node_id: String,
    /// The incarnation of the process.
    pub incarnation: u64,
}

impl UniqueAddress {
    /// A unique address.
    pub fn new(address: impl Into<String>, node_id: impl Into<String>, incarnation: u64) -> Self {
        Self {
            address: address.into(),
            node_id: node_id.into(),
            incarnation,
        }
    }

    /// The key of this process in vector clocks.
    pub fn key(&self) -> NodeKey {
        NodeKey::new(self.node_id.clone(), self.incarnation)
    }
}

impl fmt::Display for UniqueAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}#{}", self.node_id, self.address, self.incarnation)
    }
}

/// The lifecycle state of a member.
///
/// Declared in merge precedence order: when two gossips disagree about a member, the later
/// variant wins, so `Down` and `Removed` never go back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MemberStatus {
    /// Asked to join; not yet moved up by the leader.
    Joining,
    /// Moved up without convergence (a partition elsewhere); counted as up for traffic only.
    WeaklyUp,
    /// A full member.
    Up,
    /// Asked to leave gracefully.
    Leaving,
    /// Leaving, seen by all; the node shuts down.
    Exiting,
    /// Declared dead (by an operator or the split brain resolver).
    Down,
    /// Gone for good; kept as a tombstone only.
    Removed,
}

impl MemberStatus {
    /// The transitions a member may take (Akka's table). Staying in the same state is allowed.
    ///
    /// | from | to |
    /// |---|---|
    /// | Joining | WeaklyUp, Up, Leaving, Down, Removed |
    /// | WeaklyUp | Up, Leaving, Down, Removed |
    /// | Up | Leaving, Down, Removed |
    /// | Leaving | Exiting, Down, Removed |
    /// | Exiting | Down, Removed |
    /// | Down | Removed |
    /// | Removed | (none) |
    pub fn can_become(self, to: MemberStatus) -> bool {
        use MemberStatus::*;
        if self == to {
            return true;
        }
        matches!(
            (self, to),
            (Joining, WeaklyUp | Up | Leaving | Down | Removed)
                | (WeaklyUp, Up | Leaving | Down | Removed)
                | (Up, Leaving | Down | Removed)
                | (Leaving, Exiting | Down | Removed)
                | (Exiting, Down | Removed)
                | (Down, Removed)
        )
    }

    /// All states, in precedence order.
    pub const ALL: [MemberStatus; 7] = [
        MemberStatus::Joining,
        MemberStatus::WeaklyUp,
        MemberStatus::Up,
        MemberStatus::Leaving,
        MemberStatus::Exiting,
        MemberStatus::Down,
        MemberStatus::Removed,
    ];
}

/// A transition the table of [`MemberStatus::can_become`] forbids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTransition {
    /// The member.
    pub node: UniqueAddress,
    /// Its current state.
    pub from: MemberStatus,
    /// The state asked for.
    pub to: MemberStatus,
}

impl fmt::Display for InvalidTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {:?} -> {:?} is not allowed",
            self.node, self.from, self.to
        )
    }
}

impl std::error::Error for InvalidTransition {}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Who.
    pub node: UniqueAddress,
    /// Its state.
    pub status: MemberStatus,
    /// Its roles.
    pub roles: BTreeSet<String>,
    /// The order in which the leader moved it up (lower = older); `None` before that.
    pub up_number: Option<u64>,
}

impl Member {
    /// A new `Joining` member.
    pub fn joining(node: UniqueAddress, roles: BTreeSet<String>) -> Self {
        Self {
            node,
            status: MemberStatus::Joining,
            roles,
            up_number: None,
        }
    }

    /// This member in state `to`, if the transition is allowed.
    pub fn with_status(&self, to: MemberStatus) -> Result<Member, InvalidTransition> {
        if !self.status.can_become(to) {
            return Err(InvalidTransition {
                node: self.node.clone(),
                from: self.status,
                to,
            });
        }
        Ok(Member {
            status: to,
            ..self.clone()
        })
    }

    /// `true` if `self` was moved up before `other` (ties by address).
    pub fn is_older_than(&self, other: &Member) -> bool {
        self.age_key() < other.age_key()
    }

    /// The sort key of age: up-number (members not yet up are youngest), then address.
    pub fn age_key(&self) -> (u64, &UniqueAddress) {
        (self.up_number.unwrap_or(u64::MAX), &self.node)
    }

    /// `true` if the member has the role (`None` = any member).
    pub fn has_role(&self, role: Option<&str>) -> bool {
        match role {
            Some(r) => self.roles.contains(r),
            None => true,
        }
    }

    /// The one of two views of the same member that wins a merge: the later state, then the
    /// older up-number.
    pub fn highest_priority(a: &Member, b: &Member) -> Member {
        match a.status.cmp(&b.status) {
            std::cmp::Ordering::Greater => a.clone(),
            std::cmp::Ordering::Less => b.clone(),
            std::cmp::Ordering::Equal => {
                if b.up_number.is_some() && (a.up_number.is_none() || b.is_older_than(a)) {
                    b.clone()
                } else {
                    a.clone()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemberStatus::*;

    fn m(status: MemberStatus) -> Member {
        Member {
            status,
            ..Member::joining(UniqueAddress::new("h:1", "a", 1), BTreeSet::new())
        }
    }

    #[test]
    fn transition_table_is_exactly_akkas() {
        let allowed = [
            (Joining, WeaklyUp),
            (Joining, Up),
            (Joining, Leaving),
            (Joining, Down),
            (Joining, Removed),
            (WeaklyUp, Up),
            (WeaklyUp, Leaving),
            (WeaklyUp, Down),
            (WeaklyUp, Removed),
            (Up, Leaving),
            (Up, Down),
            (Up, Removed),
            (Leaving, Exiting),
            (Leaving, Down),
            (Leaving, Removed),
            (Exiting, Down),
            (Exiting, Removed),
            (Down, Removed),
        ];
        for from in MemberStatus::ALL {
            for to in MemberStatus::ALL {
                let expect = from == to || allowed.contains(&(from, to));
                assert_eq!(from.can_become(to), expect, "{from:?} -> {to:?}");
                let res = m(from).with_status(to);
                assert_eq!(res.is_ok(), expect, "{from:?} -> {to:?}");
                if let Err(e) = res {
                    assert_eq!((e.from, e.to), (from, to));
                }
            }
        }
    }

    #[test]
    fn down_and_removed_never_go_back() {
        for to in [Joining, WeaklyUp, Up, Leaving, Exiting] {
            assert!(m(Down).with_status(to).is_err());
            assert!(m(Removed).with_status(to).is_err());
        }
        assert!(m(Removed).with_status(Down).is_err());
    }

    #[test]
    fn merge_precedence_prefers_later_state_then_older() {
        let up = m(Up);
        let down = m(Down);
        assert_eq!(Member::highest_priority(&up, &down).status, Down);
        assert_eq!(Member::highest_priority(&down, &up).status, Down);
        let mut a = m(Up);
        a.up_number = Some(3);
        let mut b = m(Up);
        b.up_number = Some(2);
        assert_eq!(Member::highest_priority(&a, &b).up_number, Some(2));
        assert_eq!(Member::highest_priority(&b, &a).up_number, Some(2));
    }

    #[test]
    fn age_orders_by_up_number_then_address() {
        let mut a = m(Up);
        a.up_number = Some(1);
        let mut b = m(Up);
        b.node.address = "h:0".into();
        b.up_number = Some(2);
        assert!(a.is_older_than(&b));
        let c = Member::joining(UniqueAddress::new("a:0", "c", 1), BTreeSet::new());
        assert!(b.is_older_than(&c));
    }
}
