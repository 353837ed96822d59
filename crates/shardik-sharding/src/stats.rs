//! A snapshot of a region's state.

/// What a region holds and has done; from [`Region::stats`](crate::Region::stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// The entity type.
    pub type_name: String,
    /// The configured shard count.
    pub shards: u32,
    /// Shards with at least one entity.
    pub active_shards: u32,
    /// Entities with a live incarnation that accepts messages.
    pub active_entities: usize,
    /// Entities that are stopping (passivating); their messages wait in buffers.
    pub stopping_entities: usize,
    /// Messages waiting in the buffers of stopping entities and, in a cluster, for shards
    /// whose home is unknown or moving, or held while the node is fenced.
    pub buffered_messages: usize,
    /// Entity incarnations started since the region started.
    pub spawned_total: u64,
    /// Passivations because an entity was idle.
    pub passivated_idle_total: u64,
    /// Passivations because the live-entity cap was reached (least recently used first).
    pub passivated_lru_total: u64,
    /// Messages refused (full buffer or mailbox) or lost to dead letters by this region.
    pub rejected_total: u64,
}
