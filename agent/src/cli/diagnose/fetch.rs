//! The fan-out: each peer's read-only API (`/api/v1/collectives`, `/markers`, `/windows`,
//! `/steps`) over plain HTTP/1.1 with a per-peer deadline, read into the pages the agent
//! serves ([`crate::export::pages`]).
//!
//! Blocking `ureq` on a bounded pool of threads rather than an async client: `diagnose` is a
//! one-shot command that waits on the network, a thread per in-flight peer is cheap at the
//! pool's size, and a deadline per request is one setting (no runtime, no TLS stack).

use std::{
    sync::{atomic::AtomicUsize, atomic::Ordering, mpsc},
    time::{Duration, Instant},
};

use serde::de::DeserializeOwned;

use super::cluster::PeerData;
use crate::{
    attribution::NetSample,
    export::pages::{CompactCollectivesPage, MarkersPage, NetView, WindowsPage},
    report::PeerFailure,
    timeline::{Marker, NicInfo, Phase},
};

/// Most calls asked of one peer (the API's own cap).
pub const CALLS_LIMIT: usize = crate::export::api::MAX_COLLECTIVES_LIMIT;
/// Largest response body read: 100 000 calls plus their network requests are ~40–50 MB of
/// JSON. A peer that sends more (an endless or garbage body) fails at this bound, so one
/// peer costs `diagnose` at most about twice this in memory, never "as much as it sends".
pub const MAX_BODY_BYTES: u64 = 64 << 20;
/// Peers queried at once (one blocking thread each); more wait for a free worker, each with
/// its own full timeout, so the fan-out takes at most ⌈peers / 256⌉ timeouts.
pub const MAX_PARALLEL: usize = 256;

/// Why a peer's answer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connection refused (is the agent running and listening on this port?)")]
    Refused,
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("HTTP {status} from {path}: {body}")]
    Status { status: u16, path: String, body: String },
    #[error("not the agent's JSON at {path}: {error}")]
    Garbage { path: String, error: String },
    #[error("{0}")]
    Http(String),
}

fn classify(e: ureq::Error, timeout: Duration) -> PeerError {
    match e {
        ureq::Error::Timeout(_) => PeerError::Timeout(timeout),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => PeerError::Refused,
        ureq::Error::Io(io) if matches!(io.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => PeerError::Timeout(timeout),
        ureq::Error::ConnectionFailed => PeerError::Connect("connection failed".into()),
        ureq::Error::HostNotFound => PeerError::Connect("host not found".into()),
        ureq::Error::BodyExceedsLimit(n) => PeerError::Http(format!("response larger than {n} bytes")),
        e => PeerError::Http(e.to_string()),
    }
}

/// An HTTP client for the fan-out; statuses are checked by [`get_json`].
pub fn client() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).max_redirects(0).build().into()
}

/// GET `http://{peer}{path}` and parse its JSON, finishing before `deadline`.
pub fn get_json<T: DeserializeOwned>(agent: &ureq::Agent, peer: &str, path: &str, deadline: Instant, timeout: Duration) -> Result<T, PeerError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(PeerError::Timeout(timeout));
    }
    let url = format!("http://{peer}{path}");
    // Errors name the endpoint, not its query string.
    let endpoint = path.split('?').next().unwrap_or(path);
    let mut resp = agent.get(&url).config().timeout_global(Some(left)).build().call().map_err(|e| classify(e, timeout))?;
    let status = resp.status().as_u16();
    // Bytes, not a String: serde_json checks UTF-8 as it parses (no second pass).
    let body = resp.body_mut().with_config().limit(MAX_BODY_BYTES).read_to_vec().map_err(|e| classify(e, timeout))?;
    let text = |n: usize| String::from_utf8_lossy(&body[..body.len().min(n)]).into_owned();
    if status != 200 {
        return Err(PeerError::Status { status, path: endpoint.into(), body: text(200).trim().to_string() });
    }
    serde_json::from_slice(&body).map_err(|e| PeerError::Garbage { path: endpoint.into(), error: format!("{e} (body starts {:?})", text(60)) })
}

/// Everything one peer has since `since`: its calls (required), markers and counter samples
/// (a failure of those two is noted; the calls are still used).
pub fn fetch_peer(agent: &ureq::Agent, peer: &str, since: f64, until: f64, timeout: Duration) -> Result<PeerData, PeerError> {
    let deadline = Instant::now() + timeout;
    // Compact rows from an agent that has the format, every call in full from one that
    // ignores the parameter (both read by `take_calls`).
    let mut p = match get_json::<CompactCollectivesPage<NetView>>(
        agent,
        peer,
        &format!("/api/v1/collectives?since={since:.6}&until={until:.6}&limit={CALLS_LIMIT}&format=compact"),
        deadline,
        timeout,
    ) {
        Ok(c) => from_calls(peer, c)?,
        // An agent running without its probes (as `--agent` reports it): its markers and
        // counters still count.
        Err(PeerError::Status { status: 503, body, .. }) if body.contains("probes are not running") => {
            PeerData { peer: peer.to_string(), notes: vec!["collective probes off on this agent: no calls from it".into()], ..Default::default() }
        }
        Err(e) => return Err(e),
    };
    match get_json::<WindowsPage>(agent, peer, &format!("/api/v1/windows?since={since:.6}&until={until:.6}"), deadline, timeout) {
        Ok(w) => {
            let host = w.host.unwrap_or_else(|| p.host.clone());
            if p.host.is_empty() {
                p.host = host.clone();
            }
            p.nics = w.nics.into_iter().map(|s| (NicInfo { host: s.nic.host.clone().or_else(|| Some(host.clone())), ..s.nic }, s.samples)).collect();
        }
        Err(e) => p.notes.push(format!("NIC counters unavailable ({e}); its NICs are missing")),
    }
    match fetch_markers(agent, peer, &p.host, (since, until), deadline, timeout) {
        Ok((markers, note)) => {
            p.markers = markers;
            p.notes.extend(note);
        }
        Err(e) => p.notes.push(format!("markers unavailable ({e}); its ranks' markers are missing")),
    }
    Ok(p)
}

/// A peer's data from its collectives page (compact or full).
fn from_calls(peer: &str, mut c: CompactCollectivesPage<NetView>) -> Result<PeerData, PeerError> {
    let calls = c.take_calls().map_err(|error| PeerError::Garbage { path: "/api/v1/collectives".into(), error })?;
    let mut p = PeerData {
        peer: peer.to_string(),
        clock_error_seconds: c.clock_error_seconds,
        clock_synchronized: c.clock_synchronized,
        net: c.net_requests.into_iter().map(|n| NetSample { bytes: n.bytes.unwrap_or(0.0), posted: n.posted, completed: n.completed, send: n.send }).collect(),
        links: std::mem::take(&mut c.links),
        gaps: crate::pipeline::Gaps { dropped: std::mem::take(&mut c.drop_spans), lost: std::mem::take(&mut c.lost_spans) },
        ..Default::default()
    };
    if calls.len() >= CALLS_LIMIT {
        p.notes.push(format!("returned the maximum {CALLS_LIMIT} calls: older steps may be incomplete; narrow --since"));
    }
    p.calls = calls;
    p.host = c.host;
    Ok(p)
}

/// Pages of markers read from one peer at most: the agent keeps at most 200 000 markers.
pub const MAX_MARKER_PAGES: usize = 20;

/// Every marker of `[since, until]`, page by page (8 ranks × 1 000 steps are 16 000 markers,
/// more than one page): the next page starts at the last marker's time, and markers seen on
/// both pages (the same time) are kept once. A page ends in received order, so a marker
/// received later but stamped before the page's last one would be missed; the ranks of one
/// host send within microseconds of their stamps. The note says when pages ran out.
fn fetch_markers(
    agent: &ureq::Agent,
    peer: &str,
    host: &str,
    (since, until): (f64, f64),
    deadline: Instant,
    timeout: Duration,
) -> Result<(Vec<Marker>, Option<String>), PeerError> {
    let limit = crate::export::api::MAX_MARKERS_LIMIT;
    let mut seen: std::collections::HashSet<(u32, u64, bool, u64, Option<String>)> = std::collections::HashSet::new();
    let (mut out, mut from, mut prev_last) = (Vec::new(), since, f64::NEG_INFINITY);
    for _ in 0..MAX_MARKER_PAGES {
        let m: MarkersPage = get_json(agent, peer, &format!("/api/v1/markers?since={from:.6}&until={until:.6}&limit={limit}"), deadline, timeout)?;
        let last = m.markers.last().and_then(|w| w.time).unwrap_or(from);
        for w in m.markers {
            if seen.insert((w.rank, w.step, w.phase == Phase::Begin, w.time.unwrap_or(0.0).to_bits(), w.host.clone())) {
                out.push(Marker { host: w.host.or_else(|| Some(host.to_string())), ..w });
            }
        }
        if !m.truncated {
            return Ok((out, None));
        }
        if last <= prev_last {
            return Ok((out, Some(format!("the markers after {last:.6} did not fit a page ({limit}): later steps may be missing"))));
        }
        // `since` is sent to the microsecond: a microsecond of overlap (seen markers are kept once).
        (prev_last, from) = (last, last - 1e-6);
    }
    Ok((out, Some(format!("returned {MAX_MARKER_PAGES} pages of {limit} markers: later steps may be missing; narrow --since"))))
}

/// Queries every peer in parallel (at most [`MAX_PARALLEL`] at once), each within `timeout`.
/// Progress goes to stderr when `progress`. Answers keep the order of `peers`.
pub fn fan_out(peers: &[String], since: f64, until: f64, timeout: Duration, progress: bool) -> (Vec<PeerData>, Vec<PeerFailure>) {
    let agent = client();
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, Result<PeerData, PeerError>)>();
    if progress {
        eprintln!("querying {} peer(s)…", peers.len());
    }
    let mut results: Vec<Option<Result<PeerData, PeerError>>> = peers.iter().map(|_| None).collect();
    std::thread::scope(|s| {
        for _ in 0..peers.len().min(MAX_PARALLEL) {
            let tx = tx.clone();
            let (agent, next) = (&agent, &next);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(peer) = peers.get(i) else { break };
                if tx.send((i, fetch_peer(agent, peer, since, until, timeout))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let (mut done, mut ok) = (0usize, 0usize);
        let mut last = Instant::now();
        while done < peers.len() {
            match rx.recv_timeout(Duration::from_millis(250)) {
                Ok((i, r)) => {
                    done += 1;
                    ok += r.is_ok() as usize;
                    if let Some(slot) = results.get_mut(i) {
                        *slot = Some(r);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if progress && last.elapsed() >= Duration::from_secs(1) && done < peers.len() {
                eprintln!("… {done}/{} peer(s) done, {ok} answered", peers.len());
                last = Instant::now();
            }
        }
        if progress {
            eprintln!("{} peer(s): {ok} answered, {} failed", peers.len(), peers.len() - ok);
        }
    });
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    for (peer, r) in peers.iter().zip(results) {
        match r {
            Some(Ok(d)) => answered.push(d),
            Some(Err(e)) => failed.push(PeerFailure { peer: peer.clone(), error: e.to_string() }),
            None => failed.push(PeerFailure { peer: peer.clone(), error: "no answer (worker stopped)".into() }),
        }
    }
    (answered, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_read_page_by_page_each_once() {
        use crate::{
            config::StepsConfig,
            engine::Engine,
            export::{api::AppState, replay::Agents},
            timeline::Phase,
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let mut engine = Engine::new(StepsConfig::default(), "node-9".into(), &mut registry).expect("engine");
        let (t0, n) = (crate::engine::wall_now() - 100.0, 2 * crate::export::api::MAX_MARKERS_LIMIT + 300);
        for i in 0..n {
            // 64 ranks, ~320 markers and steps each: within admission control's bursts.
            let phase = if i % 128 < 64 { Phase::Begin } else { Phase::End };
            engine.add_marker(Marker { rank: (i % 64) as u32, step: (i / 128) as u64, phase, time: Some(t0 + i as f64 * 1e-3), host: None });
        }
        let mut state = AppState::new(registry);
        state.set_engine(std::sync::Arc::new(std::sync::Mutex::new(engine)));
        let agents = Agents::serve(vec![state], 1).expect("serve");
        let peer = agents.addrs[0].to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        let (m, note) = fetch_markers(&client(), &peer, "node-9", (t0 - 1.0, t0 + 1e3), deadline, Duration::from_secs(30)).expect("markers");
        assert_eq!(note, None);
        assert_eq!(m.len(), n, "three pages, every marker once");
        let keys: std::collections::HashSet<(u32, u64, bool)> = m.iter().map(|x| (x.rank, x.step, x.phase == Phase::Begin)).collect();
        assert_eq!(keys.len(), n);
        assert!(m.iter().all(|x| x.host.as_deref() == Some("node-9")));
    }

    /// The spans of dropped and lost probe events a peer's history holds reach the cluster's
    /// peer data through `/api/v1/collectives` (compact), cut to the range asked for.
    #[test]
    fn a_peers_dropped_and_lost_event_spans_are_read_from_its_collectives_page() {
        use std::sync::{Arc, Mutex};

        use crate::{export::replay::Agents, sources::collectives::history::History};
        let mut h = History::new("node-3".into(), 64);
        h.drops.record(100.0, 0);
        h.drops.record(105.0, 4);
        h.drops.record(249.0, 4);
        h.drops.record(250.0, 9);
        h.push_lost(102.5);
        let state = crate::export::api::AppState::new(prometheus_client::registry::Registry::default());
        *state.collectives.write().expect("lock") = Some(Arc::new(Mutex::new(h)));
        let agents = Agents::serve(vec![state], 1).expect("serve");
        let peer = agents.addrs[0].to_string();
        let p = fetch_peer(&client(), &peer, 50.0, 200.0, Duration::from_secs(30)).expect("peer");
        assert_eq!(p.host, "node-3");
        assert_eq!(p.gaps.dropped, vec![(100.0, 105.0)], "the span after 200 s is outside the range asked for");
        assert_eq!(p.gaps.lost, vec![(102.5, 102.5)]);
    }
}
