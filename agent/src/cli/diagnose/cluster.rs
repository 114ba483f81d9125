//! Cluster mode, after the fan-out: every peer's calls joined on `(CommId, seq)`, steps from
//! markers (else from the period of the main communicator), per-collective NIC windows from
//! every peer's counter samples, and `attribution::attribute` per selected step. Pure: the
//! peers' answers in, step reports out.

use std::collections::BTreeMap;

use super::{Selection, MAX_STEPS};
use crate::{
    attribution::{attribute, NetSample, Params, StepData},
    report::{nics_of, Skew, StepReport},
    timeline::{join::CallView, join_calls, steps_from_markers, steps_from_period, Collective, CounterLog, Marker, NicInfo, NicSample, NicWindow, Step},
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
    /// Partial answers (an endpoint that failed after the calls arrived), truncation.
    pub notes: Vec<String>,
}

/// The selected steps, attributed.
#[derive(Debug, Default)]
pub struct Analysis {
    pub steps: Vec<StepReport>,
    pub notes: Vec<String>,
    /// Largest clock error bound among the peers that answered.
    pub clock_error_seconds: Option<f64>,
}

/// Clock-free skew of a set of collectives: Σ (max − min) of each collective's time inside
/// the call, and the rank that spent the least time inside most often (by summed deficit).
/// `None` when no collective was seen on two ranks.
pub fn clock_free(colls: &[&Collective]) -> (Option<f64>, Option<u32>) {
    let mut total = None;
    let mut deficit: BTreeMap<u32, f64> = BTreeMap::new();
    for c in colls.iter().filter(|c| c.arrivals.len() >= 2) {
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

/// Steps from markers; without markers, from the period of the communicator with the most
/// ranks (then the most collectives) — the job's world communicator, whose collectives
/// every step issues. Returns the steps and how they were found.
fn find_steps(markers: &[Marker], colls: &[Collective]) -> (Vec<Step>, String) {
    let s = steps_from_markers(markers);
    if !s.is_empty() {
        return (s, "step markers".into());
    }
    let mut by_comm: BTreeMap<&str, Vec<&Collective>> = BTreeMap::new();
    for c in colls {
        by_comm.entry(c.comm.as_str()).or_default().push(c);
    }
    let main = by_comm.iter().max_by_key(|(_, v)| (v.iter().map(|c| c.arrivals.len()).max().unwrap_or(0), v.len())).map(|(k, _)| *k);
    let Some(main) = main else { return (Vec::new(), "no collectives".into()) };
    let mut v = by_comm.remove(main).unwrap_or_default();
    v.sort_by_key(|c| c.seq);
    (steps_from_period(&v), format!("the period of communicator {main}'s collectives (no step markers; step ids count from the start of the fetched range)"))
}

/// Per-NIC counter log of every peer, NICs named `host/netdev` and tagged with their host.
fn counter_log(peers: &[PeerData]) -> CounterLog {
    let most = peers.iter().flat_map(|p| p.nics.iter().map(|n| n.1.len())).max().unwrap_or(0);
    let mut log = CounterLog::new(most + 4);
    for p in peers {
        for (info, samples) in &p.nics {
            let host = info.host.clone().unwrap_or_else(|| p.host.clone());
            let tagged = NicInfo { name: format!("{host}/{}", info.name), host: Some(host), ..info.clone() };
            let mut s = samples.clone();
            s.sort_by(|a, b| a.time.total_cmp(&b.time));
            for x in s {
                log.push(tagged.clone(), x);
            }
        }
    }
    log
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
    let colls = join_calls(calls);
    let mut markers: Vec<Marker> = Vec::new();
    for p in peers {
        markers.extend(p.markers.iter().cloned().map(|mut m| {
            m.host.get_or_insert_with(|| p.host.clone());
            m
        }));
    }
    let (all_steps, how) = find_steps(&markers, &colls);
    if all_steps.is_empty() {
        return Err(format!(
            "{} collective(s) joined but no step markers and no periodic collectives{} (send markers, or let the job run: period detection needs at least 3 repetitions)",
            colls.len(),
            sel.since_phrase()
        ));
    }
    notes.push(format!("steps from {how}"));
    // A step that began before the fetched range may be missing its first collectives.
    let in_range: Vec<Step> = all_steps.iter().filter(|s| s.begin >= since).cloned().collect();
    if in_range.is_empty() {
        return Err(format!("time range empty: {} step(s) found, none began{}", all_steps.len(), sel.since_phrase()));
    }
    let chosen = sel.pick(in_range, |s| s.id, |s| s.duration());
    if chosen.is_empty() {
        let ids: Vec<u64> = all_steps.iter().map(|s| s.id).collect();
        return Err(format!("step {} is not among the {} step(s) found (ids {:?}…{:?})", sel.step.unwrap_or(0), ids.len(), ids.first(), ids.last()));
    }
    if chosen.len() >= MAX_STEPS {
        notes.push(format!("showing the first {MAX_STEPS} steps of the range; use --slowest K or --step N"));
    }

    let log = counter_log(peers);
    let have_counters = peers.iter().any(|p| !p.nics.is_empty());
    if !have_counters {
        notes.push("no NIC counters from any peer: transfer time is counted as ideal communication".into());
    }
    let unsynced: Vec<&str> = peers.iter().filter(|p| !p.clock_synchronized).map(|p| p.host.as_str()).collect();
    if !unsynced.is_empty() {
        notes.push(format!("clock not synchronised on {} (adjtimex): trust the clock-free skew estimate over wall-clock skew", unsynced.join(", ")));
    }
    // Requests sorted by post time, so each step looks only at its own (a request posted
    // more than a second before the step began is not looked at).
    let nets: Vec<Vec<NetSample>> = peers
        .iter()
        .map(|p| {
            let mut v = p.net.clone();
            v.sort_by(|a, b| a.posted.total_cmp(&b.posted));
            v
        })
        .collect();
    let mut steps = Vec::new();
    for s in &chosen {
        // `join_calls` sorts by first arrival: the step's collectives (Step::collectives'
        // rule) are one slice.
        let lo = colls.partition_point(|c| c.first_arrival() < s.begin - 1e-6);
        let hi = colls.partition_point(|c| c.first_arrival() < s.end).max(lo);
        let cs: Vec<&Collective> = colls[lo..hi].iter().collect();
        let windows: Vec<Vec<NicWindow>> = cs.iter().map(|c| if have_counters { log.window(c.last_arrival(), c.last_exit()) } else { Vec::new() }).collect();
        // In-flight limits are per connection: use one host's sampled requests (the host
        // with the most in the step) rather than summing outstanding requests over hosts.
        let net: Vec<NetSample> = nets
            .iter()
            .map(|v| {
                let (a, b) = (v.partition_point(|n| n.posted < s.begin - 1.0), v.partition_point(|n| n.posted < s.end));
                v[a..b.max(a)].iter().filter(|n| n.completed > s.begin).cloned().collect::<Vec<_>>()
            })
            .max_by_key(|v| v.len())
            .unwrap_or_default();
        let a = attribute(&StepData { step: s, collectives: &cs, windows: &windows, net: &net, dropped_events: false }, params);
        let (cf, late) = clock_free(&cs);
        let skew = Skew { wall_seconds: a.cause(crate::attribution::CauseKind::ReadinessSkew), clock_free_seconds: cf, clock_free_late_rank: late };
        steps.push(StepReport { nics: nics_of(&a), skew, attribution: a, collectives: cs.iter().map(|c| (*c).clone()).collect() });
    }
    let clock_error_seconds = peers.iter().map(|p| p.clock_error_seconds).fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
    Ok(Analysis { steps, notes, clock_error_seconds })
}

#[cfg(test)]
mod tests;
