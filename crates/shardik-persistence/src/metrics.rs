//! Metrics of recovery and snapshots (the write path's are beside it, in `batch.rs`,
//! `event_sourced.rs` and `durable_state.rs`). The list is in `docs/observability.md`.

use std::future::Future;
use std::time::Instant;

use crate::error::PersistenceError;

/// Which kind of entity recovered: the `kind` label.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    EventSourced,
    DurableState,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::EventSourced => "event_sourced",
            Kind::DurableState => "durable_state",
        }
    }
}

/// Runs `recovery`, recording its duration (`shardik_persistence_recovery_seconds{kind}`) or
/// its failure (`shardik_persistence_recovery_failures_total{kind}`).
pub(crate) async fn timed_recovery<T>(
    kind: Kind,
    recovery: impl Future<Output = Result<T, PersistenceError>>,
) -> Result<T, PersistenceError> {
    let began = Instant::now();
    let result = recovery.await;
    match &result {
        Ok(_) => {
            metrics::histogram!("shardik_persistence_recovery_seconds", "kind" => kind.label())
                .record(began.elapsed())
        }
        Err(_) => metrics::counter!(
            "shardik_persistence_recovery_failures_total",
            "kind" => kind.label()
        )
        .increment(1),
    }
    result
}

/// `n` events were replayed by a recovery (after its snapshot, if any).
pub(crate) fn replayed(n: u64) {
    metrics::counter!("shardik_persistence_events_replayed_total").increment(n);
}

/// A snapshot was saved (`true`) or failed to save.
pub(crate) fn snapshot(saved: bool) {
    if saved {
        metrics::counter!("shardik_persistence_snapshots_saved_total").increment(1);
    } else {
        metrics::counter!("shardik_persistence_snapshot_failures_total").increment(1);
    }
}
