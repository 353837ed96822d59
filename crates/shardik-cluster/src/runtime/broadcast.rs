//! [`ClusterBroadcast`]: tell every `Up` member's instance of an actor registered at a path,
//! or ask them all and collect one reply per member (Casty's cluster broadcast).
//!
//! ```no_run
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use shardik_actor::{ActorRef, ReplyTo};
//! use shardik_cluster::runtime::{Cluster, ClusterBroadcast};
//!
//! #[derive(Serialize, Deserialize)]
//! enum CacheMsg {
//!     Invalidate(String),
//!     Size(ReplyTo<usize>),
//! }
//!
//! # async fn run(cluster: Cluster, cache: ActorRef<CacheMsg>) {
//! // On every node: the node's instance, registered at the same path.
//! let caches = ClusterBroadcast::register(&cluster, "/user/cache", cache);
//!
//! caches.tell_with(|| CacheMsg::Invalidate("user:42".into()));
//! let sizes = caches.ask(CacheMsg::Size, Duration::from_secs(1)).await;
//! for (node, size) in &sizes.replies {
//!     println!("{}: {size}", node.node_id);
//! }
//! for (node, why) in &sizes.missing {
//!     println!("{} did not answer: {why}", node.node_id);
//! }
//! # }
//! ```
//!
//! The members are the ones `Up` in this node's view when the call is made
//! ([`ClusterState::with_status`](super::ClusterState::with_status)). This node's own
//! instance is reached directly (no network) when it was given to
//! [`register`](ClusterBroadcast::register); a broadcast made with
//! [`new`](ClusterBroadcast::new) on a node that has no instance reports that node as
//! missing in an [`ask`](ClusterBroadcast::ask). Delivery to each member is at most once, like
//! every remote tell. A member that crashed but is not yet `Down` is still `Up`: a tell to it
//! is lost and an ask reports it missing (timeout, or undeliverable if its connection is
//! known to be gone). Every member asked is in the replies or among the missing, also when
//! building its request panicked. Members are addressed by address: a process restarted on
//! a crashed member's address before this node hears of its join answers for the crashed
//! incarnation (its instance is registered at the same path).

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use shardik_actor::{ActorRef, AskError, ReplyTo};
use tokio::task::JoinSet;

use super::cluster::Cluster;
use crate::member::{MemberStatus, UniqueAddress};

/// A broadcast to the instances of an actor registered at one path on every member.
pub struct ClusterBroadcast<M> {
    cluster: Cluster,
    path: String,
    local: Option<ActorRef<M>>,
}

impl<M> Clone for ClusterBroadcast<M> {
    fn clone(&self) -> Self {
        ClusterBroadcast {
            cluster: self.cluster.clone(),
            path: self.path.clone(),
            local: self.local.clone(),
        }
    }
}

impl<M> fmt::Debug for ClusterBroadcast<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterBroadcast")
            .field("path", &self.path)
            .field("local", &self.local.is_some())
            .finish()
    }
}

/// The answers of [`ClusterBroadcast::ask`].
#[derive(Debug)]
pub struct BroadcastReplies<R> {
    /// One reply per member that answered in time, in member address order.
    pub replies: Vec<(UniqueAddress, R)>,
    /// The members that did not answer, and why (timeout, undeliverable, no local instance).
    pub missing: Vec<(UniqueAddress, AskError)>,
}

impl<M> ClusterBroadcast<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// A broadcast to the actors registered at `path` (with
    /// [`Remote::register`](shardik_remote::Remote::register)) on the members; this node
    /// takes part only if it has an instance reachable through the network layer, which it
    /// does not: use [`register`](Self::register) on nodes that have one.
    pub fn new(cluster: &Cluster, path: impl Into<String>) -> Self {
        ClusterBroadcast {
            cluster: cluster.clone(),
            path: path.into(),
            local: None,
        }
    }

    /// Registers `actor` as this node's instance at `path` (reachable from the other nodes),
    /// and returns a broadcast to the instances at `path` on every member, this one included.
    pub fn register(cluster: &Cluster, path: impl Into<String>, actor: ActorRef<M>) -> Self {
        let path = path.into();
        cluster.remote().register(&path, actor.clone());
        ClusterBroadcast {
            cluster: cluster.clone(),
            path,
            local: Some(actor),
        }
    }

    /// The path of the instances.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The members a broadcast goes to now: the `Up` members in this node's view.
    pub fn members(&self) -> Vec<UniqueAddress> {
        self.cluster
            .state()
            .with_status(MemberStatus::Up)
            .map(|m| m.node.clone())
            .collect()
    }

    /// Sends a copy of `msg` to every `Up` member's instance without waiting; returns the
    /// members it was sent to (this node only if it has a local instance).
    pub fn tell(&self, msg: M) -> Vec<UniqueAddress>
    where
        M: Clone,
    {
        self.tell_with(|| msg.clone())
    }

    /// [`tell`](Self::tell) for message types that are not `Clone` (an enum with a
    /// [`ReplyTo`] variant): `make` builds one message per member.
    pub fn tell_with(&self, make: impl Fn() -> M) -> Vec<UniqueAddress> {
        let self_node = self.cluster.self_node();
        let mut sent = Vec::new();
        for node in self.members() {
            if &node == self_node {
                match &self.local {
                    Some(a) => a.tell(make()),
                    None => continue,
                }
            } else {
                self.cluster
                    .remote()
                    .lookup::<M>(&self.path, &node.address)
                    .tell(make());
            }
            sent.push(node);
        }
        sent
    }

    /// Asks every `Up` member's instance with a request built by `make` around a fresh
    /// [`ReplyTo`] (an enum variant like `Msg::Size` or a `move` closure), concurrently, and waits up to `timeout` for all of them. Returns the
    /// replies and the members that did not answer, with why.
    pub async fn ask<R, F>(&self, make: F, timeout: Duration) -> BroadcastReplies<R>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
        F: Fn(ReplyTo<R>) -> M + Clone + Send + 'static,
    {
        let self_node = self.cluster.self_node().clone();
        let mut tasks = JoinSet::new();
        // Whom each task asks: a task that fails (the request's `make` panicked on it, or the
        // runtime is shutting down) still reports its member missing.
        let mut asked = std::collections::HashMap::new();
        let mut missing = Vec::new();
        for node in self.members() {
            if node == self_node {
                let Some(a) = &self.local else {
                    missing.push((
                        node,
                        AskError::Undeliverable("no local instance on this node".into()),
                    ));
                    continue;
                };
                let (reply_to, rx) = ReplyTo::channel();
                // Built here, on the caller; a panic in it reports this member missing, as
                // for the others (their requests are built in their tasks).
                let built =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| make(reply_to)));
                let Ok(request) = built else {
                    let why = "building or sending the request panicked";
                    missing.push((node, AskError::Undeliverable(why.into())));
                    continue;
                };
                if let Err(e) = a.try_tell(request) {
                    missing.push((node, AskError::from(e)));
                    continue;
                }
                let task = tasks.spawn(async move {
                    match tokio::time::timeout(timeout, rx).await {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(_)) => Err(AskError::NoReply),
                        Err(_) => {
                            // As an ask of the local instance through its `ActorRef` would
                            // (the members' asks count as `remote_ref`).
                            metrics::counter!("shardik_ask_timeouts_total", "via" => "actor_ref")
                                .increment(1);
                            Err(AskError::Timeout(timeout))
                        }
                    }
                });
                asked.insert(task.id(), node);
            } else {
                let to = self.cluster.remote().lookup::<M>(&self.path, &node.address);
                let make = make.clone();
                let task = tasks.spawn(async move { to.ask(make, timeout).await });
                asked.insert(task.id(), node);
            }
        }
        let mut replies = Vec::new();
        while let Some(res) = tasks.join_next_with_id().await {
            let (id, r) = match res {
                Ok((id, r)) => (id, r),
                Err(e) => {
                    let why = if e.is_panic() {
                        "building or sending the request panicked"
                    } else {
                        "the ask was cancelled (the runtime is shutting down)"
                    };
                    (e.id(), Err(AskError::Undeliverable(why.into())))
                }
            };
            let node = asked.remove(&id).expect("every task asks one member");
            match r {
                Ok(v) => replies.push((node, v)),
                Err(e) => missing.push((node, e)),
            }
        }
        replies.sort_by(|a, b| a.0.cmp(&b.0));
        missing.sort_by(|a, b| a.0.cmp(&b.0));
        BroadcastReplies { replies, missing }
    }
}
