//! Smoke test of the `remote` suite: runs it with `--quick --json` (two processes on loopback)
//! and checks that every line is a well-formed record of the JSON contract and that every
//! benchmark ran. It checks the plumbing (child process, nodes, raw lanes, TLS), never
//! performance.

use std::process::Command;

use serde_json::Value;

const FIELDS: [&str; 7] = [
    "suite", "bench", "value", "baseline", "ratio", "unit", "better",
];

const EXPECTED: [&str; 15] = [
    "remote_tell_1pair_msgs_per_s",
    "remote_tell_4pairs_msgs_per_s",
    "remote_tell_tls_1pair_msgs_per_s",
    "remote_ask_seq_p50_us",
    "remote_ask_seq_p99_us",
    "remote_ask_1k_per_s_p50_us",
    "remote_ask_1k_per_s_p99_us",
    "remote_ask_10k_per_s_p50_us",
    "remote_ask_10k_per_s_p99_us",
    "remote_ask_100k_per_s_p50_us",
    "remote_ask_100k_per_s_p99_us",
    "remote_encode_ns",
    "remote_decode_ns",
    // Names the issue asks for: at least one record each.
    "tell",
    "tls",
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

fn check(record: &Value) {
    let object = record.as_object().expect("a record is a JSON object");
    for field in FIELDS {
        assert!(object.contains_key(field), "{field} missing in {record}");
    }
    assert_eq!(object.len(), FIELDS.len(), "unexpected fields in {record}");
    assert_eq!(record["suite"], "remote");
    assert!(record["bench"].as_str().is_some_and(|b| !b.is_empty()));
    assert!(record["unit"].as_str().is_some_and(|u| !u.is_empty()));
    let number = |f: &str| {
        let x = record[f]
            .as_f64()
            .unwrap_or_else(|| panic!("{f} is not a number in {record}"));
        assert!(x.is_finite() && x > 0.0, "{f} = {x} in {record}");
        x
    };
    let (value, baseline, ratio) = (number("value"), number("baseline"), number("ratio"));
    let expected = match record["better"].as_str() {
        Some("higher") => value / baseline,
        Some("lower") => baseline / value,
        other => panic!("better is {other:?} in {record}"),
    };
    assert!(
        (ratio - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "ratio {ratio} does not match value and baseline in {record}"
    );
}

#[test]
fn quick_remote_suite_prints_well_formed_records() {
    let records = run(&["remote", "--quick", "--json"]);
    for record in &records {
        check(record);
    }
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["bench"].as_str().unwrap())
        .collect();
    for name in EXPECTED {
        assert!(
            names.iter().any(|n| n.contains(name)),
            "{name} missing from {names:?}"
        );
    }
}

#[test]
fn remote_filter_selects_one_rate() {
    let records = run(&[
        "remote",
        "--quick",
        "--json",
        "--rounds",
        "1",
        "--filter",
        "10k_per_s_p99",
    ]);
    assert_eq!(records.len(), 1, "{records:?}");
    check(&records[0]);
    assert_eq!(records[0]["bench"], "remote_ask_10k_per_s_p99_us");
}
