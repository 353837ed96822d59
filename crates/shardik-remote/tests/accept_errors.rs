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

/// The soft limit on open files, from `/proc/self/limits` (`None` if unreadable or
/// unlimited).
fn soft_descriptor_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Above this soft limit the test does not run: exhausting it would take long (Docker's
/// default is about a million) and could run the whole system out of descriptors first.
const MAX_LIMIT: u64 = 65_536;

/// Lowers the process's soft descriptor limit to 1024 with the `prlimit` binary (the crate
/// has no libc binding), so that exhausting it is quick; returns the limit now in force, or
/// `None` if it is still above [`MAX_LIMIT`] (no `prlimit` in a minimal image, say).
fn lower_descriptor_limit() -> Option<u64> {
    let lowered = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), "--nofile=1024:"])
        .status();
    let limit = soft_descriptor_limit().filter(|l| *l <= MAX_LIMIT);
    if limit.is_none() {
        eprintln!(
            "skipped: could not lower the descriptor limit (prlimit: {lowered:?}; soft limit \
             now {:?}, above {MAX_LIMIT} or unknown)",
            soft_descriptor_limit()
        );
    }
    limit
}

/// Opens `/dev/null` until the process is out of descriptors (EMFILE). `None` if the
/// system's table ran out first (ENFILE): the descriptors are closed again at once, since
/// holding them would make every other process on the host fail to open files, and the test
/// is skipped (says so).
fn exhaust_descriptors(limit: u64) -> Option<Vec<std::fs::File>> {
    let mut files = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => files.push(f),
            Err(e) if e.raw_os_error() == Some(24) => return Some(files),
            Err(e) if e.raw_os_error() == Some(23) => {
                let opened = files.len();
                drop(files);
                eprintln!(
                    "skipped: the system's file table ran out (ENFILE) after {opened} \
                     descriptors, before this process's limit of {limit}; released them"
                );
                return None;
            }
            Err(e) => panic!("EMFILE expected: {e}"),
        }
        assert!(
            files.len() as u64 <= limit,
            "more descriptors open than the limit of {limit}"
        );
    }
}

/// The `not_logged_since` counts of the warnings logged.
fn not_logged_counts(log: &str) -> Vec<u64> {
    log.split("not_logged_since=")
        .skip(1)
        .map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().expect("a count")
        })
        .collect()
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
    let Some(limit) = lower_descriptor_limit() else {
        return;
    };
    let system = ActorSystem::new("a");
    let remote = Remote::start(&system, RemoteConfig::new("test", "a"))
        .await
        .expect("remote starts");

    let Some(mut files) = exhaust_descriptors(limit) else {
        return;
    };
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
    // The first warning says 0; a later one counts the failures it stood for (the count
    // of the first alone would pass a check for the field).
    let text = String::from_utf8_lossy(&log.0.lock()).into_owned();
    let counts = not_logged_counts(&text);
    assert_eq!(counts.len(), logged, "{text}");
    assert!(counts.iter().any(|n| *n > 0), "{counts:?}: {text}");

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
