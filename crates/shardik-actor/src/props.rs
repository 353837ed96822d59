//! [`Props`]: how to create an actor and how it runs.

use std::sync::Arc;

use crate::actor::{Actor, Termination};
use crate::mailbox::MailboxConfig;
use crate::supervision::SupervisorStrategy;

pub(crate) type Factory<A> = Box<dyn Fn() -> A + Send>;
type TerminationHook<M> = Arc<dyn Fn(Termination<M>) + Send + Sync>;

/// The settings of an actor spawned from an instance with nothing changed: a constant, so
/// spawning one allocates no settings of its own.
static INSTANCE_SUPERVISOR: SupervisorStrategy = SupervisorStrategy::Stop;
static INSTANCE_MAILBOX: MailboxConfig = MailboxConfig::Unbounded;

/// Where a cell finds its settings.
pub(crate) enum SettingsRef<M> {
    /// The defaults of [`Props::from_instance`].
    Instance,
    /// Settings chosen (and possibly shared) by the spawner.
    Shared(Arc<ActorSettings<M>>),
}

impl<M> SettingsRef<M> {
    pub(crate) fn supervisor(&self) -> &SupervisorStrategy {
        match self {
            SettingsRef::Instance => &INSTANCE_SUPERVISOR,
            SettingsRef::Shared(s) => &s.supervisor,
        }
    }

    pub(crate) fn mailbox(&self) -> &MailboxConfig {
        match self {
            SettingsRef::Instance => &INSTANCE_MAILBOX,
            SettingsRef::Shared(s) => &s.mailbox,
        }
    }

    pub(crate) fn throughput(&self) -> usize {
        match self {
            SettingsRef::Instance => DEFAULT_THROUGHPUT,
            SettingsRef::Shared(s) => s.throughput,
        }
    }

    pub(crate) fn on_termination(&self) -> Option<&TerminationHook<M>> {
        match self {
            SettingsRef::Instance => None,
            SettingsRef::Shared(s) => s.on_termination.as_ref(),
        }
    }

    fn to_settings(&self) -> ActorSettings<M> {
        match self {
            SettingsRef::Instance => {
                ActorSettings::default().supervisor(INSTANCE_SUPERVISOR.clone())
            }
            SettingsRef::Shared(s) => (**s).clone(),
        }
    }
}

impl<M> std::fmt::Debug for SettingsRef<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_settings().fmt(f)
    }
}

/// Default number of messages an actor handles per scheduling turn.
pub const DEFAULT_THROUGHPUT: usize = 64;

/// How an actor runs: supervision, mailbox, throughput and termination hook.
///
/// Owners that spawn many actors of one kind (a sharding region spawning entities) keep one
/// `Arc<ActorSettings>` and pass it to [`Props::with_settings`], so the settings are shared
/// instead of copied into every actor.
pub struct ActorSettings<M> {
    pub(crate) supervisor: SupervisorStrategy,
    pub(crate) mailbox: MailboxConfig,
    pub(crate) throughput: usize,
    pub(crate) on_termination: Option<TerminationHook<M>>,
}

impl<M> Default for ActorSettings<M> {
    fn default() -> Self {
        ActorSettings {
            supervisor: SupervisorStrategy::restart(),
            mailbox: MailboxConfig::default(),
            throughput: DEFAULT_THROUGHPUT,
            on_termination: None,
        }
    }
}

impl<M> Clone for ActorSettings<M> {
    fn clone(&self) -> Self {
        ActorSettings {
            supervisor: self.supervisor.clone(),
            mailbox: self.mailbox.clone(),
            throughput: self.throughput,
            on_termination: self.on_termination.clone(),
        }
    }
}

impl<M> std::fmt::Debug for ActorSettings<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorSettings")
            .field("supervisor", &self.supervisor)
            .field("mailbox", &self.mailbox)
            .field("throughput", &self.throughput)
            .field("on_termination", &self.on_termination.is_some())
            .finish()
    }
}

impl<M> ActorSettings<M> {
    /// Sets the supervisor strategy (default [`SupervisorStrategy::restart`]).
    pub fn supervisor(mut self, strategy: SupervisorStrategy) -> Self {
        self.supervisor = strategy;
        self
    }

    /// Sets the mailbox kind (unbounded by default).
    pub fn mailbox(mut self, mailbox: MailboxConfig) -> Self {
        self.mailbox = mailbox;
        self
    }

    /// Sets how many messages the actor handles per scheduling turn before it yields its
    /// worker thread (default 64; at least 1).
    pub fn throughput(mut self, messages: usize) -> Self {
        self.throughput = messages.max(1);
        self
    }

    /// Installs a hook that receives the actor's [`Termination`], including the user messages
    /// it accepted but never handled. Without a hook those messages are counted as dead
    /// letters. The hook runs on the actor's own task after [`Actor::stopped`] and before
    /// the termination is published: while it runs the actor's mailbox is closed, but
    /// [`ActorRef::is_terminated`](crate::ActorRef::is_terminated) is still false, the actor
    /// is still registered with its system or parent and counted as live, and watchers and
    /// `terminated()` waiters have not been told. Keep it short.
    pub fn on_termination(mut self, hook: impl Fn(Termination<M>) + Send + Sync + 'static) -> Self {
        self.on_termination = Some(Arc::new(hook));
        self
    }

    /// The configured supervisor strategy.
    pub fn supervisor_strategy(&self) -> &SupervisorStrategy {
        &self.supervisor
    }
}

/// The recipe for an actor: its factory, name and [`ActorSettings`].
///
/// ```
/// use std::time::Duration;
/// use shardik_actor::{Actor, ActorError, Context, MailboxConfig, Props, RestartPolicy, SupervisorStrategy};
///
/// struct Worker;
/// impl Actor for Worker {
///     type Msg = u32;
///     async fn handle(&mut self, _n: u32, _ctx: &mut Context<Self>) -> Result<(), ActorError> { Ok(()) }
/// }
///
/// let props = Props::new(|| Worker)
///     .name("worker")
///     .mailbox(MailboxConfig::bounded(1_000))
///     .supervisor(SupervisorStrategy::Restart(
///         RestartPolicy::new(5, Duration::from_secs(30))
///             .with_backoff(Duration::from_millis(10), Duration::from_secs(1)),
///     ));
/// # let _ = props;
/// ```
pub struct Props<A: Actor> {
    /// Recreates the actor for restarts; `None` for an actor spawned from an instance.
    pub(crate) factory: Option<Factory<A>>,
    /// The first instance, if the spawner made it.
    pub(crate) instance: Option<A>,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) settings: SettingsRef<A::Msg>,
}

impl<A: Actor> Props<A> {
    /// An actor made by `factory`, which is called again for every restart. The default
    /// strategy is [`SupervisorStrategy::restart`].
    pub fn new(factory: impl Fn() -> A + Send + 'static) -> Self {
        Props::with_settings(factory, Arc::new(ActorSettings::default()))
    }

    /// An actor made by `factory` with shared `settings`.
    pub fn with_settings(
        factory: impl Fn() -> A + Send + 'static,
        settings: Arc<ActorSettings<A::Msg>>,
    ) -> Self {
        Props {
            factory: Some(Box::new(factory)),
            instance: None,
            name: None,
            settings: SettingsRef::Shared(settings),
        }
    }

    /// An actor from a ready instance. It cannot be recreated, so the default strategy is
    /// [`SupervisorStrategy::Stop`]; `Resume` works too, and `Restart` stops it at its first
    /// failure (there is nothing to restart it from).
    pub fn from_instance(actor: A) -> Self {
        Props {
            factory: None,
            instance: Some(actor),
            name: None,
            settings: SettingsRef::Instance,
        }
    }

    /// Names the actor (shown in logs, dead letters and [`Terminated`](crate::Terminated)).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the supervisor strategy.
    pub fn supervisor(self, strategy: SupervisorStrategy) -> Self {
        self.update(|s| s.supervisor = strategy)
    }

    /// Sets the mailbox kind (unbounded by default).
    pub fn mailbox(self, mailbox: MailboxConfig) -> Self {
        self.update(|s| s.mailbox = mailbox)
    }

    /// Sets the number of messages handled per scheduling turn (default 64, at least 1).
    pub fn throughput(self, messages: usize) -> Self {
        self.update(|s| s.throughput = messages.max(1))
    }

    /// Installs a termination hook; see [`ActorSettings::on_termination`].
    pub fn on_termination(
        self,
        hook: impl Fn(Termination<A::Msg>) + Send + Sync + 'static,
    ) -> Self {
        let hook: TerminationHook<A::Msg> = Arc::new(hook);
        self.update(|s| s.on_termination = Some(hook))
    }

    fn update(mut self, f: impl FnOnce(&mut ActorSettings<A::Msg>)) -> Self {
        if let SettingsRef::Shared(shared) = &mut self.settings {
            if let Some(s) = Arc::get_mut(shared) {
                f(s);
                return self;
            }
        }
        let mut s = self.settings.to_settings();
        f(&mut s);
        self.settings = SettingsRef::Shared(Arc::new(s));
        self
    }
}

impl<A: Actor> std::fmt::Debug for Props<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Props")
            .field("actor", &std::any::type_name::<A>())
            .field("name", &self.name)
            .field("settings", &self.settings)
            .finish()
    }
}
