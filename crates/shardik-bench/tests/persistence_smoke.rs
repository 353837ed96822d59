//! Smoke test of the `persistence` suite: runs it with `--quick --json` on the 100-entity
//! SQLite records and checks that every line is a well-formed record of the JSON contract and
//! that the entities acknowledged events. It checks the plumbing, never performance.

use std::process::Command;

use serde_json::Value;

const FIELDS: [&str; 7] = [
    "suite", "bench", "value", "baseline", "ratio", "unit", "better",
];

#[test]
fn quick_persistence_suite_prints_well_formed_records() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardik-bench"))
        .args([
            "persistence",
            "--quick",
            "--json",
            "--filter",
            "persist_sqlite_100_entities",
        ])
        .output()
        .expect("the benchmark binary runs");
    assert!(
        out.status.success(),
        "shardik-bench persistence failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    let records: Vec<Value> = stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect();
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["bench"].as_str().expect("bench is a string"))
        .collect();
    assert_eq!(
        names,
        [
            "persist_sqlite_100_entities",
            "persist_sqlite_100_entities_vs_batched",
        ]
    );
    for r in &records {
        let object = r.as_object().expect("a record is a JSON object");
        for field in FIELDS {
            assert!(object.contains_key(field), "{field} missing in {r}");
        }
        assert_eq!(object.len(), FIELDS.len(), "unexpected fields in {r}");
        assert_eq!(r["suite"], "persistence");
        assert_eq!(r["unit"], "events/s");
        assert_eq!(r["better"], "higher");
        let value = r["value"].as_f64().expect("value is a number");
        assert!(
            value > 0.0 && value.is_finite(),
            "no events acknowledged: {r}"
        );
        assert!(r["baseline"].as_f64().is_some_and(|b| b > 0.0), "{r}");
    }
}
