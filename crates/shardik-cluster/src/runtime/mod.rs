//! The tokio layer that runs a [`MembershipNode`](crate::node::MembershipNode) over real
//! shardik-remote connections: [`Cluster`].
//!
//! ```no_run
//! use shardik_actor::ActorSystem;
//! use shardik_cluster::runtime::{Cluster, ClusterConfig, Event};
//! use shardik_cluster::events::ClusterEvent;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let system = ActorSystem::new("orders");
//! let cluster = Cluster::start(
//!     &system,
//!     ClusterConfig::new("orders", "node-2")
//!         .bind("0.0.0.0:2552")
//!         .advertise("10.0.0.6:2552")
//!         .secret(std::fs::read("/etc/shardik/secret")?)
//!         .seed_nodes(["10.0.0.5:2552", "10.0.0.6:2552", "10.0.0.7:2552"]),
//! )
//! .await?;
//! cluster.when_up().await?;
//!
//! let mut sub = cluster.subscribe();
//! println!("members: {:?}", sub.snapshot.members);
//! while let Ok(event) = sub.recv().await {
//!     match event {
//!         Event::Cluster(ClusterEvent::MemberUp(m)) => println!("{} is up", m.node),
//!         Event::Cluster(other) => println!("{other:?}"),
//!         Event::Stopped(why) => println!("this node stopped: {why}"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! ## What the layer does
//! [`Cluster::start`] starts the remote layer of the actor system (the cluster name is the
//! one its handshake checks, so a node of another cluster, or with another secret or
//! certificate, is refused before any message is read), registers the cluster endpoint at
//! `/system/cluster` and spawns one **driver task** that owns the node's
//! [`MembershipNode`](crate::node::MembershipNode):
//! - it feeds `Input::Tick` every [`tick_interval`](ClusterConfig::tick_interval) (100 ms) and
//!   `Input::HeartbeatTick` every [`heartbeat_interval`](ClusterConfig::heartbeat_interval)
//!   (250 ms) from tokio's clock, and every arriving cluster message, stamped with its
//!   arrival time (so the failure detector does not count the driver's own delays);
//! - it carries out the actions: gossip, join requests and heartbeats are sent with
//!   [`RemoteRef::try_tell_control`](shardik_remote::RemoteRef::try_tell_control), on the
//!   **control lane** of the connection, which the writer drains before any user message and
//!   which has its own bound, so a flood of user messages neither delays them behind the user
//!   queue nor gets them dropped by a full user lane; events are published to subscribers;
//! - on `ShutdownSelf` (this node is `Exiting`, `Down` or removed) it stops, see below.
//!
//! All cluster messages are small MessagePack values (a gossip of 10 members is a few KB).
//! A message meant for an earlier incarnation of the process at an address is dropped.
//!
//! ## Joining through seed nodes
//! Every node gets the same list of seed node addresses. Akka's rule, so that a second
//! cluster with the same name does not form by accident:
//! - the **first** seed node asks the others whether they are members (`InitJoin`, retried
//!   every [`join_retry`](ClusterConfig::join_retry)). If one answers yes, it joins that one.
//!   It forms a new cluster only when every other seed answered "not a member", or when
//!   [`seed_timeout`](ClusterConfig::seed_timeout) (5 s) passed without a yes. If the seed
//!   that said yes has not taken it in and no seed said yes again for `seed_timeout`, it
//!   asks them all afresh (that seed may have stopped right after answering);
//! - every **other** node (seed or not) asks the seeds the same way until one that is a
//!   member answers, then joins through it (the join is retried by the core until a gossip
//!   that contains this node arrives). It never forms a cluster itself;
//! - a node with **no** seed nodes other than itself forms a cluster of its own at once
//!   (single-node clusters, and tests where the first node's port is only known once it
//!   bound).
//!
//! A restarted process is a new incarnation: it joins again through the seeds, and its
//! previous incarnation is downed and removed.
//!
//! ## Stopping, and what happens to the actor system
//! The cluster layer stops when this node is `Exiting` (after [`Cluster::leave`]), `Down`
//! (the split brain resolver put it on the losing side, or an operator downed it), or no
//! longer in the membership; also on [`Cluster::shutdown`] (without leaving: the others see a
//! crash), when the actor system shuts down, or when the remote layer was shut down
//! underneath it. Stopping unregisters the endpoint, shuts the remote layer down (queued
//! messages to other nodes are dropped, remote refs fail), marks the state as stopped
//! ([`ClusterState::stopped`]) and publishes [`Event::Stopped`] as the last event.
//!
//! The **actor system keeps running** by default: local actors go on, and it is up to the
//! application (which can await [`Cluster::leave`] or watch for [`Event::Stopped`]) to shut
//! it down or restart the process, which rejoins as a new incarnation. With
//! [`ClusterConfig::stop_system_on_exit`] the system is shut down too when the node left,
//! was downed or was removed (Akka's `run-coordinated-shutdown-when-down`). A stopped node
//! cannot rejoin in the same actor system.
//!
//! ## Services built on the cluster
//! - [`Receptionist`] ([`receptionist`](self::Receptionist)): actors registered under typed
//!   [`ServiceKey`]s, found and followed from any node; each node pushes its own entries to
//!   the members, and the entries of a downed or removed node are dropped everywhere.
//! - [`ClusterSingleton`]: one instance on the oldest `Up` member (per role), handed over on
//!   leave (the old instance stops first), restarted elsewhere once its node is `Down`, and a
//!   [`SingletonProxy`] that buffers during hand-over. The placement rule is the plain
//!   function [`decide`].
//! - [`ClusterBroadcast`]: tell every `Up` member's instance of an actor at a path, or ask them
//!   all and get one reply per member plus the members that did not answer.
//!
//! ## Defaults and tuning
//! See the crate docs and `docs/cluster.md`: a crashed node is suspected about 2-2.5 s after
//! its last heartbeat and downed by keep-majority after 2 s more of stable membership, so it
//! is `Down` on the survivors in about 4.5 s and removed shortly after.
mod broadcast;
mod cluster;
mod config;
mod driver;
mod inbox;
mod metrics;
mod receptionist;
mod singleton;
mod singleton_view;
mod wire;

pub use broadcast::{BroadcastReplies, ClusterBroadcast};
pub use receptionist::{Listing, ListingSubscription, Receptionist, ServiceKey, ServiceRef};
pub use singleton::{
    decide, oldest_up, ClusterSingleton, SingletonDecision, SingletonError, SingletonProxy,
    SingletonSettings,
};

pub use cluster::{
    Cluster, ClusterError, ClusterState, ClusterStats, Event, NodeStopReason, Subscription,
};
pub use config::{ClusterConfig, ConfigError};
pub use wire::PATH;
