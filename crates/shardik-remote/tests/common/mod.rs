//! Shared helpers for the multi-node tests: nodes on 127.0.0.1 port 0 and a few actors.
#![allow(dead_code)]

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, Context, ReplyTo};
use shardik_remote::{Remote, RemoteConfig, RemoteEvent};
use tokio::sync::mpsc;

pub const SECRET: &[u8] = b"test secret: 32 bytes or more....";
pub const T: Duration = Duration::from_secs(5);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A test configuration: fast backoff, the shared test secret, cluster "test".
pub fn config(node_id: &str) -> RemoteConfig {
    RemoteConfig::new("test", node_id)
        .secret(SECRET.to_vec())
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
}

pub async fn node_with(config: RemoteConfig) -> (ActorSystem, Remote) {
    init_tracing();
    let system = ActorSystem::new(config.node_id.clone());
    let remote = Remote::start(&system, config).await.expect("remote starts");
    (system, remote)
}

pub async fn node(node_id: &str) -> (ActorSystem, Remote) {
    node_with(config(node_id)).await
}

/// The protocol of the echo actor.
#[derive(Debug, Serialize, Deserialize)]
pub enum Echo {
    /// Answers `n + 1`.
    Inc { n: u64, reply: ReplyTo<u64> },
    /// Forwards `(from, n)` to the test's channel.
    Record { from: u32, n: u64 },
    /// Drops the reply handle without answering.
    Ignore { reply: ReplyTo<u64> },
}

/// Answers `Inc`, reports `Record` on a channel.
pub struct EchoActor {
    pub seen: mpsc::UnboundedSender<(u32, u64)>,
}

impl Actor for EchoActor {
    type Msg = Echo;
    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Echo::Inc { n, reply } => reply.reply(n + 1),
            Echo::Record { from, n } => {
                let _ = self.seen.send((from, n));
            }
            Echo::Ignore { reply } => drop(reply),
        }
        Ok(())
    }
}

/// Spawns an echo actor registered at `/user/echo`; returns the channel of recorded messages.
pub fn echo(system: &ActorSystem, remote: &Remote) -> mpsc::UnboundedReceiver<(u32, u64)> {
    let (tx, rx) = mpsc::unbounded_channel();
    remote.register("/user/echo", system.spawn(EchoActor { seen: tx }));
    rx
}

/// Waits for the first event matching `pred`.
pub async fn wait_event(
    events: &mut tokio::sync::broadcast::Receiver<RemoteEvent>,
    pred: impl Fn(&RemoteEvent) -> bool,
) -> RemoteEvent {
    tokio::time::timeout(T, async {
        loop {
            match events.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await
    .expect("event within the timeout")
}

/// The next value from `rx`, failing the test if none comes within [`T`].
pub async fn next<V>(rx: &mut mpsc::UnboundedReceiver<V>) -> V {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("a value within the timeout")
        .expect("channel open")
}
