//! Smoke test of the benchmark binary: runs the local suite with `--quick --json` and checks
//! that every line is a well-formed record of the JSON contract. It checks the plumbing
//! (every benchmark runs, the variants agree, the records are consistent), never performance.

mod common;

use common::{check, names, run};

/// Records every full local run must produce.
const EXPECTED: [&str; 14] = [
    "tell_pingpong_1pair_msgs_per_s",
    "tell_pingpong_4pairs_100inflight_msgs_per_s",
    "ask_seq_p50_us",
    "ask_seq_p99_us",
    "spawn_per_s",
    "idle_bytes_per_actor",
    "shard_tell_uniform_msgs_per_s",
    "shard_tell_uniform_vs_mutex_msgs_per_s",
    "shard_tell_skewed_msgs_per_s",
    "shard_tell_skewed_vs_mutex_msgs_per_s",
    "shard_ask_uniform_msgs_per_s",
    "shard_ask_uniform_vs_mutex_msgs_per_s",
    "shard_ask_skewed_msgs_per_s",
    "shard_ask_skewed_vs_mutex_msgs_per_s",
];

#[test]
fn quick_local_suite_prints_well_formed_records() {
    let records = run(&["local", "--quick", "--json"]);
    for record in &records {
        check(record, "local");
    }
    let names = names(&records);
    for name in EXPECTED {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
}

#[test]
fn filter_selects_a_subset() {
    let records = run(&[
        "local", "--quick", "--json", "--rounds", "1", "--filter", "p99",
    ]);
    assert_eq!(records.len(), 1, "{records:?}");
    check(&records[0], "local");
    assert_eq!(records[0]["bench"], "ask_seq_p99_us");
}
