//! Smoke test of the `sharding` suite: a quick run of a few fast benchmarks (two processes on
//! loopback) must print well-formed records with the JSON contract.

mod common;

use common::{check, names, run};

#[test]
fn sharding_suite_quick_prints_well_formed_records() {
    let records = run(&[
        "sharding", "--quick", "--json", "--rounds", "1", "--filter", "local",
    ]);
    let names = names(&records);
    for expected in [
        "sharding_tell_local_msgs_per_s",
        "sharding_ask_seq_local_per_s",
        "sharding_ask_seq_local_p50_us",
        "sharding_ask_seq_local_p99_us",
        "sharding_ask_concurrent_local_per_s",
    ] {
        assert!(names.contains(&expected), "missing {expected} in {names:?}");
    }
    for (r, name) in records.iter().zip(&names) {
        check(r, "sharding");
        assert!(name.contains("local"), "{name} does not match the filter");
    }
}
