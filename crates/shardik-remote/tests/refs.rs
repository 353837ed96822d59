//! Remote refs inside messages travel as (node, path) and resolve on arrival.

mod common;

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context};
use shardik_remote::RemoteRef;

/// "Tell `target` the number `n`."
#[derive(Serialize, Deserialize)]
struct Notify {
    n: u64,
    target: RemoteRef<Echo>,
}

struct Notifier;
impl Actor for Notifier {
    type Msg = Notify;
    async fn handle(&mut self, msg: Notify, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        msg.target.tell(Echo::Record { from: 7, n: msg.n });
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ref_in_a_message_reaches_the_sender_and_a_third_node() {
    let (sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let (sys_c, c) = node("c").await;
    let mut seen_a = echo(&sys_a, &a);
    let mut seen_c = echo(&sys_c, &c);
    b.register("/user/notifier", sys_b.spawn(Notifier));
    let notifier = a.lookup::<Notify>("/user/notifier", b.addr());

    // A sends B a ref to A's own echo actor: B answers through it.
    notifier.tell(Notify {
        n: 1,
        target: a.lookup("/user/echo", a.addr()),
    });
    assert_eq!(next(&mut seen_a).await, (7, 1));

    // A sends B a ref to C's echo actor: B connects to C and tells it.
    notifier.tell(Notify {
        n: 2,
        target: a.lookup("/user/echo", c.addr()),
    });
    assert_eq!(next(&mut seen_c).await, (7, 2));
    assert!(b.connection(c.addr()).is_some());
}

#[test]
fn a_ref_does_not_decode_outside_the_remote_layer() {
    let bytes = rmp_serde::to_vec_named(&serde_json_like()).unwrap();
    let res: Result<RemoteRef<Echo>, _> = rmp_serde::from_slice(&bytes);
    assert!(res.is_err());
}

fn serde_json_like() -> std::collections::BTreeMap<&'static str, &'static str> {
    [("node", "127.0.0.1:1"), ("path", "/user/x")]
        .into_iter()
        .collect()
}
