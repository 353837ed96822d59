//! [`ActorSystem`]: owns the actors, the dead letter counters and the shutdown sequence.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// Where one extension lives: filled once, by the first caller's `init`.
type ExtensionSlot = std::sync::OnceLock<Arc<dyn Any + Send + Sync>>;

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
    top: Box<[TopLevelShard]>,
    live: AtomicUsize,
    all_stopped: Notify,
    pub(crate) dead_letters: DeadLetters,
    shutting_down: AtomicBool,
    shutdown_signal: watch::Sender<bool>,
    extensions: Mutex<HashMap<TypeId, Arc<ExtensionSlot>>>,
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

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
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
        if self.shared.is_shutting_down() {
            tracing::warn!(system = %self.shared.name, "actor spawned during shutdown; stopping it at once");
            cell.send_system(SystemMessage::Stop);
        }
        cell.launch();
        ActorRef::from_cell(cell)
    }

    /// The system's single instance of extension `T`, created by `init` on first use.
    /// Higher layers (sharding, remoting) keep their per-system state here, so it lives as
    /// long as the system.
    ///
    /// `init` runs at most once per type and system, so it may have side effects (start a
    /// task, register a handler): callers that come while it runs wait for it (blocking
    /// their thread, like a lock) and get its value; their own `init` is dropped unused. If
    /// `init` panics, the panic reaches its caller and the next call runs its own `init`.
    /// `init` may use extensions of other types, but must not ask for `T` itself (that would
    /// deadlock or panic), nor wait for another thread that is creating an extension whose
    /// `init` asks for `T`.
    pub fn extension<T: Send + Sync + 'static>(
        &self,
        init: impl FnOnce(&ActorSystem) -> T,
    ) -> Arc<T> {
        // One slot per type; the map's lock is held only to find it, so `init` runs outside
        // it and may use other extensions.
        let slot = self
            .shared
            .extensions
            .lock()
            .entry(TypeId::of::<T>())
            .or_default()
            .clone();
        slot.get_or_init(|| Arc::new(init(self)))
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
        self.shared.is_shutting_down()
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Ext(u32);

    /// Two first calls of `extension` at once: the second waits for the first one's `init`
    /// instead of running its own (whose side effects would have been kept, and its value
    /// dropped), and both get the same value.
    #[test]
    fn concurrent_first_calls_of_an_extension_run_init_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let system = ActorSystem::with_config(SystemConfig {
            name: "extension-once".into(),
            runtime: Some(rt.handle().clone()),
        });
        let inits = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let (system, inits) = (system.clone(), inits.clone());
            std::thread::spawn(move || {
                let ext = system.extension(|_| {
                    inits.fetch_add(1, Ordering::SeqCst);
                    entered_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    Ext(1)
                });
                ext.0
            })
        };
        entered.recv().unwrap();
        // The first `init` runs; the second caller finds the extension missing meanwhile.
        let slot = system
            .shared
            .extensions
            .lock()
            .get(&TypeId::of::<Ext>())
            .cloned()
            .expect("the slot exists while init runs");
        let held = Arc::strong_count(&slot);
        let second = {
            let (system, inits) = (system.clone(), inits.clone());
            std::thread::spawn(move || {
                let ext = system.extension(|_| {
                    inits.fetch_add(1, Ordering::SeqCst);
                    Ext(2)
                });
                ext.0
            })
        };
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&slot) == held && !second.is_finished() {
            assert!(
                std::time::Instant::now() < give_up,
                "the second call never came"
            );
            std::thread::yield_now();
        }
        go.send(()).unwrap();
        assert_eq!(first.join().unwrap(), 1);
        assert_eq!(
            second.join().unwrap(),
            1,
            "the second caller got another value"
        );
        assert_eq!(inits.load(Ordering::SeqCst), 1, "init ran twice");
    }
}
