//! Smoke test of the benchmark binary: runs the local suite with `--quick --json` and checks
//! that every line is a well-formed record of the JSON contract. It checks the plumbing
//! (every benchmark runs, the variants agree, the records are consistent), never performance.

use std::process::Command;

use serde_json::Value;

const FIELDS: [&str; 7] = [
    "suite", "bench", "value", "baseline", "ratio", "unit", "better",
];

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

fn run(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_shardik-bench"))
        .args(args)
        .output()
        .expect("the benchmark binary runs");
    assert!(
        out.status.success(),
        "shardik-bench {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect()
}

fn number(record: &Value, field: &str) -> f64 {
    record[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {record}"))
}

fn check(record: &Value) {
    let object = record.as_object().expect("a record is a JSON object");
    for field in FIELDS {
        assert!(object.contains_key(field), "{field} missing in {record}");
    }
    assert_eq!(object.len(), FIELDS.len(), "unexpected fields in {record}");
    assert_eq!(record["suite"], "local");
    let bench = record["bench"].as_str().expect("bench is a string");
    assert!(!bench.is_empty());
    assert!(record["unit"].as_str().is_some_and(|u| !u.is_empty()));
    let (value, baseline, ratio) = (
        number(record, "value"),
        number(record, "baseline"),
        number(record, "ratio"),
    );
    for (name, x) in [("value", value), ("baseline", baseline), ("ratio", ratio)] {
        assert!(x.is_finite() && x > 0.0, "{name} = {x} in {record}");
    }
    let expected = match record["better"].as_str() {
        Some("higher") => value / baseline,
        Some("lower") => baseline / value,
        other => panic!("better is {other:?} in {record}"),
    };
    assert!(
        (ratio - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "ratio {ratio} does not match value and baseline ({expected}) in {record}"
    );
}

#[test]
fn quick_local_suite_prints_well_formed_records() {
    let records = run(&["local", "--quick", "--json"]);
    for record in &records {
        check(record);
    }
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["bench"].as_str().unwrap())
        .collect();
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
    check(&records[0]);
    assert_eq!(records[0]["bench"], "ask_seq_p99_us");
}
