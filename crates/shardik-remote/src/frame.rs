//! The frames of the remote protocol and their byte layout.
//!
//! On the wire every frame is `[u32 big-endian body length][body]` (see [`crate::codec`]). The
//! body starts with one kind byte:
//!
//! | kind | frame | rest of the body |
//! |---|---|---|
//! | 1-5 | handshake ([`Hello`], [`Challenge`], [`Response`], [`Accept`], [`Reject`]) | compact MessagePack (structs as arrays) |
//! | 6, 7 | [`Frame::Heartbeat`], [`Frame::HeartbeatAck`] | `u64` big-endian sequence number |
//! | 8 | [`Frame::Message`] | `u32` header length, compact MessagePack [`Envelope`] header, then the raw payload |
//! | 9 | [`Frame::Reply`] | `u64` reply slot id, then the raw payload |
//! | 10 | [`Frame::ReplyFailed`] | compact MessagePack `(ids, reason)` |
//!
//! A message or a reply failure names at most [`MAX_REPLY_IDS`] reply slots; a frame that
//! names more is malformed.
//!
//! Payloads are never re-encoded by the transport: the user's bytes (MessagePack with named
//! fields) are appended after the header, and on the receiving side the payload is a
//! [`Bytes`] slice of the received frame (no copy).

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::error::FrameError;

/// The protocol version this build speaks. A peer with another version is refused.
pub const PROTOCOL_VERSION: u32 = 2;

const KIND_HELLO: u8 = 1;
const KIND_CHALLENGE: u8 = 2;
const KIND_RESPONSE: u8 = 3;
const KIND_ACCEPT: u8 = 4;
const KIND_REJECT: u8 = 5;
const KIND_HEARTBEAT: u8 = 6;
const KIND_HEARTBEAT_ACK: u8 = 7;
const KIND_MESSAGE: u8 = 8;
const KIND_REPLY: u8 = 9;
const KIND_REPLY_FAILED: u8 = 10;

/// The most reply slots one message (its `ReplyTo` handles) or one reply failure may name.
/// A sender refuses a message with more ([`SendError::Encode`](crate::SendError::Encode)),
/// and a receiver takes a frame naming more for a malformed one, refused as soon as the list
/// announces its length: a peer cannot make this node echo a long list back (a message it
/// cannot deliver is answered with a failure naming its slots) or look many up at once.
pub const MAX_REPLY_IDS: usize = 64;

/// Reply slots as read from a peer: at most [`MAX_REPLY_IDS`] of them.
struct ReplyIds(Vec<u64>);

impl<'de> Deserialize<'de> for ReplyIds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ReplyIds;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a list of at most {MAX_REPLY_IDS} reply slots")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ReplyIds, A::Error> {
                let too_many = |n: String| {
                    serde::de::Error::custom(format!(
                        "{n} reply slots named; a frame may name at most {MAX_REPLY_IDS} reply slots"
                    ))
                };
                if let Some(n) = seq.size_hint().filter(|&n| n > MAX_REPLY_IDS) {
                    return Err(too_many(n.to_string()));
                }
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(id) = seq.next_element()? {
                    if ids.len() == MAX_REPLY_IDS {
                        return Err(too_many("more".into()));
                    }
                    ids.push(id);
                }
                Ok(ReplyIds(ids))
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// Reads a header's reply slots (see [`ReplyIds`]).
fn bounded_reply_ids<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    ReplyIds::deserialize(d).map(|ids| ids.0)
}

/// Who a node is, as told during the handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// Human-readable node id, such as `"node-1"`.
    pub node_id: String,
    /// Random per process start; a restarted node has a new one.
    pub incarnation: u64,
    /// The address (`host:port`) the node listens on and is known by.
    pub addr: String,
}

/// Which of the two connections of a node pair a connection is.
///
/// Every node pair keeps two TCP connections (as Akka Artery does): the **control**
/// connection carries heartbeats and the messages sent with
/// [`RemoteRef::tell_control`](crate::RemoteRef::tell_control) (cluster gossip and failure
/// detection), the **user** connection carries every other message and all replies. Each has
/// its own queue, writer and reader, so user bytes never sit in front of control frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Lane {
    /// Heartbeats and control messages.
    Control,
    /// User messages and replies.
    User,
}

impl Lane {
    fn user() -> Lane {
        Lane::User
    }

    /// Both lanes, control first.
    pub const ALL: [Lane; 2] = [Lane::Control, Lane::User];

    /// 0 for control, 1 for user: an index into per-lane arrays.
    pub fn index(self) -> usize {
        match self {
            Lane::Control => 0,
            Lane::User => 1,
        }
    }

    /// The other lane.
    pub fn other(self) -> Lane {
        match self {
            Lane::Control => Lane::User,
            Lane::User => Lane::Control,
        }
    }

    /// A stable label for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Control => "control",
            Lane::User => "user",
        }
    }
}

/// First frame of a connection, sent by the side that connected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Protocol version of the connecting node (first, so any version can read it).
    pub version: u32,
    /// Cluster name; nodes of different clusters refuse each other.
    pub cluster: String,
    /// The connecting node.
    pub from: NodeIdentity,
    /// Random challenge for the accepting node.
    pub nonce: [u8; 32],
    /// Which connection of the node pair this is. (Missing from a version 1 hello, which
    /// then still decodes, so that its sender is refused for its version.)
    #[serde(default = "Lane::user")]
    pub lane: Lane,
    /// Name of the connecting node's payload format ([`PayloadFormat`]); both nodes must
    /// use the same. (Missing from a version 1 hello.)
    ///
    /// [`PayloadFormat`]: shardik_actor::wire::PayloadFormat
    #[serde(default)]
    pub payload_format: String,
}

/// The accepting node's answer to [`Hello`]: its identity, its own challenge and its proof
/// that it knows the shared secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Protocol version of the accepting node.
    pub version: u32,
    /// Cluster name of the accepting node.
    pub cluster: String,
    /// The accepting node.
    pub from: NodeIdentity,
    /// Random challenge for the connecting node.
    pub nonce: [u8; 32],
    /// HMAC-SHA256 proof of the accepting node (see `docs/remoting.md`).
    pub proof: [u8; 32],
    /// Name of the accepting node's payload format.
    pub payload_format: String,
}

/// The connecting node's proof that it knows the shared secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// HMAC-SHA256 proof of the connecting node.
    pub proof: [u8; 32],
}

/// The accepting node took the connection; user frames may flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accept {}

/// Why a handshake was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectReason {
    /// The protocol versions differ.
    Version,
    /// The cluster names differ.
    Cluster,
    /// The proof did not verify: the shared secrets differ.
    Authentication,
    /// The accepting node keeps another connection to the same peer (simultaneous connects).
    Duplicate,
    /// The node is shutting down.
    ShuttingDown,
    /// The peer broke the handshake protocol.
    Protocol,
    /// The nodes encode message payloads in different formats.
    PayloadFormat,
}

impl RejectReason {
    /// A stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Version => "version mismatch",
            RejectReason::Cluster => "cluster name mismatch",
            RejectReason::Authentication => "authentication failed",
            RejectReason::Duplicate => "duplicate connection",
            RejectReason::ShuttingDown => "shutting down",
            RejectReason::Protocol => "protocol violation",
            RejectReason::PayloadFormat => "payload format mismatch",
        }
    }
}

/// A refused handshake, sent by either side before it closes the connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reject {
    /// Why.
    pub reason: RejectReason,
    /// Human-readable detail (never contains secrets).
    pub detail: String,
}

/// Why a reply slot failed (carried by [`Frame::ReplyFailed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplyFailure {
    /// The reply handle was dropped without an answer.
    NoReply,
    /// No actor is registered under the recipient path.
    UnknownRecipient,
    /// The payload did not decode as the recipient's message type.
    Undecodable,
    /// The recipient actor refused the message (stopped, or its mailbox was full).
    RecipientRefused,
    /// The message or its answer could not be routed (peer restarted, queue full, ...).
    Undeliverable,
}

/// A user message on its way to an actor registered under `recipient`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Path the recipient is registered under, such as `/user/echo`.
    pub recipient: Arc<str>,
    /// Path of the sending actor, if known.
    pub sender: Option<Arc<str>>,
    /// Type name of the message at the sender, for diagnostics.
    pub type_tag: Arc<str>,
    /// Reply slots (on the sending node) exported while the payload was encoded, at most
    /// [`MAX_REPLY_IDS`]; if the message cannot be delivered the receiver fails them with
    /// [`Frame::ReplyFailed`].
    pub reply_ids: Vec<u64>,
    /// The message, MessagePack with named fields.
    pub payload: Bytes,
}

#[derive(Serialize)]
struct HeaderRef<'a> {
    recipient: &'a str,
    sender: Option<&'a str>,
    type_tag: &'a str,
    reply_ids: &'a [u64],
}

/// The header as read: strings borrowed from the frame, so each becomes one `Arc<str>`
/// allocation (a `String` first would be two).
#[derive(Deserialize)]
struct HeaderBorrowed<'a> {
    #[serde(borrow)]
    recipient: &'a str,
    #[serde(borrow)]
    sender: Option<&'a str>,
    #[serde(borrow)]
    type_tag: &'a str,
    #[serde(deserialize_with = "bounded_reply_ids")]
    reply_ids: Vec<u64>,
}

/// The last recipient path and type tag a connection decoded (see
/// [`Frame::decode_body_with`]).
#[derive(Debug, Default)]
pub struct HeaderCache {
    recipient: Option<Arc<str>>,
    type_tag: Option<Arc<str>>,
}

impl HeaderCache {
    /// `s` as an `Arc<str>`: the cached one if it is equal, else a new one that is cached.
    fn intern(slot: &mut Option<Arc<str>>, s: &str) -> Arc<str> {
        match slot {
            Some(cached) if **cached == *s => cached.clone(),
            _ => slot.insert(Arc::from(s)).clone(),
        }
    }
}

/// The compact MessagePack header of a message frame: what [`Frame::Message`] writes before
/// its payload.
pub(crate) fn message_header(
    recipient: &str,
    sender: Option<&str>,
    type_tag: &str,
    reply_ids: &[u64],
) -> Result<Vec<u8>, FrameError> {
    let header = HeaderRef {
        recipient,
        sender,
        type_tag,
        reply_ids,
    };
    rmp_serde::to_vec(&header).map_err(|e| FrameError::Encode(e.to_string()))
}

/// Bytes of a message frame before its header: length prefix, kind, header length.
pub(crate) const MESSAGE_PREFIX: usize = 4 + 1 + 4;

/// Starts a whole message frame in `dst` (which must be empty): a length prefix to be set by
/// [`finish_frame`], the kind, the header's length and `header`. The payload is appended
/// next, straight into `dst`.
pub(crate) fn begin_message(dst: &mut Vec<u8>, header: &[u8]) {
    debug_assert!(dst.is_empty());
    dst.extend_from_slice(&[0; 4]);
    dst.push(KIND_MESSAGE);
    dst.extend_from_slice(&(header.len() as u32).to_be_bytes());
    dst.extend_from_slice(header);
}

/// Swaps the header of the message frame begun in `dst` (whose current header is
/// `old_len` bytes long) for `header`, keeping the payload after it.
pub(crate) fn replace_message_header(dst: &mut Vec<u8>, old_len: usize, header: &[u8]) {
    let payload = MESSAGE_PREFIX + old_len..dst.len();
    let payload_len = payload.len();
    let at = MESSAGE_PREFIX + header.len();
    if header.len() > old_len {
        dst.resize(at + payload_len, 0);
    }
    dst.copy_within(payload, at);
    dst.truncate(at + payload_len);
    dst[MESSAGE_PREFIX..at].copy_from_slice(header);
    dst[5..MESSAGE_PREFIX].copy_from_slice(&(header.len() as u32).to_be_bytes());
}

/// The reply slots named in the header of `frame`, a whole encoded frame (length prefix
/// included) as queued for a writer: none for a frame that is not a message, or whose header
/// does not parse (this node encoded it, so that does not happen).
pub(crate) fn queued_reply_ids(frame: &[u8]) -> Vec<u64> {
    if frame.get(4) != Some(&KIND_MESSAGE) || frame.len() < MESSAGE_PREFIX {
        return Vec::new();
    }
    let header_len = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) as usize;
    frame
        .get(MESSAGE_PREFIX..MESSAGE_PREFIX.saturating_add(header_len))
        .and_then(|header| rmp_serde::from_slice::<HeaderBorrowed<'_>>(header).ok())
        .map(|h| h.reply_ids)
        .unwrap_or_default()
}

/// Sets the length prefix of the frame in `dst` (a frame begun with [`begin_message`]) and
/// returns its body length; refuses a body over `max` (leaving `dst` as it was).
pub(crate) fn finish_frame(dst: &mut [u8], max: usize) -> Result<usize, FrameError> {
    let len = dst.len() - 4;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    dst[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(len)
}

/// One frame of the remote protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Handshake step 1 (connecting side).
    Hello(Hello),
    /// Handshake step 2 (accepting side).
    Challenge(Challenge),
    /// Handshake step 3 (connecting side).
    Response(Response),
    /// Handshake step 4 (accepting side): done.
    Accept(Accept),
    /// Handshake refused (either side).
    Reject(Reject),
    /// Liveness probe, sent on both connections of a node pair.
    Heartbeat(u64),
    /// Answer to a heartbeat, on the connection the heartbeat came in on.
    HeartbeatAck(u64),
    /// A user message.
    Message(Envelope),
    /// The encoded answer for reply slot `id` on the receiving node.
    Reply {
        /// The reply slot.
        id: u64,
        /// The answer, MessagePack with named fields.
        payload: Bytes,
    },
    /// The message that carried these reply slots could not be delivered, or its reply handle
    /// was dropped unanswered.
    ReplyFailed {
        /// Reply slots on the receiving node.
        ids: Vec<u64>,
        /// What went wrong.
        failure: ReplyFailure,
        /// Why (unknown recipient, payload failed to decode, ...).
        reason: String,
    },
}

impl Frame {
    /// True for the transport's own frames (handshake, heartbeats), false for messages and
    /// replies (a message sent with `tell_control` is still a message; see [`Lane`] for which
    /// connection carries what).
    pub fn is_control(&self) -> bool {
        !matches!(
            self,
            Frame::Message(_) | Frame::Reply { .. } | Frame::ReplyFailed { .. }
        )
    }

    /// Appends the frame body (kind byte and contents, without the length prefix) to `dst`.
    pub fn encode_body(&self, dst: &mut BytesMut) -> Result<(), FrameError> {
        fn compact<T: Serialize>(dst: &mut BytesMut, kind: u8, v: &T) -> Result<(), FrameError> {
            dst.put_u8(kind);
            rmp_serde::encode::write(&mut dst.writer(), v)
                .map_err(|e| FrameError::Encode(e.to_string()))
        }
        match self {
            Frame::Hello(h) => compact(dst, KIND_HELLO, h),
            Frame::Challenge(c) => compact(dst, KIND_CHALLENGE, c),
            Frame::Response(r) => compact(dst, KIND_RESPONSE, r),
            Frame::Accept(a) => compact(dst, KIND_ACCEPT, a),
            Frame::Reject(r) => compact(dst, KIND_REJECT, r),
            Frame::Heartbeat(n) => {
                dst.put_u8(KIND_HEARTBEAT);
                dst.put_u64(*n);
                Ok(())
            }
            Frame::HeartbeatAck(n) => {
                dst.put_u8(KIND_HEARTBEAT_ACK);
                dst.put_u64(*n);
                Ok(())
            }
            Frame::Message(env) => {
                dst.put_u8(KIND_MESSAGE);
                let at = dst.len();
                dst.put_u32(0);
                let header = HeaderRef {
                    recipient: &env.recipient,
                    sender: env.sender.as_deref(),
                    type_tag: &env.type_tag,
                    reply_ids: &env.reply_ids,
                };
                rmp_serde::encode::write(&mut dst.writer(), &header)
                    .map_err(|e| FrameError::Encode(e.to_string()))?;
                let header_len = (dst.len() - at - 4) as u32;
                dst[at..at + 4].copy_from_slice(&header_len.to_be_bytes());
                dst.extend_from_slice(&env.payload);
                Ok(())
            }
            Frame::Reply { id, payload } => {
                dst.put_u8(KIND_REPLY);
                dst.put_u64(*id);
                dst.extend_from_slice(payload);
                Ok(())
            }
            Frame::ReplyFailed {
                ids,
                failure,
                reason,
            } => compact(dst, KIND_REPLY_FAILED, &(ids, failure, reason)),
        }
    }

    /// The number of body bytes this frame will take, computed cheaply for user frames
    /// (an upper bound for the header part is not needed: headers are small).
    pub fn payload_len(&self) -> usize {
        match self {
            Frame::Message(env) => env.payload.len(),
            Frame::Reply { payload, .. } => payload.len(),
            _ => 0,
        }
    }

    /// Parses a frame body (as cut by [`crate::codec::FrameCodec`]). Never panics; payloads
    /// are slices of `body`, not copies.
    pub fn decode_body(body: Bytes) -> Result<Frame, FrameError> {
        Frame::decode_body_with(body, &mut HeaderCache::default())
    }

    /// Like [`decode_body`](Self::decode_body), reusing the recipient path and type tag of
    /// the previous message when they repeat (a connection reader keeps one `cache`), so a
    /// stream of messages to the same actor does not allocate them per message.
    pub fn decode_body_with(mut body: Bytes, cache: &mut HeaderCache) -> Result<Frame, FrameError> {
        fn compact<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
            rmp_serde::from_slice(body).map_err(|e| FrameError::Malformed(e.to_string()))
        }
        if body.is_empty() {
            return Err(FrameError::Malformed("empty frame".into()));
        }
        let kind = body.get_u8();
        match kind {
            KIND_HELLO => Ok(Frame::Hello(compact(&body)?)),
            KIND_CHALLENGE => Ok(Frame::Challenge(compact(&body)?)),
            KIND_RESPONSE => Ok(Frame::Response(compact(&body)?)),
            KIND_ACCEPT => Ok(Frame::Accept(compact(&body)?)),
            KIND_REJECT => Ok(Frame::Reject(compact(&body)?)),
            KIND_HEARTBEAT | KIND_HEARTBEAT_ACK => {
                if body.len() != 8 {
                    return Err(FrameError::Malformed("heartbeat must be 8 bytes".into()));
                }
                let n = body.get_u64();
                Ok(if kind == KIND_HEARTBEAT {
                    Frame::Heartbeat(n)
                } else {
                    Frame::HeartbeatAck(n)
                })
            }
            KIND_MESSAGE => {
                if body.len() < 4 {
                    return Err(FrameError::Malformed(
                        "message header length missing".into(),
                    ));
                }
                let header_len = body.get_u32() as usize;
                if header_len > body.len() {
                    return Err(FrameError::Malformed(format!(
                        "message header of {header_len} bytes in a body of {}",
                        body.len()
                    )));
                }
                let envelope = {
                    let header: HeaderBorrowed<'_> = rmp_serde::from_slice(&body[..header_len])
                        .map_err(|e| FrameError::Malformed(e.to_string()))?;
                    Envelope {
                        recipient: HeaderCache::intern(&mut cache.recipient, header.recipient),
                        sender: header.sender.map(Into::into),
                        type_tag: HeaderCache::intern(&mut cache.type_tag, header.type_tag),
                        reply_ids: header.reply_ids,
                        payload: Bytes::new(),
                    }
                };
                body.advance(header_len);
                Ok(Frame::Message(Envelope {
                    payload: body,
                    ..envelope
                }))
            }
            KIND_REPLY => {
                if body.len() < 8 {
                    return Err(FrameError::Malformed("reply id missing".into()));
                }
                let id = body.get_u64();
                Ok(Frame::Reply { id, payload: body })
            }
            KIND_REPLY_FAILED => {
                let (ReplyIds(ids), failure, reason): (ReplyIds, ReplyFailure, String) =
                    compact(&body)?;
                Ok(Frame::ReplyFailed {
                    ids,
                    failure,
                    reason,
                })
            }
            other => Err(FrameError::UnknownKind(other)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn samples() -> Vec<Frame> {
        let id = NodeIdentity {
            node_id: "node-1".into(),
            incarnation: 42,
            addr: "127.0.0.1:4000".into(),
        };
        vec![
            Frame::Hello(Hello {
                version: PROTOCOL_VERSION,
                cluster: "c".into(),
                from: id.clone(),
                nonce: [7; 32],
                lane: Lane::Control,
                payload_format: "msgpack-named".into(),
            }),
            Frame::Challenge(Challenge {
                version: PROTOCOL_VERSION,
                cluster: "c".into(),
                from: id,
                nonce: [1; 32],
                proof: [2; 32],
                payload_format: "json".into(),
            }),
            Frame::Response(Response { proof: [3; 32] }),
            Frame::Accept(Accept {}),
            Frame::Reject(Reject {
                reason: RejectReason::Cluster,
                detail: "x".into(),
            }),
            Frame::Heartbeat(9),
            Frame::HeartbeatAck(u64::MAX),
            Frame::Message(Envelope {
                recipient: "/user/echo".into(),
                sender: Some("/user/a".into()),
                type_tag: "my::Msg".into(),
                reply_ids: vec![1, 2, u64::MAX],
                payload: Bytes::from_static(b"\x81\xa1a\x01"),
            }),
            Frame::Message(Envelope {
                recipient: "".into(),
                sender: None,
                type_tag: "".into(),
                reply_ids: vec![],
                payload: Bytes::new(),
            }),
            Frame::Reply {
                id: 5,
                payload: Bytes::from_static(b"abc"),
            },
            Frame::ReplyFailed {
                ids: vec![3],
                failure: ReplyFailure::UnknownRecipient,
                reason: "unknown recipient".into(),
            },
        ]
    }

    #[test]
    fn a_replaced_header_keeps_the_payload_whether_it_grows_or_shrinks() {
        for (old, new) in [
            (&b"abcdef"[..], &b"ab"[..]),
            (b"ab", b"abcdefgh"),
            (b"abc", b"xyz"),
        ] {
            let mut buf = Vec::new();
            begin_message(&mut buf, old);
            buf.extend_from_slice(b"PAYLOAD");
            replace_message_header(&mut buf, old.len(), new);
            let mut expected = Vec::new();
            begin_message(&mut expected, new);
            expected.extend_from_slice(b"PAYLOAD");
            assert_eq!(buf, expected);
        }
    }

    #[test]
    fn a_message_built_in_place_is_the_encoded_frame() {
        for reply_ids in [vec![], vec![7, 1 << 40]] {
            let env = Envelope {
                recipient: "/user/echo".into(),
                sender: None,
                type_tag: "bench::Msg".into(),
                reply_ids: reply_ids.clone(),
                payload: Bytes::from_static(b"\x81\xa1a\x01 payload"),
            };
            let mut expected = BytesMut::new();
            crate::codec::encode_frame(&Frame::Message(env.clone()), &mut expected, 1 << 20)
                .unwrap();
            // Begun without reply slots, then given the slots the payload exported.
            let mut built = Vec::new();
            let plain = message_header("/user/echo", None, "bench::Msg", &[]).unwrap();
            begin_message(&mut built, &plain);
            built.extend_from_slice(&env.payload);
            if !reply_ids.is_empty() {
                let full = message_header("/user/echo", None, "bench::Msg", &reply_ids).unwrap();
                replace_message_header(&mut built, plain.len(), &full);
            }
            let len = finish_frame(&mut built, 1 << 20).unwrap();
            assert_eq!(len, built.len() - 4);
            assert_eq!(built, &expected[..]);
            assert_eq!(
                Frame::decode_body(Bytes::copy_from_slice(&built[4..])).unwrap(),
                Frame::Message(env)
            );
            assert!(matches!(
                finish_frame(&mut built, len - 1),
                Err(FrameError::TooLarge { len: l, max: m }) if l == len && m == len - 1
            ));
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for frame in samples() {
            let mut buf = BytesMut::new();
            frame.encode_body(&mut buf).unwrap();
            let back = Frame::decode_body(buf.freeze()).unwrap();
            assert_eq!(back, frame);
        }
    }

    #[test]
    fn control_lane_classification() {
        let control: Vec<bool> = samples().iter().map(Frame::is_control).collect();
        assert_eq!(
            control,
            [true, true, true, true, true, true, true, false, false, false, false]
        );
    }

    /// A connection's header cache hands out the previous path and tag while they repeat,
    /// and follows a change.
    #[test]
    fn header_cache_reuses_repeated_paths_and_tags() {
        let encode = |recipient: &str| {
            let mut body = BytesMut::new();
            Frame::Message(Envelope {
                recipient: recipient.into(),
                sender: None,
                type_tag: "my::Msg".into(),
                reply_ids: vec![],
                payload: Bytes::from_static(b"\x01"),
            })
            .encode_body(&mut body)
            .unwrap();
            body.freeze()
        };
        let mut cache = HeaderCache::default();
        let mut decode =
            |recipient: &str| match Frame::decode_body_with(encode(recipient), &mut cache) {
                Ok(Frame::Message(env)) => env,
                other => panic!("not a message: {other:?}"),
            };
        let (a, b, c) = (decode("/user/a"), decode("/user/a"), decode("/user/b"));
        assert!(Arc::ptr_eq(&a.recipient, &b.recipient));
        assert!(Arc::ptr_eq(&a.type_tag, &c.type_tag));
        assert_eq!(&*c.recipient, "/user/b");
        assert_eq!(b.payload, Bytes::from_static(b"\x01"));
    }

    #[test]
    fn bad_bodies_are_errors() {
        assert!(matches!(
            Frame::decode_body(Bytes::new()),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            Frame::decode_body(Bytes::from_static(&[200])),
            Err(FrameError::UnknownKind(200))
        ));
        // A message header length that points past the end.
        assert!(Frame::decode_body(Bytes::from_static(&[KIND_MESSAGE, 0, 0, 1, 0, 1])).is_err());
        assert!(Frame::decode_body(Bytes::from_static(&[KIND_HEARTBEAT, 1])).is_err());
        assert!(Frame::decode_body(Bytes::from_static(&[KIND_REPLY, 1, 2])).is_err());
    }

    /// A message or a reply failure may name at most 64 reply slots: more is a malformed
    /// frame, refused before the list is read whole. (Before, any number was taken: a peer
    /// could name 450 000 made-up slots in one 4 MiB frame, which this node then echoed in a
    /// reply failure of the same size, or made the node look each up under the lock every
    /// ask of the node takes.)
    #[test]
    fn more_reply_slots_than_a_message_may_carry_are_malformed() {
        let message = |n: u64| {
            Frame::Message(Envelope {
                recipient: "/user/echo".into(),
                sender: None,
                type_tag: "my::Msg".into(),
                reply_ids: (1..=n).collect(),
                payload: Bytes::from_static(b"\x01"),
            })
        };
        let failure = |n: u64| Frame::ReplyFailed {
            ids: (1..=n).collect(),
            failure: ReplyFailure::NoReply,
            reason: "x".into(),
        };
        for make in [message as fn(u64) -> Frame, failure] {
            let encode = |f: Frame| {
                let mut buf = BytesMut::new();
                f.encode_body(&mut buf).unwrap();
                buf.freeze()
            };
            let ok = make(64);
            assert_eq!(Frame::decode_body(encode(ok.clone())).unwrap(), ok);
            for n in [65, 450_000] {
                match Frame::decode_body(encode(make(n))) {
                    Err(FrameError::Malformed(e)) => {
                        assert!(e.contains("at most 64 reply slots"), "{e}")
                    }
                    other => panic!("{n} slots decoded: {:?}", other.map(|_| ())),
                }
            }
        }
    }

    #[test]
    fn message_payload_is_a_slice_of_the_frame() {
        let frame = samples().swap_remove(7);
        let mut buf = BytesMut::new();
        frame.encode_body(&mut buf).unwrap();
        let body = buf.freeze();
        let range = body.as_ptr_range();
        let Frame::Message(env) = Frame::decode_body(body.clone()).unwrap() else {
            panic!("not a message")
        };
        let p = env.payload.as_ptr();
        assert!(range.contains(&p), "payload was copied");
    }
}
