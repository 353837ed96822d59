//! The child node of the `sharding` suite (`shardik-bench sharding-peer`, hidden): joins the
//! cluster through `--seed`, starts the account type with `--shards` shards, starts a raw TCP
//! echo/count server (the remote baselines, [`crate::remote::raw`]), prints
//! `READY <addr> <incarnation> <raw addr>` once it is `Up`, and serves until its stdin closes
//! or it is killed.

use std::io::{Read, Write};

use clap::Args;
use tokio::net::TcpListener;

/// Arguments of the hidden `sharding-peer` subcommand.
#[derive(Args, Debug)]
pub struct PeerArgs {
    /// Address of the node to join through.
    #[arg(long)]
    pub seed: String,
    /// This node's id.
    #[arg(long)]
    pub node_id: String,
    /// Shards of the account type (the same on every node).
    #[arg(long)]
    pub shards: u32,
}

/// Runs the peer until stdin closes.
pub fn serve(args: &PeerArgs) {
    let rt = crate::harness::runtime();
    let (system, cluster, region, raw_addr) = rt.block_on(async {
        let (system, cluster, region) =
            super::account::start_node(&args.node_id, Some(&args.seed), args.shards).await;
        let raw = TcpListener::bind("127.0.0.1:0").await.expect("raw bind");
        let raw_addr = raw.local_addr().expect("raw address").to_string();
        crate::remote::raw::spawn_server(raw);
        (system, cluster, region, raw_addr)
    });
    let me = cluster.self_node().clone();
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY {} {} {raw_addr}", me.address, me.incarnation);
        let _ = out.flush();
    }
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(region);
    rt.block_on(async {
        cluster.shutdown().await;
        system.shutdown().await;
    });
}
