//! The fault injector cuts links between named nodes one way or both, and heals them.

mod common;

use std::time::Duration;

use common::*;
use shardik_actor::AskError;
use shardik_remote::FaultInjector;

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
