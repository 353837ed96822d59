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

/// Holds (or drops) the refs it is sent; `Ping` tells the first one held.
#[derive(Serialize, Deserialize)]
enum Keeper {
    Refs {
        keep: bool,
        refs: Vec<RemoteRef<Echo>>,
        reply: shardik_actor::ReplyTo<usize>,
    },
    Ping(shardik_actor::ReplyTo<usize>),
}

struct KeeperActor(Vec<RemoteRef<Echo>>);

impl Actor for KeeperActor {
    type Msg = Keeper;
    async fn handle(&mut self, msg: Keeper, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Keeper::Refs { keep, refs, reply } => {
                if keep {
                    self.0.extend(refs);
                }
                reply.reply(self.0.len());
            }
            Keeper::Ping(reply) => {
                self.0[0].tell(Echo::Record { from: 9, n: 1 });
                reply.reply(self.0.len());
            }
        }
        Ok(())
    }
}

/// Addresses that arrive inside messages (refs to other nodes) do not pile up: once nothing
/// uses their peers any more they are forgotten, dialers and all, while peers that a live
/// ref points at stay and work. A ref whose address is not `host:port` does not decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_learned_from_messages_are_forgotten_once_unused() {
    let (sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let mut seen_a = echo(&sys_a, &a);
    b.register("/user/keeper", sys_b.spawn(KeeperActor(Vec::new())));
    let keeper = a.lookup::<Keeper>("/user/keeper", b.addr());
    // Nothing listens at these (port 1 of a documentation network); nothing is sent there.
    let bogus = |from: u32, n: u32| -> Vec<RemoteRef<Echo>> {
        (from..from + n)
            .map(|i| a.lookup("/user/echo", &format!("192.0.2.{}:{}", i % 250, 1000 + i)))
            .collect()
    };
    let send = |keep: bool, refs: Vec<RemoteRef<Echo>>| {
        keeper.ask(move |reply| Keeper::Refs { keep, refs, reply }, T)
    };

    // 500 refs, dropped by the keeper once handled.
    assert_eq!(send(false, bogus(0, 500)).await, Ok(0));
    let learned = b.known_peers();
    assert!(learned > 500, "b learned the addresses: {learned}");
    assert_eq!(b.stats().peers_forgotten, 0);

    // 500 more, kept, behind a ref to a's echo actor: making their peers looks for idle ones.
    let mut kept = vec![a.lookup("/user/echo", a.addr())];
    kept.extend(bogus(500, 499));
    assert_eq!(send(true, kept).await, Ok(500));
    assert!(
        b.stats().peers_forgotten >= 500,
        "the first 500 were forgotten: {:?}",
        b.stats()
    );
    let now = b.known_peers();
    assert!((500..=502).contains(&now), "the kept ones stay: {now}");

    // A kept ref still works.
    assert_eq!(keeper.ask(Keeper::Ping, T).await, Ok(500));
    assert_eq!(next(&mut seen_a).await, (9, 1));

    // A malformed address fails the message with an error that says why.
    let bad = vec![a.lookup("/user/echo", "no-port-here")];
    match send(true, bad).await {
        Err(shardik_actor::AskError::Undeliverable(why)) => {
            assert!(why.contains("host:port"), "{why}")
        }
        other => panic!("expected Undeliverable, got {other:?}"),
    }
}
