//! The cluster singleton across nodes over real TCP: exactly one instance, hand-over on a
//! graceful leave of its node (the old instance stops before the new one starts, also when
//! the leaving node is downed meanwhile, and messages sent through a proxy that sees the host
//! leaving are delivered), restart on the next oldest node after a crash (only once the
//! crashed node is `Down`), a partition that isolates the host (its instance stops when its
//! node is fenced, before the majority starts one, even with no down margin), an instance
//! that stops on its own started again after the restart backoff (or handed over if its node
//! leaves meanwhile), and a bounded proxy buffer.

mod netutil;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netutil::*;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, Props, ReplyTo};
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::{
    Cluster, ClusterSingleton, SingletonError, SingletonProxy, SingletonSettings,
};

#[derive(Serialize, Deserialize)]
enum Msg {
    Add(u64),
    /// As `Add`, after working for this many milliseconds.
    Slow(u64, u64),
    /// Which node runs the instance, and what it received.
    Get(ReplyTo<(String, Vec<u64>)>),
    /// The instance stops itself.
    Stop,
}

/// Who is alive, shared by all nodes of the test (they run in one process).
#[derive(Default)]
struct Witness {
    alive: AtomicUsize,
    max_alive: AtomicUsize,
    log: Mutex<Vec<String>>,
    /// Told of every line added to `log`.
    logged: tokio::sync::Notify,
    /// For every instance started: its node, that node's view and the time at that moment.
    views: Mutex<Vec<(String, View, Instant)>>,
    /// For every instance stopped: the time its `stopped` hook ran.
    stops: Mutex<Vec<Instant>>,
}

impl Witness {
    fn push(&self, line: String) {
        self.log.lock().push(line);
        self.logged.notify_waiters();
    }

    /// Waits until the log holds at least `len` lines, and returns it.
    async fn wait_log(&self, len: usize) -> Vec<String> {
        self.wait_log_for(|log| log.len() >= len).await
    }

    /// Waits until `pred` holds for the log, and returns it.
    async fn wait_log_for(&self, mut pred: impl FnMut(&[String]) -> bool) -> Vec<String> {
        loop {
            let notified = self.logged.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let log = self.log.lock().clone();
            if pred(&log) {
                return log;
            }
            notified.await;
        }
    }
}

/// The status of every member (by node id) in one node's view; removed members are absent.
type View = Vec<(String, MemberStatus)>;

struct Counter {
    node: String,
    got: Vec<u64>,
    witness: Arc<Witness>,
}

impl Actor for Counter {
    type Msg = Msg;
    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let n = self.witness.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.witness.max_alive.fetch_max(n, Ordering::SeqCst);
        self.witness.push(format!("start {}", self.node));
        Ok(())
    }
    async fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.witness.stops.lock().push(Instant::now());
        self.witness.push(format!("stop {}", self.node));
        self.witness.alive.fetch_sub(1, Ordering::SeqCst);
    }
    async fn handle(&mut self, msg: Msg, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::Add(n) => self.got.push(n),
            Msg::Slow(n, ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                self.got.push(n);
            }
            Msg::Get(reply) => reply.reply((self.node.clone(), self.got.clone())),
            Msg::Stop => ctx.stop(),
        }
        Ok(())
    }
}

const MARGIN: Duration = Duration::from_secs(2);

fn start_singleton(cluster: &Cluster, witness: &Arc<Witness>) -> ClusterSingleton<Msg> {
    // A margin well above scheduling delays of this test's own waiter task on a loaded
    // machine (the default, 500 ms, is not).
    start_singleton_with(
        cluster,
        witness,
        SingletonSettings::new("counter").down_margin(MARGIN),
    )
}

/// The counter singleton started on every node, with the witness they share.
fn start_everywhere(nodes: &[Node]) -> (Arc<Witness>, Vec<ClusterSingleton<Msg>>) {
    let witness = Arc::new(Witness::default());
    let singletons = nodes
        .iter()
        .map(|n| start_singleton(&n.cluster, &witness))
        .collect();
    (witness, singletons)
}

/// Tells `proxy` `messages` messages of 50 ms each: a backlog for the instance.
fn backlog(proxy: &SingletonProxy<Msg>, messages: u64) {
    for i in 0..messages {
        proxy.tell(Msg::Slow(i, 50)).unwrap();
    }
}

/// The counter singleton started on every node with `settings`, once n0 hosts it.
async fn hosted_everywhere_with(
    nodes: &[Node],
    settings: SingletonSettings,
) -> (Arc<Witness>, Vec<ClusterSingleton<Msg>>) {
    let witness = Arc::new(Witness::default());
    let singletons: Vec<_> = nodes
        .iter()
        .map(|n| start_singleton_with(&n.cluster, &witness, settings.clone()))
        .collect();
    within("n0 hosts", 5, singletons[0].wait_hosting(true)).await;
    (witness, singletons)
}

fn start_singleton_with(
    cluster: &Cluster,
    witness: &Arc<Witness>,
    settings: SingletonSettings,
) -> ClusterSingleton<Msg> {
    let node = cluster.self_node().node_id.clone();
    let witness = witness.clone();
    let c = cluster.clone();
    ClusterSingleton::start(cluster, settings, move || {
        let node = node.clone();
        let view = c
            .state()
            .members
            .iter()
            .map(|m| (m.node.node_id.clone(), m.status))
            .collect();
        witness
            .views
            .lock()
            .push((node.clone(), view, Instant::now()));
        let witness = witness.clone();
        Props::new(move || Counter {
            node: node.clone(),
            got: Vec::new(),
            witness: witness.clone(),
        })
    })
}

/// Cuts n0 off from n1 and n2 and waits until it is fenced and has stopped its instance.
async fn isolate_n0(
    faults: &shardik_remote::FaultInjector,
    nodes: &[Node],
    on_n0: &ClusterSingleton<Msg>,
) {
    for other in ["n1", "n2"] {
        faults.cut_both("n0", other);
    }
    let fenced = |s: &shardik_cluster::runtime::ClusterState| s.fenced;
    wait(
        &nodes[0].cluster,
        "n0 fenced",
        Duration::from_secs(10),
        fenced,
    )
    .await;
    within("n0's instance stops", 5, on_n0.wait_hosting(false)).await;
}

/// A cluster whose singleton instance runs on n0 (see [`hosted_on_n0`]).
struct Hosted {
    faults: shardik_remote::FaultInjector,
    nodes: Vec<Node>,
    witness: Arc<Witness>,
    singletons: Vec<ClusterSingleton<Msg>>,
    /// n1's proxy, which sends to n0.
    p1: SingletonProxy<Msg>,
    n0: UniqueAddress,
}

impl Hosted {
    /// Checks that there never were two instances at once, and stops the nodes.
    async fn end(self) {
        assert_eq!(self.witness.max_alive.load(Ordering::SeqCst), 1);
        stop_all(&self.nodes).await;
    }
}

/// `n` nodes with fault injection and no downing for a minute (`stable_after`), the counter
/// singleton started on every node, its instance running on n0, and n1's proxy sending to it.
async fn hosted_on_n0(n: usize) -> Hosted {
    let faults = shardik_remote::FaultInjector::new();
    let (nodes, _) = cluster_with(n, |i| {
        config(&format!("n{i}"))
            .faults(faults.clone())
            .stable_after(Duration::from_secs(60))
    })
    .await;
    let (witness, singletons) = start_everywhere(&nodes);
    within("n0 hosts", 5, singletons[0].wait_hosting(true)).await;
    let p1 = singletons[1].proxy();
    let n0 = nodes[0].id().clone();
    sending_to(&p1, &n0).await;
    Hosted {
        faults,
        nodes,
        witness,
        singletons,
        p1,
        n0,
    }
}

/// Waits until the proxy `p` sends to `host` (it knows it and is not paused).
async fn sending_to(p: &SingletonProxy<Msg>, host: &UniqueAddress) {
    within(
        "the proxy sends to the host",
        20,
        p.wait_host(|h| h == Some(host)),
    )
    .await;
}

/// Heals every cut, waits until the proxy `p` sends to `host` again (its instance runs),
/// and asks the instance where it runs and what it received.
async fn heal_and_ask(
    faults: &shardik_remote::FaultInjector,
    p: &SingletonProxy<Msg>,
    host: &UniqueAddress,
) -> (String, Vec<u64>) {
    faults.heal_all();
    sending_to(p, host).await;
    within("the instance answers", 10, async {
        p.ask(Msg::Get, Duration::from_secs(5)).await
    })
    .await
    .expect("the instance answers")
}

async fn within<T>(what: &str, secs: u64, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within {secs} s"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_handed_over_on_leave_and_restarted_after_crash() {
    // Four nodes, so that after one left and one crashed, the other two are a majority.
    let (nodes, _) = cluster_of(4, None).await;
    let (witness, singletons) = start_everywhere(&nodes);

    // The oldest member (n0, moved up first) runs the only instance; every proxy finds it.
    within("n0 hosts", 5, singletons[0].wait_hosting(true)).await;
    for (i, s) in singletons.iter().enumerate() {
        let p = s.proxy();
        let (host, _) = within("proxy answer", 5, p.ask(Msg::Get, Duration::from_secs(5)))
            .await
            .unwrap();
        assert_eq!(host, "n0", "proxy on n{i}");
    }
    assert!(singletons[1..].iter().all(|s| !s.is_hosting()));
    assert_eq!(witness.alive.load(Ordering::SeqCst), 1);

    // The members by age (up-number): n0 formed the cluster, the others were moved up
    // together, in address order (so the order of n1..n3 depends on their ports).
    let state = nodes[0].cluster.state();
    let mut by_age: Vec<usize> = (0..nodes.len()).collect();
    by_age.sort_by_key(|&i| state.member(nodes[i].id()).unwrap().up_number);
    let name = |i: usize| format!("n{i}");
    let (a, b, c) = (by_age[1], by_age[2], by_age[3]);
    assert_eq!(by_age[0], 0);

    // n0 leaves. Once b and c see it Leaving, messages through their proxies are buffered
    // (or go to the new instance): all are delivered to the new instance on a.
    let leaver = nodes[0].cluster.clone();
    let leave = tokio::spawn(async move { leaver.leave().await });
    let old = nodes[0].id().clone();
    for i in [b, c] {
        wait(
            &nodes[i].cluster,
            "n0 leaving",
            Duration::from_secs(5),
            |s| s.member(&old).is_none_or(|m| m.status != MemberStatus::Up),
        )
        .await;
    }
    let (pb, pc) = (singletons[b].proxy(), singletons[c].proxy());
    for i in 1..=10 {
        pb.tell(Msg::Add(i)).unwrap();
        pc.tell(Msg::Add(100 + i)).unwrap();
    }
    within("a hosts", 10, singletons[a].wait_hosting(true)).await;
    // Each proxy's messages arrive in order, before its own later ask (messages of two
    // senders are not ordered with respect to each other).
    for (p, range) in [(&pb, 1..=10u64), (&pc, 101..=110)] {
        let (host, got) = within(
            "ask after hand-over",
            10,
            p.ask(Msg::Get, Duration::from_secs(5)),
        )
        .await
        .unwrap();
        assert_eq!(host, name(a));
        let mine: Vec<u64> = got.iter().copied().filter(|v| range.contains(v)).collect();
        assert_eq!(mine, range.collect::<Vec<_>>(), "{got:?}");
    }
    within("n0 left", 10, leave).await.unwrap();
    let rest: Vec<_> = [a, b, c].iter().map(|&i| nodes[i].id().clone()).collect();
    for &i in &[a, b, c] {
        wait(
            &nodes[i].cluster,
            "n0 removed",
            Duration::from_secs(5),
            |s| s.all_up(&rest),
        )
        .await;
    }
    assert_eq!(
        *witness.log.lock(),
        [
            "start n0".to_string(),
            "stop n0".into(),
            format!("start {}", name(a))
        ],
        "the old instance stopped before the new one started"
    );

    // a crashes (its remoting dies without leaving). b (next oldest) starts a new instance,
    // only once a is Down in its view and the down margin (`MARGIN`) has passed.
    let down_seen = {
        let (cb, a_id) = (nodes[b].cluster.clone(), nodes[a].id().clone());
        tokio::spawn(async move {
            cb.wait_until(|s| {
                s.member(&a_id)
                    .is_none_or(|m| m.status == MemberStatus::Down)
            })
            .await;
            Instant::now()
        })
    };
    nodes[a].cluster.remote().shutdown().await;
    within(
        "b hosts after the crash",
        15,
        singletons[b].wait_hosting(true),
    )
    .await;
    {
        let (node, view, started) = witness.views.lock().last().cloned().unwrap();
        assert_eq!(node, name(b));
        let down_seen = down_seen.await.unwrap();
        // The waiter may see the Down later than b's manager did (another task): allow half.
        assert!(
            started.saturating_duration_since(down_seen) >= MARGIN / 2,
            "b started {:?} after it saw a Down; the margin is {MARGIN:?}",
            started.saturating_duration_since(down_seen)
        );
        let was = view.iter().find(|(id, _)| *id == name(a)).map(|(_, s)| *s);
        assert!(
            was.is_none_or(|s| s == MemberStatus::Down),
            "a was {was:?} when b started"
        );
    }
    assert!(!singletons[c].is_hosting());
    let (host, got) = within(
        "ask after crash",
        5,
        pc.ask(Msg::Get, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(host, name(b));
    assert!(got.is_empty(), "a new instance: {got:?}");
    let log = witness.log.lock().clone();
    let expected: Vec<String> = vec![
        "start n0".into(),
        "stop n0".into(),
        format!("start {}", name(a)),
        format!("stop {}", name(a)),
        format!("start {}", name(b)),
    ];
    assert_eq!(log, expected);
    assert_eq!(witness.max_alive.load(Ordering::SeqCst), 1, "{log:?}");
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_host_stops_its_instance_before_the_majority_starts_one() {
    let faults = shardik_remote::FaultInjector::new();
    let (nodes, _) = cluster_of(3, Some(&faults)).await;
    let witness = Arc::new(Witness::default());
    let singletons: Vec<_> = nodes
        .iter()
        .map(|n| {
            let node = n.cluster.self_node().node_id.clone();
            let witness = witness.clone();
            // No margin: only the fence keeps the two instances apart.
            let settings = SingletonSettings::new("counter").down_margin(Duration::ZERO);
            ClusterSingleton::start(&n.cluster, settings, move || {
                let (node, witness) = (node.clone(), witness.clone());
                Props::new(move || Counter {
                    node: node.clone(),
                    got: Vec::new(),
                    witness: witness.clone(),
                })
            })
        })
        .collect();
    within("n0 hosts", 5, singletons[0].wait_hosting(true)).await;
    isolate_n0(&faults, &nodes, &singletons[0]).await;
    let hosts = within("the majority hosts", 20, async {
        tokio::select! {
            _ = singletons[1].wait_hosting(true) => 1,
            _ = singletons[2].wait_hosting(true) => 2,
        }
    })
    .await;
    // The manager reports hosting once it spawned the instance; its `started` hook (which
    // writes the log) runs right after.
    let deadline = Instant::now() + Duration::from_secs(5);
    while witness.log.lock().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = witness.log.lock().clone();
    assert_eq!(
        log,
        [
            "start n0".to_string(),
            "stop n0".into(),
            format!("start n{hosts}")
        ],
        "the isolated instance stopped before the new one started"
    );
    assert_eq!(witness.max_alive.load(Ordering::SeqCst), 1, "{log:?}");
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_buffer_is_bounded_while_no_instance_is_known() {
    let (nodes, _) = cluster_of(2, None).await;
    // Nobody has the role: no instance, the proxy only buffers.
    let singletons: Vec<ClusterSingleton<Msg>> = nodes
        .iter()
        .map(|n| {
            ClusterSingleton::start(
                &n.cluster,
                SingletonSettings::new("nowhere")
                    .role("nobody")
                    .buffer_size(3),
                || -> Props<Counter> { unreachable!("no member has the role") },
            )
        })
        .collect();
    let p = singletons[1].proxy();
    for i in 0..3 {
        p.tell(Msg::Add(i)).unwrap();
    }
    assert_eq!(p.buffered(), 3);
    assert_eq!(p.host(), None);
    assert_eq!(
        p.tell(Msg::Add(3)),
        Err(SingletonError::BufferFull {
            name: "nowhere".into(),
            capacity: 3
        })
    );
    // An ask says the same with the matching `AskError` (it was an `Undeliverable` text).
    assert_eq!(
        p.ask(Msg::Get, Duration::from_secs(1)).await,
        Err(shardik_actor::AskError::MailboxFull)
    );
    stop_all(&nodes).await;
}

/// A host that leaves while its instance has a long backlog works through it only for half
/// the removal timeout, then stops the instance after its current message: the new instance
/// never overlaps with the old one, however long the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_instance_on_a_leaving_host_never_overlaps_the_next() {
    let (nodes, _) = cluster_of(3, None).await;
    let settings = SingletonSettings::new("counter")
        .down_margin(MARGIN)
        .removal_timeout(Duration::from_secs(2));
    let (witness, singletons) = hosted_everywhere_with(&nodes, settings).await;
    // 300 messages of 50 ms: a 15 s backlog on the host.
    let proxy = singletons[0].proxy();
    backlog(&proxy, 300);
    let leaver = nodes[0].cluster.clone();
    let started = Instant::now();
    let leave = tokio::spawn(async move { leaver.leave().await });
    within("another node hosts", 12, async {
        tokio::select! {
            _ = singletons[1].wait_hosting(true) => {}
            _ = singletons[2].wait_hosting(true) => {}
        }
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the hand-over waited for the backlog"
    );
    // Hosting is announced before the new instance's `started` hook runs: wait for it.
    within("the new instance starts", 10, async {
        while witness.log.lock().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    within("n0 left", 10, leave).await.unwrap();
    let log = witness.log.lock().clone();
    assert_eq!(log.first().map(String::as_str), Some("start n0"), "{log:?}");
    assert_eq!(log.get(1).map(String::as_str), Some("stop n0"), "{log:?}");
    assert_eq!(witness.max_alive.load(Ordering::SeqCst), 1, "{log:?}");
}

/// The host is cut off long enough to be fenced (its instance stops) but not downed (a long
/// `stable_after`), then the cut heals. A message told through a proxy on the other side
/// while the host was unreachable reaches the instance once it runs again: the proxy waits
/// for the host's next announcement (found by an audit on 2026-11-29: it went out as soon as
/// the host was reachable again, before its fence lifted, and was lost). One told through the
/// host's own proxy while fenced waits too (that proxy forgot the stopped instance), and is
/// handled first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_around_a_fenced_host_reach_its_instance_when_it_runs_again() {
    let hosted = hosted_on_n0(3).await;
    let p0 = hosted.singletons[0].proxy();
    isolate_n0(&hosted.faults, &hosted.nodes, &hosted.singletons[0]).await;
    wait(
        &hosted.nodes[1].cluster,
        "n1 sees n0 unreachable",
        Duration::from_secs(10),
        |s| s.unreachable.contains(&hosted.n0),
    )
    .await;
    hosted.p1.tell(Msg::Add(1)).unwrap();
    p0.tell(Msg::Add(2)).unwrap();
    hosted.faults.heal_all();
    within(
        "n0 hosts again",
        20,
        hosted.singletons[0].wait_hosting(true),
    )
    .await;
    let (host, got) = within("the instance answers", 10, async {
        hosted.p1.ask(Msg::Get, Duration::from_secs(5)).await
    })
    .await
    .expect("the instance answers");
    assert_eq!(host, "n0");
    assert_eq!(got, vec![2, 1], "both reached the instance, n0's own first");
    hosted.end().await;
}

/// A host fenced while the proxy's node still reaches it and nobody flags it (it cannot
/// hear most of the cluster, one way): it says it stopped its instance (`Paused`), so the
/// proxy sends to no node (`host()` is `None`) and buffers until the instance runs again,
/// instead of sending to the stopped instance. Five nodes: n0 hears only n1, so it loses
/// most of the peers it watches and is fenced, while everyone hears n0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_reaches_a_fenced_host_waits_for_its_instance() {
    let hosted = hosted_on_n0(5).await;
    for other in ["n2", "n3", "n4"] {
        hosted.faults.cut(other, "n0");
    }
    let fenced = |s: &shardik_cluster::runtime::ClusterState| s.fenced;
    wait(
        &hosted.nodes[0].cluster,
        "n0 fenced",
        Duration::from_secs(10),
        fenced,
    )
    .await;
    within(
        "n0's instance stops",
        5,
        hosted.singletons[0].wait_hosting(false),
    )
    .await;
    within("n1's proxy pauses", 5, hosted.p1.wait_host(|h| h.is_none())).await;
    assert!(
        !hosted.nodes[1]
            .cluster
            .state()
            .unreachable
            .contains(&hosted.n0),
        "nobody flags n0: the proxy paused on n0's word"
    );
    hosted.p1.tell(Msg::Add(1)).unwrap();
    assert_eq!(hosted.p1.buffered(), 1);
    let (host, got) = heal_and_ask(&hosted.faults, &hosted.p1, &hosted.n0).await;
    assert_eq!(host, "n0");
    assert_eq!(
        got,
        vec![1],
        "the message sent while n0 was fenced reached the instance"
    );
    hosted.end().await;
}

/// A host that a member flags unreachable, while the proxy's node hears it: the proxy
/// buffers until nobody flags the host, also when the host announces itself meanwhile (an
/// announcement confirms a paused host only once it is reachable). The flagged host also
/// fences itself once it hears of the flag (the other end of the broken link would down it),
/// and runs its instance again after the heal, with the buffered message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_buffers_for_a_flagged_host_it_still_hears() {
    let hosted = hosted_on_n0(3).await;
    // n2 stops hearing n0 and flags it; n0 and n1 hear everyone.
    hosted.faults.cut("n0", "n2");
    wait(
        &hosted.nodes[1].cluster,
        "n1 sees n0 flagged",
        Duration::from_secs(10),
        |s| s.unreachable.contains(&hosted.n0),
    )
    .await;
    within("n1's proxy pauses", 5, hosted.p1.wait_host(|h| h.is_none())).await;
    hosted.p1.tell(Msg::Add(1)).unwrap();
    // n0 announces itself every 500 ms meanwhile; none of that sends the message.
    let announced_meanwhile = Instant::now();
    while announced_meanwhile.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if hosted.nodes[1]
            .cluster
            .state()
            .unreachable
            .contains(&hosted.n0)
        {
            assert_eq!(hosted.p1.buffered(), 1, "buffered while n0 is flagged");
            assert_eq!(hosted.p1.host(), None);
        }
    }
    let (host, got) = heal_and_ask(&hosted.faults, &hosted.p1, &hosted.n0).await;
    assert_eq!((host.as_str(), got), ("n0", vec![1]));
    hosted.end().await;
}

/// A host that leaves with a long backlog and is downed (by an operator) while its instance
/// works through it stops the instance at once: the others start a new one `down_margin`
/// after the `Down`, without waiting for `HandedOver`. Found by an audit on 2026-11-29: the
/// manager waited for the drain inside its step and saw neither the fence nor the `Down`, so
/// the old instance ran on for up to half the removal timeout next to the new one. n3, which
/// does not have the singleton's role, is cut off so that the leave cannot converge: n0 stays
/// `Leaving` until it is downed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_host_downed_during_its_hand_over_stops_its_instance_at_once() {
    let faults = shardik_remote::FaultInjector::new();
    let (nodes, _) = cluster_with(4, |i| {
        let c = config(&format!("n{i}"))
            .faults(faults.clone())
            .stable_after(Duration::from_secs(60));
        if i < 3 {
            c.role("host")
        } else {
            c
        }
    })
    .await;
    // Half the removal timeout, the longest drain, is far beyond the margin.
    let settings = SingletonSettings::new("counter")
        .role("host")
        .down_margin(MARGIN)
        .removal_timeout(Duration::from_secs(60));
    let (witness, singletons) = hosted_everywhere_with(&nodes, settings).await;
    for other in ["n0", "n1", "n2"] {
        faults.cut_both("n3", other);
    }
    let n3 = nodes[3].id().clone();
    for node in &nodes[..3] {
        wait(
            &node.cluster,
            "n3 unreachable",
            Duration::from_secs(10),
            |s| s.unreachable.contains(&n3),
        )
        .await;
    }
    // 600 messages of 50 ms: a 30 s backlog on the host.
    let proxy = singletons[0].proxy();
    backlog(&proxy, 600);
    let leaver = nodes[0].cluster.clone();
    let leave = tokio::spawn(async move { leaver.leave().await });
    let n0 = nodes[0].id().clone();
    wait(
        &nodes[1].cluster,
        "n0 leaving",
        Duration::from_secs(5),
        |s| {
            s.member(&n0)
                .is_some_and(|m| m.status == MemberStatus::Leaving)
        },
    )
    .await;
    nodes[1].cluster.down(&n0);
    let next = within("another node hosts", 15, async {
        tokio::select! {
            _ = singletons[1].wait_hosting(true) => 1,
            _ = singletons[2].wait_hosting(true) => 2,
        }
    })
    .await;
    let started = format!("start n{next}");
    let log = within(
        "the new instance starts",
        5,
        witness.wait_log_for(|log| log.contains(&started)),
    )
    .await;
    assert_eq!(
        log[..],
        [
            "start n0".to_string(),
            "stop n0".into(),
            format!("start n{next}")
        ],
        "the old instance stopped before the new one started"
    );
    assert_eq!(witness.max_alive.load(Ordering::SeqCst), 1, "{log:?}");
    assert_eq!(
        within("n0 stops", 10, leave).await.unwrap(),
        shardik_cluster::runtime::NodeStopReason::Downed
    );
    stop_all(&nodes).await;
}

/// A host shut down without leaving (the others take it for crashed, and start a new
/// instance once it is `Down`) stops its instance at once rather than working through the
/// queue first, which is for a graceful leave only (found by the same audit: it worked
/// through it for up to half the removal timeout whatever the reason the node stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_shut_down_with_a_backlog_stops_its_instance_at_once() {
    let (nodes, _) = cluster_of(2, None).await;
    let settings = SingletonSettings::new("counter")
        .down_margin(MARGIN)
        .removal_timeout(Duration::from_secs(60));
    let (witness, singletons) = hosted_everywhere_with(&nodes, settings).await;
    // A 30 s backlog.
    let proxy = singletons[0].proxy();
    backlog(&proxy, 600);
    nodes[0].cluster.shutdown().await;
    within("n0's instance stops", 5, singletons[0].wait_hosting(false)).await;
    let log = within("the instance stops", 5, witness.wait_log(2)).await;
    assert_eq!(log, ["start n0", "stop n0"]);
    stop_all(&nodes).await;
}

/// An instance that stops on its own (here it stops itself; a supervisor giving up does the
/// same) is started again on the same host once the restart backoff has passed. Meanwhile
/// the host no longer says it runs one, and the proxies buffer until it does: a message told
/// then reaches the new instance. Found by an audit on 2026-11-29: the manager kept the dead
/// instance, went on announcing it, and every message to it was lost although `tell`
/// returned `Ok`. The backoff is far longer than what the test does meanwhile, so nothing
/// races the restart (with the default 1 s a stalled test could miss the pause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_stops_on_its_own_is_started_again() {
    const BACKOFF: Duration = Duration::from_secs(30);
    let (nodes, _) = cluster_of(2, None).await;
    let settings = SingletonSettings::new("counter")
        .down_margin(MARGIN)
        .restart_backoff(BACKOFF, 2 * BACKOFF);
    let (witness, singletons) = hosted_everywhere_with(&nodes, settings).await;
    let n0 = nodes[0].id().clone();
    let (p0, p1) = (singletons[0].proxy(), singletons[1].proxy());
    sending_to(&p1, &n0).await;
    p1.tell(Msg::Add(1)).unwrap();
    p1.tell(Msg::Stop).unwrap();
    within("n0 no longer hosts", 5, singletons[0].wait_hosting(false)).await;
    within("n1's proxy waits", 5, p1.wait_host(|h| h.is_none())).await;
    within("n0's proxy waits", 5, p0.wait_host(|h| h.is_none())).await;
    p1.tell(Msg::Add(2)).unwrap();
    p0.tell(Msg::Add(3)).unwrap();
    assert_eq!((p0.buffered(), p1.buffered()), (1, 1));
    assert!(!singletons[0].is_hosting() && !singletons[1].is_hosting());
    within(
        "n0 hosts again",
        BACKOFF.as_secs() + 15,
        singletons[0].wait_hosting(true),
    )
    .await;
    let (host, got) = within(
        "the new instance answers",
        10,
        p1.ask(Msg::Get, Duration::from_secs(5)),
    )
    .await
    .expect("the new instance answers");
    assert_eq!(host, "n0");
    let mut got = got;
    got.sort_unstable();
    assert_eq!(
        got,
        vec![2, 3],
        "a new instance, with the messages told meanwhile"
    );
    let log = within("the log", 5, witness.wait_log(3)).await;
    assert_eq!(log, ["start n0", "stop n0", "start n0"]);
    // The restart waited out the backoff, counted from the moment the old instance was
    // reaped (after its `stopped` hook ran) until the new one was made.
    let stopped = witness.stops.lock()[0];
    let restarted = witness.views.lock()[1].2;
    let waited = restarted.saturating_duration_since(stopped);
    assert!(waited >= BACKOFF, "restarted {waited:?} after the stop");
    stop_all(&nodes).await;
}

/// A host whose instance stopped on its own and that leaves while it waits out the restart
/// backoff runs no instance: it confirms the hand-over (`HandedOver`) as a leaving node does,
/// and the next host starts at once, not after the removal timeout (here 1 hour), with the
/// messages its proxy buffered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_leaves_while_its_instance_waits_for_a_restart_hands_over() {
    let (nodes, _) = cluster_of(2, None).await;
    let hour = Duration::from_secs(3600);
    let settings = SingletonSettings::new("counter")
        .down_margin(MARGIN)
        .removal_timeout(hour)
        .restart_backoff(hour, hour);
    let (witness, singletons) = hosted_everywhere_with(&nodes, settings).await;
    let n0 = nodes[0].id().clone();
    let p1 = singletons[1].proxy();
    sending_to(&p1, &n0).await;
    p1.tell(Msg::Stop).unwrap();
    within("n0 no longer hosts", 5, singletons[0].wait_hosting(false)).await;
    within("n1's proxy waits", 5, p1.wait_host(|h| h.is_none())).await;
    p1.tell(Msg::Add(1)).unwrap();
    let leaver = nodes[0].cluster.clone();
    let leave = tokio::spawn(async move { leaver.leave().await });
    within("n1 hosts", 20, singletons[1].wait_hosting(true)).await;
    let (host, got) = within(
        "the new instance answers",
        10,
        p1.ask(Msg::Get, Duration::from_secs(5)),
    )
    .await
    .expect("the new instance answers");
    assert_eq!((host.as_str(), got), ("n1", vec![1]));
    within("n0 left", 10, leave).await.unwrap();
    let log = witness.log.lock().clone();
    assert_eq!(log, ["start n0", "stop n0", "start n1"]);
    stop_all(&nodes).await;
}
