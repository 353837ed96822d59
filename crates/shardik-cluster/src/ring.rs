//! The heartbeat ring: each node monitors a bounded number of peers.
//!
//! Members are placed on a ring ordered by a stable hash of their unique address; a node
//! monitors the next `k` members after it. So every node is watched by at most `k` peers
//! whatever the cluster size, and every node computes the same ring from the same membership.

use std::collections::BTreeSet;

use crate::member::UniqueAddress;

fn fnv1a(node: &UniqueAddress) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = node
        .address
        .bytes()
        .chain([0])
        .chain(node.node_id.bytes())
        .chain(node.incarnation.to_be_bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn ordered(nodes: &BTreeSet<UniqueAddress>) -> Vec<&UniqueAddress> {
    let mut v: Vec<&UniqueAddress> = nodes.iter().collect();
    v.sort_by_key(|n| (fnv1a(n), *n));
    v
}

/// The nodes `of` monitors: the next `k` nodes after it on the ring (all others when
/// `k >= nodes.len() - 1`). Empty if `of` is not in `nodes`.
pub fn monitored(
    of: &UniqueAddress,
    nodes: &BTreeSet<UniqueAddress>,
    k: usize,
) -> BTreeSet<UniqueAddress> {
    let ring = ordered(nodes);
    let Some(pos) = ring.iter().position(|n| *n == of) else {
        return BTreeSet::new();
    };
    let take = k.min(ring.len().saturating_sub(1));
    (1..=take)
        .map(|i| ring[(pos + i) % ring.len()].clone())
        .collect()
}

/// The nodes that monitor `of` (to which it sends heartbeats).
pub fn watchers(
    of: &UniqueAddress,
    nodes: &BTreeSet<UniqueAddress>,
    k: usize,
) -> BTreeSet<UniqueAddress> {
    nodes
        .iter()
        .filter(|n| *n != of && monitored(n, nodes, k).contains(of))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(k: u8) -> BTreeSet<UniqueAddress> {
        (0..k)
            .map(|i| UniqueAddress::new(format!("h:{i}"), format!("n{i}"), 1))
            .collect()
    }

    #[test]
    fn small_clusters_monitor_everyone() {
        let all = nodes(5);
        for n in &all {
            let m = monitored(n, &all, 9);
            assert_eq!(m.len(), 4);
            assert!(!m.contains(n));
            assert_eq!(watchers(n, &all, 9).len(), 4);
        }
    }

    #[test]
    fn large_clusters_are_bounded_and_symmetric() {
        let all = nodes(30);
        for n in &all {
            assert_eq!(monitored(n, &all, 5).len(), 5);
            assert_eq!(
                watchers(n, &all, 5).len(),
                5,
                "each node watched by exactly k"
            );
            for w in watchers(n, &all, 5) {
                assert!(monitored(&w, &all, 5).contains(n));
            }
        }
    }
}
