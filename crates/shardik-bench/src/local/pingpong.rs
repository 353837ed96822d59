//! Tell ping-pong: pairs of actors bounce balls back and forth with `tell`.
//!
//! A ball carries the number of bounces left; whoever receives it tells it, decremented, to
//! its partner, and the receiver of the last bounce counts the ball as done. The figure is
//! messages handled per second over all pairs, from the first ball thrown until the last ball
//! is done. The baseline is the same shape with two tokio tasks per pair, each looping over
//! `recv()` on its own unbounded `tokio::sync::mpsc` channel and `send`ing to the partner's.

use std::sync::Arc;
use std::time::Instant;

use shardik::prelude::*;
use tokio::sync::mpsc;

use super::{Ctx, SUITE};
use crate::harness::{block_on_task, Contender, Countdown};
use crate::report::{Better, Record};

/// One pair, one ball: every message wakes an idle receiver (the latency-bound case).
pub const ONE_PAIR: &str = "tell_pingpong_1pair_msgs_per_s";
/// Four pairs with 100 balls each in flight (the throughput-bound case).
pub const FOUR_PAIRS: &str = "tell_pingpong_4pairs_100inflight_msgs_per_s";

/// A ping-pong shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Independent pairs.
    pub pairs: usize,
    /// Balls in flight per pair.
    pub balls: usize,
    /// Bounces per ball (each ball is handled `hops + 1` times).
    pub hops: u32,
}

impl Shape {
    /// Messages handled in one run.
    pub fn messages(&self) -> u64 {
        (self.pairs * self.balls) as u64 * (u64::from(self.hops) + 1)
    }
}

/// `tell_pingpong_1pair_msgs_per_s`: one pair, one ball bounced `pingpong_1pair_msgs` times.
pub fn one_pair(ctx: &Ctx) -> Vec<Record> {
    let shape = Shape {
        pairs: 1,
        balls: 1,
        hops: ctx.sizes.pingpong_1pair_msgs,
    };
    compare(ctx, ONE_PAIR, shape)
}

/// `tell_pingpong_4pairs_100inflight_msgs_per_s`: four pairs, 100 balls in flight per pair.
pub fn four_pairs(ctx: &Ctx) -> Vec<Record> {
    let shape = Shape {
        pairs: 4,
        balls: 100,
        hops: ctx.sizes.pingpong_4pairs_hops,
    };
    compare(ctx, FOUR_PAIRS, shape)
}

fn compare(ctx: &Ctx, name: &str, shape: Shape) -> Vec<Record> {
    let rt = &ctx.rt;
    let mut contenders = [
        Contender::new("shardik", || {
            vec![block_on_task(rt, shardik_pingpong(shape))]
        }),
        Contender::new("tokio mpsc", || {
            vec![block_on_task(rt, tokio_pingpong(shape))]
        }),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        name,
        m[0][0],
        m[1][0],
        "msg/s",
        Better::Higher,
    )]
}

/// A ping-pong message.
pub enum Ball {
    /// Introduces the partner (sent once, before any ball).
    Partner(ActorRef<Ball>),
    /// A ball with this many bounces left.
    Hit(u32),
}

/// One player of a pair.
pub struct Player {
    partner: Option<ActorRef<Ball>>,
    done: Arc<Countdown>,
}

impl Actor for Player {
    type Msg = Ball;

    async fn handle(&mut self, msg: Ball, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        match msg {
            Ball::Partner(p) => self.partner = Some(p),
            Ball::Hit(0) => self.done.hit(),
            Ball::Hit(n) => self
                .partner
                .as_ref()
                .expect("the partner is introduced first")
                .tell(Ball::Hit(n - 1)),
        }
        Ok(())
    }
}

/// One run with shardik actors; returns messages per second.
pub async fn shardik_pingpong(shape: Shape) -> f64 {
    let system = ActorSystem::new("bench-pingpong");
    let done = Countdown::new(shape.pairs * shape.balls);
    let mut servers = Vec::with_capacity(shape.pairs);
    for _ in 0..shape.pairs {
        let player = || Player {
            partner: None,
            done: done.clone(),
        };
        let a = system.spawn(player());
        let b = system.spawn(player());
        // Queued before any ball, so each player knows its partner before the first hit.
        a.tell(Ball::Partner(b.clone()));
        b.tell(Ball::Partner(a.clone()));
        servers.push(a);
    }
    let start = Instant::now();
    for a in &servers {
        for _ in 0..shape.balls {
            a.tell(Ball::Hit(shape.hops));
        }
    }
    done.wait().await;
    let secs = start.elapsed().as_secs_f64();
    drop(servers);
    system.shutdown().await;
    shape.messages() as f64 / secs
}

/// One run with tokio tasks on unbounded mpsc channels; returns messages per second.
pub async fn tokio_pingpong(shape: Shape) -> f64 {
    async fn player(
        mut inbox: mpsc::UnboundedReceiver<u32>,
        partner: mpsc::UnboundedSender<u32>,
        done: Arc<Countdown>,
    ) {
        while let Some(n) = inbox.recv().await {
            if n == 0 {
                done.hit();
            } else {
                let _ = partner.send(n - 1);
            }
        }
    }
    let done = Countdown::new(shape.pairs * shape.balls);
    let mut tasks = Vec::with_capacity(shape.pairs * 2);
    let mut servers = Vec::with_capacity(shape.pairs);
    for _ in 0..shape.pairs {
        let (to_a, inbox_a) = mpsc::unbounded_channel();
        let (to_b, inbox_b) = mpsc::unbounded_channel();
        tasks.push(tokio::spawn(player(inbox_a, to_b, done.clone())));
        tasks.push(tokio::spawn(player(inbox_b, to_a.clone(), done.clone())));
        servers.push(to_a);
    }
    let start = Instant::now();
    for a in &servers {
        for _ in 0..shape.balls {
            let _ = a.send(shape.hops);
        }
    }
    done.wait().await;
    let secs = start.elapsed().as_secs_f64();
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    shape.messages() as f64 / secs
}
