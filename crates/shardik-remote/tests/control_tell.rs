//! `RemoteRef::tell_control`: user messages of a higher layer on the control connection,
//! which a full or busy user lane neither blocks nor delays.

mod common;

use std::time::Duration;

use common::*;
use serde::{Deserialize, Serialize};
use shardik_actor::{Actor, ActorError, Context};
use shardik_remote::{FaultInjector, Lane, RemoteEvent, SendError};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    User(u64),
    Control(u64),
}

/// Reports, for each control message, how many user messages had arrived before it.
struct Recorder {
    users: u64,
    out: mpsc::UnboundedSender<(u64, u64)>,
    total: u64,
    done: mpsc::UnboundedSender<()>,
}

impl Actor for Recorder {
    type Msg = Msg;
    async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Msg::User(_) => {
                self.users += 1;
                if self.users == self.total {
                    let _ = self.done.send(());
                }
            }
            Msg::Control(n) => {
                let _ = self.out.send((n, self.users));
            }
        }
        Ok(())
    }
}

/// Control messages do not wait behind user messages sent before them: with a's user
/// connection held at b, a control message sent after 100 000 user messages is handled
/// first. (b keeps reading the held connection, so this shows the separate connections at
/// the receiver; that the sender's queues are separate is `control_lane.rs`'s subject.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_messages_overtake_queued_user_messages() {
    const N: u64 = 100_000;
    let hold = FaultInjector::new();
    let (_sys_a, a) = node_with(config("a").outbound_queue(N as usize)).await;
    let (sys_b, b) = node_with(config("b").faults(hold.clone())).await;
    let (out, mut seen) = mpsc::unbounded_channel();
    let (done, mut finished) = mpsc::unbounded_channel();
    b.register(
        "/user/rec",
        sys_b.spawn(Recorder {
            users: 0,
            out,
            total: N + 1,
            done,
        }),
    );
    let mut events = a.events();
    let to_b = a.lookup::<Msg>("/user/rec", b.addr());
    // Both connections up (each lane dials on its first message), the control one handled.
    to_b.try_tell(Msg::User(0)).unwrap();
    to_b.try_tell_control(Msg::Control(0)).unwrap();
    let mut up = 0;
    while up < 2 {
        let event = tokio::time::timeout(T, events.recv())
            .await
            .unwrap()
            .unwrap();
        if matches!(event, RemoteEvent::Connected { .. }) {
            up += 1;
        }
    }
    let (n, _) = tokio::time::timeout(T, seen.recv()).await.unwrap().unwrap();
    assert_eq!(n, 0);
    // b handles nothing that arrives on a's user connection until released: the backlog
    // and the control message queued behind it at a are all on their way, and which is
    // handled first is up to the lanes alone.
    hold.hold("a", "b", Lane::User);
    for i in 1..=N {
        to_b.try_tell(Msg::User(i)).unwrap();
    }
    to_b.try_tell_control(Msg::Control(1)).unwrap();
    let (n, users_before) = tokio::time::timeout(T, seen.recv()).await.unwrap().unwrap();
    assert_eq!(n, 1);
    // `User(0)` may or may not have been handled before the hold.
    assert!(
        users_before <= 1,
        "the control message waited behind {users_before} of {N} user messages"
    );
    hold.release("a", "b", Lane::User);
    tokio::time::timeout(Duration::from_secs(30), finished.recv())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_user_lane_does_not_refuse_control_messages() {
    let (_sys_a, a) = node_with(config("a").outbound_queue(4)).await;
    // Nobody listens there: everything stays queued.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let to = a.lookup::<Msg>("/user/rec", &dead);
    for i in 0..4 {
        to.try_tell(Msg::User(i)).unwrap();
    }
    assert!(matches!(
        to.try_tell(Msg::User(4)),
        Err(SendError::QueueFull(_))
    ));
    to.try_tell_control(Msg::Control(1)).unwrap();
    to.tell_control(Msg::Control(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_messages_to_this_node_are_delivered_in_place() {
    let (sys, a) = node("a").await;
    let (out, mut seen) = mpsc::unbounded_channel();
    let (done, _finished) = mpsc::unbounded_channel();
    a.register(
        "/user/rec",
        sys.spawn(Recorder {
            users: 0,
            out,
            total: 1,
            done,
        }),
    );
    a.lookup::<Msg>("/user/rec", a.addr())
        .try_tell_control(Msg::Control(7))
        .unwrap();
    let (n, _) = tokio::time::timeout(T, seen.recv()).await.unwrap().unwrap();
    assert_eq!(n, 7);
}
