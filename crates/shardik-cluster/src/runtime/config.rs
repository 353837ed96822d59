//! [`ClusterConfig`]: what a node needs to run in a cluster.

use std::collections::BTreeSet;
use std::time::Duration;

use shardik_actor::wire::PayloadFormat;
use shardik_remote::{FaultInjector, RemoteConfig, TlsConfig};

use crate::downing::{DowningConfig, Strategy};
use crate::member::UniqueAddress;
use crate::node::NodeConfig;
use crate::phi::PhiConfig;

/// Settings of one cluster node. Build with [`ClusterConfig::new`] and the setters; every
/// node of a cluster runs with the same settings except its node id and address.
///
/// The transport settings (bind and advertised address, shared secret, TLS, queue sizes,
/// fault injection for tests) live in the embedded [`RemoteConfig`]; the cluster name is the
/// one the remote handshake checks, so nodes of another cluster are refused before any
/// message is read.
///
/// ```
/// use std::time::Duration;
/// use shardik_cluster::runtime::ClusterConfig;
///
/// let cfg = ClusterConfig::new("orders", "node-1")
///     .bind("0.0.0.0:2552")
///     .advertise("10.0.0.5:2552")
///     .secret(b"a long random shared secret, 32+ bytes".to_vec())
///     .seed_nodes(["10.0.0.5:2552", "10.0.0.6:2552", "10.0.0.7:2552"])
///     .role("backend")
///     .acceptable_heartbeat_pause(Duration::from_secs(3)); // a busier network: slower, safer
/// cfg.validate().unwrap();
/// ```
///
/// Its `Debug` output never shows the shared secret: the secret lives only in the embedded
/// [`RemoteConfig`], whose `Debug` prints its length instead of its bytes.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Transport settings; `remote.cluster` is the cluster name, `remote.node_id` the node id.
    pub remote: RemoteConfig,
    /// This node's roles.
    pub roles: BTreeSet<String>,
    /// Addresses (`host:port`, as advertised) of the seed nodes, the same list on every node.
    /// The first one forms a new cluster when none of the others answers (see
    /// [`Cluster::start`](super::Cluster::start)); an empty list makes this node form a
    /// cluster of its own at once.
    pub seed_nodes: Vec<String>,
    /// How long the first seed node waits for another seed to answer before it forms a new
    /// cluster (default 5 s, Akka's `seed-node-timeout`). Seeds that answer "not a member"
    /// shorten the wait: once all have, it forms at once.
    pub seed_timeout: Duration,
    /// How often the membership state machine ticks (default 100 ms): gossip rounds,
    /// failure-detector checks, leader actions and downing decisions are taken on ticks.
    pub tick_interval: Duration,
    /// How often heartbeats are sent to the nodes that monitor this one (default 250 ms,
    /// twice as often as the core's 500 ms example: a crashed node's last heartbeat is then
    /// at most 250 ms old, which keeps crash-to-`Down` under 5 s in the worst case; see
    /// `docs/cluster.md`). [`ClusterConfig::heartbeat_interval`] also sets the detector's
    /// first estimate.
    pub heartbeat_interval: Duration,
    /// How often a gossip round runs (default 1 s).
    pub gossip_interval: Duration,
    /// How often join requests are retried while joining (default 1 s).
    pub join_retry: Duration,
    /// The phi accrual failure detector (default: threshold 8, 1.5 s acceptable pause,
    /// 100 ms minimum standard deviation, 1000 samples, first estimate = the heartbeat
    /// interval).
    pub phi: PhiConfig,
    /// How many peers monitor each node (default 9).
    pub monitored_by: usize,
    /// The split brain resolver (default keep-majority after 2 s of stability).
    pub downing: DowningConfig,
    /// Move joining members to `WeaklyUp` after this long without convergence (default 7 s;
    /// `None`: never).
    pub weakly_up_after: Option<Duration>,
    /// Also shut the actor system down when this node leaves the cluster (left, downed,
    /// removed). Default `false`: the cluster layer and remoting stop, local actors go on.
    pub stop_system_on_exit: bool,
    /// How long a removed incarnation (each restart, each leave, each downed node) is kept as
    /// a tombstone in the gossip (default 24 h, Akka's `prune-gossip-tombstones-after`; at
    /// least 1 min). While it is kept, no gossip, however stale, brings the incarnation back;
    /// then the leader drops it at a convergence, so churn does not grow the gossip for good.
    /// Keep it far above the longest a gossip can be delayed: a state from before the
    /// removal that arrives after the tombstone is gone can bring the incarnation back (see
    /// `docs/cluster.md`, *Tuning*). Removal times are wall-clock times: keep the nodes'
    /// clocks within a fraction of this (a node whose clock is behind the leader's by more
    /// than half of it merges dropped tombstones back in until its clock catches up).
    pub prune_tombstones_after: Duration,
}

/// Why a [`ClusterConfig`] was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The cluster name is empty.
    #[error("the cluster name must not be empty")]
    EmptyClusterName,
    /// The node id is empty.
    #[error("the node id must not be empty")]
    EmptyNodeId,
    /// A seed node address is not `host:port`.
    #[error("seed node address {0:?} is not host:port")]
    BadSeedAddress(String),
    /// A seed node appears twice.
    #[error("seed node {0:?} is listed twice")]
    DuplicateSeed(String),
    /// An interval that must be positive is zero, or below the millisecond the cluster
    /// layer counts in (it would be zero there).
    #[error("{0} must be at least 1 ms")]
    ZeroDuration(&'static str),
    /// The tick must be at most the heartbeat and gossip intervals.
    #[error("tick_interval ({tick:?}) must not exceed heartbeat_interval and gossip_interval")]
    TickTooSlow {
        /// The tick interval.
        tick: Duration,
    },
    /// The phi threshold must be a positive number.
    #[error("the phi threshold must be a positive number, not {0}")]
    BadPhiThreshold(f64),
    /// The failure detector must keep at least one sample.
    #[error("phi max_sample_size must be at least 1")]
    NoSamples,
    /// The acceptable pause must be at least [`ClusterConfig::MIN_PAUSE_HEARTBEATS`] heartbeat intervals:
    /// a watched peer silent for the pause counts as lost for fencing (`fence_after` is the
    /// pause), so with a pause of about one interval a single late heartbeat would fence the
    /// node and stop its shards and singletons.
    #[error(
        "acceptable_heartbeat_pause ({pause:?}) must be at least 3 × heartbeat_interval \
         ({heartbeat:?}): one late heartbeat would otherwise fence the node"
    )]
    PauseShorterThanHeartbeat {
        /// The acceptable pause.
        pause: Duration,
        /// The heartbeat interval.
        heartbeat: Duration,
    },
    /// At least one peer must monitor each node.
    #[error("monitored_by must be at least 1")]
    NoMonitors,
    /// A duration is longer than [`ClusterConfig::MAX_DURATION`] (one day): deadlines are computed as
    /// `now + duration`, and a near-`Duration::MAX` value would overflow them.
    #[error("{name} ({value:?}) must be at most 24 h")]
    TooLong {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: Duration,
    },
    /// A static quorum of zero.
    #[error("the static quorum size must be at least 1")]
    ZeroQuorum,
    /// Tombstones kept for less than a minute could let gossip that was merely delayed
    /// bring a removed incarnation back.
    #[error("prune_tombstones_after ({0:?}) must be at least 1 min")]
    TombstonesPrunedTooSoon(Duration),
    /// The remote layer's idle timeout would close connections between heartbeats.
    #[error("the remote idle_timeout ({idle:?}) must exceed heartbeat_interval ({heartbeat:?})")]
    IdleTimeoutTooShort {
        /// The remote idle timeout.
        idle: Duration,
        /// The cluster heartbeat interval.
        heartbeat: Duration,
    },
    /// The remote layer's payload format is not the default MessagePack: the cluster's own
    /// messages (gossip, reachability, sharding's coordinator state) have maps keyed by
    /// structs, which JSON cannot encode, so no cluster could form.
    #[error(
        "the cluster layer needs the default MessagePack payload format, not {0:?}: its gossip \
         has maps keyed by structs, which that format cannot encode (keep \
         RemoteConfig::payload_format at its default; JSON is for remoting without the cluster)"
    )]
    UnsupportedPayloadFormat(String),
}

impl ClusterConfig {
    /// The longest any duration of the configuration may be (one day), except
    /// `prune_tombstones_after`, which has no upper bound (it is only ever subtracted from,
    /// saturating); [`validate`](Self::validate) refuses a longer one.
    pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

    /// The acceptable heartbeat pause must be at least this many heartbeat intervals (see
    /// [`ConfigError::PauseShorterThanHeartbeat`]).
    pub const MIN_PAUSE_HEARTBEATS: u32 = 3;

    /// A node `node_id` of cluster `cluster`, listening on `127.0.0.1:0`, with no seed nodes,
    /// no secret and the defaults documented on each field.
    pub fn new(cluster: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self::with_remote(RemoteConfig::new(cluster, node_id))
    }

    /// A configuration on top of a prepared [`RemoteConfig`] (its node id and cluster name
    /// are used), with the cluster defaults.
    pub fn with_remote(remote: RemoteConfig) -> Self {
        let core = NodeConfig::new(UniqueAddress::new("", "", 0));
        ClusterConfig {
            remote,
            roles: BTreeSet::new(),
            seed_nodes: Vec::new(),
            seed_timeout: Duration::from_secs(5),
            tick_interval: Duration::from_millis(100),
            heartbeat_interval: Duration::from_millis(250),
            gossip_interval: core.gossip_interval,
            join_retry: core.join_retry,
            phi: PhiConfig {
                first_heartbeat_estimate: Duration::from_millis(250),
                ..core.phi
            },
            monitored_by: core.monitored_by,
            downing: core.downing,
            weakly_up_after: core.weakly_up_after,
            stop_system_on_exit: false,
            prune_tombstones_after: core.prune_tombstones_after,
        }
    }

    /// The cluster name.
    pub fn cluster_name(&self) -> &str {
        &self.remote.cluster
    }

    /// The node id.
    pub fn node_id(&self) -> &str {
        &self.remote.node_id
    }

    /// Sets the listen address (port 0 picks a free port).
    pub fn bind(mut self, addr: impl Into<String>) -> Self {
        self.remote.bind = addr.into();
        self
    }

    /// Sets the address other nodes reach this one at (default: the bound address).
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.remote.advertise = Some(addr.into());
        self
    }

    /// Sets the shared secret of the handshake (use 32+ random bytes, the same everywhere).
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.remote = self.remote.secret(secret);
        self
    }

    /// Turns on mutual TLS.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.remote = self.remote.tls(tls);
        self
    }

    /// Installs a fault injector shared with the other nodes of a test.
    pub fn faults(mut self, faults: FaultInjector) -> Self {
        self.remote = self.remote.faults(faults);
        self
    }

    /// Replaces the transport settings (node id and cluster name included), except those
    /// that `remote` leaves unset and that were set on this configuration before (with
    /// [`bind`](Self::bind), [`advertise`](Self::advertise), [`secret`](Self::secret),
    /// [`tls`](Self::tls) or [`faults`](Self::faults)): those are kept, so the order of the
    /// setters does not matter. Unset means `None` for the advertised address, secret, TLS
    /// and fault injector, and the default `127.0.0.1:0` for the bind address; a value set on
    /// `remote` wins.
    pub fn remote(mut self, remote: RemoteConfig) -> Self {
        let before = std::mem::replace(&mut self.remote, remote);
        let r = &mut self.remote;
        if r.bind == RemoteConfig::new("", "").bind {
            r.bind = before.bind;
        }
        r.advertise = r.advertise.take().or(before.advertise);
        r.secret = r.secret.take().or(before.secret);
        r.tls = r.tls.take().or(before.tls);
        r.faults = r.faults.take().or(before.faults);
        self
    }

    /// Adds a role.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.roles.insert(role.into());
        self
    }

    /// Sets the seed node addresses.
    pub fn seed_nodes<I, S>(mut self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.seed_nodes = seeds.into_iter().map(Into::into).collect();
        self
    }

    /// Sets how long the first seed waits for the others before forming a cluster.
    pub fn seed_timeout(mut self, d: Duration) -> Self {
        self.seed_timeout = d;
        self
    }

    /// Sets the tick interval of the membership state machine.
    pub fn tick_interval(mut self, d: Duration) -> Self {
        self.tick_interval = d;
        self
    }

    /// Sets the heartbeat interval (also the detector's first estimate).
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.heartbeat_interval = d;
        self.phi.first_heartbeat_estimate = d;
        self
    }

    /// Sets the gossip interval.
    pub fn gossip_interval(mut self, d: Duration) -> Self {
        self.gossip_interval = d;
        self
    }

    /// Sets the join retry interval.
    pub fn join_retry(mut self, d: Duration) -> Self {
        self.join_retry = d;
        self
    }

    /// Sets the phi threshold.
    pub fn phi_threshold(mut self, threshold: f64) -> Self {
        self.phi.threshold = threshold;
        self
    }

    /// Sets the pause the failure detector tolerates on top of the mean heartbeat interval
    /// (at least [`MIN_PAUSE_HEARTBEATS`](Self::MIN_PAUSE_HEARTBEATS) heartbeat intervals:
    /// it is also how long a watched peer may be silent before it counts as lost for
    /// fencing).
    pub fn acceptable_heartbeat_pause(mut self, d: Duration) -> Self {
        self.phi.acceptable_heartbeat_pause = d;
        self
    }

    /// Sets the failure detector's minimum standard deviation.
    pub fn min_std_deviation(mut self, d: Duration) -> Self {
        self.phi.min_std_deviation = d;
        self
    }

    /// Sets how many heartbeat intervals the failure detector keeps.
    pub fn max_sample_size(mut self, n: usize) -> Self {
        self.phi.max_sample_size = n;
        self
    }

    /// Sets how many peers monitor each node.
    pub fn monitored_by(mut self, n: usize) -> Self {
        self.monitored_by = n;
        self
    }

    /// Sets the downing strategy.
    pub fn downing_strategy(mut self, strategy: Strategy) -> Self {
        self.downing.strategy = strategy;
        self
    }

    /// Sets how long membership must be stable before the split brain resolver decides
    /// (at least 1 ms).
    pub fn stable_after(mut self, d: Duration) -> Self {
        self.downing.stable_after = d;
        self
    }

    /// Sets how long past `stable_after` a reachability picture that keeps changing may go
    /// undecided before every member is downed (at least 1 ms), or turns that off with `None` (see
    /// [`DowningConfig::down_all_when_unstable`]; off by default).
    /// [`DowningConfig::akka_unstable_bound`] gives Akka's default bound.
    pub fn down_all_when_unstable(mut self, d: Option<Duration>) -> Self {
        self.downing.down_all_when_unstable = d;
        self
    }

    /// Counts only members with this role in downing decisions.
    pub fn downing_role(mut self, role: impl Into<String>) -> Self {
        self.downing.role = Some(role.into());
        self
    }

    /// Sets (or turns off) the weakly-up delay.
    pub fn weakly_up_after(mut self, d: Option<Duration>) -> Self {
        self.weakly_up_after = d;
        self
    }

    /// Also shut the actor system down when this node leaves the cluster.
    ///
    /// The node reports itself stopped (what [`Cluster::leave`](super::Cluster::leave) and
    /// the other waits on the stop return on) only once the system has shut down, and the
    /// shutdown waits for every actor's current message. So with this set, do not await
    /// `leave` (or anything else that waits for the node to stop) inside a handler of an
    /// actor of this system: the two would wait for each other for good. Send the leave to a
    /// task of its own (`tokio::spawn`) instead.
    pub fn stop_system_on_exit(mut self, yes: bool) -> Self {
        self.stop_system_on_exit = yes;
        self
    }

    /// Sets how long removed incarnations are kept as tombstones (default 24 h).
    pub fn prune_tombstones_after(mut self, d: Duration) -> Self {
        self.prune_tombstones_after = d;
        self
    }

    /// Checks the settings; [`Cluster::start`](super::Cluster::start) does it too. The
    /// transport settings are checked by the remote layer when it starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.remote.cluster.is_empty() {
            return Err(ConfigError::EmptyClusterName);
        }
        if self.remote.node_id.is_empty() {
            return Err(ConfigError::EmptyNodeId);
        }
        let mut seen = BTreeSet::new();
        for s in &self.seed_nodes {
            let ok = s
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err(ConfigError::BadSeedAddress(s.clone()));
            }
            if !seen.insert(s) {
                return Err(ConfigError::DuplicateSeed(s.clone()));
            }
        }
        // Zero is refused too for `stable_after` (the resolver would decide on the first
        // flag, before the other side's picture could match) and for
        // `down_all_when_unstable` (every partition would down the whole cluster instead of
        // being decided).
        let at_least_1ms = [
            ("seed_timeout", self.seed_timeout),
            ("tick_interval", self.tick_interval),
            ("heartbeat_interval", self.heartbeat_interval),
            ("gossip_interval", self.gossip_interval),
            ("join_retry", self.join_retry),
            (
                "first_heartbeat_estimate",
                self.phi.first_heartbeat_estimate,
            ),
            ("min_std_deviation", self.phi.min_std_deviation),
            ("stable_after", self.downing.stable_after),
        ]
        .into_iter()
        .chain(
            self.downing
                .down_all_when_unstable
                .map(|d| ("down_all_when_unstable", d)),
        );
        for (name, d) in at_least_1ms.clone() {
            if d < Duration::from_millis(1) {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        let bounded = at_least_1ms
            .chain([(
                "acceptable_heartbeat_pause",
                self.phi.acceptable_heartbeat_pause,
            )])
            .chain(self.weakly_up_after.map(|d| ("weakly_up_after", d)));
        for (name, value) in bounded {
            if value > Self::MAX_DURATION {
                return Err(ConfigError::TooLong { name, value });
            }
        }
        if self.tick_interval > self.heartbeat_interval || self.tick_interval > self.gossip_interval
        {
            return Err(ConfigError::TickTooSlow {
                tick: self.tick_interval,
            });
        }
        if !(self.phi.threshold.is_finite() && self.phi.threshold > 0.0) {
            return Err(ConfigError::BadPhiThreshold(self.phi.threshold));
        }
        if self.phi.max_sample_size == 0 {
            return Err(ConfigError::NoSamples);
        }
        if self.phi.acceptable_heartbeat_pause
            < self.heartbeat_interval * Self::MIN_PAUSE_HEARTBEATS
        {
            return Err(ConfigError::PauseShorterThanHeartbeat {
                pause: self.phi.acceptable_heartbeat_pause,
                heartbeat: self.heartbeat_interval,
            });
        }
        if self.prune_tombstones_after < Duration::from_secs(60) {
            return Err(ConfigError::TombstonesPrunedTooSoon(
                self.prune_tombstones_after,
            ));
        }
        if self.monitored_by == 0 {
            return Err(ConfigError::NoMonitors);
        }
        if self.downing.strategy == (Strategy::StaticQuorum { quorum_size: 0 }) {
            return Err(ConfigError::ZeroQuorum);
        }
        if self.remote.idle_timeout <= self.heartbeat_interval {
            return Err(ConfigError::IdleTimeoutTooShort {
                idle: self.remote.idle_timeout,
                heartbeat: self.heartbeat_interval,
            });
        }
        let format = self.remote.payload_format.name();
        if format != PayloadFormat::message_pack().name() {
            return Err(ConfigError::UnsupportedPayloadFormat(format.to_string()));
        }
        Ok(())
    }

    /// The settings of the membership state machine for `self_node`.
    pub fn node_config(&self, self_node: UniqueAddress) -> NodeConfig {
        let mut c = NodeConfig::new(self_node);
        c.roles = self.roles.clone();
        c.gossip_interval = self.gossip_interval;
        c.join_retry = self.join_retry;
        c.seed_node_timeout = self.seed_timeout;
        c.phi = self.phi.clone();
        c.monitored_by = self.monitored_by;
        c.downing = self.downing.clone();
        // Fenced after a silence the detector tolerates, i.e. before it can suspect anyone.
        c.fence_after = self.phi.acceptable_heartbeat_pause;
        c.weakly_up_after = self.weakly_up_after;
        c.prune_tombstones_after = self.prune_tombstones_after;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_core() {
        let c = ClusterConfig::new("c", "n");
        c.validate().unwrap();
        let core = NodeConfig::new(UniqueAddress::new("h:1", "n", 1));
        let n = c.node_config(UniqueAddress::new("h:1", "n", 1));
        // Only the heartbeat is faster than the core's example (250 ms instead of 500 ms).
        assert_eq!(
            n.phi,
            PhiConfig {
                first_heartbeat_estimate: Duration::from_millis(250),
                ..core.phi
            }
        );
        assert_eq!(n.downing, core.downing);
        assert_eq!(n.gossip_interval, core.gossip_interval);
        assert_eq!(n.join_retry, core.join_retry);
        assert_eq!(n.monitored_by, core.monitored_by);
        assert_eq!(n.weakly_up_after, core.weakly_up_after);
        assert_eq!(c.heartbeat_interval, n.phi.first_heartbeat_estimate);
    }

    #[test]
    fn bad_settings_are_refused_with_a_clear_error() {
        let c = || ClusterConfig::new("c", "n");
        assert_eq!(
            ClusterConfig::new("", "n").validate(),
            Err(ConfigError::EmptyClusterName)
        );
        assert_eq!(
            ClusterConfig::new("c", "").validate(),
            Err(ConfigError::EmptyNodeId)
        );
        assert_eq!(
            c().seed_nodes(["localhost"]).validate(),
            Err(ConfigError::BadSeedAddress("localhost".into()))
        );
        assert_eq!(
            c().seed_nodes(["h:1", "h:1"]).validate(),
            Err(ConfigError::DuplicateSeed("h:1".into()))
        );
        assert_eq!(
            c().tick_interval(Duration::ZERO).validate(),
            Err(ConfigError::ZeroDuration("tick_interval"))
        );
        // Counted in whole milliseconds: a standard deviation of 0 ms made phi a hard
        // timeout, NaN exactly at the mean.
        assert_eq!(
            c().min_std_deviation(Duration::from_micros(500)).validate(),
            Err(ConfigError::ZeroDuration("min_std_deviation"))
        );
        assert!(matches!(
            c().tick_interval(Duration::from_secs(2)).validate(),
            Err(ConfigError::TickTooSlow { .. })
        ));
        assert_eq!(
            c().phi_threshold(f64::NAN)
                .validate()
                .unwrap_err()
                .to_string(),
            "the phi threshold must be a positive number, not NaN"
        );
        assert!(matches!(
            c().acceptable_heartbeat_pause(Duration::from_millis(100))
                .validate(),
            Err(ConfigError::PauseShorterThanHeartbeat { .. })
        ));
        assert_eq!(c().monitored_by(0).validate(), Err(ConfigError::NoMonitors));
        assert_eq!(
            c().prune_tombstones_after(Duration::from_secs(59))
                .validate()
                .unwrap_err()
                .to_string(),
            "prune_tombstones_after (59s) must be at least 1 min"
        );
        c().prune_tombstones_after(Duration::MAX)
            .validate()
            .unwrap();
        assert_eq!(
            c().downing_strategy(Strategy::StaticQuorum { quorum_size: 0 })
                .validate(),
            Err(ConfigError::ZeroQuorum)
        );
        assert!(matches!(
            c().heartbeat_interval(Duration::from_secs(10))
                .acceptable_heartbeat_pause(Duration::from_secs(30))
                .validate(),
            Err(ConfigError::IdleTimeoutTooShort { .. })
        ));
        c().seed_nodes(["10.0.0.1:2552", "[::1]:2552"])
            .validate()
            .unwrap();
    }

    /// A pause of one or two heartbeat intervals was accepted: `fence_after` is the pause,
    /// so one late heartbeat fenced the node.
    #[test]
    fn a_pause_shorter_than_three_heartbeats_is_refused() {
        let c = |pause_ms: u64| {
            ClusterConfig::new("c", "n")
                .heartbeat_interval(Duration::from_millis(500))
                .acceptable_heartbeat_pause(Duration::from_millis(pause_ms))
                .validate()
        };
        for pause in [500, 1_000, 1_499] {
            assert_eq!(
                c(pause),
                Err(ConfigError::PauseShorterThanHeartbeat {
                    pause: Duration::from_millis(pause),
                    heartbeat: Duration::from_millis(500),
                })
            );
        }
        assert_eq!(
            c(500).unwrap_err().to_string(),
            "acceptable_heartbeat_pause (500ms) must be at least 3 × heartbeat_interval \
             (500ms): one late heartbeat would otherwise fence the node"
        );
        c(1_500).unwrap();
    }

    /// `stable_after` 0 made the resolver decide on the first flag, and
    /// `down_all_when_unstable` 0 downed the whole cluster on every partition; both were
    /// accepted.
    #[test]
    fn zero_stable_after_and_zero_unstable_bound_are_refused() {
        let c = || ClusterConfig::new("c", "n");
        assert_eq!(
            c().stable_after(Duration::ZERO).validate(),
            Err(ConfigError::ZeroDuration("stable_after"))
        );
        assert_eq!(
            c().down_all_when_unstable(Some(Duration::ZERO))
                .validate()
                .unwrap_err()
                .to_string(),
            "down_all_when_unstable must be at least 1 ms"
        );
        c().down_all_when_unstable(None).validate().unwrap();
        c().down_all_when_unstable(Some(Duration::from_secs(4)))
            .validate()
            .unwrap();
    }

    /// `Duration::MAX` (or anything near it) was accepted, and the driver computed its
    /// deadlines as `now + duration`: a panic in debug builds, a wrapped deadline (a second
    /// cluster formed at once) in release builds.
    /// JSON cannot encode the gossip's struct-keyed maps: before, a cluster configured with it
    /// started, sent its joins, and then failed to encode every gossip message, so no
    /// cluster ever formed and nothing said why.
    #[test]
    fn a_payload_format_other_than_message_pack_is_refused() {
        let mut c = ClusterConfig::new("c", "n");
        c.validate().unwrap();
        c.remote.payload_format = shardik_remote::JsonCodec::format();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::UnsupportedPayloadFormat(f)) if f == "json"
        ));
    }

    #[test]
    fn durations_beyond_a_day_are_refused() {
        type Set = fn(ClusterConfig, Duration) -> ClusterConfig;
        let setters: [(&str, Set); 11] = [
            ("seed_timeout", |c, d| c.seed_timeout(d)),
            // Refused for its length before anything compares it with other settings.
            ("tick_interval", |c, d| c.tick_interval(d)),
            ("heartbeat_interval", |c, d| c.heartbeat_interval(d)),
            ("gossip_interval", |c, d| c.gossip_interval(d)),
            ("join_retry", |c, d| c.join_retry(d)),
            ("min_std_deviation", |c, d| c.min_std_deviation(d)),
            ("stable_after", |c, d| c.stable_after(d)),
            ("down_all_when_unstable", |c, d| {
                c.down_all_when_unstable(Some(d))
            }),
            ("acceptable_heartbeat_pause", |c, d| {
                c.acceptable_heartbeat_pause(d)
            }),
            ("weakly_up_after", |c, d| c.weakly_up_after(Some(d))),
            ("first_heartbeat_estimate", |mut c, d| {
                c.phi.first_heartbeat_estimate = d;
                c
            }),
        ];
        let max = ClusterConfig::MAX_DURATION;
        for (name, set) in setters {
            for value in [max + Duration::from_millis(1), Duration::MAX] {
                let err = set(ClusterConfig::new("c", "n"), value).validate();
                assert_eq!(err, Err(ConfigError::TooLong { name, value }), "{name}");
            }
            // The bound itself is fine, as far as this setting goes (others may then refuse
            // the combination, say a tick slower than the heartbeat).
            let at_max = set(ClusterConfig::new("c", "n"), max).validate();
            assert!(
                !matches!(at_max, Err(ConfigError::TooLong { .. })),
                "{name}: {at_max:?}"
            );
        }
        assert_eq!(
            ClusterConfig::new("c", "n")
                .seed_timeout(Duration::MAX)
                .validate()
                .unwrap_err()
                .to_string(),
            format!("seed_timeout ({:?}) must be at most 24 h", Duration::MAX)
        );
        // A whole setup at the bound works (the remote idle timeout must exceed the
        // heartbeat, and the pause be three of them: both within their own bounds).
        let mut slow = ClusterConfig::new("c", "n")
            .heartbeat_interval(Duration::from_secs(3600))
            .acceptable_heartbeat_pause(Duration::from_secs(3 * 3600))
            .tick_interval(Duration::from_secs(3600))
            .gossip_interval(Duration::from_secs(3600))
            .seed_timeout(max)
            .stable_after(max)
            .weakly_up_after(Some(max));
        slow.remote = slow
            .remote
            .heartbeat(Duration::from_secs(1), Duration::from_secs(7200));
        slow.validate().unwrap();
    }

    /// `seed_timeout` was never copied into the core's settings.
    #[test]
    fn node_config_takes_the_seed_timeout() {
        let c = ClusterConfig::new("c", "n").seed_timeout(Duration::from_millis(1234));
        let n = c.node_config(UniqueAddress::new("h:1", "n", 1));
        assert_eq!(n.seed_node_timeout, Duration::from_millis(1234));
    }

    /// A `TlsConfig` from a throwaway self-signed certificate (DNS name `node`); nothing
    /// connects with it.
    fn test_tls() -> TlsConfig {
        let ck = rcgen::generate_simple_self_signed(vec!["node".to_string()]).unwrap();
        let cert = ck.cert.pem();
        TlsConfig::from_pem(
            cert.as_bytes(),
            ck.key_pair.serialize_pem().as_bytes(),
            cert.as_bytes(),
            "node",
        )
        .unwrap()
    }

    /// `remote()` replaced the whole transport configuration: called after `bind`,
    /// `advertise`, `secret`, `tls` or `faults`, it dropped them silently.
    #[test]
    fn remote_keeps_transport_settings_set_before_unless_it_sets_them() {
        let secret = b"a long random shared secret, 32+ bytes".to_vec();
        let c = ClusterConfig::new("c", "n")
            .bind("0.0.0.0:2552")
            .advertise("10.0.0.5:2552")
            .secret(secret.clone())
            .tls(test_tls())
            .faults(FaultInjector::new())
            .remote(RemoteConfig::new("orders", "node-7").outbound_queue(7));
        let r = &c.remote;
        assert_eq!(
            (r.cluster.as_str(), r.node_id.as_str()),
            ("orders", "node-7")
        );
        assert_eq!(r.outbound_queue, 7);
        assert_eq!(r.bind, "0.0.0.0:2552");
        assert_eq!(r.advertise.as_deref(), Some("10.0.0.5:2552"));
        assert_eq!(r.secret.as_deref(), Some(&secret[..]));
        assert!(r.tls.is_some());
        assert!(r.faults.is_some());
        // The same settings in the other order give the same transport.
        let other_order = ClusterConfig::new("c", "n")
            .remote(RemoteConfig::new("orders", "node-7").outbound_queue(7))
            .bind("0.0.0.0:2552")
            .advertise("10.0.0.5:2552")
            .secret(secret.clone());
        assert_eq!(
            (&other_order.remote.bind, &other_order.remote.advertise),
            (&r.bind, &r.advertise)
        );
        assert_eq!(other_order.remote.secret, r.secret);
        // What the given RemoteConfig sets wins.
        let c = ClusterConfig::new("c", "n")
            .bind("0.0.0.0:2552")
            .advertise("10.0.0.5:2552")
            .secret(secret)
            .remote(
                RemoteConfig::new("c", "n")
                    .bind("0.0.0.0:3000")
                    .advertise("10.0.0.6:3000")
                    .secret(b"another secret".to_vec()),
            );
        assert_eq!(c.remote.bind, "0.0.0.0:3000");
        assert_eq!(c.remote.advertise.as_deref(), Some("10.0.0.6:3000"));
        assert_eq!(c.remote.secret.as_deref(), Some(&b"another secret"[..]));
        assert!(c.remote.tls.is_none() && c.remote.faults.is_none());
    }

    #[test]
    fn debug_output_does_not_show_the_secret() {
        let c = ClusterConfig::new("c", "n").secret(b"hunter2-hunter2-hunter2".to_vec());
        let shown = format!("{c:?} {c:#?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        // Nor its bytes as numbers (a derived Debug of a byte slice).
        assert!(!shown.contains("104, 117, 110"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
