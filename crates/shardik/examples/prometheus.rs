//! shardik's metrics on a Prometheus endpoint: two cluster nodes in one process, a sharded
//! counter type with traffic, a third node that joins (shards move to it), then one scrape of
//! `http://<listen>/metrics` printed (the `shardik_` series).
//!
//! ```sh
//! cargo run -p shardik --example prometheus                              # scrape once, exit
//! cargo run -p shardik --example prometheus -- --listen 127.0.0.1:9898 --serve-secs 300
//! curl -s http://127.0.0.1:9898/metrics | grep ^shardik_                 # meanwhile
//! ```
//!
//! The recorder is installed before anything starts: regions register their metric handles
//! when they start, against the recorder installed then. Every metric is listed in
//! `docs/observability.md`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde::{Deserialize, Serialize};
use shardik::cluster::runtime::{Cluster, ClusterConfig};
use shardik::prelude::*;
use shardik::sharding::cluster::{ClusterSharding, ClusterShardingSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser)]
struct Args {
    /// Where the `/metrics` endpoint listens.
    #[arg(long, default_value = "127.0.0.1:9898")]
    listen: SocketAddr,
    /// How long to keep serving after the printed scrape (for `curl` or a Prometheus server).
    #[arg(long, default_value_t = 0)]
    serve_secs: u64,
}

#[derive(Serialize, Deserialize)]
enum CounterMsg {
    Add(u64),
    Get(ReplyTo<u64>),
}

struct Counter(u64);

impl Actor for Counter {
    type Msg = CounterMsg;
    async fn handle(
        &mut self,
        msg: CounterMsg,
        _ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        match msg {
            CounterMsg::Add(n) => self.0 += n,
            CounterMsg::Get(reply) => reply.reply(self.0),
        }
        Ok(())
    }
}

const SECRET: &[u8] = b"example secret, at least 32 bytes long";

async fn node(name: &str, seed: Option<String>) -> (ActorSystem, Cluster, Region<CounterMsg>) {
    let system = ActorSystem::new(name);
    let mut config = ClusterConfig::new("metrics-demo", name).secret(SECRET.to_vec());
    if let Some(seed) = seed {
        config = config.seed_nodes([seed]);
    }
    let cluster = Cluster::start(&system, config)
        .await
        .expect("cluster starts");
    cluster.when_up().await.expect("node is up");
    // Rebalance rounds every second (the default is 2 s), so the joining node gets shards
    // soon.
    let settings = ClusterShardingSettings::default().rebalance_interval(Duration::from_secs(1));
    let counters = ClusterSharding::get(&cluster)
        .start_with(
            EntityType::new("counter", |_id: &str| Counter(0)).shards(30),
            settings,
        )
        .expect("entity type starts");
    (system, cluster, counters)
}

/// `GET /metrics` over plain TCP, as a scraper does; returns the body.
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the metrics endpoint accepts");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "scrape failed: {head}");
    body.to_string()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    PrometheusBuilder::new()
        .with_http_listener(args.listen)
        // Histograms (hand-off durations, heartbeat round trips) as Prometheus histograms.
        .set_buckets(&[0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0])
        .expect("valid buckets")
        // The one histogram not in seconds: writes per persistence transaction (up to the
        // writer's `max_batch`, 1024 by default).
        .set_buckets_for_metric(
            Matcher::Full("shardik_persistence_batch_size".into()),
            &[1.0, 4.0, 16.0, 64.0, 256.0, 1024.0],
        )
        .expect("valid buckets")
        .install()
        .expect("the Prometheus exporter starts");

    let (sys_a, cluster_a, counters_a) = node("node-a", None).await;
    let seed = cluster_a.self_node().address.clone();
    let (sys_b, cluster_b, counters_b) = node("node-b", Some(seed.clone())).await;
    for i in 0..20_000u64 {
        let region = if i % 2 == 0 { &counters_a } else { &counters_b };
        region.tell(&format!("counter-{}", i % 1_000), CounterMsg::Add(1));
    }
    // An ask per counter through each node (each follows that node's adds). The counters
    // keep their counts in memory only: one whose shard moved to node-b when it joined
    // started again from zero there (persistent entities keep theirs, see
    // `cluster_bank_durable`), so the sum is not printed.
    for i in 0..1_000 {
        for region in [&counters_a, &counters_b] {
            region
                .ask(
                    &format!("counter-{i}"),
                    CounterMsg::Get,
                    Duration::from_secs(5),
                )
                .await
                .expect("a counter answers");
        }
    }
    println!("20 000 adds and 2 000 asks to 1 000 counters through two nodes");

    // A third node joins; the coordinator moves shards to it (hand-offs).
    let (sys_c, cluster_c, counters_c) = node("node-c", Some(seed)).await;
    let sharding_c = ClusterSharding::get(&cluster_c);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sharding_c
        .hosted_shards("counter")
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no shard moved to node-c"
        );
        // Keep asking so entities start on node-c once shards are there.
        let _ = counters_c
            .ask("counter-1", CounterMsg::Get, Duration::from_secs(5))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let body = scrape(args.listen).await;
    println!("scraped http://{}/metrics:", args.listen);
    for line in body.lines().filter(|l| l.starts_with("shardik_")) {
        println!("  {line}");
    }
    if args.serve_secs > 0 {
        println!("serving for {} s", args.serve_secs);
        tokio::time::sleep(Duration::from_secs(args.serve_secs)).await;
    }

    // node-c and node-b hand their shards off and leave; node-a, alone, just stops.
    for (system, cluster) in [(sys_c, cluster_c), (sys_b, cluster_b)] {
        let left = ClusterSharding::get(&cluster)
            .leave(Duration::from_secs(10))
            .await;
        if !left.handed_off() {
            eprintln!(
                "a node left before handing off {:?}: messages to those shards' entities were lost",
                left.not_handed_off
            );
        }
        system.shutdown().await;
    }
    cluster_a.shutdown().await;
    sys_a.shutdown().await;
}
