//! The seam between local reply channels and a transport.
//!
//! A [`ReplyTo`](crate::ReplyTo) inside a message is encoded as a [`WireReplyAddr`]: the node
//! that waits for the answer and a number that identifies the waiting slot there. A transport
//! (such as `shardik-remote`) installs a [`WireContext`] around encoding and decoding with
//! [`with_wire_context`]; the context registers local slots and ships encoded replies to
//! remote ones. Replies are encoded in the context's [`PayloadFormat`] (by default MessagePack
//! with named fields).
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Arc;
//! use parking_lot::Mutex;
//! use shardik_actor::wire::{with_wire_context, ReplyDeliver, ReplySink, WireContext, WireReplyAddr};
//! use shardik_actor::ReplyTo;
//!
//! /// A context that loops replies back within the process (what a test transport does).
//! #[derive(Default)]
//! struct Loopback(Mutex<(u64, HashMap<u64, ReplyDeliver>)>);
//!
//! impl WireContext for Loopback {
//!     fn export_reply(&self, deliver: ReplyDeliver) -> Result<WireReplyAddr, String> {
//!         let mut g = self.0.lock();
//!         g.0 += 1;
//!         let id = g.0;
//!         g.1.insert(id, deliver);
//!         Ok(WireReplyAddr { node: "local".into(), id })
//!     }
//!     fn import_reply(self: Arc<Self>, addr: WireReplyAddr) -> Result<ReplySink, String> {
//!         Ok(Box::new(move |bytes: Vec<u8>| {
//!             if let Some(deliver) = self.0.lock().1.remove(&addr.id) {
//!                 deliver(&bytes).unwrap();
//!             }
//!         }))
//!     }
//! }
//!
//! let ctx: Arc<dyn WireContext> = Arc::new(Loopback::default());
//! let (reply_to, mut rx) = ReplyTo::<u32>::channel();
//! let bytes = with_wire_context(&ctx, || rmp_serde::to_vec_named(&reply_to)).unwrap();
//! let remote: ReplyTo<u32> = with_wire_context(&ctx, || rmp_serde::from_slice(&bytes)).unwrap();
//! remote.reply(7);
//! assert_eq!(rx.try_recv().unwrap(), 7);
//! ```

use std::cell::RefCell;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::payload::{PayloadCodec, PayloadFormat, Visit};
/// The crate [`PayloadCodec`]s are written against.
pub use erased_serde;

/// Where a reply must be sent: the asking node and its slot number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WireReplyAddr {
    /// The node that waits for the reply.
    pub node: String,
    /// The waiting slot on that node.
    pub id: u64,
}

/// Completes a local ask from the encoded reply bytes; an `Err` says why they did not decode.
pub type ReplyDeliver = Box<dyn FnOnce(&[u8]) -> Result<(), String> + Send>;

/// Ships encoded reply bytes to a remote asker.
pub type ReplySink = Box<dyn FnOnce(Vec<u8>) + Send + Sync>;

/// What a transport provides while it encodes or decodes messages.
pub trait WireContext: Send + Sync + 'static {
    /// Registers a local waiting slot and returns the address that names it on the wire.
    fn export_reply(&self, deliver: ReplyDeliver) -> Result<WireReplyAddr, String>;
    /// Returns a sink that sends encoded replies to `addr`.
    fn import_reply(self: Arc<Self>, addr: WireReplyAddr) -> Result<ReplySink, String>;
    /// The format replies are encoded in (the transport's payload format). Defaults to
    /// MessagePack with named fields.
    fn payload_format(&self) -> PayloadFormat {
        PayloadFormat::message_pack()
    }
}

thread_local! {
    static CONTEXT: RefCell<Option<Arc<dyn WireContext>>> = const { RefCell::new(None) };
}

/// Runs `f` (an encode or decode) with `ctx` installed for the [`ReplyTo`](crate::ReplyTo)s it
/// meets. Nesting is allowed; the previous context is restored afterwards, even on panic.
pub fn with_wire_context<T>(ctx: &Arc<dyn WireContext>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<dyn WireContext>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            CONTEXT.with(|c| *c.borrow_mut() = prev);
        }
    }
    let prev = CONTEXT.with(|c| c.borrow_mut().replace(ctx.clone()));
    let _restore = Restore(prev);
    f()
}

fn current() -> Result<Arc<dyn WireContext>, String> {
    CONTEXT.with(|c| c.borrow().clone()).ok_or_else(|| {
        "a ReplyTo can only be (de)serialized by a transport: no wire context is installed \
         (see shardik_actor::wire::with_wire_context)"
            .to_string()
    })
}

pub(crate) fn export_reply(deliver: ReplyDeliver) -> Result<WireReplyAddr, String> {
    current()?.export_reply(deliver)
}

pub(crate) fn import_reply(addr: WireReplyAddr) -> Result<ReplySink, String> {
    current()?.import_reply(addr)
}

/// The payload format of the wire context installed on this thread (by
/// [`with_wire_context`]), or the default format (MessagePack with named fields) if none is.
pub fn current_payload_format() -> PayloadFormat {
    CONTEXT
        .with(|c| c.borrow().as_ref().map(|ctx| ctx.payload_format()))
        .unwrap_or_default()
}
