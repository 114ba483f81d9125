//! `agent diagnose`: where did the step's time go? Reads attributed steps and prints, per
//! step, the seconds of each cause (they sum to the step), the ranked causes with evidence
//! and fix, per-rank arrivals and per-NIC bytes.
//!
//! - Local mode reads this host's history store (`--db`) or one agent's `/api/v1/steps`
//!   (`--agent`).
//! - Cluster mode (`--peers` / `--dns`) fans out to every agent's read-only API in parallel,
//!   joins arrivals on `(CommId, seq)` across hosts and attributes the steps itself, with the
//!   clock error bound and the clock-free skew estimate. Peers that do not answer are listed
//!   and the report uses the others.
//!
//! Exit status: 0 with a report, 2 on usage errors, 3 when no step matches (the message
//! says why), 1 when the data cannot be read at all.

pub(crate) mod cluster;
mod fetch;
mod hang;
mod locate;

use std::{
    net::ToSocketAddrs,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use clap::Args;

use super::EXIT_USAGE;
use crate::{
    attribution::{Attribution, Params},
    config::{parse_duration, DEFAULT_DB_PATH},
    report::{self, Peers, Report, StepReport},
    store::{StepQuery, Store},
};

/// Exit status when no step matches the selection.
pub const EXIT_NO_STEPS: u8 = 3;
/// Exit status when the data cannot be read (store unreadable, agent or DNS unreachable).
pub const EXIT_FAILURE: u8 = 1;
/// The agent's API port.
pub const DEFAULT_PORT: u16 = 9477;
/// Range looked at when `--since` is not given (and no `--step`).
pub const DEFAULT_SINCE: Duration = Duration::from_secs(600);
/// Most steps one report shows when a whole range is asked for.
pub const MAX_STEPS: usize = 1000;

#[derive(Debug, Args)]
#[command(after_help = "Without --step/--slowest: the slowest step of the last 10 minutes. \
Local mode reads the history store (--db) or one agent (--agent); cluster mode (--peers or --dns) \
asks every agent and joins ranks across hosts.\n\n\
Exit status: 0 a report; 1 the data cannot be read (store unreadable, agent or DNS name unreachable, \
--html file not written); 2 usage error (also a bad --peers/--agent address); 3 no step matches (the message says why; \
--json still prints a report).\n\n\
--hang: which communicator is stuck and who everyone waits for, from the live agents' /api/v1/open \
(this host's agent at 127.0.0.1:9477 unless --agent, --peers or --dns); exit 0 nothing suspected, \
4 a communicator is suspected hung, 1 no agent answered.")]
pub struct DiagnoseArgs {
    /// Live hang report instead of steps: open calls, missing ranks, their state.
    #[arg(long, conflicts_with_all = ["step", "slowest", "since", "db"])]
    pub hang: bool,
    /// Only this step (its id from markers, or from period detection).
    #[arg(long, conflicts_with = "slowest")]
    pub step: Option<u64>,
    /// The K slowest steps, slowest first.
    #[arg(long, value_name = "K", value_parser = parse_count)]
    pub slowest: Option<usize>,
    /// Only steps that began within this long before now, e.g. 10m, 2h [default: 10m].
    #[arg(long, value_name = "DURATION", value_parser = parse_since)]
    pub since: Option<Duration>,
    /// Cluster mode: every agent as host[:port] (port 9477 when omitted), comma-separated.
    #[arg(long, value_name = "HOST:PORT,…", value_delimiter = ',', num_args = 1.., conflicts_with_all = ["dns", "agent", "db"])]
    pub peers: Vec<String>,
    /// Cluster mode: a DNS name that resolves to every agent (e.g. a headless Service).
    #[arg(long, value_name = "NAME[:PORT]", conflicts_with_all = ["agent", "db"])]
    pub dns: Option<String>,
    /// Local mode from one agent's API (host[:port]) instead of the history store.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "db")]
    pub agent: Option<String>,
    /// History store to read [default: /var/lib/stepwise/agent.db].
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// Print JSON (every number in base units) instead of the table.
    #[arg(long, conflicts_with = "html")]
    pub json: bool,
    /// Also write a self-contained HTML report to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Per-peer time limit (all of a peer's requests together).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Causes at or below this many milliseconds are not listed as findings.
    #[arg(long, value_name = "MS", default_value_t = 1.0, value_parser = parse_threshold)]
    pub threshold_ms: f64,
}

/// Most steps `--slowest` reports (each is a full report).
const MAX_SLOWEST: usize = 10_000;
/// Longest `--since` window: a year of history.
const MAX_SINCE: Duration = Duration::from_secs(366 * 86_400);
/// Longest `--timeout` per peer.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest `--threshold-ms`: an hour.
const MAX_THRESHOLD_MS: f64 = 3_600_000.0;

fn parse_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) if n > MAX_SLOWEST => Err(format!("must be at most {MAX_SLOWEST}")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}: expected a whole number of steps, e.g. 3 (at most {MAX_SLOWEST})")),
    }
}

fn parse_since(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > MAX_SINCE {
        return Err(format!("must be at most {} (e.g. 10m, 2h, 7days)", humantime::format_duration(MAX_SINCE)));
    }
    Ok(d)
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be longer than 0 (e.g. 5s)".into());
    }
    if d > MAX_TIMEOUT {
        return Err(format!("must be at most {} (e.g. 5s)", humantime::format_duration(MAX_TIMEOUT)));
    }
    Ok(d)
}

fn parse_threshold(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (0.0..=MAX_THRESHOLD_MS).contains(&x) => Ok(x),
        Ok(x) => Err(format!("{x} is not a threshold: give milliseconds from 0 to {MAX_THRESHOLD_MS}, e.g. 1 or 0.5")),
        Err(e) => Err(format!("{e}: give milliseconds, e.g. 1 or 0.5")),
    }
}

/// `host`, `host:port`, `[v6]:port`, bare `v6` or `http://host:port/` → `host:port`.
pub fn parse_peer(s: &str) -> Result<String, String> {
    let t = s.trim().trim_start_matches("http://").trim_end_matches('/');
    if t.is_empty() || t.contains(['/', ' ', '?', '#', '@']) {
        return Err(format!("{s:?} is not a peer: expected host[:port], e.g. node-7:9477"));
    }
    let port_ok = |p: &str| p.parse::<u16>().ok().filter(|p| *p > 0).is_some();
    if let Some(rest) = t.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(|| format!("{s:?}: unclosed '['"))?;
        return match tail.strip_prefix(':') {
            Some(p) if port_ok(p) => Ok(format!("[{host}]:{p}")),
            None if tail.is_empty() => Ok(format!("[{host}]:{DEFAULT_PORT}")),
            _ => Err(format!("{s:?}: bad port (1–65535)")),
        };
    }
    match t.matches(':').count() {
        0 => Ok(format!("{t}:{DEFAULT_PORT}")),
        1 => match t.split_once(':') {
            Some((h, p)) if !h.is_empty() && port_ok(p) => Ok(t.to_string()),
            _ => Err(format!("{s:?}: bad port (1–65535)")),
        },
        _ => Ok(format!("[{t}]:{DEFAULT_PORT}")), // bare IPv6
    }
}

/// Which steps to show. Filters combine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    pub step: Option<u64>,
    pub slowest: Option<usize>,
    /// Steps that began at or after this (wall seconds).
    pub since: Option<f64>,
    /// `--since` as the user wrote it, for messages.
    pub since_label: Option<String>,
}

impl Selection {
    /// `--step` alone looks at all history; otherwise the range defaults to the last 10
    /// minutes and, without `--slowest`/`--since`, to the slowest step in it.
    pub fn from_args(a: &DiagnoseArgs, now: f64) -> Selection {
        let since = a.since.or(if a.step.is_none() { Some(DEFAULT_SINCE) } else { None });
        let slowest = a.slowest.or(if a.step.is_none() && a.since.is_none() { Some(1) } else { None });
        Selection { step: a.step, slowest, since: since.map(|d| now - d.as_secs_f64()), since_label: since.map(|d| humantime::format_duration(d).to_string()) }
    }

    /// " in the last 10m", or "" without a range.
    pub fn since_phrase(&self) -> String {
        self.since_label.as_ref().map(|l| format!(" in the last {l}")).unwrap_or_default()
    }

    /// Applies `step` and `slowest` (slowest first) to items already in range; a whole range
    /// is capped at [`MAX_STEPS`], the most recent kept.
    pub fn pick<T>(&self, mut items: Vec<T>, id: impl Fn(&T) -> u64, seconds: impl Fn(&T) -> f64) -> Vec<T> {
        if let Some(n) = self.step {
            items.retain(|x| id(x) == n);
        }
        if let Some(k) = self.slowest {
            items.sort_by(|a, b| seconds(b).total_cmp(&seconds(a)));
            items.truncate(k);
        } else if items.len() > MAX_STEPS {
            items.drain(..items.len() - MAX_STEPS);
        }
        items
    }
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Why `diagnose` produced no report.
#[derive(Debug, thiserror::Error)]
pub enum DiagnoseError {
    /// No step matched; the report still carries the peers and notes (for `--json`).
    #[error("no steps match: {why}")]
    NoSteps { why: String, report: Box<Report> },
    #[error("cannot read the history store at {path}: {reason}")]
    Store { path: PathBuf, reason: String },
    #[error("agent {agent} did not answer: {source}")]
    Agent {
        agent: String,
        #[source]
        source: fetch::PeerError,
    },
    #[error("cannot resolve {name}: {reason}")]
    Dns { name: String, reason: String },
}

/// Local mode from the history store: the one place that reads it. With `collectives`
/// (the HTML timeline needs them) each step comes with its stored collectives.
fn from_store(db: &std::path::Path, sel: &Selection, collectives: bool) -> Result<Vec<StepReport>, DiagnoseError> {
    let store_err = |e: &dyn std::fmt::Display| DiagnoseError::Store { path: db.to_path_buf(), reason: e.to_string() };
    let none = |why: String| DiagnoseError::NoSteps { why, report: Box::default() };
    // Never create a store by reading one (Store::open creates missing files).
    match std::fs::metadata(db) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(none(format!("no history store at {} (has the agent run on this host? point --db at its [store] path)", db.display())))
        }
        Err(e) => return Err(store_err(&e)),
        // A device (`/dev/zero` reads as empty), FIFO or directory is no store: an error like
        // any unreadable one, not "no steps".
        Ok(m) if !m.file_type().is_file() => return Err(store_err(&"not a regular file")),
        Ok(m) if m.len() == 0 => return Err(none(format!("the history store at {} is empty: no step stored yet", db.display()))),
        Ok(_) => {}
    }
    let st = Store::open(db).map_err(|e| store_err(&e))?;
    let whole_range = sel.step.is_none() && sel.slowest.is_none();
    let q = StepQuery { step: sel.step, since: sel.since, slowest: sel.slowest, limit: whole_range.then_some(MAX_STEPS), job_key: None };
    let steps = st.steps(&q).map_err(|e| store_err(&e))?;
    if !steps.is_empty() {
        return steps
            .into_iter()
            .map(|a| {
                let colls = if collectives { st.collectives_of_step(&a).map_err(|e| store_err(&e))? } else { Vec::new() };
                Ok(StepReport::from_attribution(a).with_collectives(colls))
            })
            .collect();
    }
    let n = st.count_steps().map_err(|e| store_err(&e))?;
    if n == 0 {
        return Err(none(format!(
            "the history store at {} is empty: no step stored yet (the agent stores a step once markers or periodic collectives define it)",
            db.display()
        )));
    }
    let newest = st.steps(&StepQuery { limit: Some(1), ..Default::default() }).map_err(|e| store_err(&e))?.first().map(|a| a.begin);
    let ago = newest
        .map(|t| format!("; the newest began {} ago", humantime::format_duration(Duration::from_secs((now_unix() - t).max(0.0) as u64))))
        .unwrap_or_default();
    Err(none(match sel.step {
        Some(k) => format!("step {k} is not in the store at {}{} ({n} step(s) stored{ago})", db.display(), sel.since_phrase()),
        None => format!("time range empty: none of the {n} stored step(s) began{}{ago} (widen --since)", sel.since_phrase()),
    }))
}

/// Local mode from one agent's `/api/v1/steps`.
fn from_agent(addr: &str, sel: &Selection, timeout: Duration) -> Result<(Vec<Attribution>, String), DiagnoseError> {
    let agent = fetch::client();
    let mut q = format!("/api/v1/steps?limit={MAX_STEPS}");
    if let Some(s) = sel.since {
        q += &format!("&since={s:.6}");
    }
    if let Some(k) = sel.slowest {
        q += &format!("&slowest={k}");
    }
    if let Some(n) = sel.step {
        q += &format!("&step={n}");
    }
    let deadline = std::time::Instant::now() + timeout;
    let w: crate::export::pages::StepsPage =
        fetch::get_json(&agent, addr, &q, deadline, timeout).map_err(|source| DiagnoseError::Agent { agent: addr.into(), source })?;
    // The agent filters too; filtering again keeps the selection's meaning exact.
    let since = sel.since.unwrap_or(f64::NEG_INFINITY);
    let steps = sel.pick(w.steps.into_iter().filter(|a| a.begin >= since).collect(), |a| a.step, |a| a.seconds);
    if steps.is_empty() {
        let why = match sel.step {
            Some(n) => format!("agent {addr} ({}) has no step {n}{}", w.host, sel.since_phrase()),
            None => format!("agent {addr} ({}) attributed no step{} (are markers or periodic collectives reaching it?)", w.host, sel.since_phrase()),
        };
        return Err(DiagnoseError::NoSteps { why, report: Box::default() });
    }
    Ok((steps, w.host))
}

fn resolve(name: &str) -> Result<Vec<String>, DiagnoseError> {
    let target = parse_peer(name).map_err(|reason| DiagnoseError::Dns { name: name.into(), reason })?;
    let addrs = target.to_socket_addrs().map_err(|e| DiagnoseError::Dns { name: name.into(), reason: e.to_string() })?;
    let mut peers: Vec<String> = addrs.map(|a| a.to_string()).collect();
    peers.sort();
    peers.dedup();
    if peers.is_empty() {
        return Err(DiagnoseError::Dns { name: name.into(), reason: "no addresses".into() });
    }
    Ok(peers)
}

fn cluster_report(peers: &[String], sel: &Selection, timeout: Duration, threshold: f64) -> Result<Report, DiagnoseError> {
    let now = now_unix();
    let mut since = sel.since.unwrap_or(now - DEFAULT_SINCE.as_secs_f64());
    let mut until = now;
    // --step N: every peer is asked only for the stretch that holds it (locate.rs).
    let located = sel.step.and_then(|n| locate::locate(peers, n, since, now, timeout));
    if let Some(l) = &located {
        (since, until) = (l.since, l.until);
    }
    let (answered, failed) = fetch::fan_out(peers, since, until, timeout, true);
    let mut rep = Report {
        source: format!("cluster of {} peer(s)", peers.len()),
        peers: Peers { answered: answered.iter().map(|p| format!("{} ({})", p.peer, p.host)).collect(), failed },
        threshold_seconds: threshold,
        ..Default::default()
    };
    if answered.is_empty() {
        return Err(DiagnoseError::NoSteps { why: format!("none of the {} peer(s) answered", peers.len()), report: Box::new(rep) });
    }
    // Period detection and --step need the range the calls were fetched for.
    let sel = Selection {
        since: Some(since),
        since_label: sel.since_label.clone().or_else(|| Some(humantime::format_duration(DEFAULT_SINCE).to_string())),
        ..sel.clone()
    };
    match cluster::analyze(&answered, &sel, &Params::default()) {
        Ok(an) => {
            rep.steps = an.steps;
            rep.notes = an.notes;
            if let (Some(l), Some(n)) = (&located, sel.step) {
                rep.notes.push(format!(
                    "step {n} located in {}'s history: every peer was asked only for the {:.1} s of history around it",
                    l.peer,
                    l.until - l.since
                ));
            }
            rep.clock_error_seconds = an.clock_error_seconds;
            rep.clocks = Some(an.clocks);
            Ok(rep)
        }
        Err(why) => Err(DiagnoseError::NoSteps { why, report: Box::new(rep) }),
    }
}

fn build(a: &DiagnoseArgs, sel: &Selection) -> Result<Report, DiagnoseError> {
    let threshold = a.threshold_ms / 1e3;
    let peers: Vec<String> = match &a.dns {
        Some(name) => resolve(name)?,
        None => a.peers.clone(),
    };
    if !peers.is_empty() {
        return cluster_report(&peers, sel, a.timeout, threshold);
    }
    let (steps, source) = match &a.agent {
        Some(addr) => {
            let (steps, host) = from_agent(addr, sel, a.timeout)?;
            (steps.into_iter().map(StepReport::from_attribution).collect(), format!("agent {addr} ({host})"))
        }
        None => {
            let db = a.db.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DB_PATH));
            (from_store(&db, sel, a.html.is_some())?, format!("store {}", db.display()))
        }
    };
    Ok(Report { source, steps, threshold_seconds: threshold, ..Default::default() })
}

pub fn main(mut a: DiagnoseArgs) -> ExitCode {
    // Peers are validated before anything is sent.
    let mut peers = Vec::with_capacity(a.peers.len());
    for p in a.peers.iter().chain(a.agent.iter()) {
        match parse_peer(p) {
            Ok(x) => peers.push(x),
            Err(e) => {
                eprintln!("agent diagnose: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    if let Some(ag) = &mut a.agent {
        *ag = peers.pop().unwrap_or_default();
    }
    // A peer named twice (or as `host` and `host:9477`) is asked once.
    let mut seen = std::collections::HashSet::new();
    peers.retain(|p| seen.insert(p.clone()));
    a.peers = peers;
    if a.hang {
        let peers = match (&a.dns, &a.agent) {
            (Some(name), _) => match resolve(name) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("agent diagnose: {e}");
                    return ExitCode::from(EXIT_FAILURE);
                }
            },
            (None, Some(ag)) => vec![ag.clone()],
            (None, None) => a.peers.clone(),
        };
        let cluster = a.dns.is_some() || !a.peers.is_empty();
        return hang::main(&a, peers, cluster);
    }
    let sel = Selection::from_args(&a, now_unix());
    let out = build(&a, &sel);
    let rep = match out {
        Ok(r) => r,
        Err(DiagnoseError::NoSteps { why, mut report }) => {
            eprintln!("agent diagnose: no steps match: {why}");
            if report.source.is_empty() {
                report.source = match (&a.agent, &a.db) {
                    (Some(ag), _) => format!("agent {ag}"),
                    (None, db) => format!("store {}", db.as_deref().unwrap_or(std::path::Path::new(DEFAULT_DB_PATH)).display()),
                };
            }
            if a.json {
                report.notes.push(format!("no steps match: {why}"));
                return super::print_stdout(report::json::render(&report), ExitCode::from(EXIT_NO_STEPS));
            } else if !report.peers.failed.is_empty() {
                eprint!("{}", report::text::render(&report));
            }
            return ExitCode::from(EXIT_NO_STEPS);
        }
        Err(e) => {
            eprintln!("agent diagnose: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    if let Some(path) = &a.html {
        if let Err(e) = std::fs::write(path, report::html::render(&rep)) {
            eprintln!("agent diagnose: cannot write {}: {e}", path.display());
            return ExitCode::from(EXIT_FAILURE);
        }
        eprintln!("wrote {}", path.display());
    }
    super::print_stdout(if a.json { report::json::render(&rep) } else { report::text::render(&rep) }, ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests;
