//! [`ClusterSharding`]: the cluster sharding extension of one cluster node.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use shardik_actor::Actor;
use shardik_cluster::runtime::{Cluster, NodeStopReason};
use tokio::sync::{mpsc, watch};

use super::coordinator::{CoordEvent, CoordinatorDriver, CoordinatorSnapshot, Ctx};
use super::directory::{Directory, TypeAd};
use super::proxy::NoHost;
use super::region::{ClusterRegion, RegionRole, Registration};
use super::remember::Remember;
use super::replica::ReplicaStore;
use super::settings::ClusterShardingSettings;
use super::state_store::ShardingStateStore;
use super::wire::{coordinator_path, decoder};
use crate::coordination::{RegisterError, ToRegion};
use crate::entity::EntityType;
use crate::error::ShardingError;
use crate::handle::Region;
use crate::hash::{ShardFn, ShardId};
use crate::region::{LocalRegion, ShardHost};

/// The type-erased face of one started entity type.
trait StartedType: Send + Sync {
    fn region_any(&self) -> &(dyn Any + Send + Sync);
    fn msg_type(&self) -> &'static str;
    fn hosted_shards(&self) -> BTreeSet<ShardId>;
    fn owned_shards(&self) -> BTreeSet<ShardId>;
    fn coordinator(&self) -> Option<CoordinatorSnapshot>;
    fn request_leave(&self);
    fn hold_for_leave(&self);
    fn leave_complete(&self) -> watch::Receiver<bool>;
    fn registration(&self) -> watch::Receiver<Registration>;
    fn shard_count(&self) -> u32;
}

struct Started<M> {
    handle: Region<M>,
    region: Arc<ClusterRegion<M>>,
    snapshot: Arc<Mutex<Option<CoordinatorSnapshot>>>,
}

impl<M> StartedType for Started<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    fn region_any(&self) -> &(dyn Any + Send + Sync) {
        &self.handle
    }
    fn msg_type(&self) -> &'static str {
        std::any::type_name::<M>()
    }
    fn hosted_shards(&self) -> BTreeSet<ShardId> {
        self.region.hosted_shards()
    }
    fn owned_shards(&self) -> BTreeSet<ShardId> {
        self.region.owned_shards()
    }
    fn coordinator(&self) -> Option<CoordinatorSnapshot> {
        self.snapshot.lock().clone()
    }
    fn request_leave(&self) {
        self.region.request_leave();
    }
    fn hold_for_leave(&self) {
        self.region.hold_for_leave();
    }
    fn leave_complete(&self) -> watch::Receiver<bool> {
        self.region.leave_complete()
    }
    fn registration(&self) -> watch::Receiver<Registration> {
        self.region.registration()
    }
    fn shard_count(&self) -> u32 {
        self.handle.shard_count()
    }
}

struct Inner {
    cluster: Cluster,
    replicas: Arc<ReplicaStore>,
    directory: Arc<Directory>,
    clock: Instant,
    types: Mutex<HashMap<String, Arc<dyn StartedType>>>,
}

/// Cluster sharding on one node: entity types whose shards are placed on the members of the
/// cluster, reached from any node through the same [`Region`] and
/// [`EntityRef`](crate::EntityRef) handles as single-node sharding.
///
/// Every node that should host (or send to) an entity type starts it with the same name, shard
/// count and settings. See the [module docs](super) for how it works.
#[derive(Clone)]
pub struct ClusterSharding {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ClusterSharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSharding")
            .field("node", self.inner.cluster.self_node())
            .field("types", &self.type_names())
            .finish()
    }
}

struct Slot(ClusterSharding);

impl ClusterSharding {
    /// The cluster sharding extension of `cluster`'s node (created on first use, which also
    /// starts this node's coordinator-state replica, in memory unless
    /// [`with_state_store`](Self::with_state_store) created it).
    pub fn get(cluster: &Cluster) -> ClusterSharding {
        let system = cluster.remote().system().clone();
        let slot = system.extension(|_| {
            let replicas = Arc::new(ReplicaStore::default());
            replicas.serve(cluster.remote());
            Slot(ClusterSharding::build(cluster, replicas))
        });
        slot.0.clone()
    }

    /// The cluster sharding extension of `cluster`'s node with its replica of the sharding
    /// state (coordinator states, remembered entities) kept in `store` under this node's
    /// node id, so that it survives a full cluster restart. Loads what `store` holds for
    /// this node id before the replica answers anyone; from then on a write is acknowledged
    /// only once `store` has it. Call it once per node, before anything else uses
    /// [`ClusterSharding`] on that node (and before starting entity types), and start the
    /// types with [`min_quorum`](ClusterShardingSettings::min_quorum) set to a majority of
    /// the full cluster, so that after a full restart the first node up does not start
    /// from its own copy alone.
    ///
    /// # Errors
    /// [`ShardingError::StateStore`] if loading failed, or if cluster sharding was already
    /// started on this node (with [`get`](Self::get) or another store).
    pub async fn with_state_store(
        cluster: &Cluster,
        store: Arc<dyn ShardingStateStore>,
    ) -> Result<ClusterSharding, ShardingError> {
        let system = cluster.remote().system().clone();
        let node = cluster.self_node().node_id.clone();
        let replicas = Arc::new(
            ReplicaStore::load(store, &node)
                .await
                .map_err(|e| ShardingError::StateStore(e.to_string()))?,
        );
        let mine = replicas.clone();
        let slot = system.extension(|_| {
            mine.serve(cluster.remote());
            Slot(ClusterSharding::build(cluster, mine))
        });
        if !Arc::ptr_eq(&slot.0.inner.replicas, &replicas) {
            return Err(ShardingError::StateStore(format!(
                "cluster sharding already runs on node {node}: set the state store first"
            )));
        }
        Ok(slot.0.clone())
    }

    fn build(cluster: &Cluster, replicas: Arc<ReplicaStore>) -> ClusterSharding {
        ClusterSharding {
            inner: Arc::new(Inner {
                cluster: cluster.clone(),
                replicas,
                directory: Directory::start(cluster),
                clock: Instant::now(),
                types: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Starts `entity` on this node with default [`ClusterShardingSettings`] and returns its
    /// region. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`ShardingError::AlreadyStarted`] if a type of that name runs already,
    /// [`ShardingError::InvalidSettings`] for out-of-range settings.
    pub fn start<A>(&self, entity: EntityType<A>) -> Result<Region<A::Msg>, ShardingError>
    where
        A: Actor,
        A::Msg: Serialize + DeserializeOwned,
    {
        self.start_with(entity, ClusterShardingSettings::default())
    }

    /// [`start`](Self::start) with explicit settings. With
    /// [`role`](ClusterShardingSettings::role) set, a node without that role only routes to the
    /// type (like [`start_proxy`](Self::start_proxy)); the coordinator of the type runs on the
    /// oldest `Up` member that hosts it.
    pub fn start_with<A>(
        &self,
        entity: EntityType<A>,
        settings: ClusterShardingSettings,
    ) -> Result<Region<A::Msg>, ShardingError>
    where
        A: Actor,
        A::Msg: Serialize + DeserializeOwned,
    {
        entity.validate()?;
        if let Some(problem) = settings.problem() {
            return Err(ShardingError::InvalidSettings {
                name: entity.name().to_string(),
                problem,
            });
        }
        let name = entity.name().to_string();
        let shard_count = entity.shards;
        let shard_fn = entity.shard_fn.clone();
        let mut types = self.inner.types.lock();
        if types.contains_key(&name) {
            return Err(ShardingError::AlreadyStarted(name));
        }
        let system = self.inner.cluster.remote().system().clone();
        let local = LocalRegion::start(&system, entity);
        Ok(self.start_region(
            &mut types,
            name,
            (shard_count, shard_fn),
            local,
            settings,
            false,
        ))
    }

    /// Starts entity type `type_name` on this node as a **proxy**: its region routes messages
    /// to the nodes that host the type but never hosts a shard (no entity of the type ever runs
    /// here, and this node never runs its coordinator). `shard_count` must be the hosting
    /// nodes' count ([`EntityType::shards`], default [`DEFAULT_SHARDS`](crate::DEFAULT_SHARDS)).
    ///
    /// # Errors
    /// [`ShardingError::AlreadyStarted`] if a type of that name runs already,
    /// [`ShardingError::InvalidSettings`] for an empty name or a shard count of 0 or above
    /// [`MAX_SHARDS`](crate::MAX_SHARDS).
    pub fn start_proxy<M>(
        &self,
        type_name: &str,
        shard_count: u32,
    ) -> Result<Region<M>, ShardingError>
    where
        M: Serialize + DeserializeOwned + Send + 'static,
    {
        self.start_proxy_with(type_name, shard_count, ClusterShardingSettings::default())
    }

    /// [`start_proxy`](Self::start_proxy) with explicit settings (use the hosting nodes' role).
    pub fn start_proxy_with<M>(
        &self,
        type_name: &str,
        shard_count: u32,
        settings: ClusterShardingSettings,
    ) -> Result<Region<M>, ShardingError>
    where
        M: Serialize + DeserializeOwned + Send + 'static,
    {
        self.start_proxy_sharded(type_name, shard_count, ShardFn::md5(), settings)
    }

    /// [`start_proxy_with`](Self::start_proxy_with) for a type whose hosting nodes map ids to
    /// shards with a custom function ([`EntityType::shard_fn`]): the proxy must use the same
    /// one (a proxy with another rule is refused by the coordinator).
    ///
    /// # Errors
    /// As [`start_proxy`](Self::start_proxy).
    pub fn start_proxy_sharded<M>(
        &self,
        type_name: &str,
        shard_count: u32,
        shard_fn: ShardFn,
        settings: ClusterShardingSettings,
    ) -> Result<Region<M>, ShardingError>
    where
        M: Serialize + DeserializeOwned + Send + 'static,
    {
        let problem = if type_name.is_empty() {
            Some("the type name is empty".to_string())
        } else if let Some(problem) = crate::entity::shard_count_problem(shard_count) {
            Some(problem)
        } else {
            settings.problem()
        };
        if let Some(problem) = problem {
            return Err(ShardingError::InvalidSettings {
                name: type_name.to_string(),
                problem,
            });
        }
        let mut types = self.inner.types.lock();
        if types.contains_key(type_name) {
            return Err(ShardingError::AlreadyStarted(type_name.to_string()));
        }
        let local = Arc::new(NoHost::<M> {
            system: self.inner.cluster.remote().system().clone(),
            type_name: type_name.to_string(),
            shard_count,
            shard_fn: shard_fn.clone(),
            _msg: std::marker::PhantomData,
        });
        Ok(self.start_region(
            &mut types,
            type_name.to_string(),
            (shard_count, shard_fn),
            local,
            settings,
            true,
        ))
    }

    fn start_region<M>(
        &self,
        types: &mut HashMap<String, Arc<dyn StartedType>>,
        name: String,
        (shard_count, shard_fn): (u32, ShardFn),
        local: Arc<dyn ShardHost<M>>,
        settings: ClusterShardingSettings,
        proxy: bool,
    ) -> Region<M>
    where
        M: Serialize + DeserializeOwned + Send + 'static,
    {
        let cluster = &self.inner.cluster;
        let remember = (settings.remember_entities && !proxy).then(|| {
            let host = local.clone();
            Remember::new(
                &name,
                cluster,
                self.inner.replicas.clone(),
                &settings,
                Arc::new(move |shard: ShardId, id: &str| host.start_entity(shard, id)),
            )
        });
        let (coord_tx, coord_rx) = mpsc::unbounded_channel();
        // Every region and coordinator of the type checks that they map ids to shards alike.
        let fingerprint = Some(shard_fn.fingerprint(shard_count));
        let mut region_config = settings.region_config(shard_count);
        region_config.shard_fn_fingerprint = fingerprint;
        let mut coordinator_config = settings.coordinator_config(shard_count);
        coordinator_config.shard_fn_fingerprint = fingerprint;
        let (region, region_driver) = ClusterRegion::start(
            &name,
            cluster,
            self.inner.clock,
            region_config,
            settings.tick,
            local,
            coord_tx.clone(),
            RegionRole {
                role: settings.role.clone(),
                proxy,
                directory: self.inner.directory.clone(),
                remember,
            },
        );
        let snapshot = Arc::new(Mutex::new(None));
        let r = region.clone();
        let ctx = Ctx {
            type_name: name.clone(),
            cluster: cluster.clone(),
            replicas: self.inner.replicas.clone(),
            directory: self.inner.directory.clone(),
            settings: settings.clone(),
            clock: self.inner.clock,
            events: coord_tx.clone(),
            local_region: Arc::new(move |m: ToRegion| r.on_coordinator_msg(m)),
            snapshot: snapshot.clone(),
        };
        let tx = coord_tx;
        cluster.remote().register_decoder(
            &coordinator_path(&name),
            decoder(move |w| {
                let _ = tx.send(CoordEvent::Wire(w));
            }),
        );
        // Announced (with both endpoints registered) before the region and the coordinator
        // first read the membership: they then see this node host the type, and the region
        // does not register with a younger node's coordinator first.
        self.inner
            .directory
            .announce(&name, TypeAd { proxy, shard_count });
        let driver = CoordinatorDriver::new(ctx, coordinator_config);
        tokio::spawn(driver.run(coord_rx));
        region_driver.spawn();
        let handle = Region::new(region.clone());
        types.insert(
            name,
            Arc::new(Started {
                handle: handle.clone(),
                region,
                snapshot,
            }),
        );
        handle
    }

    /// Waits until this node's region of `type_name` is registered with the type's
    /// coordinator, up to `timeout`. A region the coordinator refused fails every message;
    /// this says why.
    ///
    /// # Errors
    /// [`ShardingError::ShardCountMismatch`] (naming both shard counts) if this node started
    /// the type with another shard count than the coordinator's, [`ShardingError::Refused`]
    /// if refused for another reason, [`ShardingError::NotRegistered`] if no answer came in
    /// time, [`ShardingError::NotStarted`] if the type is not started here.
    pub async fn wait_registered(
        &self,
        type_name: &str,
        timeout: Duration,
    ) -> Result<(), ShardingError> {
        let t = self
            .inner
            .types
            .lock()
            .get(type_name)
            .cloned()
            .ok_or_else(|| ShardingError::NotStarted(type_name.to_string()))?;
        let mut rx = t.registration();
        let res = tokio::time::timeout(timeout, async {
            loop {
                let now = rx.borrow_and_update().clone();
                if now != Registration::Pending {
                    return now;
                }
                if rx.changed().await.is_err() {
                    return Registration::Pending;
                }
            }
        })
        .await;
        match res {
            Ok(Registration::Registered) => Ok(()),
            Ok(Registration::Refused(e)) => Err(refusal(type_name, t.shard_count(), e)),
            Ok(Registration::Pending) | Err(_) => Err(ShardingError::NotRegistered {
                name: type_name.to_string(),
                timeout,
            }),
        }
    }

    /// The entity ids of `type_name` remembered in this node's replica (with
    /// [`remember_entities`](ClusterShardingSettings::remember_entities); every id some node
    /// wrote here, over all shards).
    pub fn remembered_entities(&self, type_name: &str) -> BTreeSet<String> {
        self.inner.replicas.remembered(type_name)
    }

    /// How many entity ids of `type_name` this node's replica remembers: the size of
    /// [`remembered_entities`](Self::remembered_entities) without copying the ids.
    pub fn remembered_entity_count(&self, type_name: &str) -> usize {
        self.inner.replicas.remembered_count(type_name)
    }

    /// Why the coordinator refused this node's region of `type_name`, if it did (every
    /// message to the type then fails on this node with `TellError::Stopped`).
    pub fn refusal(&self, type_name: &str) -> Option<ShardingError> {
        let t = self.inner.types.lock().get(type_name).cloned()?;
        let r = t.registration().borrow().clone();
        match r {
            Registration::Refused(e) => Some(refusal(type_name, t.shard_count(), e)),
            _ => None,
        }
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
        let types = self.inner.types.lock();
        let Some(t) = types.get(type_name) else {
            return Ok(None);
        };
        match t.region_any().downcast_ref::<Region<M>>() {
            Some(r) => Ok(Some(r.clone())),
            None => Err(ShardingError::WrongMessageType {
                name: type_name.to_string(),
                actual: t.msg_type(),
                requested: std::any::type_name::<M>(),
            }),
        }
    }

    /// Names of the entity types started on this node, sorted.
    pub fn type_names(&self) -> Vec<String> {
        let mut names: Vec<_> = self.inner.types.lock().keys().cloned().collect();
        names.sort();
        names
    }

    /// The shards of `type_name` whose entities live on this node now (hosted, or being
    /// handed off and not yet stopped). `None` if the type is not started here.
    pub fn hosted_shards(&self, type_name: &str) -> Option<BTreeSet<ShardId>> {
        let t = self.inner.types.lock().get(type_name).cloned()?;
        Some(t.hosted_shards())
    }

    /// The coordinator of `type_name` if it runs on this node (the oldest `Up` member that
    /// hosts the type): its
    /// epoch, durable state (shard homes, regions) and running hand-offs.
    pub fn coordinator(&self, type_name: &str) -> Option<CoordinatorSnapshot> {
        let t = self.inner.types.lock().get(type_name).cloned()?;
        t.coordinator()
    }

    /// Leaves the cluster gracefully: first every entity type started here hands all its shards
    /// off to other nodes (each shard's entities stop here before they start there, and
    /// messages sent meanwhile are buffered and delivered there), then the node leaves the
    /// membership ([`Cluster::leave`]).
    ///
    /// Waits up to `handoff_timeout` for the hand-offs. After that, the regions stop hosting
    /// as a fenced node does: the entities of the shards still here stop as soon as their
    /// current message is done, messages for them are held (those of a shard whose hand-off
    /// completes meanwhile go with it, the rest are dead letters once the node is gone), and
    /// the node leaves once none of them runs (an entity in a handler that never returns
    /// holds the leave, which logs it every 5 s): the shards are reallocated once the node
    /// is gone, and never while an incarnation still runs here. The result names the shards
    /// that were not handed off in time. Do not await it inside a handler of an entity of
    /// this node: it would wait for that handler.
    ///
    /// ```no_run
    /// # async fn example(sharding: shardik_sharding::cluster::ClusterSharding) {
    /// use std::time::Duration;
    ///
    /// let left = sharding.leave(Duration::from_secs(30)).await;
    /// if !left.handed_off() {
    ///     eprintln!("left without handing off {:?}", left.not_handed_off);
    /// }
    /// # }
    /// ```
    pub async fn leave(&self, handoff_timeout: Duration) -> Left {
        let types: Vec<(String, Arc<dyn StartedType>)> = self
            .inner
            .types
            .lock()
            .iter()
            .map(|(name, t)| (name.clone(), t.clone()))
            .collect();
        // Every type asks at once (a slow one does not hold the others back), again every
        // 500 ms until its coordinator answers (it may be starting or moving). A type is
        // pending until its coordinator said the leave is complete and it owns no shard: a
        // coordinator that moved after saying so starts without knowing this node leaves
        // (until the node is `Leaving`, which comes after), and may give it shards again.
        // So while any type is pending every type asks again, those done included, and one
        // that was given a shard meanwhile hands it off before the node leaves (found by an
        // audit on 2026-11-29: such a shard left with the node, without a hand-off).
        let request = || {
            let pending: Vec<&Arc<dyn StartedType>> = types
                .iter()
                .map(|(_, t)| t)
                .filter(|t| !*t.leave_complete().borrow() || !t.owned_shards().is_empty())
                .collect();
            if !pending.is_empty() {
                for (_, t) in &types {
                    t.request_leave();
                }
            }
            pending.first().map(|t| t.leave_complete())
        };
        let all = async {
            while let Some(mut done) = request() {
                let _ = tokio::time::timeout(Duration::from_millis(500), done.changed()).await;
            }
        };
        let mut not_handed_off = BTreeMap::new();
        if tokio::time::timeout(handoff_timeout, all).await.is_err() {
            for (name, t) in &types {
                // As in `request`: done only if complete and owning no shard (a coordinator
                // that moved may have given a type that was done shards again).
                if !*t.leave_complete().borrow() || !t.owned_shards().is_empty() {
                    // Every shard not handed off, also those whose entities a fence already
                    // stopped (`hosted_shards` then lists only those still stopping).
                    let shards = t.owned_shards();
                    tracing::warn!(
                        entity_type = %name,
                        shards = shards.len(),
                        timeout = ?handoff_timeout,
                        "cluster sharding: hand-off time is up; the entities of the shards \
                         still here stop after their current message, then the node leaves \
                         and the shards are reallocated"
                    );
                    not_handed_off.insert(name.clone(), shards);
                }
            }
            // Every type, also those done: a coordinator that moved meanwhile may have given
            // one of them a shard again (it does not know this node leaves until it is
            // `Leaving`), and no entity may start here from now on.
            for (_, t) in &types {
                t.hold_for_leave();
            }
            // Leaving while an incarnation still runs here would let the shard's next home
            // start a second one.
            let started = Instant::now();
            let mut last_request = started;
            let mut next_log = Duration::from_secs(5);
            loop {
                let running: Vec<(&str, usize)> = types
                    .iter()
                    .map(|(name, t)| (name.as_str(), t.hosted_shards().len()))
                    .filter(|(_, n)| *n > 0)
                    .collect();
                if running.is_empty() {
                    break;
                }
                // Hand-offs still under way go on: tell a coordinator that moved.
                if last_request.elapsed() >= Duration::from_millis(500) {
                    last_request = Instant::now();
                    let _ = request();
                }
                if started.elapsed() >= next_log {
                    next_log += Duration::from_secs(5);
                    tracing::warn!(
                        waited = ?started.elapsed(),
                        "cluster sharding: the leave waits for entities still in a message \
                         (entity type, shards): {running:?}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let reason = self.inner.cluster.leave().await;
        Left {
            reason,
            not_handed_off,
        }
    }
}

pub(super) fn refusal(type_name: &str, this_node: u32, e: RegisterError) -> ShardingError {
    match e {
        RegisterError::ShardCountMismatch { coordinator, .. } => {
            ShardingError::ShardCountMismatch {
                name: type_name.to_string(),
                coordinator,
                this_node,
            }
        }
        other => ShardingError::Refused {
            name: type_name.to_string(),
            reason: other.to_string(),
        },
    }
}

/// What [`ClusterSharding::leave`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a leave whose hand-offs timed out lost the messages of those shards' entities: check `handed_off()`"]
pub struct Left {
    /// Why the node's cluster layer stopped: [`NodeStopReason::Left`] after a graceful leave.
    pub reason: NodeStopReason,
    /// The entity types whose hand-offs had not completed within the timeout, each with the
    /// shards this node still owned then, whether or not their entities still ran (a fenced
    /// node's had stopped already); possibly none: the hand-off of the last ones may have
    /// been just short of its acknowledgement. Their entities stopped here after their
    /// current message, before the node left; what they had not handled, and what was sent to
    /// them meanwhile, went with the shard if its hand-off completed in the end, and became
    /// dead letters if not. The shards are reallocated once the node is gone. Empty after a
    /// complete hand-off.
    pub not_handed_off: BTreeMap<String, BTreeSet<ShardId>>,
}

impl Left {
    /// `true` if every entity type handed all its shards off before the node left.
    pub fn handed_off(&self) -> bool {
        self.not_handed_off.is_empty()
    }
}
