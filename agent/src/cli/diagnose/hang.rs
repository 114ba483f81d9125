//! `agent diagnose --hang`: every agent's `/api/v1/open` (this host's agent by default, or
//! `--agent`, `--peers`, `--dns`), joined on the communicator and judged by the same rule
//! as the daemon ([`crate::hang::evaluate`]): which communicator is stuck, the ranks inside,
//! and each missing rank with its host, last completed sequence number and state.

use std::{process::ExitCode, time::Instant};

use super::{fetch, DiagnoseArgs, EXIT_FAILURE};
use crate::{
    export::open::OpenWire,
    report::{hang as render, hang::HangReport, PeerFailure},
};

/// Exit status when a communicator is suspected hung.
pub const EXIT_HANG: u8 = 4;
/// Where `--hang` looks without `--agent`, `--peers` or `--dns`.
pub const LOCAL_AGENT: &str = "127.0.0.1:9477";

fn fetch_all(peers: &[String], timeout: std::time::Duration) -> Vec<(String, Result<OpenWire, fetch::PeerError>)> {
    let agent = fetch::client();
    let mut out = Vec::with_capacity(peers.len());
    for chunk in peers.chunks(fetch::MAX_PARALLEL) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|p| {
                    let agent = &agent;
                    s.spawn(move || fetch::get_json::<OpenWire>(agent, p, "/api/v1/open", Instant::now() + timeout, timeout))
                })
                .collect();
            for (p, h) in chunk.iter().zip(handles) {
                out.push((p.clone(), h.join().unwrap_or_else(|_| Err(fetch::PeerError::Http("worker panicked".into())))));
            }
        });
    }
    out
}

/// The joined report of `answers` (peer, its `/api/v1/open` or why not).
pub fn report(source: String, answers: Vec<(String, Result<OpenWire, fetch::PeerError>)>, cluster: bool) -> HangReport {
    let mut rep = HangReport { source, ..Default::default() };
    let mut wires = Vec::new();
    for (peer, r) in answers {
        match r {
            Ok(w) => {
                rep.peers.answered.push(format!("{peer} ({})", w.view.host));
                rep.hosts.push(w.view.host.clone());
                wires.push(w);
            }
            Err(e) => rep.peers.failed.push(PeerFailure { peer, error: e.to_string() }),
        }
    }
    let Some(first) = wires.first() else { return rep };
    let cfg = first.hang.clone();
    if wires.iter().any(|w| w.hang != cfg) {
        rep.notes.push(format!("the agents' [hang] settings differ; judged with {}'s", first.view.host));
    }
    if cluster && !rep.peers.failed.is_empty() {
        rep.notes.push("some peers did not answer: ranks not seen may be on them, so they are listed but not counted as missing".into());
    }
    if let Some(n) = enqueue_only_note(&wires) {
        rep.notes.push(n);
    }
    let views: Vec<_> = wires.iter().map(|w| w.view.clone()).collect();
    rep.hangs = crate::hang::evaluate(&views, &cfg, cluster && rep.peers.failed.is_empty());
    rep.desyncs = desyncs(&wires, &views);
    let (ras, findings, note) = crate::report::ras::join(&wires.iter().map(|w| w.ras.clone()).collect::<Vec<_>>());
    (rep.ras, rep.ras_findings) = (ras, findings);
    rep.notes.extend(note);
    // An agent's own suspicion (held by its hysteresis) stands even when the joined rule
    // no longer holds this instant.
    for h in &mut rep.hangs {
        let held = wires.iter().flat_map(|w| &w.hangs).filter(|x| x.comm == h.comm && x.suspected);
        if let Some(since) = held.filter_map(|x| x.suspected_since).reduce(f64::min) {
            h.suspected = true;
            h.suspected_since = Some(since);
        }
    }
    rep
}

/// The agents' desyncs and those of the joined open calls: per communicator the one at its
/// first diverging number (of two at that number, the one with more ranks).
fn desyncs(wires: &[OpenWire], views: &[crate::timeline::open::HostProgress]) -> Vec<crate::timeline::desync::Desync> {
    let mut all: Vec<_> = wires.iter().flat_map(|w| w.desyncs.iter().cloned()).chain(crate::timeline::desync::find(&[], views)).collect();
    all.sort_by(|a, b| a.comm.cmp(&b.comm).then(a.seq.cmp(&b.seq)).then(b.calls.len().cmp(&a.calls.len())));
    all.dedup_by(|a, b| a.comm == b.comm);
    all
}

/// What cannot be seen: ranks whose NCCL calls are timed at the enqueue (asynchronous, no
/// profiler plugin) return before their work runs, so a collective stuck on their GPUs is
/// never open in these views and cannot be suspected.
fn enqueue_only_note(wires: &[OpenWire]) -> Option<String> {
    let mut who: Vec<String> = wires
        .iter()
        .flat_map(|w| &w.view.comms)
        .flat_map(|c| c.ranks.iter().filter(|r| r.enqueue_only).map(move |r| (c, r)))
        .map(|(c, r)| format!("{} (pid {}, comm {})", r.rank.map_or("rank ?".into(), |k| format!("rank {k}")), r.pid, c.comm))
        .collect();
    if who.is_empty() {
        return None;
    }
    who.sort();
    who.dedup();
    let n = who.len();
    who.truncate(4);
    Some(format!(
        "{n} rank(s) call NCCL asynchronously without the profiler plugin ({}{}): their calls return once the work is enqueued, so a collective stuck on their GPUs is not seen here and cannot be suspected; load the plugin for GPU-side progress (docs/profiler-plugin.md)",
        who.join(", "),
        if n > 4 { ", …" } else { "" }
    ))
}

pub fn main(a: &DiagnoseArgs, peers: Vec<String>, cluster: bool) -> ExitCode {
    let peers = if peers.is_empty() { vec![LOCAL_AGENT.to_string()] } else { peers };
    let source = if cluster { format!("cluster of {} peer(s)", peers.len()) } else { format!("agent {}", peers[0]) };
    let rep = report(source, fetch_all(&peers, a.timeout), cluster);
    if rep.hosts.is_empty() {
        for f in &rep.peers.failed {
            eprintln!("agent diagnose: agent {} did not answer: {}", f.peer, f.error);
        }
        return ExitCode::from(EXIT_FAILURE);
    }
    if let Some(path) = &a.html {
        if let Err(e) = std::fs::write(path, render::html(&rep)) {
            eprintln!("agent diagnose: cannot write {}: {e}", path.display());
            return ExitCode::from(EXIT_FAILURE);
        }
        eprintln!("wrote {}", path.display());
    }
    let code = if rep.suspected() > 0 { ExitCode::from(EXIT_HANG) } else { ExitCode::SUCCESS };
    crate::cli::print_stdout(if a.json { render::json(&rep) } else { render::text(&rep) }, code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::open::{CommProgress, HostProgress, OpenCall, RankProgress};

    fn wire(host: &str, ranks: Vec<RankProgress>, held: bool) -> OpenWire {
        let comm = CommProgress {
            comm: "00000000000000aa".into(),
            global: true,
            library: "nccl".into(),
            nranks: Some(2),
            median_seconds: Some(0.01),
            samples: 4,
            ranks,
        };
        let mut w = OpenWire { view: HostProgress { host: host.into(), as_of: 100.0, comms: vec![comm] }, ..Default::default() };
        w.hang.floor = std::time::Duration::from_secs(2);
        if held {
            w.hangs = vec![crate::hang::Hang { comm: "00000000000000aa".into(), suspected: true, suspected_since: Some(90.0), ..Default::default() }];
        }
        w
    }

    fn inside(rank: u32, host: &str, since: f64) -> RankProgress {
        RankProgress {
            rank: Some(rank),
            pid: rank + 1,
            host: host.into(),
            open: Some(OpenCall { seq: 3, op: "all_reduce".into(), bytes: None, tid: 1, since }),
            ..Default::default()
        }
    }

    #[test]
    fn views_join_across_peers_and_a_failed_peer_keeps_unseen_ranks_uncounted() {
        let both =
            vec![("a:1".to_string(), Ok(wire("a", vec![inside(0, "a", 99.5)], false))), ("b:1".to_string(), Ok(wire("b", vec![inside(1, "b", 99.6)], false)))];
        let rep = report("cluster".into(), both, true);
        assert_eq!(rep.hosts, vec!["a", "b"]);
        assert_eq!((rep.hangs[0].inside.len(), rep.suspected()), (2, 0), "both ranks inside 0.5 s: nothing suspected");
        let one_failed = vec![("a:1".to_string(), Ok(wire("a", vec![inside(0, "a", 10.0)], false))), ("b:1".to_string(), Err(fetch::PeerError::Refused))];
        let rep = report("cluster".into(), one_failed, true);
        assert_eq!(rep.suspected(), 0, "rank 1 may be on the peer that did not answer");
        assert!(rep.notes.iter().any(|n| n.contains("did not answer")), "{:?}", rep.notes);
        assert_eq!(rep.peers.failed.len(), 1);
        // An agent's held suspicion stands in the joined report.
        let held = vec![("a:1".to_string(), Ok(wire("a", vec![inside(0, "a", 99.9)], true)))];
        let rep = report("agent a:1".into(), held, false);
        assert_eq!((rep.suspected(), rep.hangs[0].suspected_since), (1, Some(90.0)));
        assert!(!rep.notes.iter().any(|n| n.contains("without the profiler plugin")), "{:?}", rep.notes);
    }

    #[test]
    fn ranks_timed_at_the_enqueue_are_said_to_be_blind_spots() {
        let done = |rank: u32, enqueue_only: bool| RankProgress { rank: Some(rank), pid: 40 + rank, host: "a".into(), enqueue_only, ..Default::default() };
        let rep = report("agent a:1".into(), vec![("a:1".to_string(), Ok(wire("a", vec![done(0, true), done(1, true)], false)))], false);
        assert_eq!(rep.suspected(), 0);
        let note = rep.notes.iter().find(|n| n.contains("without the profiler plugin")).expect("a note on what cannot be seen");
        assert!(note.starts_with("2 rank(s)") && note.contains("rank 0 (pid 40, comm 00000000000000aa)"), "{note}");
        let rep = report("agent a:1".into(), vec![("a:1".to_string(), Ok(wire("a", vec![done(0, false)], false)))], false);
        assert!(rep.notes.is_empty(), "{:?}", rep.notes);
    }

    /// Issue 34: rank 1 never arrives at the all-reduce rank 0 is inside; NCCL's RAS service
    /// (the fake one of `sources::ras` tests, NCCL's protocol and JSON) reports it dead: its
    /// line in the hang report says so. Without a RAS answering, the report says absent.
    #[test]
    fn the_hang_report_names_the_rank_ras_reports_dead_and_says_when_ras_is_absent() {
        use crate::sources::ras;
        let r1 = RankProgress { rank: Some(1), pid: 2, host: "b".into(), ..Default::default() };
        let (addr, srv) = ras::tests::fake_ras(ras::tests::DEAD_RANK_1_OF_2, true, 1);
        let mut w = wire("a", vec![inside(0, "a", 10.0), r1.clone()], false);
        w.ras = Some(ras::query(&addr, std::time::Duration::from_secs(2), 100.0));
        srv.join().expect("fake RAS");
        let rep = report("agent a:1".into(), vec![("a:1".to_string(), Ok(w))], false);
        assert_eq!(rep.suspected(), 1, "{:?}", rep.hangs);
        let text = crate::report::hang::text(&rep);
        let line = text.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap_or_else(|| panic!("rank 1's line: {text}"));
        assert!(line.contains("NCCL RAS: dead (pid 2 on 10.0.0.2)"), "{text}");
        assert!(text.contains("NCCL RAS: communicator 0x5e1f00d5e1f00d5e dead: rank 1 (10.0.0.2 pid 2)"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&crate::report::hang::json(&rep)).expect("json");
        assert_eq!(json["ras_findings"][0]["ranks"][0]["rank"], 1, "{json}");
        // Nothing listening: absent, said once, and no rank is named by RAS.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let gone = l.local_addr().expect("addr").to_string();
        drop(l);
        let mut w = wire("a", vec![inside(0, "a", 10.0), r1], false);
        w.ras = Some(ras::query(&gone, std::time::Duration::from_millis(500), 100.0));
        let rep = report("agent a:1".into(), vec![("a:1".to_string(), Ok(w))], false);
        let text = crate::report::hang::text(&rep);
        assert!(text.contains("note: NCCL RAS: absent — nothing answered on 127.0.0.1:"), "{text}");
        assert!(!text.contains("NCCL RAS: dead"), "{text}");
    }

    /// Two hosts, each seeing one rank: rank 1 inside a broadcast where rank 0 is inside the
    /// all_reduce #3. Only the joined views show the desync; the hang says it is the cause.
    #[test]
    fn a_desync_across_hosts_is_found_in_the_joined_views_and_named_the_cause() {
        let mut r1 = inside(1, "b", 99.6);
        r1.open.as_mut().expect("open").op = "broadcast".into();
        let both = vec![("a:1".to_string(), Ok(wire("a", vec![inside(0, "a", 90.0)], false))), ("b:1".to_string(), Ok(wire("b", vec![r1], false)))];
        let rep = report("cluster".into(), both, true);
        assert_eq!(rep.desyncs.len(), 1, "{:?}", rep.desyncs);
        assert_eq!((rep.desyncs[0].seq, rep.desyncs[0].odd_ranks.clone()), (3, vec![1]));
        assert_eq!(rep.suspected(), 1, "every rank inside, but at different calls: {:?}", rep.hangs);
        let text = crate::report::hang::text(&rep);
        assert!(text.contains("SUSPECTED HUNG by a desync") && text.contains("rank 1 called broadcast"), "{text}");
    }
}
