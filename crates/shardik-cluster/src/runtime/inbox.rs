//! A remote path whose messages go to a tokio channel instead of an actor: the protocol
//! endpoints of the singleton managers. (The receptionist takes its messages in its decoder:
//! see `receptionist.rs`.)

use std::sync::Arc;

use serde::de::DeserializeOwned;
use shardik_remote::{decode_payload, DecodeError, Remote};
use tokio::sync::mpsc;

/// Registers `path` on `remote`: every message that decodes as `T` is queued on the returned
/// channel (bounded by `capacity`; a message that finds it full is dropped, which the
/// periodic re-sends of the protocols repair).
pub(crate) fn register<T>(remote: &Remote, path: &str, capacity: usize) -> mpsc::Receiver<T>
where
    T: DeserializeOwned + Send + 'static,
{
    let (tx, rx) = mpsc::channel(capacity);
    remote.register_decoder(
        path,
        Arc::new(move |bytes: &[u8]| {
            let msg: T = decode_payload(bytes)?;
            tx.try_send(msg)
                .map_err(|_| DecodeError::Refused("protocol inbox full or closed".into()))
        }),
    );
    rx
}
