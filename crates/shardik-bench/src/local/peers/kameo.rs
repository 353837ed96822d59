//! kameo: ping-pong with `tell(..).try_send()` and sequential `ask`, unbounded mailboxes.

use std::sync::Arc;
use std::time::Instant;

use kameo::actor::{ActorRef, Spawn};
use kameo::message::{Context, Message};

use super::Peer;
use crate::harness::{block_on_task, Countdown};
use crate::local::pingpong::Shape;

/// kameo as a [`Peer`].
pub const PEER: Peer = Peer {
    name: "kameo",
    pingpong: |rt, shape| block_on_task(rt, pingpong(shape)),
    asks: |rt, n| block_on_task(rt, asks(n)),
};

/// A ping-pong player.
#[derive(kameo::Actor)]
pub struct Player {
    partner: Option<ActorRef<Player>>,
    done: Arc<Countdown>,
}

/// A ping-pong message.
pub enum Ball {
    /// Introduces the partner.
    Partner(ActorRef<Player>),
    /// A ball with this many bounces left.
    Hit(u32),
}

impl Message<Ball> for Player {
    type Reply = ();

    async fn handle(&mut self, msg: Ball, _ctx: &mut Context<Self, ()>) {
        match msg {
            Ball::Partner(p) => self.partner = Some(p),
            Ball::Hit(0) => self.done.hit(),
            Ball::Hit(n) => {
                let partner = self.partner.as_ref().expect("partner introduced first");
                partner
                    .tell(Ball::Hit(n - 1))
                    .try_send()
                    .unwrap_or_else(|_| panic!("kameo tell failed"));
            }
        }
    }
}

/// One ping-pong run; messages per second.
pub async fn pingpong(shape: Shape) -> f64 {
    let done = Countdown::new(shape.pairs * shape.balls);
    let mut all = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..shape.pairs {
        let player = || Player {
            partner: None,
            done: done.clone(),
        };
        let a = Player::spawn_with_mailbox(player(), kameo::mailbox::unbounded());
        let b = Player::spawn_with_mailbox(player(), kameo::mailbox::unbounded());
        let tell = |to: &ActorRef<Player>, msg| {
            to.tell(msg)
                .try_send()
                .unwrap_or_else(|_| panic!("kameo tell failed"))
        };
        tell(&a, Ball::Partner(b.clone()));
        tell(&b, Ball::Partner(a.clone()));
        servers.push(a.clone());
        all.extend([a, b]);
    }
    for a in &all {
        a.wait_for_startup().await;
    }
    let start = Instant::now();
    for a in &servers {
        for _ in 0..shape.balls {
            a.tell(Ball::Hit(shape.hops))
                .try_send()
                .unwrap_or_else(|_| panic!("kameo tell failed"));
        }
    }
    done.wait().await;
    let secs = start.elapsed().as_secs_f64();
    for a in &all {
        a.kill();
    }
    for a in &all {
        a.wait_for_shutdown().await;
    }
    shape.messages() as f64 / secs
}

/// Replies with the number it was sent.
#[derive(kameo::Actor)]
pub struct Echoer;

/// The ask request.
pub struct Echo(pub u64);

impl Message<Echo> for Echoer {
    type Reply = u64;

    async fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self, u64>) -> u64 {
        msg.0
    }
}

/// One run of `n` recorded sequential asks; `[p50, p99]` in microseconds.
pub async fn asks(n: usize) -> Vec<f64> {
    let echo = Echoer::spawn_with_mailbox(Echoer, kameo::mailbox::unbounded());
    echo.wait_for_startup().await;
    let out = crate::local::ask::record(n, |i| {
        let echo = &echo;
        async move {
            echo.ask(Echo(i))
                .await
                .unwrap_or_else(|_| panic!("kameo ask failed"))
        }
    })
    .await;
    echo.kill();
    echo.wait_for_shutdown().await;
    out
}
