//! What happens when an actor fails.

use std::time::Duration;

// The runtime's clock, on which the backoff sleeps too (paused time in tests counts).
use tokio::time::Instant;

/// What the runtime does when a handler or lifecycle hook returns an error or panics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupervisorStrategy {
    /// Stop the actor. Messages still queued go to its termination hook or to dead letters.
    Stop,
    /// Keep the actor and its state, drop the failed message, go on with the next one.
    Resume,
    /// Drop the failed instance and create a fresh one from the factory, within limits.
    Restart(RestartPolicy),
}

impl SupervisorStrategy {
    /// Restart with the default [`RestartPolicy`]: at most 10 restarts within 60 s, no backoff.
    pub fn restart() -> Self {
        SupervisorStrategy::Restart(RestartPolicy::default())
    }
}

/// Limits and pacing of restarts.
///
/// When more than `max_restarts` failures happen within any span of `within` (a sliding
/// window), the actor is stopped instead. Before a restart the actor waits
/// `min(min_backoff * 2^(n-1), max_backoff)`, `n` being the failures within the window;
/// messages keep queueing meanwhile, and a stop during the wait takes effect at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed within the window before the actor is stopped.
    pub max_restarts: u32,
    /// The sliding window over which failures are counted.
    pub within: Duration,
    /// The delay before the first restart of a series (zero: restart at once).
    pub min_backoff: Duration,
    /// The cap of the exponentially growing delay (one below `min_backoff` counts as
    /// `min_backoff`).
    pub max_backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 10,
            within: Duration::from_secs(60),
            min_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        }
    }
}

impl RestartPolicy {
    /// A policy with the given limit and window and no backoff.
    pub fn new(max_restarts: u32, within: Duration) -> Self {
        RestartPolicy {
            max_restarts,
            within,
            ..RestartPolicy::default()
        }
    }

    /// Sets exponential backoff between `min` and `max`.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }
}

/// The times of the failures within the last `within` (part of an actor's run state).
#[derive(Default, Debug)]
pub(crate) struct RestartWindow {
    /// Oldest first; at most `max_restarts + 1` are kept, since only that many matter.
    failures: std::collections::VecDeque<Instant>,
}

impl RestartWindow {
    /// Records a failure at `now`. Returns the backoff to wait before restarting, or `None` if
    /// more than `max_restarts` failures fall within the `within` ending now (a sliding
    /// window) and the actor must stop.
    pub(crate) fn on_failure(&mut self, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        while self
            .failures
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > policy.within)
        {
            self.failures.pop_front();
        }
        self.failures.push_back(now);
        let keep = usize::try_from(policy.max_restarts)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        while self.failures.len() > keep {
            self.failures.pop_front();
        }
        let count = u32::try_from(self.failures.len()).unwrap_or(u32::MAX);
        if count > policy.max_restarts {
            return None;
        }
        if policy.min_backoff.is_zero() {
            return Some(Duration::ZERO);
        }
        let exp = (count - 1).min(31);
        let backoff = policy.min_backoff.saturating_mul(1u32 << exp);
        Some(backoff.min(policy.max_backoff.max(policy.min_backoff)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_counts_and_resets() {
        let policy = RestartPolicy::new(2, Duration::from_secs(10));
        let mut w = RestartWindow::default();
        let t0 = Instant::now();
        assert_eq!(w.on_failure(&policy, t0), Some(Duration::ZERO));
        assert_eq!(
            w.on_failure(&policy, t0 + Duration::from_secs(1)),
            Some(Duration::ZERO)
        );
        assert_eq!(w.on_failure(&policy, t0 + Duration::from_secs(2)), None);
        // After the window has passed the count starts over.
        assert_eq!(
            w.on_failure(&policy, t0 + Duration::from_secs(30)),
            Some(Duration::ZERO)
        );
    }

    /// The window slides: three failures within 0.3 s stop the actor even when the first
    /// window that would have counted them started 10 s earlier.
    #[test]
    fn the_window_slides_with_each_failure() {
        let policy = RestartPolicy::new(2, Duration::from_secs(10));
        let mut w = RestartWindow::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(w.on_failure(&policy, at(0)).is_some());
        assert!(w.on_failure(&policy, at(9_900)).is_some());
        // 10.1 s: the failure at 0 has left the window; 9.9 and 10.1 remain.
        assert!(w.on_failure(&policy, at(10_100)).is_some());
        // 10.2 s: 9.9, 10.1 and 10.2 are three within 10 s.
        assert_eq!(w.on_failure(&policy, at(10_200)), None);
        // A huge limit keeps only what it needs.
        let lax = RestartPolicy::new(u32::MAX, Duration::from_secs(10));
        let mut w = RestartWindow::default();
        for ms in 0..100 {
            assert!(w.on_failure(&lax, at(ms)).is_some());
        }
    }

    #[test]
    fn backoff_grows_exponentially_and_is_capped() {
        let policy = RestartPolicy::new(10, Duration::from_secs(60))
            .with_backoff(Duration::from_millis(100), Duration::from_millis(350));
        let mut w = RestartWindow::default();
        let t0 = Instant::now();
        let got: Vec<_> = (0..4).map(|_| w.on_failure(&policy, t0).unwrap()).collect();
        assert_eq!(
            got,
            vec![
                Duration::from_millis(100),
                Duration::from_millis(200),
                Duration::from_millis(350),
                Duration::from_millis(350)
            ]
        );
    }

    /// A policy built by hand with only `min_backoff` set (`max_backoff` stays zero from
    /// the default) backs off by `min_backoff`, instead of not at all.
    #[test]
    fn a_cap_below_the_minimum_backoff_counts_as_the_minimum() {
        let policy = RestartPolicy {
            min_backoff: Duration::from_millis(100),
            ..RestartPolicy::default()
        };
        let mut w = RestartWindow::default();
        let t0 = Instant::now();
        let got: Vec<_> = (0..3).map(|_| w.on_failure(&policy, t0).unwrap()).collect();
        assert_eq!(got, vec![Duration::from_millis(100); 3]);
    }
}
