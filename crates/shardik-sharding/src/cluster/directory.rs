//! The type directory: which node started which entity type, and whether it hosts it or only
//! routes to it (proxy). The coordinator of a type runs on the oldest `Up` member among the
//! nodes that host it, so every node must know who hosts what.
//!
//! Like the cluster receptionist, each node **owns its own entry**: the set of types it
//! started, with a version that grows on every change. It pushes that set to every other
//! member on the control lane at once after a change, after every membership event, and every
//! [`PUSH_INTERVAL`] as anti-entropy. A receiver keeps, per origin node (address, node id and
//! incarnation), the set of the highest version seen; there is no merge, each origin's set is
//! replaced as a whole. Entries of members that are `Down` or removed are dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::{Cluster, ClusterState, Event};
use shardik_remote::RemoteRef;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::Notify;

use super::wire::decoder;

/// The directory endpoint, one per node for all entity types.
pub(crate) const DIRECTORY_PATH: &str = "/system/sharding/directory";

/// How often each node pushes its set even without a change (to the members it heard from).
pub(crate) const PUSH_INTERVAL: Duration = Duration::from_millis(500);

/// How often a member that never pushed its own set is pushed to (it may not run cluster
/// sharding yet; its first push makes every receiver push back at once).
pub(crate) const UNHEARD_PUSH_INTERVAL: Duration = Duration::from_secs(5);

/// How long after a member is first seen a node pushes to it without having heard from it.
pub(crate) const UNHEARD_FIRST_PUSH: Duration = Duration::from_secs(1);

/// How long a member that never pushed a set counts as "unknown" (the coordinator choice
/// waits for it); after that it counts as hosting nothing (it does not run cluster sharding).
pub(crate) const UNKNOWN_GRACE: Duration = Duration::from_secs(3);

/// How long the set of a node that is not a member (not yet, or not any more) is kept after
/// its last push: a joining node pushes before this node's view lists it (and pushes again
/// every [`PUSH_INTERVAL`]), while one that left, or any sender that never joins, is
/// forgotten.
pub(crate) const NON_MEMBER_GRACE: Duration = Duration::from_secs(30);

/// What a node says about one entity type it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TypeAd {
    /// Proxy-only: routes, never hosts (or started with a role the node does not have).
    pub(crate) proxy: bool,
    /// The shard count it was started with.
    pub(crate) shard_count: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct DirectoryWire {
    from: UniqueAddress,
    version: u64,
    types: BTreeMap<String, TypeAd>,
}

#[derive(Default)]
struct Inner {
    version: u64,
    local: BTreeMap<String, TypeAd>,
    remote: HashMap<UniqueAddress, (u64, BTreeMap<String, TypeAd>)>,
    /// When each origin in `remote` last pushed (for [`NON_MEMBER_GRACE`]).
    heard: HashMap<UniqueAddress, Instant>,
    refs: HashMap<String, RemoteRef<DirectoryWire>>,
    /// When each member was first seen (for [`UNKNOWN_GRACE`]).
    first_seen: HashMap<UniqueAddress, Instant>,
    /// When each member that never pushed was last pushed to.
    unheard_push: HashMap<UniqueAddress, Instant>,
    /// Push to every member with the next push, also those never heard from (set when this
    /// node starts its directory or changes its set).
    force_all: bool,
}

/// This node's view of who started which type.
pub(crate) struct Directory {
    cluster: Cluster,
    inner: Mutex<Inner>,
    push: Notify,
}

impl Directory {
    /// Starts the directory of `cluster`'s node: registers its endpoint, spawns its push task.
    pub(crate) fn start(cluster: &Cluster) -> Arc<Directory> {
        let dir = Arc::new(Directory {
            cluster: cluster.clone(),
            inner: Mutex::new(Inner {
                version: 1,
                force_all: true,
                ..Inner::default()
            }),
            push: Notify::new(),
        });
        let d = dir.clone();
        cluster.remote().register_decoder(
            DIRECTORY_PATH,
            decoder(move |w: DirectoryWire| d.receive(w)),
        );
        let d = Arc::downgrade(&dir);
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let system = cluster.remote().system().clone();
            let mut sub = cluster.subscribe();
            let mut tick = tokio::time::interval(PUSH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let Some(dir) = d.upgrade() else { break };
                let notified = dir.push.notified();
                tokio::select! {
                    _ = system.shutdown_started() => break,
                    _ = tick.tick() => {}
                    _ = notified => {}
                    ev = sub.recv() => match ev {
                        Ok(Event::Stopped(_)) | Err(RecvError::Closed) => break,
                        Ok(Event::Cluster(_)) | Err(RecvError::Lagged(_)) => {}
                    },
                }
                dir.push_all();
            }
        });
        dir
    }

    /// Announces that this node started `type_name` (hosting it unless `ad.proxy`).
    pub(crate) fn announce(&self, type_name: &str, ad: TypeAd) {
        {
            let mut inner = self.inner.lock();
            inner.local.insert(type_name.to_string(), ad);
            inner.version += 1;
            inner.force_all = true;
        }
        self.push.notify_one();
    }

    /// Whether `node` started `type_name` as a hosting (not proxy) node, as far as this node
    /// knows (its own entry for itself, the latest pushed set for the others). `None` while
    /// `node` never pushed its set and was first seen less than [`UNKNOWN_GRACE`] ago.
    pub(crate) fn hosts(&self, node: &UniqueAddress, type_name: &str) -> Option<bool> {
        let mut inner = self.inner.lock();
        let types = if node == self.cluster.self_node() {
            Some(&inner.local)
        } else {
            inner.remote.get(node).map(|(_, t)| t)
        };
        match types {
            Some(t) => Some(t.get(type_name).is_some_and(|ad| !ad.proxy)),
            None => {
                let seen = *inner
                    .first_seen
                    .entry(node.clone())
                    .or_insert_with(Instant::now);
                (seen.elapsed() >= UNKNOWN_GRACE).then_some(false)
            }
        }
    }

    fn receive(&self, w: DirectoryWire) {
        let state = self.cluster.state();
        if state
            .member(&w.from)
            .is_some_and(|m| matches!(m.status, MemberStatus::Down | MemberStatus::Removed))
        {
            return;
        }
        let mut inner = self.inner.lock();
        inner.heard.insert(w.from.clone(), Instant::now());
        let first = !inner.remote.contains_key(&w.from);
        let newer = inner
            .remote
            .get(&w.from)
            .is_none_or(|(v, _)| w.version > *v);
        if newer {
            inner.remote.insert(w.from, (w.version, w.types));
        }
        drop(inner);
        if first {
            // A node heard from for the first time: send it this node's set at once.
            self.push.notify_one();
        }
    }

    fn push_all(&self) {
        let state = self.cluster.state();
        let me = self.cluster.self_node().clone();
        let mut inner = self.inner.lock();
        prune(&mut inner, &state, Instant::now());
        let msg = DirectoryWire {
            from: me.clone(),
            version: inner.version,
            types: inner.local.clone(),
        };
        let now = Instant::now();
        let force_all = std::mem::take(&mut inner.force_all);
        for m in &state.members {
            if m.node == me || matches!(m.status, MemberStatus::Down | MemberStatus::Removed) {
                continue;
            }
            let seen = *inner.first_seen.entry(m.node.clone()).or_insert(now);
            if !force_all && !inner.remote.contains_key(&m.node) {
                // A member never heard from may not run cluster sharding yet (a new member
                // starts it once it is up, then pushes to everyone and is answered at once):
                // push to it only after a second, then every few seconds.
                let due = now.duration_since(seen) >= UNHEARD_FIRST_PUSH
                    && inner
                        .unheard_push
                        .get(&m.node)
                        .is_none_or(|t| now.duration_since(*t) >= UNHEARD_PUSH_INTERVAL);
                if !due {
                    continue;
                }
                inner.unheard_push.insert(m.node.clone(), now);
            }
            let addr = m.node.address.clone();
            let r = inner
                .refs
                .entry(addr.clone())
                .or_insert_with(|| self.cluster.remote().lookup(DIRECTORY_PATH, &addr));
            if let Err(e) = r.try_tell_control(msg.clone()) {
                tracing::trace!(to = %addr, "sharding directory push not sent: {e}");
            }
        }
    }
}

/// Drops the sets of origins that are `Down`, removed, replaced by a newer incarnation, or
/// not members and silent for [`NON_MEMBER_GRACE`] (until 2026-11-30 a non-member's set was
/// kept for good, so every node that ever pushed, members long removed included, stayed), and
/// what is kept per member for nodes that are not members (or not live ones) any more.
fn prune(inner: &mut Inner, state: &ClusterState, now: Instant) {
    let live = |node: &UniqueAddress| {
        state
            .member(node)
            .map(|m| !matches!(m.status, MemberStatus::Down | MemberStatus::Removed))
    };
    let Inner { remote, heard, .. } = inner;
    remote.retain(|node, _| match live(node) {
        Some(live) => live,
        // Not (yet) a member: kept while it pushes, unless another incarnation of its
        // address is one.
        None => {
            !state.members.iter().any(|m| m.node.address == node.address)
                && heard
                    .get(node)
                    .is_some_and(|t| now.saturating_duration_since(*t) < NON_MEMBER_GRACE)
        }
    });
    heard.retain(|node, _| remote.contains_key(node));
    inner.first_seen.retain(|node, _| live(node) == Some(true));
    inner
        .unheard_push
        .retain(|node, _| live(node) == Some(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    use shardik_cluster::member::Member;

    fn node(n: u64) -> UniqueAddress {
        UniqueAddress::new(format!("10.0.0.{n}:7000"), format!("n{n}"), 1)
    }

    fn state(members: &[(u64, MemberStatus)]) -> ClusterState {
        let members: Vec<Member> = members
            .iter()
            .map(|(n, status)| Member {
                node: node(*n),
                status: *status,
                roles: Default::default(),
                up_number: Some(*n),
            })
            .collect();
        ClusterState {
            self_node: node(1),
            members,
            unreachable: Default::default(),
            leader: None,
            fenced: false,
            stopped: None,
        }
    }

    fn heard_from(inner: &mut Inner, n: u64, at: Instant) {
        inner.remote.insert(node(n), (1, BTreeMap::new()));
        inner.heard.insert(node(n), at);
        inner.first_seen.insert(node(n), at);
        inner.unheard_push.insert(node(n), at);
    }

    /// A member's set is kept; a non-member's only while it pushed within the grace; a
    /// member removed from the view (no longer listed) goes once its pushes stop.
    #[test]
    fn sets_of_nodes_that_are_not_members_are_dropped_after_the_grace() {
        let t0 = Instant::now();
        let mut inner = Inner::default();
        for n in 2..=4 {
            heard_from(&mut inner, n, t0);
        }
        let view = state(&[(1, MemberStatus::Up), (2, MemberStatus::Up)]);
        prune(&mut inner, &view, t0 + Duration::from_secs(1));
        let mut kept: Vec<_> = inner.remote.keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, vec![node(2), node(3), node(4)], "joining nodes kept");
        // Only members keep their first-seen and push times.
        assert_eq!(inner.first_seen.keys().collect::<Vec<_>>(), vec![&node(2)]);
        assert_eq!(
            inner.unheard_push.keys().collect::<Vec<_>>(),
            vec![&node(2)]
        );
        inner.heard.insert(node(3), t0 + NON_MEMBER_GRACE);
        prune(
            &mut inner,
            &view,
            t0 + NON_MEMBER_GRACE + Duration::from_secs(1),
        );
        let mut kept: Vec<_> = inner.remote.keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, vec![node(2), node(3)], "n4 silent past the grace");
        assert_eq!(inner.heard.len(), 2);
    }
}
