//! Cluster sharding over real TCP, three nodes in one process: tell and ask from every node,
//! each entity on exactly one node, per-sender order, and the coordinator state replicated.

mod cluster_util;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cluster_util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tell_and_ask_from_every_node_reach_the_one_incarnation() {
    let reg = Arc::new(Registry::default());
    let nodes = cluster_of(3, 12, &reg).await;
    let ids: Vec<String> = (0..30).map(|i| format!("e{i}")).collect();

    // Every node sends to every entity: sender = node index, 20 numbers each, interleaved.
    for seq in 0..20u64 {
        for id in &ids {
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
    // Ask from every node: all agree where each entity lives.
    let mut placement: HashMap<String, String> = HashMap::new();
    for id in &ids {
        let mut seen = BTreeSet::new();
        for n in &nodes {
            seen.insert(where_is(n, id).await);
        }
        assert_eq!(seen.len(), 1, "{id} answered from several nodes: {seen:?}");
        placement.insert(id.clone(), seen.into_iter().next().unwrap());
    }
    // Everything told before the asks was handled (asks follow the tells per sender), in order.
    for id in &ids {
        let got = nodes[0]
            .region
            .entity_ref(id.as_str())
            .ask(Msg::Get, ASK)
            .await
            .unwrap();
        for s in 0..3u32 {
            let seqs: Vec<u64> = got
                .iter()
                .filter(|(x, _)| *x == s)
                .map(|(_, q)| *q)
                .collect();
            assert_eq!(seqs, (0..20).collect::<Vec<_>>(), "{id} from sender {s}");
        }
        reg.assert_stream(id, &[0, 1, 2], 20);
    }
    // Exactly one node per entity, ever; every node hosts something.
    for (id, homes) in reg.homes.lock().iter() {
        assert_eq!(homes.len(), 1, "{id} started more than once: {homes:?}");
        assert_eq!(&homes[0], &placement[id]);
    }
    let hosts: BTreeSet<&String> = placement.values().collect();
    assert_eq!(hosts.len(), 3, "entities on every node: {placement:?}");
    // Shards hosted by the nodes are disjoint.
    let mut all = BTreeSet::new();
    for n in &nodes {
        for s in n.hosted() {
            assert!(all.insert(s), "shard {s} hosted twice");
        }
    }
    reg.assert_single_writer();

    // The coordinator runs on the oldest node, and its state is on every replica's majority.
    let snap = nodes[0]
        .sharding
        .coordinator(TYPE)
        .expect("coordinator on n0");
    assert_eq!(shardik_sharding::coordination::epoch_round(snap.epoch), 1);
    assert_eq!(snap.state.shards.len(), all.len());
    assert!(nodes[1].sharding.coordinator(TYPE).is_none());
    stop_all(&nodes).await;
}

/// A node that starts the type with another shard count is refused by the coordinator:
/// `wait_registered` (and `refusal`) name both shard counts in a typed error, and its region
/// refuses every message from then on (`TellError::Stopped`; an ask fails as
/// `Undeliverable` with the refusal's text), instead of homing entities twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_count_mismatch_is_refused() {
    use shardik_sharding::ShardingError;
    let reg = Arc::new(Registry::default());
    let n0 = start_node("n0", None, 12, &reg).await;
    let seed = n0.id().address.clone();
    let n1 = start_node("n1", Some(&seed), 13, &reg).await;
    // Asked before n1's region has an answer from the coordinator: the message waits in the
    // region's buffer until the refusal, which fails it (it used to wait there for good, and
    // the ask ran out its timeout).
    let early = tokio::spawn({
        let region = n1.region.clone();
        async move {
            region
                .ask("y", Msg::Get, std::time::Duration::from_secs(60))
                .await
        }
    });
    let nodes = vec![n0, n1];
    all_up(&nodes).await;
    let wait = std::time::Duration::from_secs(20);
    nodes[0].sharding.wait_registered(TYPE, wait).await.unwrap();
    let err = nodes[1]
        .sharding
        .wait_registered(TYPE, wait)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ShardingError::ShardCountMismatch {
            name: TYPE.to_string(),
            coordinator: 12,
            this_node: 13,
        }
    );
    let text = err.to_string();
    assert!(text.contains("12") && text.contains("13"), "{text}");
    assert_eq!(nodes[1].sharding.refusal(TYPE), Some(err));
    assert_eq!(nodes[0].sharding.refusal(TYPE), None);
    poll("n1 refused", std::time::Duration::from_secs(20), || {
        matches!(
            nodes[1]
                .region
                .try_tell("x", Msg::Add { sender: 0, seq: 0 }),
            Err(shardik_actor::TellError::Stopped(_))
        )
    })
    .await;
    // An ask through it says why (it said "the recipient actor has stopped").
    match nodes[1]
        .region
        .ask("x", Msg::Get, std::time::Duration::from_secs(5))
        .await
    {
        Err(shardik_actor::AskError::Undeliverable(why)) => {
            assert!(why.contains("shard count mismatch"), "{why}")
        }
        other => panic!("expected Undeliverable, got {other:?}"),
    }
    match early.await.unwrap() {
        Err(shardik_actor::AskError::Undeliverable(why)) => {
            assert!(why.contains("shard count mismatch"), "{why}")
        }
        other => panic!("expected the early ask Undeliverable, got {other:?}"),
    }
    // n0 still works, and hosts everything.
    assert_eq!(where_is(&nodes[0], "x").await, "n0");
    let snap = nodes[0].sharding.coordinator(TYPE).unwrap();
    assert_eq!(snap.state.regions.len(), 1);
    stop_all(&nodes).await;
}

/// Three entity types side by side on three nodes: each has its own coordinator state (its
/// own epoch and versions) and routing of one never disturbs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_entity_types_side_by_side() {
    use shardik_sharding::EntityType;
    let reg = Arc::new(Registry::default());
    let nodes = cluster_of(3, 12, &reg).await;
    let mut regions = Vec::new();
    for n in &nodes {
        let mut per_node = vec![n.region.clone()];
        for t in ["probe-b", "probe-c"] {
            let node = n.name();
            let r = reg.clone();
            per_node.push(
                n.sharding
                    .start_with(
                        EntityType::new(t, move |eid: &str| Probe::new(eid, &node, &r)).shards(7),
                        settings(),
                    )
                    .unwrap(),
            );
        }
        regions.push(per_node);
    }
    for (t, name) in ["probe", "probe-b", "probe-c"].iter().enumerate() {
        for (i, node_regions) in regions.iter().enumerate() {
            for e in 0..10 {
                let id = format!("{name}-{e}");
                node_regions[t].tell(
                    &id,
                    Msg::Add {
                        sender: i as u32,
                        seq: 0,
                    },
                );
                let got = node_regions[t]
                    .entity_ref(id.as_str())
                    .ask(Msg::Get, ASK)
                    .await
                    .unwrap_or_else(|err| panic!("{id} through n{i}: {err}"));
                assert_eq!(got.len(), i + 1, "{id}: one message from each node so far");
            }
        }
    }
    for name in ["probe", "probe-b", "probe-c"] {
        let snap = nodes[0]
            .sharding
            .coordinator(name)
            .expect("n0 coordinates every type");
        assert_eq!(shardik_sharding::coordination::epoch_round(snap.epoch), 1);
        assert_eq!(snap.state.regions.len(), 3, "{name}");
        let want = if name == "probe" { 12 } else { 7 };
        assert_eq!(snap.state.shard_count, want);
    }
    assert_eq!(
        nodes[1].sharding.type_names(),
        vec!["probe", "probe-b", "probe-c"]
    );
    reg.assert_single_writer();
    stop_all(&nodes).await;
}

/// An entity type started on a node before it is a member works once the node is `Up`
/// (messages sent meanwhile wait in the region's buffers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_started_before_the_node_joined() {
    use shardik_actor::ActorSystem;
    use shardik_cluster::runtime::Cluster;
    use shardik_sharding::cluster::ClusterSharding;
    use shardik_sharding::EntityType;
    let reg = Arc::new(Registry::default());
    let n0 = start_node("n0", None, 12, &reg).await;
    let system = ActorSystem::new("n1");
    let cluster = Cluster::start(&system, config("n1").seed_nodes([n0.id().address.clone()]))
        .await
        .unwrap();
    let sharding = ClusterSharding::get(&cluster);
    let r = reg.clone();
    let region = sharding
        .start_with(
            EntityType::new(TYPE, move |eid: &str| Probe::new(eid, "n1", &r)).shards(12),
            settings(),
        )
        .unwrap();
    // Sent before n1 is a member: buffered until it registered with the coordinator.
    region.tell("early", Msg::Add { sender: 7, seq: 0 });
    let got = region.entity_ref("early").ask(Msg::Get, ASK).await.unwrap();
    assert_eq!(got, vec![(7, 0)]);
    let n1 = Node {
        system,
        cluster,
        sharding,
        region,
    };
    reg.assert_single_writer();
    stop_all(&[n0, n1]).await;
}

/// Settings that would stop the type's tasks after it started (a zero `tick` panicked
/// tokio's interval inside them: the region never routed and no error said why) are refused
/// by `start_with` and `start_proxy_with`, with the setting named; the name stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_cluster_settings_are_refused_at_start() {
    use shardik_sharding::{EntityType, ShardingError};
    let (system, cluster, sharding) = start_member("n0", None, &[]).await;
    let reg = Arc::new(Registry::default());
    let bad = shardik_sharding::cluster::ClusterShardingSettings {
        tick: std::time::Duration::ZERO,
        ..settings()
    };
    let r = reg.clone();
    let entity = EntityType::new(TYPE, move |eid: &str| Probe::new(eid, "n0", &r)).shards(12);
    match sharding.start_with(entity, bad.clone()) {
        Err(ShardingError::InvalidSettings { name, problem }) => {
            assert_eq!(name, TYPE);
            assert!(problem.contains("tick"), "{problem}");
        }
        other => panic!("expected InvalidSettings, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        sharding.start_proxy_with::<Msg>(TYPE, 12, bad),
        Err(ShardingError::InvalidSettings { .. })
    ));
    let region = start_probe(&sharding, "n0", 12, &reg, settings());
    let got = region.entity_ref("a").ask(Msg::Get, ASK).await.unwrap();
    assert!(got.is_empty());
    drop(region);
    cluster.shutdown().await;
    system.shutdown().await;
}
