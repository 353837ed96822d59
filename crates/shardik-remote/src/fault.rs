//! Fault injection for tests: cut or delay the link between two named nodes, one way or
//! both, and heal it, without root and without touching the sockets.
//!
//! Share one [`FaultInjector`] between the nodes of a test (see
//! [`RemoteConfig::faults`](crate::RemoteConfig::faults)). While the link `from -> to` is cut,
//! every frame `from` would send to `to` (user messages, replies, heartbeats) is dropped by
//! `from`'s writer and, should one slip through, by `to`'s reader; the TCP connection stays
//! open, like a black-holing firewall. Missing heartbeats then close it after the idle timeout,
//! and reconnects succeed (the handshake is not subject to cuts) but still carry nothing over
//! the cut direction. Healing lets frames queued after the heal flow again; frames dropped
//! meanwhile are gone (remote delivery is at most once).
//!
//! While the link `from -> to` is delayed by `d`, `to`'s reader holds every frame that arrives
//! from `from` (user messages, replies, heartbeats) for `d` after its arrival before handling
//! it, in arrival order; the reader keeps reading meanwhile, so the delay does not throttle
//! the link. A request over a link delayed one way takes `d` longer; a round trip over a link
//! delayed both ways takes `2 d` longer. Changing or removing the delay never reorders frames:
//! frames that arrive while earlier ones are still held queue behind them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

/// A shared switchboard of cut and delayed links between node ids. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct FaultInjector {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    any: AtomicBool,
    cut: RwLock<HashSet<(String, String)>>,
    any_delay: AtomicBool,
    delays: RwLock<HashMap<(String, String), Duration>>,
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

    /// Restores the link `from -> to`: no cut, no delay.
    pub fn heal(&self, from: &str, to: &str) {
        let key = (from.to_string(), to.to_string());
        {
            let mut cut = self.inner.cut.write();
            cut.remove(&key);
            self.inner.any.store(!cut.is_empty(), Ordering::Release);
        }
        {
            let mut delays = self.inner.delays.write();
            delays.remove(&key);
            self.inner
                .any_delay
                .store(!delays.is_empty(), Ordering::Release);
        }
        tracing::info!(from, to, "fault injection: link healed");
    }

    /// Delays every frame node `from` sends to node `to` by `delay` (one way), replacing an
    /// earlier delay of that link; `Duration::ZERO` removes it. See the module docs.
    pub fn delay(&self, from: &str, to: &str, delay: Duration) {
        let key = (from.to_string(), to.to_string());
        let mut delays = self.inner.delays.write();
        if delay.is_zero() {
            delays.remove(&key);
        } else {
            delays.insert(key, delay);
        }
        self.inner
            .any_delay
            .store(!delays.is_empty(), Ordering::Release);
        tracing::info!(from, to, ?delay, "fault injection: link delayed");
    }

    /// Delays both directions between `a` and `b` by `delay` each.
    pub fn delay_both(&self, a: &str, b: &str, delay: Duration) {
        self.delay(a, b, delay);
        self.delay(b, a, delay);
    }

    /// The delay of the link `from -> to`, if it is delayed.
    pub fn delay_of(&self, from: &str, to: &str) -> Option<Duration> {
        if !self.inner.any_delay.load(Ordering::Acquire) {
            return None;
        }
        self.inner
            .delays
            .read()
            .iter()
            .find(|((f, t), _)| f == from && t == to)
            .map(|(_, d)| *d)
    }

    /// Restores both directions between `a` and `b`.
    pub fn heal_both(&self, a: &str, b: &str) {
        self.heal(a, b);
        self.heal(b, a);
    }

    /// Restores every link: no cuts, no delays.
    pub fn heal_all(&self) {
        self.inner.cut.write().clear();
        self.inner.any.store(false, Ordering::Release);
        self.inner.delays.write().clear();
        self.inner.any_delay.store(false, Ordering::Release);
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

    #[test]
    fn delay_per_direction_and_heal() {
        let f = FaultInjector::new();
        let d = Duration::from_millis(50);
        assert_eq!(f.delay_of("a", "b"), None);
        f.delay("a", "b", d);
        assert_eq!(f.delay_of("a", "b"), Some(d));
        assert_eq!(f.delay_of("b", "a"), None);
        assert!(!f.is_cut("a", "b"), "a delay is not a cut");
        f.delay("a", "b", Duration::ZERO);
        assert_eq!(f.delay_of("a", "b"), None);
        f.delay_both("a", "c", d);
        f.cut("a", "c");
        assert_eq!(f.delay_of("c", "a"), Some(d));
        f.heal("a", "c");
        assert_eq!(f.delay_of("a", "c"), None);
        assert!(!f.is_cut("a", "c"));
        assert_eq!(f.delay_of("c", "a"), Some(d));
        f.heal_all();
        assert_eq!(f.delay_of("c", "a"), None);
    }
}
