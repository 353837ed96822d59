//! Local actors reachable from other nodes, by path, each with the decoder of its own message
//! type.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use shardik_actor::wire::PayloadFormat;
use shardik_actor::{ActorRef, ActorSystem, TellError};

use crate::error::DecodeError;

/// Decodes a payload into the recipient's message type and delivers it.
pub type Decoder = Arc<dyn Fn(&[u8]) -> Result<(), DecodeError> + Send + Sync>;

#[derive(Default)]
pub(crate) struct Registry {
    map: RwLock<HashMap<Arc<str>, Decoder>>,
}

impl Registry {
    pub(crate) fn insert(&self, path: &str, decoder: Decoder) -> Option<Decoder> {
        self.map.write().insert(path.into(), decoder)
    }

    pub(crate) fn remove(&self, path: &str) -> bool {
        self.map.write().remove(path).is_some()
    }

    pub(crate) fn get(&self, path: &str) -> Option<Decoder> {
        self.map.read().get(path).cloned()
    }
}

/// Decodes a received payload as a `T` in the payload format of the node that is
/// dispatching it: the helper for decoders registered with
/// [`Remote::register_decoder`](crate::Remote::register_decoder), which the node runs inside
/// its dispatch. (Called anywhere else it decodes MessagePack with named fields, the default
/// format.)
pub fn decode_payload<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    shardik_actor::wire::current_payload_format()
        .decode(bytes)
        .map_err(|detail| DecodeError::Payload {
            expected: std::any::type_name::<T>(),
            detail,
        })
}

/// The decoder for an actor that takes messages of type `M`: the payload in `format` into
/// `M`, then `try_tell`. A refused message is recorded as a dead letter.
pub(crate) fn typed_decoder<M>(
    system: ActorSystem,
    path: Arc<str>,
    actor: ActorRef<M>,
    format: PayloadFormat,
) -> Decoder
where
    M: DeserializeOwned + Send + 'static,
{
    Arc::new(move |bytes: &[u8]| {
        let msg: M = format
            .decode(bytes)
            .map_err(|detail| DecodeError::Payload {
                expected: std::any::type_name::<M>(),
                detail,
            })?;
        actor.try_tell(msg).map_err(|e| {
            let why = match e {
                TellError::Stopped(_) => "recipient stopped",
                TellError::MailboxFull(_) => "mailbox full",
            };
            system.record_dead_letter(&path, std::any::type_name::<M>(), why);
            DecodeError::Refused(why.to_string())
        })
    })
}
