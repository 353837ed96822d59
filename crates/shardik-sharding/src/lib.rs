//! # shardik-sharding
//!
//! Entities by id: an entity type names a kind of stateful actor (account, cart, sensor), an
//! entity id names one of them, and a [`Region`] routes `(id, message)` to the one live
//! incarnation of that entity, starting it on its first message. Ids hash to shards
//! ([`shard_of`]); shards are the unit that later moves between cluster nodes.
//!
//! ```
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
//! use shardik_sharding::{EntityType, ShardingExt};
//!
//! #[derive(Serialize, Deserialize)]
//! enum AccountMsg {
//!     Deposit(u64),
//!     Balance(ReplyTo<u64>),
//! }
//!
//! struct Account { balance: u64 }
//!
//! impl Actor for Account {
//!     type Msg = AccountMsg;
//!     async fn handle(&mut self, msg: AccountMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
//!         match msg {
//!             AccountMsg::Deposit(n) => self.balance += n,
//!             AccountMsg::Balance(reply) => reply.reply(self.balance),
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let system = ActorSystem::new("bank");
//! let accounts = system
//!     .sharding()
//!     .start(EntityType::new("account", |_id: &str| Account { balance: 0 }))
//!     .unwrap();
//! accounts.tell("alice", AccountMsg::Deposit(100));
//! accounts.tell("alice", AccountMsg::Deposit(50));
//! let balance = accounts
//!     .ask("alice", AccountMsg::Balance, Duration::from_secs(1))
//!     .await
//!     .unwrap();
//! assert_eq!(balance, 150);
//! system.shutdown().await;
//! # }
//! ```
//!
//! Guarantees (see `docs/semantics.md`): one live incarnation per entity id per region; one
//! message at a time per entity; FIFO per sender; messages that arrive while an entity
//! passivates wait and go to its next incarnation.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod cluster;
pub mod coordination;
mod entity;
mod error;
mod extract;
mod handle;
mod hash;
mod metrics;
mod region;
pub mod shard;
mod sharding;
mod stats;

pub use coordination::FencingToken;
pub use entity::{EntityType, DEFAULT_BUFFER_LIMIT, DEFAULT_SHARDS, MAX_SHARDS};
pub use error::ShardingError;
pub use extract::{ExtractAskError, ExtractError, ExtractingRegion, Extractor, MessageExtractor};
pub use handle::{EntityRef, Region};
pub use hash::{hash32, shard_of, ShardFn, ShardId};
pub use shard::EntityId;
pub use sharding::{Sharding, ShardingExt};
pub use stats::RegionStats;
