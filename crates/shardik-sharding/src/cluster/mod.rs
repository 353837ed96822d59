//! # Cluster sharding: the tokio layer over [`coordination`](crate::coordination)
//!
//! [`ClusterSharding::get`] on a running [`Cluster`](shardik_cluster::runtime::Cluster) node,
//! then [`ClusterSharding::start`] with the same [`EntityType`](crate::EntityType) as
//! single-node sharding: the returned [`Region`](crate::Region) and its
//! [`EntityRef`](crate::EntityRef)s `tell` and `ask` entities wherever they live.
//!
//! ```no_run
//! # use serde::{Deserialize, Serialize};
//! # use shardik_actor::{Actor, ActorError, Context, ReplyTo};
//! # #[derive(Serialize, Deserialize)]
//! # enum AccountMsg { Deposit(u64), Balance(ReplyTo<u64>) }
//! # struct Account { balance: u64 }
//! # impl Actor for Account {
//! #     type Msg = AccountMsg;
//! #     async fn handle(&mut self, m: AccountMsg, _c: &mut Context<Self>) -> Result<(), ActorError> {
//! #         match m { AccountMsg::Deposit(n) => self.balance += n, AccountMsg::Balance(r) => r.reply(self.balance) }
//! #         Ok(())
//! #     }
//! # }
//! use std::time::Duration;
//! use shardik_cluster::runtime::Cluster;
//! use shardik_sharding::cluster::ClusterSharding;
//! use shardik_sharding::EntityType;
//!
//! # async fn run(cluster: Cluster) {
//! // On every node:
//! let accounts = ClusterSharding::get(&cluster)
//!     .start(EntityType::new("account", |_id: &str| Account { balance: 0 }))
//!     .unwrap();
//! // From any node; the entity lives on exactly one of them.
//! accounts.tell("alice", AccountMsg::Deposit(100));
//! let balance = accounts
//!     .entity_ref("alice")
//!     .ask(AccountMsg::Balance, Duration::from_secs(5))
//!     .await
//!     .unwrap();
//! # let _ = balance;
//! # }
//! ```
//!
//! ## Pieces (one task or endpoint each)
//! * **Region** (`region.rs`): the node's [`RegionState`](crate::coordination::RegionState)
//!   under a lock. A sender's `tell` routes under the lock and the resulting actions (deliver
//!   to a hosted shard's local entity, forward to a peer region, ask the coordinator, stop a
//!   shard) run before the lock is released, so actions leave in the order the state machine
//!   emitted them. Hosted shards live in the single-node `LocalRegion`, so
//!   entity code is unchanged. Forwarded envelopes and fences go on the user lane of the one
//!   connection per node pair (ordered); messages arriving from peers are handled on the
//!   connection's reader task, in arrival order. A driver task ticks the state machine, feeds
//!   it `ShardStopped`, coordinator changes (the oldest `Up` member) and downed peers.
//! * **Coordinator** (`coordinator.rs`): a task per entity type on every node; the one on the
//!   oldest `Up` member that hosts the type (started it, not as a proxy, with the type's role
//!   if any; known from the type directory, `directory.rs`) reads the coordinator state from a majority of
//!   replicas, recovers a [`Coordinator`](crate::coordination::Coordinator) with the highest
//!   epoch seen + 1, and drives it. Its messages to regions go on the control lane.
//! * **Replica** (`replica.rs`): every node stores the latest coordinator state per type. Every
//!   `Persist` is answered with `Persisted(v)` only once a majority of the `Up`/`Leaving`
//!   members acknowledged a state of version `v` or newer of this epoch. Replicas refuse states
//!   older (by epoch, then version) than theirs, which fences a stale coordinator.
//! * **State store** (`state_store.rs`, optional): a [`ShardingStateStore`] per node keeps
//!   the replica (coordinator states and remembered entities) across a full cluster restart;
//!   a replica then acknowledges a write only once the store has it.
//!
//! How it works in more detail, the guarantees and what is not done yet: `docs/sharding.md` and
//! the "Cluster sharding" section of `docs/semantics.md`.
mod coordinator;
mod directory;
mod entity_sets;
mod membership;
mod proxy;
mod region;
mod remember;
mod replica;
mod settings;
mod sharding;
mod state_store;
mod wire;

pub use coordinator::CoordinatorSnapshot;
pub use settings::{ClusterShardingSettings, RememberedStart};
pub use sharding::{ClusterSharding, Left};
pub use state_store::{
    replaces, RecordKey, ShardingRecord, ShardingStateStore, StateStoreError, StateStoreFuture,
};
