//! The shard host of a proxy-only region: it never hosts a shard, so it holds no entity.

use std::marker::PhantomData;

use shardik_actor::{ActorSystem, TellError};

use crate::hash::{ShardFn, ShardId};
use crate::region::{RegionCore, ShardHost, ShardStopped};
use crate::stats::RegionStats;

/// Hosts nothing: a proxy region only routes (the coordinator never gives it a shard).
pub(crate) struct NoHost<M> {
    pub(crate) system: ActorSystem,
    pub(crate) type_name: String,
    pub(crate) shard_count: u32,
    pub(crate) shard_fn: ShardFn,
    pub(crate) _msg: PhantomData<fn(M)>,
}

impl<M: Send + 'static> RegionCore<M> for NoHost<M> {
    fn deliver(&self, _shard: ShardId, _id: &str, msg: M) -> Result<(), TellError<M>> {
        Err(TellError::Stopped(msg))
    }
    fn shard_count(&self) -> u32 {
        self.shard_count
    }
    fn shard_of(&self, id: &str) -> ShardId {
        self.shard_fn.shard(id, self.shard_count)
    }
    fn type_name(&self) -> &str {
        &self.type_name
    }
    fn system(&self) -> &ActorSystem {
        &self.system
    }
    fn stats(&self) -> RegionStats {
        RegionStats {
            type_name: self.type_name.clone(),
            shards: self.shard_count,
            ..RegionStats::default()
        }
    }
    fn shard_entities(&self) -> Vec<usize> {
        vec![0; self.shard_count as usize]
    }
    fn passivate(&self, _id: &str) -> bool {
        false
    }
}

impl<M: Send + 'static> ShardHost<M> for NoHost<M> {
    fn stop_shard(&self, _shard: ShardId, done: ShardStopped) {
        done();
    }
    fn force_stop_shard(&self, _shard: ShardId, _unhandled: crate::region::Unhandled<M>) {}
    fn cancel_stops_unless_handing_on(&self, _shards: &[ShardId]) -> bool {
        true
    }
    fn start_entity(&self, _shard: ShardId, _id: &str) {}
    fn deliver_new(&self, shard: ShardId, id: &str, msg: M) -> (bool, Result<(), TellError<M>>) {
        (false, self.deliver(shard, id, msg))
    }
    fn deliver_accepted(
        &self,
        shard: ShardId,
        id: &str,
        msg: M,
    ) -> (bool, Result<(), TellError<M>>) {
        (false, self.deliver(shard, id, msg))
    }
    fn set_fencing_token(&self, _shard: ShardId, _token: Option<crate::FencingToken>) {}
}
