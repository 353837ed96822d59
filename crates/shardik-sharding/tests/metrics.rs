//! What the actor, cluster and sharding layers report through the `metrics` crate, read the way
//! an operator reads it: rendered by the Prometheus exporter. (Its own test binary: the
//! recorder is process-wide and must be installed before any region starts, since regions
//! register their metric handles when they start; its tests run one at a time.)

mod cluster_util;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cluster_util::*;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, AskError, Context, ReplyTo};
use shardik_sharding::{shard_of, EntityType, ShardingExt};

/// The tests of this binary run one at a time: they read the same global recorder.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The global recorder, installed by the first test that asks.
fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.01, 0.1, 1.0, 10.0])
            .expect("valid buckets")
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// The value of the series `name` whose labels include `labels`, in the exposition format
/// `render` (summed if several series match), or `None` if none does.
fn value(render: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in render.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, v)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let have: BTreeSet<(&str, &str)> = series_labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|l| have.contains(l)) {
            let v: f64 = v.parse().expect("a numeric sample");
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

#[derive(Serialize, Deserialize)]
enum Cmd {
    Ping(ReplyTo<u32>),
    Stop,
    /// Keeps the reply handle without answering (the ask times out).
    Hold(ReplyTo<u32>),
}

struct Metered {
    held: Vec<ReplyTo<u32>>,
}

impl Actor for Metered {
    type Msg = Cmd;
    async fn handle(&mut self, msg: Cmd, ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Cmd::Ping(r) => r.reply(1),
            Cmd::Stop => ctx.stop(),
            Cmd::Hold(r) => self.held.push(r),
        }
        Ok(())
    }
}

/// Live incarnations go up as entities start and down as they stop; every start is counted;
/// an ask that times out is counted by the way it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entity_incarnations_and_ask_timeouts_are_reported() {
    let _serial = SERIAL.lock().await;
    let metrics = prometheus();
    let system = ActorSystem::new("metrics");
    let region = system
        .sharding()
        .start(EntityType::new("metered", |_id: &str| Metered { held: Vec::new() }).shards(8))
        .expect("the type starts");
    let ty = [("entity_type", "metered")];
    for i in 0..10 {
        let id = format!("e{i}");
        assert_eq!(region.ask(&id, Cmd::Ping, ASK).await, Ok(1));
    }
    let text = metrics.render();
    assert_eq!(value(&text, "shardik_sharding_entities", &ty), Some(10.0));
    assert_eq!(
        value(&text, "shardik_sharding_entity_starts_total", &ty),
        Some(10.0)
    );

    // `e0` stops itself; the ping after it waits for the termination and starts the next
    // incarnation, so by its answer the first one has been counted out.
    region.tell("e0", Cmd::Stop);
    assert_eq!(region.ask("e0", Cmd::Ping, ASK).await, Ok(1));
    let text = metrics.render();
    assert_eq!(value(&text, "shardik_sharding_entities", &ty), Some(10.0));
    assert_eq!(
        value(&text, "shardik_sharding_entity_starts_total", &ty),
        Some(11.0)
    );

    let before = value(
        &metrics.render(),
        "shardik_ask_timeouts_total",
        &[("via", "region")],
    )
    .unwrap_or(0.0);
    assert_eq!(
        region.ask("e1", Cmd::Hold, Duration::from_millis(20)).await,
        Err(AskError::Timeout(Duration::from_millis(20)))
    );
    let text = metrics.render();
    assert_eq!(
        value(&text, "shardik_ask_timeouts_total", &[("via", "region")]),
        Some(before + 1.0)
    );

    system.shutdown().await;
    let text = metrics.render();
    assert_eq!(
        value(&text, "shardik_sharding_entities", &ty),
        Some(0.0),
        "the shutdown stopped every entity"
    );
}

const SHARDS: u32 = 12;

/// The cluster gauges show each node's view of the membership; each region reports the shards
/// it hosts, and a rebalance to a joining node shows up as hand-offs with their durations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_shards_and_hand_offs_are_reported() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let metrics = prometheus();
    let reg = Arc::new(Registry::default());
    let mut nodes = cluster_of(2, SHARDS, &reg).await;
    // `all_up` returned once both nodes published a view with both up, and a node records
    // its gauges as it publishes.
    let text = metrics.render();
    for node in ["n0", "n1"] {
        let up = [("node", node), ("status", "up")];
        assert_eq!(value(&text, "shardik_cluster_members", &up), Some(2.0));
        let joining = [("node", node), ("status", "joining")];
        assert_eq!(value(&text, "shardik_cluster_members", &joining), Some(0.0));
        assert_eq!(
            value(
                &text,
                "shardik_cluster_unreachable_members",
                &[("node", node)]
            ),
            Some(0.0)
        );
        assert_eq!(
            value(&text, "shardik_cluster_fenced", &[("node", node)]),
            Some(0.0)
        );
        // Gossip and heartbeats flow over one control connection per pair.
        assert_eq!(
            value(
                &text,
                "shardik_remote_connections",
                &[("node", node), ("lane", "control")]
            ),
            Some(1.0)
        );
        assert!(value(
            &text,
            "shardik_remote_connections_established_total",
            &[("node", node)]
        )
        .is_some_and(|n| n >= 1.0));
    }
    assert_eq!(
        value(&text, "shardik_cluster_is_leader", &[]),
        Some(1.0),
        "exactly one leader"
    );

    // Allocate shards by asking entities in them.
    let ids: Vec<String> = (0..40).map(|i| format!("id{i}")).collect();
    for id in &ids {
        where_is(&nodes[0], id).await;
    }
    let used: BTreeSet<u32> = ids.iter().map(|id| shard_of(id, SHARDS)).collect();
    let hosted = |node: &str| {
        value(
            &metrics.render(),
            "shardik_sharding_shards_hosted",
            &[("entity_type", TYPE), ("node", node)],
        )
        .unwrap_or(0.0)
    };
    // A region records its count at the end of each change of its state (no event reports
    // it across nodes): polled.
    poll("the hosted gauges add up", Duration::from_secs(20), || {
        hosted("n0") + hosted("n1") == used.len() as f64
    })
    .await;

    // One coordinator, whose state has every used shard allocated (it records its gauges
    // after acting on an event, so just after the regions heard of it: polled).
    let coordinator =
        |name: &str| value(&metrics.render(), name, &[("entity_type", TYPE)]).unwrap_or(0.0);
    poll("the coordinator's gauges", Duration::from_secs(20), || {
        coordinator("shardik_sharding_coordinator_active") == 1.0
            && coordinator("shardik_sharding_shards_allocated") == used.len() as f64
    })
    .await;

    // A third node joins: the coordinator moves shards to it, each a hand-off.
    let seed = nodes[0].id().address.clone();
    nodes.push(start_node("n2", Some(&seed), SHARDS, &reg).await);
    all_up(&nodes).await;
    poll("shards moved to n2", Duration::from_secs(30), || {
        hosted("n2") > 0.0
    })
    .await;
    let text = metrics.render();
    let handoffs: f64 = ["n0", "n1"]
        .iter()
        .map(|n| {
            value(
                &text,
                "shardik_sharding_handoffs_total",
                &[("entity_type", TYPE), ("node", n)],
            )
            .unwrap_or(0.0)
        })
        .sum();
    assert!(handoffs >= 1.0, "hand-offs counted: {handoffs}");
    let timed = value(
        &text,
        "shardik_sharding_handoff_seconds_count",
        &[("entity_type", TYPE)],
    )
    .unwrap_or(0.0);
    assert!(
        timed >= 1.0 && timed <= handoffs,
        "{timed} hand-offs timed of {handoffs}"
    );
    let text = metrics.render();
    assert_eq!(
        value(
            &text,
            "shardik_cluster_members",
            &[("node", "n2"), ("status", "up")]
        ),
        Some(3.0)
    );
    assert!(
        value(
            &text,
            "shardik_cluster_member_events_total",
            &[("node", "n0"), ("event", "up")]
        )
        .is_some_and(|n| n >= 3.0),
        "n0 saw three members come up:\n{text}"
    );
    stop_all(&nodes).await;
}
