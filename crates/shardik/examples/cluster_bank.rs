//! The Casty bank on a two-node cluster in one process: accounts are sharded entities, the
//! deposits go through either node, and the balance is asked through the other.
//!
//! ```sh
//! cargo run -p shardik --example cluster_bank
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik::cluster::runtime::{Cluster, ClusterConfig};
use shardik::prelude::*;
use shardik::sharding::cluster::ClusterSharding;

#[derive(Serialize, Deserialize)]
enum AccountMsg {
    Deposit(u64),
    Balance(ReplyTo<u64>),
}

struct Account {
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

const SECRET: &[u8] = b"example secret, at least 32 bytes long";

async fn node(name: &str, seed: Option<String>) -> (ActorSystem, Cluster, Region<AccountMsg>) {
    let system = ActorSystem::new(name);
    let mut config = ClusterConfig::new("bank", name).secret(SECRET.to_vec());
    if let Some(seed) = seed {
        config = config.seed_nodes([seed]);
    }
    let cluster = Cluster::start(&system, config)
        .await
        .expect("cluster starts");
    cluster.when_up().await.expect("node is up");
    let accounts = ClusterSharding::get(&cluster)
        .start(EntityType::new("account", |_id: &str| Account { balance: 0 }).shards(10))
        .expect("entity type starts");
    (system, cluster, accounts)
}

#[tokio::main]
async fn main() {
    let (sys_a, cluster_a, bank_a) = node("node-a", None).await;
    let (sys_b, cluster_b, bank_b) =
        node("node-b", Some(cluster_a.self_node().address.clone())).await;

    // Deposits through either node; the account lives on exactly one of them.
    bank_a.tell("alice", AccountMsg::Deposit(100));
    bank_b.tell("alice", AccountMsg::Deposit(50));

    // Each sender's messages arrive in order: an ask through a node follows that node's
    // deposit. After one ask through each node both deposits are in.
    for bank in [&bank_a, &bank_b] {
        bank.ask("alice", AccountMsg::Balance, Duration::from_secs(5))
            .await
            .expect("balance");
    }
    let balance = bank_a
        .entity_ref("alice")
        .ask(AccountMsg::Balance, Duration::from_secs(5))
        .await
        .expect("balance");
    println!("Alice's balance: {balance}");

    // Node b hands its shards off to node a, then leaves the cluster.
    ClusterSharding::get(&cluster_b)
        .leave(Duration::from_secs(10))
        .await;
    cluster_a.shutdown().await;
    sys_b.shutdown().await;
    sys_a.shutdown().await;
}
