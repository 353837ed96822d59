//! The payload format is pluggable: two nodes that both use JSON tell, ask and answer reply
//! handles made by hand, with refs inside messages; a node with another format is refused with
//! an error that names both formats.

mod common;

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context, ReplyTo};
use shardik_remote::{
    HandshakeError, JsonCodec, RejectReason, RemoteError, RemoteEvent, RemoteRef,
};

fn json(node_id: &str) -> shardik_remote::RemoteConfig {
    config(node_id).payload_format(JsonCodec::format())
}

/// A message that carries a reply handle made by hand and a ref to answer to.
#[derive(Serialize, Deserialize)]
struct Subscribe {
    topic: String,
    answer: ReplyTo<String>,
    notify: RemoteRef<Echo>,
}

struct Subscriptions;
impl Actor for Subscriptions {
    type Msg = Subscribe;
    async fn handle(&mut self, msg: Subscribe, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        msg.answer.reply(format!("subscribed to {}", msg.topic));
        msg.notify.tell(Echo::Record { from: 7, n: 1 });
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tell_ask_and_reply_handles_work_with_json_payloads() {
    let (sys_a, a) = node_with(json("a")).await;
    let (sys_b, b) = node_with(json("b")).await;
    assert_eq!(a.payload_format().name(), "json");
    let mut seen_a = echo(&sys_a, &a);
    let mut seen_b = echo(&sys_b, &b);
    b.register("/user/subs", sys_b.spawn(Subscriptions));

    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    to_b.tell(Echo::Record { from: 1, n: 10 });
    assert_eq!(next(&mut seen_b).await, (1, 10));
    assert_eq!(
        to_b.ask(|reply| Echo::Inc { n: 41, reply }, T).await,
        Ok(42)
    );
    to_b.tell_control(Echo::Record { from: 1, n: 11 });
    assert_eq!(next(&mut seen_b).await, (1, 11));

    let subs = a.lookup::<Subscribe>("/user/subs", b.addr());
    let (answer, rx) = ReplyTo::channel();
    subs.tell(Subscribe {
        topic: "news".into(),
        answer,
        notify: a.lookup("/user/echo", a.addr()),
    });
    let got = tokio::time::timeout(T, rx).await.unwrap().unwrap();
    assert_eq!(got, "subscribed to news");
    assert_eq!(next(&mut seen_a).await, (7, 1));

    // A payload that is not the recipient's type fails the ask with the JSON error.
    #[derive(Serialize, Deserialize)]
    struct Wrong {
        reply: ReplyTo<u64>,
    }
    let wrong = a.lookup::<Wrong>("/user/echo", b.addr());
    match wrong.ask(|reply| Wrong { reply }, T).await {
        Err(shardik_actor::AskError::Undeliverable(why)) => {
            assert!(why.contains("failed to decode"), "{why}")
        }
        other => panic!("expected Undeliverable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_mismatch_names_both_formats_on_both_sides() {
    let (_sys_a, a) = node_with(json("a")).await;
    let (_sys_b, b) = node("b").await;
    let mut events_b = b.events();
    let err = a.connect(b.addr()).await.unwrap_err();
    let RemoteError::Handshake(HandshakeError::RefusedByPeer { reason, detail }) = &err else {
        panic!("unexpected error {err}");
    };
    assert_eq!(*reason, RejectReason::PayloadFormat);
    assert!(
        detail.contains("\"json\"") && detail.contains("\"msgpack-named\""),
        "{detail}"
    );
    let e = wait_event(&mut events_b, |e| {
        matches!(e, RemoteEvent::HandshakeFailed { .. })
    })
    .await;
    let RemoteEvent::HandshakeFailed { by_us, error, .. } = e else {
        unreachable!()
    };
    assert!(by_us);
    assert!(error.contains("payload format mismatch"), "{error}");
    assert!(a.connection(b.addr()).is_none());
}
