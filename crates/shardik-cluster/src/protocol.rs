//! What goes into a [`MembershipNode`](crate::node::MembershipNode) and what comes out.

use std::collections::BTreeSet;

use crate::events::ClusterEvent;
use crate::gossip::Gossip;
use crate::member::UniqueAddress;

/// An input to the membership state machine. Instants are milliseconds since a fixed epoch.
#[derive(Clone, Debug)]
pub enum Input {
    /// A gossip arrived from a node.
    Gossip(UniqueAddress, Box<Gossip>),
    /// Time to send heartbeats (every heartbeat interval).
    HeartbeatTick(u64),
    /// A heartbeat arrived from a node at the given instant.
    HeartbeatFrom(UniqueAddress, u64),
    /// A node that monitors this one asked for its heartbeats (it asks on every heartbeat
    /// tick; see [`Action::SendWatch`]).
    WatchFrom {
        /// The node that asks.
        from: UniqueAddress,
        /// It is `Joining` or `WeaklyUp` in its own view (a joiner that this node may not
        /// know of yet).
        joining: bool,
        /// When the request arrived.
        at: u64,
    },
    /// A join request arrived from a node, with its roles. Sent to itself, it forms a new
    /// cluster.
    Join(UniqueAddress, BTreeSet<String>),
    /// A join reminder arrived from a node, with its roles: a joiner that is a member in its
    /// own view asks this node, which has not seen its state, to take it in (see
    /// [`Action::SendJoinReminder`]). Taken like a join request, except never in place of a
    /// live member with the joiner's address or node id: a reminder may come from a process
    /// that has been running (and paused) for long, not one that just started.
    JoinReminder(UniqueAddress, BTreeSet<String>),
    /// Join an existing cluster through these seed addresses: a join request goes to every
    /// seed other than this node, again every `join_retry` on `Tick`, until a gossip that
    /// contains this node arrives. If this node is the first of the list, it forms a new
    /// cluster once `seed_node_timeout` has passed without such an answer (at once if it is
    /// the only seed); any other node never forms one.
    JoinSeeds(Vec<String>),
    /// Leave the cluster gracefully.
    Leave,
    /// Operator decision: mark a node `Down`.
    Down(UniqueAddress),
    /// Periodic tick: gossip, reachability, leader actions, downing.
    Tick(u64),
}

/// Something the IO layer must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Send the gossip to a node.
    SendGossip(UniqueAddress, Box<Gossip>),
    /// Send a heartbeat to a node (on the control lane).
    SendHeartbeat(UniqueAddress),
    /// Ask a node this one monitors to send it heartbeats (on the control lane). Heartbeats
    /// go to the watchers in the sender's view of the ring; while the two views differ (a
    /// joiner right after its welcome, a ring that shifted), the request keeps them coming.
    SendWatch {
        /// The peer watched.
        to: UniqueAddress,
        /// This node is `Joining` or `WeaklyUp` in its own view.
        joining: bool,
    },
    /// Send a join request with this node's roles to the node at an address.
    SendJoin(String),
    /// Send a join reminder with this node's roles to a member, for its incarnation only (a
    /// process restarted at its address drops it): this node, `Joining` or `WeaklyUp` in its
    /// own view, has not been seen by that member.
    SendJoinReminder(UniqueAddress),
    /// Publish an event to subscribers.
    Event(ClusterEvent),
    /// This node is `Down`, `Exiting` or removed: stop the process (or the cluster part).
    ShutdownSelf,
}
