//! [`RemoteRef`]: a typed reference to an actor on another node.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shardik_actor::wire::{with_wire_context, PayloadFormat};
use shardik_actor::{AskError, ReplyTo};
use tokio::sync::oneshot;

use crate::frame::{Envelope, Frame, ReplyFailure};
use crate::node::Node;
use crate::peer::Peer;
use crate::replies;
use crate::stats::should_log;

/// Why a message to a remote actor was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The user lane toward the peer is full (it is slow or unreachable): the message was
    /// dropped (drop-newest policy).
    #[error("the outbound queue to {0} is full")]
    QueueFull(String),
    /// The encoded message is larger than the frame limit.
    #[error("message of about {len} bytes exceeds the frame limit of {max} bytes")]
    TooLarge {
        /// Approximate frame size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The message failed to serialize.
    #[error("message failed to encode: {0}")]
    Encode(String),
    /// The remote layer has shut down.
    #[error("the remote layer has shut down")]
    ShutDown,
}

/// A message [`RemoteRef::try_send`] refused: why, and the message itself when it was refused
/// before it was encoded (so a [`ReplyTo`] inside it is still usable).
#[derive(Debug)]
pub struct Refused<M> {
    /// Why it was refused.
    pub error: SendError,
    /// The message, unless it was refused after encoding (its reply channels are then spent).
    pub msg: Option<M>,
}

/// A reference to an actor registered at a path on another node, accepting messages of type
/// `M`. Obtained from [`Remote::lookup`](crate::Remote::lookup); cloning is cheap.
///
/// Its [`tell`](RemoteRef::tell) and [`ask`](RemoteRef::ask) mirror
/// [`ActorRef`](shardik_actor::ActorRef)'s: `tell` never blocks and turns an undeliverable
/// message into a dead letter; `ask` builds the request around a [`ReplyTo`] and waits up to a
/// timeout. Messages are encoded in the node's payload format (by default MessagePack with
/// named fields) when they are sent, so a
/// `ReplyTo` inside a message (made by `ask`, or by [`ReplyTo::channel`]) is answered across
/// the network. Delivery is at most once; messages from one sender to one remote actor keep
/// their order.
pub struct RemoteRef<M> {
    node: Arc<Node>,
    peer: Arc<Peer>,
    path: Arc<str>,
    type_tag: Arc<str>,
    _msg: PhantomData<fn(M)>,
}

impl<M> Clone for RemoteRef<M> {
    fn clone(&self) -> Self {
        RemoteRef {
            node: self.node.clone(),
            peer: self.peer.clone(),
            path: self.path.clone(),
            type_tag: self.type_tag.clone(),
            _msg: PhantomData,
        }
    }
}

impl<M> fmt::Debug for RemoteRef<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRef")
            .field("node", &self.peer.addr)
            .field("path", &self.path)
            .finish()
    }
}

impl<M: Serialize + Send + 'static> RemoteRef<M> {
    pub(crate) fn new(node: Arc<Node>, peer: Arc<Peer>, path: Arc<str>) -> Self {
        RemoteRef {
            node,
            peer,
            path,
            type_tag: std::any::type_name::<M>().into(),
            _msg: PhantomData,
        }
    }

    /// The path of the actor on its node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The address of the actor's node.
    pub fn node_addr(&self) -> &str {
        &self.peer.addr
    }

    /// Encodes `msg` into a frame; returns the reply slots it exported.
    fn encode(&self, msg: &M) -> Result<(Frame, Vec<u64>), SendError> {
        if self.node.is_shut_down() {
            return Err(SendError::ShutDown);
        }
        let format = &self.node.cfg.payload_format;
        let (res, ids) =
            replies::capture(|| with_wire_context(&self.peer.wire, || encode_payload(format, msg)));
        let payload = match res {
            Ok(p) => p,
            Err(e) => {
                self.node.replies.forget(&ids);
                self.node.counters.bump(
                    &self.node.counters.encode_errors,
                    "shardik_remote_encode_errors_total",
                );
                return Err(SendError::Encode(e));
            }
        };
        // Kind byte, header length, MessagePack overhead of the header (generous).
        let len = payload.len() + self.path.len() + self.type_tag.len() + 9 * ids.len() + 32;
        let max = self.node.cfg.max_frame_len;
        if len > max {
            self.node.replies.forget(&ids);
            self.node.counters.bump(
                &self.node.counters.dropped_too_large,
                "shardik_remote_dropped_too_large_total",
            );
            return Err(SendError::TooLarge { len, max });
        }
        let frame = Frame::Message(Envelope {
            recipient: self.path.clone(),
            sender: None,
            type_tag: self.type_tag.clone(),
            reply_ids: ids.clone(),
            payload,
        });
        Ok((frame, ids))
    }

    fn enqueue(&self, frame: Frame, ids: &[u64]) -> Result<(), SendError> {
        self.enqueue_on(frame, ids, false)
    }

    /// Queues `frame` on the peer's user lane, or its control lane if `control`; on a full
    /// lane forgets the reply slots `ids` and counts the drop.
    fn enqueue_on(&self, frame: Frame, ids: &[u64], control: bool) -> Result<(), SendError> {
        let queued = if control {
            self.peer.send_control_msg(frame)
        } else {
            self.peer.send_user(frame)
        };
        if queued.is_err() {
            self.node.replies.forget(ids);
            self.node.counters.bump(
                &self.node.counters.dropped_queue_full,
                "shardik_remote_dropped_queue_full_total",
            );
            return Err(SendError::QueueFull(self.peer.addr.to_string()));
        }
        self.node
            .counters
            .messages_sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Queues `msg` for the remote actor, or says why it was refused (nothing is recorded
    /// as a dead letter).
    pub fn try_tell(&self, msg: M) -> Result<(), SendError> {
        let (frame, ids) = self.encode(&msg)?;
        drop(msg);
        self.enqueue(frame, &ids)
    }

    /// Like [`try_tell`](Self::try_tell), but a message refused because the user lane is full
    /// is handed back: the lane is checked before the message is encoded. (A lane that fills
    /// between the check and the push, which takes a race with another sender, refuses the
    /// encoded message without handing it back.) Senders that can report a refusal to their
    /// own caller, like sharding regions forwarding to a slow peer, use this.
    pub fn try_send(&self, msg: M) -> Result<(), Refused<M>> {
        if self.peer.user_full() {
            self.node.counters.bump(
                &self.node.counters.dropped_queue_full,
                "shardik_remote_dropped_queue_full_total",
            );
            return Err(Refused {
                error: SendError::QueueFull(self.peer.addr.to_string()),
                msg: Some(msg),
            });
        }
        self.try_tell(msg)
            .map_err(|error| Refused { error, msg: None })
    }

    /// Queues `msg` on the peer's **control lane** instead of the user lane, or says why it
    /// was refused (nothing is recorded as a dead letter).
    ///
    /// The control lane is what heartbeats use: it has its own TCP connection to the node,
    /// with its own writer and reader, and its own bound (`RemoteConfig::control_queue`,
    /// default 1 024 frames), so a flood of user messages toward the same node neither delays
    /// these messages (not in the queue, not in the kernel's buffers, not at the receiver's
    /// reader) nor makes them fail with a full user lane. Meant
    /// for small, infrequent protocol messages of higher layers (cluster heartbeats and
    /// gossip); the receiver decodes and delivers them exactly like [`tell`](Self::tell)ed
    /// ones. Messages sent with `tell` and `tell_control` to the same actor are not ordered
    /// with respect to each other; each kind keeps its own order.
    pub fn try_tell_control(&self, msg: M) -> Result<(), SendError> {
        let (frame, ids) = self.encode(&msg)?;
        drop(msg);
        self.enqueue_on(frame, &ids, true)
    }

    /// [`try_tell_control`](Self::try_tell_control), recording a refused message as a dead
    /// letter like [`tell`](Self::tell).
    pub fn tell_control(&self, msg: M) {
        if let Err(e) = self.try_tell_control(msg) {
            self.undeliverable(&e);
        }
    }

    /// Queues `msg` without waiting. A message that cannot be queued (full outbound queue,
    /// too large, fails to encode, layer shut down) is logged and recorded as a dead letter.
    pub fn tell(&self, msg: M) {
        if let Err(e) = self.try_tell(msg) {
            self.undeliverable(&e);
        }
    }

    fn undeliverable(&self, e: &SendError) {
        let reason = match e {
            SendError::QueueFull(_) => "remote outbound queue full",
            SendError::TooLarge { .. } => "remote message too large",
            SendError::Encode(_) => "remote message failed to encode",
            SendError::ShutDown => "remote layer shut down",
        };
        let recipient = format!("{}{}", self.peer.addr, self.path);
        self.node
            .system
            .record_dead_letter(&recipient, std::any::type_name::<M>(), reason);
        let n = self.node.counters.snapshot();
        let total = n.dropped_queue_full + n.dropped_too_large + n.encode_errors;
        if !matches!(e, SendError::QueueFull(_)) || should_log(total) {
            tracing::error!(recipient, "remote message not sent: {e}");
        }
    }

    /// Sends a request built by `make` around a fresh [`ReplyTo`] and waits up to `timeout`
    /// for the answer, which travels back over the network.
    ///
    /// Errors: [`AskError::Timeout`] when no answer came in time (also when the node is
    /// unreachable); [`AskError::NoReply`] when the recipient dropped the `ReplyTo`
    /// unanswered; [`AskError::Stopped`] / [`AskError::MailboxFull`] when the recipient
    /// refused the message; [`AskError::Undeliverable`] when the request could not be sent or
    /// delivered (unknown path, payload that does not decode there, full queue, peer restarted).
    pub async fn ask<R>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError>
    where
        R: DeserializeOwned + Send + 'static,
    {
        let (reply_to, rx) = ReplyTo::channel();
        let msg = make(reply_to);
        let (frame, ids) = match self.encode(&msg) {
            Ok(x) => x,
            Err(e) => return Err(AskError::Undeliverable(e.to_string())),
        };
        drop(msg);
        let (fail_tx, fail_rx) = oneshot::channel();
        if let Some(&first) = ids.first() {
            self.node.replies.on_fail(first, fail_tx);
        }
        if let Err(e) = self.enqueue(frame, &ids) {
            return Err(AskError::Undeliverable(e.to_string()));
        }
        let wait = async move {
            let mut rx = rx;
            let mut fail_rx = Some(fail_rx);
            loop {
                tokio::select! {
                    biased;
                    r = async { fail_rx.as_mut().expect("guarded").await }, if fail_rx.is_some() => match r {
                        Ok((failure, reason)) => return Err(ask_error(failure, reason)),
                        Err(_) => fail_rx = None,
                    },
                    v = &mut rx => return v.map_err(|_| AskError::NoReply),
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => {
                self.node.replies.forget(&ids);
                Err(AskError::Timeout(timeout))
            }
        }
    }
}

thread_local! {
    /// The node whose reader is decoding a message on this thread.
    static DECODING: RefCell<Option<Weak<Node>>> = const { RefCell::new(None) };
}

/// Runs a decode with `node` as the node that resolves [`RemoteRef`]s in the message.
pub(crate) fn decoding_on<T>(node: &Arc<Node>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Weak<Node>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            let _ = DECODING.try_with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = DECODING.with(|c| c.borrow_mut().replace(Arc::downgrade(node)));
    let _restore = Restore(prev);
    f()
}

/// A [`RemoteRef`] on the wire: the node's address and the actor's path.
#[derive(Serialize, Deserialize)]
struct WireRef<'a> {
    node: std::borrow::Cow<'a, str>,
    path: std::borrow::Cow<'a, str>,
}

/// A `RemoteRef` inside a message is sent as (node address, path) and resolves to a ref to
/// the same actor on arrival, so it can be passed on to a third node. To send a ref to a
/// local actor, register it and send `remote.lookup(path, remote.addr())`.
impl<M> Serialize for RemoteRef<M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireRef {
            node: std::borrow::Cow::Borrowed(&self.peer.addr),
            path: std::borrow::Cow::Borrowed(&self.path),
        }
        .serialize(serializer)
    }
}

impl<'de, M: Serialize + Send + 'static> Deserialize<'de> for RemoteRef<M> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let w = WireRef::deserialize(deserializer)?;
        let node = DECODING
            .with(|c| c.borrow().as_ref().and_then(Weak::upgrade))
            .ok_or_else(|| {
                serde::de::Error::custom(
                    "a RemoteRef can only be decoded by the remote layer (in a received message)",
                )
            })?;
        let peer = node.peer(&w.node);
        Ok(RemoteRef::new(node, peer, w.path.as_ref().into()))
    }
}

fn ask_error(failure: ReplyFailure, reason: String) -> AskError {
    match failure {
        ReplyFailure::NoReply => AskError::NoReply,
        ReplyFailure::RecipientRefused if reason.contains("mailbox full") => AskError::MailboxFull,
        ReplyFailure::RecipientRefused => AskError::Stopped,
        ReplyFailure::UnknownRecipient
        | ReplyFailure::Undecodable
        | ReplyFailure::Undeliverable => AskError::Undeliverable(reason),
    }
}

thread_local! {
    /// A scratch buffer per thread for [`encode_payload`].
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Encodes `msg` in `format` into exactly-sized [`Bytes`]: serialized into a reused
/// per-thread buffer first, then copied once. Serializing into a fresh `Vec` grew it step by
/// step (several reallocations for a 100-byte message) and left spare capacity that made the
/// conversion to `Bytes` allocate once more.
fn encode_payload<M: Serialize>(format: &PayloadFormat, msg: &M) -> Result<Bytes, String> {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let res = format.encode_into(msg, &mut buf);
            let out = res.map(|()| Bytes::copy_from_slice(&buf));
            if buf.capacity() > 64 * 1024 {
                *buf = Vec::new();
            }
            out
        }
        // A message whose serialization sends another message on this thread.
        Err(_) => format.encode(msg).map(Bytes::from),
    })
}
