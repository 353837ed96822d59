//! What every suite shares: the runtime, alternating rounds with medians, and a countdown
//! that tells a driver when the work it started is done.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Worker threads of the benchmark runtime: the machine's two cores.
pub const WORKERS: usize = 2;

/// The multi-threaded tokio runtime every benchmark runs on (shardik and baselines alike).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("the tokio runtime starts")
}

/// Runs `future` as a task on a worker thread and waits for it, so drivers run where actors
/// and baseline tasks run (not on the thread that blocks on the runtime).
pub fn block_on_task<F>(rt: &tokio::runtime::Runtime, future: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.block_on(async move { tokio::spawn(future).await.expect("benchmark task panicked") })
}

/// One competitor in a benchmark: a name for progress output and a run that returns one
/// figure per metric of the benchmark.
pub struct Contender<'a> {
    /// Shown in progress messages.
    pub name: &'static str,
    /// One measurement; returns the figures in the benchmark's metric order.
    pub run: Box<dyn FnMut() -> Vec<f64> + 'a>,
}

impl<'a> Contender<'a> {
    /// A contender called `name` measured by `run`.
    pub fn new(name: &'static str, run: impl FnMut() -> Vec<f64> + 'a) -> Self {
        Contender {
            name,
            run: Box::new(run),
        }
    }
}

/// Measures the contenders alternately: `warmup` discarded rounds, then `rounds` rounds,
/// each running every contender once (in forward order in even rounds and in reverse order in
/// odd ones, so no contender always follows the same one). Returns, per contender, the median
/// of each metric over the rounds. The machine is shared and noisy; alternating spreads the
/// noise over all contenders and the median drops outliers.
pub fn alternate(contenders: &mut [Contender<'_>], warmup: usize, rounds: usize) -> Vec<Vec<f64>> {
    let rounds = rounds.max(1);
    let n = contenders.len();
    let mut samples: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n];
    for round in 0..warmup + rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        for i in order {
            let figures = (contenders[i].run)();
            if round >= warmup {
                samples[i].push(figures);
            }
        }
    }
    for (c, runs) in contenders.iter().zip(&samples) {
        let firsts: Vec<String> = runs.iter().map(|r| format!("{:.4e}", r[0])).collect();
        eprintln!("[rounds]   {:<16} {}", c.name, firsts.join("  "));
    }
    samples
        .into_iter()
        .map(|runs| {
            let metrics = runs.first().map_or(0, Vec::len);
            (0..metrics)
                .map(|m| median(runs.iter().map(|r| r[m]).collect()))
                .collect()
        })
        .collect()
}

/// The median of `xs` (the mean of the two middle values for an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    assert!(!xs.is_empty(), "median of nothing");
    xs.sort_by(|a, b| a.total_cmp(b));
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

/// Counts events down to zero and wakes the one waiter when the last one arrives.
///
/// Costs one atomic decrement per event, the same for shardik and for the baselines.
#[derive(Debug)]
pub struct Countdown {
    left: AtomicUsize,
    done: Notify,
}

impl Countdown {
    /// A countdown expecting `n` events (`n` must be at least 1).
    pub fn new(n: usize) -> Arc<Self> {
        assert!(n > 0, "a countdown needs at least one event");
        Arc::new(Countdown {
            left: AtomicUsize::new(n),
            done: Notify::new(),
        })
    }

    /// Records one event.
    #[inline]
    pub fn hit(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.notify_one();
        }
    }

    /// Waits until every expected event has been recorded.
    pub async fn wait(&self) {
        while self.left.load(Ordering::Acquire) != 0 {
            self.done.notified().await;
        }
    }
}

/// What a benchmark of a two-process suite gets: options, sizes, the runtime, and the suite's
/// set-up (child process, nodes), started by `start` on first use.
pub struct SuiteCtx<S, N> {
    /// The suite options.
    pub opts: crate::SuiteOptions,
    /// Problem sizes.
    pub sizes: S,
    /// The multi-threaded runtime (2 workers) this side runs on.
    pub rt: tokio::runtime::Runtime,
    net: std::sync::OnceLock<N>,
    start: fn(&tokio::runtime::Runtime) -> N,
}

impl<S, N> SuiteCtx<S, N> {
    /// A context on a fresh [`runtime`] whose set-up `start` runs on first use.
    pub fn new(
        opts: &crate::SuiteOptions,
        sizes: S,
        start: fn(&tokio::runtime::Runtime) -> N,
    ) -> Self {
        SuiteCtx {
            opts: opts.clone(),
            sizes,
            rt: runtime(),
            net: std::sync::OnceLock::new(),
            start,
        }
    }

    /// Alternates the contenders with the suite's warm-up and rounds.
    pub fn alternate(&self, contenders: &mut [Contender<'_>]) -> Vec<Vec<f64>> {
        alternate(contenders, self.opts.warmup(), self.opts.rounds())
    }

    /// The suite's set-up, started on first use.
    pub fn net(&self) -> &N {
        self.net.get_or_init(|| (self.start)(&self.rt))
    }

    /// Takes the set-up (if it was started) and the runtime, to shut both down.
    pub fn into_parts(self) -> (Option<N>, tokio::runtime::Runtime) {
        (self.net.into_inner(), self.rt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn alternate_takes_medians_per_contender() {
        let mut a = 0.0;
        let mut b = 100.0;
        let mut contenders = [
            Contender::new("a", || {
                a += 1.0;
                vec![a, -a]
            }),
            Contender::new("b", || {
                b += 1.0;
                vec![b, -b]
            }),
        ];
        let out = alternate(&mut contenders, 1, 3);
        // Warm-up ran 1.0 / 101.0; the measured rounds were 2..=4 and 102..=104.
        assert_eq!(out, vec![vec![3.0, -3.0], vec![103.0, -103.0]]);
    }
}
