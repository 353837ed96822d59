//! A cluster node in a separate OS process, killed with SIGKILL: the survivors (in this
//! process) see it unreachable, `Down` within 5 s and then removed.
//!
//! The child node is this test binary itself, re-run with the ignored test [`child_node`]
//! selected and its settings in environment variables (no extra binary or build step). It
//! joins the cluster through the seed it is given, prints `READY <addr> <incarnation>` once
//! it is `Up`, and runs until it is killed or its stdin closes.

mod netutil;

use std::process::Stdio;
use std::time::{Duration, Instant};

use netutil::*;
use shardik_actor::ActorSystem;
use shardik_cluster::member::{MemberStatus, UniqueAddress};
use shardik_cluster::runtime::Cluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Set (to the seed address) in the child's environment.
const CHILD_SEED: &str = "SHARDIK_CLUSTER_TEST_CHILD_SEED";

#[test]
#[ignore = "helper: the child process of the test below"]
fn child_node() {
    let Ok(seed) = std::env::var(CHILD_SEED) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (_system, cluster) = rt.block_on(async {
        let system = ActorSystem::new("child");
        let cluster = Cluster::start(&system, config("child").seed_nodes([seed]))
            .await
            .expect("the child node starts");
        cluster.when_up().await.expect("the child joins");
        (system, cluster)
    });
    let me = cluster.self_node();
    // A line of its own: libtest may have printed "test child_node ... " without a newline.
    println!("\nREADY {} {}", me.address, me.incarnation);
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_with_sigkill_is_downed_and_removed() {
    let (nodes, _) = cluster_of(2, None).await;
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let mut child = Command::new(exe)
        .args([
            "child_node",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SEED, &nodes[0].id().address)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the child process starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).await.expect("child stdout");
            assert!(n > 0, "the child exited before it was ready");
            if let Some(at) = line.find("READY ") {
                return line[at + "READY ".len()..].trim().to_string();
            }
        }
    })
    .await
    .expect("the child is up within 30 s");
    let mut parts = ready.split_whitespace();
    let addr = parts.next().unwrap().to_string();
    let incarnation: u64 = parts.next().unwrap().parse().unwrap();
    let victim = UniqueAddress::new(addr, "child", incarnation);
    let mut ids: Vec<_> = nodes.iter().map(|n| n.id().clone()).collect();
    ids.push(victim.clone());
    for n in &nodes {
        wait(
            &n.cluster,
            "child up everywhere",
            Duration::from_secs(15),
            |s| s.all_up(&ids),
        )
        .await;
    }

    let killed_at = Instant::now();
    child.start_kill().expect("SIGKILL");
    let mut down_after = Duration::ZERO;
    for n in &nodes {
        wait(
            &n.cluster,
            "killed node Down",
            Duration::from_secs(10),
            |s| {
                s.member(&victim)
                    .is_none_or(|m| m.status == MemberStatus::Down)
            },
        )
        .await;
        down_after = down_after.max(killed_at.elapsed());
    }
    for n in &nodes {
        wait(
            &n.cluster,
            "killed node removed",
            Duration::from_secs(10),
            |s| s.member(&victim).is_none(),
        )
        .await;
    }
    eprintln!(
        "SIGKILL: Down on all survivors after {down_after:?}, removed after {:?}",
        killed_at.elapsed()
    );
    assert!(down_after < Duration::from_secs(5), "{down_after:?}");
    let _ = child.wait().await;
    stop_all(&nodes).await;
}
