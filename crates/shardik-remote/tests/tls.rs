//! Mutual TLS: nodes with certificates from the shared CA talk; a node whose certificate is
//! not trusted is refused on both sides before any message is exchanged.

mod common;

use std::time::Duration;

use common::*;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use shardik_remote::{HandshakeError, RemoteConfig, RemoteError, RemoteEvent, TlsConfig};

const NAME: &str = "shardik-node";

struct Ca {
    cert: Certificate,
    key: KeyPair,
    /// Holds the PEM files; removed when the test ends.
    dir: tempfile::TempDir,
}

fn ca(label: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, label);
    let cert = p.self_signed(&key).unwrap();
    let dir = tempfile::Builder::new()
        .prefix(&format!("shardik-remote-tls-{label}-"))
        .tempdir()
        .unwrap();
    std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
    Ca { cert, key, dir }
}

/// Writes a node certificate signed by `signer` and returns a TLS config that trusts `trust`.
fn tls_for(node: &str, signer: &Ca, trust: &Ca) -> TlsConfig {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec![NAME.to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, node);
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = p.signed_by(&key, &signer.cert, &signer.key).unwrap();
    let cert_path = signer.dir.path().join(format!("{node}.pem"));
    let key_path = signer.dir.path().join(format!("{node}.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    TlsConfig::from_pem_files(&cert_path, &key_path, trust.dir.path().join("ca.pem"), NAME).unwrap()
}

fn tls_config(node: &str, signer: &Ca, trust: &Ca) -> RemoteConfig {
    config(node).tls(tls_for(node, signer, trust))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_certificates_from_the_shared_ca_talk() {
    let ca = ca("ca");
    let (sys_a, a) = node_with(tls_config("a", &ca, &ca)).await;
    let (sys_b, b) = node_with(tls_config("b", &ca, &ca)).await;
    let mut seen_a = echo(&sys_a, &a);
    let _seen_b = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    b.lookup::<Echo>("/user/echo", a.addr())
        .tell(Echo::Record { from: 1, n: 1 });
    assert_eq!(next(&mut seen_a).await, (1, 1));
    assert_eq!(a.connection(b.addr()).unwrap().peer.node_id, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_server_certificate_is_refused_on_both_sides() {
    let good = ca("good");
    let evil = ca("evil");
    let (sys_a, a) = node_with(tls_config("a", &good, &good)).await;
    // b's certificate comes from another CA (it trusts that one too).
    let (_sys_b, b) = node_with(tls_config("b", &evil, &evil)).await;
    let mut seen_a = echo(&sys_a, &a);
    let mut events_a = a.events();
    let mut events_b = b.events();

    let err = a.connect(b.addr()).await.unwrap_err();
    assert!(
        matches!(err, RemoteError::Handshake(HandshakeError::Tls(_))),
        "{err}"
    );
    for events in [&mut events_a, &mut events_b] {
        wait_event(events, |e| matches!(e, RemoteEvent::HandshakeFailed { .. })).await;
    }
    assert!(a.connection(b.addr()).is_none());
    b.lookup::<Echo>("/user/echo", a.addr())
        .tell(Echo::Record { from: 2, n: 2 });
    let _ = b.connect(a.addr()).await.unwrap_err();
    assert!(seen_a.try_recv().is_err());
    assert_eq!(a.stats().messages_delivered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_client_certificate_is_refused() {
    let good = ca("good");
    let evil = ca("evil");
    let (sys_a, a) = node_with(tls_config("a", &good, &good)).await;
    // c trusts the right CA (so it accepts a's certificate) but presents one from another.
    let (_sys_c, c) = node_with(tls_config("c", &evil, &good)).await;
    let mut seen_a = echo(&sys_a, &a);
    let mut events_a = a.events();
    // The dialer learns it as a TLS failure too (with TLS 1.3, from the alert that ends the
    // session after its own TLS handshake had completed).
    match c.connect(a.addr()).await {
        Err(RemoteError::Handshake(HandshakeError::Tls(e))) => {
            assert!(!e.is_empty())
        }
        other => panic!("expected a TLS handshake error, got {other:?}"),
    }
    let e = wait_event(&mut events_a, |e| {
        matches!(e, RemoteEvent::HandshakeFailed { .. })
    })
    .await;
    let RemoteEvent::HandshakeFailed { error, .. } = e else {
        unreachable!()
    };
    assert!(error.contains("TLS"), "{error}");
    assert!(seen_a.try_recv().is_err());
    assert_eq!(a.stats().messages_delivered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_node_cannot_talk_to_a_tls_node() {
    let ca = ca("ca");
    let (_sys_a, a) = node_with(tls_config("a", &ca, &ca)).await;
    let (_sys_b, b) = node("b").await;
    // The plain dialer is told what is wrong, not that a frame was too large.
    match b.connect(a.addr()).await {
        Err(RemoteError::Handshake(HandshakeError::Tls(e))) => {
            assert!(e.contains("no TLS configured"), "{e}")
        }
        other => panic!("expected a TLS handshake error, got {other:?}"),
    }
    assert!(a.connect(b.addr()).await.is_err());
}

/// A burst far larger than the (here tiny) socket buffers, then silence. A TLS stream accepts
/// the tail of a write into its own buffer when the socket would block and reports it
/// written; unless the writer flushes, that tail waits for the next write, which here is a
/// heartbeat a minute away, and the last messages never arrive within the test's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_burst_over_tls_arrives_without_a_later_write() {
    let ca = ca("ca");
    let cfg = |node: &str| {
        tls_config(node, &ca, &ca)
            .socket_buffer(4096)
            .heartbeat(Duration::from_secs(60), Duration::from_secs(180))
    };
    let (_sys_a, a) = node_with(cfg("a")).await;
    let (sys_b, b) = node_with(cfg("b")).await;
    let mut seen_b = echo(&sys_b, &b);
    a.connect(b.addr()).await.unwrap();
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    const BURST: u64 = 50_000;
    for n in 0..BURST {
        to_b.tell(Echo::Record { from: 7, n });
    }
    for n in 0..BURST {
        assert_eq!(next(&mut seen_b).await, (7, n));
    }
}
