//! `docs/observability.md` lists every metric the crates emit, and nothing else: each metric
//! name written in the sources (`"shardik_…"` string literals under `crates/*/src`, the
//! benchmark crate aside) has a row in the document's tables, and each row names a metric
//! the sources emit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names in `"shardik_…"` string literals of `text`.
fn literal_names(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split("\"shardik_").skip(1).filter_map(|rest| {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest[name.len()..]
            .starts_with('"')
            .then(|| format!("shardik_{name}"))
    })
}

#[test]
fn the_observability_doc_lists_exactly_the_emitted_metrics() {
    let root = workspace();
    let mut emitted = BTreeSet::new();
    for krate in std::fs::read_dir(root.join("crates")).expect("the crates directory") {
        let krate = krate.expect("a directory entry").path();
        if krate.ends_with("shardik-bench") || !krate.join("src").is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&krate.join("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a readable source file");
            emitted.extend(literal_names(&text));
        }
    }
    assert!(
        emitted.len() >= 30,
        "found only {} metric names; did the sources move?",
        emitted.len()
    );

    let doc =
        std::fs::read_to_string(root.join("docs/observability.md")).expect("docs/observability.md");
    // A table row starts with "| `shardik_…` |".
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_string()))
        .filter(|name| name.starts_with("shardik_"))
        .collect();

    let undocumented: Vec<_> = emitted.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&emitted).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "emitted but not in docs/observability.md: {undocumented:?}; \
         documented but not emitted: {stale:?}"
    );
}
