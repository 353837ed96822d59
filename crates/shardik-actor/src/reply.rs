//! [`ReplyTo`]: the reply channel that travels inside a request message.

use std::fmt;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::oneshot;

use crate::wire::{self, PayloadFormat, WireReplyAddr};

/// A one-shot reply channel carried inside a request message, like `reply_to` in Akka or
/// Casty. [`ActorRef::ask`](crate::ActorRef::ask) creates one and hands it to the message
/// constructor; the recipient answers with [`reply`](ReplyTo::reply).
///
/// `ReplyTo` implements `Serialize` and `Deserialize`, so request messages keep one protocol
/// whether the recipient is local or on another node: the transport registers the local end
/// while encoding and resolves the remote end while decoding (see [`crate::wire`]). Outside such
/// a transport, serializing a `ReplyTo` is an error that says so.
///
/// A `ReplyTo` that arrived from another node can be forwarded again, inside a message to a
/// third node: the transport exports a new slot on this node that relays the answer to the
/// original asker (answers only ever travel back to the node a request came from). Like any
/// `ReplyTo`, it is one-shot: serializing it a second time is an error.
pub struct ReplyTo<R> {
    inner: Inner<R>,
}

type RemoteReply<R> = Box<dyn FnOnce(R) + Send + Sync>;

enum Inner<R> {
    /// The asker is in this process. The mutex lets serialization move the sender out.
    Local(Mutex<Option<oneshot::Sender<R>>>),
    /// The asker is elsewhere; the closure encodes and ships the value. The mutex lets
    /// serialization move it into a relay slot when the handle is forwarded again.
    Remote(Mutex<Option<RemoteReply<R>>>),
}

impl<R> ReplyTo<R> {
    pub(crate) fn local(tx: oneshot::Sender<R>) -> Self {
        ReplyTo {
            inner: Inner::Local(Mutex::new(Some(tx))),
        }
    }

    /// Creates a connected pair for code that drives a request by hand (tests, adapters):
    /// the receiver resolves with the value passed to [`reply`](ReplyTo::reply), or with an
    /// error if the `ReplyTo` is dropped unanswered.
    pub fn channel() -> (ReplyTo<R>, oneshot::Receiver<R>) {
        let (tx, rx) = oneshot::channel();
        (ReplyTo::local(tx), rx)
    }

    /// Creates a reply handle that calls `f` with the answer. Transports use this for replies
    /// that must travel back over the network.
    pub fn from_fn(f: impl FnOnce(R) + Send + Sync + 'static) -> Self {
        ReplyTo {
            inner: Inner::Remote(Mutex::new(Some(Box::new(f)))),
        }
    }

    /// Sends the answer. If the asker has gone (timed out or stopped) the value is dropped:
    /// the asker already got an error.
    pub fn reply(self, value: R) {
        match self.inner {
            Inner::Local(tx) => {
                if let Some(tx) = tx.into_inner() {
                    let _ = tx.send(value);
                }
            }
            Inner::Remote(f) => {
                if let Some(f) = f.into_inner() {
                    f(value);
                }
            }
        }
    }

    /// True if a local asker has stopped waiting (timed out or dropped its future), or the
    /// handle was forwarded to another node. False for a remote asker otherwise, whose state
    /// is not known here.
    pub fn is_closed(&self) -> bool {
        match &self.inner {
            Inner::Local(tx) => tx.lock().as_ref().is_none_or(|tx| tx.is_closed()),
            Inner::Remote(f) => f.lock().is_none(),
        }
    }
}

impl<R> fmt::Debug for ReplyTo<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Local(_) => f.write_str("ReplyTo(local)"),
            Inner::Remote(_) => f.write_str("ReplyTo(remote)"),
        }
    }
}

impl<R> Serialize for ReplyTo<R>
where
    R: DeserializeOwned + Send + 'static,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        const TWICE: &str = "this ReplyTo was already serialized once; a reply channel is one-shot";
        fn decode<R: DeserializeOwned>(format: &PayloadFormat, bytes: &[u8]) -> Result<R, String> {
            format.decode(bytes).map_err(|e| {
                format!(
                    "reply of type {} failed to decode: {e}",
                    std::any::type_name::<R>()
                )
            })
        }
        // The answer comes back in the format of the transport that carries the request.
        let format = wire::current_payload_format();
        let deliver: wire::ReplyDeliver = match &self.inner {
            Inner::Local(slot) => {
                let tx = slot.lock().take().ok_or(serde::ser::Error::custom(TWICE))?;
                Box::new(move |bytes: &[u8]| {
                    let _ = tx.send(decode::<R>(&format, bytes)?);
                    Ok(())
                })
            }
            // Forwarded again: the new slot relays the answer to the original asker.
            Inner::Remote(slot) => {
                let f = slot.lock().take().ok_or(serde::ser::Error::custom(TWICE))?;
                Box::new(move |bytes: &[u8]| {
                    f(decode::<R>(&format, bytes)?);
                    Ok(())
                })
            }
        };
        let addr = wire::export_reply(deliver).map_err(serde::ser::Error::custom)?;
        addr.serialize(serializer)
    }
}

impl<'de, R> Deserialize<'de> for ReplyTo<R>
where
    R: Serialize + Send + 'static,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let addr = WireReplyAddr::deserialize(deserializer)?;
        let sink = wire::import_reply(addr).map_err(serde::de::Error::custom)?;
        let format = wire::current_payload_format();
        Ok(ReplyTo::from_fn(move |value: R| {
            match format.encode(&value) {
                Ok(bytes) => sink(bytes),
                Err(e) => tracing::error!(
                    error = %e,
                    reply_type = std::any::type_name::<R>(),
                    "failed to encode a reply for a remote asker; the asker will time out"
                ),
            }
        }))
    }
}
