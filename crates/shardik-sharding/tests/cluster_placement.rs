//! Where the coordinator and the shards of a type run: only on nodes that host the type
//! (started it, with its role, not as a proxy). Proxy nodes and nodes of another role route
//! to the type (tell and ask) but never host a shard, and never run its coordinator.

mod cluster_util;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cluster_util::*;
use shardik_actor::ActorSystem;
use shardik_cluster::runtime::Cluster;
use shardik_sharding::cluster::ClusterSharding;
use shardik_sharding::{EntityType, Region};

const REG: Duration = Duration::from_secs(20);

fn node(
    (system, cluster, sharding): (ActorSystem, Cluster, ClusterSharding),
    region: Region<Msg>,
) -> Node {
    Node {
        system,
        cluster,
        sharding,
        region,
    }
}

/// Tells 5 numbers from every node to every id, asks each from every node where it runs
/// (all must agree, and it must be one of `hosts`), then checks every number arrived once,
/// in order.
async fn traffic(nodes: &[Node], ids: &[String], hosts: &[&str]) {
    for seq in 0..5u64 {
        for id in ids {
            for (i, n) in nodes.iter().enumerate() {
                n.region.tell(
                    id,
                    Msg::Add {
                        sender: i as u32,
                        seq,
                    },
                );
            }
        }
    }
    for id in ids {
        let mut seen = BTreeSet::new();
        for n in nodes {
            seen.insert(where_is(n, id).await);
        }
        assert_eq!(seen.len(), 1, "{id} answered from several nodes: {seen:?}");
        let home = seen.into_iter().next().unwrap();
        assert!(hosts.contains(&home.as_str()), "{id} runs on {home}");
    }
    let counts = vec![5u64; nodes.len()];
    await_streams_of(nodes, ids, &counts).await;
}

/// Every sender's numbers reached each entity once and in order (asked from the entity).
async fn await_streams_of(nodes: &[Node], ids: &[String], counts: &[u64]) {
    for id in ids {
        let got = nodes[0]
            .region
            .entity_ref(id.as_str())
            .ask(Msg::Get, ASK)
            .await
            .unwrap();
        for (s, n) in counts.iter().enumerate() {
            let seqs: Vec<u64> = got
                .iter()
                .filter(|(x, _)| *x == s as u32)
                .map(|(_, q)| *q)
                .collect();
            assert_eq!(seqs, (0..*n).collect::<Vec<_>>(), "{id} from sender {s}");
        }
    }
}

/// The oldest member never starts the type: the coordinator runs on the oldest member that
/// does (n1), tell and ask from the hosting nodes work at once, and once n0 starts the type
/// as a proxy it reaches every entity too, without ever hosting one or coordinating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_runs_on_the_oldest_member_hosting_the_type() {
    let reg = Arc::new(Registry::default());
    let m0 = start_member("n0", None, &[]).await;
    let seed = m0.1.self_node().address.clone();
    // n0 runs another entity type: it is not a host of the probe type.
    let other =
        m0.2.start_with(
            EntityType::new("other", {
                let r = reg.clone();
                move |eid: &str| Probe::new(eid, "n0", &r)
            })
            .shards(4),
            settings(),
        )
        .unwrap();
    let m1 = start_member("n1", Some(&seed), &[]).await;
    let r1 = start_probe(&m1.2, "n1", 12, &reg, settings());
    let m2 = start_member("n2", Some(&seed), &[]).await;
    let r2 = start_probe(&m2.2, "n2", 12, &reg, settings());
    let mut nodes = vec![node(m1, r1), node(m2, r2)];
    for n in &nodes {
        n.sharding.wait_registered(TYPE, REG).await.unwrap();
    }
    registered(&nodes[0], 2).await;
    assert!(nodes[1].sharding.coordinator(TYPE).is_none());
    assert!(m0.2.coordinator(TYPE).is_none());

    let ids: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
    traffic(&nodes, &ids[..10], &["n1", "n2"]).await;

    // n0 joins the type as a proxy: it routes, never hosts, never coordinates.
    let r0 = m0.2.start_proxy::<Msg>(TYPE, 12).unwrap();
    m0.2.wait_registered(TYPE, REG).await.unwrap();
    nodes.insert(0, node(m0, r0));
    registered_with_proxies(&nodes[1], 3, 1).await;
    traffic(&nodes, &ids[10..], &["n1", "n2"]).await;
    // The entities of the first round answer through n0 as well.
    for id in &ids[..10] {
        let home = where_is(&nodes[0], id).await;
        assert!(home == "n1" || home == "n2", "{id} on {home}");
    }
    assert!(nodes[0].hosted().is_empty());
    assert!(nodes[0].sharding.coordinator(TYPE).is_none());
    let snap = nodes[1].sharding.coordinator(TYPE).expect("n1 coordinates");
    for (region, shards) in snap.state.shards_per_region() {
        if region.0.contains("#n0#") {
            assert!(shards.is_empty(), "proxy n0 was given shards {shards:?}");
        }
    }
    // The other type, started on n0 only, is coordinated there and works.
    other.tell("x", Msg::Add { sender: 0, seq: 0 });
    assert_eq!(
        other.entity_ref("x").ask(Msg::Where, ASK).await.unwrap(),
        "n0"
    );
    assert!(nodes[0].sharding.coordinator("other").is_some());
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// A type restricted to the role "backend": n0 (the oldest, role "frontend") starts it like
/// the hosts but lacks the role, n3 (no role) starts it as a proxy. Shards land only on the
/// two backend nodes, the coordinator runs on the oldest backend node, and tell and ask work
/// from all four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_restricted_type_never_lands_on_proxy_or_other_role_nodes() {
    let reg = Arc::new(Registry::default());
    let backend = || settings().role("backend");
    let m0 = start_member("n0", None, &["frontend"]).await;
    let seed = m0.1.self_node().address.clone();
    let r0 = start_probe(&m0.2, "n0", 16, &reg, backend());
    let m1 = start_member("n1", Some(&seed), &["backend"]).await;
    let r1 = start_probe(&m1.2, "n1", 16, &reg, backend());
    let m2 = start_member("n2", Some(&seed), &["backend", "frontend"]).await;
    let r2 = start_probe(&m2.2, "n2", 16, &reg, backend());
    let m3 = start_member("n3", Some(&seed), &[]).await;
    let r3 = m3.2.start_proxy_with::<Msg>(TYPE, 16, backend()).unwrap();
    let nodes = vec![node(m0, r0), node(m1, r1), node(m2, r2), node(m3, r3)];
    all_up(&nodes).await;
    for n in &nodes {
        n.sharding.wait_registered(TYPE, REG).await.unwrap();
    }
    registered_with_proxies(&nodes[1], 4, 2).await;

    let ids: Vec<String> = (0..40).map(|i| format!("e{i}")).collect();
    traffic(&nodes, &ids, &["n1", "n2"]).await;

    for i in [0, 3] {
        assert!(nodes[i].hosted().is_empty(), "n{i} hosts shards");
        assert!(nodes[i].sharding.coordinator(TYPE).is_none());
        assert_eq!(nodes[i].region.stats().spawned_total, 0);
    }
    assert!(nodes[2].sharding.coordinator(TYPE).is_none());
    let snap = nodes[1].sharding.coordinator(TYPE).expect("n1 coordinates");
    let mut hosting = BTreeSet::new();
    for (region, shards) in snap.state.shards_per_region() {
        if !shards.is_empty() {
            hosting.insert(region.0.split('#').nth(1).unwrap().to_string());
        }
    }
    assert_eq!(
        hosting,
        BTreeSet::from(["n1".to_string(), "n2".to_string()])
    );
    // Every entity ever started ran on a backend node.
    for (id, homes) in reg.homes.lock().iter() {
        assert!(
            homes.iter().all(|h| h == "n1" || h == "n2"),
            "{id} ran on {homes:?}"
        );
    }
    reg.assert_single_writer();
    stop_all(&nodes).await;
}
