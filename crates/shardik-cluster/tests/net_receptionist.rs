//! The receptionist across three nodes over real TCP: registrations are found from other
//! nodes, subscriptions see changes, a stopped actor is dropped, and the entries of a crashed
//! node are dropped on the survivors once it is `Down`; a listing larger than a frame is
//! sent in chunks, and a node that never uses the receptionist gets no message it cannot
//! handle.

mod netutil;

use std::time::Duration;

use netutil::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use shardik_cluster::runtime::{Listing, ListingSubscription, Receptionist, ServiceKey};

#[derive(Serialize, Deserialize)]
struct Echo {
    text: String,
    reply: ReplyTo<String>,
}

struct EchoActor {
    node: String,
}

impl Actor for EchoActor {
    type Msg = Echo;
    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        msg.reply.reply(format!("{}:{}", self.node, msg.text));
        Ok(())
    }
}

/// Another message type, to check that a key name reused with another type finds nothing.
#[derive(Serialize, Deserialize)]
struct Other(u32);

async fn next_matching<M>(
    sub: &mut ListingSubscription<M>,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Listing<M>) -> bool,
) -> Listing<M>
where
    M: Serialize + Send + 'static,
{
    let wait = async {
        loop {
            let l = sub.recv().await.expect("receptionist running");
            if pred(&l) {
                return l;
            }
        }
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(l) => l,
        Err(_) => panic!("{what}: not within {timeout:?}"),
    }
}

fn node_ids<M>(l: &Listing<M>) -> Vec<String>
where
    M: Serialize + Send + 'static,
{
    let mut v: Vec<String> = l.refs().iter().map(|r| r.node().node_id.clone()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_are_found_followed_and_dropped_across_nodes() {
    let (nodes, _) = cluster_of(3, None).await;
    let key = ServiceKey::<Echo>::new("echo");
    let recs: Vec<Receptionist> = nodes
        .iter()
        .map(|n| Receptionist::get(&n.cluster))
        .collect();
    let mut sub0 = recs[0].subscribe(&key);
    let first = sub0.recv().await.unwrap();
    assert!(first.is_empty());

    // Register on n1 and n2; n0 sees both.
    let actors: Vec<_> = nodes
        .iter()
        .map(|n| {
            n.system.spawn(EchoActor {
                node: n.id().node_id.clone(),
            })
        })
        .collect();
    recs[1].register(&key, actors[1].clone());
    recs[2].register(&key, actors[2].clone());
    let l = next_matching(
        &mut sub0,
        "n1 and n2 listed on n0",
        Duration::from_secs(5),
        |l| l.len() == 2,
    )
    .await;
    assert_eq!(node_ids(&l), ["n1", "n2"]);
    // find gives working refs of the right type.
    let found = recs[0].find(&key);
    assert_eq!(found.len(), 2);
    for r in found.refs() {
        assert!(!r.is_local());
        // Paths name the registering process's incarnation, so a process restarted on the
        // same address (numbering its registrations from 1 again) never answers for them.
        let incarnation = format!("/system/receptionist/{}/", r.node().incarnation);
        assert!(r.path().starts_with(&incarnation), "{}", r.path());
        let text = "hi".to_string();
        let reply = r
            .ask(
                |reply| Echo {
                    text: text.clone(),
                    reply,
                },
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(reply, format!("{}:hi", r.node().node_id));
    }
    // The same name with another message type is another service.
    assert!(recs[0].find(&ServiceKey::<Other>::new("echo")).is_empty());

    // A registration on n0 itself: local ref, and n2's subscription sees all three.
    let mut sub2 = recs[2].subscribe(&key);
    recs[0].register(&key, actors[0].clone());
    let local = recs[0].find(&key);
    assert_eq!(local.len(), 3);
    assert!(local.refs().iter().any(|r| r.is_local()));
    let l = next_matching(
        &mut sub2,
        "three listed on n2",
        Duration::from_secs(5),
        |l| l.len() == 3,
    )
    .await;
    assert_eq!(node_ids(&l), ["n0", "n1", "n2"]);

    // Deregistering on n0 and stopping n1's actor: n2 sees only its own.
    assert!(recs[0].deregister(&key, &actors[0]));
    actors[1].stop();
    let l = next_matching(
        &mut sub2,
        "only n2 left on n2",
        Duration::from_secs(5),
        |l| node_ids(l) == ["n2"],
    )
    .await;
    assert!(l.refs()[0].is_local());

    // n2 crashes: once it is Down, n0 and n1 drop its entry.
    let again = nodes[1].system.spawn(EchoActor { node: "n1".into() });
    recs[1].register(&key, again);
    next_matching(
        &mut sub0,
        "n1 and n2 on n0 again",
        Duration::from_secs(5),
        |l| node_ids(l) == ["n1", "n2"],
    )
    .await;
    let mut sub1 = recs[1].subscribe(&key);
    next_matching(&mut sub1, "n1 and n2 on n1", Duration::from_secs(5), |l| {
        node_ids(l) == ["n1", "n2"]
    })
    .await;
    nodes[2].cluster.remote().shutdown().await;
    for sub in [&mut sub0, &mut sub1] {
        next_matching(sub, "crashed n2 dropped", Duration::from_secs(10), |l| {
            node_ids(l) == ["n1"]
        })
        .await;
    }
    // It was dropped because it is Down (or already removed), not earlier.
    let dead = nodes[2].id().clone();
    for n in &nodes[..2] {
        let s = n.cluster.state();
        assert!(s
            .member(&dead)
            .is_none_or(|m| m.status == shardik_cluster::member::MemberStatus::Down));
    }
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_later_gets_the_existing_entries() {
    let (mut nodes, _) = cluster_of(2, None).await;
    let key = ServiceKey::<Echo>::new("echo");
    let a = nodes[0].system.spawn(EchoActor { node: "n0".into() });
    Receptionist::get(&nodes[0].cluster).register(&key, a);
    let seed = nodes[0].id().address.clone();
    nodes.push(start(config("n2").seed_nodes([seed])).await);
    let mut sub = Receptionist::get(&nodes[2].cluster).subscribe(&key);
    let l = next_matching(
        &mut sub,
        "n0's entry on the joiner",
        Duration::from_secs(10),
        |l| l.len() == 1,
    )
    .await;
    assert_eq!(node_ids(&l), ["n0"]);
    stop_all(&nodes).await;
}

/// A listing of more than one frame's worth (400 entries of about 90 bytes against a 16 KiB
/// frame limit) reaches the other node, in chunks, and so does a smaller version of it
/// after deregistrations. Before, the whole listing went in one message, which the remote
/// layer refused as too large: the other node never listed any of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_larger_than_a_frame_reaches_the_other_node() {
    let frame = 16 * 1024;
    let (nodes, _) = cluster_with(2, |i| {
        let mut c = config(&format!("n{i}"));
        c.remote = c.remote.max_frame_len(frame);
        c
    })
    .await;
    let key = ServiceKey::<Echo>::new("echo");
    let rec0 = Receptionist::get(&nodes[0].cluster);
    let actors: Vec<_> = (0..400)
        .map(|_| nodes[0].system.spawn(EchoActor { node: "n0".into() }))
        .collect();
    for a in &actors {
        rec0.register(&key, a.clone());
    }
    let listed_bytes: usize = rec0
        .find(&key)
        .refs()
        .iter()
        .map(|r| r.path().len() + key.name().len() + std::any::type_name::<Echo>().len())
        .sum();
    assert!(
        listed_bytes > frame,
        "{listed_bytes} bytes of strings alone"
    );
    let mut sub = Receptionist::get(&nodes[1].cluster).subscribe(&key);
    next_matching(
        &mut sub,
        "all 400 entries on n1",
        Duration::from_secs(10),
        |l| l.len() == 400,
    )
    .await;
    for a in &actors[..150] {
        assert!(rec0.deregister(&key, a));
    }
    let l = next_matching(
        &mut sub,
        "250 entries left on n1",
        Duration::from_secs(10),
        |l| l.len() == 250,
    )
    .await;
    let mut want: Vec<String> = rec0
        .find(&key)
        .refs()
        .iter()
        .map(|r| r.path().to_string())
        .collect();
    let mut got: Vec<String> = l.refs().iter().map(|r| r.path().to_string()).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    // One of them answers from n1.
    let reply = l.refs()[0]
        .ask(
            |reply| Echo {
                text: "big".into(),
                reply,
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(reply, "n0:big");
    stop_all(&nodes).await;
}

/// A node whose application never touches the receptionist still has its endpoint (started
/// with the cluster): the pushes of the others are not dropped there as messages for an
/// unknown recipient (logged as errors before), and its receptionist already lists their
/// entries when the application first asks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_uses_the_receptionist_gets_no_message_it_cannot_handle() {
    let (nodes, _) = cluster_of(3, None).await;
    let key = ServiceKey::<Echo>::new("echo");
    let rec0 = Receptionist::get(&nodes[0].cluster);
    let mut sub2 = Receptionist::get(&nodes[2].cluster).subscribe(&key);
    // Two versions pushed by n0, each to n1 and n2; n2 has seen both.
    for n in 1..=2 {
        rec0.register(&key, nodes[0].system.spawn(EchoActor { node: "n0".into() }));
        next_matching(
            &mut sub2,
            "n0's entries on n2",
            Duration::from_secs(5),
            |l| l.len() == n,
        )
        .await;
    }
    // Evidence that n1 got n0's messages before looking at what it did with them.
    let mut sub1 = Receptionist::get(&nodes[1].cluster).subscribe(&key);
    next_matching(
        &mut sub1,
        "n0's entries on n1",
        Duration::from_secs(5),
        |l| l.len() == 2,
    )
    .await;
    let stats = nodes[1].cluster.remote().stats();
    assert_eq!(stats.unknown_recipient, 0);
    assert_eq!(stats.decode_errors, 0);
    stop_all(&nodes).await;
}

/// Once every member holds a node's listing, the node does not send it again: every push
/// interval it sends only its version, which a member holding it ignores. Before, the whole
/// listing went to every member every 500 ms and on every cluster event, however large,
/// on the lane heartbeats and gossip use. A node joining later is still served: it gets
/// the version, asks for the listing and gets it. On one thread inside a thread-local
/// recorder, so that only this test's metrics are seen.
#[test]
fn an_unchanged_listing_is_announced_by_version_and_not_sent_again() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // What n0's receptionist sent so far, of the given kinds (a snapshot takes the counts
    // out of the recorder: they are added up here).
    let totals = std::cell::RefCell::new(std::collections::HashMap::<String, u64>::new());
    let sent = |kinds: &[&str]| -> u64 {
        let mut totals = totals.borrow_mut();
        for (k, _, _, v) in snapshotter.snapshot().into_vec() {
            let labels: Vec<_> = k.key().labels().collect();
            if k.key().name() != "shardik_receptionist_sent_total"
                || !labels
                    .iter()
                    .any(|l| l.key() == "node" && l.value() == "n0")
            {
                continue;
            }
            let kind = labels.iter().find(|l| l.key() == "kind").unwrap().value();
            match v {
                DebugValue::Counter(n) => *totals.entry(kind.to_string()).or_default() += n,
                other => panic!("{other:?}"),
            }
        }
        kinds.iter().filter_map(|k| totals.get(*k)).sum()
    };
    let chunks = ["change_chunk", "requested_chunk"];
    let all = ["change_chunk", "requested_chunk", "version", "request"];
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut nodes, _) = cluster_of(2, None).await;
            let key = ServiceKey::<Echo>::new("echo");
            let rec0 = Receptionist::get(&nodes[0].cluster);
            rec0.register(&key, nodes[0].system.spawn(EchoActor { node: "n0".into() }));
            let mut sub1 = Receptionist::get(&nodes[1].cluster).subscribe(&key);
            next_matching(&mut sub1, "n0's entry on n1", Duration::from_secs(5), |l| {
                l.len() == 1
            })
            .await;
            let before = sent(&chunks);
            assert!(before >= 1);
            // Four more messages to n1: four push intervals at least, membership being
            // settled.
            let total = sent(&all);
            tokio::time::timeout(Duration::from_secs(10), async {
                while sent(&all) < total + 4 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("n0 keeps telling n1 its version");
            assert_eq!(
                sent(&chunks),
                before,
                "the unchanged listing was sent again"
            );
            // A node joining later asks for the listing and gets it.
            let seed = nodes[0].id().address.clone();
            nodes.push(start(config("n2").seed_nodes([seed])).await);
            let mut sub2 = Receptionist::get(&nodes[2].cluster).subscribe(&key);
            next_matching(
                &mut sub2,
                "n0's entry on n2",
                Duration::from_secs(10),
                |l| l.len() == 1,
            )
            .await;
            assert_eq!(sent(&["change_chunk"]), before, "nothing changed");
            assert!(sent(&["requested_chunk"]) >= 1);
            stop_all(&nodes).await;
        });
    });
}
