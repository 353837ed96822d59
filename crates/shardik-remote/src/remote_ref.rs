//! [`RemoteRef`]: a typed reference to an actor on another node.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shardik_actor::wire::with_wire_context;
use shardik_actor::{AskError, ReplyTo};
use tokio::sync::oneshot;

use crate::error::FrameError;
use crate::frame::{
    begin_message, finish_frame, message_header, replace_message_header, ReplyFailure,
    MAX_REPLY_IDS,
};
use crate::node::Node;
use crate::peer::Peer;
use crate::replies;
use crate::scratch::with_scratch;
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

/// A message [`RemoteRef::try_send`] refused: why, and the message itself when it is still
/// whole (refused before it was encoded, or refused by a full lane and without a
/// [`ReplyTo`] inside, since encoding spends a reply channel).
#[derive(Debug)]
pub struct Refused<M> {
    /// Why it was refused.
    pub error: SendError,
    /// The message, unless encoding it spent its reply channels or it could not be sent at
    /// all (too large, failed to encode, layer shut down).
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
    /// The encoded frame header of a message without reply slots.
    header: Arc<[u8]>,
    _msg: PhantomData<fn(M)>,
}

impl<M> Clone for RemoteRef<M> {
    fn clone(&self) -> Self {
        RemoteRef {
            node: self.node.clone(),
            peer: self.peer.clone(),
            path: self.path.clone(),
            type_tag: self.type_tag.clone(),
            header: self.header.clone(),
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
        let type_tag: Arc<str> = std::any::type_name::<M>().into();
        // Strings and an empty list into a `Vec`: serializing cannot fail.
        let header = message_header(&path, None, &type_tag, &[])
            .expect("a header of two strings encodes")
            .into();
        RemoteRef {
            node,
            peer,
            path,
            type_tag,
            header,
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

    /// Encodes `msg` into a whole frame, straight into a per-thread scratch buffer, and
    /// queues it on the peer's user lane, or its control lane if `control`. `before_queue`
    /// sees the reply slots the message exported just before the frame is queued. Returns
    /// those slots; on any failure they are forgotten and the failure counted.
    fn send(
        &self,
        msg: &M,
        control: bool,
        before_queue: impl FnOnce(&[u64]),
    ) -> Result<Vec<u64>, SendError> {
        self.send_telling(msg, control, before_queue)
            .map_err(|(e, _)| e)
    }

    /// [`send`](Self::send), whose failure also says whether encoding `msg` took reply
    /// handles out of it (a `ReplyTo` is one-shot: such a message cannot be sent again).
    fn send_telling(
        &self,
        msg: &M,
        control: bool,
        before_queue: impl FnOnce(&[u64]),
    ) -> Result<Vec<u64>, (SendError, bool)> {
        if self.node.is_shut_down() {
            return Err((SendError::ShutDown, false));
        }
        let format = &self.node.cfg.payload_format;
        let counters = &self.node.counters;
        with_scratch(&SCRATCH, |buf| {
            let (res, ids) = replies::capture(|| {
                with_wire_context(&self.peer.wire, || {
                    begin_message(buf, &self.header);
                    format.encode_into(msg, buf)
                })
            });
            if let Err(e) = res {
                self.node.replies.forget(&ids);
                counters.bump(
                    &counters.encode_errors,
                    "shardik_remote_encode_errors_total",
                );
                return Err((SendError::Encode(e), !ids.is_empty()));
            }
            match self.finish_and_queue(buf, &ids, control, before_queue) {
                Ok(()) => {
                    counters
                        .messages_sent
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(ids)
                }
                Err(e) => {
                    self.node.replies.forget(&ids);
                    let (counter, name) = match &e {
                        SendError::TooLarge { .. } => (
                            &counters.dropped_too_large,
                            "shardik_remote_dropped_too_large_total",
                        ),
                        SendError::QueueFull(_) => (
                            &counters.dropped_queue_full,
                            "shardik_remote_dropped_queue_full_total",
                        ),
                        _ => (
                            &counters.encode_errors,
                            "shardik_remote_encode_errors_total",
                        ),
                    };
                    counters.bump(counter, name);
                    Err((e, !ids.is_empty()))
                }
            }
        })
    }

    /// Puts the reply slots `ids` into the header of the message frame in `buf` (begun
    /// without any), sets its length and queues it.
    fn finish_and_queue(
        &self,
        buf: &mut Vec<u8>,
        ids: &[u64],
        control: bool,
        before_queue: impl FnOnce(&[u64]),
    ) -> Result<(), SendError> {
        if ids.len() > MAX_REPLY_IDS {
            // The receiver would take the frame for a malformed one.
            return Err(SendError::Encode(format!(
                "the message carries {} reply handles (ReplyTo); at most {MAX_REPLY_IDS} may \
                 travel in one message",
                ids.len()
            )));
        }
        if !ids.is_empty() {
            let header = message_header(&self.path, None, &self.type_tag, ids)
                .map_err(|e| SendError::Encode(e.to_string()))?;
            replace_message_header(buf, self.header.len(), &header);
        }
        finish_frame(buf, self.node.cfg.max_frame_len).map_err(|e| match e {
            FrameError::TooLarge { len, max } => SendError::TooLarge { len, max },
            other => SendError::Encode(other.to_string()),
        })?;
        before_queue(ids);
        self.peer
            .send_message(buf, control)
            .map_err(|_| SendError::QueueFull(self.peer.addr.to_string()))
    }

    /// Queues `msg` for the remote actor, or says why it was refused (nothing is recorded
    /// as a dead letter).
    pub fn try_tell(&self, msg: M) -> Result<(), SendError> {
        self.send(&msg, false, |_| {}).map(drop)
    }

    /// Like [`try_tell`](Self::try_tell), but a message refused because the user lane is full
    /// is handed back: the lane is checked before the message is encoded, and a message the
    /// full lane refuses once encoded (its byte bound, or another sender that filled it in
    /// between) comes back too, unless it carried a [`ReplyTo`]: encoding takes the reply
    /// channel out of it (the asker then gets its failure at once). Senders that can report
    /// a refusal to their own caller, like sharding regions forwarding to a slow peer, use
    /// this.
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
        match self.send_telling(&msg, false, |_| {}) {
            Ok(_) => Ok(()),
            Err((error @ SendError::QueueFull(_), false)) => Err(Refused {
                error,
                msg: Some(msg),
            }),
            Err((error, _)) => Err(Refused { error, msg: None }),
        }
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
        self.send(&msg, true, |_| {}).map(drop)
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
    /// unanswered; [`AskError::MailboxFull`] (or [`AskError::Stopped`], in the moment
    /// before a stopped actor's registration ends) when the recipient refused the message;
    /// [`AskError::Undeliverable`] when the request could not be sent or delivered (unknown
    /// path, as once its actor stopped; payload that does not decode there, full queue, peer
    /// restarted).
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
        let (fail_tx, fail_rx) = oneshot::channel();
        // The failure callback is in place before the request is queued: a request to this
        // node itself is handled, and may fail, before `send` returns.
        let sent = self.send(&msg, false, |ids| {
            self.node.replies.owned_by_ask(ids, timeout, fail_tx);
        });
        drop(msg);
        let ids = match sent {
            Ok(ids) => ids,
            Err(e) => return Err(AskError::Undeliverable(e.to_string())),
        };
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
                metrics::counter!("shardik_ask_timeouts_total", "via" => "remote_ref").increment(1);
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
        check_node_addr(&w.node)
            .map_err(|e| serde::de::Error::custom(format!("a RemoteRef's {e}")))?;
        let peer = node.peer(&w.node);
        Ok(RemoteRef::new(node, peer, w.path.as_ref().into()))
    }
}

/// The longest node address a peer may tell (in a received [`RemoteRef`] or its handshake):
/// a DNS name is at most 253 bytes; with brackets, a colon and a port 262 would do.
pub(crate) const MAX_NODE_ADDR: usize = 300;

/// Checks a node address that came from the network (a [`RemoteRef`] in a message, the
/// address a peer advertises in its handshake): `host:port`, with a non-empty host, a port
/// number, no spaces or control characters, and a sane length. Every address a node
/// advertises has this shape; anything else would only make a peer that can never connect.
/// The error quotes the address's start, escaped.
pub(crate) fn check_node_addr(addr: &str) -> Result<(), String> {
    let shown = || addr.chars().take(64).collect::<String>();
    if addr.len() > MAX_NODE_ADDR {
        return Err(format!(
            "node address is {} bytes long (at most {MAX_NODE_ADDR}): {}",
            addr.len(),
            crate::node::shown_max(addr, 64)
        ));
    }
    let well_formed = !addr.chars().any(|c| c.is_whitespace() || c.is_control())
        && addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !well_formed {
        return Err(format!("node address must be host:port, got {:?}", shown()));
    }
    Ok(())
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
    /// A scratch buffer per thread that a message frame is built in.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::check_node_addr;

    #[test]
    fn node_addresses_from_the_network_must_be_host_and_port() {
        for ok in [
            "127.0.0.1:2552",
            "[::1]:2552",
            "node-3.cluster.local:1",
            "a:1",
        ] {
            assert_eq!(check_node_addr(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "host",
            ":2552",
            "host:",
            "host:99999",
            "ho st:1",
            "host:1\n",
        ] {
            let e = check_node_addr(bad).expect_err(bad);
            assert!(e.contains("host:port"), "{e}");
        }
        let long = format!("{}:1", "h".repeat(400));
        let e = check_node_addr(&long).expect_err("too long");
        assert!(e.contains("402 bytes long"), "{e}");
        assert!(e.len() < 200, "the error quotes only the start: {e}");
    }
}
