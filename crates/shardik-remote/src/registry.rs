//! Local actors reachable from other nodes, by path, each with the decoder of its own message
//! type.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use shardik_actor::wire::PayloadFormat;
use shardik_actor::{ActorRef, ActorSystem, TellError};

use crate::error::DecodeError;

/// Decodes a payload into the recipient's message type and delivers it.
pub type Decoder = Arc<dyn Fn(&[u8]) -> Result<(), DecodeError> + Send + Sync>;

/// A registration: its decoder, and for an actor registered with
/// [`Remote::register`](crate::Remote::register) the task that ends the registration when
/// the actor terminates, aborted when the registration ends otherwise (removed or replaced),
/// so registering and unregistering a long-lived actor over and over leaves no tasks behind.
struct Entry {
    decoder: Decoder,
    watcher: Option<tokio::task::AbortHandle>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(w) = &self.watcher {
            w.abort();
        }
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    map: RwLock<HashMap<Arc<str>, Entry>>,
    /// Bumped by every change of `map`: invalidates the per-thread lookup caches.
    generation: AtomicU64,
}

/// A connection's last lookup (see [`Registry::get_cached`]).
#[derive(Default)]
pub(crate) struct LookupCache(Option<(u64, Arc<str>, Decoder)>);

impl Registry {
    /// Registers `decoder` at `path`; returns whether it replaced a registration (whose
    /// watcher, if any, is aborted).
    pub(crate) fn insert(&self, path: &str, decoder: Decoder) -> bool {
        let entry = Entry {
            decoder,
            watcher: None,
        };
        let old = {
            let mut map = self.map.write();
            self.generation.fetch_add(1, Ordering::Release);
            map.insert(path.into(), entry)
        };
        old.is_some()
    }

    /// Gives the registration at `path`, if it is still `decoder`, the task that ends it
    /// when its actor terminates; otherwise aborts that task (the registration ended).
    pub(crate) fn watch(&self, path: &str, decoder: &Decoder, watcher: tokio::task::AbortHandle) {
        let mut map = self.map.write();
        match map.get_mut(path) {
            Some(e) if Arc::ptr_eq(&e.decoder, decoder) => e.watcher = Some(watcher),
            _ => watcher.abort(),
        }
    }

    pub(crate) fn remove(&self, path: &str) -> bool {
        let old = {
            let mut map = self.map.write();
            self.generation.fetch_add(1, Ordering::Release);
            map.remove(path)
        };
        old.is_some()
    }

    /// Removes the registration at `path` if it is still `decoder` (not one made since).
    pub(crate) fn remove_if_same(&self, path: &str, decoder: &Decoder) -> bool {
        let old = {
            let mut map = self.map.write();
            if !map
                .get(path)
                .is_some_and(|e| Arc::ptr_eq(&e.decoder, decoder))
            {
                return false;
            }
            self.generation.fetch_add(1, Ordering::Release);
            map.remove(path)
        };
        old.is_some()
    }

    pub(crate) fn get(&self, path: &str) -> Option<Decoder> {
        self.map.read().get(path).map(|e| e.decoder.clone())
    }

    /// Like [`get`](Self::get), answered from `cache` (one connection's last lookup) when
    /// it was for the same `path` (the same `Arc`, as the connection's header cache hands
    /// out for repeated paths) and nothing was registered or removed since: a stream of
    /// messages to one actor then skips the shared lock and the map.
    pub(crate) fn get_cached(&self, path: &Arc<str>, cache: &mut LookupCache) -> Option<Decoder> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((gen, p, d)) = &cache.0 {
            if *gen == generation && Arc::ptr_eq(p, path) {
                return Some(d.clone());
            }
        }
        let found = self.get(path)?;
        cache.0 = Some((generation, path.clone(), found.clone()));
        Some(found)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder(tag: u8, seen: Arc<parking_lot::Mutex<Vec<u8>>>) -> Decoder {
        Arc::new(move |_: &[u8]| {
            seen.lock().push(tag);
            Ok(())
        })
    }

    /// The end of an actor removes its own registration only, not one made at its path
    /// since (by another actor), and the lookup caches see the removal.
    #[test]
    fn removal_if_same_leaves_a_newer_registration() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let reg = Registry::default();
        let (old, new) = (decoder(1, seen.clone()), decoder(2, seen.clone()));
        reg.insert("/user/a", old.clone());
        reg.insert("/user/a", new.clone());
        assert!(!reg.remove_if_same("/user/a", &old));
        assert!(reg.get("/user/a").is_some_and(|d| Arc::ptr_eq(&d, &new)));
        let path: Arc<str> = "/user/a".into();
        let mut cache = LookupCache::default();
        assert!(reg.get_cached(&path, &mut cache).is_some());
        assert!(reg.remove_if_same("/user/a", &new));
        assert!(reg.get_cached(&path, &mut cache).is_none());
        assert!(!reg.remove_if_same("/user/a", &new));
    }

    /// The per-connection cache answers repeats, and never outlives a change of the
    /// registry: a replaced or removed actor is looked up afresh.
    #[test]
    fn cached_lookups_follow_registrations_and_removals() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let reg = Registry::default();
        let path: Arc<str> = "/user/a".into();
        let mut cache = LookupCache::default();
        assert!(reg.get_cached(&path, &mut cache).is_none());
        reg.insert("/user/a", decoder(1, seen.clone()));
        reg.get_cached(&path, &mut cache).unwrap()(b"").unwrap();
        reg.get_cached(&path, &mut cache).unwrap()(b"").unwrap();
        reg.insert("/user/a", decoder(2, seen.clone()));
        reg.get_cached(&path, &mut cache).unwrap()(b"").unwrap();
        assert!(reg.remove("/user/a"));
        assert!(reg.get_cached(&path, &mut cache).is_none());
        assert_eq!(*seen.lock(), vec![1, 1, 2]);
    }
}
