//! The hang report (`agent diagnose --hang`): per communicator with an open call, whether it
//! is suspected hung, how long its oldest call has been open against the threshold, who is
//! inside, and every missing rank with its host, last completed sequence number and what it
//! is doing (process state and the kernel functions its threads wait in) or how it exited.
//! Text, JSON (`HangReport` as is, every time in seconds) and a self-contained HTML page.

use std::fmt::Write as _;

use serde::Serialize;

use super::{duration, html::escape, Peers};
use crate::hang::{Hang, Missing, Why};

#[derive(Clone, Debug, Default, Serialize)]
pub struct HangReport {
    /// Where the views came from ("agent 127.0.0.1:9477", "cluster of 2 peer(s)").
    pub source: String,
    pub peers: Peers,
    /// Hosts whose views were joined.
    pub hosts: Vec<String>,
    /// Suspected communicators first, then the longest open.
    pub hangs: Vec<Hang>,
    /// Ranks whose calls at one sequence number differ: found by the agents in their
    /// recent calls, or in the joined open calls.
    pub desyncs: Vec<crate::timeline::desync::Desync>,
    /// What each host's NCCL RAS service answered (docs/ras.md), and its findings joined
    /// over the hosts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ras: Vec<crate::sources::ras::RasView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ras_findings: Vec<crate::sources::ras::RasFinding>,
    pub notes: Vec<String>,
}

impl HangReport {
    pub fn suspected(&self) -> usize {
        self.hangs.iter().filter(|h| h.suspected).count()
    }
}

fn rank_name(r: Option<u32>) -> String {
    r.map(|r| r.to_string()).unwrap_or_else(|| "?".into())
}

/// One line saying what a missing rank is doing or how it ended.
pub fn doing(m: &Missing) -> String {
    match m.why {
        Why::Exited => {
            let how = m.exited.as_ref().map(|e| e.how()).unwrap_or_else(|| "status unknown".into());
            match &m.aborted {
                Some(a) => format!("exited ({how}) inside {} #{}", a.op, a.seq),
                None => format!("exited ({how})"),
            }
        }
        Why::NotSeen => "not seen on any host asked".into(),
        Why::NotProgressing => format!("inside the call but not progressing (state {})", m.state.as_ref().map_or("unknown", |s| s.state.as_str())),
        Why::NotArrived => match &m.state {
            Some(s) => {
                let mut w: Vec<String> = s.threads.iter().filter(|t| !t.wchan.is_empty()).map(|t| format!("{}:{}", t.name, t.wchan)).collect();
                w.dedup();
                w.truncate(4);
                let inside = if s.in_probed_call { ", inside another probed call" } else { "" };
                if w.is_empty() {
                    format!("state {}{inside}", s.state)
                } else {
                    format!("state {}{inside}, waiting in {}", s.state, w.join(", "))
                }
            }
            None => "not arrived (state not read)".into(),
        },
    }
}

/// The missing rank's host, and its Kubernetes pod when it runs in one.
fn place(m: &Missing) -> String {
    let host = m.host.clone().unwrap_or_else(|| "?".into());
    match m.state.as_ref().and_then(|s| s.pod.as_deref()) {
        Some(pod) => format!("{host}, pod {pod}"),
        None => host,
    }
}

fn headline(h: &Hang) -> String {
    let verdict = match (h.suspected, &h.desync) {
        (true, Some(_)) => "SUSPECTED HUNG by a desync",
        (true, None) => "SUSPECTED HUNG",
        (false, _) => "open",
    };
    let inside = h.inside.len();
    let total = h.nranks.map(|n| n.to_string()).unwrap_or_else(|| "?".into());
    format!(
        "{} #{} on communicator {} ({}): {verdict} — {inside} of {total} rank(s) inside for {} (threshold {})",
        h.op,
        h.seq,
        h.comm,
        h.library,
        duration(h.open_seconds),
        duration(h.threshold_seconds)
    )
}

pub fn text(rep: &HangReport) -> String {
    let mut out = format!("source: {} · hosts: {}\n", rep.source, rep.hosts.join(", "));
    for f in &rep.peers.failed {
        let _ = writeln!(out, "peer {} did not answer: {}", f.peer, f.error);
    }
    if rep.hangs.is_empty() {
        out.push_str("no open collective: nothing is waiting\n");
    }
    for h in &rep.hangs {
        let _ = writeln!(out, "{}", headline(h));
        if let Some(d) = &h.desync {
            let _ = writeln!(out, "  desync: the ranks disagree at {}", d.summary());
        } else if h.missing.is_empty() {
            out.push_str("  every rank is inside: a slow call, not a hang\n");
        }
        let rows: Vec<Vec<String>> = h
            .missing
            .iter()
            .map(|m| {
                vec![
                    rank_name(m.rank),
                    place(m),
                    m.pid.map(|p| p.to_string()).unwrap_or_default(),
                    m.last_done_seq.map(|s| format!("#{s}")).unwrap_or_else(|| "none".into()),
                    match super::ras::says(&rep.ras_findings, h.nranks, m) {
                        Some(r) => format!("{}; {r}", doing(m)),
                        None => doing(m),
                    },
                ]
            })
            .collect();
        if !rows.is_empty() {
            out.push_str(&super::text::table(&["missing rank", "host", "pid", "last completed", "doing"], &rows, &[true, false, true, true, false], "  "));
        }
    }
    for d in &rep.desyncs {
        let _ = writeln!(out, "desync on communicator {} ({}) first at {}", d.comm, d.library, d.summary());
    }
    super::ras::text(&rep.ras_findings, &mut out);
    for n in &rep.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let _ = writeln!(out, "{} communicator(s) suspected hung", rep.suspected());
    out
}

pub fn json(rep: &HangReport) -> String {
    let mut v = serde_json::to_value(rep).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("suspected".into(), rep.suspected().into());
    }
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

pub fn html(rep: &HangReport) -> String {
    let mut out = String::from(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Stepwise hang report</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}.bad{color:#b00}</style></head><body><h1>Who is everyone waiting for?</h1>",
    );
    let _ = write!(out, "<p>Source: {} · hosts: {}</p>", escape(&rep.source), escape(&rep.hosts.join(", ")));
    for f in &rep.peers.failed {
        let _ = write!(out, "<p class=\"bad\">peer {} did not answer: {}</p>", escape(&f.peer), escape(&f.error));
    }
    if rep.hangs.is_empty() {
        out.push_str("<p>No open collective: nothing is waiting.</p>");
    }
    for h in &rep.hangs {
        let _ = write!(out, "<h2 class=\"{}\">{}</h2>", if h.suspected { "bad" } else { "" }, escape(&headline(h)));
        out.push_str("<table><tr><th>missing rank</th><th>host</th><th>pid</th><th>last completed</th><th>doing</th></tr>");
        for m in &h.missing {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                rank_name(m.rank),
                escape(&place(m)),
                m.pid.map(|p| p.to_string()).unwrap_or_default(),
                m.last_done_seq.map(|s| format!("#{s}")).unwrap_or_else(|| "none".into()),
                escape(&doing(m))
            );
        }
        out.push_str("</table>");
        if let Some(d) = &h.desync {
            let _ = write!(out, "<p class=\"bad\">desync: the ranks disagree at {}</p>", escape(&d.summary()));
        }
    }
    for d in &rep.desyncs {
        let _ = write!(out, "<p class=\"bad\">desync on communicator {} ({}) first at {}</p>", escape(&d.comm), escape(&d.library), escape(&d.summary()));
    }
    for n in &rep.notes {
        let _ = write!(out, "<p>{}</p>", escape(n));
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::open::{Exit, OpenCall, ProcState, ThreadState};

    fn report() -> HangReport {
        let stopped = Missing {
            rank: Some(2),
            host: Some("node-b".into()),
            pid: Some(42),
            why: Why::NotArrived,
            last_done_seq: Some(4),
            last_done_at: Some(1.0),
            aborted: None,
            exited: None,
            state: Some(ProcState {
                state: "T (stopped)".into(),
                threads: vec![ThreadState { tid: 42, name: "mpi_steps".into(), state: "T (stopped)".into(), wchan: "do_signal_stop".into() }],
                pod: Some("training/llama-worker-2".into()),
                ..Default::default()
            }),
        };
        let killed = Missing {
            rank: Some(1),
            why: Why::Exited,
            aborted: Some(OpenCall { seq: 5, op: "all_reduce".into(), bytes: None, tid: 7, since: 0.0 }),
            exited: Some(Exit { at: 2.0, signal: Some(9), code: None }),
            ..stopped.clone()
        };
        let h = Hang {
            comm: "00000000000000aa".into(),
            library: "mpi".into(),
            nranks: Some(4),
            seq: 5,
            op: "all_reduce".into(),
            open_seconds: 12.0,
            threshold_seconds: 2.0,
            missing: vec![killed, stopped],
            suspected: true,
            rule: true,
            ..Default::default()
        };
        HangReport { source: "cluster of 2 peer(s)".into(), hosts: vec!["node-a".into(), "node-b".into()], hangs: vec![h], ..Default::default() }
    }

    #[test]
    fn text_names_the_missing_ranks_their_hosts_and_what_they_do() {
        let t = text(&report());
        assert!(t.contains("all_reduce #5 on communicator 00000000000000aa (mpi): SUSPECTED HUNG — 0 of 4 rank(s) inside for 12.0 s (threshold 2.0 s)"), "{t}");
        assert!(t.contains("node-b, pod training/llama-worker-2") && t.contains("#4"), "{t}");
        assert!(t.contains("state T (stopped), waiting in mpi_steps:do_signal_stop"), "{t}");
        assert!(t.contains("exited (signal 9 (SIGKILL)) inside all_reduce #5"), "{t}");
        assert!(t.ends_with("1 communicator(s) suspected hung\n"));
    }

    #[test]
    fn json_and_html_carry_the_same_verdict() {
        let v: serde_json::Value = serde_json::from_str(&json(&report())).expect("json");
        assert_eq!(v["suspected"], 1);
        assert_eq!(v["hangs"][0]["missing"][1]["why"], "not_arrived");
        assert_eq!(v["hangs"][0]["missing"][1]["state"]["state"], "T (stopped)");
        assert_eq!(v["hangs"][0]["missing"][1]["state"]["pod"], "training/llama-worker-2");
        let h = html(&report());
        assert!(h.contains("SUSPECTED HUNG") && h.contains("do_signal_stop") && h.contains("pod training/llama-worker-2") && h.ends_with("</html>\n"));
        let mut quiet = report();
        quiet.hangs.clear();
        assert!(text(&quiet).contains("no open collective"));
    }
}
