//! Counters of the remote layer ([`RemoteStats`]) and the events it publishes
//! ([`RemoteEvent`]). Every counter is also exported through the `metrics` crate.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::frame::{Lane, RejectReason};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Totals since the node started.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct RemoteStats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        pub(crate) struct Counters {
            $( pub(crate) $name: AtomicU64, )*
            /// This node's id: the `node` label of the metrics.
            node: std::sync::Arc<str>,
        }

        impl Counters {
            pub(crate) fn new(node: &str) -> Self {
                Counters { $( $name: AtomicU64::new(0), )* node: node.into() }
            }

            pub(crate) fn snapshot(&self) -> RemoteStats {
                RemoteStats { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// User messages queued toward peers.
    messages_sent,
    /// User messages delivered to local actors.
    messages_delivered,
    /// Write calls made by writers (each carries a batch of frames).
    write_batches,
    /// Frames written.
    frames_written,
    /// Messages refused because a peer's user lane was full (drop newest).
    dropped_queue_full,
    /// Messages refused because their frame would exceed the size limit.
    dropped_too_large,
    /// Frames (messages, replies, control messages) dropped from a peer's queue after the
    /// peer stayed unreachable (or refused every dial as a duplicate with no connection
    /// following) for `give_up_message_after`.
    dropped_unreachable,
    /// Messages that failed to encode at the sender.
    encode_errors,
    /// Messages for a path nobody registered.
    unknown_recipient,
    /// Payloads that failed to decode as the recipient's message type.
    decode_errors,
    /// Messages the recipient actor refused (stopped, or mailbox full).
    recipient_refused,
    /// Frames that did not parse (bad kind, malformed body), skipped.
    malformed_frames,
    /// Connections closed for a protocol violation (oversized frame, i/o error mid-frame,
    /// handshake frames after the handshake).
    connections_rejected,
    /// Connections closed because their writer made no progress for `write_stall_timeout` while
    /// it had frames to write: the peer read nothing (although it may have kept sending).
    write_stalls,
    /// Dials of a peer that failed (no connection, or no handshake), per lane and attempt;
    /// not those the peer refused as a duplicate (simultaneous connects).
    dial_failures,
    /// Handshakes that failed, on either side; not the refusal of a duplicate connection
    /// (simultaneous connects), which is how they are settled.
    handshake_failures,
    /// Inbound connections closed before their handshake because too many were in theirs
    /// already: 256 on the node, or 64 from the connection's IP address.
    handshakes_refused_busy,
    /// Failed `accept` calls of the listener (file descriptors exhausted, out of memory, a
    /// connection aborted before it was accepted); the node keeps listening.
    accept_errors,
    /// Peers forgotten because nothing used them any more (no connection, nothing queued,
    /// no `RemoteRef` or waiting reply pointing at them): addresses learned from messages
    /// do not accumulate.
    peers_forgotten,
    /// Connections that completed a handshake (two per node pair: control and user).
    connections_established,
    /// Frames dropped by the fault injector.
    fault_dropped,
    /// Frames held by a link delayed by the fault injector (counted on arrival).
    fault_delayed,
    /// Replies whose slot was unknown (late after a timeout, or made up), and replies and
    /// reply failures (one per slot) from another node than the one the slot's request went
    /// to (forged): dropped, the slot keeps waiting.
    replies_unmatched,
    /// Replies that failed to decode as the asker's type.
    reply_decode_errors,
    /// Heartbeats answered on control connections.
    heartbeats_acked,
    /// Longest heartbeat round trip seen on a control connection, in microseconds (from
    /// queueing the heartbeat to reading its answer; shows whether anything delayed the
    /// control lane).
    heartbeat_rtt_max_us,
    /// Latest heartbeat round trip on a control connection, in microseconds.
    heartbeat_rtt_last_us,
    /// Connections that stopped waiting for the reader of a connection they replaced after
    /// `idle_timeout` (a decoder that blocks held it): what the peer sent across that
    /// reconnect may have been handled out of order.
    handover_timeouts,
}

impl Counters {
    pub(crate) fn bump(&self, c: &AtomicU64, metric: &'static str) -> u64 {
        self.add(c, metric, 1)
    }

    /// [`bump`](Self::bump), then the new total if it is one to log ([`should_log`]): the
    /// first ten, then every thousandth.
    pub(crate) fn bump_to_log(&self, c: &AtomicU64, metric: &'static str) -> Option<u64> {
        Some(self.bump(c, metric)).filter(|&n| should_log(n))
    }

    /// Adds `n` to `c` and its metric; returns the new total.
    pub(crate) fn add(&self, c: &AtomicU64, metric: &'static str, n: u64) -> u64 {
        metrics::counter!(metric, "node" => self.node.clone()).increment(n);
        c.fetch_add(n, Ordering::Relaxed) + n
    }

    /// Records a heartbeat round trip of a control connection.
    pub(crate) fn heartbeat_rtt(&self, rtt: std::time::Duration) {
        metrics::histogram!("shardik_remote_heartbeat_rtt_seconds", "node" => self.node.clone())
            .record(rtt);
    }

    /// The node's id, for other metrics of the layer.
    pub(crate) fn node(&self) -> &std::sync::Arc<str> {
        &self.node
    }
}

/// Log the first 10 occurrences, then every 1000th, so a flood cannot drown the log.
pub(crate) fn should_log(n: u64) -> bool {
    n <= 10 || n.is_multiple_of(1000)
}

/// Something that happened to a node's connections. Subscribe with
/// [`Remote::events`](crate::Remote::events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteEvent {
    /// A handshake completed: one of the two connections to `node_id` at `addr` (its
    /// `lane`) is up. Published once per connection, so twice when a node pair connects.
    Connected {
        /// The peer's advertised address.
        addr: String,
        /// The peer's node id.
        node_id: String,
        /// The peer's incarnation.
        incarnation: u64,
        /// True if this node dialed.
        outbound: bool,
        /// Which of the two connections came up.
        lane: Lane,
    },
    /// One of the two connections to the peer ended (it is re-made on demand).
    ConnectionClosed {
        /// The peer's advertised address.
        addr: String,
        /// Which connection.
        lane: Lane,
    },
    /// The last connection to the peer ended: neither the control nor the user connection is
    /// up (published after that connection's [`RemoteEvent::ConnectionClosed`]).
    Disconnected {
        /// The peer's advertised address.
        addr: String,
    },
    /// A peer came back with a new incarnation (it restarted); replies pending toward its old
    /// incarnation were failed.
    PeerRestarted {
        /// The peer's advertised address.
        addr: String,
        /// The old incarnation.
        old: u64,
        /// The new incarnation.
        new: u64,
    },
    /// A handshake failed, on either side (not published for a connection refused as a
    /// duplicate, which settles simultaneous connects).
    HandshakeFailed {
        /// The remote address (the socket address for inbound connections).
        addr: String,
        /// The reject reason, if one side refused.
        reason: Option<RejectReason>,
        /// True if this node refused the peer (false: the peer refused us, or it broke off).
        by_us: bool,
        /// The error text.
        error: String,
    },
    /// A connection was closed because the peer broke the protocol (oversized or bad frames).
    ConnectionRejected {
        /// The remote socket address.
        addr: String,
        /// The error text.
        error: String,
    },
}
