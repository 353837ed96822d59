//! What the cluster layer puts on the wire: endpoint paths, region ids of nodes, and the
//! envelopes of the three endpoints (region, coordinator, replica).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardik_actor::ReplyTo;
use shardik_cluster::member::UniqueAddress;
use shardik_remote::Decoder;

use crate::coordination::{CoordinatorState, Epoch, PeerMsg, RegionId, ToCoordinator, Version};
use crate::hash::ShardId;

/// The replica endpoint, one per node for all entity types.
pub(crate) const REPLICA_PATH: &str = "/system/sharding/replica";

/// Forwarded envelopes and fences from other regions (the user lane: one ordered channel per
/// node pair).
pub(crate) fn peer_path(type_name: &str) -> String {
    format!("/system/sharding/{type_name}/region")
}

/// Coordinator messages to the region of a type (the control lane).
pub(crate) fn region_control_path(type_name: &str) -> String {
    format!("/system/sharding/{type_name}/region-control")
}

/// The coordinator endpoint of a type (on every node; only the oldest `Up` one answers).
pub(crate) fn coordinator_path(type_name: &str) -> String {
    format!("/system/sharding/{type_name}/coordinator")
}

/// The region id of a node: `address#node_id#incarnation`, ordered by address like members.
pub(crate) fn region_id(node: &UniqueAddress) -> RegionId {
    RegionId(format!(
        "{}#{}#{}",
        node.address, node.node_id, node.incarnation
    ))
}

/// The address a region id's node listens on.
pub(crate) fn region_addr(region: &RegionId) -> &str {
    region.0.split('#').next().unwrap_or(&region.0)
}

/// The node of a region id.
pub(crate) fn region_node(region: &RegionId) -> Option<UniqueAddress> {
    let mut parts = region.0.split('#');
    let address = parts.next()?;
    let node_id = parts.next()?;
    let incarnation = parts.next()?.parse().ok()?;
    Some(UniqueAddress::new(address, node_id, incarnation))
}

/// A message from another region.
#[derive(Serialize, Deserialize)]
pub(crate) struct PeerWire<M> {
    pub(crate) from: RegionId,
    pub(crate) msg: PeerMsg<M>,
}

/// A message to the coordinator endpoint of a type.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum CoordWire {
    /// A protocol message of a region.
    Region { from: RegionId, msg: ToCoordinator },
    /// The region's node leaves gracefully (`ClusterSharding::leave`): hand all its shards off.
    Leaving { region: RegionId },
}

/// A request to the replica endpoint.
#[derive(Serialize, Deserialize)]
pub(crate) enum ReplicaReq {
    /// Store `state` if it is not older (by epoch, then version) than the stored one.
    Write {
        type_name: String,
        state: CoordinatorState,
        reply: ReplyTo<ReplicaAck>,
    },
    /// The stored state of a type, if any.
    Read {
        type_name: String,
        reply: ReplyTo<Option<CoordinatorState>>,
    },
    /// Store the remembered entities of a shard if `set` is newer than the stored one.
    WriteEntities {
        type_name: String,
        shard: ShardId,
        set: EntitySet,
    },
    /// The remembered entities of a shard, if any.
    ReadEntities {
        type_name: String,
        shard: ShardId,
        reply: ReplyTo<Option<EntitySet>>,
    },
}

/// The remembered entity ids of one shard, stamped by (owner generation, write number): each
/// new owner of the shard reads a majority, continues with a higher generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EntitySet {
    pub(crate) stamp: (u64, u64),
    pub(crate) ids: std::collections::BTreeSet<String>,
}

/// The answer to [`ReplicaReq::Write`]: whether it was stored, and the stored epoch/version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplicaAck {
    pub(crate) accepted: bool,
    pub(crate) epoch: Epoch,
    pub(crate) version: Version,
}

/// A decoder that decodes `T` and hands it to `f` (on the connection's reader task).
pub(crate) fn decoder<T>(f: impl Fn(T) + Send + Sync + 'static) -> Decoder
where
    T: DeserializeOwned + Send + 'static,
{
    Arc::new(move |bytes: &[u8]| {
        let msg: T = shardik_remote::decode_payload(bytes)?;
        f(msg);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_ids_name_their_address() {
        let n = UniqueAddress::new("127.0.0.1:7000", "n0", 42);
        let r = region_id(&n);
        assert_eq!(r.0, "127.0.0.1:7000#n0#42");
        assert_eq!(region_addr(&r), "127.0.0.1:7000");
        assert_eq!(region_node(&r), Some(n));
    }
}
