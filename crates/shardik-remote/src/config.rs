//! [`RemoteConfig`]: everything a node needs to join the network.

use std::sync::Arc;
use std::time::Duration;

use shardik_actor::wire::PayloadFormat;

use crate::codec::DEFAULT_MAX_FRAME_LEN;
use crate::fault::FaultInjector;
use crate::tls::TlsConfig;

/// Settings of one node's remote layer. Build with [`RemoteConfig::new`] and the setters.
///
/// ```
/// use std::time::Duration;
/// use shardik_remote::RemoteConfig;
/// let cfg = RemoteConfig::new("prod", "node-1")
///     .bind("0.0.0.0:2552")
///     .advertise("10.0.0.5:2552")
///     .secret(b"a long random shared secret".to_vec())
///     .outbound_queue(50_000)
///     .heartbeat(Duration::from_millis(500), Duration::from_secs(5));
/// assert_eq!(cfg.node_id, "node-1");
/// ```
///
/// Its `Debug` output shows the secret's length only, never its bytes.
#[derive(Clone)]
pub struct RemoteConfig {
    /// Human-readable node id, such as `"worker-east"`.
    pub node_id: String,
    /// Cluster name; nodes with different names refuse each other.
    pub cluster: String,
    /// Address to listen on; port 0 asks the OS for a free port (see [`crate::Remote::addr`]).
    pub bind: String,
    /// Address other nodes reach this one at; defaults to the bound address. Needed when
    /// binding to `0.0.0.0` or behind NAT: [`Remote::start`](crate::Remote::start) refuses to
    /// advertise an unspecified address (`0.0.0.0`, `[::]`) or port 0, which would make every
    /// such node claim the same unreachable address.
    pub advertise: Option<String>,
    /// Shared secret for the handshake's challenge-response. `None` authenticates nothing:
    /// anyone who can reach the port can send messages to registered actors. An empty
    /// secret is refused at start (it would authenticate nothing either, silently).
    pub secret: Option<Arc<[u8]>>,
    /// Largest frame body accepted or sent, in bytes (default 4 MiB; from 1 KiB to
    /// `u32::MAX`, checked at start). A larger incoming length prefix closes the connection;
    /// a larger outgoing message is refused at the sender.
    pub max_frame_len: usize,
    /// Capacity of the user lane toward one peer, in frames (default 100 000). When full, new
    /// messages are dropped (drop newest) and recorded as dead letters.
    pub outbound_queue: usize,
    /// Capacity of each lane toward one peer (user and control) in bytes of encoded frames
    /// waiting to be written (default 64 MiB), besides the bounds in frames. A frame that
    /// would take a non-empty lane past it is refused like one over the frame bound (drop
    /// newest: `SendError::QueueFull`, a dead letter, an ask `Undeliverable`); a frame into
    /// an empty lane is always taken, so a frame of `max_frame_len` always fits.
    pub outbound_queue_bytes: usize,
    /// Capacity of the control lane toward one peer, in frames (default 1 024). When full,
    /// new control messages are dropped like user ones.
    pub control_queue: usize,
    /// Most user frames the user connection's writer hands to one write (default 1 024).
    pub write_batch_frames: usize,
    /// Time allowed to connect and complete a handshake (default 5 s): one deadline for the
    /// TCP connect, TLS and the protocol handshake together.
    pub handshake_timeout: Duration,
    /// First reconnect delay (default 100 ms); doubled after each failure up to `backoff_max`.
    pub backoff_min: Duration,
    /// Largest reconnect delay (default 5 s).
    pub backoff_max: Duration,
    /// How long a peer may stay unreachable, every dial of a lane failing to connect, before
    /// the frames waiting in that lane's queue are dropped (default 60 s, like Akka's
    /// `give-up-message-after`; at least 1 ms). A dial the peer refuses as a duplicate counts
    /// too if no connection follows (the peer was likely dialed under another address than
    /// it advertises). They are counted in
    /// [`RemoteStats::dropped_unreachable`](crate::RemoteStats::dropped_unreachable), asks
    /// among them fail with `Undeliverable`, and the lane stops dialing until something new
    /// is sent, so a peer that is gone for good (an address a restarted node will not have
    /// again) is forgotten once nothing refers to it.
    pub give_up_message_after: Duration,
    /// Heartbeat period, on both connections of a node pair (default 1 s).
    pub heartbeat_interval: Duration,
    /// A connection that receives nothing (not even a heartbeat) for this long is closed
    /// (default 10 s).
    pub idle_timeout: Duration,
    /// A connection whose writer makes no progress for this long while it has frames to
    /// write (the peer reads nothing, although it may keep sending) is closed (default
    /// 60 s). Longer than `idle_timeout` because the kernel reports a socket writable only
    /// once a third of its send buffer has drained: on a slow link with a large (autotuned)
    /// buffer that can take many seconds while bytes flow all along. At least
    /// [`MIN_WRITE_STALL`](Self::MIN_WRITE_STALL) (1 s).
    pub write_stall_timeout: Duration,
    /// A reply slot exported in a message (a `ReplyTo`) is forgotten after this long without
    /// an answer (default 10 min, at least 1 s); asks forget theirs at their own timeout,
    /// however long that is.
    pub max_reply_wait: Duration,
    /// Kernel send and receive buffer size for every connection, in bytes (default `None`:
    /// the OS autotunes them). Smaller buffers bound how many user bytes can sit in the
    /// kernel ahead of a heartbeat (control-lane latency under a flood) at the cost of
    /// throughput on links with a large bandwidth-delay product.
    pub socket_buffer: Option<u32>,
    /// Mutual TLS for every connection (default none: plain TCP).
    pub tls: Option<TlsConfig>,
    /// Fault injection for tests (default none).
    pub faults: Option<FaultInjector>,
    /// The serde format of message and reply payloads (default MessagePack with named
    /// fields). Every node must use the same: the handshake refuses a peer whose format has
    /// another name. Frame headers and the handshake keep their compact MessagePack form.
    pub payload_format: PayloadFormat,
}

/// The secret's length in place of its bytes, so that logging a configuration
/// (`tracing::info!(?config)`) does not leak it.
struct RedactedSecret(usize);

impl std::fmt::Debug for RedactedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<redacted {} bytes>", self.0)
    }
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured so that a new field cannot be forgotten here.
        let RemoteConfig {
            node_id,
            cluster,
            bind,
            advertise,
            secret,
            max_frame_len,
            outbound_queue,
            outbound_queue_bytes,
            control_queue,
            write_batch_frames,
            handshake_timeout,
            backoff_min,
            backoff_max,
            give_up_message_after,
            heartbeat_interval,
            idle_timeout,
            write_stall_timeout,
            max_reply_wait,
            socket_buffer,
            tls,
            faults,
            payload_format,
        } = self;
        f.debug_struct("RemoteConfig")
            .field("node_id", node_id)
            .field("cluster", cluster)
            .field("bind", bind)
            .field("advertise", advertise)
            .field("secret", &secret.as_ref().map(|s| RedactedSecret(s.len())))
            .field("max_frame_len", max_frame_len)
            .field("outbound_queue", outbound_queue)
            .field("outbound_queue_bytes", outbound_queue_bytes)
            .field("control_queue", control_queue)
            .field("write_batch_frames", write_batch_frames)
            .field("handshake_timeout", handshake_timeout)
            .field("backoff_min", backoff_min)
            .field("backoff_max", backoff_max)
            .field("give_up_message_after", give_up_message_after)
            .field("heartbeat_interval", heartbeat_interval)
            .field("idle_timeout", idle_timeout)
            .field("write_stall_timeout", write_stall_timeout)
            .field("max_reply_wait", max_reply_wait)
            .field("socket_buffer", socket_buffer)
            .field("tls", tls)
            .field("faults", faults)
            .field("payload_format", payload_format)
            .finish()
    }
}

impl RemoteConfig {
    /// The longest any of the configuration's durations may be (one year); `Remote::start`
    /// refuses a longer one.
    pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

    /// The shortest [`write_stall_timeout`](Self::write_stall_timeout) `Remote::start`
    /// accepts: below it, a write that blocks for a moment would close its connection.
    pub const MIN_WRITE_STALL: Duration = Duration::from_secs(1);

    /// A configuration for node `node_id` in cluster `cluster`, listening on `127.0.0.1:0`,
    /// with no secret and the defaults above. The cluster comes first, as in
    /// `ClusterConfig::new`.
    pub fn new(cluster: impl Into<String>, node_id: impl Into<String>) -> Self {
        RemoteConfig {
            node_id: node_id.into(),
            cluster: cluster.into(),
            bind: "127.0.0.1:0".into(),
            advertise: None,
            secret: None,
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            outbound_queue: 100_000,
            outbound_queue_bytes: 64 << 20,
            control_queue: 1_024,
            write_batch_frames: 1_024,
            handshake_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            give_up_message_after: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
            write_stall_timeout: Duration::from_secs(60),
            max_reply_wait: Duration::from_secs(600),
            socket_buffer: None,
            tls: None,
            faults: None,
            payload_format: PayloadFormat::message_pack(),
        }
    }

    /// Sets the listen address.
    pub fn bind(mut self, addr: impl Into<String>) -> Self {
        self.bind = addr.into();
        self
    }

    /// Sets the advertised address.
    pub fn advertise(mut self, addr: impl Into<String>) -> Self {
        self.advertise = Some(addr.into());
        self
    }

    /// Sets the shared secret (use at least 32 random bytes).
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into().into());
        self
    }

    /// Sets the maximum frame body size.
    pub fn max_frame_len(mut self, bytes: usize) -> Self {
        self.max_frame_len = bytes;
        self
    }

    /// Sets the user-lane capacity per peer.
    pub fn outbound_queue(mut self, frames: usize) -> Self {
        self.outbound_queue = frames;
        self
    }

    /// Sets the byte capacity of each lane per peer (see
    /// [`RemoteConfig::outbound_queue_bytes`]).
    pub fn outbound_queue_bytes(mut self, bytes: usize) -> Self {
        self.outbound_queue_bytes = bytes;
        self
    }

    /// Sets the reconnect backoff bounds.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Sets [`give_up_message_after`](Self::give_up_message_after).
    pub fn give_up_message_after(mut self, after: Duration) -> Self {
        self.give_up_message_after = after;
        self
    }

    /// Sets the heartbeat period and the idle timeout.
    pub fn heartbeat(mut self, interval: Duration, idle_timeout: Duration) -> Self {
        self.heartbeat_interval = interval;
        self.idle_timeout = idle_timeout;
        self
    }

    /// Sets [`write_stall_timeout`](Self::write_stall_timeout).
    pub fn write_stall_timeout(mut self, timeout: Duration) -> Self {
        self.write_stall_timeout = timeout;
        self
    }

    /// Sets the handshake timeout.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets the kernel socket buffer sizes (see [`RemoteConfig::socket_buffer`]).
    pub fn socket_buffer(mut self, bytes: u32) -> Self {
        self.socket_buffer = Some(bytes);
        self
    }

    /// Turns on mutual TLS (see [`TlsConfig`]).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the payload format (see [`RemoteConfig::payload_format`] and
    /// [`JsonCodec`](crate::JsonCodec)).
    pub fn payload_format(mut self, format: PayloadFormat) -> Self {
        self.payload_format = format;
        self
    }

    /// Installs a fault injector (tests).
    pub fn faults(mut self, faults: FaultInjector) -> Self {
        self.faults = Some(faults);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.node_id.is_empty() {
            return Err("node_id must not be empty".into());
        }
        // Other nodes refuse a peer whose id is not one a node can have.
        crate::handshake::check_node_id(&self.node_id).map_err(|e| format!("node_id: {e}"))?;
        if self.max_frame_len < 1024 {
            return Err("max_frame_len must be at least 1024 bytes".into());
        }
        if self.max_frame_len > u32::MAX as usize {
            // A longer body's length would be cut to 32 bits on the wire, and the peer would
            // read the rest of it as frames.
            return Err(format!(
                "max_frame_len must be at most {} bytes: frame lengths are 32-bit",
                u32::MAX
            ));
        }
        if self.outbound_queue == 0
            || self.outbound_queue_bytes == 0
            || self.control_queue == 0
            || self.write_batch_frames == 0
        {
            return Err("queue capacities and write_batch_frames must be positive".into());
        }
        if self.backoff_min.is_zero() || self.backoff_max < self.backoff_min {
            return Err("backoff_min must be positive and at most backoff_max".into());
        }
        if self.payload_format.name().is_empty() {
            return Err("the payload format's name must not be empty".into());
        }
        if self.heartbeat_interval.is_zero() || self.idle_timeout <= self.heartbeat_interval {
            return Err("idle_timeout must exceed a positive heartbeat_interval".into());
        }
        if self.write_stall_timeout < Self::MIN_WRITE_STALL {
            // A write that would block for a moment would close the connection.
            return Err(format!(
                "write_stall_timeout ({:?}) must be at least {:?}",
                self.write_stall_timeout,
                Self::MIN_WRITE_STALL
            ));
        }
        if self.secret.as_ref().is_some_and(|s| s.is_empty()) {
            // An empty key proves nothing: it would admit nodes that have no secret at all.
            return Err(
                "the shared secret must not be empty (use at least 32 random bytes; \
                        leave it unset to run without authentication)"
                    .into(),
            );
        }
        if self.handshake_timeout.is_zero() {
            return Err("handshake_timeout must be positive".into());
        }
        if self.give_up_message_after < Duration::from_millis(1) {
            return Err("give_up_message_after must be at least 1 ms".into());
        }
        if self.max_reply_wait < Duration::from_secs(1) {
            return Err("max_reply_wait must be at least 1 s".into());
        }
        // Deadlines are computed as `now + duration`, which a near-`Duration::MAX` value
        // would overflow (a panic in the task computing it).
        for (name, d) in [
            ("handshake_timeout", self.handshake_timeout),
            ("backoff_min", self.backoff_min),
            ("backoff_max", self.backoff_max),
            ("give_up_message_after", self.give_up_message_after),
            ("heartbeat_interval", self.heartbeat_interval),
            ("idle_timeout", self.idle_timeout),
            ("write_stall_timeout", self.write_stall_timeout),
            ("max_reply_wait", self.max_reply_wait),
        ] {
            if d > Self::MAX_DURATION {
                return Err(format!(
                    "{name} must be at most {} days, got {d:?}",
                    Self::MAX_DURATION.as_secs() / 86_400
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_secret() {
        let secret = "correct-horse-battery-staple-0123456789";
        let cfg = RemoteConfig::new("prod", "node-1").secret(secret.as_bytes().to_vec());
        for out in [format!("{cfg:?}"), format!("{cfg:#?}")] {
            assert!(!out.contains(secret), "secret leaked: {out}");
            // Not as a byte list either (the derived form printed `[99, 111, ...]`).
            assert!(!out.contains("99, 111, 114"), "secret bytes leaked: {out}");
            assert!(out.contains("<redacted 39 bytes>"), "{out}");
            assert!(
                out.contains("node-1") && out.contains("handshake_timeout"),
                "{out}"
            );
        }
        let none = format!("{:?}", RemoteConfig::new("prod", "node-1"));
        assert!(none.contains("secret: None"), "{none}");
    }

    /// A stall timeout a short blocking write would trip is refused.
    #[test]
    fn a_write_stall_timeout_under_a_second_is_refused() {
        for t in [Duration::ZERO, Duration::from_millis(999)] {
            let e = RemoteConfig::new("c", "n")
                .write_stall_timeout(t)
                .validate()
                .unwrap_err();
            assert!(e.contains("write_stall_timeout"), "{e}");
        }
        let ok = RemoteConfig::new("c", "n").write_stall_timeout(Duration::from_secs(1));
        assert_eq!(ok.validate(), Ok(()));
        // Independent of the heartbeat: a slow heartbeat keeps the default valid.
        let slow = RemoteConfig::new("c", "n")
            .heartbeat(Duration::from_secs(60), Duration::from_secs(180));
        assert_eq!(slow.validate(), Ok(()));
    }

    /// A node id other nodes would refuse in the handshake is refused at start.
    #[test]
    fn a_node_id_peers_would_refuse_is_refused() {
        assert_eq!(RemoteConfig::new("c", "node 1 (east)").validate(), Ok(()));
        for bad in ["a\nb".to_string(), "x".repeat(256)] {
            let e = RemoteConfig::new("c", bad).validate().unwrap_err();
            assert!(e.contains("control characters"), "{e}");
        }
    }
}
