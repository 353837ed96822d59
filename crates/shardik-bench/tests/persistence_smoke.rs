//! Smoke test of the `persistence` suite: runs it with `--quick --json` on the 100-entity
//! SQLite records and checks that every line is a well-formed record of the JSON contract and
//! that the entities acknowledged events. It checks the plumbing, never performance.

mod common;

use common::{check, names, run};

#[test]
fn quick_persistence_suite_prints_well_formed_records() {
    let records = run(&[
        "persistence",
        "--quick",
        "--json",
        "--filter",
        "persist_sqlite_100_entities",
    ]);
    assert_eq!(
        names(&records),
        [
            "persist_sqlite_100_entities",
            "persist_sqlite_100_entities_vs_batched",
        ]
    );
    for r in &records {
        // `check` also requires a positive value: events were acknowledged.
        check(r, "persistence");
        assert_eq!(r["unit"], "events/s");
        assert_eq!(r["better"], "higher");
    }
}
