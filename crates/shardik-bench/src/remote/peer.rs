//! The receiving process of the `remote` suite (`shardik-bench remote-peer`, hidden).
//!
//! Starts two shardik nodes (plain and mutual TLS), each with [`SINKS`] sinks and an echo
//! actor, and two raw servers (plain and TLS, [`super::raw::serve`]), all on 127.0.0.1 with
//! OS-assigned ports; prints `READY {json addresses}` as its only stdout line; serves until
//! its stdin closes (the suite ends or dies), then exits.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};
use shardik::prelude::*;
use shardik::remote::Remote;
use tokio::net::TcpListener;

use super::{node_config, sink_path, tls, BenchMsg, ECHO_PATH, SINKS};

/// Arguments of the hidden `remote-peer` subcommand.
#[derive(Args, Debug)]
pub struct PeerArgs {
    /// Directory holding `ca.pem`, `node.pem` and `node.key`.
    #[arg(long)]
    pub tls_dir: PathBuf,
}

/// Where the peer listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerAddrs {
    /// The plain shardik node.
    pub node: String,
    /// The TLS shardik node.
    pub tls_node: String,
    /// The plain raw server.
    pub raw: String,
    /// The TLS raw server.
    pub raw_tls: String,
}

/// Counts `Data`, answers `Count` and `Echo`.
pub struct Sink {
    count: u64,
}

impl Actor for Sink {
    type Msg = BenchMsg;

    async fn handle(&mut self, msg: BenchMsg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            BenchMsg::Data { payload } => {
                debug_assert_eq!(payload.len(), super::PAYLOAD);
                self.count += 1;
            }
            BenchMsg::Count { reply } => {
                reply.reply(self.count);
                self.count = 0;
            }
            BenchMsg::Echo { n, reply } => reply.reply(n),
        }
        Ok(())
    }
}

/// Runs the peer until stdin closes.
pub fn serve(args: &PeerArgs) {
    let rt = crate::harness::runtime();
    let node_tls = tls::node_tls(&args.tls_dir).expect("TLS configuration loads");
    let acceptor = tls::raw_acceptor(&args.tls_dir).expect("raw TLS configuration loads");
    let (addrs, systems) = rt.block_on(async move {
        let mut systems = Vec::new();
        let mut node_addrs = Vec::new();
        for (id, tls) in [("bench-b", None), ("bench-b-tls", Some(node_tls))] {
            let system = ActorSystem::new(id);
            let mut cfg = node_config(id);
            if let Some(tls) = tls {
                cfg = cfg.tls(tls);
            }
            let remote = Remote::start(&system, cfg).await.expect("peer node starts");
            for i in 0..SINKS {
                remote.register(&sink_path(i), system.spawn(Sink { count: 0 }));
            }
            remote.register(ECHO_PATH, system.spawn(Sink { count: 0 }));
            node_addrs.push(remote.addr().to_string());
            systems.push(system);
        }
        let raw = TcpListener::bind("127.0.0.1:0").await.expect("raw bind");
        let raw_tls = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("raw TLS bind");
        let addrs = PeerAddrs {
            node: node_addrs[0].clone(),
            tls_node: node_addrs[1].clone(),
            raw: raw.local_addr().expect("raw address").to_string(),
            raw_tls: raw_tls.local_addr().expect("raw TLS address").to_string(),
        };
        super::raw::spawn_server(raw);
        tokio::spawn(async move {
            while let Ok((stream, _)) = raw_tls.accept().await {
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let res = match acceptor.accept(stream).await {
                        Ok(s) => {
                            let (r, w) = tokio::io::split(s);
                            super::raw::serve(r, w).await
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = res {
                        eprintln!("[remote-peer] raw TLS connection failed: {e}");
                    }
                });
            }
        });
        (addrs, systems)
    });
    {
        let mut out = std::io::stdout().lock();
        let json = serde_json::to_string(&addrs).expect("addresses serialize");
        writeln!(out, "READY {json}").expect("stdout is writable");
        out.flush().expect("stdout flushes");
    }
    // Serve until the suite closes our stdin (or dies).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    rt.block_on(async move {
        for system in systems {
            system.shutdown().await;
        }
    });
}
