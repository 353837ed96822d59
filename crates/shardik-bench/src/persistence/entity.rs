//! The benchmark's event-sourced entity: a counter whose every `Add` persists one event.

use serde::{Deserialize, Serialize};
use shardik::prelude::*;
use shardik_persistence::{Effect, EventSourced, Versioned};

/// The counter's commands.
#[derive(Serialize, Deserialize)]
pub enum Cmd {
    /// Persists one [`Event::Added`], then answers the new count.
    Add(u64, ReplyTo<u64>),
    /// Answers the count (persists nothing): used to time recovery.
    Get(ReplyTo<u64>),
}

/// The counter's one event.
#[derive(Debug, Serialize, Deserialize)]
pub enum Event {
    /// `amount` was added.
    Added {
        /// How much.
        amount: u64,
    },
}

impl Versioned for Event {
    const TYPE_NAME: &'static str = "bench.CounterEvent";
}

/// The counter's state (and snapshot).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct State {
    /// Sum of the amounts.
    pub count: u64,
    /// Events applied.
    pub events: u64,
}

impl Versioned for State {
    const TYPE_NAME: &'static str = "bench.CounterState";
}

/// Applies `event` to `state`: the fold both shardik and the direct baselines run.
pub fn apply(state: &mut State, event: &Event) {
    match event {
        Event::Added { amount } => {
            state.count += amount;
            state.events += 1;
        }
    }
}

/// The behaviour.
pub struct Counter;

impl EventSourced for Counter {
    type Command = Cmd;
    type Event = Event;
    type State = State;

    fn handle_command(&self, state: &State, cmd: Cmd) -> Effect<Event, State> {
        match cmd {
            Cmd::Add(amount, reply) => {
                Effect::persist(Event::Added { amount }).then_reply(reply, |s: &State| s.count)
            }
            Cmd::Get(reply) => Effect::reply(reply, state.events),
        }
    }

    fn apply(state: &mut State, event: &Event) {
        apply(state, event);
    }
}
