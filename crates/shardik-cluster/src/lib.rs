//! # shardik-cluster
//!
//! The sans-IO membership core of a shardik cluster: who is in the cluster, in which state,
//! who can reach whom, who leads, and which side of a partition goes on. Nothing here opens a
//! socket, spawns a task, sleeps or reads a clock; every piece is a plain value fed with
//! messages and instants (milliseconds since any fixed epoch), so all of it is tested
//! deterministically. A thin tokio layer, [`runtime`] ([`Cluster`]), carries the messages
//! over shardik-remote connections.
//!
//! | module | holds |
//! |---|---|
//! | [`vclock`] | vector clocks over (node id, incarnation) |
//! | [`member`] | [`UniqueAddress`](member::UniqueAddress), [`Member`](member::Member), the state transition table |
//! | [`reachability`] | per-observer unreachable flags, versioned per observer |
//! | [`gossip`] | the gossiped state and its monotonic merge, convergence, leader |
//! | [`leader`] | the leader's actions (up, exiting, removed, weakly-up) |
//! | [`phi`] | the phi accrual failure detector |
//! | [`ring`] | which peers each node monitors (bounded) |
//! | [`downing`] | split brain resolver decisions and the stability timer |
//! | [`events`] | cluster events as the difference of two states |
//! | [`protocol`], [`node`] | the inputs and actions of [`MembershipNode`](node::MembershipNode), the state machine that ties it together |
//! | [`runtime`] | [`Cluster`]: the tokio layer that runs a node over shardik-remote; on top of it the [`Receptionist`], the [`ClusterSingleton`] and [`ClusterBroadcast`] |
//!
//! ## Rules (Akka's, see `shared/reference/protocols.md`)
//! - A process is a `UniqueAddress` (address, node id, incarnation). A restarted process is a
//!   new incarnation: its join marks the old one `Down`, the leader removes it, and removed
//!   incarnations stay as tombstones for `prune_tombstones_after` (24 h), so no gossip,
//!   however stale, brings them back; then the leader drops them at a convergence.
//! - Member states only move forward (the table in [`member::MemberStatus::can_become`]);
//!   merges keep the later state, so `Down` and `Removed` never go back.
//! - Unreachable is a per-observer flag: one observer sets it, every observer must clear it.
//! - Convergence: every unreachable member is `Down` or `Exiting`, and every `Up`/`Leaving`
//!   member has seen the current version. The leader (first reachable `Up`/`Leaving` member by
//!   address) acts only at convergence, except for moving joiners to `WeaklyUp`.
//! - Gossip versions are merged as Akka merges them: a merge of concurrent states takes the
//!   entry-wise maximum of both clocks and authors no new entry, so nodes that merge the same
//!   states get the same state under the same version and converge.
//! - A failure detector only flags. Downing is decided by the split brain resolver on the
//!   leader of each side, after membership has been stable for `stable_after`; the losing
//!   side marks itself `Down` and every node that sees itself `Down`, `Exiting` or removed
//!   emits [`Action::ShutdownSelf`](protocol::Action::ShutdownSelf).
//! - Only the first node of the seed list may form a cluster, and only when no other seed
//!   answered its join requests within `seed_node_timeout` (`Input::JoinSeeds`); every other
//!   node only joins, so nodes sharing a seed list never form two clusters by accident.
//!
//! ## Driving the state machine
//! The IO layer owns one [`MembershipNode`](node::MembershipNode) per process and calls
//! [`handle`](node::MembershipNode::handle) with:
//! - `Input::Tick(now)` every 50-100 ms (gossip rounds, reachability, leader actions, downing);
//! - `Input::HeartbeatTick(now)` every heartbeat interval (500 ms by default);
//! - `Input::Gossip`, `Input::HeartbeatFrom`, `Input::WatchFrom`, `Input::Join` as frames
//!   arrive;
//! - `Input::JoinSeeds(seeds)` at start on every node with the same ordered seed list (or
//!   `Input::Join(self, roles)` to form a cluster right away, when the IO layer decided so
//!   itself); `Input::Leave` and `Input::Down` from the API.
//!
//! and carries out each returned action: send the gossip, heartbeat or heartbeat request
//! (heartbeats and requests on the control lane, so user traffic cannot starve them), send a
//! join request, publish the event, or stop the node.
//!
//! ```
//! use std::collections::BTreeSet;
//! use shardik_cluster::member::{MemberStatus, UniqueAddress};
//! use shardik_cluster::node::{MembershipNode, NodeConfig};
//! use shardik_cluster::protocol::{Action, Input};
//!
//! let a_id = UniqueAddress::new("10.0.0.1:7000", "a", 1);
//! let b_id = UniqueAddress::new("10.0.0.2:7000", "b", 1);
//! let mut a = MembershipNode::new(NodeConfig::new(a_id.clone()));
//! let mut b = MembershipNode::new(NodeConfig::new(b_id.clone()));
//!
//! a.handle(Input::Join(a_id.clone(), BTreeSet::new())); // a forms the cluster
//! let out = b.handle(Input::JoinSeeds(vec!["10.0.0.1:7000".into()]));
//! assert_eq!(out, vec![Action::SendJoin("10.0.0.1:7000".into())]);
//!
//! // A tiny synchronous "network": deliver every message until nothing is left.
//! let mut queue: Vec<(UniqueAddress, Action)> = a
//!     .handle(Input::Join(b_id.clone(), BTreeSet::new()))
//!     .into_iter()
//!     .map(|act| (a_id.clone(), act))
//!     .collect();
//! for now in (100..5_000).step_by(100) {
//!     for (id, node) in [(&a_id, &mut a), (&b_id, &mut b)] {
//!         let mut out = node.handle(Input::Tick(now));
//!         if now % 500 == 0 {
//!             out.extend(node.handle(Input::HeartbeatTick(now)));
//!         }
//!         queue.extend(out.into_iter().map(|act| (id.clone(), act)));
//!     }
//!     while let Some((from, action)) = queue.pop() {
//!         let (to, input) = match action {
//!             Action::SendGossip(to, g) => (to, Input::Gossip(from, g)),
//!             Action::SendHeartbeat(to) => (to, Input::HeartbeatFrom(from, now)),
//!             _ => continue,
//!         };
//!         let (id, node) = if to == a_id { (&a_id, &mut a) } else { (&b_id, &mut b) };
//!         queue.extend(node.handle(input).into_iter().map(|act| (id.clone(), act)));
//!     }
//! }
//! for node in [&a, &b] {
//!     assert_eq!(node.gossip().member(&b_id).unwrap().status, MemberStatus::Up);
//! }
//! ```
//!
//! ## Timing and tuning
//! Defaults ([`node::NodeConfig::new`]): heartbeats every 500 ms, phi threshold 8 with a
//! 1.5 s acceptable pause and 100 ms minimum standard deviation (a stopped node is flagged
//! about 2-2.5 s after its last heartbeat), keep-majority after 2 s of stability. In the
//! in-memory simulation (50 ms steps and latency) a crashed node is `Down` on every survivor
//! 4.5-4.65 s after the crash in clusters of 3 to 10 nodes, whichever node crashes and
//! whenever in the heartbeat cycle, and 20 % message loss for two minutes downs nobody
//! (`tests/crash.rs`). Akka's defaults (1 s heartbeats, 3 s pause, 20 s stable-after) take
//! about 25-45 s. Raising the acceptable pause or `stable_after` trades detection time for
//! tolerance of long pauses (GC, a saturated machine); a pause shorter than the acceptable
//! pause never flags, and a flag cleared before `stable_after` never downs.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod downing;
pub mod events;
pub mod gossip;
pub mod leader;
pub mod member;
pub mod node;
pub mod phi;
pub mod protocol;
pub mod reachability;
pub mod ring;
pub mod runtime;
pub mod vclock;

pub use runtime::{
    BroadcastReplies, Cluster, ClusterBroadcast, ClusterConfig, ClusterError, ClusterSingleton,
    ClusterState, Event, Listing, NodeStopReason, Receptionist, ServiceKey, ServiceRef,
    SingletonError, SingletonProxy, SingletonSettings,
};
