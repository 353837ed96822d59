//! # Cluster sharding coordination, sans-IO
//!
//! The decisions of cluster sharding as plain state machines: no IO, no tasks, no clock reads
//! (time comes in as milliseconds). A thin IO layer carries their messages over the network,
//! replicates their state and feeds them membership events.
//!
//! * [`Coordinator`] — one per entity type (per role): registered regions, shard → region
//!   allocations, rebalance, hand-offs. Its state ([`CoordinatorState`]) is versioned and carries
//!   the **epoch** of the coordinator that wrote it.
//! * [`RegionState`] — one per entity type per node: the shard-home cache, bounded buffers,
//!   local-vs-remote routing and the region's side of hand-offs.
//! * Messages: [`ToCoordinator`], [`ToRegion`], [`PeerMsg`] (one enum per direction, all serde).
//!
//! ## Life of a shard
//!
//! ```text
//!                 GetShardHome / remembered / eager after hand-off
//!   unallocated ─────────────────────────────────────────────────────▶ allocated(R)
//!        ▲          Persist(ShardAllocated) ─ Persisted ─ ShardHome         │
//!        │                                                                   │ rebalance / RegionLeaving(R)
//!        │ Persisted(ShardDeallocated)                                       ▼
//!        │                                      BeginHandOff ──▶ every region (stop routing, buffer,
//!   handing-off(R) ◀── ShardStopped ◀── R stops   ◀── BeginHandOffAck ──      fence the cached home)
//!   (Stopping)         its entities       HandOff(fences) ──▶ R (owner)
//!        │
//!        │ RegionDown(R) at any point: Persist(RegionRemoved) → unallocated
//!        │ ack timeout (Begin phase): abort, R keeps the shard, ShardHome(R) to all
//! ```
//!
//! 1. **Allocation.** A region with no cached home buffers the message and sends
//!    `GetShardHome`. The coordinator's [`AllocationStrategy`] picks an eligible region
//!    (registered under its epoch, not proxy, not leaving, gone or unreachable: a region whose
//!    node may have crashed keeps its shards but gets no new ones, unless every region that
//!    may host is unreachable) from its *working* state
//!    (durable + pending updates + hand-offs moving there); the default, [`LeastShards`], picks
//!    the one with the fewest shards, ties broken by region id. The coordinator emits
//!    `Persist(ShardAllocated)`; and after `Persisted` broadcasts `ShardHome` to every region.
//!    The new home starts hosting ([`RegionAction::StartShard`]); the others cache the home and
//!    flush their buffers, in order.
//! 2. **Hand-off.** The coordinator sends `BeginHandOff` to every region. Each one stops
//!    routing to the shard and buffers; if it had a remote home cached it sends a
//!    [`PeerMsg::Fence`] to that home on the same channel as its forwarded messages, then acks
//!    (`BeginHandOffAck`, naming where the fence went). The owner, too, buffers its own local
//!    senders but keeps delivering messages forwarded to it. When all acks are in, `HandOff` goes
//!    to the owner with the list of regions that fenced it; once their fences have arrived (so
//!    every message they forwarded before has been delivered) it stops the shard's entities
//!    ([`RegionAction::StopShard`], forced after `stop_timeout_ms`) and answers `ShardStopped`.
//!    The coordinator persists `ShardDeallocated` and `ShardAllocated(target)` and, once durable,
//!    broadcasts the new home; buffers flush to it.
//! 3. **Timeouts.** Missing acks abort the hand-off (nobody was told to stop: the owner keeps
//!    the shard, and everyone is sent `ShardHome(owner)`). A missing `ShardStopped` only makes the
//!    coordinator send `HandOff` again (regions answer it idempotently): a shard is never given
//!    to another region before its owner reported it stopped or was reported down, so there are
//!    never two owners. A fence is sent again while its sender does not know the shard's next
//!    home (a broken connection loses it): after `retry_interval_ms`, then at doubling
//!    intervals up to [`FENCE_RESEND_MAX_INTERVAL_MS`], with no last copy; with
//!    `fence_timeout_ms` the owner also stops once a fence is that late. Regions retry
//!    `Register` and `GetShardHome` every `retry_interval_ms`, and so does an owner whose
//!    hand-off began and has not reached `HandOff` (the `ShardHome` that ends an aborted one
//!    may be lost; the coordinator answers only once the hand-off is over).
//! 4. **Failover.** [`Coordinator::recover`] starts from the replicated state with a higher
//!    epoch and persists it first. Regions re-register ([`RegionInput::CoordinatorChanged`], or
//!    the coordinator's [`ToRegion::StaleEpoch`] call every [`REREGISTER_CALL_MS`] to those that
//!    have not) and receive every durable home; messages of the old epoch are refused on both sides. Hand-offs
//!    wait until every region of the state has re-registered or been reported down.
//!
//! ## Guarantees (given the IO contract in `docs/semantics.md`)
//!
//! * **Single writer**: at most one region hosts a shard's entities at a time.
//! * **Persist before act**: no reply, broadcast or hand-off step depends on an update that is
//!   not yet durable; a new coordinator never assumes updates its predecessor did not persist.
//! * **No loss, no duplicate, per-sender order across hand-offs** for messages that do not pass
//!   through a crashed node; buffers are bounded and overflow is a typed error ([`SendError`]).
//!
//! ```
//! use shardik_sharding::coordination::*;
//!
//! let (mut coord, mut actions) = Coordinator::new(CoordinatorConfig::new(4));
//! // The IO layer replicates the epoch update and reports it persisted.
//! coord.handle(0, Input::Persisted(1), &mut actions);
//! let mut region: RegionState<&str> = RegionState::new(RegionId::new("a"), RegionConfig::new(4));
//! let mut out = Vec::new();
//! region.handle(0, RegionInput::CoordinatorChanged, &mut out);
//! let RegionAction::ToCoordinator(register) = out.remove(0) else { panic!() };
//! actions.clear();
//! coord.handle(0, Input::Message { from: region.id().clone(), msg: register }, &mut actions);
//! // Registration is persisted before it is acknowledged.
//! assert!(matches!(actions[0], Action::Persist(_)));
//! coord.handle(0, Input::Persisted(2), &mut actions);
//! let Action::Send { msg: ack, .. } = actions.pop().unwrap() else { panic!() };
//! region.handle(0, RegionInput::FromCoordinator(ack), &mut out);
//! assert!(region.is_registered());
//! ```

mod allocation;
mod coordinator;
mod protocol;
mod rebalance;
mod region;
mod state;

pub use allocation::{AllocationStrategy, AllocationView, LeastShards, LocalFirst};
pub use coordinator::{
    Action, Coordinator, CoordinatorConfig, CoordinatorStats, HandOffInfo, Input, RecoverError,
    REREGISTER_CALL_MS,
};
pub use protocol::{
    epoch_round, next_epoch, Envelope, Epoch, FencingToken, HandOffId, PeerMsg, RegionId,
    RegisterError, ToCoordinator, ToRegion, Version, EPOCH_TAG_BITS,
};
pub use rebalance::{plan_rebalance, round_limit, Move};
pub use region::{
    RegionAction, RegionConfig, RegionCoordStats, RegionInput, RegionState, Rejected, SendError,
    ShardView, FENCE_RESEND_MAX_INTERVAL_MS,
};
pub use state::{ApplyError, Change, CoordinatorState, RegionInfo, StateUpdate};

#[cfg(test)]
mod tests;
