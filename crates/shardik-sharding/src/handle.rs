//! [`Region`] and [`EntityRef`]: how callers reach entities.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use shardik_actor::{ActorSystem, AskError, ReplyTo, TellError};

use crate::hash::ShardId;
use crate::region::RegionCore;
use crate::shard::EntityId;
use crate::stats::RegionStats;

/// The entry point to one entity type: send `(entity id, message)` and the region finds or
/// starts the entity. Cloning is cheap.
pub struct Region<M> {
    core: Arc<dyn RegionCore<M>>,
}

impl<M> Clone for Region<M> {
    fn clone(&self) -> Self {
        Region {
            core: self.core.clone(),
        }
    }
}

impl<M: Send + 'static> Region<M> {
    pub(crate) fn new(core: Arc<dyn RegionCore<M>>) -> Self {
        Region { core }
    }

    /// Sends `msg` to entity `id`, starting the entity if needed. Never blocks. A message that
    /// cannot be accepted (the entity's buffer or bounded mailbox is full, or the system is
    /// shutting down) is recorded as a dead letter.
    #[inline]
    pub fn tell(&self, id: &str, msg: M) {
        let shard = self.core.shard_of(id);
        self.tell_shard(shard, id, msg);
    }

    /// Like [`tell`](Region::tell) but hands a refused message back.
    #[inline]
    pub fn try_tell(&self, id: &str, msg: M) -> Result<(), TellError<M>> {
        let shard = self.core.shard_of(id);
        self.core.deliver(shard, id, msg)
    }

    /// Sends a request built around a fresh [`ReplyTo`] to entity `id` and waits up to
    /// `timeout` for the answer.
    pub async fn ask<R>(
        &self,
        id: &str,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError> {
        let shard = self.core.shard_of(id);
        self.ask_shard(shard, id, make, timeout).await
    }

    /// A handle to one entity that remembers its shard, for repeated messages.
    pub fn entity_ref(&self, id: impl Into<EntityId>) -> EntityRef<M> {
        let id = id.into();
        EntityRef {
            shard: self.core.shard_of(&id),
            id,
            region: self.clone(),
        }
    }

    /// Asks entity `id` to passivate: it handles what it has queued, then stops; later
    /// messages start a new incarnation. Returns false if it is not active.
    pub fn passivate(&self, id: &str) -> bool {
        self.core.passivate(id)
    }

    /// The entity type's name.
    pub fn type_name(&self) -> &str {
        self.core.type_name()
    }

    /// The shard count.
    pub fn shard_count(&self) -> u32 {
        self.core.shard_count()
    }

    /// The shard entity `id` belongs to (the type's [`ShardFn`](crate::ShardFn)).
    pub fn shard_of(&self, id: &str) -> ShardId {
        self.core.shard_of(id)
    }

    /// A snapshot of the region's entities, buffers and counters.
    pub fn stats(&self) -> RegionStats {
        self.core.stats()
    }

    /// Entities (live or stopping) per shard, indexed by [`ShardId`]: how evenly the ids of
    /// this region spread over its shards.
    pub fn shard_entity_counts(&self) -> Vec<usize> {
        self.core.shard_entities()
    }

    /// The actor system the region runs in.
    pub fn system(&self) -> &ActorSystem {
        self.core.system()
    }

    #[inline]
    fn tell_shard(&self, shard: ShardId, id: &str, msg: M) {
        if let Err(e) = self.core.deliver(shard, id, msg) {
            let reason = match e {
                TellError::Stopped(_) if self.core.refusal().is_some() => {
                    "region refused by the coordinator"
                }
                TellError::Stopped(_) => "entity refused the message (system shutting down)",
                TellError::MailboxFull(_) => "entity buffer or mailbox full",
            };
            self.core.system().record_dead_letter(
                &format_args!("{}/{}", self.core.type_name(), id),
                std::any::type_name::<M>(),
                reason,
            );
        }
    }

    async fn ask_shard<R>(
        &self,
        shard: ShardId,
        id: &str,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError> {
        let (reply_to, rx) = ReplyTo::channel();
        self.deliver_and_wait(shard, id, make(reply_to), rx, timeout)
            .await
    }

    /// Sends `msg`, already built around the sender of `rx`, to entity `id` and waits for the
    /// answer.
    pub(crate) async fn ask_built<R>(
        &self,
        id: &str,
        msg: M,
        rx: tokio::sync::oneshot::Receiver<R>,
        timeout: Duration,
    ) -> Result<R, AskError> {
        let shard = self.core.shard_of(id);
        self.deliver_and_wait(shard, id, msg, rx, timeout).await
    }

    async fn deliver_and_wait<R>(
        &self,
        shard: ShardId,
        id: &str,
        msg: M,
        rx: tokio::sync::oneshot::Receiver<R>,
        timeout: Duration,
    ) -> Result<R, AskError> {
        self.core.deliver(shard, id, msg).map_err(|e| match e {
            // A region the coordinator refused says why (a shard count that differs from the
            // other nodes', say) instead of "the recipient actor has stopped".
            TellError::Stopped(_) => self
                .core
                .refusal()
                .map_or(AskError::Stopped, AskError::Undeliverable),
            TellError::MailboxFull(_) => AskError::MailboxFull,
        })?;
        let answer = if self.core.in_process() {
            self.core.system().timeout(timeout, rx).await.ok()
        } else {
            tokio::time::timeout(timeout, rx).await.ok()
        };
        match answer {
            Some(Ok(value)) => Ok(value),
            // Dropped unanswered: by a region the coordinator refused meanwhile (the message
            // waited for a home when the refusal came), which says why.
            Some(Err(_)) => Err(self
                .core
                .refusal()
                .map_or(AskError::NoReply, AskError::Undeliverable)),
            None => {
                metrics::counter!("shardik_ask_timeouts_total", "via" => "region").increment(1);
                Err(AskError::Timeout(timeout))
            }
        }
    }
}

impl<M: 'static> fmt::Debug for Region<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("type_name", &self.core.type_name())
            .field("shards", &self.core.shard_count())
            .finish()
    }
}

/// A handle to one entity by id. The entity need not be running: the first message starts
/// it, and it may be passivated and restarted between messages without the caller noticing.
pub struct EntityRef<M> {
    id: EntityId,
    shard: ShardId,
    region: Region<M>,
}

impl<M> Clone for EntityRef<M> {
    fn clone(&self) -> Self {
        EntityRef {
            id: self.id.clone(),
            shard: self.shard,
            region: self.region.clone(),
        }
    }
}

impl<M: Send + 'static> EntityRef<M> {
    /// Sends `msg` to the entity; see [`Region::tell`].
    #[inline]
    pub fn tell(&self, msg: M) {
        self.region.tell_shard(self.shard, &self.id, msg);
    }

    /// Sends `msg`, handing it back if refused; see [`Region::try_tell`].
    #[inline]
    pub fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.region.core.deliver(self.shard, &self.id, msg)
    }

    /// Asks the entity; see [`Region::ask`].
    pub async fn ask<R>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, AskError> {
        self.region
            .ask_shard(self.shard, &self.id, make, timeout)
            .await
    }

    /// The entity id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The entity's shard.
    pub fn shard(&self) -> ShardId {
        self.shard
    }
}

impl<M: 'static> fmt::Debug for EntityRef<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntityRef")
            .field("type_name", &self.region.core.type_name())
            .field("id", &self.id)
            .field("shard", &self.shard)
            .finish()
    }
}
