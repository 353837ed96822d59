//! The actor-ts cart example on a two-node cluster in one process: carts are sharded
//! entities; items are added through either node and the cart is viewed from both.
//!
//! ```sh
//! cargo run -p shardik --example cluster_cart
//! ```
//!
//! As in actor-ts, every command carries its entity id (`entity_id`); the caller routes by it
//! with `tell(&cmd.entity_id, cmd)`, so the same id reaches the same entity from any node.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik::cluster::runtime::{Cluster, ClusterConfig};
use shardik::prelude::*;
use shardik::sharding::cluster::ClusterSharding;

/// A cart command, with the cart's id inside (actor-ts's `CartCmd`).
#[derive(Serialize, Deserialize)]
struct CartCmd {
    entity_id: String,
    kind: CartKind,
}

#[derive(Serialize, Deserialize)]
enum CartKind {
    Add { sku: String },
    View(ReplyTo<Cart>),
}

/// What `View` answers.
#[derive(Debug, Serialize, Deserialize)]
struct Cart {
    items: Vec<String>,
    /// The node the cart entity runs on.
    node: String,
}

struct CartActor {
    items: Vec<String>,
    node: String,
}

impl Actor for CartActor {
    type Msg = CartCmd;
    async fn handle(&mut self, cmd: CartCmd, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match cmd.kind {
            CartKind::Add { sku } => self.items.push(sku),
            CartKind::View(reply) => reply.reply(Cart {
                items: self.items.clone(),
                node: self.node.clone(),
            }),
        }
        Ok(())
    }
}

const SECRET: &[u8] = b"example secret, at least 32 bytes long";

async fn node(name: &str, seed: Option<String>) -> (ActorSystem, Cluster, Region<CartCmd>) {
    let system = ActorSystem::new(name);
    let mut config = ClusterConfig::new("shop", name).secret(SECRET.to_vec());
    if let Some(seed) = seed {
        config = config.seed_nodes([seed]);
    }
    let cluster = Cluster::start(&system, config)
        .await
        .expect("cluster starts");
    cluster.when_up().await.expect("node is up");
    let node_name = name.to_string();
    let carts = ClusterSharding::get(&cluster)
        .start(EntityType::new("cart", move |_id: &str| CartActor {
            items: Vec::new(),
            node: node_name.clone(),
        }))
        .expect("entity type starts");
    (system, cluster, carts)
}

/// Routes a command by the id it carries (actor-ts's `extractEntityId`).
fn tell(region: &Region<CartCmd>, cmd: CartCmd) {
    let id = cmd.entity_id.clone();
    region.tell(&id, cmd);
}

async fn view(region: &Region<CartCmd>, id: &str) -> Cart {
    region
        .ask(
            id,
            |reply| CartCmd {
                entity_id: id.to_string(),
                kind: CartKind::View(reply),
            },
            Duration::from_secs(5),
        )
        .await
        .expect("the cart answers")
}

#[tokio::main]
async fn main() {
    let (sys_a, cluster_a, carts_a) = node("node-a", None).await;
    let (sys_b, cluster_b, carts_b) =
        node("node-b", Some(cluster_a.self_node().address.clone())).await;

    let add = |sku: &str| CartCmd {
        entity_id: "user-42".into(),
        kind: CartKind::Add { sku: sku.into() },
    };
    tell(&carts_a, add("book-1"));
    tell(&carts_b, add("pen-7"));
    // Each node's messages arrive in order, so a view through a node follows its add.
    view(&carts_a, "user-42").await;
    let from_b = view(&carts_b, "user-42").await;
    let from_a = view(&carts_a, "user-42").await;
    let mut items = from_a.items.clone();
    items.sort();
    println!(
        "cart user-42 lives on {}: {:?} (viewed from node-a and node-b: {})",
        from_a.node,
        items,
        if from_a.items == from_b.items && from_a.node == from_b.node {
            "the same cart"
        } else {
            "DIFFERENT carts"
        }
    );
    assert_eq!(items, ["book-1", "pen-7"]);

    let left = ClusterSharding::get(&cluster_b)
        .leave(Duration::from_secs(10))
        .await;
    if !left.handed_off() {
        eprintln!(
            "node-b left before handing off {:?}: messages to those shards' entities were lost",
            left.not_handed_off
        );
    }
    cluster_a.shutdown().await;
    sys_b.shutdown().await;
    sys_a.shutdown().await;
}
