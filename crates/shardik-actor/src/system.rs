//! [`ActorSystem`]: owns the actors, the dead letter counters and the shutdown sequence.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use crate::actor::{Actor, ActorId};
use crate::actor_ref::ActorRef;
use crate::cell::{Cell, CellHandle, Parent};
use crate::dead_letters::{DeadLetterStats, DeadLetters, DeadReason};
use crate::deadline::{Ticker, Within};
use crate::dispatcher::Dispatcher;
use crate::mailbox::SystemMessage;
use crate::props::Props;

const TOP_LEVEL_SHARDS: usize = 32;

/// One shard of the top-level actors, by id.
type TopLevelShard = Mutex<HashMap<ActorId, Arc<dyn CellHandle>>>;

/// Settings of an [`ActorSystem`].
#[derive(Clone, Debug)]
pub struct SystemConfig {
    /// The system's name, shown in logs.
    pub name: String,
    /// The tokio runtime the actors run on; `None` means the runtime of the caller of
    /// [`ActorSystem::with_config`].
    pub runtime: Option<tokio::runtime::Handle>,
}

impl SystemConfig {
    /// A config with the given name and the current runtime.
    pub fn new(name: impl Into<String>) -> Self {
        SystemConfig {
            name: name.into(),
            runtime: None,
        }
    }
}

/// A shutdown that did not finish in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shutdown timed out after {timeout:?} with {remaining} actor(s) still running")]
pub struct ShutdownError {
    /// The timeout that passed.
    pub timeout: Duration,
    /// Actors that had not terminated.
    pub remaining: usize,
}

pub(crate) struct SystemShared {
    pub(crate) name: Arc<str>,
    pub(crate) runtime: tokio::runtime::Handle,
    next_id: AtomicU64,
    top: Box<[TopLevelShard]>,
    live: AtomicUsize,
    all_stopped: Notify,
    pub(crate) dead_letters: DeadLetters,
    shutting_down: AtomicBool,
    shutdown_signal: watch::Sender<bool>,
    extensions: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    pub(crate) dispatcher: Arc<Dispatcher>,
    /// Ends the grace period of pending asks (see `deadline.rs`).
    pub(crate) ask_ticker: Arc<Ticker>,
}

impl Drop for SystemShared {
    fn drop(&mut self) {
        self.dispatcher.close();
        self.ask_ticker.close();
    }
}

impl SystemShared {
    pub(crate) fn timeout<F: std::future::Future>(
        &self,
        timeout: Duration,
        fut: F,
    ) -> Within<'_, F> {
        crate::deadline::within(&self.ask_ticker, timeout, fut)
    }

    pub(crate) fn next_id(&self) -> ActorId {
        ActorId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn actor_started(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn actor_stopped(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.all_stopped.notify_waiters();
        }
    }

    fn shard(&self, id: ActorId) -> &TopLevelShard {
        &self.top[(id.0 as usize) % TOP_LEVEL_SHARDS]
    }

    pub(crate) fn remove_top_level(&self, id: ActorId) {
        self.shard(id).lock().remove(&id);
    }
}

/// The home of a set of actors: spawns top-level actors, counts dead letters, and shuts
/// everything down in order.
///
/// Cloning is cheap; all clones are the same system. An `ActorSystem` must be created inside
/// a tokio runtime (or be given one in [`SystemConfig::runtime`]); actors run on that runtime.
#[derive(Clone)]
pub struct ActorSystem {
    pub(crate) shared: Arc<SystemShared>,
}

impl ActorSystem {
    /// Creates a system on the current tokio runtime.
    ///
    /// # Panics
    /// If called outside a tokio runtime, like `tokio::spawn`. Use
    /// [`with_config`](ActorSystem::with_config) with a runtime handle to create one elsewhere.
    pub fn new(name: impl Into<String>) -> Self {
        ActorSystem::with_config(SystemConfig::new(name))
    }

    /// Creates a system from `config`.
    ///
    /// # Panics
    /// If `config.runtime` is `None` and the caller is not inside a tokio runtime.
    pub fn with_config(config: SystemConfig) -> Self {
        let runtime = config.runtime.unwrap_or_else(|| {
            tokio::runtime::Handle::try_current().unwrap_or_else(|_| {
                panic!("ActorSystem::new must be called inside a tokio runtime (or pass SystemConfig::runtime)")
            })
        });
        let (shutdown_signal, _) = watch::channel(false);
        let ask_ticker = Ticker::new();
        ActorSystem {
            shared: Arc::new(SystemShared {
                name: config.name.into(),
                runtime,
                next_id: AtomicU64::new(1),
                top: (0..TOP_LEVEL_SHARDS)
                    .map(|_| Mutex::new(HashMap::new()))
                    .collect(),
                live: AtomicUsize::new(0),
                all_stopped: Notify::new(),
                dead_letters: DeadLetters::default(),
                shutting_down: AtomicBool::new(false),
                shutdown_signal,
                extensions: Mutex::new(HashMap::new()),
                dispatcher: Dispatcher::new(),
                ask_ticker,
            }),
        }
    }

    pub(crate) fn from_shared(shared: Arc<SystemShared>) -> Self {
        ActorSystem { shared }
    }

    /// Requires `fut` to complete within `timeout`, like `tokio::time::timeout`, at a fraction
    /// of its cost for futures that usually finish early: the timer is armed only if `fut` is
    /// still pending after [`deadline::GRACE`](crate::deadline::GRACE) (see
    /// [`deadline`](crate::deadline)). [`ActorRef::ask`] uses it, and so can in-process
    /// request/response code of your own; for a future that waits on the network a tokio timer
    /// costs too little to matter. The deadline is counted from this call, on the runtime's clock.
    ///
    /// The future borrows the system: it is meant to be awaited where it is made. (Holding a
    /// clone of the system instead would put an atomic reference count that every ask on every
    /// thread touches on the hot path.) To spawn it, move a clone of the system into the task
    /// and call `timeout` there.
    ///
    /// ```
    /// use std::time::Duration;
    /// use shardik_actor::{deadline::Elapsed, ActorSystem};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let system = ActorSystem::new("docs");
    /// let never = std::future::pending::<()>();
    /// let late = system.timeout(Duration::from_secs(5), never).await;
    /// assert_eq!(late, Err(Elapsed(Duration::from_secs(5))));
    /// assert_eq!(system.timeout(Duration::from_secs(5), async { 7 }).await, Ok(7));
    /// # }
    /// ```
    pub fn timeout<F: std::future::Future>(&self, timeout: Duration, fut: F) -> Within<'_, F> {
        self.shared.timeout(timeout, fut)
    }

    /// The system's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The tokio runtime the actors run on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.shared.runtime
    }

    /// Spawns a top-level actor from an instance (it cannot be restarted; see
    /// [`Props::from_instance`]).
    pub fn spawn<A: Actor>(&self, actor: A) -> ActorRef<A::Msg> {
        self.spawn_props(Props::from_instance(actor))
    }

    /// Spawns a top-level actor from [`Props`].
    pub fn spawn_props<A: Actor>(&self, props: Props<A>) -> ActorRef<A::Msg> {
        let cell = Cell::create(&self.shared, Parent::System, props);
        let handle: Arc<dyn CellHandle> = cell.clone();
        self.shared.shard(cell.id).lock().insert(cell.id, handle);
        if self.shared.shutting_down.load(Ordering::Acquire) {
            tracing::warn!(system = %self.shared.name, "actor spawned during shutdown; stopping it at once");
            cell.send_system(SystemMessage::Stop);
        }
        cell.launch();
        ActorRef::from_cell(cell)
    }

    /// The system's single instance of extension `T`, created by `init` on first use.
    /// Higher layers (sharding, remoting) keep their per-system state here, so it lives as
    /// long as the system.
    pub fn extension<T: Send + Sync + 'static>(
        &self,
        init: impl FnOnce(&ActorSystem) -> T,
    ) -> Arc<T> {
        if let Some(ext) = self.shared.extensions.lock().get(&TypeId::of::<T>()) {
            return ext
                .clone()
                .downcast::<T>()
                .expect("extension stored under its own type id");
        }
        // Built outside the lock so `init` may use other extensions.
        let made: Arc<dyn Any + Send + Sync> = Arc::new(init(self));
        let mut map = self.shared.extensions.lock();
        map.entry(TypeId::of::<T>())
            .or_insert(made)
            .clone()
            .downcast::<T>()
            .expect("extension stored under its own type id")
    }

    /// Dead letters counted so far.
    pub fn dead_letters(&self) -> DeadLetterStats {
        self.shared.dead_letters.stats()
    }

    /// Records a dead letter on behalf of a higher layer (such as a sharding buffer that
    /// overflowed), so every undeliverable message shows up in one place.
    pub fn record_dead_letter(
        &self,
        recipient: &dyn std::fmt::Display,
        message_type: &'static str,
        reason: &'static str,
    ) {
        self.shared.dead_letters.record(
            &self.shared.name,
            recipient,
            message_type,
            DeadReason::Other(reason),
        );
    }

    /// Actors spawned and not yet terminated (top-level and children).
    pub fn live_actors(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// True once [`shutdown`](ActorSystem::shutdown) has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Ordering::Acquire)
    }

    /// Completes when shutdown begins; background tasks of higher layers select on it.
    pub async fn shutdown_started(&self) {
        let mut rx = self.shared.shutdown_signal.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Stops every actor and waits for all of them: each finishes the message it is handling,
    /// children stop before their parents, every `stopped` hook runs. Messages still queued
    /// are handed to termination hooks or counted as dead letters.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        let mut first = true;
        loop {
            let notified = self.shared.all_stopped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.live_actors() == 0 {
                return;
            }
            // `begin_shutdown` has just stopped every top-level actor, and anything spawned
            // after it is stopped at birth; on later rounds, stop again whatever is left.
            if !first {
                self.stop_top_level();
            }
            first = false;
            notified.await;
        }
    }

    /// Like [`shutdown`](ActorSystem::shutdown) but gives up after `timeout`, reporting how many
    /// actors were still running.
    pub async fn shutdown_timeout(&self, timeout: Duration) -> Result<(), ShutdownError> {
        match tokio::time::timeout(timeout, self.shutdown()).await {
            Ok(()) => Ok(()),
            Err(_) => Err(ShutdownError {
                timeout,
                remaining: self.live_actors(),
            }),
        }
    }

    fn begin_shutdown(&self) {
        if !self.shared.shutting_down.swap(true, Ordering::AcqRel) {
            tracing::debug!(system = %self.shared.name, live = self.live_actors(), "shutting down");
            self.shared.shutdown_signal.send_replace(true);
        }
        self.stop_top_level();
    }

    fn stop_top_level(&self) {
        for shard in self.shared.top.iter() {
            let handles: Vec<_> = shard.lock().values().cloned().collect();
            for h in handles {
                h.send_system(SystemMessage::Stop);
            }
        }
    }
}

impl std::fmt::Debug for ActorSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorSystem")
            .field("name", &self.shared.name)
            .field("live_actors", &self.live_actors())
            .finish()
    }
}
