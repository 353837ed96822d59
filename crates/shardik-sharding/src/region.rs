//! The region: the node-local home of one entity type. It routes `(entity id, message)` to the
//! shard's [`ShardState`], spawns entity actors on demand, and runs passivation.
//!
//! Routing happens on the caller's thread: hash the id, lock the one shard, queue the message
//! into the entity's mailbox. There is no region actor on the hot path, so a `tell` to a live
//! entity costs one hash, one short lock and one mailbox push.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lru::LruCache;
use parking_lot::Mutex;
use shardik_actor::{
    Actor, ActorRef, ActorSettings, ActorSystem, Props, StopReason, TellError, Termination,
};

use crate::coordination::FencingToken;
use crate::entity::{EntityFactory, EntityType};
use crate::hash::{ShardFn, ShardId};
use crate::shard::{
    AfterStop, Delivery, Ended, EntityHandle, EntityId, ShardState, MAX_STARTS_WITHOUT_PROGRESS,
};
use crate::stats::RegionStats;

/// The type-erased face of a region, behind [`Region`](crate::Region).
pub(crate) trait RegionCore<M>: Send + Sync + 'static {
    fn deliver(&self, shard: ShardId, id: &str, msg: M) -> Result<(), TellError<M>>;
    fn shard_count(&self) -> u32;
    /// The shard of `id` (the type's [`ShardFn`]).
    fn shard_of(&self, id: &str) -> ShardId;
    fn type_name(&self) -> &str;
    fn system(&self) -> &ActorSystem;
    fn stats(&self) -> RegionStats;
    fn shard_entities(&self) -> Vec<usize>;
    fn passivate(&self, id: &str) -> bool;
    /// True if every entity of this region runs in this process, so an ask through it costs
    /// about as much as a tokio timer and arms its timeout lazily
    /// ([`ActorSystem::timeout`](shardik_actor::ActorSystem::timeout)). Asks that may cross
    /// the network arm a tokio timer at once: the timer is noise next to a round trip, and
    /// lazy arming measured a slower median there (`docs/semantics.md`).
    fn in_process(&self) -> bool {
        false
    }
    /// Why this region refuses every message, if it does (a cluster region the coordinator
    /// refused: its node started the type with another shard count, or was downed).
    fn refusal(&self) -> Option<String> {
        None
    }
}

/// Called once every entity of a shard has stopped ([`ShardHost::stop_shard`]).
pub(crate) type ShardStopped = Box<dyn FnOnce() + Send>;

/// Takes the messages a force-stopped entity had accepted but not handled, oldest first
/// ([`ShardHost::force_stop_shard`]).
pub(crate) type Unhandled<M> = Arc<dyn Fn(EntityId, Vec<M>) + Send + Sync>;

/// One termination's hand-on of unhandled messages in a shard, counted in the region's
/// `handing_on` while it lives (uncounted when dropped, also by a panic).
struct HandingOn<'a> {
    counts: &'a Mutex<std::collections::HashMap<ShardId, usize>>,
    shard: ShardId,
}

impl<'a> HandingOn<'a> {
    fn count(counts: &'a Mutex<std::collections::HashMap<ShardId, usize>>, shard: ShardId) -> Self {
        *counts.lock().entry(shard).or_default() += 1;
        HandingOn { counts, shard }
    }
}

impl Drop for HandingOn<'_> {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(&self.shard) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.shard);
            }
        }
    }
}

/// A region that can also stop whole shards: what the cluster layer hosts shards with.
pub(crate) trait ShardHost<M>: RegionCore<M> {
    /// Passivates every entity of `shard` (each handles what it has queued first) and calls
    /// `done` once the shard holds no incarnation. Entities that are restarted meanwhile
    /// (messages buffered while one stopped) are passivated again, so nothing is lost; a
    /// restart [`start_entity`](Self::start_entity) asked of a stopping entity before is
    /// called off. The caller must stop delivering to the shard first.
    fn stop_shard(&self, shard: ShardId, done: ShardStopped);

    /// Ends a [`stop_shard`](Self::stop_shard) whose entities are slow to stop: every entity
    /// of `shard` stops as soon as its current message is done, and the messages it had
    /// accepted but not handled (its mailbox, then what the shard buffered for it) go to
    /// `unhandled` instead of a new incarnation here, before `done` is called. Does nothing
    /// if the shard is not stopping.
    fn force_stop_shard(&self, shard: ShardId, unhandled: Unhandled<M>);

    /// Calls off the [`stop_shard`](Self::stop_shard) (and force stop) of each of `shards`,
    /// whose `done` nobody waits for (the fence's), unless an entity
    /// stopped by a [`force_stop_shard`](Self::force_stop_shard), in any shard, has ended and
    /// is handing what it had not handled to its `unhandled`; returns whether it did. Atomic
    /// with respect to terminations: one that sees a stop still forced is counted before
    /// this looks, so a `true` means every such hand-over has been made (its `unhandled`
    /// returned) and every later termination in `shards` starts a new incarnation here
    /// with what it had not handled: the shards are hosted again.
    fn cancel_stops_unless_handing_on(&self, shards: &[ShardId]) -> bool;

    /// Starts entity `id` of `shard` without a message if it has no incarnation (remembered
    /// entities on a new home), or as soon as its stopping incarnation has ended. The caller
    /// hosts the shard.
    fn start_entity(&self, shard: ShardId, id: &str);

    /// [`deliver`](RegionCore::deliver), also saying whether the message starts a new
    /// incarnation of the entity (it had none, or it waits for the stopping one to end):
    /// what remember-entities records, so that a message to a running entity costs nothing
    /// more.
    fn deliver_new(&self, shard: ShardId, id: &str, msg: M) -> (bool, Result<(), TellError<M>>);

    /// [`deliver_new`](Self::deliver_new) for a message this node accepted already (a fence
    /// held it, or an entity stopped before it handled it): an entity still stopping buffers
    /// it past the type's `buffer_limit`, which bounds only what senders add.
    fn deliver_accepted(
        &self,
        shard: ShardId,
        id: &str,
        msg: M,
    ) -> (bool, Result<(), TellError<M>>);

    /// Sets the fencing token entities of `shard` are started with from now on (the token of
    /// the shard's allocation here; `None`: the coordinator gave none).
    fn set_fencing_token(&self, shard: ShardId, token: Option<FencingToken>);
}

/// A live entity incarnation as the shard sees it.
pub(crate) struct EntityCell<M>(ActorRef<M>);

impl<M> Clone for EntityCell<M> {
    fn clone(&self) -> Self {
        EntityCell(self.0.clone())
    }
}

impl<M: Send + 'static> EntityHandle<M> for EntityCell<M> {
    fn incarnation(&self) -> u64 {
        self.0.id().as_u64()
    }

    #[inline]
    fn try_tell(&self, msg: M) -> Result<(), TellError<M>> {
        self.0.try_tell(msg)
    }

    fn hand_over(&self, msg: M) -> Result<(), TellError<M>> {
        self.0.try_tell_past_bound(msg)
    }

    fn passivate(&self) {
        self.0.graceful_stop();
    }

    fn stop_now(&self) {
        self.0.stop();
    }
}

/// The sans-IO shard state as this region holds it.
type LocalShard<M> = ShardState<M, EntityCell<M>>;

#[derive(Default)]
struct Counters {
    spawned: AtomicU64,
    passivated_idle: AtomicU64,
    passivated_lru: AtomicU64,
    rejected: AtomicU64,
}

pub(crate) struct LocalRegion<A: Actor> {
    type_name: Arc<str>,
    system: ActorSystem,
    shard_count: u32,
    shard_fn: ShardFn,
    shards: Box<[Mutex<LocalShard<A::Msg>>]>,
    /// Per shard: the fencing token its entities are started with (0: none).
    tokens: Box<[AtomicU64]>,
    factory: EntityFactory<A>,
    settings: Arc<ActorSettings<A::Msg>>,
    lru: Option<Mutex<LruCache<EntityId, ()>>>,
    max_live: usize,
    /// Shards being stopped for a hand-off, with what to call once they are empty.
    stopping: Mutex<std::collections::HashMap<ShardId, ShardStopped>>,
    /// Shards force-stopped while stopping, with where their entities' unhandled messages go.
    forced: Mutex<std::collections::HashMap<ShardId, Unhandled<A::Msg>>>,
    /// Per force-stopped shard: terminations whose unhandled messages are being handed on.
    /// The shard is reported stopped only once none is, so its messages never arrive after
    /// its `ShardStopped`.
    handing_on: Mutex<std::collections::HashMap<ShardId, usize>>,
    /// Coarse milliseconds since start, advanced by the idle sweeper.
    clock: AtomicU64,
    counters: Counters,
    metrics: crate::metrics::EntityMetrics,
}

impl<A: Actor> LocalRegion<A> {
    pub(crate) fn start(system: &ActorSystem, entity: EntityType<A>) -> Arc<Self> {
        let EntityType {
            name,
            factory,
            shards,
            idle_timeout,
            max_live,
            buffer_limit,
            settings,
            shard_fn,
            refused: _,
        } = entity;
        let region = Arc::new_cyclic(|me: &Weak<LocalRegion<A>>| {
            let me = me.clone();
            let settings = settings.on_termination(move |t: Termination<A::Msg>| {
                if let Some(region) = me.upgrade() {
                    region.on_terminated(t);
                } else {
                    // The system (which owns the region) is being torn down.
                    drop(t);
                }
            });
            LocalRegion {
                metrics: crate::metrics::EntityMetrics::new(&name),
                type_name: name.into(),
                system: system.clone(),
                shard_count: shards,
                shard_fn,
                shards: (0..shards)
                    .map(|_| Mutex::new(ShardState::new(buffer_limit)))
                    .collect(),
                tokens: (0..shards).map(|_| AtomicU64::new(0)).collect(),
                factory,
                settings: Arc::new(settings),
                lru: max_live.map(|_| Mutex::new(LruCache::unbounded())),
                max_live: max_live.unwrap_or(usize::MAX),
                stopping: Mutex::new(std::collections::HashMap::new()),
                forced: Mutex::new(std::collections::HashMap::new()),
                handing_on: Mutex::new(std::collections::HashMap::new()),
                clock: AtomicU64::new(0),
                counters: Counters::default(),
            }
        });
        if let Some(timeout) = idle_timeout {
            spawn_idle_sweeper(&region, timeout);
        }
        tracing::info!(
            entity_type = %region.type_name,
            shards,
            ?idle_timeout,
            ?max_live,
            "entity type started"
        );
        region
    }

    fn spawn_entity(&self, shard: ShardId, id: &EntityId) -> EntityCell<A::Msg> {
        let factory = self.factory.clone();
        let key = id.clone();
        // Fixed for the incarnation (restarts included): the token of the allocation under
        // which it was started (kept as a plain u64, 0 for none: every entity holds it).
        let token = self.tokens[shard as usize].load(Ordering::Acquire);
        let make = move || factory(&key, Some(token).filter(|t| *t != 0));
        let props = Props::with_settings(make, self.settings.clone()).name(id.clone());
        self.counters.spawned.fetch_add(1, Ordering::Relaxed);
        self.metrics.started();
        EntityCell(self.system.spawn_props(props))
    }

    fn now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Under the shard lock: LRU bookkeeping after a delivery. Returns victims to passivate
    /// once the lock is released.
    fn track(&self, id: &str, delivery: &Delivery<A::Msg>, victims: &mut Vec<EntityId>) {
        let Some(lru) = &self.lru else { return };
        let mut lru = lru.lock();
        match delivery {
            Delivery::Delivered => {
                lru.promote(id);
            }
            Delivery::Spawned => {
                lru.put(EntityId::from(id), ());
                self.evict_over_cap(&mut lru, victims);
            }
            Delivery::Buffered => {
                lru.pop(id);
            }
            Delivery::Rejected(_) => {}
        }
    }

    fn evict_over_cap(&self, lru: &mut LruCache<EntityId, ()>, victims: &mut Vec<EntityId>) {
        while lru.len() > self.max_live {
            match lru.pop_lru() {
                Some((victim, ())) => victims.push(victim),
                None => break,
            }
        }
    }

    fn passivate_victims(&self, victims: Vec<EntityId>) {
        for victim in victims {
            let shard = self.shard_fn.shard(&victim, self.shard_count);
            if self.shards[shard as usize].lock().passivate(&victim) {
                self.counters.passivated_lru.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("shardik_passivations_total", "entity_type" => self.type_name.to_string(), "reason" => "max_live").increment(1);
            }
        }
    }

    /// Locks the shard that holds incarnation `incarnation` of entity `id`: the one the
    /// type's shard function names, or else the one it was started in. A peer's message is
    /// delivered to the shard the peer computed; with a shard function that differs between
    /// nodes (beyond the probe ids the coordinator compares) that is another one, and judged
    /// by the local function the termination was stale and the shard stayed stopping for
    /// good, holding its hand-off (found by an audit on 2026-11-29). Only then, or for a
    /// termination that is stale indeed, are the other shards searched; not found, the
    /// function's shard.
    fn lock_holder(
        &self,
        id: &str,
        incarnation: u64,
    ) -> (ShardId, parking_lot::MutexGuard<'_, LocalShard<A::Msg>>) {
        let own = self.shard_fn.shard(id, self.shard_count);
        let guard = self.shards[own as usize].lock();
        if guard.holds(id, incarnation) {
            return (own, guard);
        }
        drop(guard);
        // An incarnation is entered in its shard under that shard's lock, before the lock
        // is released, so a termination that locks the shard finds it there.
        for (shard, state) in self.shards.iter().enumerate() {
            if shard as ShardId != own {
                let guard = state.lock();
                if guard.holds(id, incarnation) {
                    return (shard as ShardId, guard);
                }
            }
        }
        (own, self.shards[own as usize].lock())
    }

    fn on_terminated(&self, t: Termination<A::Msg>) {
        // Every incarnation was spawned by `spawn_entity` and ends here once.
        self.metrics.ended();
        let Some(id) = t.name else { return };
        let (shard, state) = self.lock_holder(&id, t.id.as_u64());
        let ended = Ended {
            incarnation: t.id.as_u64(),
            undelivered: t.undelivered,
            failed: matches!(t.reason, StopReason::Failed(_)),
            handled_any: t.handled_any,
        };
        let mut victims = Vec::new();
        let mut respawn = !self.system.is_shutting_down();
        let (after, unhandled, handing, counted) = {
            let mut state = state;
            // A force-stopped shard's entities are not started again here: what they had not
            // handled goes with the shard to its next home. Read under the shard's lock:
            // `force_stop_shard` registers the shard before it takes that lock, so either it
            // is seen here, or the entity this termination might restart is force-stopped
            // there.
            // Counted under the same lock as the read (see
            // `cancel_stops_unless_handing_on`), before the entity's removal is visible to
            // another termination's `check_stopping` (which takes the shard's lock), and
            // uncounted once the hand-on below is made, or at once if there is none.
            let (unhandled, counted) = {
                let forced = self.forced.lock();
                let unhandled = forced.get(&shard).cloned();
                let counted = unhandled
                    .as_ref()
                    .map(|_| HandingOn::count(&self.handing_on, shard));
                (unhandled, counted)
            };
            respawn &= unhandled.is_none();
            let after = state.terminated(&id, ended, respawn, self.now(), |key| {
                self.spawn_entity(shard, key)
            });
            let handing = unhandled.is_some()
                && !self.system.is_shutting_down()
                && matches!(&after, AfterStop::Dropped(m) | AfterStop::Respawned { dropped: m, .. } if !m.is_empty());
            let counted = if handing { counted } else { None };
            if let Some(lru) = &self.lru {
                let mut lru = lru.lock();
                match &after {
                    // A new incarnation that is already stopping again is not live.
                    AfterStop::Respawned { .. } if state.is_active(&id) == Some(true) => {
                        lru.put(id.clone(), ());
                        self.evict_over_cap(&mut lru, &mut victims);
                    }
                    AfterStop::Respawned { .. } => {
                        lru.pop(&*id);
                    }
                    AfterStop::Removed | AfterStop::Dropped(_) | AfterStop::GaveUp(_) => {
                        lru.pop(&*id);
                    }
                    AfterStop::Stale => {}
                }
            }
            (after, unhandled, handing, counted)
        };
        self.passivate_victims(victims);
        let gave_up = matches!(after, AfterStop::GaveUp(_));
        let dropped = match after {
            AfterStop::Dropped(msgs) | AfterStop::GaveUp(msgs) => msgs,
            AfterStop::Respawned { dropped, .. } => dropped,
            AfterStop::Removed | AfterStop::Stale => Vec::new(),
        };
        if gave_up {
            tracing::warn!(
                entity_type = %self.type_name,
                entity = %id,
                messages = dropped.len(),
                "entity stopped {MAX_STARTS_WITHOUT_PROGRESS} times in a row without handling \
                 a message (does its `started` hook stop it?); the messages waiting for it \
                 are dead letters, and the next one starts it again"
            );
        }
        let dropped = match unhandled {
            // Handed on before the shard can be reported stopped (`handing_on`).
            // The same decision as the count above (shutdown may start in between).
            Some(unhandled) if handing => {
                unhandled(id.clone(), dropped);
                drop(counted);
                Vec::new()
            }
            _ => dropped,
        };
        self.check_stopping(shard);
        let reason = if gave_up {
            "entity kept stopping without handling a message"
        } else if respawn {
            "entity failed with messages queued"
        } else {
            "entity stopped by shutdown with messages queued"
        };
        for msg in dropped {
            // Counted before the message goes: dropping it fails an ask waiting on its reply,
            // and whoever that wakes sees the dead letter already.
            self.dead_letter(&id, reason);
            drop(msg);
        }
    }

    /// Passivates every active entity of `shard`; true if it holds no incarnation.
    fn passivate_shard(&self, shard: ShardId) -> bool {
        let mut state = self.shards[shard as usize].lock();
        // Called after every termination while a shard stops: only scan the shard when an
        // entity is active again (restarted for buffered messages), so stopping k entities
        // costs O(k), not O(k²).
        if state.active() == 0 {
            return state.is_empty();
        }
        for id in state.idle_since(u64::MAX) {
            if state.passivate(&id) {
                if let Some(lru) = &self.lru {
                    lru.lock().pop(&*id);
                }
            }
        }
        state.is_empty()
    }

    /// After a termination in `shard`: if the shard is being stopped, passivate what was
    /// restarted and report it stopped once empty.
    fn check_stopping(&self, shard: ShardId) {
        if !self.stopping.lock().contains_key(&shard) {
            return;
        }
        if self.passivate_shard(shard) && !self.handing_on.lock().contains_key(&shard) {
            // Under the `stopping` lock, so a concurrent `force_stop_shard` either registers
            // before (and is removed here) or finds the shard no longer stopping.
            let done = {
                let mut stopping = self.stopping.lock();
                self.forced.lock().remove(&shard);
                stopping.remove(&shard)
            };
            if let Some(done) = done {
                done();
            }
        }
    }

    fn dead_letter(&self, id: &str, reason: &'static str) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        self.system.record_dead_letter(
            &format_args!("{}/{}", self.type_name, id),
            std::any::type_name::<A::Msg>(),
            reason,
        );
    }

    /// One pass of the idle sweeper at coarse time `now`: passivates entities untouched since
    /// `cutoff`.
    fn sweep(&self, now: u64, cutoff: u64) {
        self.clock.store(now, Ordering::Relaxed);
        for shard in self.shards.iter() {
            let mut state = shard.lock();
            if state.active() == 0 {
                continue;
            }
            for id in state.idle_since(cutoff) {
                if state.passivate(&id) {
                    self.counters
                        .passivated_idle
                        .fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("shardik_passivations_total", "entity_type" => self.type_name.to_string(), "reason" => "idle").increment(1);
                    if let Some(lru) = &self.lru {
                        lru.lock().pop(&*id);
                    }
                }
            }
        }
    }
}

impl<A: Actor> LocalRegion<A> {
    /// [`ShardHost::deliver_new`]; inlined into [`RegionCore::deliver`] too, where the
    /// returned flag is dropped.
    ///
    /// With `accepted` it is [`ShardHost::deliver_accepted`]: a constant at every call, so
    /// the hot path pays nothing for it.
    #[inline(always)]
    fn deliver_tracked(
        &self,
        shard: ShardId,
        id: &str,
        msg: A::Msg,
        accepted: bool,
    ) -> (bool, Result<(), TellError<A::Msg>>) {
        // Once the system shuts down no entity handles another message (each is being
        // stopped) and none may start, so refuse at once: `tell` records the dead letter now,
        // `try_tell` hands the message back, `ask` fails with `Stopped`. Without this check a
        // message for an entity without a live incarnation spawned a new one during or after
        // the shutdown (running its factory and `started` hook) only to have it stopped.
        if self.system.is_shutting_down() {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return (false, Err(TellError::Stopped(msg)));
        }
        let mut victims = Vec::new();
        // Set by the spawn, even if the new incarnation then refuses the message.
        let mut spawned = false;
        let delivery = {
            let mut state = self.shards[shard as usize].lock();
            let spawn = |key: &EntityId| {
                spawned = true;
                self.spawn_entity(shard, key)
            };
            let delivery = if accepted {
                state.deliver_accepted(id, msg, self.now(), spawn)
            } else {
                state.deliver(id, msg, self.now(), spawn)
            };
            self.track(id, &delivery, &mut victims);
            delivery
        };
        if !victims.is_empty() {
            self.passivate_victims(victims);
        }
        match delivery {
            // A buffered message starts the next incarnation once the current one stopped.
            Delivery::Buffered => (true, Ok(())),
            Delivery::Delivered | Delivery::Spawned => (spawned, Ok(())),
            Delivery::Rejected(e) => {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                (spawned, Err(e))
            }
        }
    }
}

fn spawn_idle_sweeper<A: Actor>(region: &Arc<LocalRegion<A>>, timeout: Duration) {
    // Deliveries stamp entities with the coarse clock, which only this sweeper advances, so a
    // stamp `s` means "touched before the clock moved past `s`". That can be much later than
    // `s + tick` when the sweeper runs late (a busy runtime, a stalled thread), and judging
    // idleness by `s + tick` then passivated entities that had heard something less than
    // `timeout` ago. Instead the sweeper remembers the clock values it published: an entity
    // stamped `s` is idle once the value published after `s` is at least `timeout` old. An
    // entity is thus passivated after at least `timeout` of silence and, while the sweeper
    // keeps time, at most `timeout + tick`.
    let tick = (timeout / 8).clamp(Duration::from_millis(1), Duration::from_secs(5));
    let weak = Arc::downgrade(region);
    let system = region.system.clone();
    let timeout_ms = timeout.as_millis() as u64;
    region.system.runtime().spawn(async move {
        let start = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Clock values published and not yet known to be `timeout` old, oldest first (about
        // `timeout / tick` of them); the clock starts at 0.
        let mut published = std::collections::VecDeque::from([0u64]);
        // Entities stamped at or before this are idle.
        let mut cutoff = None;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = system.shutdown_started() => return,
            }
            let Some(region) = weak.upgrade() else { return };
            let now = start.elapsed().as_millis() as u64;
            if published.back() != Some(&now) {
                published.push_back(now);
            }
            if let Some(horizon) = now.checked_sub(timeout_ms) {
                while published.len() >= 2 && published[1] <= horizon {
                    cutoff = published.pop_front();
                }
            }
            match cutoff {
                Some(cutoff) => region.sweep(now, cutoff),
                None => region.clock.store(now, Ordering::Relaxed),
            }
        }
    });
}

impl<A: Actor> ShardHost<A::Msg> for LocalRegion<A> {
    fn deliver_new(
        &self,
        shard: ShardId,
        id: &str,
        msg: A::Msg,
    ) -> (bool, Result<(), TellError<A::Msg>>) {
        self.deliver_tracked(shard, id, msg, false)
    }

    fn deliver_accepted(
        &self,
        shard: ShardId,
        id: &str,
        msg: A::Msg,
    ) -> (bool, Result<(), TellError<A::Msg>>) {
        self.deliver_tracked(shard, id, msg, true)
    }

    fn set_fencing_token(&self, shard: ShardId, token: Option<FencingToken>) {
        if let Some(slot) = self.tokens.get(shard as usize) {
            slot.store(token.unwrap_or(0), Ordering::Release);
        }
    }

    fn stop_shard(&self, shard: ShardId, done: ShardStopped) {
        if shard >= self.shard_count {
            done();
            return;
        }
        {
            // A shard stopped again while it stops (a fence, then a hand-off): both are told.
            let mut stopping = self.stopping.lock();
            let done = match stopping.remove(&shard) {
                Some(first) => Box::new(move || {
                    first();
                    done();
                }) as ShardStopped,
                None => done,
            };
            stopping.insert(shard, done);
        }
        // Entities stopping when the shard was hosted again (a lifted fence) and asked for
        // by remember-entities would start again once they end, only to be passivated.
        self.shards[shard as usize].lock().call_off_restarts();
        // A termination racing with this call finds the entry and checks again.
        self.check_stopping(shard);
    }

    fn force_stop_shard(&self, shard: ShardId, unhandled: Unhandled<A::Msg>) {
        {
            let stopping = self.stopping.lock();
            if shard >= self.shard_count || !stopping.contains_key(&shard) {
                return;
            }
            // A shard force-stopped twice (a hand-off's timeout, a fence) keeps the first
            // destination: both lead the messages back through the region's state machine.
            self.forced.lock().entry(shard).or_insert(unhandled);
        }
        let told = self.shards[shard as usize].lock().force_stop();
        tracing::warn!(
            entity_type = %self.type_name,
            shard,
            entities = told.len(),
            "shard entities slow to stop: stopping them now; their unhandled messages move with the shard"
        );
        if let Some(lru) = &self.lru {
            let mut lru = lru.lock();
            for id in &told {
                lru.pop(&**id);
            }
        }
        self.check_stopping(shard);
    }

    fn cancel_stops_unless_handing_on(&self, shards: &[ShardId]) -> bool {
        let mut stopping = self.stopping.lock();
        let mut forced = self.forced.lock();
        // Any shard's, not only those of `shards`: the caller then delivers what it held for
        // every shard, and a shard not resumed may have a home by then (its held messages
        // forwarded at once), so a hand-over still on its way would reach it behind them.
        if !self.handing_on.lock().is_empty() {
            return false;
        }
        for shard in shards {
            forced.remove(shard);
            stopping.remove(shard);
        }
        true
    }

    fn start_entity(&self, shard: ShardId, id: &str) {
        if shard >= self.shard_count || self.system.is_shutting_down() {
            return;
        }
        let mut victims = Vec::new();
        {
            let mut state = self.shards[shard as usize].lock();
            if state.ensure(id, self.now(), |key| self.spawn_entity(shard, key)) {
                self.track(id, &Delivery::Spawned, &mut victims);
            }
        }
        if !victims.is_empty() {
            self.passivate_victims(victims);
        }
    }
}

impl<A: Actor> RegionCore<A::Msg> for LocalRegion<A> {
    #[inline]
    fn deliver(&self, shard: ShardId, id: &str, msg: A::Msg) -> Result<(), TellError<A::Msg>> {
        self.deliver_tracked(shard, id, msg, false).1
    }

    fn shard_count(&self) -> u32 {
        self.shard_count
    }

    fn in_process(&self) -> bool {
        true
    }

    #[inline]
    fn shard_of(&self, id: &str) -> ShardId {
        self.shard_fn.shard(id, self.shard_count)
    }

    fn type_name(&self) -> &str {
        &self.type_name
    }

    fn system(&self) -> &ActorSystem {
        &self.system
    }

    fn passivate(&self, id: &str) -> bool {
        let shard = self.shard_fn.shard(id, self.shard_count);
        // The LRU entry goes under the shard lock, as everywhere: released first, the entity
        // could stop and a buffered message respawn it (entering it in the LRU) before the
        // pop, which then took the live incarnation out of the cap for good.
        let mut guard = self.shards[shard as usize].lock();
        let done = guard.passivate(id);
        if done {
            if let Some(lru) = &self.lru {
                lru.lock().pop(id);
            }
        }
        done
    }

    fn stats(&self) -> RegionStats {
        let mut stats = RegionStats {
            type_name: self.type_name.to_string(),
            shards: self.shard_count,
            spawned_total: self.counters.spawned.load(Ordering::Relaxed),
            passivated_idle_total: self.counters.passivated_idle.load(Ordering::Relaxed),
            passivated_lru_total: self.counters.passivated_lru.load(Ordering::Relaxed),
            rejected_total: self.counters.rejected.load(Ordering::Relaxed),
            ..RegionStats::default()
        };
        for shard in self.shards.iter() {
            let state = shard.lock();
            if !state.is_empty() {
                stats.active_shards += 1;
            }
            stats.active_entities += state.active();
            stats.stopping_entities += state.len() - state.active();
            stats.buffered_messages += state.buffered();
        }
        stats
    }

    fn shard_entities(&self) -> Vec<usize> {
        self.shards.iter().map(|shard| shard.lock().len()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardik_actor::{ActorError, Context};

    struct Nop;

    impl Actor for Nop {
        type Msg = u32;

        async fn handle(&mut self, _m: u32, _c: &mut Context<Self>) -> Result<(), ActorError> {
            Ok(())
        }
    }

    /// A peer whose shard function differs from this node's delivers into the shard it
    /// computed: stopping that shard still ends once the entity ended (it stayed stopping
    /// for good, the termination taken as stale for the shard the local function names).
    #[tokio::test]
    async fn a_shard_stops_with_an_entity_delivered_to_it_by_another_shard_function() {
        let system = ActorSystem::new("other-shard-fn");
        let region = LocalRegion::start(
            &system,
            EntityType::new("nop", |_: &str| Nop)
                .shards(4)
                .shard_fn(|_: &str, _: u32| 0),
        );
        assert_eq!(region.shard_of("x"), 0);
        let (started, result) = region.deliver_new(2, "x", 1);
        assert!(started && result.is_ok());
        assert_eq!(region.shard_entities(), vec![0, 0, 1, 0]);
        let (tx, rx) = tokio::sync::oneshot::channel();
        region.stop_shard(
            2,
            Box::new(move || {
                let _ = tx.send(());
            }),
        );
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("shard 2 stopped")
            .unwrap();
        assert_eq!(region.shard_entities(), vec![0; 4]);
        system.shutdown().await;
    }

    #[tokio::test]
    async fn deliver_new_says_whether_the_message_started_an_incarnation() {
        let system = ActorSystem::new("deliver-new");
        let region = LocalRegion::start(&system, EntityType::new("nop", |_: &str| Nop));
        let (a, b) = (region.shard_of("a"), region.shard_of("b"));
        let (started, result) = region.deliver_new(a, "a", 1);
        assert!(started && result.is_ok());
        let (started, result) = region.deliver_new(a, "a", 2);
        assert!(!started && result.is_ok(), "a running entity");
        let (started, result) = region.deliver_new(b, "b", 3);
        assert!(started && result.is_ok());
        system.shutdown().await;
        let (started, result) = region.deliver_new(a, "a", 4);
        assert!(!started && result.is_err(), "nothing starts after shutdown");
    }
}
