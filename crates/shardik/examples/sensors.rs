//! The single-node demo: 100 000 sensor entities in 256 shards report temperature readings.
//!
//! ```text
//! cargo run --release -p shardik --example sensors
//! cargo run --release -p shardik --example sensors -- --sensors 20000 --readings 50
//! ```
//!
//! Producer tasks `tell` readings to sensors by id; each sensor is an entity (one actor per id,
//! started on its first reading) that keeps running statistics. A progress bar follows the
//! readings the sensors have *processed*; at the end every sensor is asked for its statistics
//! and the demo checks that not one reading was lost before printing a summary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use shardik::prelude::*;

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Sensor entities on one node: readings in, statistics out")]
struct Args {
    /// Number of sensor entities.
    #[arg(long, default_value_t = 100_000)]
    sensors: usize,
    /// Readings each sensor reports.
    #[arg(long, default_value_t = 20)]
    readings: u32,
    /// Shards the sensor ids hash to.
    #[arg(long, default_value_t = 256)]
    shards: u32,
}

/// What a sensor entity understands. Serde bounds: the same messages will cross the network
/// when the entity type runs on a cluster.
#[derive(Serialize, Deserialize)]
enum SensorMsg {
    /// A temperature reading in degrees Celsius.
    Reading { celsius: f64 },
    /// Asks for the statistics so far.
    Stats(ReplyTo<SensorStats>),
}

/// Running statistics of one sensor.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SensorStats {
    count: u64,
    min: f64,
    max: f64,
    sum: f64,
}

impl SensorStats {
    fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
}

/// The entity: one per sensor id.
struct Sensor {
    stats: SensorStats,
    processed: Arc<AtomicU64>,
}

impl Actor for Sensor {
    type Msg = SensorMsg;

    async fn handle(&mut self, msg: SensorMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            SensorMsg::Reading { celsius } => {
                let s = &mut self.stats;
                s.count += 1;
                s.sum += celsius;
                s.min = s.min.min(celsius);
                s.max = s.max.max(celsius);
                self.processed.fetch_add(1, Ordering::Relaxed);
            }
            SensorMsg::Stats(reply) => reply.reply(self.stats.clone()),
        }
        Ok(())
    }
}

/// A deterministic temperature for sensor `i` at round `r`: a per-sensor base between 15 and
/// 35 °C plus a small wobble, so that the answers are the same on every run.
fn temperature(i: usize, r: u32) -> f64 {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(r).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let base = 15.0 + (i % 2000) as f64 / 100.0;
    base + ((h >> 40) % 200) as f64 / 100.0 - 1.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    if args.sensors == 0 || args.readings == 0 {
        return Err("--sensors and --readings must be at least 1".into());
    }

    let system = ActorSystem::new("sensors-demo");
    let processed = Arc::new(AtomicU64::new(0));
    let counter = processed.clone();
    let sensors = system.sharding().start(
        EntityType::new("sensor", move |_id: &str| Sensor {
            stats: SensorStats {
                count: 0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
                sum: 0.0,
            },
            processed: counter.clone(),
        })
        .shards(args.shards)
        .idle_timeout(Duration::from_secs(300)),
    )?;

    let ids: Arc<Vec<String>> = Arc::new(
        (0..args.sensors)
            .map(|i| format!("sensor-{i:06}"))
            .collect(),
    );
    let total = args.sensors as u64 * u64::from(args.readings);
    println!(
        "shardik sensors demo: {} sensors in {} shards, {} readings each ({} in all)",
        args.sensors, args.shards, args.readings, total
    );

    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner:.green} [{elapsed_precise}] [{wide_bar:.cyan/blue}] {human_pos}/{human_len} readings ({per_sec})",
        )?
        .progress_chars("=> "),
    );

    // Producers: each owns a slice of the sensors and reports round by round.
    let started = Instant::now();
    let producers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut tasks = Vec::with_capacity(producers);
    for p in 0..producers {
        let sensors = sensors.clone();
        let ids = ids.clone();
        let rounds = args.readings;
        tasks.push(tokio::spawn(async move {
            let mine: Vec<usize> = (p..ids.len()).step_by(producers).collect();
            for r in 0..rounds {
                for (n, &i) in mine.iter().enumerate() {
                    sensors.tell(
                        &ids[i],
                        SensorMsg::Reading {
                            celsius: temperature(i, r),
                        },
                    );
                    if n % 4096 == 4095 {
                        // Let the entities run between bursts instead of queueing everything.
                        tokio::task::yield_now().await;
                    }
                }
            }
            started.elapsed()
        }));
    }

    // Until every reading is processed, or the count stops moving for 10 s (readings were
    // lost: the check after the summary says how many) instead of waiting forever.
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    let mut last = (0, Instant::now());
    loop {
        let done = processed.load(Ordering::Relaxed);
        bar.set_position(done);
        if done >= total {
            break;
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(10) {
            break;
        }
        ticker.tick().await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    let mut sent = Duration::ZERO;
    for task in tasks {
        sent = sent.max(task.await?);
    }

    // Ask every sensor for its statistics, many asks in flight at once.
    let ask_started = Instant::now();
    let mut all = Vec::with_capacity(args.sensors);
    for chunk in ids.chunks(1024) {
        let asks = chunk.iter().map(|id| {
            let sensors = sensors.clone();
            let id = id.clone();
            tokio::spawn(async move {
                let stats = sensors
                    .ask(&id, SensorMsg::Stats, Duration::from_secs(10))
                    .await;
                (id, stats)
            })
        });
        let asks: Vec<_> = asks.collect();
        for ask in asks {
            let (id, stats) = ask.await?;
            all.push((id, stats?));
        }
    }
    let asked = ask_started.elapsed();

    let counted: u64 = all.iter().map(|(_, s)| s.count).sum();
    let short: Vec<&String> = all
        .iter()
        .filter(|(_, s)| s.count != u64::from(args.readings))
        .map(|(id, _)| id)
        .collect();
    let hottest = all
        .iter()
        .max_by(|a, b| a.1.mean().total_cmp(&b.1.mean()))
        .expect("at least one sensor");
    let coldest = all
        .iter()
        .min_by(|a, b| a.1.mean().total_cmp(&b.1.mean()))
        .expect("at least one sensor");
    let per_shard = sensors.shard_entity_counts();
    let busiest = per_shard.iter().copied().max().unwrap_or(0);
    let quietest = per_shard.iter().copied().min().unwrap_or(0);
    let stats = sensors.stats();

    let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    println!();
    println!("summary");
    println!("{}", "-".repeat(63));
    row("sensor entities started", stats.spawned_total.to_string());
    row("live entities", stats.active_entities.to_string());
    row(
        "shards with entities",
        format!("{} of {}", stats.active_shards, stats.shards),
    );
    row(
        "entities per shard (min / max)",
        format!("{quietest} / {busiest}"),
    );
    row("readings sent", total.to_string());
    row("readings processed", counted.to_string());
    row(
        "time to send (tell)",
        format!("{:.2} s", sent.as_secs_f64()),
    );
    row(
        "time until all processed",
        format!("{:.2} s", elapsed.as_secs_f64()),
    );
    row(
        "throughput",
        format!("{:.0} readings/s", rate(total, elapsed)),
    );
    row(
        "stats asks answered",
        format!("{} in {:.2} s", all.len(), asked.as_secs_f64()),
    );
    row(
        "ask throughput",
        format!("{:.0} asks/s", rate(all.len() as u64, asked)),
    );
    row(
        "hottest sensor",
        format!("{} ({:.2} °C mean)", hottest.0, hottest.1.mean()),
    );
    row(
        "coldest sensor",
        format!("{} ({:.2} °C mean)", coldest.0, coldest.1.mean()),
    );
    row("messages refused", stats.rejected_total.to_string());
    row("dead letters", system.dead_letters().total().to_string());

    system.shutdown().await;
    if counted != total || !short.is_empty() {
        return Err(format!(
            "lost readings: processed {counted} of {total}; {} sensors short (first: {:?})",
            short.len(),
            short.first()
        )
        .into());
    }
    println!("\nevery reading was processed exactly once by its sensor entity");
    Ok(())
}

fn row(label: &str, value: String) {
    println!("{label:<32} {value:>30}");
}
