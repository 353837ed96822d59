//! The seed systems' account entity (deposit, get balance), the node configuration of the
//! suite, and the entity ids it uses.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik::cluster::runtime::ClusterConfig;
use shardik::prelude::*;
use shardik::shard_of;
use shardik::sharding::cluster::ClusterSharding;
use shardik_cluster::runtime::Cluster;

use crate::harness::Countdown;

/// Cluster name of the benchmark nodes.
pub const CLUSTER: &str = "bench-sharding";
/// Shared secret of the benchmark nodes.
pub const SECRET: &[u8] = b"shardik-bench sharding suite secret, 32+ bytes";
/// Name of the account entity type.
pub const ACCOUNT: &str = "account";

/// The account entity's messages.
#[derive(Debug, Serialize, Deserialize)]
pub enum AccountMsg {
    /// Adds to the balance (a tell).
    Deposit(u64),
    /// Answers the balance.
    Balance(ReplyTo<u64>),
}

/// One account.
pub struct Account {
    balance: u64,
}

impl Actor for Account {
    type Msg = AccountMsg;

    async fn handle(
        &mut self,
        msg: AccountMsg,
        _ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        match msg {
            AccountMsg::Deposit(n) => self.balance += n,
            AccountMsg::Balance(reply) => reply.reply(self.balance),
        }
        Ok(())
    }
}

/// The account entity type with `shards` shards.
pub fn account_type(shards: u32) -> EntityType<Account> {
    EntityType::new(ACCOUNT, |_id: &str| Account { balance: 0 }).shards(shards)
}

/// An entity that records its start in a countdown (the activation benchmark).
pub struct Activated {
    started: Arc<Countdown>,
}

impl Actor for Activated {
    type Msg = AccountMsg;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.started.hit();
        Ok(())
    }

    async fn handle(
        &mut self,
        msg: AccountMsg,
        _ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        if let AccountMsg::Balance(reply) = msg {
            reply.reply(0);
        }
        Ok(())
    }
}

/// An entity type of [`Activated`] entities that count down `started`.
pub fn activated_type(shards: u32, started: Arc<Countdown>) -> EntityType<Activated> {
    EntityType::new("activated", move |_id: &str| Activated {
        started: started.clone(),
    })
    .shards(shards)
}

/// A node configuration of the suite: default cluster timing, loopback port 0.
pub fn node_config(node_id: &str) -> ClusterConfig {
    let mut c = ClusterConfig::new(CLUSTER, node_id).secret(SECRET.to_vec());
    c.remote = c
        .remote
        .backoff(Duration::from_millis(10), Duration::from_millis(500));
    c
}

/// A cluster node in this process: joins `seed` (or forms the cluster), waits until `Up`,
/// starts the account type with `shards` shards.
pub async fn start_node(
    node_id: &str,
    seed: Option<&str>,
    shards: u32,
) -> (ActorSystem, Cluster, Region<AccountMsg>) {
    let system = ActorSystem::new(node_id.to_string());
    let mut cfg = node_config(node_id);
    if let Some(seed) = seed {
        cfg = cfg.seed_nodes([seed.to_string()]);
    }
    let cluster = Cluster::start(&system, cfg)
        .await
        .expect("a benchmark node starts");
    cluster.when_up().await.expect("the node joins");
    let region = ClusterSharding::get(&cluster)
        .start(account_type(shards))
        .expect("the account type starts");
    (system, cluster, region)
}

/// One entity id per shard: `acct-<i>` for the smallest `i` landing on each of the `shards`
/// shards, in shard order, so "N entities on N shards" holds exactly.
pub fn one_id_per_shard(shards: u32) -> Vec<&'static str> {
    let mut ids: Vec<Option<&'static str>> = vec![None; shards as usize];
    let mut left = shards as usize;
    let mut i = 0u64;
    while left > 0 {
        let id = format!("acct-{i}");
        let s = shard_of(&id, shards) as usize;
        if ids[s].is_none() {
            ids[s] = Some(Box::leak(id.into_boxed_str()));
            left -= 1;
        }
        i += 1;
    }
    ids.into_iter().map(|id| id.expect("filled")).collect()
}

/// Asks `id`'s balance, retrying (with `per_try` each) until it answers or `deadline` passes.
pub async fn balance(
    region: &Region<AccountMsg>,
    id: &str,
    per_try: Duration,
    deadline: Duration,
) -> u64 {
    let start = std::time::Instant::now();
    loop {
        match region.ask(id, AccountMsg::Balance, per_try).await {
            Ok(b) => return b,
            Err(e) if start.elapsed() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("entity {id} did not answer within {deadline:?}: {e}"),
        }
    }
}
