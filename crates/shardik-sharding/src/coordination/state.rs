//! The replicated coordinator state and the updates that change it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::protocol::{Epoch, RegionId, Version};
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
                self.shards.retain(|_, r| r != region);
            }
            Change::ShardAllocated { shard, region } => {
                self.shards.insert(*shard, region.clone());
                self.remembered.insert(*shard);
            }
            Change::ShardDeallocated { shard } => {
                self.shards.remove(shard);
            }
        }
    }

    /// The home of a shard.
    pub fn home(&self, shard: ShardId) -> Option<&RegionId> {
        self.shards.get(&shard)
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
}
