//! What the smoke tests of every suite share: running the benchmark binary and checking that a
//! record follows the JSON contract. They check the plumbing, never performance.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;

/// The fields of a record, and no others.
pub const FIELDS: [&str; 7] = [
    "suite", "bench", "value", "baseline", "ratio", "unit", "better",
];

/// Runs `shardik-bench args...`, asserts success and parses every stdout line as a record.
pub fn run(args: &[&str]) -> Vec<Value> {
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

/// The `bench` names of `records`, in order.
pub fn names(records: &[Value]) -> Vec<&str> {
    records
        .iter()
        .map(|r| r["bench"].as_str().expect("bench is a string"))
        .collect()
}

/// Checks one record of `suite`: exactly the contract's fields, a non-empty name and unit,
/// positive finite numbers, and a ratio that matches value, baseline and `better`.
pub fn check(record: &Value, suite: &str) {
    let object = record.as_object().expect("a record is a JSON object");
    for field in FIELDS {
        assert!(object.contains_key(field), "{field} missing in {record}");
    }
    assert_eq!(object.len(), FIELDS.len(), "unexpected fields in {record}");
    assert_eq!(record["suite"], suite);
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
        "ratio {ratio} does not match value and baseline ({expected}) in {record}"
    );
}
