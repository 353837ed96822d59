//! # shardik-persistence
//!
//! Durable entities for [shardik](https://example.invalid/shardik): event-sourced entities
//! (state is the fold of persisted events, recovered from the latest snapshot plus later
//! events) and durable-state entities (the whole state saved per change), over storage
//! traits ([`Journal`], [`SnapshotStore`], [`StateStore`]) with an in-memory backend for
//! tests, an embedded SQLite backend ([`SqliteStore`], WAL mode) and a PostgreSQL backend
//! for clusters ([`PostgresStore`]); both durable backends batch concurrent writes.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::{ActorSystem, ReplyTo};
//! use shardik_persistence::{Effect, EventSourced, InMemoryStore, Persistence, PersistSettings, Versioned};
//! use shardik_sharding::ShardingExt;
//!
//! #[derive(Serialize, Deserialize)]
//! enum AccountCmd {
//!     Deposit(u64, ReplyTo<u64>),
//!     Balance(ReplyTo<u64>),
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! enum AccountEvent {
//!     Deposited { amount: u64 },
//! }
//! impl Versioned for AccountEvent {
//!     const TYPE_NAME: &'static str = "bank.AccountEvent";
//! }
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Account {
//!     balance: u64,
//! }
//! impl Versioned for Account {
//!     const TYPE_NAME: &'static str = "bank.Account";
//! }
//!
//! struct Bank;
//!
//! impl EventSourced for Bank {
//!     type Command = AccountCmd;
//!     type Event = AccountEvent;
//!     type State = Account;
//!
//!     fn handle_command(&self, state: &Account, cmd: AccountCmd) -> Effect<AccountEvent, Account> {
//!         match cmd {
//!             // Replied to only after the event is stored and applied.
//!             AccountCmd::Deposit(amount, reply) => Effect::persist(AccountEvent::Deposited { amount })
//!                 .then_reply(reply, |account: &Account| account.balance),
//!             AccountCmd::Balance(reply) => Effect::reply(reply, state.balance),
//!         }
//!     }
//!
//!     fn apply(state: &mut Account, event: &AccountEvent) {
//!         match event {
//!             AccountEvent::Deposited { amount } => state.balance += amount,
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Arc::new(InMemoryStore::new()); // or SqliteStore::open("node.db")
//! let persistence = Persistence::new(store);
//! let settings = PersistSettings::default().snapshot_every(100);
//! let t = Duration::from_secs(1);
//!
//! let system = ActorSystem::new("bank");
//! let accounts = system
//!     .sharding()
//!     .start(persistence.event_sourced("account", settings.clone(), |_id| Bank))
//!     .unwrap();
//! assert_eq!(accounts.ask("alice", |r| AccountCmd::Deposit(100, r), t).await, Ok(100));
//! assert_eq!(accounts.ask("alice", |r| AccountCmd::Deposit(50, r), t).await, Ok(150));
//! system.shutdown().await;
//!
//! // A new system over the same store: "alice" recovers her balance from the journal.
//! let system = ActorSystem::new("bank");
//! let accounts = system
//!     .sharding()
//!     .start(persistence.event_sourced("account", settings, |_id| Bank))
//!     .unwrap();
//! assert_eq!(accounts.ask("alice", AccountCmd::Balance, t).await, Ok(150));
//! system.shutdown().await;
//! # }
//! ```
//!
//! ## Guarantees
//! Events are persisted before the reply is sent and then applied; a failed write never
//! acknowledges its command. Writes carry the expected sequence number (or revision) and the
//! writer's incarnation: a conflicting or fenced-out write is refused with a typed
//! [`StoreError`], never merged. Concurrent writes from many entities share
//! transactions. Stored values are self-describing (type name, version, named-field
//! MessagePack) and older versions are upcast through [`Versioned::upcast`]. See
//! `docs/persistence.md`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod batch;
mod codec;
mod durable_state;
mod effect;
mod error;
mod event_sourced;
mod faulty;
mod memory;
mod metrics;
mod persistence;
mod postgres;
mod record;
mod rules;
mod settings;
mod spawn;
mod sqlite;
mod store;
mod value_tree;

pub use batch::WriterStats;
pub use codec::{Payload, Versioned};
pub use durable_state::{DurableState, DurableStateEntity};
pub use effect::{Effect, StateEffect};
pub use error::{CodecError, PersistenceError, StoreError};
pub use event_sourced::{EventSourced, EventSourcedEntity};
pub use faulty::FaultyStore;
pub use memory::InMemoryStore;
pub use persistence::{persistence_id, Persistence};
pub use postgres::{PostgresOptions, PostgresStore, PostgresTls};
pub use record::{
    AppendRequest, Incarnation, PersistedEvent, SnapshotRecord, StateRecord, StateWrite,
};
pub use settings::{OnPersistFailure, PersistSettings};
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};
pub use store::{Journal, SnapshotStore, StateStore, StoreFuture};
