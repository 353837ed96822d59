//! Ways to run persistent behaviours: as plain actors ([`Props`]) or as sharded entity
//! types ([`EntityType`]).

use std::sync::Arc;

use shardik_actor::Props;
use shardik_sharding::EntityType;

use crate::durable_state::{DurableState, DurableStateEntity};
use crate::event_sourced::{EventSourced, EventSourcedEntity};
use crate::persistence::{persistence_id, type_name_problem, Persistence};
use crate::settings::PersistSettings;

impl Persistence {
    /// An entity type whose entities are event sourced; entity `id` persists to
    /// `"<type_name>|<id>"`. Start it with `system.sharding().start(..)` like any entity type.
    ///
    /// `type_name` must not contain `|`: the persistence ids of such a type could be another
    /// type's (see [`persistence_id`](crate::persistence_id)). Starting such a type fails with
    /// [`ShardingError::InvalidSettings`](shardik_sharding::ShardingError::InvalidSettings),
    /// which says why.
    pub fn event_sourced<B: EventSourced>(
        &self,
        type_name: &str,
        settings: PersistSettings,
        factory: impl Fn(&str) -> B + Send + Sync + 'static,
    ) -> EntityType<EventSourcedEntity<B>> {
        let persistence = self.clone();
        let settings = Arc::new(settings);
        let name = type_name.to_string();
        let entity = EntityType::new_fenced(type_name, move |id: &str, token| {
            EventSourcedEntity::new(
                factory(id),
                persistence_id(&name, id),
                persistence.clone(),
                settings.clone(),
            )
            .with_fencing_token(token)
        });
        refuse_if_unusable(entity)
    }

    /// An entity type whose entities are durable-state entities; see
    /// [`event_sourced`](Persistence::event_sourced) (a `type_name` with `|` is refused the
    /// same way).
    pub fn durable_state<B: DurableState>(
        &self,
        type_name: &str,
        settings: PersistSettings,
        factory: impl Fn(&str) -> B + Send + Sync + 'static,
    ) -> EntityType<DurableStateEntity<B>> {
        let persistence = self.clone();
        let settings = Arc::new(settings);
        let name = type_name.to_string();
        let entity = EntityType::new_fenced(type_name, move |id: &str, token| {
            DurableStateEntity::new(
                factory(id),
                persistence_id(&name, id),
                persistence.clone(),
                settings.clone(),
            )
            .with_fencing_token(token)
        });
        refuse_if_unusable(entity)
    }

    /// Props for a plain event-sourced actor writing stream `persistence_id`. The factory
    /// runs again on every restart, and each new instance recovers from the store.
    pub fn event_sourced_props<B: EventSourced>(
        &self,
        persistence_id: &str,
        settings: PersistSettings,
        factory: impl Fn() -> B + Send + 'static,
    ) -> Props<EventSourcedEntity<B>> {
        let persistence = self.clone();
        let settings = Arc::new(settings);
        let pid = persistence_id.to_string();
        Props::new(move || {
            EventSourcedEntity::new(
                factory(),
                pid.clone(),
                persistence.clone(),
                settings.clone(),
            )
        })
    }

    /// Props for a plain durable-state actor saving under `persistence_id`.
    pub fn durable_state_props<B: DurableState>(
        &self,
        persistence_id: &str,
        settings: PersistSettings,
        factory: impl Fn() -> B + Send + 'static,
    ) -> Props<DurableStateEntity<B>> {
        let persistence = self.clone();
        let settings = Arc::new(settings);
        let pid = persistence_id.to_string();
        Props::new(move || {
            DurableStateEntity::new(
                factory(),
                pid.clone(),
                persistence.clone(),
                settings.clone(),
            )
        })
    }
}

/// `entity`, refused at start if its type name cannot prefix persistence ids.
fn refuse_if_unusable<A: shardik_actor::Actor>(entity: EntityType<A>) -> EntityType<A> {
    match type_name_problem(entity.name()) {
        Some(problem) => entity.refuse_start(problem),
        None => entity,
    }
}
