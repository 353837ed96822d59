//! A restarted peer (same address, new incarnation) is reconnected to; asks to a dead node
//! fail within their timeout.

mod common;

use std::time::{Duration, Instant};

use common::*;
use shardik_actor::AskError;
use shardik_remote::{Lane, RemoteEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_peer_restarts_with_a_new_incarnation() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let addr_b = b.addr().to_string();
    let _seen = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", &addr_b);
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    let old_incarnation = b.incarnation();
    let mut events = a.events();

    // B goes away.
    sys_b.shutdown().await;
    b.shutdown().await;
    wait_event(&mut events, |e| {
        matches!(e, RemoteEvent::Disconnected { .. })
    })
    .await;
    assert!(a.connection(&addr_b).is_none());

    // An ask to the dead node fails with its timeout, not later.
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    assert_eq!(
        to_b.ask(|reply| Echo::Inc { n: 2, reply }, timeout).await,
        Err(AskError::Timeout(timeout))
    );
    assert!(started.elapsed() < timeout + Duration::from_secs(1));

    // B comes back on the same address as a new incarnation.
    let (sys_b2, b2) = node_with(config("b").bind(addr_b.clone())).await;
    assert_eq!(b2.addr(), addr_b);
    assert_ne!(b2.incarnation(), old_incarnation);
    let _seen2 = echo(&sys_b2, &b2);
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 3, reply }, T).await, Ok(4));
    let e = wait_event(&mut events, |e| {
        matches!(e, RemoteEvent::PeerRestarted { .. })
    })
    .await;
    assert_eq!(
        e,
        RemoteEvent::PeerRestarted {
            addr: addr_b.clone(),
            old: old_incarnation,
            new: b2.incarnation()
        }
    );
    assert_eq!(
        a.connection(&addr_b).unwrap().peer.incarnation,
        b2.incarnation()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_remade_on_demand() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let mut seen = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let mut events = a.events();
    to_b.tell(Echo::Record { from: 1, n: 1 });
    assert_eq!(next(&mut seen).await, (1, 1));
    // The message made the user connection; `a`, its dialer, makes the control connection
    // right after. Both are up before they are cut.
    wait_event(&mut events, |e| {
        matches!(
            e,
            RemoteEvent::Connected {
                lane: Lane::Control,
                ..
            }
        )
    })
    .await;
    let first = a.connection(b.addr()).unwrap();
    a.disconnect(b.addr());
    wait_event(&mut events, |e| {
        matches!(e, RemoteEvent::Disconnected { .. })
    })
    .await;
    to_b.tell(Echo::Record { from: 1, n: 2 });
    assert_eq!(next(&mut seen).await, (1, 2));
    let second = a.connection(b.addr()).unwrap();
    assert_ne!(first.local, second.local);
    assert_eq!(second.peer.incarnation, b.incarnation());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_address_times_out_and_backs_off() {
    let (_sys_a, a) =
        node_with(config("a").backoff(Duration::from_millis(20), Duration::from_millis(100))).await;
    let dead = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let to = a.lookup::<Echo>("/user/echo", &dead);
    let timeout = Duration::from_millis(400);
    let started = Instant::now();
    assert_eq!(
        to.ask(|reply| Echo::Inc { n: 1, reply }, timeout).await,
        Err(AskError::Timeout(timeout))
    );
    assert!(started.elapsed() < timeout + Duration::from_secs(1));
    assert!(a.connection(&dead).is_none());
    assert!(matches!(
        a.connect(&dead).await,
        Err(shardik_remote::RemoteError::Connect { .. })
    ));
}
