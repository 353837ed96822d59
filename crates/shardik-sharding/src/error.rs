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
}
