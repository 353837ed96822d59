//! The cluster's metrics (through the `metrics` crate): gauges of the membership as this node
//! sees it, set whenever it changes, and a counter of membership events. Every series carries
//! the node id as `node`, so several nodes in one process (tests, examples) keep apart.
//! The list, with what to alert on, is in `docs/observability.md`.

use crate::events::ClusterEvent;
use crate::member::MemberStatus;

use super::cluster::{ClusterState, Event};

/// Every status a member in a state can have, with its label value. Not `Removed`: removed
/// members are gone from the state (`shardik_cluster_member_events_total{event="removed"}`
/// counts them).
const STATUSES: [(MemberStatus, &str); 6] = [
    (MemberStatus::Joining, "joining"),
    (MemberStatus::WeaklyUp, "weakly_up"),
    (MemberStatus::Up, "up"),
    (MemberStatus::Leaving, "leaving"),
    (MemberStatus::Exiting, "exiting"),
    (MemberStatus::Down, "down"),
];

/// Records what this node publishes: `state` (the view after `events`) and `events`.
pub(super) fn record(node: &str, state: &ClusterState, events: &[Event]) {
    for (status, label) in STATUSES {
        let count = state.members.iter().filter(|m| m.status == status).count();
        metrics::gauge!("shardik_cluster_members", "node" => node.to_string(), "status" => label)
            .set(count as f64);
    }
    metrics::gauge!("shardik_cluster_unreachable_members", "node" => node.to_string())
        .set(state.unreachable.len() as f64);
    let leader = state.leader.as_ref() == Some(&state.self_node);
    metrics::gauge!("shardik_cluster_is_leader", "node" => node.to_string())
        .set(f64::from(u8::from(leader)));
    metrics::gauge!("shardik_cluster_fenced", "node" => node.to_string())
        .set(f64::from(u8::from(state.fenced)));
    for event in events {
        metrics::counter!(
            "shardik_cluster_member_events_total",
            "node" => node.to_string(),
            "event" => event_label(event)
        )
        .increment(1);
    }
}

/// The `event` label of a published event.
fn event_label(event: &Event) -> &'static str {
    match event {
        Event::Cluster(e) => match e {
            ClusterEvent::MemberJoined(_) => "joined",
            ClusterEvent::MemberWeaklyUp(_) => "weakly_up",
            ClusterEvent::MemberUp(_) => "up",
            ClusterEvent::MemberLeft(_) => "left",
            ClusterEvent::MemberExited(_) => "exited",
            ClusterEvent::MemberDowned(_) => "downed",
            ClusterEvent::MemberRemoved { .. } => "removed",
            ClusterEvent::Unreachable(_) => "unreachable",
            ClusterEvent::Reachable(_) => "reachable",
            ClusterEvent::LeaderChanged(_) => "leader_changed",
            ClusterEvent::Fenced => "fenced",
            ClusterEvent::Unfenced => "unfenced",
        },
        Event::Stopped(_) => "stopped",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::member::Member;

    /// A metric's name, labels and value.
    type Sample = (String, Vec<(String, String)>, DebugValue);
    use crate::member::UniqueAddress;

    fn member(port: u16, status: MemberStatus) -> Member {
        let mut m = Member::joining(
            UniqueAddress::new(format!("127.0.0.1:{port}"), format!("n{port}"), 1),
            BTreeSet::new(),
        );
        m.status = status;
        m
    }

    /// The gauges are the view's counts, every status is set (zero included), and each
    /// event counts once under its label.
    #[test]
    fn the_gauges_follow_the_view_and_events_are_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let a = member(1, MemberStatus::Up);
        let b = member(2, MemberStatus::Up);
        let c = member(3, MemberStatus::Leaving);
        let state = ClusterState {
            self_node: a.node.clone(),
            members: vec![a.clone(), b.clone(), c],
            unreachable: BTreeSet::from([b.node.clone()]),
            leader: Some(a.node.clone()),
            fenced: false,
            stopped: None,
        };
        let events = [
            Event::Cluster(ClusterEvent::Unreachable(b.node.clone())),
            Event::Cluster(ClusterEvent::MemberLeft(member(3, MemberStatus::Leaving))),
            Event::Cluster(ClusterEvent::Unreachable(b.node.clone())),
        ];
        metrics::with_local_recorder(&recorder, || record("n1", &state, &events));
        let values: Vec<Sample> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, v)| {
                let key = k.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_string(), l.value().to_string()))
                    .collect();
                (key.name().to_string(), labels, v)
            })
            .collect();
        let get = |name: &str, label: Option<(&str, &str)>| {
            values
                .iter()
                .filter(|(n, labels, _)| {
                    n == name
                        && labels.contains(&("node".into(), "n1".into()))
                        && label.is_none_or(|(k, v)| labels.contains(&(k.into(), v.into())))
                })
                .map(|(_, _, v)| match v {
                    DebugValue::Counter(n) => *n as f64,
                    DebugValue::Gauge(g) => g.into_inner(),
                    DebugValue::Histogram(_) => panic!("{name} is a histogram"),
                })
                .collect::<Vec<f64>>()
        };
        assert_eq!(
            get("shardik_cluster_members", Some(("status", "up"))),
            [2.0]
        );
        assert_eq!(
            get("shardik_cluster_members", Some(("status", "leaving"))),
            [1.0]
        );
        assert_eq!(
            get("shardik_cluster_members", Some(("status", "down"))),
            [0.0]
        );
        assert_eq!(get("shardik_cluster_members", None).len(), STATUSES.len());
        assert_eq!(
            get("shardik_cluster_members", Some(("status", "removed"))),
            [] as [f64; 0],
            "removed members are never in a state"
        );
        assert_eq!(get("shardik_cluster_unreachable_members", None), [1.0]);
        assert_eq!(get("shardik_cluster_is_leader", None), [1.0]);
        assert_eq!(get("shardik_cluster_fenced", None), [0.0]);
        assert_eq!(
            get(
                "shardik_cluster_member_events_total",
                Some(("event", "unreachable"))
            ),
            [2.0]
        );
        assert_eq!(
            get(
                "shardik_cluster_member_events_total",
                Some(("event", "left"))
            ),
            [1.0]
        );
    }
}
