//! [`ClusterShardingSettings`]: the timing and limits of the cluster layer of one entity type.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use crate::coordination::{AllocationStrategy, CoordinatorConfig, LeastShards, RegionConfig};

/// Timing and limits of one entity type's cluster layer; every node should use the same.
#[derive(Clone, Debug)]
pub struct ClusterShardingSettings {
    /// How often regions and the coordinator are ticked (retries, timeouts, rebalance checks).
    /// Default 100 ms.
    pub tick: Duration,
    /// Interval between a region's `Register` / `GetShardHome` retries. Default 300 ms.
    pub retry_interval: Duration,
    /// Minimum time between two rebalance rounds. Default 2 s.
    pub rebalance_interval: Duration,
    /// A hand-off whose acknowledgements are not all in after this long is aborted (the owner
    /// keeps the shard). Default 10 s.
    pub handoff_ack_timeout: Duration,
    /// `HandOff` is sent again after this long without `ShardStopped`. Default 5 s.
    pub handoff_stop_retry: Duration,
    /// How long the entities of a shard that is handed off get to stop gracefully (each
    /// handles what its mailbox holds first). Those still running then are stopped as soon as
    /// their current message is done, and the messages they had not handled move with the
    /// shard to its next home, ahead of what was sent meanwhile: a slow entity delays a
    /// hand-off (and a graceful leave) by at most this long, and loses nothing. Default 10 s.
    pub entity_stop_timeout: Duration,
    /// Messages buffered per shard while its home is unknown or it moves. Default 10 000.
    pub buffer_limit: usize,
    /// How long one replica write or read may take before it is retried. Default 2 s.
    pub replication_timeout: Duration,
    /// How long after a member is seen `Down` (or removed without having left) its shards are
    /// reallocated. A node stops its entities as soon as it is **fenced**
    /// ([`ClusterState::fenced`](shardik_cluster::runtime::ClusterState::fenced): on its own
    /// view the split brain resolver would down it, or most of the peers it watches went
    /// silent), which on the losing side of a partition happens about when it could first
    /// suspect the other side, while the winning side downs it only `stable_after` (2 s)
    /// after its own detection. The margin adds to those 2 s against a skew between the two
    /// sides' detection and entities slow to stop. Default 500 ms.
    pub down_margin: Duration,
    /// Only members with this role host the type's shards (and run its coordinator and store
    /// its coordinator-state replicas); a node without it that starts the type only routes to
    /// it, like [`ClusterSharding::start_proxy`](super::ClusterSharding::start_proxy). Default
    /// `None`: every member.
    pub role: Option<String>,
    /// Remember entities: the ids of the entities started in each shard are replicated to the
    /// members (like the coordinator state), and when a shard gets a new home (rebalance,
    /// leave, crash) its remembered entities are started there at once, without waiting for a
    /// message; a crashed node's shards are reallocated at once for that. Ids are never
    /// forgotten (a passivated entity is restarted on the shard's next home). Default `false`.
    pub remember_entities: bool,
    /// How a shard's new home starts its remembered entities: all at once (default), or a
    /// few at a time so that a failover or a full restart does not start (and recover from
    /// the journal) every entity of every moved shard in the same instant. Entities that get
    /// a message start at once either way.
    pub remembered_start: RememberedStart,
    /// Where the coordinator puts new shards and which shards a rebalance round moves. Default
    /// [`LeastShards`]; [`LocalFirst`](crate::coordination::LocalFirst) keeps a shard on the node
    /// that first sent to it. Configure the same strategy on every node (the coordinator may
    /// move to any of them).
    pub allocation_strategy: Arc<dyn AllocationStrategy>,
    /// The type's coordinator starts (reads the replicated state from a majority) and a new
    /// home of a shard reads its remembered entities only while at least this many members
    /// (`Up` or `Leaving`, with the type's role) are in the view. With a
    /// [state store](super::ClusterSharding::with_state_store), set it to a majority of the
    /// cluster's full size: after a full restart the first node up would otherwise be a
    /// majority of itself and start from its own copy, which may miss what the other nodes
    /// acknowledged. A running coordinator is not stopped when members leave. A value above
    /// the number of members with the role leaves the type without a coordinator (nothing is
    /// allocated); the node that would run it logs a warning. Default 1.
    pub min_quorum: usize,
}

/// How a shard's new home starts its remembered entities
/// ([`ClusterShardingSettings::remembered_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RememberedStart {
    /// Every remembered entity of the shard at once.
    All,
    /// `entities` of the shard's remembered entities at a time, the next ones `every` later.
    Constant {
        /// Entities started per step.
        entities: NonZeroUsize,
        /// Time between two steps.
        every: Duration,
    },
}

impl Default for ClusterShardingSettings {
    fn default() -> Self {
        ClusterShardingSettings {
            tick: Duration::from_millis(100),
            retry_interval: Duration::from_millis(300),
            rebalance_interval: Duration::from_secs(2),
            handoff_ack_timeout: Duration::from_secs(10),
            handoff_stop_retry: Duration::from_secs(5),
            entity_stop_timeout: Duration::from_secs(10),
            buffer_limit: 10_000,
            replication_timeout: Duration::from_secs(2),
            down_margin: Duration::from_millis(500),
            role: None,
            remember_entities: false,
            remembered_start: RememberedStart::All,
            allocation_strategy: Arc::new(LeastShards),
            min_quorum: 1,
        }
    }
}

impl ClusterShardingSettings {
    /// Sets [`rebalance_interval`](Self::rebalance_interval).
    pub fn rebalance_interval(mut self, d: Duration) -> Self {
        self.rebalance_interval = d;
        self
    }

    /// Sets [`down_margin`](Self::down_margin).
    pub fn down_margin(mut self, d: Duration) -> Self {
        self.down_margin = d;
        self
    }

    /// Sets [`role`](Self::role): only members with `role` host the type.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }

    /// Sets [`remember_entities`](Self::remember_entities).
    pub fn remember_entities(mut self, on: bool) -> Self {
        self.remember_entities = on;
        self
    }

    /// Sets [`remembered_start`](Self::remembered_start).
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use std::time::Duration;
    /// use shardik_sharding::cluster::{ClusterShardingSettings, RememberedStart};
    /// // Per shard: 5 remembered entities every 100 ms (Akka's constant recovery strategy).
    /// let settings = ClusterShardingSettings::default()
    ///     .remember_entities(true)
    ///     .remembered_start(RememberedStart::Constant {
    ///         entities: NonZeroUsize::new(5).unwrap(),
    ///         every: Duration::from_millis(100),
    ///     });
    /// # let _ = settings;
    /// ```
    pub fn remembered_start(mut self, start: RememberedStart) -> Self {
        self.remembered_start = start;
        self
    }

    /// Sets [`min_quorum`](Self::min_quorum).
    pub fn min_quorum(mut self, n: usize) -> Self {
        self.min_quorum = n;
        self
    }

    /// Sets [`entity_stop_timeout`](Self::entity_stop_timeout).
    pub fn entity_stop_timeout(mut self, d: Duration) -> Self {
        self.entity_stop_timeout = d;
        self
    }

    /// Sets [`buffer_limit`](Self::buffer_limit).
    pub fn buffer_limit(mut self, n: usize) -> Self {
        self.buffer_limit = n;
        self
    }

    /// Sets [`allocation_strategy`](Self::allocation_strategy).
    ///
    /// ```
    /// use shardik_sharding::cluster::ClusterShardingSettings;
    /// use shardik_sharding::coordination::LocalFirst;
    /// let settings = ClusterShardingSettings::default().allocation_strategy(LocalFirst);
    /// # let _ = settings;
    /// ```
    pub fn allocation_strategy(mut self, strategy: impl AllocationStrategy) -> Self {
        self.allocation_strategy = Arc::new(strategy);
        self
    }

    /// The longest duration a setting takes (longer ones would overflow the clock).
    pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

    /// What is wrong with these settings, if anything: the periods that drive retries and
    /// timeouts (and `rebalance_interval`, `entity_stop_timeout`) must be at least a
    /// millisecond (the cluster layer counts in whole milliseconds, and a zero `tick` would
    /// stop its tasks), `handoff_ack_timeout` at least twice `tick` (the coordinator checks
    /// it on its tick: a shorter one aborts every hand-off whose acknowledgements take a
    /// tick, and a graceful leave then never finishes), no duration above
    /// [`MAX_DURATION`](Self::MAX_DURATION), a buffer of at least one message and a quorum
    /// of at least one member. Checked when the type starts
    /// ([`ShardingError::InvalidSettings`](crate::ShardingError::InvalidSettings)).
    ///
    /// A `min_quorum` above the number of members with the type's role cannot be seen here:
    /// the type then has no coordinator, which the node that would run it logs as a warning
    /// once it has waited 10 s, and every 30 s after that.
    pub fn problem(&self) -> Option<String> {
        let periods = [
            ("tick", self.tick),
            ("retry_interval", self.retry_interval),
            ("rebalance_interval", self.rebalance_interval),
            ("handoff_ack_timeout", self.handoff_ack_timeout),
            ("handoff_stop_retry", self.handoff_stop_retry),
            ("entity_stop_timeout", self.entity_stop_timeout),
            ("replication_timeout", self.replication_timeout),
        ];
        if let Some((name, d)) = periods.iter().find(|(_, d)| *d < Duration::from_millis(1)) {
            return Some(format!("{name} is {d:?}; it must be at least 1 ms"));
        }
        if self.handoff_ack_timeout < self.tick.saturating_mul(2) {
            return Some(format!(
                "handoff_ack_timeout is {:?}; it must be at least twice tick ({:?}): the \
                 coordinator checks it on its tick, and a shorter one aborts every hand-off \
                 whose acknowledgements take a tick (a graceful leave would never finish)",
                self.handoff_ack_timeout, self.tick
            ));
        }
        let mut all = periods.to_vec();
        all.push(("down_margin", self.down_margin));
        if let RememberedStart::Constant { every, .. } = self.remembered_start {
            if every < Duration::from_millis(1) {
                return Some(format!(
                    "remembered_start's step is {every:?}; it must be at least 1 ms"
                ));
            }
            all.push(("remembered_start's step", every));
        }
        if let Some((name, d)) = all.iter().find(|(_, d)| *d > Self::MAX_DURATION) {
            return Some(format!(
                "{name} is {d:?}; it must be at most {:?}",
                Self::MAX_DURATION
            ));
        }
        if self.buffer_limit == 0 {
            return Some(
                "buffer_limit is 0: every message for a moving shard would be refused".into(),
            );
        }
        if self.min_quorum == 0 {
            return Some("min_quorum is 0; it must be at least 1".into());
        }
        None
    }

    pub(crate) fn coordinator_config(&self, shard_count: u32) -> CoordinatorConfig {
        let mut c = CoordinatorConfig::new(shard_count);
        c.rebalance_interval_ms = self.rebalance_interval.as_millis() as u64;
        c.handoff_ack_timeout_ms = self.handoff_ack_timeout.as_millis() as u64;
        c.handoff_stop_retry_ms = self.handoff_stop_retry.as_millis() as u64;
        c.remember_shards = self.remember_entities;
        c.allocation_strategy = self.allocation_strategy.clone();
        c
    }

    pub(crate) fn region_config(&self, shard_count: u32) -> RegionConfig {
        let mut c = RegionConfig::new(shard_count);
        c.retry_interval_ms = self.retry_interval.as_millis() as u64;
        c.stop_timeout_ms = self.entity_stop_timeout.as_millis() as u64;
        c.buffer_limit = self.buffer_limit;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings that would stop the type's tasks (a zero `tick` panics tokio's interval in
    /// them, after `start_with` returned), refuse every buffered message or overflow the
    /// clock are refused with the setting named.
    #[test]
    fn out_of_range_settings_are_named() {
        let base = ClusterShardingSettings::default;
        assert_eq!(base().problem(), None);
        let cases: Vec<(ClusterShardingSettings, &str)> = vec![
            (
                ClusterShardingSettings {
                    tick: Duration::ZERO,
                    ..base()
                },
                "tick",
            ),
            (
                ClusterShardingSettings {
                    replication_timeout: Duration::from_micros(500),
                    ..base()
                },
                "replication_timeout",
            ),
            (
                base().rebalance_interval(Duration::MAX),
                "rebalance_interval",
            ),
            (base().buffer_limit(0), "buffer_limit"),
            (base().min_quorum(0), "min_quorum"),
            (
                base().remembered_start(RememberedStart::Constant {
                    entities: NonZeroUsize::new(1).unwrap(),
                    every: Duration::ZERO,
                }),
                "remembered_start",
            ),
        ];
        for (settings, name) in cases {
            let problem = settings.problem().expect(name);
            assert!(problem.starts_with(name), "{problem}");
        }
        assert_eq!(base().down_margin(Duration::ZERO).problem(), None);
    }

    /// Settings that were accepted silently though they make no sense (found by an audit on
    /// 2026-11-30): a zero rebalance interval or entity stop timeout, and a hand-off ack
    /// timeout that ends before the coordinator's next tick but one (every hand-off whose
    /// acknowledgements take a tick would be aborted, and a leave would never finish).
    #[test]
    fn settings_that_make_no_sense_are_named() {
        let base = ClusterShardingSettings::default;
        let ack = |d: Duration| ClusterShardingSettings {
            handoff_ack_timeout: d,
            ..base()
        };
        let cases: Vec<(ClusterShardingSettings, &str)> = vec![
            (
                base().rebalance_interval(Duration::ZERO),
                "rebalance_interval",
            ),
            (
                base().entity_stop_timeout(Duration::ZERO),
                "entity_stop_timeout",
            ),
            (ack(Duration::from_millis(199)), "handoff_ack_timeout"),
            (
                ClusterShardingSettings {
                    tick: Duration::from_secs(6),
                    ..base()
                },
                "handoff_ack_timeout",
            ),
        ];
        for (settings, name) in cases {
            let problem = settings.problem().expect(name);
            assert!(problem.starts_with(name), "{problem}");
            assert!(problem.contains("must be"), "{problem}");
        }
        assert_eq!(ack(Duration::from_millis(200)).problem(), None);
    }
}
