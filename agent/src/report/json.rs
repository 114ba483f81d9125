//! The machine-readable report (`agent diagnose --json`). Every number in base units
//! (seconds, bytes, bytes/s, fractions). Shape:
//!
//! ```text
//! {"source": str,
//!  "steps": [{"step", "begin", "end", "seconds", "collectives", "incomplete", "notes",
//!             "desyncs": [{"comm", "library", "seq", "groups": [{"op", "bytes", "ranks"}],
//!                          "calls", "odd_ranks", "diverging", "shift", "since"}],
//!             "timing": "gpu" | "host_completion" | "host_enqueue" | "unknown" | "mixed (…)" | "",
//!             "top_cause": kind | null,
//!             "causes": [{"kind", "seconds", "share", "evidence", "fix", "rank"?}],  // all eight
//!             "ranks": [{"rank", "host", "late_seconds", "wait_seconds", "inside_seconds"}],
//!             "nics": [{"nic", "tx_bytes", "share", "rate_bytes_per_second"}],
//!             "skew": {"wall_seconds", "clock_free_seconds", "clock_free_late_rank"}}],
//!  "peers": {"answered": [str], "failed": [{"peer", "error"}]},
//!  "clock_error_seconds": number | null,
//!  "clocks": {"reference": str, "hosts": [{"host", "offset_seconds", "error_seconds",
//!             "interval": [lo, hi], "collectives", "applied"}], "inconsistent": [str]} | null,
//!  "threshold_seconds": number, "notes": [str]}
//! ```
//! `kind` is one of `compute`, `ideal_comm`, `intra_host`, `readiness_skew`, `rail_imbalance`,
//! `in_flight_limit`, `congestion`, `unexplained`; `late_seconds` is the rank's arrival
//! offset after the first rank, summed over the step's collectives.

use serde_json::{json, Value};

use super::{Report, StepReport};

fn step(r: &StepReport, threshold: f64) -> Value {
    let a = &r.attribution;
    json!({
        "step": a.step,
        "begin": a.begin,
        "end": a.end,
        "seconds": a.seconds,
        "collectives": a.collectives,
        "incomplete": a.incomplete,
        "notes": a.notes,
        "desyncs": a.desyncs,
        "timing": a.timing,
        "top_cause": r.ranked(threshold).first().map(|c| c.kind),
        "causes": a.causes,
        "ranks": a.ranks,
        "nics": r.nics,
        "skew": r.skew,
    })
}

/// The report as a JSON value.
pub fn to_value(rep: &Report) -> Value {
    json!({
        "source": rep.source,
        "steps": rep.steps.iter().map(|s| step(s, rep.threshold_seconds)).collect::<Vec<_>>(),
        "peers": rep.peers,
        "clock_error_seconds": rep.clock_error_seconds,
        "clocks": rep.clocks,
        "threshold_seconds": rep.threshold_seconds,
        "notes": rep.notes,
    })
}

/// The report as pretty-printed JSON with a trailing newline.
pub fn render(rep: &Report) -> String {
    let mut s = serde_json::to_string_pretty(&to_value(rep)).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attribution::CauseKind, report::fixtures};

    #[test]
    fn shape_kinds_and_numbers() {
        let v: Value = serde_json::from_str(&render(&fixtures::report())).expect("valid JSON");
        let s = &v["steps"][0];
        assert_eq!(s["step"], 42);
        assert!((s["seconds"].as_f64().unwrap_or(0.0) - 0.2).abs() < 1e-12);
        assert_eq!(s["incomplete"], false);
        assert_eq!(s["top_cause"], "readiness_skew");
        let causes = s["causes"].as_array().expect("causes");
        let kinds: Vec<&str> = causes.iter().filter_map(|c| c["kind"].as_str()).collect();
        let mut sorted = kinds.clone();
        sorted.sort();
        let mut all: Vec<&str> = CauseKind::ALL.iter().map(|k| k.as_str()).collect();
        all.sort();
        assert_eq!(sorted, all, "every kind exactly once with its exact name");
        let sum: f64 = causes.iter().filter_map(|c| c["seconds"].as_f64()).sum();
        assert!((sum - 0.2).abs() < 1e-12, "parts sum to the step");
        let skew = causes.iter().find(|c| c["kind"] == "readiness_skew").expect("skew");
        assert_eq!(skew["rank"], 5);
        assert!((skew["share"].as_f64().unwrap_or(0.0) - 0.15).abs() < 1e-12);
        assert_eq!(skew["evidence"]["late_host"], "node-b");
        assert!(skew["fix"].as_str().unwrap_or("").contains("rank 5"));
        let compute = causes.iter().find(|c| c["kind"] == "compute").expect("compute");
        assert!(compute.get("rank").is_none(), "rank only where a rank is named");
        let r5 = s["ranks"].as_array().and_then(|r| r.iter().find(|x| x["rank"] == 5)).expect("rank 5");
        assert_eq!(r5["host"], "node-b");
        assert!((r5["late_seconds"].as_f64().unwrap_or(0.0) - 0.03).abs() < 1e-12);
        assert_eq!(s["nics"][0]["nic"], "node-a/eth0");
        assert_eq!(s["nics"][0]["tx_bytes"], 300e6);
        assert_eq!(s["skew"]["clock_free_late_rank"], 5);
        assert_eq!(v["peers"]["answered"].as_array().map(|a| a.len()), Some(2));
        assert_eq!(v["peers"]["failed"][0]["peer"], "10.0.0.3:9477");
        assert_eq!(v["peers"]["failed"][0]["error"], "timed out after 5s");
        assert_eq!(v["clock_error_seconds"], 0.002);
    }

    #[test]
    fn local_report_has_null_clock_error_and_empty_peers() {
        let mut rep = fixtures::report();
        rep.clock_error_seconds = None;
        rep.peers = Default::default();
        rep.threshold_seconds = 1.0;
        let v = to_value(&rep);
        assert!(v["clock_error_seconds"].is_null());
        assert_eq!(v["peers"]["failed"].as_array().map(|a| a.len()), Some(0));
        assert!(v["steps"][0]["top_cause"].is_null(), "nothing above 1 s");
    }
}
