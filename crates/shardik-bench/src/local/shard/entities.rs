//! The shardik variant: one counter entity per key in a [`Region`] of [`SHARDS`] shards.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardik::prelude::*;

use super::driver::Store;
use super::progress;

/// Shards of the counter region.
pub const SHARDS: u32 = 256;
const TIMEOUT: Duration = Duration::from_secs(30);

/// The counter entity's messages.
#[derive(Serialize, Deserialize)]
pub enum CounterMsg {
    /// Add to the counter (a tell).
    Add(u64),
    /// Add to the counter and answer the new value.
    AddGet(u64, ReplyTo<u64>),
    /// Answer the counter.
    Get(ReplyTo<u64>),
}

/// One key's counter.
pub struct Counter {
    count: u64,
}

impl Actor for Counter {
    type Msg = CounterMsg;

    async fn handle(
        &mut self,
        msg: CounterMsg,
        _ctx: &mut Context<Self>,
    ) -> Result<(), ActorError> {
        match msg {
            CounterMsg::Add(n) => {
                self.count += n;
                progress::handled();
            }
            CounterMsg::AddGet(n, reply) => {
                self.count += n;
                reply.reply(self.count);
            }
            CounterMsg::Get(reply) => reply.reply(self.count),
        }
        Ok(())
    }
}

/// A fresh actor system with the counter region started.
#[derive(Clone)]
pub struct Entities {
    system: ActorSystem,
    region: Region<CounterMsg>,
}

impl Store for Entities {
    const SYNC: bool = false;

    async fn start() -> Self {
        let system = ActorSystem::new("bench-shard");
        let region = system
            .sharding()
            .start(EntityType::new("counter", |_id: &str| Counter { count: 0 }).shards(SHARDS))
            .expect("the counter entity type starts");
        Entities { system, region }
    }

    #[inline]
    fn tell_add(&self, key: &'static str) {
        self.region.tell(key, CounterMsg::Add(1));
    }

    async fn ask_add(&self, key: &'static str) -> u64 {
        self.region
            .ask(key, |r| CounterMsg::AddGet(1, r), TIMEOUT)
            .await
            .expect("a counter entity answers")
    }

    async fn get(&self, key: &'static str) -> u64 {
        self.region
            .ask(key, CounterMsg::Get, TIMEOUT)
            .await
            .expect("a counter entity answers")
    }

    async fn stop(self) {
        let dead = self.system.dead_letters();
        self.system.shutdown().await;
        assert_eq!(
            dead.total(),
            0,
            "the shardik variant had dead letters during the run: {dead:?}"
        );
    }
}
