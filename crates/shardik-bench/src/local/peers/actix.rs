//! actix: ping-pong with `do_send` and sequential `send(..).await`, each run in its own
//! `actix::System` on a fresh thread (actix actors live on a single-threaded arbiter).

use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, Addr, Context, Handler, Message};

use super::Peer;
use crate::harness::Countdown;
use crate::local::pingpong::Shape;

/// actix as a [`Peer`].
pub const PEER: Peer = Peer {
    name: "actix",
    pingpong: |_rt, shape| in_system(move || pingpong(shape)),
    asks: |_rt, n| in_system(move || asks(n)),
};

/// Runs `f`'s future in a fresh actix system on its own thread and returns its output.
fn in_system<T, F, Fut>(f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    std::thread::spawn(move || {
        let system = actix::System::new();
        let out = system.block_on(f());
        actix::System::current().stop();
        let _ = system.run();
        out
    })
    .join()
    .expect("the actix benchmark thread panicked")
}

/// A ping-pong player.
pub struct Player {
    partner: Option<Addr<Player>>,
    done: Arc<Countdown>,
}

impl Actor for Player {
    type Context = Context<Self>;
}

/// A ping-pong message.
pub enum Ball {
    /// Introduces the partner.
    Partner(Addr<Player>),
    /// A ball with this many bounces left.
    Hit(u32),
}

impl Message for Ball {
    type Result = ();
}

impl Handler<Ball> for Player {
    type Result = ();

    fn handle(&mut self, msg: Ball, _ctx: &mut Context<Self>) {
        match msg {
            Ball::Partner(p) => self.partner = Some(p),
            Ball::Hit(0) => self.done.hit(),
            Ball::Hit(n) => self
                .partner
                .as_ref()
                .expect("partner introduced first")
                .do_send(Ball::Hit(n - 1)),
        }
    }
}

/// One ping-pong run; messages per second.
async fn pingpong(shape: Shape) -> f64 {
    let done = Countdown::new(shape.pairs * shape.balls);
    let mut servers = Vec::new();
    let mut all = Vec::new();
    for _ in 0..shape.pairs {
        let player = || Player {
            partner: None,
            done: done.clone(),
        };
        let a = player().start();
        let b = player().start();
        a.do_send(Ball::Partner(b.clone()));
        b.do_send(Ball::Partner(a.clone()));
        servers.push(a.clone());
        all.extend([a, b]);
    }
    let start = Instant::now();
    for a in &servers {
        for _ in 0..shape.balls {
            a.do_send(Ball::Hit(shape.hops));
        }
    }
    done.wait().await;
    let secs = start.elapsed().as_secs_f64();
    drop(all);
    shape.messages() as f64 / secs
}

/// The ask request.
pub struct Echo(pub u64);

impl Message for Echo {
    type Result = u64;
}

/// Replies with the number it was sent.
pub struct Echoer;

impl Actor for Echoer {
    type Context = Context<Self>;
}

impl Handler<Echo> for Echoer {
    type Result = u64;

    fn handle(&mut self, msg: Echo, _ctx: &mut Context<Self>) -> u64 {
        msg.0
    }
}

/// One run of `n` recorded sequential asks; `[p50, p99]` in microseconds.
async fn asks(n: usize) -> Vec<f64> {
    let echo = Echoer.start();
    crate::local::ask::record(n, |i| {
        let echo = &echo;
        async move { echo.send(Echo(i)).await.expect("actix send failed") }
    })
    .await
}
