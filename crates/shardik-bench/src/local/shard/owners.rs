//! The Go seed's channel-owner pattern in tokio: [`OWNERS`] owner tasks, each the only one
//! touching its `HashMap<String, u64>`; a key goes to owner `fnv1a(key) % OWNERS` over that
//! owner's unbounded mpsc channel, and an ask carries a oneshot for the answer.
//!
//! Made as strong as the pattern allows: keys travel as `&'static str` (no allocation per
//! message; a map allocates a `String` once per key), FNV-1a instead of SipHash for routing and
//! for the maps, and [`OWNERS`] = 8. On 2 cores few owners win: each owner's channel stays
//! busy, so an owner handles runs of messages per wake-up, where with 256 owners more messages
//! wake a parked owner. Measured on this machine with 2, 4, 8, 16, 64 and 256 owners, 8 was
//! among the fastest for all four shapes (tell/ask, uniform/skewed; the spread between 4, 8 and
//! 16 was within the noise).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::driver::Store;
use super::progress;
use super::workload::fnv1a;

/// Owner tasks.
pub const OWNERS: usize = 8;

/// A `Hasher` running FNV-1a over the written bytes.
#[derive(Default)]
pub struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Chain from the previous state so multi-part keys hash all their parts.
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// FNV-1a maps.
pub type FnvMap<V> = HashMap<String, V, BuildHasherDefault<Fnv>>;

enum Msg {
    Add(&'static str),
    AddGet(&'static str, oneshot::Sender<u64>),
    Get(&'static str, oneshot::Sender<u64>),
}

/// Handles to the owner tasks.
#[derive(Clone)]
pub struct Owners {
    inboxes: Arc<[mpsc::UnboundedSender<Msg>]>,
    tasks: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Owners {
    #[inline]
    fn inbox(&self, key: &str) -> &mpsc::UnboundedSender<Msg> {
        &self.inboxes[(fnv1a(key.as_bytes()) % self.inboxes.len() as u64) as usize]
    }

    async fn call(&self, key: &'static str, msg: impl FnOnce(oneshot::Sender<u64>) -> Msg) -> u64 {
        let (tx, rx) = oneshot::channel();
        self.inbox(key)
            .send(msg(tx))
            .unwrap_or_else(|_| panic!("owner task of {key} is gone"));
        rx.await.expect("an owner answers")
    }
}

/// One owner: the only task that touches its map.
async fn owner(mut inbox: mpsc::UnboundedReceiver<Msg>) {
    let mut map: FnvMap<u64> = FnvMap::default();
    while let Some(msg) = inbox.recv().await {
        match msg {
            Msg::Add(key) => {
                add(&mut map, key);
                progress::handled();
            }
            Msg::AddGet(key, reply) => {
                let _ = reply.send(add(&mut map, key));
            }
            Msg::Get(key, reply) => {
                let _ = reply.send(map.get(key).copied().unwrap_or(0));
            }
        }
    }
}

/// Adds one to `key` in `map`, allocating the key only on its first increment.
#[inline]
pub fn add(map: &mut FnvMap<u64>, key: &str) -> u64 {
    match map.get_mut(key) {
        Some(v) => {
            *v += 1;
            *v
        }
        None => {
            map.insert(key.to_string(), 1);
            1
        }
    }
}

impl Store for Owners {
    const SYNC: bool = false;

    async fn start() -> Self {
        let (inboxes, tasks): (Vec<_>, Vec<_>) = (0..OWNERS)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                (tx, tokio::spawn(owner(rx)))
            })
            .unzip();
        Owners {
            inboxes: inboxes.into(),
            tasks: Arc::new(parking_lot::Mutex::new(tasks)),
        }
    }

    #[inline]
    fn tell_add(&self, key: &'static str) {
        self.inbox(key)
            .send(Msg::Add(key))
            .unwrap_or_else(|_| panic!("owner task of {key} is gone"));
    }

    async fn ask_add(&self, key: &'static str) -> u64 {
        self.call(key, |tx| Msg::AddGet(key, tx)).await
    }

    async fn get(&self, key: &'static str) -> u64 {
        self.call(key, |tx| Msg::Get(key, tx)).await
    }

    async fn stop(self) {
        let tasks = std::mem::take(&mut *self.tasks.lock());
        drop(self);
        for t in tasks {
            t.await.expect("an owner task panicked");
        }
    }
}
