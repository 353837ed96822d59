//! Admission of inbound connections to their handshake: at most [`MAX_PENDING`] at once on a
//! node, and at most [`MAX_PENDING_PER_SOURCE`] of them from one source (an IPv4 address, or
//! an IPv6 /64: one host usually holds a whole /64, and could otherwise open connections from
//! as many addresses as it likes), so that one host
//! that opens connections and never authenticates them (a scanner, a misconfigured client, an
//! attack) cannot keep every other peer out for a `handshake_timeout` at a time. A connection
//! over either limit is closed at once; a slot is given back when its handshake ends, whether
//! it succeeded or not.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections that may be in their handshake at once on a node.
pub(crate) const MAX_PENDING: usize = 256;

/// Connections from one IP address that may be in their handshake at once: room for 32 nodes
/// on one host (two lanes each) connecting at the same moment, a quarter of [`MAX_PENDING`].
pub(crate) const MAX_PENDING_PER_SOURCE: usize = 64;

/// Why a connection got no slot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// [`MAX_PENDING`] handshakes are under way.
    Node,
    /// [`MAX_PENDING_PER_SOURCE`] handshakes from this address are under way.
    Source,
}

/// The slots of one node.
pub(crate) struct HandshakeSlots {
    node: Arc<Semaphore>,
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    per_source: usize,
}

/// One connection's place among the handshakes under way; dropped when its handshake ends.
pub(crate) struct HandshakeSlot {
    _node: OwnedSemaphorePermit,
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    source: IpAddr,
}

impl HandshakeSlots {
    /// Slots for [`MAX_PENDING`] handshakes, [`MAX_PENDING_PER_SOURCE`] per address.
    pub(crate) fn new() -> Self {
        Self::with_limits(MAX_PENDING, MAX_PENDING_PER_SOURCE)
    }

    fn with_limits(node: usize, per_source: usize) -> Self {
        HandshakeSlots {
            node: Arc::new(Semaphore::new(node)),
            sources: Arc::new(Mutex::new(HashMap::new())),
            per_source,
        }
    }

    /// A slot for a connection from `source`, or why there is none.
    pub(crate) fn try_take(&self, source: IpAddr) -> Result<HandshakeSlot, Refused> {
        let source = source_of(source);
        let mut sources = self.sources.lock();
        let pending = sources.get(&source).copied().unwrap_or(0);
        if pending >= self.per_source {
            return Err(Refused::Source);
        }
        let node = self
            .node
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Node)?;
        sources.insert(source, pending + 1);
        Ok(HandshakeSlot {
            _node: node,
            sources: self.sources.clone(),
            source,
        })
    }

    #[cfg(test)]
    fn sources(&self) -> usize {
        self.sources.lock().len()
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut sources = self.sources.lock();
        if let Some(pending) = sources.get_mut(&self.source) {
            *pending -= 1;
            if *pending == 0 {
                sources.remove(&self.source);
            }
        }
    }
}

/// The source a connection from `ip` counts against: an IPv4 address (also when it reaches
/// an IPv6 listener as `::ffff:a.b.c.d`), or the /64 network of an IPv6 address.
fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !(u128::from(u64::MAX));
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_source_gets_at_most_its_share_and_others_still_get_in() {
        let slots = HandshakeSlots::with_limits(10, 3);
        let a: Vec<_> = (0..3)
            .map(|_| slots.try_take(ip("10.0.0.1")).unwrap())
            .collect();
        assert_eq!(slots.try_take(ip("10.0.0.1")).err(), Some(Refused::Source));
        // The same host over IPv6's mapped form counts as the same source.
        assert_eq!(
            slots.try_take(ip("::ffff:10.0.0.1")).err(),
            Some(Refused::Source)
        );
        let b = slots
            .try_take(ip("10.0.0.2"))
            .expect("another host gets in");
        // An IPv6 host holds a /64: its addresses share one source's slots.
        let c: Vec<_> = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::9"]
            .iter()
            .map(|s| slots.try_take(ip(s)).unwrap())
            .collect();
        assert_eq!(
            slots.try_take(ip("2001:db8:1:2:abcd::1")).err(),
            Some(Refused::Source)
        );
        let d = slots
            .try_take(ip("2001:db8:1:3::1"))
            .expect("another /64 gets in");
        drop((c, d));
        drop(a);
        let again = slots.try_take(ip("10.0.0.1")).expect("slots come back");
        drop((b, again));
        assert_eq!(
            slots.sources(),
            0,
            "no entry is kept for a source without handshakes"
        );
    }

    #[test]
    fn the_node_limit_holds_over_all_sources_and_a_refusal_keeps_no_entry() {
        let slots = HandshakeSlots::with_limits(4, 3);
        let held: Vec<_> = ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|s| slots.try_take(ip(s)).unwrap())
            .collect();
        assert_eq!(slots.try_take(ip("10.0.0.4")).err(), Some(Refused::Node));
        assert_eq!(slots.sources(), 3, "the refused source left no entry");
        drop(held);
        assert_eq!(slots.sources(), 0);
        assert!(slots.try_take(ip("10.0.0.4")).is_ok());
    }
}
