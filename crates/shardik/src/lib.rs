//! # shardik
//!
//! An actor runtime with cluster sharding for async Rust. Millions of stateful entities
//! (accounts, carts, sessions, sensors), each one actor that handles one message at a time,
//! addressed by id. This crate is the facade: depend on `shardik` and everything you need is
//! re-exported here.
//!
//! - [`actor`]: typed actors, [`ActorRef`] with `tell` and `ask`, supervision, timers, watch,
//!   dead letters and orderly shutdown ([`ActorSystem`]).
//! - [`sharding`]: entity types, id → shard hashing, [`Region`] and [`EntityRef`], passivation
//!   by idle timeout, by a cap on live entities (least recently used first) and on request.
//!
//! ## Quickstart
//!
//! ```
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use shardik::prelude::*;
//!
//! #[derive(Serialize, Deserialize)]
//! enum Counter {
//!     Add(u64),
//!     Get(ReplyTo<u64>),
//! }
//!
//! struct CounterEntity {
//!     total: u64,
//! }
//!
//! impl Actor for CounterEntity {
//!     type Msg = Counter;
//!     async fn handle(&mut self, msg: Counter, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
//!         match msg {
//!             Counter::Add(n) => self.total += n,
//!             Counter::Get(reply) => reply.reply(self.total),
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let system = ActorSystem::new("quickstart");
//! let counters = system
//!     .sharding()
//!     .start(
//!         EntityType::new("counter", |_id: &str| CounterEntity { total: 0 })
//!             .idle_timeout(Duration::from_secs(60)),
//!     )
//!     .expect("entity type starts");
//!
//! counters.tell("page-a", Counter::Add(2));
//! let page = counters.entity_ref("page-a");
//! page.tell(Counter::Add(3));
//! let total = page.ask(Counter::Get, Duration::from_secs(1)).await.expect("entity answers");
//! assert_eq!(total, 5);
//!
//! system.shutdown().await;
//! # }
//! ```
//!
//! The guarantees (ordering, delivery, supervision, passivation, shutdown) are written down in
//! `docs/semantics.md` of the repository; the design is in `ARCHITECTURE.md`.
//!
//! # Logs and metrics
//!
//! shardik logs with [`tracing`](https://docs.rs/tracing) and counts with the
//! [`metrics`](https://docs.rs/metrics) facade: install a recorder (the Prometheus exporter,
//! say) **before** starting the actor system, since regions register their metric handles when
//! they start. Cluster membership by status, unreachable members, shards hosted, hand-offs and
//! their duration, live entities, ask timeouts, dead letters, connections and persistence
//! recoveries are among them; `docs/observability.md` of the repository lists every metric
//! and what to alert on, and the `prometheus` example serves them on `/metrics`.
//!
//! # Release builds
//!
//! The runtime's hot path (an actor's run loop, its mailbox, `tell`) is generic over your
//! actor types, so it is compiled into your crate, under your release profile. Build services
//! with one codegen unit:
//!
//! ```toml
//! [profile.release]
//! codegen-units = 1
//! ```
//!
//! With the 4 units of this workspace's own profile, how that code was split and inlined
//! changed with unrelated code in the same crate: the 4-pair tell benchmark fell from 0.79 to
//! 0.63 of raw tokio channels with no change to the runtime, and measured 0.79-0.80 again with
//! one unit (the README's performance section has the runs).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// The local actor runtime (the `shardik-actor` crate).
pub mod actor {
    pub use shardik_actor::*;
}

/// Entities by id over shards (the `shardik-sharding` crate).
pub mod sharding {
    pub use shardik_sharding::*;
}

/// Nodes talking to each other: frames over TCP, handshake, TLS, remote refs (the
/// `shardik-remote` crate). See `docs/remoting.md` for what is secure and what is not.
pub mod remote {
    pub use shardik_remote::*;
}

/// Cluster membership: gossip, phi accrual failure detection, split brain resolution, and
/// [`Cluster`](shardik_cluster::runtime::Cluster) that runs them over remoting (the
/// `shardik-cluster` crate). See `docs/cluster.md` for defaults and tuning.
pub mod cluster {
    pub use shardik_cluster::*;
}

/// Event-sourced and durable-state entities over SQLite, PostgreSQL or memory, and the
/// cluster sharding state on the same stores (the `shardik-persistence` crate; feature
/// `persistence`, on by default). See `docs/persistence.md`.
#[cfg(feature = "persistence")]
pub mod persistence {
    pub use shardik_persistence::*;
}

pub use shardik_actor::{
    Actor, ActorError, ActorId, ActorRef, ActorSettings, ActorSystem, AskError, Context,
    DeadLetterStats, MailboxConfig, OverflowPolicy, Props, ReplyTo, RestartPolicy, ShutdownError,
    StopReason, SupervisorStrategy, SystemConfig, TellError, Terminated, Termination, TimerId,
};
pub use shardik_sharding::{
    shard_of, EntityId, EntityRef, EntityType, FencingToken, Region, RegionStats, ShardId,
    Sharding, ShardingError, ShardingExt,
};

/// The names most programs need: `use shardik::prelude::*;`.
pub mod prelude {
    pub use shardik_actor::{
        Actor, ActorError, ActorRef, ActorSystem, AskError, Context, MailboxConfig, OverflowPolicy,
        Props, ReplyTo, RestartPolicy, StopReason, SupervisorStrategy, TellError,
    };
    pub use shardik_sharding::{
        EntityRef, EntityType, ExtractingRegion, Extractor, MessageExtractor, Region, ShardingExt,
    };
}

/// The README's code blocks are compiled and run as doc tests, so the quickstart stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
