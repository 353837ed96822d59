//! Spawn rate: actors created and running per second.
//!
//! One driver task spawns `n` actors and keeps their handles; the clock stops when every one
//! of them has run its first turn (shardik: the `started` hook; baseline: the task's first
//! poll), each of which records itself in a shared countdown. The baseline "actor" is what a
//! tokio program writes by hand: an unbounded mpsc channel plus a task looping on `recv()`,
//! keeping the sender as the handle. Tear-down (shutdown, dropping the senders) is not timed.

use std::sync::Arc;
use std::time::Instant;

use shardik::prelude::*;
use tokio::sync::mpsc;

use super::{Ctx, SUITE};
use crate::harness::{block_on_task, Contender, Countdown};
use crate::report::{Better, Record};

/// Actors spawned (and started) per second.
pub const NAME: &str = "spawn_per_s";

/// `spawn_per_s`.
pub fn spawn_rate(ctx: &Ctx) -> Vec<Record> {
    let rt = &ctx.rt;
    let n = ctx.sizes.spawn;
    let mut contenders = [
        Contender::new("shardik", || vec![block_on_task(rt, shardik_spawn(n))]),
        Contender::new("task+mpsc", || vec![block_on_task(rt, tokio_spawn(n))]),
    ];
    let m = ctx.alternate(&mut contenders);
    vec![Record::new(
        SUITE,
        NAME,
        m[0][0],
        m[1][0],
        "actor/s",
        Better::Higher,
    )]
}

/// An actor that records its start and ignores its messages.
pub struct Starter {
    started: Arc<Countdown>,
}

impl Actor for Starter {
    type Msg = u64;

    async fn started(&mut self, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        self.started.hit();
        Ok(())
    }

    async fn handle(&mut self, _msg: u64, _ctx: &mut Context<Self>) -> Result<(), ActorError> {
        Ok(())
    }
}

/// Spawns `n` shardik actors; returns actors per second.
pub async fn shardik_spawn(n: usize) -> f64 {
    let system = ActorSystem::new("bench-spawn");
    let started = Countdown::new(n);
    let mut refs = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        refs.push(system.spawn(Starter {
            started: started.clone(),
        }));
    }
    started.wait().await;
    let secs = start.elapsed().as_secs_f64();
    drop(refs);
    system.shutdown().await;
    n as f64 / secs
}

/// Spawns `n` task + channel pairs; returns "actors" per second.
pub async fn tokio_spawn(n: usize) -> f64 {
    let started = Countdown::new(n);
    let exited = Countdown::new(n);
    let mut senders = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let (tx, mut rx) = mpsc::unbounded_channel::<u64>();
        let started = started.clone();
        let exited = exited.clone();
        tokio::spawn(async move {
            started.hit();
            while rx.recv().await.is_some() {}
            exited.hit();
        });
        senders.push(tx);
    }
    started.wait().await;
    let secs = start.elapsed().as_secs_f64();
    drop(senders);
    exited.wait().await;
    n as f64 / secs
}
