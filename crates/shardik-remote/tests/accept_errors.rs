//! The listener's accept failing (the process out of file descriptors) is counted, logged
//! rate-limited, and retried after a back-off, and the node keeps serving once descriptors
//! are free again. Alone in its test binary: it exhausts the process's descriptors.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shardik_actor::ActorSystem;
use shardik_remote::{Remote, RemoteConfig};
use tokio::io::AsyncReadExt;

/// Collects everything logged.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn count(&self, what: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock())
            .matches(what)
            .count()
    }
}

/// Opens `/dev/null` until the process is out of descriptors (after lowering its soft
/// limit, so that this is quick).
fn exhaust_descriptors() -> Vec<std::fs::File> {
    let _ = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), "--nofile=1024:"])
        .status();
    let mut files = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => files.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(24), "EMFILE expected: {e}");
                return files;
            }
        }
        assert!(files.len() < 1_000_000, "no descriptor limit");
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(start_paused = true)]
async fn out_of_descriptors_is_logged_rarely_and_retried_slowly() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_env_filter("shardik_remote=warn")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let system = ActorSystem::new("a");
    let remote = Remote::start(&system, RemoteConfig::new("test", "a"))
        .await
        .expect("remote starts");

    let mut files = exhaust_descriptors();
    // One descriptor for a client's socket; the node has none left to accept it with.
    files.pop();
    let client = tokio::net::TcpStream::connect(remote.addr())
        .await
        .expect("the kernel completes the connection");
    // 30 s (of paused time: it passes as soon as the runtime is idle) of failing accepts.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let errors = remote.stats().accept_errors;
    let logged = log.count("accept failed");
    drop(files);

    // About one accept a second (each fails with EMFILE), one warning per 10 s; before, an
    // accept and a warning every 10 ms.
    assert!((20..=40).contains(&errors), "{errors} accept errors");
    assert!((1..=4).contains(&logged), "{logged} warnings");
    assert!(
        log.count("not_logged_since=") >= 1,
        "{}",
        String::from_utf8_lossy(&log.0.lock())
    );

    // Descriptors are free again: the node accepts the connection waiting in its backlog
    // and, as the client sends nothing, closes it when its handshake times out.
    let mut client = client;
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), client.read_to_end(&mut seen))
        .await
        .expect("the node accepted and closed the connection")
        .expect("read");
    assert_eq!(
        remote.stats().accept_errors,
        errors,
        "accepts succeed again"
    );
    system.shutdown().await;
}
