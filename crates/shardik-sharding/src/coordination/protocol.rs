//! The messages of the coordination protocol and the identifiers they carry.
//!
//! Three enums, one per direction: [`ToCoordinator`] (region → coordinator), [`ToRegion`]
//! (coordinator → region) and [`PeerMsg`] (region → region: forwarded entity messages and
//! hand-off fences, which must travel on the same ordered channel). All are serde-serializable
//! so the IO layer can carry them as they are.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ShardId;

/// The identity of a region: one entity type on one node incarnation (e.g. `host:port:uid`).
///
/// Ordered, so ties in allocation are broken deterministically by region id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RegionId(pub String);

impl RegionId {
    /// A region id from anything string-like.
    pub fn new(id: impl Into<String>) -> Self {
        RegionId(id.into())
    }
}

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A coordinator incarnation. Bumped (and persisted) by every coordinator that takes over.
///
/// In a cluster an epoch is a *round* (the upper 48 bits, one more than the highest round
/// the new coordinator read) and a *tag* of the coordinator's node (the lower 16 bits), see
/// [`next_epoch`]: two nodes that take over at once from the same state (views that disagree
/// for a moment) get different epochs, so the replicas fence the lower one.
pub type Epoch = u64;

/// Bits of an [`Epoch`] that tag the coordinator's node.
pub const EPOCH_TAG_BITS: u32 = 16;

/// The round of `epoch` (see [`Epoch`]).
pub fn epoch_round(epoch: Epoch) -> u64 {
    epoch >> EPOCH_TAG_BITS
}

/// The epoch of a coordinator that takes over after reading `read`: the next round, tagged
/// with `tag` (a hash of the coordinator's node). Always above `read`. Two coordinators get
/// equal epochs only if their tags collide (1 in 65 536 for distinct nodes); a replica
/// promises an epoch once, so of two such takeovers at most one gathers a majority.
pub fn next_epoch(read: Epoch, tag: u64) -> Epoch {
    let mask = (1u64 << EPOCH_TAG_BITS) - 1;
    ((epoch_round(read) + 1) << EPOCH_TAG_BITS) | (tag & mask)
}

/// The version of the coordinator state: bumped by every [`StateUpdate`](super::StateUpdate).
pub type Version = u64;

/// Names one allocation of a shard to a region: every allocation gets a token higher than
/// every token handed out before it for the entity type (the coordinator's wall clock in
/// microseconds since the Unix epoch, or one more than the last token if the clock is
/// behind). The owner's entities write with it, so a store can refuse the writes of an
/// owner whose shard has since moved ([`FencingToken`]s are compared, never trusted to be
/// unique across entity types). 0 means "no token" (a coordinator that hands out none).
pub type FencingToken = u64;

/// Names one hand-off attempt of one coordinator incarnation; a retry after an abort gets a new id,
/// so late acknowledgements of an aborted attempt are recognised and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HandOffId {
    /// The epoch of the coordinator that started it.
    pub epoch: Epoch,
    /// A sequence number within that epoch.
    pub seq: u64,
}

/// An entity message on its way to the region that hosts its shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<M> {
    /// The entity id.
    pub entity_id: String,
    /// The shard of the entity id (computed once by the sender's region).
    pub shard: ShardId,
    /// How many times regions forwarded it (bounded by `RegionConfig::max_hops` to stop loops
    /// between regions whose caches disagree for a moment).
    pub hops: u8,
    /// The message itself.
    pub payload: M,
}

impl<M> Envelope<M> {
    /// A new envelope with zero hops.
    pub fn new(entity_id: impl Into<String>, shard: ShardId, payload: M) -> Self {
        Envelope {
            entity_id: entity_id.into(),
            shard,
            hops: 0,
            payload,
        }
    }
}

/// Messages a region sends to the coordinator of its entity type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// Register (or re-register after a coordinator change). Idempotent; retried until
    /// [`ToRegion::RegisterAck`] or [`ToRegion::RegisterRefused`] arrives.
    Register {
        /// The region's shard count; must equal the coordinator's.
        shard_count: u32,
        /// Proxy-only: routes, never hosts.
        proxy: bool,
        /// The [fingerprint](crate::ShardFn::fingerprint) of the region's id-to-shard rule, if
        /// it is to be checked; must equal the coordinator's.
        #[serde(default)]
        shard_fn: Option<u64>,
        /// The region's registration attempt, echoed by the answer so that the region takes
        /// only an answer to its current attempt (a late ack of a previous coordinator is
        /// ignored). Starts at 1 and grows with every new attempt (a coordinator change, a
        /// stale epoch); retries of one attempt repeat it. 0: not numbered (an older region).
        #[serde(default)]
        attempt: u64,
    },
    /// Where does this shard live? Answered with [`ToRegion::ShardHome`], allocating if needed.
    GetShardHome {
        /// The epoch the region registered with.
        epoch: Epoch,
        /// The shard.
        shard: ShardId,
    },
    /// The region stopped routing to the shard and buffers its messages.
    BeginHandOffAck {
        /// The hand-off.
        id: HandOffId,
        /// The shard.
        shard: ShardId,
        /// The region to which a [`PeerMsg::Fence`] was sent (the home it had cached), if any.
        fenced: Option<RegionId>,
    },
    /// The owner stopped every entity of the shard (answer to [`ToRegion::HandOff`], repeated
    /// if the hand-off is sent again).
    ShardStopped {
        /// The hand-off.
        id: HandOffId,
        /// The shard.
        shard: ShardId,
    },
}

impl ToCoordinator {
    /// The epoch the message was sent under, if it carries one (`Register` does not).
    pub fn epoch(&self) -> Option<Epoch> {
        match self {
            ToCoordinator::Register { .. } => None,
            ToCoordinator::GetShardHome { epoch, .. } => Some(*epoch),
            ToCoordinator::BeginHandOffAck { id, .. } | ToCoordinator::ShardStopped { id, .. } => {
                Some(id.epoch)
            }
        }
    }
}

/// Why the coordinator refused a region's registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RegisterError {
    /// The region was started with another shard count than the coordinator's: entities would be
    /// homed twice. Every node must use the same shard count for an entity type.
    #[error(
        "shard count mismatch: the coordinator uses {coordinator} shards, this region {region}; \
         every node must start the entity type with the same shard count"
    )]
    ShardCountMismatch {
        /// The coordinator's shard count.
        coordinator: u32,
        /// The region's shard count.
        region: u32,
    },
    /// The region maps entity ids to shards with another rule than the coordinator's (their
    /// [fingerprints](crate::ShardFn::fingerprint) differ): one entity id could be homed in two
    /// shards. Every node must use the same shard function for an entity type.
    #[error(
        "shard function mismatch: the region maps entity ids to shards differently than the \
         coordinator (fingerprints {region:#x} and {coordinator:#x}); every node, proxies \
         included, must use the same shard function for the entity type"
    )]
    ShardFnMismatch {
        /// The coordinator's fingerprint.
        coordinator: u64,
        /// The region's fingerprint.
        region: u64,
    },
    /// The region's node was downed; a downed incarnation never comes back.
    #[error("region {0} was downed and cannot register again")]
    Downed(RegionId),
}

/// Messages the coordinator sends to a region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToRegion {
    /// Registration accepted under `epoch`, with every shard home known (durably) at that point.
    /// Shards not listed are unallocated or moving; the region asks for them when needed.
    RegisterAck {
        /// The coordinator's epoch.
        epoch: Epoch,
        /// Shard homes.
        homes: Vec<(ShardId, RegionId)>,
        /// The fencing tokens of the shards homed at the registering region.
        #[serde(default)]
        tokens: Vec<(ShardId, FencingToken)>,
        /// The `attempt` of the [`ToCoordinator::Register`] this answers (0 from an older
        /// coordinator, which does not echo it).
        #[serde(default)]
        attempt: u64,
    },
    /// Registration refused; the region stops retrying and refuses messages.
    RegisterRefused {
        /// The coordinator's epoch.
        epoch: Epoch,
        /// Why.
        error: RegisterError,
        /// The `attempt` of the [`ToCoordinator::Register`] this answers (0 from an older
        /// coordinator, which does not echo it).
        #[serde(default)]
        attempt: u64,
    },
    /// A shard's home (durably recorded). Sent to the asker, and broadcast to all regions when a
    /// shard is allocated or a hand-off ends.
    ShardHome {
        /// The coordinator's epoch.
        epoch: Epoch,
        /// The shard.
        shard: ShardId,
        /// Its home.
        region: RegionId,
        /// The allocation's fencing token (0: none, from an older coordinator).
        #[serde(default)]
        token: FencingToken,
    },
    /// Stop routing to `shard`, buffer its messages, and acknowledge.
    BeginHandOff {
        /// The hand-off.
        id: HandOffId,
        /// The shard.
        shard: ShardId,
    },
    /// To the owner: once the fences of `fences` have arrived, stop the shard's entities and answer
    /// [`ToCoordinator::ShardStopped`].
    HandOff {
        /// The hand-off.
        id: HandOffId,
        /// The shard.
        shard: ShardId,
        /// Regions that sent a [`PeerMsg::Fence`] to the owner: after it, they send nothing more for
        /// this shard, so every message they forwarded before has arrived.
        fences: Vec<RegionId>,
    },
    /// The region's message carried an epoch older than the coordinator's: register again.
    StaleEpoch {
        /// The coordinator's epoch.
        epoch: Epoch,
    },
    /// To a leaving region: all its shards have been handed off; it may exit.
    LeaveComplete {
        /// The coordinator's epoch.
        epoch: Epoch,
    },
}

impl ToRegion {
    /// The epoch the message was sent under.
    pub fn epoch(&self) -> Epoch {
        match self {
            ToRegion::RegisterAck { epoch, .. }
            | ToRegion::RegisterRefused { epoch, .. }
            | ToRegion::ShardHome { epoch, .. }
            | ToRegion::StaleEpoch { epoch }
            | ToRegion::LeaveComplete { epoch } => *epoch,
            ToRegion::BeginHandOff { id, .. } | ToRegion::HandOff { id, .. } => id.epoch,
        }
    }
}

/// Messages between regions, on one ordered channel per pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerMsg<M> {
    /// An entity message forwarded to the region believed to host its shard.
    Deliver(Envelope<M>),
    /// Sent on [`ToRegion::BeginHandOff`] to the home the sender had cached: nothing more for
    /// `shard` follows from this sender until the shard has a new home.
    Fence {
        /// The hand-off.
        id: HandOffId,
        /// The shard.
        shard: ShardId,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Epochs of coordinators that take over from the same state differ (by their tags) and
    /// are above it; the next takeover is a round above both.
    #[test]
    fn takeovers_from_one_state_get_distinct_increasing_epochs() {
        let read = next_epoch(0, 7);
        assert_eq!(epoch_round(read), 1);
        let (a, b) = (next_epoch(read, 1), next_epoch(read, 2));
        assert!(a > read && b > read && a != b);
        assert_eq!((epoch_round(a), epoch_round(b)), (2, 2));
        assert!(next_epoch(a.max(b), 0) > a.max(b));
        // Only the low bits of the tag count.
        assert_eq!(next_epoch(read, 1), next_epoch(read, 1 | (1 << 40)));
    }
}
