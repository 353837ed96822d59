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
//!
//! While one connection of the link `from -> to` is held ([`FaultInjector::hold`], by
//! [`Lane`]), `to`'s reader of that connection keeps reading but handles nothing it reads
//! (nor frames still waiting out a delay) until the hold is released, then handles them in
//! arrival order; the other connection of the pair flows. This lets a test put frames of
//! both connections in flight and decide which are handled first, with no timing involved.
//! Held frames are kept in memory without a bound and are lost if the connection closes;
//! no counter counts them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::frame::Lane;

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
    any_hold: AtomicBool,
    holds: RwLock<HashSet<(String, String, Lane)>>,
    /// Told whenever a hold ends.
    released: Notify,
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

    /// Restores the link `from -> to`: no cut, no delay, no held lane.
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
        for lane in Lane::ALL {
            self.release(from, to, lane);
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

    /// Restores every link: no cuts, no delays, no held lanes.
    pub fn heal_all(&self) {
        // Each flag is stored under its set's lock, so a fault added at the same time is
        // either cleared with the set or keeps its flag.
        {
            let mut cut = self.inner.cut.write();
            cut.clear();
            self.inner.any.store(false, Ordering::Release);
        }
        {
            let mut delays = self.inner.delays.write();
            delays.clear();
            self.inner.any_delay.store(false, Ordering::Release);
        }
        {
            let mut holds = self.inner.holds.write();
            holds.clear();
            self.inner.any_hold.store(false, Ordering::Release);
        }
        self.inner.released.notify_waiters();
    }

    /// Holds the frames node `from` sends to node `to` on its `lane` connection: `to`
    /// handles none of them until [`release`](Self::release) (or a heal), then all of them,
    /// in arrival order. See the module docs.
    pub fn hold(&self, from: &str, to: &str, lane: Lane) {
        let mut holds = self.inner.holds.write();
        holds.insert((from.to_string(), to.to_string(), lane));
        self.inner.any_hold.store(true, Ordering::Release);
        tracing::info!(from, to, lane = lane.as_str(), "fault injection: lane held");
    }

    /// Ends a [`hold`](Self::hold): the held frames are handled, in arrival order.
    pub fn release(&self, from: &str, to: &str, lane: Lane) {
        {
            let mut holds = self.inner.holds.write();
            if !holds.remove(&(from.to_string(), to.to_string(), lane)) {
                return;
            }
            self.inner
                .any_hold
                .store(!holds.is_empty(), Ordering::Release);
        }
        self.inner.released.notify_waiters();
        tracing::info!(
            from,
            to,
            lane = lane.as_str(),
            "fault injection: lane released"
        );
    }

    /// True while the `lane` connection of `from -> to` is held.
    pub fn is_held(&self, from: &str, to: &str, lane: Lane) -> bool {
        if !self.inner.any_hold.load(Ordering::Acquire) {
            return false;
        }
        self.inner
            .holds
            .read()
            .iter()
            .any(|(f, t, l)| f == from && t == to && *l == lane)
    }

    /// Waits until the `lane` connection of `from -> to` is not held.
    pub(crate) async fn until_released(&self, from: &str, to: &str, lane: Lane) {
        // The usual case (a delayed link, nothing held) touches no `Notify`.
        if !self.is_held(from, to, lane) {
            return;
        }
        loop {
            // Registered before the check, so a release between the two is not missed.
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.is_held(from, to, lane) {
                return;
            }
            released.await;
        }
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

    #[tokio::test]
    async fn a_hold_is_per_lane_and_ends_with_a_release_or_a_heal() {
        let f = FaultInjector::new();
        f.hold("a", "b", Lane::User);
        assert!(f.is_held("a", "b", Lane::User));
        assert!(!f.is_held("a", "b", Lane::Control));
        assert!(!f.is_held("b", "a", Lane::User));
        assert!(!f.is_cut("a", "b") && f.delay_of("a", "b").is_none());
        // Not released yet: the wait does not end.
        let wait = f.until_released("a", "b", Lane::User);
        tokio::pin!(wait);
        assert!(futures_util::FutureExt::now_or_never(wait.as_mut()).is_none());
        f.release("a", "b", Lane::User);
        wait.await;
        assert!(!f.is_held("a", "b", Lane::User));
        f.until_released("a", "b", Lane::Control).await;
        // Healing the link ends its holds, and wakes who waits for them.
        f.hold("a", "b", Lane::Control);
        let waiter = {
            let f = f.clone();
            tokio::spawn(async move { f.until_released("a", "b", Lane::Control).await })
        };
        tokio::task::yield_now().await;
        f.heal("a", "b");
        waiter.await.unwrap();
        f.hold("a", "c", Lane::User);
        f.heal_all();
        assert!(!f.is_held("a", "c", Lane::User));
    }
}
