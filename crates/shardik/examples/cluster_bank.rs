//! The Casty bank on a two-node cluster: accounts are sharded entities, the deposits go
//! through either node, and the balance is asked through the other.
//!
//! ```sh
//! cargo run -p shardik --example cluster_bank                  # two nodes in one process
//! cargo run -p shardik --example cluster_bank -- --processes   # two OS processes
//! ```
//!
//! With `--processes` this process is node-a and starts node-b as a child process of the same
//! program: node-b deposits 50 through its own region, node-a deposits 100 through its own,
//! and node-a asks for the balance.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

use serde::{Deserialize, Serialize};
use shardik::cluster::runtime::{Cluster, ClusterConfig};
use shardik::prelude::*;
use shardik::sharding::cluster::{ClusterSharding, Left};

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

/// Says so if `node` left before it had handed every shard off (their messages were lost).
fn report_leave(node: &str, left: &Left) {
    if !left.handed_off() {
        eprintln!(
            "{node} left before handing off {:?}: messages to those shards' entities were lost",
            left.not_handed_off
        );
    }
}

async fn balance(bank: &Region<AccountMsg>) -> u64 {
    bank.entity_ref("alice")
        .ask(AccountMsg::Balance, Duration::from_secs(5))
        .await
        .expect("balance")
}

/// node-b as a child process: deposits 50, says so on stdout, and serves until its parent
/// closes stdin.
async fn child(seed: String) {
    let (sys_b, cluster_b, bank_b) = node("node-b", Some(seed)).await;
    bank_b.tell("alice", AccountMsg::Deposit(50));
    // The ask through the same node follows the deposit: once it is answered, it is in.
    balance(&bank_b).await;
    println!("deposited");
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while stdin.read(&mut buf).await.unwrap_or(0) > 0 {}
    let left = ClusterSharding::get(&cluster_b)
        .leave(Duration::from_secs(10))
        .await;
    report_leave("node-b", &left);
    sys_b.shutdown().await;
}

async fn two_processes() {
    let (sys_a, cluster_a, bank_a) = node("node-a", None).await;
    let mut node_b = Command::new(std::env::current_exe().expect("own path"))
        .args(["--child", &cluster_a.self_node().address])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node-b starts");
    bank_a.tell("alice", AccountMsg::Deposit(100));
    let mut lines = BufReader::new(node_b.stdout.take().expect("piped")).lines();
    let said = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("node-b deposits within 30 s")
        .expect("node-b's output");
    assert_eq!(said.as_deref(), Some("deposited"));
    println!("Alice's balance: {}", balance(&bank_a).await);
    // Closing node-b's stdin makes it hand its shards off and leave.
    drop(node_b.stdin.take());
    node_b.wait().await.expect("node-b exits");
    cluster_a.shutdown().await;
    sys_a.shutdown().await;
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => one_process().await,
        ["--processes"] => two_processes().await,
        ["--child", seed] => child(seed.to_string()).await,
        _ => {
            eprintln!("usage: cluster_bank [--processes]");
            std::process::exit(2);
        }
    }
}

async fn one_process() {
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
    println!("Alice's balance: {}", balance(&bank_a).await);

    // Node b hands its shards off to node a, then leaves the cluster.
    let left = ClusterSharding::get(&cluster_b)
        .leave(Duration::from_secs(10))
        .await;
    report_leave("node-b", &left);
    cluster_a.shutdown().await;
    sys_b.shutdown().await;
    sys_a.shutdown().await;
}
