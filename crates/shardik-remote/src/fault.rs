//! Fault injection for tests: cut the link between two named nodes, one way or both, and heal
//! it, without root and without touching the sockets.
//!
//! Share one [`FaultInjector`] between the nodes of a test (see
//! [`RemoteConfig::faults`](crate::RemoteConfig::faults)). While the link `from -> to` is cut,
//! every frame `from` would send to `to` (user messages, replies, heartbeats) is dropped by
//! `from`'s writer and, should one slip through, by `to`'s reader; the TCP connection stays
//! open, like a black-holing firewall. Missing heartbeats then close it after the idle timeout,
//! and reconnects succeed (the handshake is not subject to cuts) but still carry nothing over
//! the cut direction. Healing lets frames queued after the heal flow again; frames dropped
//! meanwhile are gone (remote delivery is at most once).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// A shared switchboard of cut links between node ids. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct FaultInjector {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    any: AtomicBool,
    cut: RwLock<HashSet<(String, String)>>,
}

impl FaultInjector {
    /// A switchboard with every link up.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops everything node `from` sends to node `to` (one way).
    pub fn cut(&self, from: &str, to: &str) {
        let mut cut = self.inner.cut.write();
        cut.insert((from.to_string(), to.to_string()));
        self.inner.any.store(true, Ordering::Release);
        tracing::info!(from, to, "fault injection: link cut");
    }

    /// Cuts both directions between `a` and `b`.
    pub fn cut_both(&self, a: &str, b: &str) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Restores the link `from -> to`.
    pub fn heal(&self, from: &str, to: &str) {
        let mut cut = self.inner.cut.write();
        cut.remove(&(from.to_string(), to.to_string()));
        self.inner.any.store(!cut.is_empty(), Ordering::Release);
        tracing::info!(from, to, "fault injection: link healed");
    }

    /// Restores both directions between `a` and `b`.
    pub fn heal_both(&self, a: &str, b: &str) {
        self.heal(a, b);
        self.heal(b, a);
    }

    /// Restores every link.
    pub fn heal_all(&self) {
        self.inner.cut.write().clear();
        self.inner.any.store(false, Ordering::Release);
    }

    /// True while `from -> to` is cut.
    pub fn is_cut(&self, from: &str, to: &str) -> bool {
        if !self.inner.any.load(Ordering::Acquire) {
            return false;
        }
        self.inner
            .cut
            .read()
            .iter()
            .any(|(f, t)| f == from && t == to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_and_heal_per_direction() {
        let f = FaultInjector::new();
        assert!(!f.is_cut("a", "b"));
        f.cut("a", "b");
        assert!(f.is_cut("a", "b"));
        assert!(!f.is_cut("b", "a"));
        f.cut_both("a", "c");
        assert!(f.is_cut("c", "a"));
        f.heal("a", "b");
        assert!(!f.is_cut("a", "b"));
        assert!(f.is_cut("a", "c"));
        f.heal_all();
        assert!(!f.is_cut("a", "c") && !f.is_cut("c", "a"));
    }
}
