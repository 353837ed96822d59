//! Smoke test of the `sharding` suite: a quick run of a few fast benchmarks (two processes on
//! loopback) must print well-formed records with the JSON contract.

use std::process::Command;

#[test]
fn sharding_suite_quick_prints_well_formed_records() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardik-bench"))
        .args([
            "sharding", "--quick", "--json", "--rounds", "1", "--filter", "local",
        ])
        .output()
        .expect("the benchmark binary runs");
    assert!(
        out.status.success(),
        "the suite failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is a JSON record"))
        .collect();
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["bench"].as_str().expect("bench is a string"))
        .collect();
    for expected in [
        "sharding_tell_local_msgs_per_s",
        "sharding_ask_seq_local_per_s",
        "sharding_ask_seq_local_p50_us",
        "sharding_ask_seq_local_p99_us",
        "sharding_ask_concurrent_local_per_s",
    ] {
        assert!(names.contains(&expected), "missing {expected} in {names:?}");
    }
    for r in &records {
        assert_eq!(r["suite"], "sharding");
        let name = r["bench"].as_str().unwrap();
        assert!(name.contains("local"), "{name} does not match the filter");
        for key in ["value", "baseline", "ratio"] {
            let v = r[key].as_f64().unwrap_or_else(|| panic!("{key} of {name}"));
            assert!(v.is_finite() && v > 0.0, "{key} of {name} is {v}");
        }
        assert!(r["unit"].is_string());
        assert!(r["better"] == "higher" || r["better"] == "lower");
    }
}
