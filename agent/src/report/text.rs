//! The terminal report: per step the top finding and its fix first, then the breakdown
//! table (every cause, its duration with one decimal in s, ms or µs, share of the step in %), the ranked
//! findings with evidence, the skew both ways, per-rank arrivals and per-NIC bytes.

use std::fmt::Write as _;

use super::{bytes, duration, evidence_pairs, pct, Report, StepReport};
use crate::attribution::CauseKind;

/// Columns aligned to their widest cell; `right[i]` right-aligns column i (numbers).
pub fn table(header: &[&str], rows: &[Vec<String>], right: &[bool], indent: &str) -> String {
    let n = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::from(indent);
        for (i, c) in cells.enumerate().take(n) {
            let pad = w[i].saturating_sub(c.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if right.get(i).copied().unwrap_or(false) {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            } else {
                s.push_str(c);
                if i + 1 < n {
                    s.push_str(&" ".repeat(pad));
                }
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

fn headline(r: &StepReport, threshold: f64) -> String {
    let a = &r.attribution;
    match r.ranked(threshold).first() {
        Some(c) => {
            let who = match (c.kind, c.rank) {
                (CauseKind::ReadinessSkew, Some(rank)) => {
                    let host = a.ranks.iter().find(|x| x.rank == rank).map(|x| format!(" on {}", x.host)).unwrap_or_default();
                    format!(" — rank {rank}{host} was late")
                }
                _ => String::new(),
            };
            format!("  top cause: {} {} ({}){who}\n  fix: {}\n", c.kind.as_str(), duration(c.seconds), pct(c.share), c.fix)
        }
        None => format!(
            "  no cause above {}: compute {}, ideal communication {} — the step is as fast as its compute and bytes allow\n",
            duration(threshold),
            duration(a.cause(CauseKind::Compute)),
            duration(a.cause(CauseKind::IdealComm))
        ),
    }
}

fn step(out: &mut String, r: &StepReport, rep: &Report) {
    let a = &r.attribution;
    let _ = writeln!(
        out,
        "step {} · {} · {} collective(s) · {} rank(s){}",
        a.step,
        duration(a.seconds),
        a.collectives,
        a.ranks.len(),
        if a.incomplete { " · INCOMPLETE DATA (ranks or probe events missing: numbers are a lower bound)" } else { "" }
    );
    out.push_str(&headline(r, rep.threshold_seconds));
    out.push('\n');

    let mut rows: Vec<Vec<String>> = a.causes.iter().map(|c| vec![c.kind.as_str().to_string(), duration(c.seconds), pct(c.share)]).collect();
    let sum: f64 = a.causes.iter().map(|c| c.seconds).sum();
    rows.push(vec!["total".into(), duration(sum), pct(if a.seconds > 0.0 { sum / a.seconds } else { 0.0 })]);
    out.push_str(&table(&["cause", "seconds", "share"], &rows, &[false, true, true], "  "));

    let ranked = r.ranked(rep.threshold_seconds);
    if !ranked.is_empty() {
        let _ = writeln!(out, "\n  causes above {}, largest first:", duration(rep.threshold_seconds));
        for (i, c) in ranked.iter().enumerate() {
            let rank = c.rank.map(|x| format!("  rank {x}")).unwrap_or_default();
            let _ = writeln!(out, "  {}. {}  {}  {}{rank}", i + 1, c.kind.as_str(), duration(c.seconds), pct(c.share));
            let ev: Vec<String> = evidence_pairs(&c.evidence).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
            if !ev.is_empty() {
                let _ = writeln!(out, "     evidence: {}", ev.join(", "));
            }
            let _ = writeln!(out, "     fix: {}", c.fix);
        }
    }

    let clock = match rep.clock_error_seconds {
        Some(e) => format!(" (clock error ≤ {})", duration(e)),
        None => " (one host's clock)".into(),
    };
    let free = match (r.skew.clock_free_seconds, r.skew.clock_free_late_rank) {
        (Some(s), Some(k)) => format!("{}, late rank {k}", duration(s)),
        (Some(s), None) => duration(s),
        _ if a.timing.contains("host_enqueue") => "n/a (timed at the host enqueue)".into(),
        _ => "n/a (one rank)".into(),
    };
    let _ = writeln!(out, "\n  readiness skew: wall clock {}{clock} · clock-free {free}", duration(r.skew.wall_seconds));
    if !a.timing.is_empty() {
        let _ = writeln!(out, "  timing: {}", a.timing);
        if let Some(g) = &a.graph_replay {
            let _ = writeln!(out, "  graph replay: {} of {} arrivals (CUDA graph); not timed: {}", g.arrivals, g.of, g.not_timed.join("; "));
        }
    }

    if !a.ranks.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = a
            .ranks
            .iter()
            .map(|k| vec![k.rank.to_string(), k.host.clone(), duration(k.late_seconds), duration(k.wait_seconds), duration(k.inside_seconds)])
            .collect();
        out.push_str(&table(&["rank", "host", "arrival", "wait", "inside"], &rows, &[true, false, true, true, true], "  "));
    }
    if !r.nics.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .nics
            .iter()
            .map(|n| {
                vec![
                    n.nic.clone(),
                    bytes(n.tx_bytes),
                    pct(n.share),
                    n.rate_bytes_per_second.map(|x| format!("{:.2} GB/s", x / 1e9)).unwrap_or_else(|| "?".into()),
                ]
            })
            .collect();
        out.push_str(&table(&["nic", "tx", "share", "rate"], &rows, &[false, true, true, true], "  "));
    }
    for d in &a.desyncs {
        let _ = writeln!(out, "  desync on communicator {} ({}): the ranks disagree at {}", d.comm, d.library, d.summary());
    }
    for n in &a.notes {
        let _ = writeln!(out, "  note: {n}");
    }
}

/// The whole report as text.
pub fn render(rep: &Report) -> String {
    let mut out = String::new();
    let peers = &rep.peers;
    let mut head = format!("source: {}", rep.source);
    if !peers.answered.is_empty() || !peers.failed.is_empty() {
        let _ = write!(head, " · {}/{} peers answered", peers.answered.len(), peers.answered.len() + peers.failed.len());
    }
    if let Some(e) = rep.clock_error_seconds {
        let _ = write!(head, " · clock error ≤ {}", duration(e));
    }
    out.push_str(&head);
    out.push('\n');
    if !peers.failed.is_empty() {
        out.push_str("peers that did not answer (report uses the others):\n");
        let rows: Vec<Vec<String>> = peers.failed.iter().map(|f| vec![f.peer.clone(), f.error.clone()]).collect();
        out.push_str(&table(&["peer", "error"], &rows, &[false, false], "  "));
    }
    for n in &rep.notes {
        let _ = writeln!(out, "note: {n}");
    }
    for r in &rep.steps {
        out.push('\n');
        step(&mut out, r, rep);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;

    /// Cells of the line that starts (after spaces) with `first`.
    fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
        let line = text.lines().find(|l| l.trim_start().starts_with(first)).unwrap_or_else(|| panic!("no line {first:?} in\n{text}"));
        line.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect()
    }

    #[test]
    fn breakdown_table_has_every_cause_in_ms_and_percent_and_sums() {
        let t = render(&fixtures::report());
        assert_eq!(row(&t, "cause"), vec!["cause", "seconds", "share"]);
        assert_eq!(row(&t, "compute"), vec!["compute", "150.0 ms", "75.0 %"]);
        assert_eq!(row(&t, "readiness_skew "), vec!["readiness_skew", "30.0 ms", "15.0 %"]);
        assert_eq!(row(&t, "in_flight_limit"), vec!["in_flight_limit", "0.0 ms", "0.0 %"]);
        assert_eq!(row(&t, "total"), vec!["total", "200.0 ms", "100.0 %"]);
        for k in CauseKind::ALL {
            assert!(t.lines().any(|l| l.trim_start().starts_with(k.as_str())), "{} missing:\n{t}", k.as_str());
        }
        // Aligned: the seconds column ends at the same offset on every line of the table.
        let line = |f: &str| t.lines().find(|l| l.trim_start().starts_with(f)).unwrap_or_default();
        let header_end = line("cause").find("seconds").map(|x| x + "seconds".len());
        for f in ["compute", "readiness_skew ", "in_flight_limit", "total"] {
            assert_eq!(line(f).find(" ms").map(|x| x + 3), header_end, "{f}:\n{t}");
        }
    }

    #[test]
    fn top_cause_and_its_fix_come_first() {
        let t = render(&fixtures::report());
        let top = t.find("top cause: readiness_skew 30.0 ms (15.0 %) — rank 5 on node-b was late").unwrap_or_else(|| panic!("{t}"));
        let fix = t.find("fix: rank 5 on node-b").unwrap_or(usize::MAX);
        let table = t.find("cause  ").unwrap_or(0);
        assert!(top < fix && fix < table, "{t}");
        // Ranked findings: skew, rail, unexplained (above 1 ms), not congestion (0 ms).
        let r1 = t.find("1. readiness_skew").unwrap_or(usize::MAX);
        let r2 = t.find("2. rail_imbalance").unwrap_or(0);
        assert!(r1 < r2, "{t}");
        assert!(t.contains("3. unexplained"), "{t}");
        assert!(!t.contains(". congestion"), "{t}");
        assert!(t.contains("busiest_share=75.0 %"), "{t}");
    }

    #[test]
    fn ranks_nics_peers_and_clock() {
        let t = render(&fixtures::report());
        assert_eq!(row(&t, "5 "), vec!["5", "node-b", "30.0 ms", "0.0 ms", "20.0 ms"]);
        assert_eq!(row(&t, "0 "), vec!["0", "node-a", "0.0 ms", "30.0 ms", "50.0 ms"]);
        assert_eq!(row(&t, "node-a/eth0"), vec!["node-a/eth0", "286.1 MiB", "75.0 %", "12.50 GB/s"]);
        assert!(t.contains("2/3 peers answered"), "{t}");
        assert_eq!(row(&t, "10.0.0.3:9477"), vec!["10.0.0.3:9477", "timed out after 5s"]);
        assert!(t.contains("readiness skew: wall clock 30.0 ms (clock error ≤ 2.0 ms) · clock-free 30.0 ms, late rank 5"), "{t}");
    }

    #[test]
    fn a_large_clock_error_reads_in_seconds() {
        let mut rep = fixtures::report();
        rep.clock_error_seconds = Some(16.0);
        let t = render(&rep);
        assert!(t.contains("clock error ≤ 16.0 s") && !t.contains("16000"), "{t}");
    }

    #[test]
    fn healthy_step_says_so() {
        let mut rep = fixtures::report();
        rep.threshold_seconds = 0.1;
        let t = render(&rep);
        assert!(t.contains("no cause above 100.0 ms: compute 150.0 ms, ideal communication 12.0 ms"), "{t}");
        assert!(!t.contains("top cause"), "{t}");
    }
}
