//! [`StoreError`] and [`CodecError`]: what a store or an encoding can fail with.

/// Why a storage operation failed.
///
/// A conflict is never resolved by the store: it refuses the write and says why, and the
/// writer decides (an entity recovers from the store and tries again with the next command).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The writer expected the entity's stream (or durable state) to end at `expected` but
    /// the store has `actual`: someone else wrote in between. Nothing was written.
    #[error("concurrency conflict on {persistence_id}: expected {expected}, store has {actual}")]
    Conflict {
        /// The stream written to.
        persistence_id: String,
        /// The sequence number (or revision) the writer expected.
        expected: u64,
        /// The sequence number (or revision) the store holds.
        actual: u64,
    },
    /// A newer writer incarnation has written this stream; this (older) writer may no
    /// longer append. Nothing was written.
    #[error("writer {writer} of {persistence_id} is fenced out by newer writer {current}")]
    Fenced {
        /// The stream written to.
        persistence_id: String,
        /// The refused writer's incarnation.
        writer: u64,
        /// The newest incarnation that has written.
        current: u64,
    },
    /// The backend failed (IO, SQL, a fault injected by a test store).
    #[error("storage backend failed: {0}")]
    Backend(String),
    /// The store has been closed or its writer has stopped.
    #[error("the store is closed")]
    Closed,
}

/// Why a value could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Serialization failed.
    #[error("cannot encode {type_name}: {reason}")]
    Encode {
        /// The type being encoded.
        type_name: &'static str,
        /// The serializer's message.
        reason: String,
    },
    /// The stored bytes do not decode into the expected type (after upcasting).
    #[error("cannot decode {type_name} version {version}: {reason}")]
    Decode {
        /// The stored type name.
        type_name: String,
        /// The stored version.
        version: u32,
        /// The deserializer's or upcaster's message.
        reason: String,
    },
    /// The record was written for another type.
    #[error("stored type {found} is not the expected {expected}")]
    WrongType {
        /// The type the reader expects.
        expected: &'static str,
        /// The type name stored with the record.
        found: String,
    },
    /// The record was written by newer code than this reader knows.
    #[error("{type_name} version {found} is newer than the supported version {supported}")]
    NewerVersion {
        /// The type name.
        type_name: &'static str,
        /// The stored version.
        found: u32,
        /// The newest version this code reads.
        supported: u32,
    },
}

/// Why an entity could not recover or persist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PersistenceError {
    /// The store failed or refused the write.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A value could not be encoded or decoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The entity cannot recover: the stored stream is not what recovery expects (a gap in
    /// sequence numbers, a snapshot ahead of the journal, a corrupt stored number), or the
    /// entity type is misconfigured (a type name with `|`).
    #[error("recovery of {persistence_id} failed: {reason}")]
    Recovery {
        /// The entity's stream.
        persistence_id: String,
        /// What is wrong.
        reason: String,
    },
}
