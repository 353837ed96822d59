//! Vector clocks over node keys (node id + incarnation).
//!
//! A [`VClock`] counts, per node, how many versions of the gossip that node has produced. Two
//! clocks are compared entry by entry ([`VClock::compare`]) and merged by taking the larger
//! count of every entry ([`VClock::merge`]); merge is commutative, associative and idempotent,
//! which is what lets gossip converge whatever the order of exchanges.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The key of one entry of a vector clock: a node id and the incarnation of the process that
/// runs it. A restarted process is a new incarnation and so a new key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeKey {
    /// The node id (stable across restarts of the same node).
    pub node_id: String,
    /// The incarnation of the process (new on every start).
    pub incarnation: u64,
}

impl NodeKey {
    /// A key for `node_id` at `incarnation`.
    pub fn new(node_id: impl Into<String>, incarnation: u64) -> Self {
        Self {
            node_id: node_id.into(),
            incarnation,
        }
    }
}

impl fmt::Display for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.node_id, self.incarnation)
    }
}

/// How two vector clocks relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordering {
    /// `self` happened before `other` (every entry `<=`, one `<`).
    Before,
    /// `self` happened after `other` (every entry `>=`, one `>`).
    After,
    /// Both clocks are equal.
    Same,
    /// Neither is before the other: concurrent updates that must be merged.
    Concurrent,
}

impl Ordering {
    /// The relation seen from the other side (`Before` <-> `After`).
    pub fn reverse(self) -> Self {
        match self {
            Ordering::Before => Ordering::After,
            Ordering::After => Ordering::Before,
            other => other,
        }
    }
}

/// A vector clock: a counter per [`NodeKey`]; missing entries count as zero.
///
/// ```
/// use shardik_cluster::vclock::{NodeKey, Ordering, VClock};
///
/// let a = NodeKey::new("a", 1);
/// let b = NodeKey::new("b", 1);
/// let mut x = VClock::new();
/// x.increment(&a);
/// let mut y = x.clone();
/// y.increment(&b);
/// assert_eq!(x.compare(&y), Ordering::Before);
/// x.increment(&a);
/// assert_eq!(x.compare(&y), Ordering::Concurrent);
/// let m = x.merge(&y);
/// assert_eq!(m.compare(&x), Ordering::After);
/// assert_eq!(m.compare(&y), Ordering::After);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VClock {
    entries: BTreeMap<NodeKey, u64>,
}

impl VClock {
    /// An empty clock (all counters zero).
    pub fn new() -> Self {
        Self::default()
    }

    /// The counter of `node` (zero when absent).
    pub fn get(&self, node: &NodeKey) -> u64 {
        self.entries.get(node).copied().unwrap_or(0)
    }

    /// Sets the counter of `node` (tests that build states no node would author).
    #[cfg(test)]
    pub(crate) fn set(&mut self, node: NodeKey, counter: u64) {
        self.entries.insert(node, counter);
    }

    /// The largest counter (zero for an empty clock).
    pub fn max_counter(&self) -> u64 {
        self.entries.values().copied().max().unwrap_or(0)
    }

    /// Adds one to the counter of `node`.
    pub fn increment(&mut self, node: &NodeKey) {
        let counter = self.entries.entry(node.clone()).or_insert(0);
        *counter = counter.saturating_add(1);
    }

    /// The entry-wise maximum of both clocks.
    pub fn merge(&self, other: &VClock) -> VClock {
        let mut entries = self.entries.clone();
        for (k, v) in &other.entries {
            let e = entries.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        VClock { entries }
    }

    /// Drops the entry of `node` (used when a node is removed from the cluster for good).
    pub fn prune(&mut self, node: &NodeKey) {
        self.entries.remove(node);
    }

    /// The nodes with a non-zero counter, in key order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeKey> {
        self.entries.iter().filter(|(_, v)| **v > 0).map(|(k, _)| k)
    }

    /// How `self` relates to `other`.
    pub fn compare(&self, other: &VClock) -> Ordering {
        let mut less = false;
        let mut greater = false;
        let keys = self.entries.keys().chain(other.entries.keys());
        for k in keys {
            match self.get(k).cmp(&other.get(k)) {
                CmpOrdering::Less => less = true,
                CmpOrdering::Greater => greater = true,
                CmpOrdering::Equal => {}
            }
            if less && greater {
                return Ordering::Concurrent;
            }
        }
        match (less, greater) {
            (false, false) => Ordering::Same,
            (true, false) => Ordering::Before,
            (false, true) => Ordering::After,
            (true, true) => Ordering::Concurrent,
        }
    }

    /// `true` if `self` is strictly before `other`.
    pub fn is_before(&self, other: &VClock) -> bool {
        self.compare(other) == Ordering::Before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(i: u8) -> NodeKey {
        NodeKey::new(format!("n{}", i % 4), u64::from(i / 4))
    }

    fn clock() -> impl Strategy<Value = VClock> {
        proptest::collection::vec((0u8..8, 0u64..4), 0..6).prop_map(|v| {
            let mut c = VClock::new();
            for (k, n) in v {
                for _ in 0..n {
                    c.increment(&key(k));
                }
            }
            c
        })
    }

    fn norm(c: &VClock) -> Vec<(NodeKey, u64)> {
        c.entries
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    #[test]
    fn empty_clocks_are_same() {
        assert_eq!(VClock::new().compare(&VClock::new()), Ordering::Same);
    }

    #[test]
    fn different_incarnations_are_different_entries() {
        let mut a = VClock::new();
        a.increment(&NodeKey::new("n", 1));
        let mut b = VClock::new();
        b.increment(&NodeKey::new("n", 2));
        assert_eq!(a.compare(&b), Ordering::Concurrent);
    }

    #[test]
    fn prune_removes_the_entry() {
        let k = NodeKey::new("n", 1);
        let mut a = VClock::new();
        a.increment(&k);
        a.prune(&k);
        assert_eq!(a.get(&k), 0);
        assert_eq!(a.compare(&VClock::new()), Ordering::Same);
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in clock(), b in clock()) {
            prop_assert_eq!(norm(&a.merge(&b)), norm(&b.merge(&a)));
        }

        #[test]
        fn merge_is_associative(a in clock(), b in clock(), c in clock()) {
            prop_assert_eq!(norm(&a.merge(&b).merge(&c)), norm(&a.merge(&b.merge(&c))));
        }

        #[test]
        fn merge_is_idempotent(a in clock(), b in clock()) {
            prop_assert_eq!(norm(&a.merge(&a)), norm(&a));
            let m = a.merge(&b);
            prop_assert_eq!(norm(&m.merge(&b)), norm(&m));
        }

        #[test]
        fn merge_dominates_both(a in clock(), b in clock()) {
            let m = a.merge(&b);
            prop_assert!(matches!(m.compare(&a), Ordering::After | Ordering::Same));
            prop_assert!(matches!(m.compare(&b), Ordering::After | Ordering::Same));
        }

        #[test]
        fn compare_is_antisymmetric(a in clock(), b in clock()) {
            prop_assert_eq!(a.compare(&b), b.compare(&a).reverse());
        }

        #[test]
        fn compare_agrees_with_merge(a in clock(), b in clock()) {
            let m = a.merge(&b);
            match a.compare(&b) {
                Ordering::Same => prop_assert_eq!(norm(&a), norm(&b)),
                Ordering::Before => prop_assert_eq!(norm(&m), norm(&b)),
                Ordering::After => prop_assert_eq!(norm(&m), norm(&a)),
                Ordering::Concurrent => {
                    prop_assert_eq!(m.compare(&a), Ordering::After);
                    prop_assert_eq!(m.compare(&b), Ordering::After);
                }
            }
        }

        #[test]
        fn increment_moves_after(a in clock(), k in 0u8..8) {
            let mut b = a.clone();
            b.increment(&key(k));
            prop_assert_eq!(b.compare(&a), Ordering::After);
            prop_assert_eq!(a.compare(&b), Ordering::Before);
        }

        #[test]
        fn before_is_transitive(a in clock(), b in clock(), c in clock()) {
            if a.compare(&b) == Ordering::Before && b.compare(&c) == Ordering::Before {
                prop_assert_eq!(a.compare(&c), Ordering::Before);
            }
        }
    }
}
