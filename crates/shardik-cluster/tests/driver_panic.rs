//! A panic of the driver task (a bug) stops the node visibly: it is published as stopped and
//! fenced, so that `leave`, `when_up` and whatever watches `fenced` (shard regions,
//! singletons) do not wait for good while local work goes on. The panic is injected from
//! outside the production code: a tracing layer that panics on one of the driver's log
//! events. The test runs on a current-thread runtime, so the driver task runs on the thread
//! where that layer is the default subscriber.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardik_actor::ActorSystem;
use shardik_cluster::runtime::{Cluster, ClusterConfig, ClusterError, Event, NodeStopReason};
use tracing::field::{Field, Visit};
use tracing::{Event as TraceEvent, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Panics on the event whose message is `panic_on`; records every event's level and message.
struct PanicOn {
    panic_on: &'static str,
    seen: Arc<Mutex<Vec<(Level, String)>>>,
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for PanicOn {
    fn on_event(&self, event: &TraceEvent<'_>, _ctx: Context<'_, S>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        self.seen
            .lock()
            .unwrap()
            .push((*event.metadata().level(), m.0.clone()));
        if m.0 == self.panic_on {
            panic!("injected: the driver panics while it logs {:?}", m.0);
        }
    }
}

#[tokio::test]
async fn a_driver_that_panics_publishes_the_node_stopped_and_fenced() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(PanicOn {
        panic_on: "leaving the cluster",
        seen: seen.clone(),
    }));
    let system = ActorSystem::new("n");
    let cluster = Cluster::start(&system, ClusterConfig::new("c", "n"))
        .await
        .expect("starts");
    // No seed nodes: it forms a cluster of its own at once.
    cluster.when_up().await.expect("up");
    let mut events = cluster.subscribe();
    // The driver panics handling the leave. Before, nothing published the stop and this
    // waited for good.
    let why = tokio::time::timeout(Duration::from_secs(10), cluster.leave())
        .await
        .expect("leave returns once the driver panicked");
    assert_eq!(why, NodeStopReason::DriverFailed);
    let state = cluster.state();
    assert_eq!(state.stopped, Some(NodeStopReason::DriverFailed));
    assert!(state.fenced, "{state:?}");
    loop {
        match events.recv().await.expect("events until Stopped") {
            Event::Stopped(r) => {
                assert_eq!(r, NodeStopReason::DriverFailed);
                break;
            }
            Event::Cluster(_) => {}
        }
    }
    assert!(matches!(
        cluster.when_up().await,
        Err(ClusterError::Stopped(NodeStopReason::DriverFailed))
    ));
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|(level, m)| *level == Level::ERROR
                && m.contains("the cluster driver panicked: injected")),
        "no error logged: {:?}",
        seen.lock().unwrap()
    );
    system.shutdown().await;
}
