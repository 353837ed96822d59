//! Reachability: which observer currently cannot reach which subject.
//!
//! Unreachable is a flag kept per observer, not a member state. One observer is enough to make
//! a subject unreachable; every observer must clear its flag for the subject to be reachable
//! again. Each observer owns its rows and versions them; a merge takes, per observer, the rows
//! with the higher version, so rows only move forward.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::member::UniqueAddress;

/// The rows of one observer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObserverRows {
    /// Bumped by the observer on every change.
    pub version: u64,
    /// The subjects this observer cannot reach.
    pub unreachable: BTreeSet<UniqueAddress>,
}

/// Per-observer unreachability flags.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reachability {
    observers: BTreeMap<UniqueAddress, ObserverRows>,
}

impl Reachability {
    /// No flags.
    pub fn new() -> Self {
        Self::default()
    }

    /// `observer` cannot reach `subject`. Returns `true` if that changed anything.
    pub fn unreachable(&mut self, observer: &UniqueAddress, subject: &UniqueAddress) -> bool {
        let rows = self.observers.entry(observer.clone()).or_default();
        if rows.unreachable.insert(subject.clone()) {
            rows.version = rows.version.saturating_add(1);
            true
        } else {
            false
        }
    }

    /// `observer` reaches `subject` again. Returns `true` if that changed anything.
    pub fn reachable(&mut self, observer: &UniqueAddress, subject: &UniqueAddress) -> bool {
        let Some(rows) = self.observers.get_mut(observer) else {
            return false;
        };
        if rows.unreachable.remove(subject) {
            rows.version = rows.version.saturating_add(1);
            true
        } else {
            false
        }
    }

    /// `true` if `observer` flagged `subject`.
    pub fn is_unreachable_by(&self, observer: &UniqueAddress, subject: &UniqueAddress) -> bool {
        self.observers
            .get(observer)
            .is_some_and(|r| r.unreachable.contains(subject))
    }

    /// `true` if no observer outside `excluded` flagged `subject`.
    pub fn is_reachable_excluding(
        &self,
        subject: &UniqueAddress,
        excluded: &BTreeSet<UniqueAddress>,
    ) -> bool {
        !self
            .observers
            .iter()
            .any(|(o, r)| !excluded.contains(o) && r.unreachable.contains(subject))
    }

    /// `true` if no observer flagged `subject`.
    pub fn is_reachable(&self, subject: &UniqueAddress) -> bool {
        self.is_reachable_excluding(subject, &BTreeSet::new())
    }

    /// Every subject flagged by some observer outside `excluded`.
    pub fn all_unreachable_excluding(
        &self,
        excluded: &BTreeSet<UniqueAddress>,
    ) -> BTreeSet<UniqueAddress> {
        self.observers
            .iter()
            .filter(|(o, _)| !excluded.contains(*o))
            .flat_map(|(_, r)| r.unreachable.iter().cloned())
            .collect()
    }

    /// Every subject flagged by some observer.
    pub fn all_unreachable(&self) -> BTreeSet<UniqueAddress> {
        self.all_unreachable_excluding(&BTreeSet::new())
    }

    /// The observers that flagged `subject`.
    pub fn observers_of(&self, subject: &UniqueAddress) -> BTreeSet<UniqueAddress> {
        self.observers
            .iter()
            .filter(|(_, r)| r.unreachable.contains(subject))
            .map(|(o, _)| o.clone())
            .collect()
    }

    /// Every `(observer, subject)` flag, in observer then subject order.
    pub fn records(&self) -> impl Iterator<Item = (&UniqueAddress, &UniqueAddress)> {
        self.observers
            .iter()
            .flat_map(|(o, r)| r.unreachable.iter().map(move |s| (o, s)))
    }

    /// Checks a table received from another node: every observer and subject is one of
    /// `members` (rows of others are dropped when a member is removed, and a row that no one
    /// clears would block convergence for good) and no version is near overflow.
    pub fn check_received(&self, members: &BTreeSet<&UniqueAddress>) -> Result<(), String> {
        for (o, rows) in &self.observers {
            if !members.contains(o) {
                return Err(format!("reachability rows of {o}, not a member"));
            }
            if rows.version > u64::MAX / 4 {
                return Err(format!(
                    "reachability rows of {o} with an impossible version"
                ));
            }
            if let Some(s) = rows.unreachable.iter().find(|s| !members.contains(s)) {
                return Err(format!("{o} flags {s}, not a member"));
            }
        }
        Ok(())
    }

    /// Sets the version of `observer`'s rows (tests that build states no node authors).
    #[cfg(test)]
    pub(crate) fn set_version_for_test(&mut self, observer: &UniqueAddress, version: u64) {
        self.observers.entry(observer.clone()).or_default().version = version;
    }

    /// The rows of one observer.
    pub fn rows(&self, observer: &UniqueAddress) -> Option<&ObserverRows> {
        self.observers.get(observer)
    }

    /// Per observer, the rows with the higher version; only observers and subjects in `members`
    /// are kept.
    pub fn merge(&self, other: &Reachability, members: &BTreeSet<UniqueAddress>) -> Reachability {
        let mut observers = BTreeMap::new();
        for o in self.observers.keys().chain(other.observers.keys()) {
            if !members.contains(o) || observers.contains_key(o) {
                continue;
            }
            let rows = match (self.observers.get(o), other.observers.get(o)) {
                (Some(a), Some(b)) if b.version > a.version => b,
                (Some(a), _) => a,
                (None, Some(b)) => b,
                (None, None) => continue,
            };
            let mut rows = rows.clone();
            rows.unreachable.retain(|s| members.contains(s));
            observers.insert(o.clone(), rows);
        }
        Reachability { observers }
    }

    /// Forgets `node` both as observer and as subject (it left the cluster). Other observers'
    /// versions are not bumped: only an observer versions its own rows, so equal versions
    /// always mean equal rows up to removed subjects, which merges filter out.
    pub fn remove(&mut self, node: &UniqueAddress) {
        self.observers.remove(node);
        for rows in self.observers.values_mut() {
            rows.unreachable.remove(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> UniqueAddress {
        UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1)
    }

    fn all(k: u8) -> BTreeSet<UniqueAddress> {
        (0..k).map(n).collect()
    }

    #[test]
    fn one_observer_suffices_to_flag() {
        let mut r = Reachability::new();
        assert!(r.unreachable(&n(0), &n(2)));
        assert!(!r.unreachable(&n(0), &n(2)));
        assert!(!r.is_reachable(&n(2)));
        assert!(r.is_reachable(&n(1)));
        assert_eq!(r.observers_of(&n(2)), [n(0)].into());
    }

    #[test]
    fn all_observers_must_clear() {
        let mut r = Reachability::new();
        r.unreachable(&n(0), &n(2));
        r.unreachable(&n(1), &n(2));
        r.reachable(&n(0), &n(2));
        assert!(!r.is_reachable(&n(2)));
        r.reachable(&n(1), &n(2));
        assert!(r.is_reachable(&n(2)));
    }

    #[test]
    fn excluded_observers_do_not_count() {
        let mut r = Reachability::new();
        r.unreachable(&n(0), &n(2));
        assert!(r.is_reachable_excluding(&n(2), &[n(0)].into()));
    }

    #[test]
    fn merge_takes_higher_version_per_observer() {
        let mut a = Reachability::new();
        a.unreachable(&n(0), &n(2));
        let mut b = a.clone();
        b.reachable(&n(0), &n(2)); // version 2, cleared
        b.unreachable(&n(1), &n(0));
        let m1 = a.merge(&b, &all(3));
        let m2 = b.merge(&a, &all(3));
        assert_eq!(m1, m2);
        assert!(m1.is_reachable(&n(2)));
        assert!(!m1.is_reachable(&n(0)));
    }

    #[test]
    fn merge_drops_non_members() {
        let mut a = Reachability::new();
        a.unreachable(&n(0), &n(2));
        a.unreachable(&n(2), &n(1));
        let m = a.merge(&Reachability::new(), &all(2));
        assert!(m.is_reachable(&n(2)));
        assert!(m.is_reachable(&n(1)));
    }

    #[test]
    fn remove_forgets_node_both_ways() {
        let mut a = Reachability::new();
        a.unreachable(&n(0), &n(2));
        a.unreachable(&n(2), &n(1));
        a.remove(&n(2));
        assert!(a.all_unreachable().is_empty());
    }
}
