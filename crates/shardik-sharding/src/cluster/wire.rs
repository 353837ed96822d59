//! What the cluster layer puts on the wire: endpoint paths, region ids of nodes, and the
//! envelopes of the three endpoints (region, coordinator, replica).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardik_actor::ReplyTo;
use shardik_cluster::member::UniqueAddress;
use shardik_remote::Decoder;

use crate::coordination::{
    CoordinatorState, Envelope, Epoch, HandOffId, PeerMsg, RegionId, ToCoordinator, Version,
};
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
/// Read back by [`region_node`]: the address (`host:port`) and the incarnation (a number)
/// hold no `#`, so the node id is everything between the first `#` and the last, whatever
/// it holds (a `#` too).
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

/// The node of a region id (see [`region_id`]).
pub(crate) fn region_node(region: &RegionId) -> Option<UniqueAddress> {
    // Split at the first `#` and the last, not at every one: a node id may hold a `#`
    // (before 2026-11-29 such a node's region matched no member, so it never registered).
    let (address, rest) = region.0.split_once('#')?;
    let (node_id, incarnation) = rest.rsplit_once('#')?;
    let incarnation = incarnation.parse().ok()?;
    Some(UniqueAddress::new(address, node_id, incarnation))
}

/// A message from another region.
///
/// Encoded as one array instead of maps of named fields, because it travels with every
/// forwarded entity message: `[from, 0, entity_id, shard, hops, payload]` for
/// [`PeerMsg::Deliver`], `[from, 1, hand-off id, shard]` for [`PeerMsg::Fence`]. The payload
/// (the user's message) keeps the transport's encoding, named fields by default.
pub(crate) struct PeerWire<M> {
    pub(crate) from: RegionId,
    pub(crate) msg: PeerMsg<M>,
}

const PEER_DELIVER: u8 = 0;
const PEER_FENCE: u8 = 1;

impl<M: Serialize> Serialize for PeerWire<M> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        match &self.msg {
            PeerMsg::Deliver(env) => {
                let mut t = s.serialize_tuple(6)?;
                t.serialize_element(&self.from.0)?;
                t.serialize_element(&PEER_DELIVER)?;
                t.serialize_element(&env.entity_id)?;
                t.serialize_element(&env.shard)?;
                t.serialize_element(&env.hops)?;
                t.serialize_element(&env.payload)?;
                t.end()
            }
            PeerMsg::Fence { id, shard } => {
                let mut t = s.serialize_tuple(4)?;
                t.serialize_element(&self.from.0)?;
                t.serialize_element(&PEER_FENCE)?;
                t.serialize_element(id)?;
                t.serialize_element(shard)?;
                t.end()
            }
        }
    }
}

impl<'de, M: Deserialize<'de>> Deserialize<'de> for PeerWire<M> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<M>(std::marker::PhantomData<M>);
        impl<'de, M: Deserialize<'de>> serde::de::Visitor<'de> for Visit<M> {
            type Value = PeerWire<M>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a region message: [from, kind, ...]")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error;
                let missing =
                    |at: usize| A::Error::invalid_length(at, &"a complete region message");
                let from: String = seq.next_element()?.ok_or_else(|| missing(0))?;
                let kind: u8 = seq.next_element()?.ok_or_else(|| missing(1))?;
                let msg = match kind {
                    PEER_DELIVER => {
                        let entity_id: String = seq.next_element()?.ok_or_else(|| missing(2))?;
                        let shard: ShardId = seq.next_element()?.ok_or_else(|| missing(3))?;
                        let hops: u8 = seq.next_element()?.ok_or_else(|| missing(4))?;
                        let payload: M = seq.next_element()?.ok_or_else(|| missing(5))?;
                        PeerMsg::Deliver(Envelope {
                            entity_id,
                            shard,
                            hops,
                            payload,
                        })
                    }
                    PEER_FENCE => {
                        let id: HandOffId = seq.next_element()?.ok_or_else(|| missing(2))?;
                        let shard: ShardId = seq.next_element()?.ok_or_else(|| missing(3))?;
                        PeerMsg::Fence { id, shard }
                    }
                    other => {
                        return Err(A::Error::invalid_value(
                            serde::de::Unexpected::Unsigned(other.into()),
                            &"0 (deliver) or 1 (fence)",
                        ))
                    }
                };
                Ok(PeerWire {
                    from: RegionId(from),
                    msg,
                })
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
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
    /// Store `state` if it is not older (by epoch, then version) than the stored one, nor of
    /// an epoch older than one promised.
    Write {
        type_name: String,
        state: CoordinatorState,
        reply: ReplyTo<ReplicaAck>,
    },
    /// The stored state of a type, if any (a plain read; takeovers use `Promise`).
    Read {
        type_name: String,
        reply: ReplyTo<Option<CoordinatorState>>,
    },
    /// A coordinator taking over with `epoch` reads the state and asks the replica to refuse
    /// writes of older epochs from now on (see `ReplicaStore::promise`).
    Promise {
        type_name: String,
        epoch: Epoch,
        reply: ReplyTo<PromiseAck>,
    },
    /// Store the whole remembered set of a shard unless the replica holds a newer one.
    WriteEntities {
        type_name: String,
        shard: ShardId,
        set: EntitySet,
        reply: ReplyTo<EntitiesAck>,
    },
    /// Add ids to the remembered set of a shard, if the replica holds exactly `delta.base`.
    AddEntities {
        type_name: String,
        shard: ShardId,
        delta: EntityDelta,
        reply: ReplyTo<EntitiesAck>,
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

/// The ids a shard's owner added to its set between two stamps: applied by a replica that
/// holds the set stamped `base`, giving the set stamped `stamp`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EntityDelta {
    pub(crate) base: (u64, u64),
    pub(crate) stamp: (u64, u64),
    pub(crate) ids: Vec<String>,
}

/// A replica's answer to a write of remembered entities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum EntitiesAck {
    /// The replica holds the written set (stored, with a durable store).
    Held,
    /// The replica holds a set with a higher stamp (the one given) and ignored the write.
    Newer((u64, u64)),
    /// A delta whose base the replica does not hold: the writer sends the whole set.
    NeedFull,
}

/// The answer to [`ReplicaReq::Write`]: whether it was stored, and the stored epoch/version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplicaAck {
    pub(crate) accepted: bool,
    pub(crate) epoch: Epoch,
    pub(crate) version: Version,
}

/// The answer to [`ReplicaReq::Promise`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct PromiseAck {
    /// Whether the replica promised: no newer epoch was promised or written there.
    pub(crate) granted: bool,
    /// The highest epoch the replica knows of (promised or written): a refused coordinator
    /// takes over again above it.
    pub(crate) promised: Epoch,
    /// The state the replica holds.
    pub(crate) state: Option<CoordinatorState>,
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

    /// A node id may hold the separator (or be made of it): the region id still names the
    /// node's address and its node.
    #[test]
    fn region_ids_of_node_ids_with_a_hash_name_their_node() {
        for node_id in ["a#b", "#", "n#0#1", "x#", "#y"] {
            let n = UniqueAddress::new("127.0.0.1:7000", node_id, 42);
            let r = region_id(&n);
            assert_eq!(region_addr(&r), "127.0.0.1:7000", "{node_id}");
            assert_eq!(region_node(&r), Some(n), "{node_id}");
        }
        assert_eq!(region_node(&RegionId("127.0.0.1:7000#n0".into())), None);
        assert_eq!(region_node(&RegionId("127.0.0.1:7000#n0#x".into())), None);
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Deposit {
        amount: u64,
    }

    fn round_trip(w: &PeerWire<Deposit>) -> PeerWire<Deposit> {
        let bytes = rmp_serde::to_vec_named(w).unwrap();
        rmp_serde::from_slice(&bytes).unwrap()
    }

    /// Region messages travel as compact arrays around a payload that keeps its named fields.
    #[test]
    fn region_messages_round_trip_compactly() {
        let from = RegionId("127.0.0.1:1#a#7".into());
        let deliver = PeerWire {
            from: from.clone(),
            msg: PeerMsg::Deliver(Envelope {
                entity_id: "alice".into(),
                shard: 42,
                hops: 1,
                payload: Deposit { amount: 50 },
            }),
        };
        let bytes = rmp_serde::to_vec_named(&deliver).unwrap();
        assert!(
            !bytes.windows(9).any(|w| w == b"entity_id"),
            "envelope fields are not named"
        );
        assert!(
            bytes.windows(6).any(|w| w == b"amount"),
            "payload fields are"
        );
        let back = round_trip(&deliver);
        assert_eq!(back.from, from);
        assert_eq!(back.msg, deliver.msg);
        let id = HandOffId { epoch: 3, seq: 9 };
        let fence = PeerWire {
            from,
            msg: PeerMsg::Fence { id, shard: 5 },
        };
        assert_eq!(round_trip(&fence).msg, fence.msg);
    }

    #[test]
    fn an_unknown_kind_or_a_short_message_is_an_error() {
        let bad_kind = rmp_serde::to_vec(&("r", 9u8, 1u32)).unwrap();
        assert!(rmp_serde::from_slice::<PeerWire<Deposit>>(&bad_kind).is_err());
        let short = rmp_serde::to_vec(&("r", 0u8, "alice")).unwrap();
        assert!(rmp_serde::from_slice::<PeerWire<Deposit>>(&short).is_err());
    }
}
