//! [`DurableState`] behaviours and the [`DurableStateEntity`] actor that runs them.

use std::sync::Arc;

use shardik_actor::{Actor, ActorError, Context};
use shardik_sharding::FencingToken;

use crate::codec::{Payload, Versioned};
use crate::effect::StateEffect;
use crate::error::{PersistenceError, StoreError};
use crate::event_sourced::{persist_failed, writer_above};
use crate::persistence::Persistence;
use crate::record::{Incarnation, StateWrite};
use crate::settings::PersistSettings;

/// An entity whose whole state is saved on every change and loaded on start.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use shardik_actor::ReplyTo;
/// use shardik_persistence::{DurableState, StateEffect, Versioned};
///
/// #[derive(Clone, Default, Serialize, Deserialize)]
/// struct Profile { name: String }
/// impl Versioned for Profile { const TYPE_NAME: &'static str = "profile.State"; }
///
/// enum ProfileCmd { Rename(String, ReplyTo<()>), Get(ReplyTo<String>) }
///
/// struct Profiles;
/// impl DurableState for Profiles {
///     type Command = ProfileCmd;
///     type State = Profile;
///     fn handle_command(&self, state: &Profile, cmd: ProfileCmd) -> StateEffect<Profile> {
///         match cmd {
///             ProfileCmd::Rename(name, reply) => StateEffect::persist(Profile { name }).then_reply(reply, |_| ()),
///             ProfileCmd::Get(reply) => StateEffect::reply(reply, state.name.clone()),
///         }
///     }
/// }
/// ```
pub trait DurableState: Send + 'static {
    /// The commands (the actor's message type).
    type Command: Send + 'static;
    /// The state; its [`Default`] is the state of an entity never saved.
    type State: Versioned + Default;

    /// Decides what a command does: a new state to save (or none) and the follow-ups.
    fn handle_command(
        &self,
        state: &Self::State,
        command: Self::Command,
    ) -> StateEffect<Self::State>;
}

/// The actor that runs a [`DurableState`] behaviour against a [`Persistence`].
pub struct DurableStateEntity<B: DurableState> {
    behavior: B,
    persistence_id: String,
    persistence: Persistence,
    settings: Arc<PersistSettings>,
    state: B::State,
    revision: u64,
    recovered: bool,
    /// The writer incarnation: the shard's fencing token from the start, or fixed by the
    /// first successful save (see `save`).
    writer: Option<Incarnation>,
}

impl<B: DurableState> DurableStateEntity<B> {
    /// An entity saving under `persistence_id`; it loads its state when it starts.
    pub fn new(
        behavior: B,
        persistence_id: impl Into<String>,
        persistence: Persistence,
        settings: Arc<PersistSettings>,
    ) -> Self {
        DurableStateEntity {
            behavior,
            persistence_id: persistence_id.into(),
            persistence,
            settings,
            state: B::State::default(),
            revision: 0,
            recovered: false,
            writer: None,
        }
    }

    /// Makes the entity save with `token` (if `Some`) instead of its node's incarnation; see
    /// [`EventSourcedEntity::with_fencing_token`](crate::EventSourcedEntity::with_fencing_token).
    pub fn with_fencing_token(mut self, token: Option<FencingToken>) -> Self {
        if let Some(token) = token {
            self.writer = Some(token);
        }
        self
    }

    async fn recover(&mut self) -> Result<(), PersistenceError> {
        crate::metrics::timed_recovery(crate::metrics::Kind::DurableState, self.load()).await
    }

    /// Reads the stored state, if any.
    async fn load(&mut self) -> Result<(), PersistenceError> {
        match self.persistence.states().get(&self.persistence_id).await? {
            Some(record) => {
                if crate::event_sourced::corrupt_number(record.revision) {
                    // A stored negative revision (read back above `i64::MAX`): no write can
                    // follow it (after a -1 the entity would answer queries and then fail its
                    // first write; after a -2, until 2026-12-01, that write stored -1). It
                    // fails to load instead, as an event-sourced entity fails recovery on
                    // such a sequence number.
                    return Err(PersistenceError::Recovery {
                        persistence_id: self.persistence_id.clone(),
                        reason: format!(
                            "the stored revision {} is corrupt: no write can follow it",
                            record.revision
                        ),
                    });
                }
                self.state = record.payload.decode()?;
                self.revision = record.revision;
            }
            None => {
                self.state = B::State::default();
                self.revision = 0;
            }
        }
        self.recovered = true;
        Ok(())
    }

    async fn save(&mut self, state: B::State) -> Result<(), PersistenceError> {
        let mut write = StateWrite {
            persistence_id: self.persistence_id.clone(),
            expected_revision: self.revision,
            writer: self.writer.unwrap_or(self.persistence.incarnation()),
            payload: Payload::encode(&state)?,
        };
        let states = self.persistence.states();
        let mut writer = write.writer;
        self.revision = match self.writer {
            Some(_) => states.upsert(write).await?,
            // The first save of this incarnation of the entity: above a newer node's writer
            // if the state moved here from one (as for event-sourced entities).
            None => match states.upsert(write.clone()).await {
                Err(StoreError::Fenced { current, .. }) => {
                    writer = writer_above(&write.persistence_id, current)?;
                    write.writer = writer;
                    states.upsert(write).await?
                }
                r => r?,
            },
        };
        self.writer = Some(writer);
        self.state = state;
        metrics::counter!("shardik_persistence_states_saved_total").increment(1);
        Ok(())
    }
}

impl<B: DurableState> Actor for DurableStateEntity<B> {
    type Msg = B::Command;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.recover().await?;
        Ok(())
    }

    async fn handle(
        &mut self,
        command: B::Command,
        ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        if !self.recovered {
            self.recover().await?;
        }
        let StateEffect { state, after } = self.behavior.handle_command(&self.state, command);
        if let Some(state) = state {
            if let Err(e) = self.save(state).await {
                self.recovered = false;
                return persist_failed(&self.persistence_id, e, self.settings.on_failure, ctx);
            }
        }
        let stop = after.stop;
        after.run(&self.state);
        if stop {
            ctx.stop();
        }
        Ok(())
    }
}

impl<B: DurableState> std::fmt::Debug for DurableStateEntity<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableStateEntity")
            .field("persistence_id", &self.persistence_id)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}
