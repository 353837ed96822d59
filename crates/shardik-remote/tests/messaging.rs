//! Tell and ask between two and three nodes, replies inside messages, FIFO per pair.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, AskError, Context, ReplyTo};
use shardik_remote::{Lane, RemoteEvent, RemoteRef};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tell_and_ask_both_ways() {
    let (sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let mut seen_a = echo(&sys_a, &a);
    let mut seen_b = echo(&sys_b, &b);

    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let to_a = b.lookup::<Echo>("/user/echo", a.addr());
    to_b.tell(Echo::Record { from: 1, n: 10 });
    to_a.tell(Echo::Record { from: 2, n: 20 });
    assert_eq!(next(&mut seen_b).await, (1, 10));
    assert_eq!(next(&mut seen_a).await, (2, 20));

    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    assert_eq!(
        to_a.ask(|reply| Echo::Inc { n: 41, reply }, T).await,
        Ok(42)
    );

    // One user connection serves both directions.
    let ca = a.connection(b.addr()).expect("a is connected to b");
    let cb = b.connection(a.addr()).expect("b is connected to a");
    assert_eq!((ca.local, ca.remote), (cb.remote, cb.local));
    assert_eq!(ca.peer.node_id, "b");
    assert_eq!(ca.peer.incarnation, b.incarnation());
    sys_a.shutdown().await;
    sys_b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reply_handle_fails_the_ask_without_waiting_for_the_timeout() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let _seen = echo(&sys_b, &b);
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    let started = Instant::now();
    let res = to_b
        .ask(|reply| Echo::Ignore { reply }, Duration::from_secs(30))
        .await;
    assert_eq!(res, Err(AskError::NoReply));
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A message that carries a reply channel made by hand (not by `ask`).
#[derive(Serialize, Deserialize)]
struct Subscribe {
    topic: String,
    answer: ReplyTo<String>,
}

struct Subscriptions;
impl Actor for Subscriptions {
    type Msg = Subscribe;
    async fn handle(&mut self, msg: Subscribe, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        msg.answer.reply(format!("subscribed to {}", msg.topic));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_to_inside_a_told_message_travels_back() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    b.register("/user/subs", sys_b.spawn(Subscriptions));
    let subs = a.lookup::<Subscribe>("/user/subs", b.addr());
    let (answer, rx) = ReplyTo::channel();
    subs.tell(Subscribe {
        topic: "news".into(),
        answer,
    });
    let got = tokio::time::timeout(T, rx).await.unwrap().unwrap();
    assert_eq!(got, "subscribed to news");
}

/// Asks the next node and answers its own asker with the result plus one.
#[derive(Serialize, Deserialize)]
enum Relay {
    Inc { n: u64, reply: ReplyTo<u64> },
}

struct RelayActor {
    next: RemoteRef<Echo>,
}

impl Actor for RelayActor {
    type Msg = Relay;
    async fn handle(&mut self, msg: Relay, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        let Relay::Inc { n, reply } = msg;
        let next = self.next.clone();
        // Answer from a task so the relay keeps handling messages meanwhile.
        tokio::spawn(async move {
            if let Ok(m) = next.ask(|reply| Echo::Inc { n, reply }, T).await {
                reply.reply(m + 1);
            }
        });
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_relay_an_ask_and_reply_to_the_original_sender() {
    let (sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let (sys_c, c) = node("c").await;
    let _seen_c = echo(&sys_c, &c);
    let relay = RelayActor {
        next: b.lookup("/user/echo", c.addr()),
    };
    b.register("/user/relay", sys_b.spawn(relay));
    let to_relay = a.lookup::<Relay>("/user/relay", b.addr());
    for n in 0..20 {
        assert_eq!(
            to_relay.ask(|reply| Relay::Inc { n, reply }, T).await,
            Ok(n + 2)
        );
    }
    // And C reaches A directly.
    let mut seen_a = echo(&sys_a, &a);
    c.lookup::<Echo>("/user/echo", a.addr())
        .tell(Echo::Record { from: 3, n: 3 });
    assert_eq!(next(&mut seen_a).await, (3, 3));
    assert!(a.connection(c.addr()).is_some());
    assert!(a.connection(b.addr()).is_some());
    assert!(b.connection(c.addr()).is_some());
}

/// Passes every request on, unchanged and with the asker's reply handle, to the next node.
struct Forwarder {
    next: RemoteRef<Echo>,
}

impl Actor for Forwarder {
    type Msg = Echo;
    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.next.tell(msg);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_handle_forwarded_to_a_third_node_answers_the_original_asker() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let (sys_c, c) = node("c").await;
    let _seen_c = echo(&sys_c, &c);
    b.register(
        "/user/forward",
        sys_b.spawn(Forwarder {
            next: b.lookup("/user/echo", c.addr()),
        }),
    );
    let to_b = a.lookup::<Echo>("/user/forward", b.addr());
    // C answers B (the node the request came from), which relays to A.
    for n in 0..20 {
        assert_eq!(to_b.ask(|reply| Echo::Inc { n, reply }, T).await, Ok(n + 1));
    }
    // A handle dropped unanswered on C fails A's ask through the relay, without the timeout.
    let started = Instant::now();
    let res = to_b
        .ask(|reply| Echo::Ignore { reply }, Duration::from_secs(30))
        .await;
    assert_eq!(res, Err(AskError::NoReply));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_per_sender_receiver_pair_under_concurrency() {
    const SENDERS: u32 = 4;
    const PER_SENDER: u64 = 5_000;
    let (sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let mut seen_b = echo(&sys_b, &b);
    let mut seen_a = echo(&sys_a, &a);
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let to_b = a.lookup::<Echo>("/user/echo", b.addr());
        let to_a = b.lookup::<Echo>("/user/echo", a.addr());
        tasks.push(tokio::spawn(async move {
            for n in 0..PER_SENDER {
                to_b.tell(Echo::Record { from: s, n });
                to_a.tell(Echo::Record { from: s, n });
                if n % 512 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for seen in [&mut seen_b, &mut seen_a] {
        let mut next = vec![0u64; SENDERS as usize];
        for _ in 0..SENDERS as u64 * PER_SENDER {
            let (s, n) = tokio::time::timeout(T, seen.recv()).await.unwrap().unwrap();
            assert_eq!(n, next[s as usize], "sender {s} out of order");
            next[s as usize] += 1;
        }
        assert!(next.iter().all(|&n| n == PER_SENDER));
    }
    let stats = a.stats();
    assert_eq!(stats.messages_sent, SENDERS as u64 * PER_SENDER);
    assert!(
        stats.write_batches < stats.frames_written,
        "writer batches frames: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_connects_settle_on_one_connection() {
    for _ in 0..5 {
        let (sys_a, a) = node("a").await;
        let (sys_b, b) = node("b").await;
        let mut seen_a = echo(&sys_a, &a);
        let mut seen_b = echo(&sys_b, &b);
        let to_b = a.lookup::<Echo>("/user/echo", b.addr());
        let to_a = b.lookup::<Echo>("/user/echo", a.addr());
        let (ra, rb) = tokio::join!(
            to_b.ask(|reply| Echo::Inc { n: 1, reply }, T),
            to_a.ask(|reply| Echo::Inc { n: 2, reply }, T)
        );
        assert_eq!((ra, rb), (Ok(2), Ok(3)));
        // Messages sent now go over the settled connection; once both arrive, both sides
        // name the same TCP connection.
        to_b.tell(Echo::Record { from: 1, n: 1 });
        to_a.tell(Echo::Record { from: 2, n: 2 });
        assert_eq!(next(&mut seen_b).await, (1, 1));
        assert_eq!(next(&mut seen_a).await, (2, 2));
        let ca = a.connection(b.addr()).unwrap();
        let cb = b.connection(a.addr()).unwrap();
        assert_eq!((ca.local, ca.remote), (cb.remote, cb.local));
        assert_ne!(ca.outbound, cb.outbound);
        sys_a.shutdown().await;
        sys_b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_of_the_own_address_delivers_locally_through_the_same_encoding() {
    let (sys, a) = node("a").await;
    let mut seen = echo(&sys, &a);
    let me = a.lookup::<Echo>("/user/echo", a.addr());
    me.tell(Echo::Record { from: 1, n: 1 });
    assert_eq!(next(&mut seen).await, (1, 1));
    assert_eq!(me.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    assert_eq!(
        me.ask(|reply| Echo::Ignore { reply }, T).await,
        Err(AskError::NoReply)
    );
    let nobody = a.lookup::<Echo>("/user/nobody", a.addr());
    assert!(matches!(
        nobody.ask(|reply| Echo::Inc { n: 1, reply }, T).await,
        Err(AskError::Undeliverable(_))
    ));
    assert!(a.connection(a.addr()).is_none(), "no connection to itself");
}

/// The first message to a peer, sent from a thread outside any runtime: the connection tasks
/// it starts run on the actor system's runtime, and the message arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_tell_from_a_plain_thread_reaches_the_peer() {
    let (sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let mut seen_b = echo(&sys_b, &b);
    let (a2, addr) = (a.clone(), b.addr().to_string());
    std::thread::spawn(move || {
        let to_b = a2.lookup::<Echo>("/user/echo", &addr);
        to_b.tell(Echo::Record { from: 7, n: 1 });
    })
    .join()
    .expect("telling from a plain thread does not panic");
    assert_eq!(next(&mut seen_b).await, (7, 1));
    sys_a.shutdown().await;
    sys_b.shutdown().await;
}

/// What [`Padder`] hears: a request it passes on, with padding, to the next node.
#[derive(Debug, Serialize, Deserialize)]
enum Padded {
    /// Passed on as `Inc` with `pad` bytes beside it.
    Inc {
        n: u64,
        pad: Vec<u8>,
        reply: ReplyTo<u64>,
    },
}

/// Passes `Echo::Inc` on as `Padded::Inc` with `pad` bytes, with the asker's reply handle.
struct Padder {
    next: RemoteRef<Padded>,
    pad: usize,
}

impl Actor for Padder {
    type Msg = Echo;
    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        if let Echo::Inc { n, reply } = msg {
            let pad = vec![0; self.pad];
            // A frame over the limit is not sent: the reply slot it exported is forgotten.
            let _ = self.next.try_tell(Padded::Inc { n, pad, reply });
        }
        Ok(())
    }
}

/// A reply handle that came back through the node's own address (an ask of a local actor
/// through `lookup(…, own address)`) and is passed on in a message that is not sent: the
/// relay slot is forgotten, which drops the handle unanswered, whose `ReplyFailed` to this
/// very node is handled in place. That used to happen under the lock of the reply slots and
/// deadlocked the node's remoting (every later ask and reply of every connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looped_back_reply_handle_in_a_message_too_large_to_send_fails_the_ask() {
    let (sys_a, a) = node_with(config("a").max_frame_len(4096)).await;
    let (sys_b, b) = node("b").await;
    let _seen_b = echo(&sys_b, &b);
    a.register(
        "/user/pad",
        sys_a.spawn(Padder {
            next: a.lookup("/user/padded", b.addr()),
            pad: 64 * 1024,
        }),
    );
    let me = a.lookup::<Echo>("/user/pad", a.addr());
    let started = Instant::now();
    assert_eq!(
        me.ask(|reply| Echo::Inc { n: 1, reply }, Duration::from_secs(30))
            .await,
        Err(AskError::NoReply),
        "the dropped handle fails the ask at once"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The node still serves asks both ways.
    let to_b = a.lookup::<Echo>("/user/echo", b.addr());
    assert_eq!(to_b.ask(|reply| Echo::Inc { n: 2, reply }, T).await, Ok(3));
    let _seen_a = echo(&sys_a, &a);
    let to_a = b.lookup::<Echo>("/user/echo", a.addr());
    assert_eq!(to_a.ask(|reply| Echo::Inc { n: 4, reply }, T).await, Ok(5));
}

/// A registration ends with its actor: the path is then unknown, as if never registered
/// (asks fail at once), and paths of short-lived actors do not accumulate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_ends_when_its_actor_stops() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let (seen, _rx) = tokio::sync::mpsc::unbounded_channel();
    let short = sys_b.spawn(EchoActor { seen });
    assert!(!b.register("/user/short", short.clone()));
    let to = a.lookup::<Echo>("/user/short", b.addr());
    assert_eq!(to.ask(|reply| Echo::Inc { n: 1, reply }, T).await, Ok(2));
    short.stop();
    short.terminated().await;
    tokio::time::timeout(T, async {
        while b.is_registered("/user/short") {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the registration ends soon after its actor");
    assert!(matches!(
        to.ask(|reply| Echo::Inc { n: 2, reply }, T).await,
        Err(AskError::Undeliverable(_))
    ));
}

/// Registering and unregistering a long-lived actor over and over leaves nothing behind:
/// the task that would end each registration with the actor ends with the registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_and_unregistering_a_live_actor_leaves_no_tasks_behind() {
    let (sys, remote) = node("a").await;
    let (seen, _rx) = tokio::sync::mpsc::unbounded_channel();
    let long_lived = sys.spawn(EchoActor { seen });
    let metrics = tokio::runtime::Handle::current().metrics();
    remote.register("/user/warm-up", long_lived.clone());
    remote.unregister("/user/warm-up");
    let before = metrics.num_alive_tasks();
    for i in 0..200 {
        let path = format!("/user/again-{}", i % 3);
        remote.register(&path, long_lived.clone());
        if i % 2 == 0 {
            remote.unregister(&path);
        }
    }
    for i in 0..3 {
        remote.unregister(&format!("/user/again-{i}"));
    }
    tokio::time::timeout(T, async {
        while metrics.num_alive_tasks() > before {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} tasks alive, {before} before", metrics.num_alive_tasks()));
    assert!(!remote.is_registered("/user/again-0"));
}

/// Hands the reply handle of each `Echo::Inc` to the test, which answers when it likes.
struct Holder(tokio::sync::mpsc::UnboundedSender<ReplyTo<u64>>);

impl Actor for Holder {
    type Msg = Echo;
    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        if let Echo::Inc { reply, .. } = msg {
            let _ = self.0.send(reply);
        }
        Ok(())
    }
}

/// An ask sent to a peer under another address than the one it advertises (`localhost`
/// for `127.0.0.1`) takes the answer the peer sends over a connection it made itself, which
/// the asking node knows under the advertised address: answers are matched to their slots
/// by the node that sent them, not by the address of the connection they came on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_peers_own_connection_reaches_an_ask_sent_under_an_alias() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    let (held_tx, mut held) = tokio::sync::mpsc::unbounded_channel();
    b.register("/user/hold", sys_b.spawn(Holder(held_tx)));
    let (mut a_events, mut b_events) = (a.events(), b.events());
    let mut all_a = a.events();
    let port = b.addr().rsplit(':').next().unwrap();
    let alias = format!("localhost:{port}");
    let to_b = a.lookup::<Echo>("/user/hold", &alias);
    let ask = tokio::spawn(async move { to_b.ask(|reply| Echo::Inc { n: 1, reply }, T).await });
    let reply = next(&mut held).await;
    // a dialed both connections under the alias (the control one right after the user one).
    for lane in [Lane::User, Lane::Control] {
        wait_event(&mut a_events, |e| {
            matches!(e, RemoteEvent::Connected { addr, outbound: true, lane: l, .. } if *addr == alias && *l == lane)
        })
        .await;
    }
    // a closes them; b answers once they are gone, over a connection of its own.
    a.disconnect(&alias);
    wait_event(
        &mut b_events,
        |e| matches!(e, RemoteEvent::Disconnected { addr } if addr == a.addr()),
    )
    .await;
    reply.reply(42);
    assert_eq!(ask.await.unwrap(), Ok(42));
    // It came over a user connection b dialed to a, which a knows under b's advertised
    // address: a had such a connection up by the time the answer arrived (its event, not
    // `a.connection`, which a later reconnect may have changed by now).
    let mut from_b = false;
    while let Ok(e) = all_a.try_recv() {
        from_b |= matches!(e, RemoteEvent::Connected { addr, outbound: false, lane: Lane::User, .. } if addr == b.addr());
    }
    assert!(from_b, "b dialed a");
    assert_eq!(a.stats().replies_unmatched, 0);
}

#[derive(Serialize, Deserialize)]
struct Many {
    replies: Vec<ReplyTo<u64>>,
}

/// Answers each reply handle of a [`Many`] with its index.
struct Answerer;

impl Actor for Answerer {
    type Msg = Many;
    async fn handle(&mut self, msg: Many, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        for (i, reply) in msg.replies.into_iter().enumerate() {
            reply.reply(i as u64);
        }
        Ok(())
    }
}

/// A message may carry up to 64 reply handles, each answered across the network; one with
/// more is refused at the sender (the receiver would take it for a malformed frame), and
/// the handles in it fail at once. (Before, any number was sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_carries_at_most_64_reply_handles() {
    let (_sys_a, a) = node("a").await;
    let (sys_b, b) = node("b").await;
    b.register("/user/many", sys_b.spawn(Answerer));
    let to = a.lookup::<Many>("/user/many", b.addr());
    let (replies, answers): (Vec<_>, Vec<_>) = (0..64).map(|_| ReplyTo::channel()).unzip();
    to.try_tell(Many { replies }).unwrap();
    for (i, answer) in answers.into_iter().enumerate() {
        let got = tokio::time::timeout(T, answer)
            .await
            .expect("answered in time");
        assert_eq!(got, Ok(i as u64));
    }
    let (replies, answers): (Vec<_>, Vec<_>) = (0..65).map(|_| ReplyTo::channel()).unzip();
    match to.try_tell(Many { replies }) {
        Err(shardik_remote::SendError::Encode(e)) => {
            assert!(e.contains("at most 64"), "{e}")
        }
        other => panic!("expected an encode error, got {other:?}"),
    }
    for answer in answers {
        let got = tokio::time::timeout(T, answer)
            .await
            .expect("failed at once");
        assert!(got.is_err(), "a handle of the refused message was answered");
    }
}
