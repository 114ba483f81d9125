//! NCCL's RAS service (NCCL ≥ 2.24, docs/ras.md): where a job's NCCL answers on this host
//! (`[collectives] ras_addr`, NCCL's default `localhost:28028`, its `NCCL_RAS_ADDR`), a
//! background task asks it for the job's status every `ras_every` and keeps the latest answer
//! for `/api/v1/open`, where `diagnose --hang` joins it with the hang and desync findings.
//!
//! The protocol, as NCCL 2.30.7's `src/ras/client.cc` (the `ncclras` client) and
//! `src/ras/client_support.cc` (the service) speak it, one line each way:
//! `CLIENT PROTOCOL 2` → `SERVER PROTOCOL 2`; `TIMEOUT <s>` → `OK`; `SET FORMAT json` → `OK`
//! (NCCL ≥ 2.28.7; older ones answer `ERROR: Unknown command ...`); `STATUS` → the report,
//! then the service closes the connection. The JSON report (`rasDumpCommsToJSON`) lists per
//! communicator its ranks (status, `collective_counts` per function) and `missing_ranks`
//! (`unresponsive`, `considered_dead`).
//!
//! Bounded: connect, each line and the whole report have timeouts (the service may take
//! seconds when a process is unresponsive: it waits `TIMEOUT` for it), the report at most
//! [`MAX_REPORT`] bytes; the query runs on a blocking thread, never on the pipeline. Nothing
//! answering is "absent", not an error: most hosts run no NCCL ≥ 2.24 job.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs},
    sync::RwLock,
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// The protocol version this client speaks (NCCL's `NCCL_RAS_CLIENT_PROTOCOL`).
pub const PROTOCOL: u32 = 2;
/// Largest report read.
pub const MAX_REPORT: u64 = 8 << 20;
/// Seconds the service may wait for each peer (`TIMEOUT`; NCCL's default is 5).
pub const PEER_TIMEOUT_S: u32 = 2;

/// What the agent last learnt from the RAS service on its host.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RasView {
    /// Where it asked.
    pub addr: String,
    /// Wall time of the answer (or of the failed attempt).
    pub at: f64,
    /// `answered`, `absent` (nothing listening, or not NCCL's RAS) or `no_json` (an NCCL
    /// older than 2.28.7: it answers but has no JSON format; nothing is parsed).
    pub state: String,
    /// Why absent, or the server's protocol line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nccl_version: String,
    #[serde(default)]
    pub findings: Vec<RasFinding>,
    /// Communicators in the report.
    #[serde(default)]
    pub communicators: usize,
}

/// One problem RAS reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RasFinding {
    /// NCCL's communicator hash (`0x…`), as RAS prints it.
    pub comm_hash: String,
    /// Its number of ranks.
    pub comm_size: i64,
    /// `dead` (considered dead: unreachable for 60 s), `unreachable` (did not answer this
    /// query), `op_count_mismatch`, `async_error` or `aborted`.
    pub kind: String,
    /// The ranks concerned: for a mismatch, those behind the highest count.
    pub ranks: Vec<RasRank>,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RasRank {
    pub rank: i64,
    pub host: String,
    pub pid: i64,
}

// ---- the JSON report, as rasDumpCommsToJSON writes it ----

#[derive(Deserialize)]
struct Report {
    #[serde(default)]
    nccl_version: String,
    #[serde(default)]
    communicators: Vec<Comm>,
}

#[derive(Deserialize)]
struct Comm {
    hash: String,
    #[serde(default)]
    size: i64,
    #[serde(default)]
    ranks: Vec<Rank>,
    #[serde(default)]
    missing_ranks: Vec<Missing>,
}

#[derive(Deserialize)]
struct Rank {
    rank: i64,
    #[serde(default)]
    host: String,
    #[serde(default)]
    pid: i64,
    #[serde(default)]
    status: RankStatus,
    #[serde(default)]
    collective_counts: BTreeMap<String, u64>,
}

#[derive(Default, Deserialize)]
struct RankStatus {
    #[serde(default)]
    async_error: i64,
    #[serde(default)]
    abort_flag: bool,
}

#[derive(Deserialize)]
struct Missing {
    rank: i64,
    #[serde(default)]
    host: String,
    #[serde(default)]
    pid: i64,
    #[serde(default)]
    status: MissingStatus,
}

#[derive(Default, Deserialize)]
struct MissingStatus {
    #[serde(default)]
    unresponsive: bool,
    #[serde(default)]
    considered_dead: bool,
}

fn who(rank: i64, host: &str, pid: i64) -> RasRank {
    RasRank { rank, host: host.to_string(), pid }
}

/// The problems in one communicator's entry.
fn comm_findings(c: &Comm) -> Vec<RasFinding> {
    let mut out = Vec::new();
    let f = |kind: &str, ranks: Vec<RasRank>, detail: String| RasFinding { comm_hash: c.hash.clone(), comm_size: c.size, kind: kind.into(), ranks, detail };
    let dead: Vec<RasRank> = c.missing_ranks.iter().filter(|m| m.status.considered_dead).map(|m| who(m.rank, &m.host, m.pid)).collect();
    if !dead.is_empty() {
        out.push(f("dead", dead, "considered dead by NCCL RAS (unreachable over the RAS network for 60 s)".into()));
    }
    let gone: Vec<RasRank> =
        c.missing_ranks.iter().filter(|m| !m.status.considered_dead && m.status.unresponsive).map(|m| who(m.rank, &m.host, m.pid)).collect();
    if !gone.is_empty() {
        out.push(f("unreachable", gone, "did not answer NCCL RAS's query (unresponsive)".into()));
    }
    for op in c.ranks.iter().flat_map(|r| r.collective_counts.keys()).collect::<std::collections::BTreeSet<_>>() {
        let count = |r: &Rank| r.collective_counts.get(op).copied().unwrap_or(0);
        let (lo, hi) = c.ranks.iter().map(count).fold((u64::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
        if lo < hi {
            let behind = c.ranks.iter().filter(|r| count(r) < hi).map(|r| who(r.rank, &r.host, r.pid)).collect();
            out.push(f("op_count_mismatch", behind, format!("{op}: ranks launched between {lo} and {hi} operations; these are behind {hi}")));
        }
    }
    let err: Vec<RasRank> = c.ranks.iter().filter(|r| r.status.async_error != 0).map(|r| who(r.rank, &r.host, r.pid)).collect();
    if !err.is_empty() {
        out.push(f("async_error", err, "ncclCommGetAsyncError would return an error on these ranks".into()));
    }
    let ab: Vec<RasRank> = c.ranks.iter().filter(|r| r.status.abort_flag).map(|r| who(r.rank, &r.host, r.pid)).collect();
    if !ab.is_empty() {
        out.push(f("aborted", ab, "the communicator's abort flag is set on these ranks".into()));
    }
    out
}

/// A RAS JSON report as findings: (NCCL version, communicators, findings).
pub fn parse(json: &str) -> Result<(String, usize, Vec<RasFinding>), String> {
    let r: Report = serde_json::from_str(json).map_err(|e| format!("RAS report is not the JSON NCCL writes: {e}"))?;
    Ok((r.nccl_version, r.communicators.len(), r.communicators.iter().flat_map(comm_findings).collect()))
}

fn line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut s = String::new();
    r.by_ref().take(4096).read_line(&mut s)?;
    Ok(s.trim_end().to_string())
}

/// Asks the service at `addr`; `timeout` bounds the connect and each read/write (the status
/// read gets `PEER_TIMEOUT_S` more, the service's own wait for its peers).
pub fn query(addr: &str, timeout: Duration, now: f64) -> RasView {
    let mut v = RasView { addr: addr.to_string(), at: now, ..Default::default() };
    match ask(addr, timeout) {
        Ok(Answer::Json(server, body)) => match parse(&body) {
            Ok((ver, n, f)) => (v.state, v.detail, v.nccl_version, v.communicators, v.findings) = ("answered".into(), server, ver, n, f),
            Err(e) => (v.state, v.detail) = ("absent".into(), e),
        },
        Ok(Answer::NoJson(server)) => (v.state, v.detail) = ("no_json".into(), server),
        Err(e) => (v.state, v.detail) = ("absent".into(), e),
    }
    v
}

enum Answer {
    Json(String, String),
    NoJson(String),
}

fn ask(addr: &str, timeout: Duration) -> Result<Answer, String> {
    let sa = addr.to_socket_addrs().map_err(|e| format!("{addr}: {e}"))?.next().ok_or_else(|| format!("{addr}: no address"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| format!("nothing answers on {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout)).and_then(|_| s.set_write_timeout(Some(timeout))).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let say = |s: &mut TcpStream, what: &str| s.write_all(what.as_bytes()).map_err(|e| format!("{addr}: {e}"));
    say(&mut s, &format!("CLIENT PROTOCOL {PROTOCOL}\n"))?;
    let server = line(&mut r).map_err(|e| format!("{addr}: no handshake: {e}"))?;
    if !server.to_ascii_uppercase().starts_with("SERVER PROTOCOL ") {
        return Err(format!("{addr} is not NCCL's RAS service (answered {server:?})"));
    }
    say(&mut s, &format!("TIMEOUT {PEER_TIMEOUT_S}\n"))?;
    let ok = line(&mut r).map_err(|e| format!("{addr}: {e}"))?;
    if !ok.eq_ignore_ascii_case("OK") {
        return Err(format!("{addr}: TIMEOUT refused: {ok:?}"));
    }
    say(&mut s, "SET FORMAT json\n")?;
    if !line(&mut r).map_err(|e| format!("{addr}: {e}"))?.eq_ignore_ascii_case("OK") {
        return Ok(Answer::NoJson(server));
    }
    say(&mut s, "STATUS\n")?;
    s.set_read_timeout(Some(timeout + Duration::from_secs(PEER_TIMEOUT_S.into()))).map_err(|e| e.to_string())?;
    let mut body = String::new();
    r.take(MAX_REPORT).read_to_string(&mut body).map_err(|e| format!("{addr}: status: {e}"))?;
    Ok(Answer::Json(server, body))
}

static LATEST: RwLock<Option<RasView>> = RwLock::new(None);

/// The latest answer (None: not asked, or RAS queries are off).
pub fn latest() -> Option<RasView> {
    LATEST.read().ok().and_then(|g| g.clone())
}

/// Starts the poller (a tokio task; each query on a blocking thread) unless `ras_addr` is empty.
pub fn start(cfg: &crate::config::CollectivesConfig, mut stop: tokio::sync::watch::Receiver<bool>) -> Option<tokio::task::JoinHandle<()>> {
    if !cfg.enabled || cfg.ras_addr.is_empty() {
        return None;
    }
    let (addr, every) = (cfg.ras_addr.clone(), cfg.ras_every.max(Duration::from_secs(1)));
    Some(tokio::spawn(async move {
        loop {
            let a = addr.clone();
            let now = crate::engine::wall_now();
            let q = tokio::task::spawn_blocking(move || query(&a, Duration::from_secs(2), now));
            if let Ok(Ok(v)) = tokio::time::timeout(Duration::from_secs(15), q).await {
                if let Ok(mut g) = LATEST.write() {
                    *g = Some(v);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.changed() => return,
            }
        }
    }))
}

#[cfg(test)]
#[path = "ras_tests.rs"]
pub(crate) mod tests;
