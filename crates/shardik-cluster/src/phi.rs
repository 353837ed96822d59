//! The phi accrual failure detector (Hayashibara et al.), as Akka computes it.
//!
//! Instead of a yes/no timeout the detector gives a suspicion level, `phi`, from the history of
//! heartbeat inter-arrival times: `phi = -log10(1 - F(elapsed))` where `F` is the normal CDF
//! with mean = mean interval + acceptable pause and standard deviation = max(measured, minimum).
//! `F` uses Akka's logistic approximation. A node is suspected once `phi >= threshold`.
//! Time is passed in: instants are milliseconds since any fixed epoch.

use std::collections::VecDeque;
use std::time::Duration;

/// Settings of a [`PhiAccrualDetector`].
#[derive(Clone, Debug, PartialEq)]
pub struct PhiConfig {
    /// Suspect a node once phi reaches this (Akka: 8).
    pub threshold: f64,
    /// Heartbeat intervals kept (Akka: 1000).
    pub max_sample_size: usize,
    /// The standard deviation never goes below this, so very regular heartbeats do not make
    /// the detector hair-triggered (Akka: 100 ms).
    pub min_std_deviation: Duration,
    /// Added to the mean interval: pauses this long (GC, a busy machine) are tolerated
    /// (Akka: 3 s).
    pub acceptable_heartbeat_pause: Duration,
    /// The expected interval, used to seed the history at the first heartbeat (Akka: the
    /// heartbeat interval, 1 s).
    pub first_heartbeat_estimate: Duration,
}

impl Default for PhiConfig {
    /// Akka's defaults: threshold 8, 1000 samples, 100 ms, 3 s, 1 s. A heartbeat lost for good
    /// is suspected about 4.5 s after the last one arrived.
    fn default() -> Self {
        Self {
            threshold: 8.0,
            max_sample_size: 1000,
            min_std_deviation: Duration::from_millis(100),
            acceptable_heartbeat_pause: Duration::from_secs(3),
            first_heartbeat_estimate: Duration::from_secs(1),
        }
    }
}

/// `phi` for `elapsed` ms given the mean and standard deviation (ms) of the distribution.
///
/// ```
/// let p = shardik_cluster::phi::phi(1000.0, 1000.0, 250.0);
/// assert!((p - 0.30103).abs() < 1e-5); // -log10(1/2): as late as the mean
/// ```
pub fn phi(elapsed: f64, mean: f64, std_deviation: f64) -> f64 {
    let y = (elapsed - mean) / std_deviation;
    let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
    if elapsed > mean {
        -(e / (1.0 + e)).log10()
    } else {
        -(1.0 - 1.0 / (1.0 + e)).log10()
    }
}

/// One monitored node's detector.
///
/// ```
/// use shardik_cluster::phi::{PhiAccrualDetector, PhiConfig};
///
/// let mut d = PhiAccrualDetector::new(PhiConfig::default());
/// for t in 0..10 {
///     d.heartbeat(t * 1000);
/// }
/// assert!(d.is_available(10_000));
/// assert!(!d.is_available(20_000));
/// ```
#[derive(Clone, Debug)]
pub struct PhiAccrualDetector {
    config: PhiConfig,
    intervals: VecDeque<u64>,
    sum: f64,
    sum_sq: f64,
    last: Option<u64>,
    /// The interval before the last heartbeat was not learnt (it ended a flag).
    skipped: bool,
}

impl PhiAccrualDetector {
    /// A detector that has seen no heartbeat yet (phi 0).
    pub fn new(config: PhiConfig) -> Self {
        Self {
            config,
            intervals: VecDeque::new(),
            sum: 0.0,
            sum_sq: 0.0,
            last: None,
            skipped: false,
        }
    }

    /// The settings.
    pub fn config(&self) -> &PhiConfig {
        &self.config
    }

    /// A heartbeat arrived at `now` (ms).
    pub fn heartbeat(&mut self, now: u64) {
        match self.last {
            None => {
                // Seed with the estimate: mean = estimate, std-dev = estimate / 4.
                let mean = crate::node::millis(self.config.first_heartbeat_estimate);
                let sd = mean / 4;
                self.push(mean - sd);
                self.push(mean.saturating_add(sd));
            }
            Some(last) => {
                // The gap of an outage (the peer was taken for unavailable) is not a
                // heartbeat interval: learnt as one it would inflate the mean and deviation
                // for the next `max_sample_size` heartbeats, and a crash soon after would be
                // detected several times later (Akka skips it too). Two such gaps in a row
                // are the peer's pace, though (it sends more slowly than this node expects,
                // its interval raised in a rolling change): learnt, or it would be flagged
                // between every two heartbeats for good.
                if now >= last {
                    if self.is_available(now) || self.skipped {
                        self.push(now - last);
                        self.skipped = false;
                    } else {
                        self.skipped = true;
                    }
                }
            }
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    fn push(&mut self, interval: u64) {
        if self.intervals.len() >= self.config.max_sample_size.max(1) {
            if let Some(old) = self.intervals.pop_front() {
                self.sum -= old as f64;
                self.sum_sq -= (old as f64) * (old as f64);
            }
        }
        self.intervals.push_back(interval);
        self.sum += interval as f64;
        self.sum_sq += (interval as f64) * (interval as f64);
    }

    /// The mean heartbeat interval (ms) of the history.
    pub fn mean(&self) -> f64 {
        if self.intervals.is_empty() {
            0.0
        } else {
            self.sum / self.intervals.len() as f64
        }
    }

    /// The standard deviation (ms) of the history (population).
    pub fn std_deviation(&self) -> f64 {
        if self.intervals.is_empty() {
            return 0.0;
        }
        let n = self.intervals.len() as f64;
        let mean = self.sum / n;
        (self.sum_sq / n - mean * mean).max(0.0).sqrt()
    }

    /// The suspicion level at `now` (ms); 0 before the first heartbeat.
    pub fn phi(&self, now: u64) -> f64 {
        let Some(last) = self.last else {
            return 0.0;
        };
        let elapsed = now.saturating_sub(last) as f64;
        let mean = self.mean() + self.config.acceptable_heartbeat_pause.as_millis() as f64;
        // Never 0 (a `min_std_deviation` under 1 ms): phi would be NaN at the mean.
        let sd = self
            .std_deviation()
            .max(self.config.min_std_deviation.as_millis() as f64)
            .max(0.001);
        phi(elapsed, mean, sd)
    }

    /// `true` while phi is below the threshold.
    pub fn is_available(&self, now: u64) -> bool {
        self.phi(now) < self.config.threshold
    }

    /// When the last heartbeat arrived (ms; `None` before the first).
    pub fn last_heartbeat(&self) -> Option<u64> {
        self.last
    }

    /// `true` once a heartbeat has arrived.
    pub fn is_monitoring(&self) -> bool {
        self.last.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-4, "{a} != {b}");
    }

    fn cfg(pause_ms: u64, min_sd_ms: u64) -> PhiConfig {
        PhiConfig {
            acceptable_heartbeat_pause: Duration::from_millis(pause_ms),
            min_std_deviation: Duration::from_millis(min_sd_ms),
            ..PhiConfig::default()
        }
    }

    #[test]
    fn formula_matches_hand_computed_values() {
        // y = 0: F = 1/2
        close(phi(1000.0, 1000.0, 250.0), std::f64::consts::LOG10_2);
        // y = 2: e = exp(-2 (1.5976 + 0.070566 * 4)) = 0.023290; -log10(e / (1 + e)) = 1.64283
        close(phi(1500.0, 1000.0, 250.0), 1.642_83);
        // y = -2: -log10(1 - 1 / (1 + 1/e)) = 0.0099988
        close(phi(500.0, 1000.0, 250.0), 0.009_998_8);
    }

    #[test]
    fn first_heartbeat_seeds_history_with_the_estimate() {
        let mut d = PhiAccrualDetector::new(cfg(0, 100));
        assert_eq!(d.phi(5_000), 0.0, "no heartbeat yet");
        d.heartbeat(10_000);
        close(d.mean(), 1000.0);
        close(d.std_deviation(), 250.0);
        close(d.phi(11_000), std::f64::consts::LOG10_2);
        close(d.phi(11_500), 1.642_83);
    }

    #[test]
    fn detector_values_follow_history() {
        let mut d = PhiAccrualDetector::new(cfg(0, 100));
        d.heartbeat(0);
        d.heartbeat(1000);
        d.heartbeat(2000);
        // samples 750, 1250, 1000, 1000: mean 1000, sd sqrt(31250) = 176.78
        close(d.mean(), 1000.0);
        close(d.std_deviation(), 176.776_7);
        close(d.phi(3200), 0.889_35);
    }

    #[test]
    fn acceptable_pause_shifts_the_mean_and_min_sd_applies() {
        let mut d = PhiAccrualDetector::new(cfg(3000, 100));
        for t in 0..=200u64 {
            d.heartbeat(t * 1000);
        }
        // the two seed samples keep the measured sd near 35 ms, under the 100 ms minimum
        assert!(d.std_deviation() < 100.0);
        let sd = 100.0;
        close(d.phi(200_000 + 4300), phi(4300.0, d.mean() + 3000.0, sd));
        // a 3 s pause is not suspected, 5 s is
        assert!(d.is_available(200_000 + 4000));
        assert!(!d.is_available(200_000 + 5000));
    }

    #[test]
    fn phi_rises_during_a_pause() {
        let mut d = PhiAccrualDetector::new(PhiConfig::default());
        for t in 0..20u64 {
            d.heartbeat(t * 1000);
        }
        let last = 19_000;
        let mut prev = -1.0;
        for dt in (0..=8000).step_by(250) {
            let p = d.phi(last + dt);
            assert!(p >= prev, "phi fell at {dt}: {p} < {prev}");
            prev = p;
        }
        assert!(prev >= 8.0);
    }

    #[test]
    fn acceptable_pause_suppresses_suspicion() {
        let mut strict = PhiAccrualDetector::new(cfg(0, 100));
        let mut lenient = PhiAccrualDetector::new(cfg(3000, 100));
        for t in 0..20u64 {
            strict.heartbeat(t * 1000);
            lenient.heartbeat(t * 1000);
        }
        let at = 19_000 + 2500;
        assert!(!strict.is_available(at));
        assert!(lenient.is_available(at));
        assert!(lenient.phi(at) < 0.1);
    }

    #[test]
    fn history_is_bounded() {
        let mut d = PhiAccrualDetector::new(PhiConfig {
            max_sample_size: 3,
            ..cfg(0, 1)
        });
        d.heartbeat(0);
        for t in 1..=10u64 {
            d.heartbeat(t * 200);
        }
        close(d.mean(), 200.0);
        close(d.std_deviation(), 0.0);
    }

    #[test]
    fn default_detects_a_stop_in_about_four_and_a_half_seconds() {
        let mut d = PhiAccrualDetector::new(PhiConfig::default());
        for t in 0..=1000u64 {
            d.heartbeat(t * 1000);
        }
        let last = 1_000_000;
        let first_suspect = (0..10_000u64)
            .step_by(10)
            .find(|dt| !d.is_available(last + dt))
            .unwrap();
        assert!((4400..=4600).contains(&first_suspect), "{first_suspect}");
    }

    /// The gap of an outage that healed is not learnt as an interval: after it, a stop is
    /// detected as soon as before it. Learnt, a 4 s gap among 40 heartbeats of 250 ms
    /// raised the deviation from about 0 to 560 ms and the detection of the next stop from
    /// about 2.3 to 4.8 s (and kept it there for `max_sample_size` heartbeats).
    #[test]
    fn the_gap_of_a_healed_outage_is_not_learnt() {
        let first_suspect = |d: &PhiAccrualDetector, last: u64| {
            (0..60_000u64)
                .step_by(10)
                .find(|dt| !d.is_available(last + dt))
                .unwrap()
        };
        let mut d = PhiAccrualDetector::new(PhiConfig::default());
        let mut t = 0;
        for _ in 0..40 {
            d.heartbeat(t);
            t += 250;
        }
        let before = first_suspect(&d, t - 250);
        let sd = d.std_deviation();
        // Silent for 4 s (taken for unavailable), then heartbeats again.
        t += 4000;
        assert!(!d.is_available(t), "the outage is noticed");
        d.heartbeat(t);
        assert!(d.is_available(t), "available again");
        close(d.std_deviation(), sd);
        for _ in 0..4 {
            t += 250;
            d.heartbeat(t);
        }
        let after = first_suspect(&d, t);
        assert!(
            after <= before + 50,
            "detected after {after} ms, before the outage {before} ms"
        );
        // A pause the detector accepted (within the acceptable pause) is learnt as usual.
        let n = d.intervals.len();
        t += 1000;
        assert!(d.is_available(t));
        d.heartbeat(t);
        assert_eq!(d.intervals.len(), (n + 1).min(d.config.max_sample_size));
    }

    /// A peer that sends more slowly than this node expects (every gap flags it) is learnt
    /// from its second slow gap on: it is flagged once, not between every two heartbeats.
    #[test]
    fn a_slower_peer_is_learnt_after_two_gaps() {
        let mut d = PhiAccrualDetector::new(PhiConfig::default());
        let mut t = 0;
        d.heartbeat(t);
        let mut flagged_at_arrival = Vec::new();
        // Well past the acceptable pause (3 s by default): every gap ends a flag until
        // the pace is learnt.
        for _ in 0..12 {
            t += 6000;
            flagged_at_arrival.push(!d.is_available(t));
            d.heartbeat(t);
        }
        assert!(
            flagged_at_arrival[4..].iter().all(|f| !f),
            "still flagged at every arrival: {flagged_at_arrival:?}"
        );
    }
}
