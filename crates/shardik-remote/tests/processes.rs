//! Nodes in separate OS processes: tell and ask both ways, and reconnecting to a peer process
//! that was killed (SIGKILL) and restarted on the same address as a new incarnation.
//!
//! The child node is this test binary itself, re-run with the ignored test [`child_node`]
//! selected and its settings in environment variables: no extra binary or build step, so it
//! works under `cargo test --workspace` on a clean clone. The child starts a node, registers
//! an actor at `/user/proc`, prints `READY <addr> <incarnation>` on stdout and serves until it
//! is killed or its stdin closes.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, ActorSystem, AskError, Context, ReplyTo};
use shardik_remote::{Remote, RemoteEvent, RemoteRef};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;

/// Set (to the address to bind) in the child's environment.
const CHILD_BIND: &str = "SHARDIK_REMOTE_TEST_CHILD_BIND";
const PATH: &str = "/user/proc";

/// The protocol between the two processes.
#[derive(Debug, Serialize, Deserialize)]
enum Proc {
    /// The child answers `n + 1`, the parent `n + 1000`.
    Inc { n: u64, reply: ReplyTo<u64> },
    /// The receiver tells `Record { n }` to `to`.
    Forward { to: RemoteRef<Proc>, n: u64 },
    /// Reported on the receiver's channel.
    Record { n: u64 },
    /// The receiver asks `to` for `Inc { n }` and answers with its answer.
    AskBack {
        to: RemoteRef<Proc>,
        n: u64,
        reply: ReplyTo<u64>,
    },
    /// Like `Inc`, with `pad` bytes beside it; counted.
    PaddedInc {
        n: u64,
        pad: Vec<u8>,
        reply: ReplyTo<u64>,
    },
    /// Answers how many `PaddedInc` this incarnation handled.
    Handled { reply: ReplyTo<u64> },
}

struct ProcActor {
    inc: u64,
    seen: Option<mpsc::UnboundedSender<u64>>,
    padded: u64,
}

impl Actor for ProcActor {
    type Msg = Proc;
    async fn handle(&mut self, msg: Proc, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Proc::Inc { n, reply } => reply.reply(n + self.inc),
            Proc::Forward { to, n } => to.tell(Proc::Record { n }),
            Proc::Record { n } => {
                if let Some(seen) = &self.seen {
                    let _ = seen.send(n);
                }
            }
            Proc::AskBack { to, n, reply } => {
                if let Ok(v) = to.ask(|reply| Proc::Inc { n, reply }, T).await {
                    reply.reply(v);
                }
            }
            Proc::PaddedInc { n, pad: _, reply } => {
                self.padded += 1;
                reply.reply(n + self.inc);
            }
            Proc::Handled { reply } => reply.reply(self.padded),
        }
        Ok(())
    }
}

/// The child's side: runs only when the parent test started this binary as a child.
#[test]
#[ignore = "helper: the child process of the tests below"]
fn child_node() {
    let Ok(bind) = std::env::var(CHILD_BIND) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (_system, remote) = rt.block_on(async {
        let system = ActorSystem::new("child");
        let remote = Remote::start(&system, config("child").bind(bind))
            .await
            .expect("the child node starts");
        remote.register(
            PATH,
            system.spawn(ProcActor {
                inc: 1,
                seen: None,
                padded: 0,
            }),
        );
        (system, remote)
    });
    // A line of its own: libtest may have printed "test child_node ... " without a newline.
    println!("\nREADY {} {}", remote.addr(), remote.incarnation());
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest);
}

/// A running child node.
struct ChildNode {
    child: Child,
    addr: String,
    incarnation: u64,
    _stdout: BufReader<ChildStdout>,
}

/// Starts a child node bound to `bind` and waits for its `READY` line.
async fn start_child(bind: &str) -> ChildNode {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let mut child = Command::new(exe)
        .args([
            "child_node",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_BIND, bind)
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
    .expect("the child is ready within 30 s");
    let mut parts = ready.split_whitespace();
    let addr = parts.next().expect("address").to_string();
    let incarnation = parts.next().expect("incarnation").parse().unwrap();
    ChildNode {
        child,
        addr,
        incarnation,
        _stdout: stdout,
    }
}

/// The parent's node with its own `/user/proc` actor, whose `Record`s arrive on the channel.
async fn parent() -> (ActorSystem, Remote, mpsc::UnboundedReceiver<u64>) {
    let (system, remote) = node("parent").await;
    let (tx, rx) = mpsc::unbounded_channel();
    remote.register(
        PATH,
        system.spawn(ProcActor {
            inc: 1000,
            seen: Some(tx),
            padded: 0,
        }),
    );
    (system, remote, rx)
}

/// Checks tell and ask in both directions between the parent and the child at `addr`.
async fn both_ways(parent: &Remote, seen: &mut mpsc::UnboundedReceiver<u64>, addr: &str) {
    let to_child = parent.lookup::<Proc>(PATH, addr);
    let me = parent.lookup::<Proc>(PATH, parent.addr());
    // Parent asks the child.
    assert_eq!(
        to_child.ask(|reply| Proc::Inc { n: 1, reply }, T).await,
        Ok(2)
    );
    // Parent tells the child, which tells the parent back (through a ref in the message).
    to_child.tell(Proc::Forward {
        to: me.clone(),
        n: 7,
    });
    assert_eq!(next(seen).await, 7);
    // The child asks the parent (its answer comes back through the child's reply).
    assert_eq!(
        to_child
            .ask(
                |reply| Proc::AskBack {
                    to: me,
                    n: 10,
                    reply
                },
                T
            )
            .await,
        Ok(1010)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tell_and_ask_both_ways_between_processes() {
    let (_sys, parent, mut seen) = parent().await;
    let child = start_child("127.0.0.1:0").await;
    both_ways(&parent, &mut seen, &child.addr).await;
    let conn = parent.connection(&child.addr).expect("connected");
    assert_eq!(conn.peer.node_id, "child");
    assert_eq!(conn.peer.incarnation, child.incarnation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_to_a_killed_and_restarted_process() {
    let (_sys, parent, mut seen) = parent().await;
    let mut child = start_child("127.0.0.1:0").await;
    let addr = child.addr.clone();
    both_ways(&parent, &mut seen, &addr).await;
    let mut events = parent.events();

    // SIGKILL: no goodbye, the kernel closes the sockets.
    child.child.kill().await.expect("the child is killed");
    wait_event(
        &mut events,
        |e| matches!(e, RemoteEvent::Disconnected { addr: a } if *a == addr),
    )
    .await;

    // Asks to the dead node fail with a typed error, within their timeout.
    let to_child = parent.lookup::<Proc>(PATH, &addr);
    let timeout = Duration::from_millis(500);
    for n in 0..3 {
        let started = Instant::now();
        let res = to_child.ask(|reply| Proc::Inc { n, reply }, timeout).await;
        assert_eq!(res, Err(AskError::Timeout(timeout)));
        assert!(started.elapsed() < timeout + Duration::from_millis(500));
    }

    // Restarted on the same address: a new incarnation, and everything works again.
    let restarted = start_child(&addr).await;
    assert_eq!(restarted.addr, addr);
    assert_ne!(restarted.incarnation, child.incarnation);
    assert_eq!(
        to_child.ask(|reply| Proc::Inc { n: 41, reply }, T).await,
        Ok(42)
    );
    let e = wait_event(&mut events, |e| {
        matches!(e, RemoteEvent::PeerRestarted { .. })
    })
    .await;
    assert_eq!(
        e,
        RemoteEvent::PeerRestarted {
            addr: addr.clone(),
            old: child.incarnation,
            new: restarted.incarnation,
        }
    );
    both_ways(&parent, &mut seen, &addr).await;
}

/// Asks still waiting in the outbound queue when the peer restarts go to the new incarnation
/// and are answered by it; only those whose requests left for the old one fail. Before, every
/// ask sent before the old connection ended failed as `Undeliverable`, and the queued ones
/// among them were then delivered to (and run by) the new incarnation all the same.
///
/// The child is stopped (SIGSTOP) so that the socket's buffers fill and a backlog builds in
/// the parent's queue (asks go on until the queue refuses one), then killed and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_queued_when_the_peer_restarts_are_answered_by_its_new_incarnation() {
    let (_sys, parent) = node_with(config("parent").outbound_queue(64)).await;
    let mut child = start_child("127.0.0.1:0").await;
    let addr = child.addr.clone();
    let to_child = parent.lookup::<Proc>(PATH, &addr);
    assert_eq!(
        to_child.ask(|reply| Proc::Inc { n: 1, reply }, T).await,
        Ok(2)
    );
    let mut events = parent.events();
    let pid = child.child.id().expect("the child runs");
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(stopped.success());

    // Asks until the queue refuses one: the ones before it that are not in the socket's
    // buffers wait in the queue.
    let asks = tokio::task::JoinSet::new();
    let mut asks = asks;
    let wait = Duration::from_secs(60);
    let sent = |s: shardik_remote::RemoteStats| s.messages_sent + s.dropped_queue_full;
    let base = sent(parent.stats());
    let mut n = 0;
    while parent.stats().dropped_queue_full == 0 {
        assert!(n < 100_000, "the queue never filled");
        let to = to_child.clone();
        asks.spawn(async move {
            to.ask(
                |reply| Proc::PaddedInc {
                    n,
                    pad: vec![7; 64 * 1024],
                    reply,
                },
                wait,
            )
            .await
        });
        n += 1;
        while sent(parent.stats()) - base < n {
            tokio::task::yield_now().await;
        }
    }

    child.child.kill().await.expect("the child is killed");
    wait_event(
        &mut events,
        |e| matches!(e, RemoteEvent::Disconnected { addr: a } if *a == addr),
    )
    .await;
    // The queued frames make the parent dial again until the new incarnation is up.
    let restarted = start_child(&addr).await;
    wait_event(&mut events, |e| {
        matches!(e, RemoteEvent::PeerRestarted { .. })
    })
    .await;
    let (mut answered, mut failed) = (0, 0);
    while let Some(res) = asks.join_next().await {
        match res.expect("an ask task panicked") {
            Ok(_) => answered += 1,
            Err(AskError::Undeliverable(_)) => failed += 1,
            Err(e) => panic!("an ask failed otherwise: {e:?}"),
        }
    }
    let handled = to_child
        .ask(|reply| Proc::Handled { reply }, T)
        .await
        .expect("the new incarnation answers");
    assert!(handled > 0, "a backlog reached the new incarnation");
    assert_eq!(
        answered, handled,
        "every request the new incarnation handled was answered ({failed} failed)"
    );
    assert!(failed >= 1, "at least the refused one failed");
    drop(restarted);
}
