//! Errors of the remote layer.

use std::io;

use crate::frame::RejectReason;

/// A frame could not be cut from the stream or parsed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The underlying stream failed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The length prefix announced more than the configured maximum; the connection is closed.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// The frame kind byte is not known to this version.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The frame body did not parse.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A frame could not be encoded.
    #[error("frame encoding failed: {0}")]
    Encode(String),
}

/// Why a handshake failed. Both sides log it; no user frame is exchanged.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer refused us.
    #[error("the peer refused our handshake: {} ({detail})", reason.as_str())]
    RefusedByPeer {
        /// The peer's reason.
        reason: RejectReason,
        /// The peer's detail text.
        detail: String,
    },
    /// We refused the peer.
    #[error("we refused the peer's handshake: {} ({detail})", reason.as_str())]
    Refused {
        /// Our reason.
        reason: RejectReason,
        /// Detail text.
        detail: String,
    },
    /// The peer did not complete the handshake in time.
    #[error("the handshake did not complete within RemoteConfig::handshake_timeout")]
    Timeout,
    /// The connection failed or sent bad frames during the handshake.
    #[error("handshake failed: {0}")]
    Frame(#[from] FrameError),
    /// The TLS handshake failed (wrong or untrusted certificate, no certificate, ...).
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The connection closed during the handshake.
    #[error("connection closed during the handshake")]
    Closed,
}

impl HandshakeError {
    /// The reject reason, if the handshake was refused by either side.
    pub fn reason(&self) -> Option<RejectReason> {
        match self {
            HandshakeError::RefusedByPeer { reason, .. }
            | HandshakeError::Refused { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

/// Errors of starting or using the remote layer.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Binding the listen address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: io::Error,
    },
    /// The configuration is invalid.
    #[error("invalid remote configuration: {0}")]
    Config(String),
    /// A handshake failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// Connecting failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: String,
        /// The cause.
        source: io::Error,
    },
}

/// A received payload could not be delivered to a registered actor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes did not decode as the recipient's message type.
    #[error("payload failed to decode as {expected}: {detail}")]
    Payload {
        /// The recipient's message type.
        expected: &'static str,
        /// What the decoder said.
        detail: String,
    },
    /// The recipient actor has stopped or its mailbox refused the message.
    #[error("recipient refused the message: {0}")]
    Refused(String),
    /// Decoding the payload panicked (a `Deserialize` implementation or a decoder registered
    /// with [`Remote::register_decoder`](crate::Remote::register_decoder)). The message is
    /// dropped and the connection goes on.
    #[error("decoding the payload panicked: {0}")]
    Panicked(String),
}

pub(crate) use shardik_actor::panic_message;
