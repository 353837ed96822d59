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
    ///
    /// It must not be above `i64::MAX` (SQLite and PostgreSQL keep signed 64-bit numbers):
    /// every write with such a writer is refused with a [`StoreError::Backend`] naming it, on
    /// every backend. An incarnation of `i64::MAX` is written, but no other node can take a
    /// stream it wrote over (there is no writer above it).
    ///
    /// [`StoreError::Backend`]: crate::StoreError::Backend
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
///
/// Ids are told apart only if no type name contains `|` (type `"a|b"` with entity `"c"` and
/// type `"a"` with entity `"b|c"` would both write stream `"a|b|c"`), so
/// [`Persistence::event_sourced`] and [`Persistence::durable_state`] refuse such a type name:
/// their entities fail to start (see there). This function does not check.
pub fn persistence_id(type_name: &str, entity_id: &str) -> String {
    let mut id = String::with_capacity(type_name.len() + 1 + entity_id.len());
    id.push_str(type_name);
    id.push(SEPARATOR);
    id.push_str(entity_id);
    id
}

/// What separates the type name from the entity id in a [`persistence_id`].
const SEPARATOR: char = '|';

/// Why `type_name` cannot prefix persistence ids, if it cannot: it holds the separator, so
/// its ids could be another type's.
pub(crate) fn type_name_problem(type_name: &str) -> Option<String> {
    type_name.contains(SEPARATOR).then(|| {
        format!(
            "the entity type name {type_name:?} contains {SEPARATOR:?}, which separates the type \
             name from the entity id in persistence ids: its streams could be another type's \
             (type \"a|b\" with entity \"c\" and type \"a\" with entity \"b|c\" both write \
             \"a|b|c\"); rename the type"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_name_with_the_separator_is_refused() {
        assert_eq!(type_name_problem("account"), None);
        assert_eq!(type_name_problem("bank.account-v2"), None);
        let problem = type_name_problem("a|b").expect("refused");
        assert!(problem.contains("\"a|b\" contains '|'"), "{problem}");
        assert_eq!(persistence_id("a|b", "c"), persistence_id("a", "b|c"));
    }
}
