//! The rebalance plan: which shards move where in one round.

use std::collections::BTreeMap;

use super::protocol::RegionId;
use crate::ShardId;

/// One planned move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The shard.
    pub shard: ShardId,
    /// Its current home.
    pub from: RegionId,
    /// Where it goes.
    pub to: RegionId,
}

/// Shards one round may move: `max(1, min(ceil(total * percent / 100), absolute))`.
///
/// ```
/// use shardik_sharding::coordination::round_limit;
/// assert_eq!(round_limit(100, 25, 1000), 25);
/// assert_eq!(round_limit(3, 10, 1000), 1);
/// assert_eq!(round_limit(10_000, 25, 1000), 1000);
/// ```
pub fn round_limit(total: usize, percent: u32, absolute: u32) -> usize {
    let relative = (total * percent as usize).div_ceil(100);
    relative.min(absolute as usize).max(1)
}

/// Plan one rebalance round over the hosting regions (`region → its shards`, regions with no
/// shards included), moving at most `limit` shards.
///
/// The target distribution gives every region `floor(total / n)` or `ceil(total / n)` shards
/// (`ceil` to the regions that hold the most, ties by id, so the fewest shards move). Each move
/// takes the highest-numbered shard of the region with the largest excess and gives it to the
/// region with the largest deficit (ties by region id). Without the limit one round reaches
/// `max - min <= 1`; with it, a region joining `n` balanced regions needs
/// `ceil(total / (n + 1) / limit)` rounds: at most 2 with the default 25 % limit.
///
/// ```
/// use std::collections::BTreeMap;
/// use shardik_sharding::coordination::{plan_rebalance, RegionId};
/// let mut regions = BTreeMap::new();
/// regions.insert(RegionId::new("a"), (0..6).collect::<Vec<u32>>());
/// regions.insert(RegionId::new("b"), vec![]);
/// let moves = plan_rebalance(&regions, 10);
/// assert_eq!(moves.len(), 3);
/// assert!(moves.iter().all(|m| m.to == RegionId::new("b")));
/// ```
pub fn plan_rebalance(regions: &BTreeMap<RegionId, Vec<ShardId>>, limit: usize) -> Vec<Move> {
    let n = regions.len();
    if n < 2 {
        return Vec::new();
    }
    let total: usize = regions.values().map(Vec::len).sum();
    let floor = total / n;
    let extra = total % n;
    // Regions holding the most get the ceil targets.
    let mut order: Vec<(&RegionId, usize)> = regions.iter().map(|(r, s)| (r, s.len())).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut target: BTreeMap<&RegionId, usize> = BTreeMap::new();
    for (i, (r, _)) in order.iter().enumerate() {
        target.insert(*r, floor + usize::from(i < extra));
    }
    plan_to_targets(regions, limit, |r| target[r])
}

/// Moves shards from regions holding more than `target(region)` to regions holding fewer, at
/// most `limit` moves: each move from the region with the largest excess to the one with the
/// largest deficit (ties: the lower region id), its highest shard. Deterministic.
pub(crate) fn plan_to_targets(
    regions: &BTreeMap<RegionId, Vec<ShardId>>,
    limit: usize,
    target: impl Fn(&RegionId) -> usize,
) -> Vec<Move> {
    let mut have: BTreeMap<&RegionId, Vec<ShardId>> = regions
        .iter()
        .map(|(r, s)| {
            let mut s = s.clone();
            s.sort_unstable();
            (r, s)
        })
        .collect();
    let mut moves = Vec::new();
    while moves.len() < limit {
        let giver = have
            .iter()
            .filter(|(r, s)| s.len() > target(r))
            .max_by(|a, b| {
                (a.1.len() - target(a.0))
                    .cmp(&(b.1.len() - target(b.0)))
                    .then_with(|| b.0.cmp(a.0))
            })
            .map(|(r, _)| *r);
        let taker = have
            .iter()
            .filter(|(r, s)| s.len() < target(r))
            .max_by(|a, b| {
                (target(a.0) - a.1.len())
                    .cmp(&(target(b.0) - b.1.len()))
                    .then_with(|| b.0.cmp(a.0))
            })
            .map(|(r, _)| *r);
        let (Some(giver), Some(taker)) = (giver, taker) else {
            break;
        };
        let shard = have
            .get_mut(giver)
            .expect("giver present")
            .pop()
            .expect("giver has excess");
        have.get_mut(taker).expect("taker present").push(shard);
        moves.push(Move {
            shard,
            from: giver.clone(),
            to: taker.clone(),
        });
    }
    moves
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Regions `r0..` holding `counts[i]` consecutive shards each.
    pub(in crate::coordination) fn regions(counts: &[usize]) -> BTreeMap<RegionId, Vec<ShardId>> {
        let mut next = 0u32;
        counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let shards = (next..next + *c as u32).collect();
                next += *c as u32;
                (RegionId::new(format!("r{i}")), shards)
            })
            .collect()
    }

    fn apply(
        mut r: BTreeMap<RegionId, Vec<ShardId>>,
        moves: &[Move],
    ) -> BTreeMap<RegionId, Vec<ShardId>> {
        for m in moves {
            let from = r.get_mut(&m.from).unwrap();
            let pos = from.iter().position(|s| *s == m.shard).unwrap();
            from.remove(pos);
            r.get_mut(&m.to).unwrap().push(m.shard);
        }
        r
    }

    fn spread(r: &BTreeMap<RegionId, Vec<ShardId>>) -> usize {
        let max = r.values().map(Vec::len).max().unwrap();
        let min = r.values().map(Vec::len).min().unwrap();
        max - min
    }

    #[test]
    fn unlimited_round_balances_with_minimal_moves() {
        let r = regions(&[34, 33, 33, 0]);
        let moves = plan_rebalance(&r, usize::MAX);
        assert_eq!(moves.len(), 25);
        assert!(spread(&apply(r, &moves)) <= 1);
    }

    #[test]
    fn balanced_needs_no_moves() {
        assert!(plan_rebalance(&regions(&[4, 3, 3]), 100).is_empty());
        assert!(plan_rebalance(&regions(&[10]), 100).is_empty());
    }

    #[test]
    fn join_balances_in_at_most_two_rounds_with_default_limit() {
        for shards in [10usize, 100, 256, 1000] {
            for n in 1..8usize {
                let mut counts = vec![shards / n; n];
                for c in counts.iter_mut().take(shards % n) {
                    *c += 1;
                }
                counts.push(0);
                let mut r = regions(&counts);
                let mut rounds = 0;
                loop {
                    let moves = plan_rebalance(&r, round_limit(shards, 25, 1000));
                    if moves.is_empty() {
                        break;
                    }
                    rounds += 1;
                    r = apply(r, &moves);
                }
                assert!(
                    rounds <= 2,
                    "{shards} shards, {n} + 1 regions: {rounds} rounds"
                );
                assert!(spread(&r) <= 1);
            }
        }
    }

    #[test]
    fn limit_is_respected_and_plan_is_deterministic() {
        let r = regions(&[100, 0, 0]);
        let a = plan_rebalance(&r, 7);
        assert_eq!(a.len(), 7);
        assert_eq!(a, plan_rebalance(&r, 7));
    }
}
