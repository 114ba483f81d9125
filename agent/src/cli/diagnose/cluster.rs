//! Cluster mode, after the fan-out: every peer's calls joined on `(CommId, seq)`, then the
//! daemon's own pipeline (`crate::pipeline`: steps, their windows from every peer's counter
//! samples, `attribution::attribute`) per selected step. Pure: the peers' answers in, step
//! reports out.

use std::collections::BTreeMap;

use super::{Selection, MAX_STEPS};
use crate::{
    attribution::{NetSample, Params},
    pipeline::{self, Found, Gaps},
    report::duration,
    report::{nics_of, Skew, StepReport},
    timeline::{
        clocks::{self, Clocks},
        links::{Links, ProcessLink},
    },
    timeline::{join::CallView, join_calls, Collective, CounterLog, Marker, NicInfo, NicSample},
};

/// What one peer answered.
#[derive(Clone, Debug, Default)]
pub struct PeerData {
    /// The address that was queried (`host:port`).
    pub peer: String,
    /// The host name the agent reports.
    pub host: String,
    pub clock_error_seconds: f64,
    pub clock_synchronized: bool,
    pub calls: Vec<CallView>,
    pub net: Vec<NetSample>,
    pub markers: Vec<Marker>,
    pub nics: Vec<(NicInfo, Vec<NicSample>)>,
    /// The NICs each of the peer's traced processes uses.
    pub links: Vec<ProcessLink>,
    /// When the peer's probes dropped or lost events, on the peer's clock (the page's
    /// `drop_spans`, `lost_spans`).
    pub gaps: Gaps,
    /// Partial answers (an endpoint that failed after the calls arrived), truncation.
    pub notes: Vec<String>,
}

/// The selected steps, attributed.
#[derive(Debug, Default)]
pub struct Analysis {
    pub steps: Vec<StepReport>,
    pub notes: Vec<String>,
    /// Largest clock error bound of the hosts compared: after the correction of
    /// [`Analysis::clocks`] for hosts that shared collectives, their own NTP bound otherwise.
    pub clock_error_seconds: Option<f64>,
    /// Every host's clock offset against the reference host, as estimated and applied.
    pub clocks: Clocks,
}

/// Clock-free skew of a set of collectives: Σ (max − min) of each collective's time inside
/// the call, and the rank that spent the least time inside most often (by summed deficit).
/// `None` when no collective was seen on two ranks. Collectives timed at the host enqueue
/// are left out: the time inside such a call is the enqueue, not the wait for the peers.
pub fn clock_free(colls: &[&Collective]) -> (Option<f64>, Option<u32>) {
    let mut total = None;
    let mut deficit: BTreeMap<u32, f64> = BTreeMap::new();
    for c in colls.iter().filter(|c| c.arrivals.len() >= 2 && !c.host_enqueue_timed()) {
        let inside = |a: &crate::timeline::Arrival| (a.exit - a.enter).max(0.0);
        let max = c.arrivals.iter().map(inside).fold(f64::NEG_INFINITY, f64::max);
        let min = c.arrivals.iter().map(inside).fold(f64::INFINITY, f64::min);
        *total.get_or_insert(0.0) += max - min;
        for a in &c.arrivals {
            *deficit.entry(a.rank).or_default() += max - inside(a);
        }
    }
    let late = deficit.into_iter().filter(|(_, d)| *d > 0.0).max_by(|a, b| a.1.total_cmp(&b.1)).map(|(r, _)| r);
    (total, late)
}

/// Per-NIC counter log of every peer, NICs tagged with their host — and named `host/netdev`
/// when the peers' NICs span hosts (one host's answer names them as its agent does) — on the
/// reference host's clock.
fn counter_log(peers: &[PeerData], clocks: &Clocks) -> CounterLog {
    let most = peers.iter().flat_map(|p| p.nics.iter().map(|n| n.1.len())).max().unwrap_or(0);
    let host_of = |p: &PeerData, info: &NicInfo| info.host.clone().unwrap_or_else(|| p.host.clone());
    let hosts: std::collections::BTreeSet<String> = peers.iter().flat_map(|p| p.nics.iter().map(move |(i, _)| host_of(p, i))).collect();
    let mut log = CounterLog::new(most + 4);
    for p in peers {
        for (info, samples) in &p.nics {
            let host = host_of(p, info);
            let name = if hosts.len() > 1 { format!("{host}/{}", info.name) } else { info.name.clone() };
            let off = clocks.offset(&host);
            let tagged = NicInfo { name, host: Some(host), ..info.clone() };
            let mut s = samples.clone();
            for x in &mut s {
                x.time -= off;
            }
            s.sort_by(|a, b| a.time.total_cmp(&b.time));
            for x in s {
                log.push(tagged.clone(), x);
            }
        }
    }
    log
}

/// What the peers observed, joined and on one clock.
struct Observed {
    colls: Vec<Collective>,
    markers: Vec<Marker>,
    log: Option<CounterLog>,
    /// Each peer's sampled requests, sorted by post time.
    nets: Vec<Vec<NetSample>>,
    /// Every peer's spans of dropped and lost probe events.
    gaps: Gaps,
    clocks: Clocks,
}

/// Joins every peer's calls, estimates the hosts' clock offsets from them
/// (`timeline::clocks`) and moves calls, markers, counter samples, requests and the spans of
/// missing probe events onto the reference host's clock.
fn observe(peers: &[PeerData], calls: Vec<&CallView>, notes: &mut Vec<String>) -> Observed {
    let mut colls = join_calls(calls);
    let mut clocks = clocks::estimate(&colls);
    clocks::correct(&mut colls, &clocks);
    // Clocks left as they are: causality bounds them, and so does NTP where both hosts say
    // they are synchronised — whichever is tighter.
    let ntp: BTreeMap<&str, (bool, f64)> = peers.iter().map(|p| (p.host.as_str(), (p.clock_synchronized, p.clock_error_seconds))).collect();
    if let Some(&(true, e0)) = ntp.get(clocks.reference.as_str()) {
        for h in clocks.hosts.iter_mut().filter(|h| !h.applied) {
            if let Some(&(true, e1)) = ntp.get(h.host.as_str()) {
                h.error_seconds = h.error_seconds.min(e0 + e1);
            }
        }
    }
    for h in &clocks.hosts {
        let (lo, hi) = (duration(h.interval.0), duration(h.interval.1));
        if h.applied {
            notes.push(format!(
                "clock of {} read {} ahead of {}'s (± {}; bounded to [{lo}, {hi}] by {} collectives): its times were moved onto {}'s clock",
                h.host,
                duration(h.offset_seconds),
                clocks.reference,
                duration(h.error_seconds),
                h.collectives,
                clocks.reference
            ));
        }
    }
    for h in &clocks.inconsistent {
        notes.push(format!(
            "clock of {h}: its collectives contradict each other against {}'s clock (a clock step in the range?); not corrected",
            clocks.reference
        ));
    }
    let mut markers: Vec<Marker> = Vec::new();
    for p in peers {
        markers.extend(p.markers.iter().cloned().map(|mut m| {
            let host = m.host.get_or_insert_with(|| p.host.clone()).clone();
            m.time = m.time.map(|t| t - clocks.offset(&host));
            m
        }));
    }
    let log = peers.iter().any(|p| !p.nics.is_empty()).then(|| counter_log(peers, &clocks));
    let nets = peers
        .iter()
        .map(|p| {
            let off = clocks.offset(&p.host);
            let mut v = p.net.clone();
            for n in &mut v {
                n.posted -= off;
                n.completed -= off;
            }
            v.sort_by(|a, b| a.posted.total_cmp(&b.posted));
            v
        })
        .collect();
    let mut gaps = Gaps::default();
    for p in peers {
        let off = clocks.offset(&p.host);
        let moved = |v: &[(f64, f64)]| v.iter().map(|&(a, b)| (a - off, b - off)).collect::<Vec<_>>();
        gaps.dropped.extend(moved(&p.gaps.dropped));
        gaps.lost.extend(moved(&p.gaps.lost));
    }
    Observed { colls, markers, log, nets, gaps, clocks }
}

/// Ranks disagreeing at one number within step `f`, numbered as the join numbers them, from
/// the calls around it (2 s and twice the step on each side, as the daemon compares the last
/// 120 s): over every call of a 1 024-rank job's 1 000 steps the comparison held ~120 MiB more
/// than the bound `tests/tests/cluster_scale.rs` sets.
fn step_desyncs(calls: &[&CallView], f: &Found, colls: &[&crate::timeline::Collective]) -> Vec<crate::timeline::desync::Desync> {
    let w = 2.0 + 2.0 * f.step.duration();
    let near: Vec<&CallView> = calls.iter().copied().filter(|c| c.enter >= f.step.begin - w && c.enter <= f.step.end + w).collect();
    crate::timeline::desync::of_step(&crate::timeline::desync::find(&near, &[]), colls)
}

/// Attributes the steps `sel` picks from the peers' answers. `Err` says why no step matched.
pub fn analyze(peers: &[PeerData], sel: &Selection, params: &Params) -> Result<Analysis, String> {
    let mut notes: Vec<String> = peers.iter().flat_map(|p| p.notes.iter().map(move |n| format!("{}: {n}", p.peer))).collect();
    let since = sel.since.unwrap_or(f64::NEG_INFINITY);
    let calls: Vec<&CallView> = peers.iter().flat_map(|p| p.calls.iter()).collect();
    if calls.is_empty() {
        return Err(format!(
            "the {} peer(s) that answered reported no collective calls{} (are the collective probes running? see /api/v1/status)",
            peers.len(),
            sel.since_phrase()
        ));
    }
    let all_calls = calls.clone();
    let Observed { colls, markers, log, nets, gaps, clocks } = observe(peers, calls, &mut notes);
    let links = Links::new(peers.iter().flat_map(|p| p.links.iter().cloned()));
    let (all_steps, how) = pipeline::find_steps(&markers, &colls);
    if all_steps.is_empty() {
        return Err(format!(
            "{} collective(s) joined but no step markers and no periodic collectives{} (send markers, or let the job run: period detection needs at least 3 repetitions)",
            colls.len(),
            sel.since_phrase()
        ));
    }
    notes.push(format!("steps from {how}"));
    // A step that began before the fetched range may be missing its first collectives.
    let in_range: Vec<Found> = all_steps.iter().filter(|f| f.step.begin >= since).cloned().collect();
    if in_range.is_empty() {
        return Err(format!("time range empty: {} step(s) found, none began{}", all_steps.len(), sel.since_phrase()));
    }
    let chosen = sel.pick(in_range, |f| f.step.id, |f| f.step.duration());
    if chosen.is_empty() {
        let ids: Vec<u64> = all_steps.iter().map(|f| f.step.id).collect();
        return Err(format!("step {} is not among the {} step(s) found (ids {:?}…{:?})", sel.step.unwrap_or(0), ids.len(), ids.first(), ids.last()));
    }
    if chosen.len() >= MAX_STEPS {
        notes.push(format!("showing the first {MAX_STEPS} steps of the range; use --slowest K or --step N"));
    }

    if log.is_none() {
        notes.push("no NIC counters from any peer: transfer time is counted as ideal communication".into());
    }
    let unsynced: Vec<&str> = peers.iter().filter(|p| !p.clock_synchronized).map(|p| p.host.as_str()).collect();
    if !unsynced.is_empty() {
        notes.push(format!("clock not synchronised on {} (adjtimex): trust the clock-free skew estimate over wall-clock skew", unsynced.join(", ")));
    }
    let mut steps = Vec::new();
    for f in &chosen {
        let (mut a, inp) = pipeline::attribute(&pipeline::Inputs { colls: &colls, log: log.as_ref(), nets: &nets, links: &links, gaps: &gaps }, f, params);
        a.desyncs = step_desyncs(&all_calls, f, &inp.collectives);
        let (cf, late) = clock_free(&inp.collectives);
        let hosts: Vec<&str> = inp.collectives.iter().flat_map(|c| c.arrivals.iter().map(|x| x.host.as_str())).collect();
        let err = clocks.error(&hosts);
        let wall = a.cause(crate::attribution::CauseKind::ReadinessSkew);
        crate::attribution::fall_back_to_clock_free(&mut a, cf, late, err, inp.collectives.len());
        let skew = Skew { wall_seconds: wall, clock_free_seconds: cf, clock_free_late_rank: late };
        steps.push(StepReport { nics: nics_of(&a), skew, attribution: a, collectives: inp.collectives.iter().map(|c| (*c).clone()).collect() });
    }
    // Hosts compared through the collectives carry that bound; the others their own.
    let estimated = |h: &str| h == clocks.reference || clocks.hosts.iter().any(|x| x.host == h);
    let own = peers.iter().filter(|p| clocks.hosts.is_empty() || !estimated(&p.host)).map(|p| p.clock_error_seconds);
    let clock_error_seconds = clocks.hosts.iter().map(|h| h.error_seconds).chain(own).fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
    Ok(Analysis { steps, notes, clock_error_seconds, clocks })
}

#[cfg(test)]
mod tests;
