//! [`Effect`] and [`StateEffect`]: what a command handler decides.

use shardik_actor::ReplyTo;

/// A follow-up run with the new state.
type Callback<S> = Box<dyn FnOnce(&S) + Send>;

/// Callbacks that run after a successful persist, with the new state.
pub(crate) struct AfterPersist<S> {
    callbacks: Vec<Callback<S>>,
    pub(crate) stop: bool,
}

impl<S> Default for AfterPersist<S> {
    fn default() -> Self {
        AfterPersist {
            callbacks: Vec::new(),
            stop: false,
        }
    }
}

impl<S> AfterPersist<S> {
    fn push(&mut self, f: impl FnOnce(&S) + Send + 'static) {
        self.callbacks.push(Box::new(f));
    }

    /// Runs the callbacks in order.
    pub(crate) fn run(self, state: &S) {
        for f in self.callbacks {
            f(state);
        }
    }
}

/// What an [`EventSourced`](crate::EventSourced) command handler decided: events to
/// persist (maybe none) and what to do once they are stored and applied.
///
/// The follow-ups (`then_reply`, `then`) run only after the events are durably stored and
/// applied; if the persist fails they never run, so a command is never acknowledged without
/// its events. A [`ReplyTo`] dropped that way fails the caller's `ask` at once with
/// `AskError::NoReply`.
///
/// ```
/// # use shardik_actor::ReplyTo;
/// # use shardik_persistence::Effect;
/// # struct State { balance: u64 }
/// # enum Event { Deposited(u64) }
/// fn deposit(amount: u64, reply: ReplyTo<u64>) -> Effect<Event, State> {
///     Effect::persist(Event::Deposited(amount)).then_reply(reply, |s: &State| s.balance)
/// }
/// # let _ = deposit;
/// ```
#[must_use = "an effect does nothing unless returned from the command handler"]
pub struct Effect<E, S> {
    pub(crate) events: Vec<E>,
    pub(crate) after: AfterPersist<S>,
}

impl<E, S: 'static> Effect<E, S> {
    /// Persist nothing, do nothing.
    pub fn none() -> Self {
        Effect {
            events: Vec::new(),
            after: AfterPersist::default(),
        }
    }

    /// Persist one event.
    pub fn persist(event: E) -> Self {
        Self::persist_all([event])
    }

    /// Persist several events atomically (all or none).
    pub fn persist_all(events: impl IntoIterator<Item = E>) -> Self {
        Effect {
            events: events.into_iter().collect(),
            after: AfterPersist::default(),
        }
    }

    /// Reply with `value` without persisting anything (a query or a rejected command).
    pub fn reply<R: Send + 'static>(reply_to: ReplyTo<R>, value: R) -> Self {
        Self::none().then_reply(reply_to, move |_| value)
    }

    /// After the events are persisted and applied, reply with `f(&new_state)`. Name the
    /// state type in the closure (`|s: &Account| s.balance`): Rust types closures before it
    /// looks at the handler's return type.
    pub fn then_reply<R: Send + 'static>(
        mut self,
        reply_to: ReplyTo<R>,
        f: impl FnOnce(&S) -> R + Send + 'static,
    ) -> Self {
        self.after.push(move |s| reply_to.reply(f(s)));
        self
    }

    /// After the events are persisted and applied, run `f` with the new state.
    pub fn then(mut self, f: impl FnOnce(&S) + Send + 'static) -> Self {
        self.after.push(f);
        self
    }

    /// After the events are persisted and applied, stop the entity.
    pub fn then_stop(mut self) -> Self {
        self.after.stop = true;
        self
    }
}

/// What a [`DurableState`](crate::DurableState) command handler decided: a new state to
/// save (or none) and what to do once it is stored. Follow-ups run only after a successful
/// save, like [`Effect`]'s.
#[must_use = "an effect does nothing unless returned from the command handler"]
pub struct StateEffect<S> {
    pub(crate) state: Option<S>,
    pub(crate) after: AfterPersist<S>,
}

impl<S: 'static> StateEffect<S> {
    /// Save nothing, do nothing.
    pub fn none() -> Self {
        StateEffect {
            state: None,
            after: AfterPersist::default(),
        }
    }

    /// Save `state` as the entity's new state.
    pub fn persist(state: S) -> Self {
        StateEffect {
            state: Some(state),
            after: AfterPersist::default(),
        }
    }

    /// Reply with `value` without saving anything.
    pub fn reply<R: Send + 'static>(reply_to: ReplyTo<R>, value: R) -> Self {
        Self::none().then_reply(reply_to, move |_| value)
    }

    /// After the state is saved, reply with `f(&new_state)`.
    pub fn then_reply<R: Send + 'static>(
        mut self,
        reply_to: ReplyTo<R>,
        f: impl FnOnce(&S) -> R + Send + 'static,
    ) -> Self {
        self.after.push(move |s| reply_to.reply(f(s)));
        self
    }

    /// After the state is saved, run `f` with it.
    pub fn then(mut self, f: impl FnOnce(&S) + Send + 'static) -> Self {
        self.after.push(f);
        self
    }

    /// After the state is saved, stop the entity.
    pub fn then_stop(mut self) -> Self {
        self.after.stop = true;
        self
    }
}
