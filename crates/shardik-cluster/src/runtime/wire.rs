//! The messages cluster nodes exchange, as one MessagePack type sent to [`PATH`] on the
//! remote control lane.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::gossip::Gossip;
use crate::member::UniqueAddress;

/// Where every node registers its cluster endpoint.
pub const PATH: &str = "/system/cluster";

/// One cluster message: who sent it, which incarnation it is for (if the sender knows), and
/// what.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct WireMsg {
    pub(crate) from: UniqueAddress,
    /// The recipient's incarnation; a message for an earlier incarnation of the process now
    /// at that address is dropped.
    pub(crate) to: Option<u64>,
    pub(crate) body: Body,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Body {
    /// The sender's membership state.
    Gossip(Box<Gossip>),
    /// The sender is alive (to the nodes that monitor it).
    Heartbeat,
    /// The sender monitors the recipient: please send it heartbeats (renewed on every
    /// heartbeat tick), whatever the recipient's view of the ring. `joining`: the sender is
    /// `Joining` or `WeaklyUp` in its own view.
    Watch { joining: bool },
    /// Please add the sender as a joining member.
    Join { roles: BTreeSet<String> },
    /// The sender, a member in its own view that the recipient has not seen, asks to be
    /// taken in (`Input::JoinReminder`). A variant of its own, not a flag on `Join`: a node
    /// from before 2026-11-29 cannot decode it and drops it, instead of taking it as a join
    /// request, which may take the place of a live member.
    JoinReminder { roles: BTreeSet<String> },
    /// Are you a member of a cluster? (seed node discovery)
    InitJoin,
    /// Yes: join through me.
    InitJoinAck,
    /// No, not (yet) a member.
    InitJoinNack,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::leader_actions;

    #[test]
    fn gossip_round_trips_through_named_messagepack() {
        let a = UniqueAddress::new("127.0.0.1:1", "a", 7);
        let b = UniqueAddress::new("127.0.0.1:2", "b", 8);
        let mut g = Gossip::new();
        g.add_joining(a.clone(), BTreeSet::from(["x".to_string()]))
            .unwrap();
        g.add_joining(b.clone(), BTreeSet::new()).unwrap();
        leader_actions(&mut g, &a, false);
        g.reachability_mut().unreachable(&a, &b);
        g.touch(&a);
        let msg = WireMsg {
            from: a.clone(),
            to: Some(8),
            body: Body::Gossip(Box::new(g.clone())),
        };
        let bytes = rmp_serde::to_vec_named(&msg).unwrap();
        let back: WireMsg = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back.from, a);
        assert_eq!(back.to, Some(8));
        match back.body {
            Body::Gossip(h) => assert_eq!(*h, g),
            other => panic!("{other:?}"),
        }
    }
}
