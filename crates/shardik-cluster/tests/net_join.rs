//! Joining over real TCP: three nodes see each other `Up`; seed nodes started together form
//! exactly one cluster; `lookup` by node id; configuration errors at start.

mod netutil;

use std::time::Duration;

use netutil::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use shardik_cluster::events::ClusterEvent;
use shardik_cluster::member::MemberStatus;
use shardik_cluster::runtime::{Cluster, ClusterError, ConfigError, Event};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_join_and_all_see_each_other_up() {
    let (nodes, took) = cluster_of(3, None).await;
    eprintln!("3 nodes all Up everywhere after {took:?}");
    let leader = nodes[0].cluster.leader().expect("a leader");
    for n in &nodes {
        assert_eq!(n.cluster.leader().as_ref(), Some(&leader));
        assert_eq!(n.cluster.members().len(), 3);
        let me = n.cluster.self_member().unwrap();
        assert_eq!(me.status, MemberStatus::Up);
        n.cluster.when_up().await.unwrap();
    }
    // A subscriber gets the snapshot, then events.
    let sub = nodes[2].cluster.subscribe();
    assert_eq!(sub.snapshot.members.len(), 3);
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_see_members_come_up_in_order() {
    let first = start(config("a")).await;
    let mut sub = first.cluster.subscribe();
    let second = start(config("b").seed_nodes([first.id().address.clone()])).await;
    let b = second.id().clone();
    let mut saw_joined = false;
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .expect("event in time")
            .expect("open");
        match e {
            Event::Cluster(ClusterEvent::MemberJoined(m)) if m.node == b => saw_joined = true,
            Event::Cluster(ClusterEvent::MemberUp(m)) if m.node == b => break,
            _ => {}
        }
    }
    assert!(saw_joined, "MemberJoined before MemberUp");
    stop_all(&[first, second]).await;
}

/// Seed nodes with the same seed list: only the first may form the cluster, the others join
/// it; a restarted first seed joins the running cluster instead of forming a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_nodes_started_together_form_one_cluster() {
    let addrs = free_addrs(3);
    // Start the non-first seeds first: they must not form anything on their own.
    let mut nodes = Vec::new();
    for i in [2, 1] {
        nodes.push(
            start(
                config(&format!("s{i}"))
                    .bind(addrs[i].clone())
                    .seed_nodes(addrs.clone()),
            )
            .await,
        );
    }
    for n in &nodes {
        assert!(
            tokio::time::timeout(Duration::from_millis(1500), n.cluster.when_up())
                .await
                .is_err(),
            "a non-first seed formed a cluster"
        );
        assert!(n.cluster.members().is_empty());
    }
    nodes.push(
        start(
            config("s0")
                .bind(addrs[0].clone())
                .seed_nodes(addrs.clone()),
        )
        .await,
    );
    let ids: Vec<_> = nodes.iter().map(|n| n.id().clone()).collect();
    wait_all_up(&nodes, &ids, "one cluster of 3").await;

    // The first seed crashes and restarts on its address: the other seeds answer that they
    // are members, so it joins them instead of forming a second cluster.
    let old = nodes.pop().unwrap();
    old.cluster.shutdown().await;
    old.system.shutdown().await;
    let restarted = start(
        config("s0")
            .bind(addrs[0].clone())
            .seed_nodes(addrs.clone()),
    )
    .await;
    let ids = [
        nodes[0].id().clone(),
        nodes[1].id().clone(),
        restarted.id().clone(),
    ];
    for n in nodes.iter().chain([&restarted]) {
        wait(
            &n.cluster,
            "restarted first seed rejoined",
            Duration::from_secs(15),
            |s| s.all_up(&ids),
        )
        .await;
    }
    stop_all(&nodes).await;
    stop_all(std::slice::from_ref(&restarted)).await;
}

#[derive(Debug, Serialize, Deserialize)]
enum Who {
    Name { reply: ReplyTo<String> },
}

struct WhoActor(String);

impl Actor for WhoActor {
    type Msg = Who;
    async fn handle(&mut self, msg: Who, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let Who::Name { reply } = msg;
        reply.reply(self.0.clone());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_by_node_id_reaches_the_actor_on_that_node() {
    let (nodes, _) = cluster_of(3, None).await;
    for n in &nodes {
        let name = n.id().node_id.clone();
        n.cluster
            .remote()
            .register("/user/who", n.system.spawn(WhoActor(name)));
    }
    for from in &nodes {
        for to in ["n0", "n1", "n2"] {
            let r = from.cluster.lookup::<Who>("/user/who", to).unwrap();
            let got = r
                .ask(|reply| Who::Name { reply }, Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(got, to);
        }
    }
    assert!(matches!(
        nodes[0].cluster.lookup::<Who>("/user/who", "nobody"),
        Err(ClusterError::UnknownNode(id)) if id == "nobody"
    ));
    stop_all(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configurations_are_refused_at_start() {
    init_tracing();
    let system = shardik_actor::ActorSystem::new("bad");
    let err = Cluster::start(&system, config("x").seed_nodes(["nohost"]))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        ClusterError::Config(ConfigError::BadSeedAddress(_))
    ));
    assert_eq!(
        err.to_string(),
        "invalid cluster configuration: seed node address \"nohost\" is not host:port"
    );
    let ok = Cluster::start(&system, config("x")).await.unwrap();
    assert!(matches!(
        Cluster::start(&system, config("y")).await,
        Err(ClusterError::AlreadyStarted)
    ));
    ok.shutdown().await;
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_never_joins() {
    let first = start(config("a")).await;
    first.cluster.when_up().await.unwrap();
    let mut other = shardik_cluster::runtime::ClusterConfig::new("other", "intruder")
        .secret(SECRET.to_vec())
        .seed_nodes([first.id().address.clone()]);
    other.remote = other
        .remote
        .backoff(Duration::from_millis(10), Duration::from_millis(100));
    let intruder = start(other).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(2), intruder.cluster.when_up())
            .await
            .is_err()
    );
    assert_eq!(first.cluster.members().len(), 1);
    stop_all(&[first, intruder]).await;
}

/// The cluster's wire message as a stand-in seed node sees it: only the seed discovery and
/// join bodies (other bodies do not decode, and the stand-in ignores them).
#[derive(Debug, Serialize, Deserialize)]
struct SeedWire {
    from: shardik_cluster::member::UniqueAddress,
    to: Option<u64>,
    body: SeedBody,
}

#[derive(Debug, Serialize, Deserialize)]
enum SeedBody {
    InitJoin,
    InitJoinAck,
    InitJoinNack,
    Join {
        roles: std::collections::BTreeSet<String>,
    },
}

/// A seed node that says it is a member to the first `InitJoin` of the first seed node
/// (at `first`) only, and never takes anyone in: a member that stopped right after answering,
/// and came back (as the same address) as a node that is not a member.
struct AckOnce {
    me: shardik_cluster::member::UniqueAddress,
    remote: shardik_remote::Remote,
    first: String,
    acked: bool,
}

impl Actor for AckOnce {
    type Msg = SeedWire;
    async fn handle(&mut self, msg: SeedWire, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        if let SeedBody::InitJoin = msg.body {
            let body = if msg.from.address == self.first && !self.acked {
                self.acked = true;
                SeedBody::InitJoinAck
            } else {
                SeedBody::InitJoinNack
            };
            self.remote
                .lookup::<SeedWire>(shardik_cluster::runtime::PATH, &msg.from.address)
                .tell(SeedWire {
                    from: self.me.clone(),
                    to: Some(msg.from.incarnation),
                    body,
                });
        }
        Ok(())
    }
}

/// The first seed node heard "I am a member" from a seed that then never took it in, and
/// every seed answers "not a member" since: after `seed_timeout` it asks the seeds afresh
/// and, all answering "not a member", forms the cluster, which the other seed joins. Before,
/// one such answer left the first seed waiting for a member for good, and no cluster formed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_seed_whose_member_seed_vanished_forms_the_cluster() {
    let addrs = free_addrs(3);
    let seed_timeout = Duration::from_millis(1500);
    let seeded = |i: usize| {
        config(&format!("s{i}"))
            .bind(addrs[i].clone())
            .seed_nodes(addrs.clone())
            .seed_timeout(seed_timeout)
            .join_retry(Duration::from_millis(200))
    };
    // Seed 1 is the stand-in: a bare remote node at the cluster's path.
    let stand_in = shardik_actor::ActorSystem::new("s1");
    let remote = shardik_remote::Remote::start(&stand_in, seeded(1).remote.clone())
        .await
        .expect("the stand-in's remote layer starts");
    let acker = stand_in.spawn(AckOnce {
        me: shardik_cluster::member::UniqueAddress::new(remote.addr(), "s1", remote.incarnation()),
        remote: remote.clone(),
        first: addrs[0].clone(),
        acked: false,
    });
    remote.register(shardik_cluster::runtime::PATH, acker);
    let s2 = start(seeded(2)).await;
    let s0 = start(seeded(0)).await;
    let within = seed_timeout * 4 + Duration::from_secs(5);
    for n in [&s0, &s2] {
        tokio::time::timeout(within, n.cluster.when_up())
            .await
            .unwrap_or_else(|_| panic!("{} is not up: {:#?}", n.id(), n.cluster.state()))
            .expect("up");
    }
    for n in [&s0, &s2] {
        let members = n.cluster.members();
        assert_eq!(members.len(), 2, "{members:#?}");
        assert!(members.iter().all(|m| m.status == MemberStatus::Up));
    }
    stop_all(&[s0, s2]).await;
    remote.shutdown().await;
    stand_in.shutdown().await;
}

/// `n` addresses on 127.0.0.1 with ports the OS picked (free when picked), for nodes that
/// must know each other's addresses before they start.
fn free_addrs(n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        })
        .collect()
}

/// Addresses declared in `InitJoin`s by nodes that never join (here 300 addresses where
/// nothing listens) leave nothing behind: the node answers each, drops the refs it holds
/// beyond what its members and seeds warrant, gives up on the answers it cannot deliver
/// (`give_up_message_after`), and then forgets those peers. Before, the driver kept a ref
/// per address for the node's lifetime, and with it each peer, its queued answer and a
/// dialer that kept trying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_declared_in_init_joins_do_not_accumulate() {
    let (nodes, _) = cluster_with(1, |i| {
        let mut c = config(&format!("n{i}"));
        c.remote = c.remote.give_up_message_after(Duration::from_millis(200));
        c
    })
    .await;
    let n0 = &nodes[0];
    let remote = n0.cluster.remote();
    let stranger_sys = shardik_actor::ActorSystem::new("stranger");
    let stranger = shardik_remote::Remote::start(&stranger_sys, config("stranger").remote)
        .await
        .expect("the stranger's remote layer starts");
    let to_n0 = stranger.lookup::<SeedWire>(shardik_cluster::runtime::PATH, &n0.id().address);
    // Refused at once: loopback addresses with nothing on port 9.
    let ghost = |i: u32| {
        shardik_cluster::member::UniqueAddress::new(
            format!("127.0.{}.{}:9", 1 + i / 250, 1 + i % 250),
            format!("ghost{i}"),
            1,
        )
    };
    let init_joins = |from: std::ops::Range<u32>| {
        for i in from {
            to_n0.tell(SeedWire {
                from: ghost(i),
                to: None,
                body: SeedBody::InitJoin,
            });
        }
    };
    let dropped = |at_least: u64| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while remote.stats().dropped_unreachable < at_least {
            assert!(
                std::time::Instant::now() < deadline,
                "answers given up: {:?}",
                remote.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    init_joins(0..200);
    dropped(200).await;
    // New peers make the node look for unused ones.
    init_joins(200..300);
    dropped(300).await;
    let known = remote.known_peers();
    assert!(
        known < 150,
        "{known} peers known after 300 strangers: {:?}",
        remote.stats()
    );
    assert!(
        remote.stats().peers_forgotten >= 150,
        "{:?}",
        remote.stats()
    );
    stranger.shutdown().await;
    stop_all(&nodes).await;
}

/// A seed node that is leaving is still a member and takes joiners in: it answers `InitJoin`
/// with "I am a member". Seeds `[s0, s1]` and a worker; `s0` crashes and restarts while `s1`
/// is leaving (its leave waits for the crashed incarnation, which the split brain resolver
/// does not down here). Before, the leaving `s1` answered "not a member", so the restarted
/// first seed, having heard from every other seed, formed a second cluster of its own while
/// the worker and `s1` went on in the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_first_seed_joins_through_a_leaving_seed() {
    let addrs = free_addrs(2);
    let seeded = |id: &str| {
        config(id)
            .seed_nodes(addrs.clone())
            // No downing while the test runs: the crashed incarnation stays unreachable, and
            // the leave stays stuck until the restarted one replaces it.
            .stable_after(Duration::from_secs(600))
    };
    let s1 = start(seeded("s1").bind(addrs[1].clone())).await;
    let s0 = start(seeded("s0").bind(addrs[0].clone())).await;
    let worker = start(seeded("w")).await;
    let ids = [s0.id().clone(), s1.id().clone(), worker.id().clone()];
    wait_all_up([&s0, &s1, &worker], &ids, "one cluster of 3").await;
    let old_s0 = s0.id().clone();
    s0.cluster.shutdown().await;
    s0.system.shutdown().await;
    wait(
        &s1.cluster,
        "the crashed first seed unreachable",
        Duration::from_secs(15),
        |s| s.unreachable.contains(&old_s0),
    )
    .await;
    let leaving = s1.cluster.clone();
    let left = tokio::spawn(async move { leaving.leave().await });
    let s1_id = s1.id().clone();
    wait(&s1.cluster, "s1 leaving", Duration::from_secs(15), |s| {
        s.member(&s1_id)
            .is_some_and(|m| m.status == MemberStatus::Leaving)
    })
    .await;

    let restarted = start(seeded("s0").bind(addrs[0].clone())).await;
    let (new_s0, w) = (restarted.id().clone(), worker.id().clone());
    for n in [&restarted, &worker] {
        wait(
            &n.cluster,
            "the restarted first seed and the worker in one cluster",
            Duration::from_secs(20),
            |s| s.all_up(&[new_s0.clone(), w.clone()]),
        )
        .await;
    }
    // The leave completes too: the restarted incarnation replaced the crashed one.
    let why = tokio::time::timeout(Duration::from_secs(20), left)
        .await
        .expect("s1 left in time")
        .unwrap();
    assert_eq!(why, shardik_cluster::runtime::NodeStopReason::Left);
    stop_all(&[restarted, worker]).await;
    s1.system.shutdown().await;
}
