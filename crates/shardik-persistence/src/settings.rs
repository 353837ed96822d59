//! [`PersistSettings`] and [`OnPersistFailure`]: snapshots, retention and failure policy.

/// What a persistent entity does when a write fails (store error, concurrency conflict,
/// fenced writer). In every case the command is not acknowledged: its follow-ups (the reply)
/// never run and the in-memory state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnPersistFailure {
    /// Fail the handler with the error, so the actor's supervisor strategy decides; with
    /// the default restart strategy the entity recovers from the store and handles the
    /// next queued command. (The default.)
    #[default]
    Restart,
    /// Stop the entity. A sharded entity's queued commands go to its next incarnation,
    /// which recovers from the store first.
    Stop,
}

/// How an event-sourced or durable-state entity persists.
///
/// ```
/// use shardik_persistence::{OnPersistFailure, PersistSettings};
/// let settings = PersistSettings::default()
///     .snapshot_every(100)          // a snapshot after every 100 events
///     .keep_snapshots(2)            // and only the two latest kept
///     .delete_events_on_snapshot()  // events older than the oldest kept snapshot deleted
///     .on_persist_failure(OnPersistFailure::Stop);
/// # let _ = settings;
/// ```
#[derive(Clone, Debug)]
pub struct PersistSettings {
    pub(crate) snapshot_every: Option<u64>,
    pub(crate) keep_snapshots: Option<u64>,
    pub(crate) delete_events: bool,
    pub(crate) on_failure: OnPersistFailure,
    pub(crate) recovery_batch: usize,
}

impl Default for PersistSettings {
    fn default() -> Self {
        PersistSettings {
            snapshot_every: None,
            keep_snapshots: None,
            delete_events: false,
            on_failure: OnPersistFailure::Restart,
            recovery_batch: 1000,
        }
    }
}

impl PersistSettings {
    /// Saves a snapshot whenever the sequence number crosses a multiple of `events`
    /// (at least 1). Default: no snapshots.
    pub fn snapshot_every(mut self, events: u64) -> Self {
        self.snapshot_every = Some(events.max(1));
        self
    }

    /// Keeps only the snapshots within `(count - 1) × every` events of the newest one (at
    /// least 1; default: all are kept): the latest `count` when a snapshot was saved at every
    /// multiple of [`snapshot_every`](Self::snapshot_every), fewer when a command's events
    /// jumped over a multiple or a save failed. The newest snapshot is always kept.
    pub fn keep_snapshots(mut self, count: u64) -> Self {
        self.keep_snapshots = Some(count.max(1));
        self
    }

    /// After each snapshot, deletes the events that no kept snapshot needs (those up to
    /// the oldest kept snapshot; with no `keep_snapshots`, up to the new snapshot).
    pub fn delete_events_on_snapshot(mut self) -> Self {
        self.delete_events = true;
        self
    }

    /// What to do when a write fails (default [`OnPersistFailure::Restart`]).
    pub fn on_persist_failure(mut self, policy: OnPersistFailure) -> Self {
        self.on_failure = policy;
        self
    }

    /// Events read per query during recovery (default 1000, at least 1).
    pub fn recovery_batch(mut self, events: usize) -> Self {
        self.recovery_batch = events.max(1);
        self
    }

    /// Sequence numbers at or below this are covered by kept snapshots after a snapshot at
    /// `seq_nr`: older snapshots and (if enabled) events up to here may go.
    pub(crate) fn retention_floor(&self, seq_nr: u64) -> u64 {
        let every = self.snapshot_every.unwrap_or(1);
        let keep = self.keep_snapshots.unwrap_or(1);
        seq_nr.saturating_sub((keep - 1).saturating_mul(every))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_floor_keeps_the_latest_snapshots() {
        let s = PersistSettings::default()
            .snapshot_every(10)
            .keep_snapshots(2);
        assert_eq!(s.retention_floor(30), 20);
        assert_eq!(s.retention_floor(31), 21);
        assert_eq!(s.retention_floor(5), 0);
        let one = PersistSettings::default().snapshot_every(10);
        assert_eq!(one.retention_floor(30), 30);
    }
}
