//! [`Sharding`]: the per-system registry of entity types.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use shardik_actor::{Actor, ActorSystem};

use crate::entity::EntityType;
use crate::error::ShardingError;
use crate::handle::Region;
use crate::region::LocalRegion;

struct Registered {
    msg_type: &'static str,
    region: Box<dyn Any + Send + Sync>,
}

/// The sharding extension of one [`ActorSystem`]: starts entity types and finds their regions.
///
/// Regions live as long as the system, whether or not callers keep their [`Region`] handles.
pub struct Sharding {
    system: ActorSystem,
    types: Mutex<HashMap<String, Registered>>,
}

impl Sharding {
    /// The sharding extension of `system` (created on first use).
    pub fn get(system: &ActorSystem) -> Arc<Sharding> {
        system.extension(|system| Sharding {
            system: system.clone(),
            types: Mutex::new(HashMap::new()),
        })
    }

    /// Starts `entity` on this node and returns its region.
    ///
    /// Entity messages must be serializable: the same entity types run unchanged when the node
    /// joins a cluster and messages travel between nodes.
    ///
    /// # Errors
    /// [`ShardingError::AlreadyStarted`] if a type of that name runs already, and
    /// [`ShardingError::InvalidSettings`] for out-of-range settings.
    pub fn start<A>(&self, entity: EntityType<A>) -> Result<Region<A::Msg>, ShardingError>
    where
        A: Actor,
        A::Msg: Serialize + DeserializeOwned,
    {
        entity.validate()?;
        let mut types = self.types.lock();
        if types.contains_key(entity.name()) {
            return Err(ShardingError::AlreadyStarted(entity.name().to_string()));
        }
        let name = entity.name().to_string();
        let region = Region::new(LocalRegion::start(&self.system, entity));
        types.insert(
            name,
            Registered {
                msg_type: std::any::type_name::<A::Msg>(),
                region: Box::new(region.clone()),
            },
        );
        Ok(region)
    }

    /// The region of a started entity type.
    ///
    /// # Errors
    /// `Ok(None)` if no such type runs; [`ShardingError::WrongMessageType`] if it runs with
    /// another message type.
    pub fn region<M: Send + 'static>(
        &self,
        type_name: &str,
    ) -> Result<Option<Region<M>>, ShardingError> {
        let types = self.types.lock();
        let Some(reg) = types.get(type_name) else {
            return Ok(None);
        };
        match reg.region.downcast_ref::<Region<M>>() {
            Some(region) => Ok(Some(region.clone())),
            None => Err(ShardingError::WrongMessageType {
                name: type_name.to_string(),
                actual: reg.msg_type,
                requested: std::any::type_name::<M>(),
            }),
        }
    }

    /// Names of the entity types started on this node, sorted.
    pub fn type_names(&self) -> Vec<String> {
        let mut names: Vec<_> = self.types.lock().keys().cloned().collect();
        names.sort();
        names
    }
}

/// Adds [`sharding`](ShardingExt::sharding) to [`ActorSystem`].
pub trait ShardingExt {
    /// The system's [`Sharding`] extension.
    fn sharding(&self) -> Arc<Sharding>;
}

impl ShardingExt for ActorSystem {
    fn sharding(&self) -> Arc<Sharding> {
        Sharding::get(self)
    }
}
