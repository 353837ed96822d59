//! Cluster broadcast across three nodes over real TCP: a tell reaches every member's
//! instance, an ask collects one reply per member, and a crashed member (still `Up`, not yet
//! downed) is reported as missing.

mod netutil;

use std::time::Duration;

use netutil::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, AskError, Context, ReplyTo};
use shardik_cluster::member::MemberStatus;
use shardik_cluster::runtime::ClusterBroadcast;

#[derive(Serialize, Deserialize)]
enum Msg {
    Note(String),
    /// The node's id and the notes it got.
    Notes(ReplyTo<(String, Vec<String>)>),
}

struct Notebook {
    node: String,
    notes: Vec<String>,
}

impl Actor for Notebook {
    type Msg = Msg;
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Note(n) => self.notes.push(n),
            Msg::Notes(reply) => reply.reply((self.node.clone(), self.notes.clone())),
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tell_and_ask_every_member_and_report_the_missing() {
    let (nodes, _) = cluster_of(3, None).await;
    let casts: Vec<ClusterBroadcast<Msg>> = nodes
        .iter()
        .map(|n| {
            let a = n.system.spawn(Notebook {
                node: n.id().node_id.clone(),
                notes: Vec::new(),
            });
            ClusterBroadcast::register(&n.cluster, "/user/notebook", a)
        })
        .collect();

    // A tell from n1 reaches all three; an ask from n1 afterwards sees it on each (one
    // sender's messages to one actor keep their order).
    let sent = casts[1].tell_with(|| Msg::Note("hello".into()));
    assert_eq!(sent.len(), 3);
    let r = casts[1].ask(Msg::Notes, Duration::from_secs(5)).await;
    assert!(r.missing.is_empty(), "{:?}", r.missing);
    let mut got: Vec<_> = r
        .replies
        .iter()
        .map(|(node, (id, notes))| {
            assert_eq!(node.node_id, *id);
            (id.clone(), notes.clone())
        })
        .collect();
    got.sort();
    let want: Vec<_> = ["n0", "n1", "n2"]
        .iter()
        .map(|n| (n.to_string(), vec!["hello".to_string()]))
        .collect();
    assert_eq!(got, want);

    // A node without a local instance of its own reports itself missing.
    let remote_only = ClusterBroadcast::<Msg>::new(&nodes[0].cluster, "/user/notebook");
    let r = remote_only.ask(Msg::Notes, Duration::from_secs(5)).await;
    assert_eq!(r.replies.len(), 2);
    assert_eq!(r.missing.len(), 1);
    assert_eq!(r.missing[0].0, *nodes[0].id());

    // n2 crashes. It is still Up (its failure is not detected yet), so it is asked and
    // reported missing; the others answer.
    let dead = nodes[2].id().clone();
    nodes[2].cluster.remote().shutdown().await;
    assert_eq!(status(&nodes[0].cluster, &dead), Some(MemberStatus::Up));
    let r = casts[0].ask(Msg::Notes, Duration::from_millis(500)).await;
    let answered: Vec<_> = r.replies.iter().map(|(n, _)| n.node_id.clone()).collect();
    assert_eq!(answered, sorted(&nodes[..2]));
    assert_eq!(r.missing.len(), 1, "{:?}", r.missing);
    assert_eq!(r.missing[0].0, dead);
    assert!(
        matches!(
            r.missing[0].1,
            AskError::Timeout(_) | AskError::Undeliverable(_)
        ),
        "{:?}",
        r.missing[0].1
    );
    // Once it is Down, broadcasts no longer include it.
    wait(&nodes[0].cluster, "n2 down", Duration::from_secs(10), |s| {
        s.member(&dead)
            .is_none_or(|m| m.status == MemberStatus::Down)
    })
    .await;
    let r = casts[0].ask(Msg::Notes, Duration::from_secs(5)).await;
    assert_eq!(r.replies.len(), 2);
    assert!(r.missing.is_empty(), "{:?}", r.missing);
    stop_all(&nodes).await;
}

/// The node ids of `nodes`, in address order (the order of the replies).
fn sorted(nodes: &[Node]) -> Vec<String> {
    let mut ids: Vec<_> = nodes.iter().map(|n| n.id().clone()).collect();
    ids.sort();
    ids.into_iter().map(|n| n.node_id).collect()
}

/// A member whose request could not be built (its `make` panicked in the ask's task) is
/// reported missing, not left out of both lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_request_panicked_is_reported_missing() {
    let (nodes, _) = cluster_of(2, None).await;
    let a = nodes[1].system.spawn(Notebook {
        node: "n1".into(),
        notes: Vec::new(),
    });
    let on_n1 = ClusterBroadcast::register(&nodes[1].cluster, "/user/notebook", a);
    // n0 has no instance: its own entry is missing for that; n1's request panics.
    let from_n0: ClusterBroadcast<Msg> = ClusterBroadcast::new(&nodes[0].cluster, "/user/notebook");
    let r = ask_panicking(&from_n0).await;
    assert!(r.replies.is_empty());
    let missing: Vec<(&str, &AskError)> = r
        .missing
        .iter()
        .map(|(n, e)| (n.node_id.as_str(), e))
        .collect();
    assert_eq!(
        missing.len(),
        2,
        "both members are accounted for: {missing:?}"
    );
    assert!(
        missing
            .iter()
            .any(|m| matches!(m, ("n1", AskError::Undeliverable(why)) if why.contains("panicked"))),
        "{missing:?}"
    );
    // From n1, whose own instance's request is built on the caller: both reported too.
    let r = ask_panicking(&on_n1).await;
    assert!(r.replies.is_empty());
    assert_eq!(r.missing.len(), 2, "{:?}", r.missing);
    let panicked =
        |e: &AskError| matches!(e, AskError::Undeliverable(why) if why.contains("panicked"));
    assert!(
        r.missing.iter().all(|(_, e)| panicked(e)),
        "{:?}",
        r.missing
    );
    stop_all(&nodes).await;
}

/// Asks with a request whose building panics.
async fn ask_panicking(
    cast: &ClusterBroadcast<Msg>,
) -> shardik_cluster::runtime::BroadcastReplies<(String, Vec<String>)> {
    cast.ask(
        |_reply: ReplyTo<(String, Vec<String>)>| -> Msg { panic!("no request today") },
        Duration::from_secs(5),
    )
    .await
}

/// Keeps every request's reply handle without answering.
struct Mute {
    held: Vec<ReplyTo<(String, Vec<String>)>>,
}

impl Actor for Mute {
    type Msg = Msg;
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        if let Msg::Notes(reply) = msg {
            self.held.push(reply);
        }
        Ok(())
    }
}

/// The local instance's ask timing out is counted in `shardik_ask_timeouts_total`, as the
/// members' are (`via="remote_ref"`), under `via="actor_ref"`. On a single-threaded runtime
/// inside a thread-local recorder, so that only this test's metrics are seen.
#[test]
fn a_local_instance_that_does_not_answer_in_time_counts_as_an_ask_timeout() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let timeouts = || -> f64 {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, _, _, _)| {
                k.key().name() == "shardik_ask_timeouts_total"
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "via" && l.value() == "actor_ref")
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => n as f64,
                other => panic!("{other:?}"),
            })
            .sum()
    };
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let node = start(config("n0")).await;
            node.cluster.when_up().await.unwrap();
            let mute = node.system.spawn(Mute { held: Vec::new() });
            let cast = ClusterBroadcast::register(&node.cluster, "/user/mute", mute);
            let r = cast.ask(Msg::Notes, Duration::from_millis(50)).await;
            assert!(r.replies.is_empty());
            assert_eq!(r.missing.len(), 1, "{:?}", r.missing);
            assert_eq!(r.missing[0].1, AskError::Timeout(Duration::from_millis(50)));
            stop_all(std::slice::from_ref(&node)).await;
        });
    });
    assert_eq!(timeouts(), 1.0);
}
