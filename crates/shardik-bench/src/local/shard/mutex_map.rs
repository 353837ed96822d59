//! The Go seed's mutex-sharded map: [`LOCKS`] `HashMap<String, u64>`s, each behind its own
//! `parking_lot::Mutex`; the caller locks map `fnv1a(key) % LOCKS` and updates it in place.
//! A tell and an ask are the same synchronous call here, so there is nothing to wait for and
//! nothing in flight; it is the floor of what keyed state costs without any message passing.

use std::sync::Arc;

use parking_lot::Mutex;

use super::driver::Store;
use super::owners::{add, FnvMap};
use super::workload::fnv1a;

/// Locks (maps); many, so two threads rarely want the same one.
pub const LOCKS: usize = 256;

/// The locked maps.
#[derive(Clone)]
pub struct MutexMap {
    maps: Arc<[Mutex<FnvMap<u64>>]>,
}

impl MutexMap {
    #[inline]
    fn add(&self, key: &str) -> u64 {
        add(
            &mut self.maps[(fnv1a(key.as_bytes()) % LOCKS as u64) as usize].lock(),
            key,
        )
    }
}

impl Store for MutexMap {
    const SYNC: bool = true;

    async fn start() -> Self {
        MutexMap {
            maps: (0..LOCKS).map(|_| Mutex::new(FnvMap::default())).collect(),
        }
    }

    #[inline]
    fn tell_add(&self, key: &'static str) {
        self.add(key);
    }

    async fn ask_add(&self, key: &'static str) -> u64 {
        self.add(key)
    }

    async fn get(&self, key: &'static str) -> u64 {
        self.maps[(fnv1a(key.as_bytes()) % LOCKS as u64) as usize]
            .lock()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    async fn stop(self) {}
}
