//! Smoke test of the `remote` suite: runs it with `--quick --json` (two processes on loopback)
//! and checks that every line is a well-formed record of the JSON contract and that every
//! benchmark ran. It checks the plumbing (child process, nodes, raw lanes, TLS), never
//! performance.

mod common;

use common::{check, names, run};

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

#[test]
fn quick_remote_suite_prints_well_formed_records() {
    let records = run(&["remote", "--quick", "--json"]);
    for record in &records {
        check(record, "remote");
    }
    let names = names(&records);
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
    check(&records[0], "remote");
    assert_eq!(records[0]["bench"], "remote_ask_10k_per_s_p99_us");
}
