//! The killed node of the `cluster` suite (`shardik-bench cluster-peer`, hidden): joins the
//! cluster through `--seed`, prints `READY <addr> <incarnation>` once it is `Up`, and serves
//! until its stdin closes or it is killed.

use std::io::{Read, Write};

use clap::Args;
use shardik::prelude::*;
use shardik_cluster::runtime::Cluster;

/// Arguments of the hidden `cluster-peer` subcommand.
#[derive(Args, Debug)]
pub struct PeerArgs {
    /// Address of the node to join through.
    #[arg(long)]
    pub seed: String,
    /// This node's id.
    #[arg(long)]
    pub node_id: String,
}

/// Runs the peer until stdin closes.
pub fn serve(args: &PeerArgs) {
    let rt = crate::harness::runtime();
    let (system, cluster) = rt.block_on(async {
        let system = ActorSystem::new(args.node_id.clone());
        let cluster = Cluster::start(
            &system,
            super::node_config(&args.node_id).seed_nodes([args.seed.clone()]),
        )
        .await
        .expect("the peer node starts");
        cluster.when_up().await.expect("the peer joins");
        (system, cluster)
    });
    let me = cluster.self_node().clone();
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY {} {}", me.address, me.incarnation);
        let _ = out.flush();
    }
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    rt.block_on(async {
        cluster.shutdown().await;
        system.shutdown().await;
    });
}
