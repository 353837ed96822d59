//! Allocation strategies: which region a new shard goes to, and which shards a rebalance round
//! moves.
//!
//! A strategy is pure: the [`Coordinator`](super::Coordinator) hands it a view of its *working*
//! state (durable plus pending updates plus hand-offs under way, so it never sees stale counts)
//! and it returns a decision. No clocks, no IO. The coordinator checks every decision before it
//! acts on it: a region that is not in the view (not registered with the current epoch, a
//! proxy, leaving, downed or unreachable) is never obeyed; the coordinator logs a warning, counts it in
//! [`CoordinatorStats::allocation_rejected`](super::CoordinatorStats::allocation_rejected) and
//! allocates by [`LeastShards`] instead (an invalid rebalance move is dropped).
//!
//! The coordinator runs on one node at a time, but a new coordinator continues with the
//! strategy of the node it runs on: configure the same strategy on every node.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::protocol::RegionId;
use super::rebalance::{plan_rebalance, plan_to_targets, Move};
use crate::ShardId;

/// What an [`AllocationStrategy`] sees: the regions that may receive shards, with their shards in
/// the coordinator's working state.
#[derive(Clone, Copy, Debug)]
pub struct AllocationView<'a> {
    /// The entity type's shard count.
    pub shard_count: u32,
    /// Every region that may receive a shard (registered with the current epoch, hosting, not
    /// leaving, gone or unreachable while another is reachable), sorted by id, with the shards it holds in the working state; a shard being
    /// handed off to it counts as its already.
    pub regions: &'a BTreeMap<RegionId, Vec<ShardId>>,
}

impl AllocationView<'_> {
    /// The region with the fewest shards, ties broken by the smallest region id.
    pub fn least_loaded(&self) -> Option<&RegionId> {
        self.regions
            .iter()
            .min_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| a.0.cmp(b.0)))
            .map(|(r, _)| r)
    }

    /// `ceil(shard_count / regions)`: how many shards each region holds once every shard is
    /// allocated and the regions are balanced (0 without regions).
    pub fn ceiling(&self) -> usize {
        match self.regions.len() {
            0 => 0,
            n => (self.shard_count as usize).div_ceil(n),
        }
    }
}

/// Where shards go: the allocation of a new shard and the plan of a rebalance round, for one
/// entity type. Set it with
/// [`ClusterShardingSettings::allocation_strategy`](crate::cluster::ClusterShardingSettings::allocation_strategy).
///
/// Both methods must be deterministic functions of their arguments (no clock, no randomness,
/// no IO): the coordinator is a replayable state machine.
///
/// ```
/// use std::collections::BTreeMap;
/// use shardik_sharding::coordination::{AllocationStrategy, AllocationView, Move, RegionId};
/// use shardik_sharding::ShardId;
///
/// /// Even shards to region "a", odd ones to the least loaded; never rebalances.
/// #[derive(Debug)]
/// struct EvenToA;
///
/// impl AllocationStrategy for EvenToA {
///     fn name(&self) -> &str { "even-to-a" }
///     fn allocate(&self, shard: ShardId, _requester: Option<&RegionId>, view: &AllocationView<'_>) -> Option<RegionId> {
///         let a = RegionId::new("a");
///         if shard % 2 == 0 && view.regions.contains_key(&a) {
///             return Some(a);
///         }
///         view.least_loaded().cloned()
///     }
///     fn rebalance(&self, _view: &AllocationView<'_>, _limit: usize) -> Vec<Move> { Vec::new() }
/// }
///
/// let mut regions = BTreeMap::new();
/// regions.insert(RegionId::new("a"), vec![0, 2]);
/// regions.insert(RegionId::new("b"), vec![]);
/// let view = AllocationView { shard_count: 8, regions: &regions };
/// assert_eq!(EvenToA.allocate(4, None, &view), Some(RegionId::new("a")));
/// assert_eq!(EvenToA.allocate(5, None, &view), Some(RegionId::new("b")));
/// ```
pub trait AllocationStrategy: fmt::Debug + Send + Sync + 'static {
    /// A short name for logs and introspection.
    fn name(&self) -> &str;

    /// The region `shard` (unallocated) should live in. `requester` is the region whose
    /// `GetShardHome` triggered the allocation (it may be a proxy, which is not in the view),
    /// `None` when the coordinator allocates on its own (a leaving or downed region's shards,
    /// remembered shards). `None` as the answer means "no opinion": the coordinator uses
    /// [`LeastShards`]. An answer that is not a key of `view.regions` is refused: the
    /// coordinator logs a warning, counts it and allocates with [`LeastShards`] instead.
    fn allocate(
        &self,
        shard: ShardId,
        requester: Option<&RegionId>,
        view: &AllocationView<'_>,
    ) -> Option<RegionId>;

    /// The moves of one rebalance round, at most `limit` of them. Run only while membership
    /// is stable, no region is leaving and no hand-off is running; `view.regions` then holds
    /// every allocated shard of the hosting regions. A move whose shard is not in `from`'s
    /// list, whose `to` is not in the view or equals `from`, or that names a shard twice, is
    /// dropped; moves past `limit` are dropped.
    fn rebalance(&self, view: &AllocationView<'_>, limit: usize) -> Vec<Move>;
}

/// The default strategy: a new shard goes to the region with the fewest shards (ties by
/// region id); a rebalance round moves shards from the fullest regions to the emptiest until
/// every region holds `floor(allocated / regions)` or `ceil(allocated / regions)` shards
/// (the fullest keep the `ceil` ones), that is until the counts differ by at most one
/// ([`plan_rebalance`]), so a join is balanced in at most two rounds with the default
/// per-round limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeastShards;

impl AllocationStrategy for LeastShards {
    fn name(&self) -> &str {
        "least-shards"
    }

    fn allocate(
        &self,
        _shard: ShardId,
        _requester: Option<&RegionId>,
        view: &AllocationView<'_>,
    ) -> Option<RegionId> {
        view.least_loaded().cloned()
    }

    fn rebalance(&self, view: &AllocationView<'_>, limit: usize) -> Vec<Move> {
        plan_rebalance(view.regions, limit)
    }
}

/// Local first: a new shard goes to the region that asked for it (the node whose caller first
/// sent to one of the shard's entities) unless that region already holds
/// [`ceil(shard_count / regions)`](AllocationView::ceiling) shards or is not a hosting region (a
/// proxy, or a node without the type's role); then to the least loaded region, like
/// [`LeastShards`]. Good when callers are co-located with the entities they talk to (each node
/// serves its own users): their messages stay on the node. Shards the coordinator allocates on
/// its own (leave, crash, remembered shards) go to the least loaded region.
///
/// A rebalance round moves only shards over that ceiling (to the regions furthest under it, ties
/// by region id), so the local placement is kept as long as no region holds more than its share
/// of the type's shard count; a node that joins takes the excess of the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalFirst;

impl AllocationStrategy for LocalFirst {
    fn name(&self) -> &str {
        "local-first"
    }

    fn allocate(
        &self,
        _shard: ShardId,
        requester: Option<&RegionId>,
        view: &AllocationView<'_>,
    ) -> Option<RegionId> {
        let ceiling = view.ceiling();
        match requester.and_then(|r| view.regions.get_key_value(r)) {
            Some((r, shards)) if shards.len() < ceiling => Some(r.clone()),
            _ => view.least_loaded().cloned(),
        }
    }

    fn rebalance(&self, view: &AllocationView<'_>, limit: usize) -> Vec<Move> {
        plan_over_ceiling(view.regions, view.ceiling(), limit)
    }
}

/// Moves shards of regions holding more than `ceiling` to the regions holding the fewest (only
/// while they hold fewer than `ceiling`), highest shard first, at most `limit` moves.
fn plan_over_ceiling(
    regions: &BTreeMap<RegionId, Vec<ShardId>>,
    ceiling: usize,
    limit: usize,
) -> Vec<Move> {
    plan_to_targets(regions, limit, |_| ceiling)
}

/// Keeps the moves a coordinator may carry out: shard held by `from`, `to` a region of the view
/// other than `from`, each shard once, at most `limit`. Returns the kept moves and how many were
/// dropped.
pub(crate) fn valid_moves(
    regions: &BTreeMap<RegionId, Vec<ShardId>>,
    moves: Vec<Move>,
    limit: usize,
) -> (Vec<Move>, usize) {
    let mut seen = BTreeSet::new();
    let mut kept = Vec::new();
    let mut dropped = 0;
    for m in moves {
        let ok = kept.len() < limit
            && m.from != m.to
            && regions.contains_key(&m.to)
            && regions.get(&m.from).is_some_and(|s| s.contains(&m.shard))
            && seen.insert(m.shard);
        if ok {
            kept.push(m);
        } else {
            dropped += 1;
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::coordination::rebalance::tests::regions;

    #[test]
    fn least_shards_picks_fewest_then_smallest_id() {
        let r = regions(&[2, 1, 1]);
        let view = AllocationView {
            shard_count: 10,
            regions: &r,
        };
        let asker = RegionId::new("r0");
        assert_eq!(
            LeastShards.allocate(9, Some(&asker), &view),
            Some(RegionId::new("r1"))
        );
        let empty = BTreeMap::new();
        let none = AllocationView {
            shard_count: 10,
            regions: &empty,
        };
        assert_eq!(LeastShards.allocate(9, None, &none), None);
    }

    #[test]
    fn local_first_keeps_shards_at_the_requester_up_to_the_ceiling() {
        // 10 shards over 3 regions: ceiling 4.
        let mut r = regions(&[0, 0, 0]);
        let asker = RegionId::new("r2");
        let mut placed = Vec::new();
        for shard in 0..6 {
            let view = AllocationView {
                shard_count: 10,
                regions: &r,
            };
            let to = LocalFirst.allocate(shard, Some(&asker), &view).unwrap();
            r.get_mut(&to).unwrap().push(shard);
            placed.push(to);
        }
        assert!(placed[..4].iter().all(|p| *p == asker), "{placed:?}");
        // Over the ceiling: least loaded, ties by id.
        assert_eq!(placed[4], RegionId::new("r0"));
        assert_eq!(placed[5], RegionId::new("r1"));
        // A requester that is not a hosting region (a proxy): least loaded.
        let view = AllocationView {
            shard_count: 10,
            regions: &r,
        };
        let proxy = RegionId::new("proxy");
        assert_eq!(
            LocalFirst.allocate(7, Some(&proxy), &view),
            Some(RegionId::new("r0"))
        );
        assert_eq!(
            LocalFirst.allocate(7, None, &view),
            Some(RegionId::new("r0"))
        );
    }

    #[test]
    fn local_first_rebalance_moves_only_the_excess_over_the_ceiling() {
        // Local placement within the ceiling (12 shards, 3 regions: 4) is kept...
        let r = regions(&[4, 1, 0]);
        let view = AllocationView {
            shard_count: 12,
            regions: &r,
        };
        assert!(LocalFirst.rebalance(&view, 100).is_empty());
        // ... where least-shards would even it out.
        assert!(!LeastShards.rebalance(&view, 100).is_empty());
        // A join: 12 shards on 2 regions (6 each), a third joins: ceiling 4.
        let r = regions(&[6, 6, 0]);
        let view = AllocationView {
            shard_count: 12,
            regions: &r,
        };
        let moves = LocalFirst.rebalance(&view, 100);
        assert_eq!(moves.len(), 4);
        assert!(moves.iter().all(|m| m.to == RegionId::new("r2")));
        let limited = LocalFirst.rebalance(&view, 3);
        assert_eq!(limited, moves[..3].to_vec());
    }

    #[test]
    fn invalid_moves_are_dropped() {
        let r = regions(&[2, 0]);
        let a = RegionId::new("r0");
        let b = RegionId::new("r1");
        let ghost = RegionId::new("ghost");
        let mv = |shard, from: &RegionId, to: &RegionId| Move {
            shard,
            from: from.clone(),
            to: to.clone(),
        };
        let (kept, dropped) = valid_moves(
            &r,
            vec![
                mv(0, &a, &ghost), // unknown target
                mv(5, &a, &b),     // shard not held by `from`
                mv(0, &a, &a),     // no move
                mv(0, &a, &b),
                mv(0, &a, &b), // twice
                mv(1, &a, &b), // over the limit
            ],
            1,
        );
        assert_eq!(kept, vec![mv(0, &a, &b)]);
        assert_eq!(dropped, 5);
    }
}
