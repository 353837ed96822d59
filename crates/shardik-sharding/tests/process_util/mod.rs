//! Child processes of the multi-process sharding tests.
//!
//! A child node is the test binary itself, re-run with one ignored helper test selected
//! (`<helper> --exact --ignored`) and its settings in an environment variable: no extra
//! binary or build step, so it works under `cargo test` and `cargo nextest` on a clean clone.
//! The child starts its node, prints `READY <addr> <incarnation>` on stdout once it is ready
//! ([`ready`]) and serves until it is killed or its stdin closes ([`serve_until_stdin_closes`]),
//! so a child never outlives a parent that died without killing it.
//!
//! The parent side is [`ChildNode`]: [`ChildNode::spawn`] waits for the `READY` line (an
//! event, with a deadline), [`ChildNode::kill`] sends SIGKILL (`std::process::Child::kill`
//! on Unix), and dropping a `ChildNode` kills it too (a failing test leaves no process
//! behind).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::oneshot;

/// What a child prints once its node is ready.
const READY: &str = "READY ";

/// The value of `var` if this process is a child started by [`ChildNode::spawn`] (the helper
/// test returns at once otherwise, also when run with `--ignored` by hand).
pub fn child_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// The child's side: reports its node's address and incarnation to the parent.
pub fn ready(addr: &str, incarnation: u64) {
    // A line of its own: libtest may have printed "test child_node ... " without a newline.
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{READY}{addr} {incarnation}").expect("stdout");
    out.flush().expect("stdout");
}

/// The child's side: blocks until the parent closes the child's stdin (or dies).
pub fn serve_until_stdin_closes() {
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

/// A cluster node running in a child process.
pub struct ChildNode {
    child: Child,
    /// The node id it was given.
    pub node_id: String,
    /// Its advertised address (port chosen by the OS).
    pub addr: String,
    /// Its incarnation.
    pub incarnation: u64,
}

impl ChildNode {
    /// Starts this test binary with only the ignored test `helper` selected, `var=value` in
    /// its environment, and waits (up to `within`) for its `READY` line. Its stderr goes to
    /// ours; its other output is read and dropped (so it never blocks on a full pipe).
    pub async fn spawn(
        helper: &str,
        node_id: &str,
        var: &str,
        value: &str,
        within: Duration,
    ) -> ChildNode {
        let exe = std::env::current_exe().expect("the test binary knows its path");
        let mut child = Command::new(exe)
            .args([
                helper,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(var, value)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the child process starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = oneshot::channel::<String>();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find(READY) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(line[at + READY.len()..].trim().to_string());
                    }
                }
            }
        });
        let mut node = ChildNode {
            child,
            node_id: node_id.to_string(),
            addr: String::new(),
            incarnation: 0,
        };
        let line = match tokio::time::timeout(within, rx).await {
            Ok(Ok(line)) => line,
            Ok(Err(_)) => panic!("child {node_id} exited before it was ready"),
            Err(_) => panic!("child {node_id} not ready within {within:?}"),
        };
        let mut parts = line.split_whitespace();
        node.addr = parts.next().expect("address").to_string();
        node.incarnation = parts
            .next()
            .and_then(|s| s.parse().ok())
            .expect("incarnation");
        node
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reaps the process (it cannot run any code after the signal).
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("the child is reaped");
        assert!(!status.success(), "killed, not exited: {status:?}");
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
