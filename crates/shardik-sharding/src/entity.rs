//! [`EntityType`]: what an entity is and how its region runs it.

use std::sync::Arc;
use std::time::Duration;

use shardik_actor::{Actor, ActorSettings, MailboxConfig, SupervisorStrategy};

use crate::coordination::FencingToken;
use crate::error::ShardingError;
use crate::hash::{ShardFn, ShardId};

/// Default number of shards of an entity type.
pub const DEFAULT_SHARDS: u32 = 100;
/// The largest shard count an entity type (or a cluster proxy) may have: 65 536. A region
/// keeps a little state per shard from the start (a lock, counters), so a count far beyond
/// the shards a cluster can use would only cost memory, and `u32::MAX` would not fit in it.
pub const MAX_SHARDS: u32 = 1 << 16;
/// Default limit of messages buffered per entity while it stops.
pub const DEFAULT_BUFFER_LIMIT: usize = 10_000;

/// Makes an entity from its id and the fencing token of its shard's allocation.
pub(crate) type EntityFactory<A> = Arc<dyn Fn(&str, Option<FencingToken>) -> A + Send + Sync>;

/// The definition of an entity type: a name, a factory from entity id to actor, a shard count
/// and how entities are passivated.
///
/// ```
/// use std::time::Duration;
/// use shardik_sharding::EntityType;
/// # use shardik_actor::{Actor, ActorError, Context};
/// # struct Sensor { id: String }
/// # impl Actor for Sensor {
/// #     type Msg = f64;
/// #     async fn handle(&mut self, _m: f64, _c: &mut Context<Self>) -> Result<(), ActorError> { Ok(()) }
/// # }
///
/// let sensors = EntityType::new("sensor", |id: &str| Sensor { id: id.to_string() })
///     .shards(256)
///     .idle_timeout(Duration::from_secs(120))
///     .max_live_entities(50_000);
/// # let _ = sensors;
/// ```
pub struct EntityType<A: Actor> {
    pub(crate) name: String,
    pub(crate) factory: EntityFactory<A>,
    pub(crate) shards: u32,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_live: Option<usize>,
    pub(crate) buffer_limit: usize,
    pub(crate) settings: ActorSettings<A::Msg>,
    pub(crate) shard_fn: ShardFn,
    /// Why the type must not start (set by a layer that builds entity types).
    pub(crate) refused: Option<String>,
}

impl<A: Actor> EntityType<A> {
    /// An entity type called `name` whose entities are made by `factory` from their id. The
    /// factory is called again when an entity restarts after a failure or comes back after
    /// passivation.
    pub fn new(
        name: impl Into<String>,
        factory: impl Fn(&str) -> A + Send + Sync + 'static,
    ) -> Self {
        Self::new_fenced(name, move |id, _| factory(id))
    }

    /// Like [`new`](EntityType::new), but the factory also gets the [`FencingToken`] of the
    /// allocation of the entity's shard to this node, for entities that write to a store
    /// shared by the cluster: writing with it lets the store refuse a node that still runs
    /// the entity after its shard moved on (after a network partition, say), because the new
    /// owner's token is higher. It is the same for every incarnation of the entity started
    /// under one allocation (restarts included) and higher after every move.
    ///
    /// `None` where no coordinator hands out tokens: in a region started with
    /// [`Sharding::start`](crate::Sharding::start) (one node), and for shards allocated by a
    /// coordinator of an older version. `shardik-persistence`'s entity types use it.
    ///
    /// ```
    /// use shardik_sharding::EntityType;
    /// # use shardik_actor::{Actor, ActorError, Context};
    /// # struct Account { id: String, writer: Option<u64> }
    /// # impl Actor for Account {
    /// #     type Msg = ();
    /// #     async fn handle(&mut self, _: (), _: &mut Context<Self>) -> Result<(), ActorError> { Ok(()) }
    /// # }
    /// let accounts = EntityType::new_fenced("account", |id: &str, token: Option<u64>| Account {
    ///     id: id.to_string(),
    ///     writer: token,
    /// });
    /// assert_eq!(accounts.name(), "account");
    /// ```
    pub fn new_fenced(
        name: impl Into<String>,
        factory: impl Fn(&str, Option<FencingToken>) -> A + Send + Sync + 'static,
    ) -> Self {
        EntityType {
            name: name.into(),
            factory: Arc::new(factory),
            shards: DEFAULT_SHARDS,
            idle_timeout: None,
            max_live: None,
            buffer_limit: DEFAULT_BUFFER_LIMIT,
            settings: ActorSettings::default(),
            shard_fn: ShardFn::md5(),
            refused: None,
        }
    }

    /// Makes starting the type fail with [`ShardingError::InvalidSettings`] carrying
    /// `problem`: for a layer that builds entity types (as `shardik-persistence` does) and
    /// finds its input unusable, so that the mistake surfaces where the type is started, not
    /// as failing entities later.
    pub fn refuse_start(mut self, problem: impl Into<String>) -> Self {
        self.refused = Some(problem.into());
        self
    }

    /// The number of shards (default 100), from 1 to [`MAX_SHARDS`] (65 536; starting the type
    /// with another count is [`ShardingError::InvalidSettings`]). Pick about ten times the
    /// largest number of nodes you expect; it cannot change while any node runs the type.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// Maps entity ids to shards with `f(entity_id, shard_count)` instead of the MD5 rule
    /// ([`shard_of`](crate::shard_of)); the result is taken modulo the shard count. Every
    /// route to the type uses it (`tell`, `ask`, `entity_ref`, extractors, passivation).
    ///
    /// In a cluster the function must be deterministic and the same on every node, proxies
    /// included (see [`ShardFn`]); a region whose function differs from the coordinator's on
    /// the probe ids is refused.
    ///
    /// ```
    /// use shardik_sharding::EntityType;
    /// # use shardik_actor::{Actor, ActorError, Context};
    /// # struct Account;
    /// # impl Actor for Account {
    /// #     type Msg = u64;
    /// #     async fn handle(&mut self, _m: u64, _c: &mut Context<Self>) -> Result<(), ActorError> { Ok(()) }
    /// # }
    /// // Ids like "eu-1234": one shard per region prefix.
    /// let accounts = EntityType::new("account", |_id: &str| Account)
    ///     .shards(4)
    ///     .shard_fn(|id: &str, _shards: u32| match id.split('-').next() {
    ///         Some("eu") => 0,
    ///         Some("us") => 1,
    ///         Some("ap") => 2,
    ///         _ => 3,
    ///     });
    /// # let _ = accounts;
    /// ```
    pub fn shard_fn(mut self, f: impl Fn(&str, u32) -> ShardId + Send + Sync + 'static) -> Self {
        self.shard_fn = ShardFn::new(f);
        self
    }

    /// Passivates an entity that has received no message for `timeout`.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// Caps the live entities of this type on this node; past the cap the least recently
    /// used entity is passivated.
    pub fn max_live_entities(mut self, max: usize) -> Self {
        self.max_live = Some(max);
        self
    }

    /// Caps the messages buffered for one entity while it stops (default 10 000). A message
    /// over the cap is refused: `try_tell` reports it and `tell` records a dead letter. The
    /// cap bounds what senders add: messages a cluster node accepted earlier (held while it
    /// was fenced, or not handled by an entity the node stopped) are buffered past it.
    pub fn buffer_limit(mut self, limit: usize) -> Self {
        self.buffer_limit = limit;
        self
    }

    /// The supervisor strategy of each entity (default: restart, 10 within 60 s).
    pub fn supervisor(mut self, strategy: SupervisorStrategy) -> Self {
        self.settings = self.settings.supervisor(strategy);
        self
    }

    /// The mailbox of each entity (default unbounded).
    pub fn mailbox(mut self, mailbox: MailboxConfig) -> Self {
        self.settings = self.settings.mailbox(mailbox);
        self
    }

    /// Messages an entity handles per scheduling turn (default 64; at least 1).
    pub fn throughput(mut self, messages: usize) -> Self {
        self.settings = self.settings.throughput(messages);
        self
    }

    /// The type's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn validate(&self) -> Result<(), ShardingError> {
        let problem = if let Some(refused) = &self.refused {
            Some(refused.clone())
        } else if self.name.is_empty() {
            Some("the type name is empty".to_string())
        } else if let Some(problem) = shard_count_problem(self.shards) {
            Some(problem)
        } else if self.max_live == Some(0) {
            Some("max_live_entities must be at least 1".to_string())
        } else if self.idle_timeout == Some(Duration::ZERO) {
            Some("idle_timeout must be longer than zero".to_string())
        } else if self
            .idle_timeout
            .is_some_and(|d| d > crate::cluster::ClusterShardingSettings::MAX_DURATION)
        {
            // Counted in milliseconds: a longer one would wrap to a short timeout.
            Some("idle_timeout must be at most a year (use none for no timeout)".to_string())
        } else if self.buffer_limit == 0 {
            Some("buffer_limit must be at least 1".to_string())
        } else {
            None
        };
        match problem {
            Some(problem) => Err(ShardingError::InvalidSettings {
                name: self.name.clone(),
                problem,
            }),
            None => Ok(()),
        }
    }
}

/// What is wrong with a shard count, if anything (outside 1 to [`MAX_SHARDS`]).
pub(crate) fn shard_count_problem(shards: u32) -> Option<String> {
    if shards == 0 {
        Some("the shard count must be at least 1".to_string())
    } else if shards > MAX_SHARDS {
        Some(format!(
            "the shard count {shards} is above the maximum of {MAX_SHARDS}"
        ))
    } else {
        None
    }
}

impl<A: Actor> std::fmt::Debug for EntityType<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntityType")
            .field("name", &self.name)
            .field("shards", &self.shards)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_live", &self.max_live)
            .field("buffer_limit", &self.buffer_limit)
            .field("settings", &self.settings)
            .field("shard_fn", &self.shard_fn)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardik_actor::{ActorError, Context};

    struct Nop;

    impl Actor for Nop {
        type Msg = ();

        async fn handle(&mut self, _m: (), _c: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
    }

    /// A shard count above the maximum is refused before anything is allocated per shard
    /// (`u32::MAX` used to try to allocate four billion locks, and abort).
    #[test]
    fn the_shard_count_is_bounded() {
        let with = |n: u32| EntityType::new("t", |_: &str| Nop).shards(n).validate();
        assert!(with(1).is_ok());
        assert!(with(MAX_SHARDS).is_ok());
        for n in [0, MAX_SHARDS + 1, u32::MAX] {
            match with(n) {
                Err(ShardingError::InvalidSettings { name, problem }) => {
                    assert_eq!(name, "t");
                    assert!(problem.contains("shard count"), "{problem}");
                }
                other => panic!("{n} shards: expected InvalidSettings, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_type_refused_by_the_layer_that_built_it_does_not_start() {
        let refused = EntityType::new("t", |_: &str| Nop).refuse_start("the name is unusable");
        assert_eq!(
            refused.validate(),
            Err(ShardingError::InvalidSettings {
                name: "t".into(),
                problem: "the name is unusable".into()
            })
        );
    }
}
