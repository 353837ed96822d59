//! [`Persistence`]: the stores an entity uses and the writer incarnation it writes with.

use std::sync::Arc;

use crate::record::Incarnation;
use crate::store::{Journal, SnapshotStore, StateStore};

/// The stores entities persist to, plus this node's writer incarnation. Cheap to clone.
///
/// ```
/// # use std::sync::Arc;
/// use shardik_persistence::{InMemoryStore, Persistence};
/// let persistence = Persistence::new(Arc::new(InMemoryStore::new())).with_incarnation(7);
/// assert_eq!(persistence.incarnation(), 7);
/// ```
#[derive(Clone)]
pub struct Persistence {
    journal: Arc<dyn Journal>,
    snapshots: Arc<dyn SnapshotStore>,
    states: Arc<dyn StateStore>,
    incarnation: Incarnation,
}

impl Persistence {
    /// Uses one store for events, snapshots and durable state. The writer incarnation is the
    /// current time in microseconds, so a node started later fences out an earlier one
    /// (set it explicitly with [`with_incarnation`](Persistence::with_incarnation) when the
    /// cluster hands out incarnations, or if the clock of a restarted node may be behind
    /// the one it replaces: its writes would be fenced out).
    pub fn new<S: Journal + SnapshotStore + StateStore>(store: Arc<S>) -> Self {
        Self::from_parts(store.clone(), store.clone(), store)
    }

    /// Uses separate stores.
    pub fn from_parts(
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        states: Arc<dyn StateStore>,
    ) -> Self {
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        Persistence {
            journal,
            snapshots,
            states,
            incarnation,
        }
    }

    /// Sets the incarnation written with every event and state.
    pub fn with_incarnation(mut self, incarnation: Incarnation) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// The writer incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// The event journal.
    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.journal
    }

    /// The snapshot store.
    pub fn snapshots(&self) -> &Arc<dyn SnapshotStore> {
        &self.snapshots
    }

    /// The durable state store.
    pub fn states(&self) -> &Arc<dyn StateStore> {
        &self.states
    }
}

impl std::fmt::Debug for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistence")
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

/// The persistence id of entity `entity_id` of type `type_name`: `"<type>|<id>"`.
pub fn persistence_id(type_name: &str, entity_id: &str) -> String {
    let mut id = String::with_capacity(type_name.len() + 1 + entity_id.len());
    id.push_str(type_name);
    id.push('|');
    id.push_str(entity_id);
    id
}
