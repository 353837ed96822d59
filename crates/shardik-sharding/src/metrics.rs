//! The sharding layer's metrics (through the `metrics` crate), as handles registered once per
//! region: updating one is an atomic operation, with no key built per update. A handle is
//! bound to the recorder installed when the region starts, so install the recorder (say, a
//! Prometheus exporter) before starting entity types. The list, with what to alert on, is in
//! `docs/observability.md`.

use metrics::{Counter, Gauge, Histogram};

/// A region's entity incarnations: `shardik_sharding_entities{entity_type}` (live now) and
/// `shardik_sharding_entity_starts_total{entity_type}`. Regions of one type in one process
/// add up in the same series.
pub(crate) struct EntityMetrics {
    live: Gauge,
    starts: Counter,
}

impl EntityMetrics {
    pub(crate) fn new(type_name: &str) -> Self {
        EntityMetrics {
            live: metrics::gauge!("shardik_sharding_entities", "entity_type" => type_name.to_string()),
            starts: metrics::counter!(
                "shardik_sharding_entity_starts_total",
                "entity_type" => type_name.to_string()
            ),
        }
    }

    /// An incarnation was spawned.
    pub(crate) fn started(&self) {
        self.starts.increment(1);
        self.live.increment(1.0);
    }

    /// An incarnation terminated.
    pub(crate) fn ended(&self) {
        self.live.decrement(1.0);
    }
}

/// A cluster region's shards: `shardik_sharding_shards_hosted{entity_type, node}` and its
/// hand-offs, `shardik_sharding_handoffs_total{entity_type, node}` and
/// `shardik_sharding_handoff_seconds{entity_type, node}` (from the coordinator's order to stop a
/// shard until its entities stopped and, with remember entities, its ids are replicated), and
/// its fencing counters `shardik_sharding_fenced_total`, `shardik_sharding_fenced_dropped_total`
/// and `shardik_sharding_forward_refused_total` (same labels).
pub(crate) struct RegionMetrics {
    pub(crate) shards_hosted: Gauge,
    pub(crate) handoffs: Counter,
    pub(crate) handoff_seconds: Histogram,
    pub(crate) fenced: Counter,
    pub(crate) fenced_dropped: Counter,
    pub(crate) forward_refused: Counter,
}

impl RegionMetrics {
    pub(crate) fn new(type_name: &str, node: &str) -> Self {
        let labels = [
            ("entity_type", type_name.to_string()),
            ("node", node.to_string()),
        ];
        RegionMetrics {
            shards_hosted: metrics::gauge!("shardik_sharding_shards_hosted", &labels),
            handoffs: metrics::counter!("shardik_sharding_handoffs_total", &labels),
            handoff_seconds: metrics::histogram!("shardik_sharding_handoff_seconds", &labels),
            fenced: metrics::counter!("shardik_sharding_fenced_total", &labels),
            fenced_dropped: metrics::counter!("shardik_sharding_fenced_dropped_total", &labels),
            forward_refused: metrics::counter!("shardik_sharding_forward_refused_total", &labels),
        }
    }
}

/// A node's coordinator of one entity type: `shardik_sharding_coordinator_active`,
/// `shardik_sharding_shards_allocated` and `shardik_sharding_handoffs_in_progress` (each
/// `{entity_type, node}`; the last two are 0 where the coordinator does not run, so summed
/// over nodes they give the cluster's figures).
pub(crate) struct CoordinatorMetrics {
    active: Gauge,
    allocated: Gauge,
    handoffs: Gauge,
}

impl CoordinatorMetrics {
    pub(crate) fn new(type_name: &str, node: &str) -> Self {
        let labels = [
            ("entity_type", type_name.to_string()),
            ("node", node.to_string()),
        ];
        CoordinatorMetrics {
            active: metrics::gauge!("shardik_sharding_coordinator_active", &labels),
            allocated: metrics::gauge!("shardik_sharding_shards_allocated", &labels),
            handoffs: metrics::gauge!("shardik_sharding_handoffs_in_progress", &labels),
        }
    }

    /// This node's coordinator runs with `allocated` shards and `handoffs` hand-offs in
    /// progress, or (`None`) does not run here.
    pub(crate) fn set(&self, running: Option<(usize, usize)>) {
        let (active, allocated, handoffs) = match running {
            Some((allocated, handoffs)) => (1.0, allocated as f64, handoffs as f64),
            None => (0.0, 0.0, 0.0),
        };
        self.active.set(active);
        self.allocated.set(allocated);
        self.handoffs.set(handoffs);
    }
}
