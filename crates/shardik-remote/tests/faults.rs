//! The fault injector cuts links between named nodes one way or both, and heals them.

mod common;

use std::time::Duration;

use common::*;
use shardik_actor::AskError;
use shardik_remote::{FaultInjector, Lane};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_one_way_then_both_then_heal() {
    let faults = FaultInjector::new();
    let (sys_a, a) = node_with(config("a").faults(faults.clone())).await;
    let (sys_b, b) = node_with(config("b").faults(faults.clone())).await;
    let mut seen_a = echo(&sys_a, &a);
    let mut seen_b = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let to_a = b.lookup::<Echo>("/user/echo", a.addr());
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    let short = Duration::from_millis(300);

    // a -> b cut: a's messages vanish, b's still arrive.
    faults.cut("a", "b");
    for n in 0..10 {
        to_b.tell(Echo::Record { from: 1, n });
    }
    assert_eq!(
        to_b.ask(|reply| Echo::Inc { n: 1, reply }, short).await,
        Err(AskError::Timeout(short))
    );
    assert_eq!(a.queued(b.addr()), 0, "the writer took (and dropped) them");
    to_a.tell(Echo::Record { from: 2, n: 0 });
    assert_eq!(next(&mut seen_a).await, (2, 0));
    // b -> a requests get no answer either: the answers travel a -> b.
    assert_eq!(
        to_a.ask(|reply| Echo::Inc { n: 1, reply }, short).await,
        Err(AskError::Timeout(short))
    );

    // Healed: new messages flow, the dropped ones never come.
    faults.heal("a", "b");
    to_b.tell(Echo::Record { from: 1, n: 100 });
    assert_eq!(next(&mut seen_b).await, (1, 100));
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 5, reply }, T).await, Ok(6));
    assert!(a.stats().fault_dropped >= 11);

    // Both ways.
    faults.cut_both("a", "b");
    let (ra, rb) = tokio::join!(
        to_b.ask(|reply| Echo::Inc { n: 1, reply }, short),
        to_a.ask(|reply| Echo::Inc { n: 1, reply }, short)
    );
    assert_eq!(
        (ra, rb),
        (Err(AskError::Timeout(short)), Err(AskError::Timeout(short)))
    );
    faults.heal_both("a", "b");
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 7, reply }, T).await, Ok(8));
    assert_eq!(to_a.ask(|reply| Echo::Inc { n: 8, reply }, T).await, Ok(9));
    assert!(
        seen_b.try_recv().is_err(),
        "nothing sent during the cut arrived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_to_one_node_leaves_others_alone() {
    let faults = FaultInjector::new();
    let (_sys_a, a) = node_with(config("a").faults(faults.clone())).await;
    let (sys_b, b) = node_with(config("b").faults(faults.clone())).await;
    let (sys_c, c) = node_with(config("c").faults(faults.clone())).await;
    let _sb = echo(&sys_b, &b);
    let _sc = echo(&sys_c, &c);
    faults.cut_both("a", "b");
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let to_c = a.lookup::<Echo>("/user/echo", c.addr());
    let short = Duration::from_millis(300);
    assert_eq!(
        to_b.ask(|reply| Echo::Inc { n: 1, reply }, short).await,
        Err(AskError::Timeout(short))
    );
    assert_eq!(to_c.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    faults.heal_all();
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_one_way_then_both_then_heal() {
    let faults = FaultInjector::new();
    let (sys_a, a) = node_with(config("a").faults(faults.clone())).await;
    let (sys_b, b) = node_with(config("b").faults(faults.clone())).await;
    let mut seen_a = echo(&sys_a, &a);
    let mut seen_b = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let to_a = b.lookup::<Echo>("/user/echo", a.addr());
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    assert_eq!(to_a.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    let d = Duration::from_millis(300);

    // a -> b delayed: a's tells arrive late but all of them, in order; b's are not held.
    faults.delay("a", "b", d);
    let started = std::time::Instant::now();
    for n in 0..50 {
        to_b.tell(Echo::Record { from: 1, n });
    }
    for n in 0..50 {
        assert_eq!(next(&mut seen_b).await, (1, n));
    }
    assert!(started.elapsed() >= d, "held for the delay");
    let started = std::time::Instant::now();
    to_a.tell(Echo::Record { from: 2, n: 0 });
    assert_eq!(next(&mut seen_a).await, (2, 0));
    assert!(started.elapsed() < d, "the other direction is not delayed");
    // A round trip crosses the delayed direction once, whichever side asks.
    for ask in [&to_b, &to_a] {
        let started = std::time::Instant::now();
        assert_eq!(ask.ask(|reply| Echo::Inc { n: 3, reply }, T).await, Ok(4));
        assert!(started.elapsed() >= d);
    }

    // Both ways: a round trip takes at least twice the delay.
    faults.delay_both("a", "b", d);
    let started = std::time::Instant::now();
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 5, reply }, T).await, Ok(6));
    assert!(started.elapsed() >= 2 * d);

    // Removing the delay while frames are held does not reorder them.
    let held = b.stats().fault_delayed;
    for n in 100..110 {
        to_b.tell(Echo::Record { from: 1, n });
    }
    // No event marks a frame's arrival: yield until b's reader has taken all ten in.
    tokio::time::timeout(T, async {
        while b.stats().fault_delayed < held + 10 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the ten tells reach b's reader");
    faults.heal_both("a", "b");
    for n in 110..120 {
        to_b.tell(Echo::Record { from: 1, n });
    }
    for n in 100..120 {
        assert_eq!(next(&mut seen_b).await, (1, n));
    }
    let started = std::time::Instant::now();
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 7, reply }, T).await, Ok(8));
    assert!(started.elapsed() < d, "healed");
    assert_eq!(a.stats().fault_dropped, 0, "a delay drops nothing");
}

/// A held connection: b handles nothing a sends on its user connection until released, while
/// the control connection flows; then everything held, and what follows, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lane_handles_nothing_until_released_then_all_in_order() {
    let faults = FaultInjector::new();
    let (_sys_a, a) = node_with(config("a").faults(faults.clone())).await;
    let (sys_b, b) = node_with(config("b").faults(faults.clone())).await;
    let mut seen_b = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    faults.hold("a", "b", Lane::User);
    for n in 0..10 {
        to_b.tell(Echo::Record { from: 1, n });
    }
    // Sent after them on the other connection, handled before any of them.
    to_b.try_tell_control(Echo::Record { from: 2, n: 0 })
        .unwrap();
    assert_eq!(next(&mut seen_b).await, (2, 0));
    faults.release("a", "b", Lane::User);
    for n in 10..20 {
        to_b.tell(Echo::Record { from: 1, n });
    }
    for n in 0..20 {
        assert_eq!(next(&mut seen_b).await, (1, n));
    }
    // Holding the other connection holds only it.
    faults.hold("a", "b", Lane::Control);
    to_b.try_tell_control(Echo::Record { from: 2, n: 1 })
        .unwrap();
    to_b.tell(Echo::Record { from: 1, n: 20 });
    assert_eq!(next(&mut seen_b).await, (1, 20));
    faults.heal("a", "b");
    assert_eq!(next(&mut seen_b).await, (2, 1));
    assert_eq!(b.stats().fault_dropped, 0, "a hold drops nothing");
}
