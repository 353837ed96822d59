//! The records stores keep: appends, persisted events, snapshots and durable state.

use crate::codec::Payload;

/// A writer's incarnation. Every write carries one; a store refuses writes to a stream from
/// an incarnation older than the newest that has written it ([`StoreError::Fenced`]).
///
/// [`StoreError::Fenced`]: crate::StoreError::Fenced
pub type Incarnation = u64;

/// One atomic append of events to one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendRequest {
    /// The stream (for entities: `"<type>|<entity id>"`).
    pub persistence_id: String,
    /// The highest sequence number the writer has seen; the first event gets this plus one.
    /// If the store holds another number the append fails with a conflict.
    pub expected_seq_nr: u64,
    /// The writer's incarnation.
    pub writer: Incarnation,
    /// The events, in order. All or none are written.
    pub events: Vec<Payload>,
}

/// An event as stored in a journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistedEvent {
    /// Its stream.
    pub persistence_id: String,
    /// Its position in the stream, from 1 without gaps.
    pub seq_nr: u64,
    /// The incarnation that wrote it.
    pub writer: Incarnation,
    /// The event.
    pub payload: Payload,
}

/// A snapshot of an entity's state after the event with `seq_nr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// Its stream.
    pub persistence_id: String,
    /// The sequence number of the last event included in the state.
    pub seq_nr: u64,
    /// The state.
    pub payload: Payload,
}

/// A write of a durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    /// The entity.
    pub persistence_id: String,
    /// The revision the writer has seen (0 if none was stored); the new one is this plus one.
    pub expected_revision: u64,
    /// The writer's incarnation.
    pub writer: Incarnation,
    /// The new state.
    pub payload: Payload,
}

/// A stored durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRecord {
    /// The entity.
    pub persistence_id: String,
    /// How many times it was written, from 1.
    pub revision: u64,
    /// The state.
    pub payload: Payload,
}
