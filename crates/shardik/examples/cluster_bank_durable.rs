//! The Casty bank, durable: event-sourced accounts sharded over three nodes, their journal in
//! a SQLite file and each node's sharding state on the same file. Deposits go through two
//! nodes; Alice's balance survives the crash of the node that holds her account (failover to
//! another node) and a full restart of the cluster. (Three nodes, so that the two left after
//! a crash are a majority: of two nodes, the split brain resolver keeps only the one with the
//! lower address, which may be the crashed one.)
//!
//! ```sh
//! cargo run -p shardik --example cluster_bank_durable             # a temporary file
//! cargo run -p shardik --example cluster_bank_durable -- bank.db  # keep it: run twice
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik::cluster::runtime::{Cluster, ClusterConfig};
use shardik::persistence::{
    Effect, EventSourced, PersistSettings, Persistence, SqliteStore, Versioned,
};
use shardik::prelude::*;
use shardik::sharding::cluster::{ClusterSharding, ClusterShardingSettings};

#[derive(Serialize, Deserialize)]
enum AccountCmd {
    Deposit(u64, ReplyTo<u64>),
    Balance(ReplyTo<u64>),
}

#[derive(Serialize, Deserialize)]
enum AccountEvent {
    Deposited { amount: u64 },
}

impl Versioned for AccountEvent {
    const TYPE_NAME: &'static str = "bank.AccountEvent";
}

#[derive(Default, Serialize, Deserialize)]
struct Account {
    balance: u64,
}

impl Versioned for Account {
    const TYPE_NAME: &'static str = "bank.Account";
}

/// A deposit is acknowledged with the new balance only once its event is in the journal.
struct Bank;

impl EventSourced for Bank {
    type Command = AccountCmd;
    type Event = AccountEvent;
    type State = Account;

    fn handle_command(&self, state: &Account, cmd: AccountCmd) -> Effect<AccountEvent, Account> {
        match cmd {
            AccountCmd::Deposit(amount, reply) => {
                Effect::persist(AccountEvent::Deposited { amount })
                    .then_reply(reply, |s: &Account| s.balance)
            }
            AccountCmd::Balance(reply) => Effect::reply(reply, state.balance),
        }
    }

    fn apply(state: &mut Account, event: &AccountEvent) {
        match event {
            AccountEvent::Deposited { amount } => state.balance += amount,
        }
    }
}

const SECRET: &[u8] = b"example secret, at least 32 bytes long";
const ASK: Duration = Duration::from_secs(5);

struct Node {
    system: ActorSystem,
    cluster: Cluster,
    bank: Region<AccountCmd>,
}

/// A cluster member `name` (joining through `seed`), up, without sharding yet.
async fn member(name: &str, seed: Option<String>) -> (ActorSystem, Cluster) {
    let system = ActorSystem::new(name);
    let mut config = ClusterConfig::new("bank", name).secret(SECRET.to_vec());
    if let Some(seed) = seed {
        config = config.seed_nodes([seed]);
    }
    let cluster = Cluster::start(&system, config)
        .await
        .expect("cluster starts");
    cluster.when_up().await.expect("node is up");
    (system, cluster)
}

/// Starts the bank on a member, its journal and sharding state on `store`, and waits until
/// its region is registered with the coordinator.
async fn bank(system: ActorSystem, cluster: Cluster, store: &Arc<SqliteStore>) -> Node {
    let sharding = ClusterSharding::with_state_store(&cluster, store.clone())
        .await
        .expect("sharding state loads");
    let persistence = Persistence::new(store.clone());
    // The coordinator recovers its state from a majority of the three nodes' replicas, so a
    // full restart never starts from one node's copy that may be stale (see
    // `docs/sharding.md`, durable sharding state).
    let settings = ClusterShardingSettings::default().min_quorum(2);
    let bank = sharding
        .start_with(
            persistence
                .event_sourced("account", PersistSettings::default(), |_| Bank)
                .shards(10),
            settings,
        )
        .expect("entity type starts");
    sharding
        .wait_registered("account", Duration::from_secs(10))
        .await
        .expect("registered");
    Node {
        system,
        cluster,
        bank,
    }
}

/// Three members, then the bank on all three at once (its coordinator needs two of them).
async fn three_nodes(store: &Arc<SqliteStore>) -> Vec<Node> {
    let (sa, a) = member("node-a", None).await;
    let seed = a.self_node().address.clone();
    let (sb, b) = member("node-b", Some(seed.clone())).await;
    let (sc, c) = member("node-c", Some(seed)).await;
    let (a, b, c) = tokio::join!(bank(sa, a, store), bank(sb, b, store), bank(sc, c, store));
    vec![a, b, c]
}

/// Alice's balance through `node`, retried while her shard finds its new home.
async fn balance(node: &Node) -> u64 {
    for _ in 0..20 {
        if let Ok(b) = node.bank.ask("alice", AccountCmd::Balance, ASK).await {
            return b;
        }
    }
    panic!("no balance through {}", node.cluster.self_node().node_id);
}

async fn stop(node: Node) {
    node.cluster.shutdown().await;
    node.system.shutdown().await;
}

async fn run(path: &Path) {
    let store = Arc::new(SqliteStore::open(path).expect("the SQLite file opens"));
    let mut nodes = three_nodes(&store).await;
    let start = balance(&nodes[0]).await;
    if start > 0 {
        println!("Alice's balance from the last run: {start}");
    }
    // Deposits through two nodes, each acknowledged once it is in the journal.
    for (node, amount) in [(&nodes[0], 100), (&nodes[1], 50)] {
        node.bank
            .ask("alice", |r| AccountCmd::Deposit(amount, r), ASK)
            .await
            .expect("deposit");
    }
    println!("Alice's balance: {}", balance(&nodes[0]).await - start);

    // The node that holds Alice's account crashes (no leave, no hand-off).
    let shard = nodes[0].bank.shard_of("alice");
    let home = nodes
        .iter()
        .position(|n| {
            ClusterSharding::get(&n.cluster)
                .hosted_shards("account")
                .is_some_and(|s| s.contains(&shard))
        })
        .expect("Alice's account lives somewhere");
    let victim = nodes.remove(home);
    let victim_name = victim.cluster.self_node().node_id.clone();
    stop(victim).await;
    println!(
        "{victim_name} crashed; Alice's balance through {}: {}",
        nodes[0].cluster.self_node().node_id,
        balance(&nodes[0]).await - start
    );
    for n in nodes {
        stop(n).await;
    }

    // A full restart on the same file.
    let nodes = three_nodes(&store).await;
    println!(
        "after a full restart: Alice's balance: {}",
        balance(&nodes[2]).await - start
    );
    for n in nodes {
        stop(n).await;
    }
}

#[tokio::main]
async fn main() {
    let arg = std::env::args().nth(1);
    match arg {
        Some(path) => run(Path::new(&path)).await,
        None => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            run(&dir.path().join("bank.db")).await;
        }
    }
}
