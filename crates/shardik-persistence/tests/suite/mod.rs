//! One store suite, run against every backend by `store_suite!` (see `backends.rs`).
//!
//! Each case is a generic async function over a store that implements all three traits. A
//! backend is added by one `store_suite!(name, make)` line, where `make` is an async function
//! returning `Some((store, guard))`, or `None` (with a printed reason) to skip.

mod entities;
mod evolution;
mod sharding;
mod stores;

pub use entities::*;
pub use evolution::*;
pub use sharding::*;
pub use stores::*;

use shardik_persistence::{AppendRequest, Journal, Payload, SnapshotStore, StateStore};
use shardik_sharding::cluster::ShardingStateStore;

use crate::common::AccountEvent;

/// What every backend under test implements.
pub trait Store: Journal + SnapshotStore + StateStore + ShardingStateStore {}
impl<S: Journal + SnapshotStore + StateStore + ShardingStateStore> Store for S {}

/// Generates one `#[tokio::test]` per suite case for a backend.
#[macro_export]
macro_rules! store_suite {
    ($backend:ident, $make:path) => {
        mod $backend {
            $crate::store_suite!(@cases $make;
                append_and_read_in_order,
                events_keep_their_own_type_and_version,
                append_conflict_writes_nothing,
                two_writers_one_id,
                delete_keeps_the_position,
                bounds_beyond_i64_mean_all_or_nothing,
                snapshots_latest_and_deletion,
                state_store_revisions,
                schema_evolution_upcasts_old_events,
                entity_recovers_through_upcasts,
                batching_many_concurrent_writers,
                mixed_batch_refuses_writes_one_by_one,
                deletes_apply_in_queue_order,
                entity_recovers_from_events,
                entity_recovers_from_snapshot_and_events,
                entity_snapshot_retention,
                entity_with_missing_events_does_not_recover,
                entity_with_a_snapshot_ahead_of_the_journal_does_not_recover,
                corrupt_stored_numbers_fail_with_an_error,
                writers_above_i64_max_are_refused,
                a_type_name_with_the_separator_is_refused,
                entity_conflict_is_not_acknowledged,
                older_node_takes_a_stream_over_and_fences_the_previous_owner,
                stale_owner_stays_fenced_out_after_restarts,
                stale_state_owner_stays_fenced_out_after_restarts,
                durable_state_restored,
                sharding_state_newer_wins,
                sharding_state_concurrent_writers_keep_the_highest,
            );
        }
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                match $make().await {
                    Some((store, _guard)) => $crate::suite::$case(store).await,
                    None => eprintln!(
                        "SKIPPED {}::{}: backend not available",
                        module_path!(),
                        stringify!($case)
                    ),
                }
            }
        )*
    };
}
pub(crate) fn ev(amount: u64) -> Payload {
    Payload::encode(&AccountEvent::Deposited { amount }).unwrap()
}

pub(crate) fn append(pid: &str, expected: u64, writer: u64, amounts: &[u64]) -> AppendRequest {
    AppendRequest {
        persistence_id: pid.to_string(),
        expected_seq_nr: expected,
        writer,
        events: amounts.iter().map(|a| ev(*a)).collect(),
    }
}

pub(crate) async fn amounts<S: Store>(store: &S, pid: &str, from: u64) -> Vec<(u64, u64)> {
    store
        .read(pid, from, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.payload.decode::<AccountEvent>().unwrap() {
            AccountEvent::Deposited { amount } | AccountEvent::Withdrawn { amount } => {
                (e.seq_nr, amount)
            }
        })
        .collect()
}
