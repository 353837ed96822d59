//! What happens when an actor fails.

use std::time::{Duration, Instant};

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
/// When more than `max_restarts` failures happen within `within`, the actor is stopped
/// instead. Before the n-th consecutive restart the actor waits
/// `min(min_backoff * 2^(n-1), max_backoff)`; messages keep queueing meanwhile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed within the window before the actor is stopped.
    pub max_restarts: u32,
    /// The sliding window over which restarts are counted.
    pub within: Duration,
    /// The delay before the first restart of a series (zero: restart at once).
    pub min_backoff: Duration,
    /// The cap of the exponentially growing delay.
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

/// Failures seen within the current window (part of an actor's run state).
#[derive(Default, Debug)]
pub(crate) struct RestartWindow {
    window_start: Option<Instant>,
    count: u32,
}

impl RestartWindow {
    /// Records a failure at `now`. Returns the backoff to wait before restarting, or `None` if
    /// the limit is exceeded and the actor must stop.
    pub(crate) fn on_failure(&mut self, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        match self.window_start {
            Some(start) if now.duration_since(start) <= policy.within => self.count += 1,
            _ => {
                self.window_start = Some(now);
                self.count = 1;
            }
        }
        if self.count > policy.max_restarts {
            return None;
        }
        if policy.min_backoff.is_zero() {
            return Some(Duration::ZERO);
        }
        let exp = (self.count - 1).min(31);
        let backoff = policy.min_backoff.saturating_mul(1u32 << exp);
        Some(backoff.min(policy.max_backoff))
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
}
