//! ractor: ping-pong with `cast` and sequential `call` (no timeout).

use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::Peer;
use crate::harness::{block_on_task, Countdown};
use crate::local::pingpong::Shape;

/// ractor as a [`Peer`].
pub const PEER: Peer = Peer {
    name: "ractor",
    pingpong: |rt, shape| block_on_task(rt, pingpong(shape)),
    asks: |rt, n| block_on_task(rt, asks(n)),
};

/// A ping-pong message.
pub enum Ball {
    /// Introduces the partner.
    Partner(ActorRef<Ball>),
    /// A ball with this many bounces left.
    Hit(u32),
}

/// A ping-pong player (its state is the partner).
pub struct Player;

impl Actor for Player {
    type Msg = Ball;
    type State = (Option<ActorRef<Ball>>, Arc<Countdown>);
    type Arguments = Arc<Countdown>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Ball>,
        done: Arc<Countdown>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok((None, done))
    }

    async fn handle(
        &self,
        _myself: ActorRef<Ball>,
        msg: Ball,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Ball::Partner(p) => state.0 = Some(p),
            Ball::Hit(0) => state.1.hit(),
            Ball::Hit(n) => {
                let partner = state.0.as_ref().expect("partner introduced first");
                partner
                    .cast(Ball::Hit(n - 1))
                    .unwrap_or_else(|_| panic!("ractor cast failed"));
            }
        }
        Ok(())
    }
}

/// One ping-pong run; messages per second.
pub async fn pingpong(shape: Shape) -> f64 {
    let done = Countdown::new(shape.pairs * shape.balls);
    let mut all = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..shape.pairs {
        let (a, ha) = Actor::spawn(None, Player, done.clone())
            .await
            .expect("ractor actor starts");
        let (b, hb) = Actor::spawn(None, Player, done.clone())
            .await
            .expect("ractor actor starts");
        let cast = |to: &ActorRef<Ball>, msg| {
            to.cast(msg)
                .unwrap_or_else(|_| panic!("ractor cast failed"))
        };
        cast(&a, Ball::Partner(b.clone()));
        cast(&b, Ball::Partner(a.clone()));
        servers.push(a.clone());
        all.extend([(a, ha), (b, hb)]);
    }
    let start = Instant::now();
    for a in &servers {
        for _ in 0..shape.balls {
            a.cast(Ball::Hit(shape.hops))
                .unwrap_or_else(|_| panic!("ractor cast failed"));
        }
    }
    done.wait().await;
    let secs = start.elapsed().as_secs_f64();
    for (a, _) in &all {
        a.stop(None);
    }
    for (_, h) in all {
        let _ = h.await;
    }
    shape.messages() as f64 / secs
}

/// The ask request.
pub struct Echo(pub u64, pub RpcReplyPort<u64>);

/// Replies with the number it was sent.
pub struct Echoer;

impl Actor for Echoer {
    type Msg = Echo;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _myself: ActorRef<Echo>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Echo>,
        msg: Echo,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let _ = msg.1.send(msg.0);
        Ok(())
    }
}

/// One run of `n` recorded sequential asks; `[p50, p99]` in microseconds.
pub async fn asks(n: usize) -> Vec<f64> {
    let (echo, handle) = Actor::spawn(None, Echoer, ())
        .await
        .expect("ractor actor starts");
    let out = crate::local::ask::record(n, |i| {
        let echo = &echo;
        async move {
            match echo.call(|r| Echo(i, r), None).await {
                Ok(ractor::rpc::CallResult::Success(v)) => v,
                _ => panic!("ractor call failed"),
            }
        }
    })
    .await;
    echo.stop(None);
    let _ = handle.await;
    out
}
