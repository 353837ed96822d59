//! `ReplyTo` on the wire: a request carrying a reply handle is encoded under a
//! `WireContext`, decoded, handled by an actor, and the reply reaches the original asker.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shardik_actor::wire::{with_wire_context, ReplyDeliver, ReplySink, WireContext, WireReplyAddr};
use shardik_actor::{Actor, ActorError, ActorRef, ActorSystem, AskError, Context, ReplyTo};

/// Loops replies back within the process, like a test transport (see the `wire` docs).
#[derive(Default)]
struct Loopback(Mutex<(u64, HashMap<u64, ReplyDeliver>)>);

impl WireContext for Loopback {
    fn export_reply(&self, deliver: ReplyDeliver) -> Result<WireReplyAddr, String> {
        let mut g = self.0.lock();
        g.0 += 1;
        let id = g.0;
        g.1.insert(id, deliver);
        Ok(WireReplyAddr {
            node: "local".into(),
            id,
        })
    }

    fn import_reply(self: Arc<Self>, addr: WireReplyAddr) -> Result<ReplySink, String> {
        Ok(Box::new(move |bytes: Vec<u8>| {
            let deliver = self.0.lock().1.remove(&addr.id);
            if let Some(deliver) = deliver {
                deliver(&bytes).expect("reply decodes");
            }
        }))
    }
}

impl Loopback {
    fn pending(&self) -> usize {
        self.0.lock().1.len()
    }
}

#[derive(Serialize, Deserialize)]
struct Square {
    n: u64,
    label: String,
    reply: ReplyTo<u64>,
}

/// The "remote" side: handles decoded requests.
struct Squarer;

impl Actor for Squarer {
    type Msg = Square;

    async fn handle(&mut self, msg: Square, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        assert_eq!(msg.label, format!("square {}", msg.n));
        msg.reply.reply(msg.n * msg.n);
        Ok(())
    }
}

/// The "local" side of a link: encodes each request and hands the bytes to the decoder.
struct Link {
    ctx: Arc<dyn WireContext>,
    remote: ActorRef<Square>,
}

impl Actor for Link {
    type Msg = Square;

    async fn handle(&mut self, msg: Square, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let bytes = with_wire_context(&self.ctx, || rmp_serde::to_vec_named(&msg))?;
        let decoded: Square = with_wire_context(&self.ctx, || rmp_serde::from_slice(&bytes))?;
        self.remote.tell(decoded);
        Ok(())
    }
}

#[tokio::test]
async fn a_reply_handle_survives_the_round_trip_through_bytes() {
    let system = ActorSystem::new("wire");
    let squarer = system.spawn(Squarer);
    let ctx: Arc<dyn WireContext> = Arc::new(Loopback::default());

    let (reply, rx) = ReplyTo::<u64>::channel();
    let bytes = with_wire_context(&ctx, || {
        rmp_serde::to_vec_named(&Square {
            n: 12,
            label: "square 12".into(),
            reply,
        })
    })
    .unwrap();
    let decoded: Square = with_wire_context(&ctx, || rmp_serde::from_slice(&bytes)).unwrap();
    squarer.tell(decoded);
    assert_eq!(rx.await, Ok(144));
    system.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_through_an_encoding_link_gets_its_reply() {
    let system = ActorSystem::new("wire-ask");
    let loopback = Arc::new(Loopback::default());
    let ctx: Arc<dyn WireContext> = loopback.clone();
    let remote = system.spawn(Squarer);
    let link = system.spawn(Link { ctx, remote });
    for n in 0..20u64 {
        let got = link
            .ask(
                |reply| Square {
                    n,
                    label: format!("square {n}"),
                    reply,
                },
                Duration::from_secs(5),
            )
            .await;
        assert_eq!(got, Ok(n * n));
    }
    assert_eq!(loopback.pending(), 0, "every exported slot was answered");
    system.shutdown().await;
}

#[tokio::test]
async fn serializing_a_reply_handle_without_a_wire_context_is_an_error() {
    let (reply, rx) = ReplyTo::<u64>::channel();
    let err = rmp_serde::to_vec_named(&Square {
        n: 1,
        label: "square 1".into(),
        reply,
    })
    .unwrap_err();
    assert!(err.to_string().contains("wire context"), "{err}");
    // The failed encode dropped the request, and with it the reply channel.
    assert!(rx.await.is_err());

    // Decoding needs a context too.
    let ctx: Arc<dyn WireContext> = Arc::new(Loopback::default());
    let (reply, _rx) = ReplyTo::<u64>::channel();
    let bytes = with_wire_context(&ctx, || rmp_serde::to_vec_named(&reply)).unwrap();
    let err = rmp_serde::from_slice::<ReplyTo<u64>>(&bytes).unwrap_err();
    assert!(err.to_string().contains("wire context"), "{err}");
}

#[tokio::test]
async fn a_reply_handle_is_one_shot_on_the_wire_and_can_be_forwarded_once() {
    let ctx: Arc<dyn WireContext> = Arc::new(Loopback::default());
    let (reply, _rx) = ReplyTo::<u64>::channel();
    with_wire_context(&ctx, || rmp_serde::to_vec_named(&reply)).unwrap();
    let again = with_wire_context(&ctx, || rmp_serde::to_vec_named(&reply)).unwrap_err();
    assert!(again.to_string().contains("already serialized"), "{again}");

    // A handle received from the wire, forwarded again: the answer to the forwarded handle
    // reaches the original asker through a relay slot.
    let (reply, rx) = ReplyTo::<u64>::channel();
    let bytes = with_wire_context(&ctx, || rmp_serde::to_vec_named(&reply)).unwrap();
    let remote: ReplyTo<u64> = with_wire_context(&ctx, || rmp_serde::from_slice(&bytes)).unwrap();
    assert!(!remote.is_closed());
    let forwarded = with_wire_context(&ctx, || rmp_serde::to_vec_named(&remote)).unwrap();
    assert!(remote.is_closed(), "the handle moved into the relay slot");
    let twice = with_wire_context(&ctx, || rmp_serde::to_vec_named(&remote)).unwrap_err();
    assert!(twice.to_string().contains("already serialized"), "{twice}");
    let third: ReplyTo<u64> =
        with_wire_context(&ctx, || rmp_serde::from_slice(&forwarded)).unwrap();
    third.reply(42);
    assert_eq!(rx.await, Ok(42));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_remote_request_times_out_the_ask() {
    struct Silent;
    impl Actor for Silent {
        type Msg = Square;
        async fn handle(
            &mut self,
            _msg: Square,
            _ctx: &mut Context<Self>,
        ) -> Result<(), ActorError> {
            Ok(())
        }
    }
    let system = ActorSystem::new("wire-timeout");
    let ctx: Arc<dyn WireContext> = Arc::new(Loopback::default());
    let remote = system.spawn(Silent);
    let link = system.spawn(Link { ctx, remote });
    let got = link
        .ask(
            |reply| Square {
                n: 2,
                label: "square 2".into(),
                reply,
            },
            Duration::from_secs(3),
        )
        .await;
    // The local sender lives in the transport's slot table, so the asker cannot tell the
    // remote side dropped the request: it waits for its timeout.
    assert_eq!(got, Err(AskError::Timeout(Duration::from_secs(3))));
    system.shutdown().await;
}
