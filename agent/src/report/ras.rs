//! NCCL RAS in the hang report (issue 34, docs/ras.md): what the agents' hosts' RAS services
//! said, joined with the hang findings — a missing rank that RAS reports dead or unreachable
//! says so in its line — and said to be absent when no host's RAS answered.

use std::fmt::Write as _;

use crate::{
    hang::Missing,
    sources::ras::{RasFinding, RasView},
};

/// The report's RAS part from the agents' views (`None`: an agent that does not ask).
pub fn join(views: &[Option<RasView>]) -> (Vec<RasView>, Vec<RasFinding>, Option<String>) {
    let got: Vec<RasView> = views.iter().flatten().cloned().collect();
    let mut findings: Vec<RasFinding> = got.iter().filter(|v| v.state == "answered").flat_map(|v| v.findings.iter().cloned()).collect();
    // Every process's RAS reports the whole job: the same finding from several hosts once.
    findings.sort_by(|a, b| (&a.comm_hash, &a.kind, a.ranks.first().map(|r| r.rank)).cmp(&(&b.comm_hash, &b.kind, b.ranks.first().map(|r| r.rank))));
    findings.dedup();
    let answered = got.iter().filter(|v| v.state == "answered").count();
    let note = if got.is_empty() {
        None // no agent asks ([collectives] ras_addr empty, or older agents)
    } else if answered == 0 && got.iter().all(|v| v.state == "absent") {
        let why = got.first().map(|v| v.detail.clone()).unwrap_or_default();
        Some(format!(
            "NCCL RAS: absent — nothing answered on {} ({why}); NCCL < 2.24, NCCL_RAS_ENABLE=0, another NCCL_RAS_ADDR, or no NCCL job on the host",
            hosts(&got)
        ))
    } else if answered == 0 {
        Some(format!("NCCL RAS: answered on {} but without JSON status (NCCL < 2.28.7): not read", hosts(&got)))
    } else if findings.is_empty() {
        Some(format!("NCCL RAS ({answered} host(s)): no dead, unreachable or mismatched rank"))
    } else {
        None
    };
    (got, findings, note)
}

fn hosts(v: &[RasView]) -> String {
    let mut a: Vec<&str> = v.iter().map(|v| v.addr.as_str()).collect();
    a.dedup();
    a.join(", ")
}

/// What RAS says of a missing rank of a hang on a communicator of `nranks`: the same rank
/// number and pid, or — a rank no agent saw has no pid — the same rank number in a
/// communicator of the same size (RAS names its host and pid).
pub fn says(findings: &[RasFinding], nranks: Option<u32>, m: &Missing) -> Option<String> {
    let rank = i64::from(m.rank?);
    let same = |f: &RasFinding, r: &crate::sources::ras::RasRank| {
        r.rank == rank && m.pid.map_or(nranks.is_some_and(|n| i64::from(n) == f.comm_size), |p| i64::from(p) == r.pid)
    };
    let hits: Vec<String> =
        findings.iter().filter_map(|f| f.ranks.iter().find(|r| same(f, r)).map(|r| format!("{} (pid {} on {})", f.kind, r.pid, r.host))).collect();
    (!hits.is_empty()).then(|| format!("NCCL RAS: {}", hits.join(", ")))
}

/// The findings as text lines.
pub fn text(findings: &[RasFinding], out: &mut String) {
    for f in findings {
        let who: Vec<String> = f.ranks.iter().map(|r| format!("rank {} ({} pid {})", r.rank, r.host, r.pid)).collect();
        let _ = writeln!(out, "NCCL RAS: communicator {} {}: {} — {}", f.comm_hash, f.kind, who.join(", "), f.detail);
    }
}
