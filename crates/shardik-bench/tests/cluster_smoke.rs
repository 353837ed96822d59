//! Smoke test of the `cluster` suite: runs it with `--quick --json` on the 3-node records
//! (a child process killed with SIGKILL, in-process nodes converging) and checks that every
//! line is a well-formed record of the JSON contract. It checks the plumbing, never
//! performance.

mod common;

use common::{check, names, run};

#[test]
fn quick_cluster_suite_prints_well_formed_records() {
    let records = run(&["cluster", "--quick", "--json", "--filter", "3nodes"]);
    assert_eq!(
        names(&records),
        [
            "cluster_unreachable_after_sigkill_3nodes_s",
            "cluster_down_after_sigkill_3nodes_s",
            "cluster_converge_3nodes_s",
        ]
    );
    for r in &records {
        check(r, "cluster");
        assert_eq!(r["unit"], "s");
        assert_eq!(r["better"], "lower");
    }
}
