//! Benchmark records and how they are printed.
//!
//! One [`Record`] per benchmark figure. `--json` prints each as one JSON object per line
//! (the contract every suite keeps):
//!
//! ```text
//! {"suite":"local","bench":"tell_pingpong_1pair_msgs_per_s","value":X,"baseline":Y,"ratio":R,"unit":"msg/s","better":"higher"}
//! ```
//!
//! `ratio` is `value / baseline` when higher is better and `baseline / value` when lower is
//! better, so a ratio above 1 always means shardik did better than the baseline.

use std::io::Write;

use serde::Serialize;

/// Which direction of a figure is good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Throughputs: more is better.
    Higher,
    /// Latencies and sizes: less is better.
    Lower,
}

/// One benchmark figure: shardik's value against the same-run baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// The suite that produced it (`local`, later `remote`, `cluster`, `persistence`).
    pub suite: &'static str,
    /// The benchmark's name, such as `ask_seq_p50_us`.
    pub bench: String,
    /// shardik's figure.
    pub value: f64,
    /// The baseline's figure, measured in the same process run.
    pub baseline: f64,
    /// Above 1 means shardik is better (see the module docs).
    pub ratio: f64,
    /// Unit of `value` and `baseline`.
    pub unit: &'static str,
    /// Whether a higher or a lower figure is better.
    pub better: Better,
}

impl Record {
    /// A record with its ratio computed from `value`, `baseline` and `better`.
    pub fn new(
        suite: &'static str,
        bench: impl Into<String>,
        value: f64,
        baseline: f64,
        unit: &'static str,
        better: Better,
    ) -> Self {
        let ratio = match better {
            Better::Higher => value / baseline,
            Better::Lower => baseline / value,
        };
        Record {
            suite,
            bench: bench.into(),
            value,
            baseline,
            ratio,
            unit,
            better,
        }
    }
}

/// Prints one record as a JSON line on stdout (flushed, so a reader sees it at once).
pub fn print_json(record: &Record) {
    let line = serde_json::to_string(record).expect("a record always serializes");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Prints the records as an aligned table on stdout.
pub fn print_table(records: &[Record]) {
    let width = records
        .iter()
        .map(|r| r.bench.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!(
        "{:<width$}  {:>14}  {:>14}  {:>7}  {:<7}  better",
        "bench", "shardik", "baseline", "ratio", "unit"
    );
    println!("{}", "-".repeat(width + 60));
    for r in records {
        println!(
            "{:<width$}  {:>14}  {:>14}  {:>7.2}  {:<7}  {}",
            r.bench,
            human(r.value),
            human(r.baseline),
            r.ratio,
            r.unit,
            match r.better {
                Better::Higher => "higher",
                Better::Lower => "lower",
            }
        );
    }
}

/// A figure with thousands separators (or two decimals when small).
fn human(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x.abs() < 100.0 {
        return format!("{x:.3}");
    }
    let int = x.round() as i128;
    let digits = int.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if int < 0 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_follows_better() {
        let up = Record::new("local", "a", 8.0, 10.0, "msg/s", Better::Higher);
        assert!((up.ratio - 0.8).abs() < 1e-12);
        let down = Record::new("local", "b", 0.5, 1.0, "us", Better::Lower);
        assert!((down.ratio - 2.0).abs() < 1e-12);
    }

    #[test]
    fn json_has_the_contract_fields() {
        let r = Record::new("local", "x", 2.0, 1.0, "msg/s", Better::Higher);
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for key in [
            "suite", "bench", "value", "baseline", "ratio", "unit", "better",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["better"], "higher");
    }

    #[test]
    fn human_groups_thousands() {
        assert_eq!(human(1_234_567.4), "1,234,567");
        assert_eq!(human(0.5), "0.500");
    }
}
