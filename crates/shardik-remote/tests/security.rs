//! The handshake refuses nodes with the wrong secret or cluster, on both sides, and no user
//! message crosses.

mod common;

use std::time::Duration;

use common::*;
use shardik_actor::AskError;
use shardik_remote::{HandshakeError, RejectReason, RemoteConfig, RemoteError, RemoteEvent};

async fn refused_both_ways(good: RemoteConfig, bad: RemoteConfig, reason: RejectReason) {
    let (sys_a, a) = node_with(good).await;
    let (_sys_b, b) = node_with(bad).await;
    let mut seen_a = echo(&sys_a, &a);
    let mut events_a = a.events();
    let mut events_b = b.events();

    // The dialing side gets a typed error.
    let err = b.connect(a.addr()).await.unwrap_err();
    match &err {
        RemoteError::Handshake(HandshakeError::RefusedByPeer { reason: r, .. })
        | RemoteError::Handshake(HandshakeError::Refused { reason: r, .. }) => {
            assert_eq!(*r, reason, "{err}")
        }
        other => panic!("unexpected error {other}"),
    }
    // Both sides report the failure.
    for events in [&mut events_a, &mut events_b] {
        let e = wait_event(events, |e| matches!(e, RemoteEvent::HandshakeFailed { .. })).await;
        let RemoteEvent::HandshakeFailed { reason: r, .. } = e else {
            unreachable!()
        };
        assert_eq!(r, Some(reason));
    }
    assert!(b.connection(a.addr()).is_none());
    assert!(a.connection(b.addr()).is_none());

    // Messages never arrive; an ask times out.
    let to_a = b.lookup::<Echo>("/user/echo", a.addr());
    to_a.tell(Echo::Record { from: 9, n: 9 });
    let res = to_a
        .ask(
            |reply| Echo::Inc { n: 1, reply },
            Duration::from_millis(300),
        )
        .await;
    assert_eq!(res, Err(AskError::Timeout(Duration::from_millis(300))));
    assert!(seen_a.try_recv().is_err());
    assert_eq!(a.stats().messages_delivered, 0);
    assert!(a.stats().handshake_failures >= 1);
    assert!(b.stats().handshake_failures >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_refused() {
    refused_both_ways(
        config("a"),
        config("b").secret(b"another secret, also long enough".to_vec()),
        RejectReason::Authentication,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_secret_is_refused_by_a_node_that_has_one() {
    let mut no_secret = config("b");
    no_secret.secret = None;
    refused_both_ways(config("a"), no_secret, RejectReason::Authentication).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_cluster_is_refused() {
    let mut other = config("b");
    other.cluster = "other-cluster".into();
    refused_both_ways(config("a"), other, RejectReason::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matching_nodes_without_secrets_connect() {
    let mut a_cfg = config("a");
    a_cfg.secret = None;
    let mut b_cfg = config("b");
    b_cfg.secret = None;
    let (sys_a, a) = node_with(a_cfg).await;
    let (_sys_b, b) = node_with(b_cfg).await;
    let _seen = echo(&sys_a, &a);
    assert_eq!(b.connect(a.addr()).await.unwrap().node_id, "a");
    let to_a = b.lookup::<Echo>("/user/echo", a.addr());
    assert_eq!(to_a.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_payload_format_is_refused() {
    let json = config("b").payload_format(shardik_remote::JsonCodec::format());
    refused_both_ways(config("a"), json, RejectReason::PayloadFormat).await;
}

/// Misconfigurations that would silently weaken or break the node are refused at start with
/// an error that names the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigurations_are_refused_at_start() {
    let refused = |cfg: RemoteConfig, expect: &'static str| async move {
        let system = shardik_actor::ActorSystem::new("misconfigured");
        match shardik_remote::Remote::start(&system, cfg).await {
            Err(RemoteError::Config(msg)) => assert!(msg.contains(expect), "{msg}"),
            Err(other) => panic!("expected a configuration error about {expect}, got {other}"),
            Ok(_) => panic!("a node started with a bad {expect}"),
        }
    };
    refused(config("a").secret(Vec::new()), "secret").await;
    refused(
        config("a").max_frame_len(u32::MAX as usize + 1),
        "max_frame_len must be at most",
    )
    .await;
    refused(
        config("a").handshake_timeout(Duration::ZERO),
        "handshake_timeout",
    )
    .await;
    let mut short = config("a");
    short.max_reply_wait = Duration::ZERO;
    refused(short, "max_reply_wait").await;
    // "Never time out" written as `Duration::MAX` would overflow a deadline.
    refused(
        config("a").handshake_timeout(Duration::MAX),
        "handshake_timeout must be at most 365 days",
    )
    .await;
    let mut long = config("a");
    long.idle_timeout = Duration::MAX;
    refused(long, "idle_timeout must be at most").await;
    // Every node bound to 0.0.0.0 without `advertise` would claim the same address.
    refused(config("a").bind("0.0.0.0:0"), "advertise").await;
    refused(
        config("a").bind("127.0.0.1:0").advertise("[::]:2552"),
        "advertise",
    )
    .await;
    // Binding to every interface is fine with an address to advertise.
    let (_system, node) =
        node_with(config("a").bind("0.0.0.0:0").advertise("127.0.0.1:2552")).await;
    assert_eq!(node.addr(), "127.0.0.1:2552");
}

/// A node that advertises another node's address is refused by it instead of being
/// installed as that node's own loopback (where its answers would never leave); the
/// handshake's unit tests cover the other direction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_advertising_this_nodes_address_is_refused() {
    let (sys_a, a) = node("a").await;
    let _seen = echo(&sys_a, &a);
    let (_sys_b, b) = node_with(config("b").advertise(a.addr().to_string())).await;
    let err = b.connect(a.addr()).await.unwrap_err();
    match &err {
        // The dialer sees the conflict first, in a's challenge, and refuses it.
        RemoteError::Handshake(HandshakeError::Refused { reason, detail }) => {
            assert_eq!(*reason, RejectReason::Protocol);
            assert!(detail.contains("own address"), "{detail}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(b.connection(a.addr()).is_none());
    // a keeps serving: a well-configured node gets its answers.
    let (_sys_c, c) = node("c").await;
    let to_a = c.lookup::<Echo>("/user/echo", a.addr());
    assert_eq!(to_a.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
}

/// A host that knows no secret relays a node's own connection back to it (the node dials
/// the relay, which dials the node and passes the bytes through): both ends are the node
/// itself, each side's proof is the one the other checks, and without the refusal of a
/// peer that is this very node the relay would hold an authenticated connection into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_relayed_back_to_itself_is_refused() {
    let (sys_a, a) = node("a").await;
    let _seen = echo(&sys_a, &a);
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap().to_string();
    let target = a.addr().to_string();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = relay.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let err = a.connect(&relay_addr).await.unwrap_err();
    match &err {
        RemoteError::Handshake(HandshakeError::Refused { reason, detail })
        | RemoteError::Handshake(HandshakeError::RefusedByPeer { reason, detail }) => {
            assert_eq!(*reason, RejectReason::Protocol);
            assert!(detail.contains("this node itself"), "{detail}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(a.connection(&relay_addr).is_none());
    // a keeps serving others.
    let (_sys_c, c) = node("c").await;
    let to_a = c.lookup::<Echo>("/user/echo", a.addr());
    assert_eq!(to_a.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
}
