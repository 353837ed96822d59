//! Local actors reachable from other nodes, by path, each with the decoder of its own message
//! type.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::de::DeserializeOwned;
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

/// The decoder for an actor that takes messages of type `M`: MessagePack into `M`, then
/// `try_tell`. A refused message is recorded as a dead letter.
pub(crate) fn typed_decoder<M>(system: ActorSystem, path: Arc<str>, actor: ActorRef<M>) -> Decoder
where
    M: DeserializeOwned + Send + 'static,
{
    Arc::new(move |bytes: &[u8]| {
        let msg: M = rmp_serde::from_slice(bytes).map_err(|e| DecodeError::Payload {
            expected: std::any::type_name::<M>(),
            detail: e.to_string(),
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
