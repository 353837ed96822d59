//! Errors of the sharding layer.

/// Why an entity type could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardingError {
    /// An entity type with this name already runs on this system.
    #[error(
        "entity type {0:?} is already started on this node; each type name may be started once"
    )]
    AlreadyStarted(String),
    /// An entity type with this name runs with a different message type.
    #[error("entity type {name:?} runs with message type {actual}, not {requested}")]
    WrongMessageType {
        /// The type name.
        name: String,
        /// The message type it was started with.
        actual: &'static str,
        /// The message type asked for.
        requested: &'static str,
    },
    /// A setting is out of range; the text names it.
    #[error("invalid settings for entity type {name:?}: {problem}")]
    InvalidSettings {
        /// The type name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A cluster entity type's coordinator refused this node's region because the node started
    /// the type with another shard count: every message to the type fails on this node.
    #[error(
        "entity type {name:?}: shard count mismatch: the coordinator uses {coordinator} shards, \
         this node started the type with {this_node}; every node must use the same shard count"
    )]
    ShardCountMismatch {
        /// The type name.
        name: String,
        /// The coordinator's shard count.
        coordinator: u32,
        /// This node's shard count.
        this_node: u32,
    },
    /// A cluster entity type's coordinator refused this node's region for another reason
    /// (its node was downed).
    #[error("entity type {name:?}: region refused by the coordinator: {reason}")]
    Refused {
        /// The type name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The cluster sharding state store failed to load, or was set too late (cluster
    /// sharding already ran on the node).
    #[error("cluster sharding state store: {0}")]
    StateStore(String),
    /// No entity type of this name is started on this node.
    #[error("entity type {0:?} is not started on this node")]
    NotStarted(String),
    /// The node's region of a cluster entity type did not register with a coordinator in time
    /// (no member hosting the type is `Up`, or the coordinator is still starting).
    #[error("entity type {name:?}: not registered with a coordinator within {timeout:?}")]
    NotRegistered {
        /// The type name.
        name: String,
        /// How long was waited.
        timeout: std::time::Duration,
    },
}
