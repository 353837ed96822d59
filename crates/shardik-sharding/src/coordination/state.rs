//! The replicated coordinator state and the updates that change it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::protocol::{Epoch, FencingToken, RegionId, Version};
use crate::ShardId;

/// What is known about a registered region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// Proxy-only: routes, never hosts.
    pub proxy: bool,
}

/// The coordinator state of one entity type, as replicated to a majority by the IO layer.
///
/// It changes only through [`StateUpdate`]s applied in version order
/// ([`CoordinatorState::apply`]); a new coordinator starts from the latest replicated copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    /// The epoch of the last coordinator that persisted its start.
    pub epoch: Epoch,
    /// The version of the last applied update.
    pub version: Version,
    /// The shard count of the entity type.
    pub shard_count: u32,
    /// Registered regions.
    pub regions: BTreeMap<RegionId, RegionInfo>,
    /// Shard → hosting region.
    pub shards: BTreeMap<ShardId, RegionId>,
    /// Every shard ever allocated (used with remember-shards to restart them eagerly).
    pub remembered: BTreeSet<ShardId>,
    /// The fencing token of each allocated shard's current allocation (absent: allocated by
    /// a coordinator that did not hand out tokens).
    #[serde(default)]
    pub tokens: BTreeMap<ShardId, FencingToken>,
    /// The highest fencing token ever handed out; the next one is higher.
    #[serde(default)]
    pub last_token: FencingToken,
}

/// One change of the coordinator state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// A coordinator with this epoch took over (always its first update).
    EpochStarted,
    /// A region registered (or changed its proxy flag).
    RegionRegistered {
        /// The region.
        region: RegionId,
        /// Proxy-only.
        proxy: bool,
    },
    /// A region is gone (downed or exited); its shards become unallocated.
    RegionRemoved {
        /// The region.
        region: RegionId,
    },
    /// A shard is allocated to a region.
    ShardAllocated {
        /// The shard.
        shard: ShardId,
        /// Its new home.
        region: RegionId,
        /// The allocation's fencing token, higher than every token handed out before it
        /// (0 from a coordinator that did not hand out tokens).
        #[serde(default)]
        token: FencingToken,
    },
    /// A shard is unallocated (its owner stopped it).
    ShardDeallocated {
        /// The shard.
        shard: ShardId,
    },
}

/// A versioned change, emitted by [`Action::Persist`](super::Action::Persist).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateUpdate {
    /// The epoch of the coordinator that made it.
    pub epoch: Epoch,
    /// Its version: the previous state's version + 1.
    pub version: Version,
    /// The change.
    pub change: Change,
}

/// Why an update could not be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// Updates must be applied in version order without gaps.
    #[error("update version {got} does not follow state version {have}")]
    VersionGap {
        /// The state's version.
        have: Version,
        /// The update's version.
        got: Version,
    },
    /// An update from an older coordinator than the one that already wrote.
    #[error("update of epoch {got} is older than the state's epoch {have}")]
    StaleEpoch {
        /// The state's epoch.
        have: Epoch,
        /// The update's epoch.
        got: Epoch,
    },
}

impl CoordinatorState {
    /// The empty state of a fresh entity type (epoch 0, version 0).
    pub fn new(shard_count: u32) -> Self {
        CoordinatorState {
            epoch: 0,
            version: 0,
            shard_count,
            regions: BTreeMap::new(),
            shards: BTreeMap::new(),
            remembered: BTreeSet::new(),
            tokens: BTreeMap::new(),
            last_token: 0,
        }
    }

    /// Apply one update. The IO layer uses this to fold replicated updates; it refuses gaps and
    /// updates from a coordinator older than the last one that wrote (a fenced-off coordinator).
    pub fn apply(&mut self, update: &StateUpdate) -> Result<(), ApplyError> {
        if update.version != self.version + 1 {
            return Err(ApplyError::VersionGap {
                have: self.version,
                got: update.version,
            });
        }
        if update.epoch < self.epoch {
            return Err(ApplyError::StaleEpoch {
                have: self.epoch,
                got: update.epoch,
            });
        }
        self.apply_change(&update.change);
        self.epoch = update.epoch;
        self.version = update.version;
        Ok(())
    }

    fn apply_change(&mut self, change: &Change) {
        match change {
            Change::EpochStarted => {}
            Change::RegionRegistered { region, proxy } => {
                self.regions
                    .insert(region.clone(), RegionInfo { proxy: *proxy });
            }
            Change::RegionRemoved { region } => {
                self.regions.remove(region);
                let shards = &mut self.shards;
                self.tokens.retain(|s, _| shards.get(s) != Some(region));
                shards.retain(|_, r| r != region);
            }
            Change::ShardAllocated {
                shard,
                region,
                token,
            } => {
                self.shards.insert(*shard, region.clone());
                self.remembered.insert(*shard);
                if *token == 0 {
                    self.tokens.remove(shard);
                } else {
                    self.tokens.insert(*shard, *token);
                }
                self.last_token = self.last_token.max(*token);
            }
            Change::ShardDeallocated { shard } => {
                self.shards.remove(shard);
                self.tokens.remove(shard);
            }
        }
    }

    /// The home of a shard.
    pub fn home(&self, shard: ShardId) -> Option<&RegionId> {
        self.shards.get(&shard)
    }

    /// The fencing token of a shard's current allocation; 0 if it is unallocated or was
    /// allocated without one.
    pub fn token(&self, shard: ShardId) -> FencingToken {
        self.tokens.get(&shard).copied().unwrap_or(0)
    }

    /// The token for a new allocation at wall-clock time `unix_micros`: that time, or one
    /// above the last token if the clock is behind it, so tokens only grow.
    pub fn next_token(&self, unix_micros: u64) -> FencingToken {
        unix_micros.max(self.last_token.saturating_add(1))
    }

    /// Shards per region (every registered region, also those with none).
    pub fn shards_per_region(&self) -> BTreeMap<RegionId, Vec<ShardId>> {
        let mut out: BTreeMap<RegionId, Vec<ShardId>> = self
            .regions
            .keys()
            .map(|r| (r.clone(), Vec::new()))
            .collect();
        for (shard, region) in &self.shards {
            out.entry(region.clone()).or_default().push(*shard);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upd(version: Version, change: Change) -> StateUpdate {
        StateUpdate {
            epoch: 1,
            version,
            change,
        }
    }

    #[test]
    fn apply_in_order_and_refuse_gaps_and_stale_epochs() {
        let mut s = CoordinatorState::new(10);
        let r = RegionId::new("a");
        s.apply(&upd(1, Change::EpochStarted)).unwrap();
        s.apply(&upd(
            2,
            Change::RegionRegistered {
                region: r.clone(),
                proxy: false,
            },
        ))
        .unwrap();
        assert_eq!(
            s.apply(&upd(4, Change::ShardDeallocated { shard: 1 })),
            Err(ApplyError::VersionGap { have: 2, got: 4 })
        );
        s.apply(&upd(
            3,
            Change::ShardAllocated {
                shard: 1,
                region: r.clone(),
                token: 7,
            },
        ))
        .unwrap();
        assert_eq!(s.home(1), Some(&r));
        let mut newer = upd(4, Change::EpochStarted);
        newer.epoch = 2;
        s.apply(&newer).unwrap();
        assert_eq!(
            s.apply(&upd(5, Change::ShardDeallocated { shard: 1 })),
            Err(ApplyError::StaleEpoch { have: 2, got: 1 })
        );
        s.apply(&StateUpdate {
            epoch: 2,
            version: 5,
            change: Change::RegionRemoved { region: r.clone() },
        })
        .unwrap();
        assert_eq!(s.home(1), None);
        assert!(s.remembered.contains(&1));
    }

    #[test]
    fn tokens_follow_allocations_and_the_last_one_never_goes_down() {
        let mut s = CoordinatorState::new(10);
        let (a, b) = (RegionId::new("a"), RegionId::new("b"));
        let alloc = |shard, region: &RegionId, token| Change::ShardAllocated {
            shard,
            region: region.clone(),
            token,
        };
        let changes = [
            alloc(1, &a, 100),
            alloc(2, &b, 200),
            alloc(3, &a, 300),
            Change::ShardDeallocated { shard: 3 },
            Change::RegionRemoved { region: b.clone() },
            // An older coordinator allocates without a token.
            alloc(2, &a, 0),
        ];
        for (v, change) in changes.into_iter().enumerate() {
            s.apply(&upd(v as u64 + 1, change)).unwrap();
        }
        assert_eq!((s.token(1), s.token(2), s.token(3)), (100, 0, 0));
        assert_eq!(s.last_token, 300, "handed out once, so never again");
        assert_eq!(s.next_token(0), 301);
        assert_eq!(s.next_token(5_000), 5_000);
    }

    /// A state replicated or stored before fencing tokens existed (named MessagePack, as the
    /// IO layer writes it) reads back with no tokens.
    #[test]
    fn a_state_from_before_tokens_decodes_without_them() {
        #[derive(Serialize)]
        struct Before {
            epoch: Epoch,
            version: Version,
            shard_count: u32,
            regions: BTreeMap<RegionId, RegionInfo>,
            shards: BTreeMap<ShardId, RegionId>,
            remembered: BTreeSet<ShardId>,
        }
        let before = Before {
            epoch: 3,
            version: 9,
            shard_count: 10,
            regions: BTreeMap::new(),
            shards: [(4, RegionId::new("a"))].into(),
            remembered: [4].into(),
        };
        let bytes = rmp_serde::to_vec_named(&before).unwrap();
        let s: CoordinatorState = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(s.home(4), Some(&RegionId::new("a")));
        assert_eq!((s.token(4), s.last_token), (0, 0));
        #[derive(Serialize)]
        enum OldChange {
            ShardAllocated { shard: ShardId, region: RegionId },
        }
        let bytes = rmp_serde::to_vec_named(&OldChange::ShardAllocated {
            shard: 4,
            region: RegionId::new("a"),
        })
        .unwrap();
        let c: Change = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            c,
            Change::ShardAllocated {
                shard: 4,
                region: RegionId::new("a"),
                token: 0
            }
        );
    }
}
