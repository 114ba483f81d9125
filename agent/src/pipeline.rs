//! The one way from observations to attributed steps, shared by the daemon
//! ([`crate::engine::Engine`]) and cluster `agent diagnose` (`cli::diagnose::cluster`):
//!
//! 1. [`find_steps`]: joined collectives + markers → steps, each with the collectives it holds;
//! 2. [`step_inputs`]: a step's collectives → the counter windows of the NICs their ranks use
//!    ([`crate::timeline::links`]) and the sampled network requests of the step;
//! 3. [`attribute`]: [`crate::attribution::attribute`] → seconds per cause.
//!
//! What differs between the daemon and the cluster is data, not rules: the daemon passes one
//! host's calls, counters and requests, the cluster every peer's.
//!
//! Steps come from markers when there are any (a marker step holds every collective whose first
//! arrival lies inside it: a step may use several communicators). A job with no collective
//! inside a marker step (one that ran before or after the marked job), and every job when
//! there are no markers, gets its steps from the period of its main communicator (markers
//! carry no process id, so a job running *while* a marked job's steps are open is taken as
//! part of those steps): communicators whose calls come from the
//! same processes are one job (a rank's world, per-host and per-rail communicators), its main
//! communicator is the one with the most ranks whose `(op, bytes)` sequence repeats, and a step
//! holds its period group of that communicator — by sequence number, so a collective can never
//! fall outside its own step — plus the job's other communicators' collectives that began
//! inside it. Other jobs' collectives are never part of a step.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    attribution::{self, Attribution, NetSample, Params, StepData},
    timeline::{links::Links, steps::detect_period, steps_from_markers, Activity, Collective, CounterLog, Marker, NicWindow, Step, StepSource},
};

/// A step and the collectives it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// The job the step belongs to: `markers`, or the main communicator of a period job.
    pub job: String,
    pub step: Step,
    /// Indices into the collectives given to [`find_steps`], ascending.
    pub members: Vec<usize>,
}

/// The steps of `colls` (joined, sorted by first arrival as `join_calls` returns them) and
/// `markers`, and how they were found (for a note).
pub fn find_steps(markers: &[Marker], colls: &[Collective]) -> (Vec<Found>, String) {
    let mut found: Vec<Found> = steps_from_markers(markers)
        .into_iter()
        .map(|step| {
            let lo = colls.partition_point(|c| c.first_arrival() < step.begin - 1e-6);
            let hi = colls.partition_point(|c| c.first_arrival() < step.end).max(lo);
            Found { job: "markers".into(), members: (lo..hi).collect(), step }
        })
        .collect();
    let marked: BTreeSet<usize> = found.iter().flat_map(|f| f.members.iter().copied()).collect();
    let mut mains = Vec::new();
    for job in jobs(colls) {
        // A job with a collective inside a marker step is the marked job (its markers are the
        // steps); a job entirely outside them — another job before or after it — gets period
        // steps, so its collectives are not lost while the markers are kept.
        if job.values().flatten().any(|i| marked.contains(i)) {
            continue;
        }
        if let Some((main, steps)) = period_steps(colls, &job) {
            mains.push(main.to_string());
            found.extend(steps);
        }
    }
    let by_markers = found.iter().any(|f| f.job == "markers");
    let how = match (by_markers, mains.is_empty()) {
        (true, true) => "step markers".to_string(),
        (false, true) => "no step markers and no periodic collectives".to_string(),
        (by_markers, false) => format!(
            "{}the period of the main communicator of each job{} ({}; step ids count periods of that communicator's sequence numbers)",
            if by_markers { "step markers, and " } else { "" },
            if by_markers { " outside them" } else { "" },
            mains.join(", ")
        ),
    };
    (found, how)
}

/// Communicators grouped into jobs: two communicators are one job when a process (host, pid)
/// called both. Each job lists its collectives' indices per communicator.
fn jobs(colls: &[Collective]) -> Vec<BTreeMap<&str, Vec<usize>>> {
    let mut by_comm: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in colls.iter().enumerate() {
        by_comm.entry(c.comm.as_str()).or_default().push(i);
    }
    let comms: Vec<&str> = by_comm.keys().copied().collect();
    let index: BTreeMap<&str, usize> = comms.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let mut parent: Vec<usize> = (0..comms.len()).collect();
    fn root(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let mut owner: BTreeMap<(&str, u32), usize> = BTreeMap::new();
    for c in colls {
        let ci = index[c.comm.as_str()];
        for a in &c.arrivals {
            let o = *owner.entry((a.host.as_str(), a.pid)).or_insert(ci);
            let (x, y) = (root(&mut parent, o), root(&mut parent, ci));
            if x != y {
                parent[x.max(y)] = x.min(y);
            }
        }
    }
    let mut out: BTreeMap<usize, BTreeMap<&str, Vec<usize>>> = BTreeMap::new();
    for (i, comm) in comms.iter().enumerate() {
        let r = root(&mut parent, i);
        out.entry(r).or_default().insert(comm, by_comm.remove(comm).unwrap_or_default());
    }
    out.into_values().collect()
}

/// Period steps of one job: the main communicator (most ranks, then most collectives, among
/// those whose sequence repeats) and its steps.
fn period_steps<'a>(colls: &[Collective], job: &BTreeMap<&'a str, Vec<usize>>) -> Option<(&'a str, Vec<Found>)> {
    let ranks = |v: &[usize]| v.iter().map(|&i| colls[i].arrivals.len().max(colls[i].nranks.unwrap_or(0) as usize)).max().unwrap_or(0);
    let mut candidates: Vec<(&str, &Vec<usize>)> = job.iter().map(|(k, v)| (*k, v)).collect();
    candidates.sort_by_key(|(_, v)| std::cmp::Reverse((ranks(v), v.len())));
    for (main, idx) in candidates {
        let mut seq: Vec<usize> = idx.clone();
        seq.sort_by_key(|&i| colls[i].seq);
        let sig: Vec<(&str, Option<u64>)> = seq.iter().map(|&i| (colls[i].op.as_str(), colls[i].bytes)).collect();
        let Some((warm, p)) = detect_period(&sig) else { continue };
        let ph = phase(colls, &seq[warm..], p);
        let start = warm + seq[warm..].iter().position(|&i| colls[i].seq % p as u64 == ph).unwrap_or(0);
        let groups: Vec<&[usize]> = seq[start..].chunks(p).filter(|g| g.len() == p).collect();
        let others: Vec<usize> = job.iter().filter(|(k, _)| **k != main).flat_map(|(_, v)| v.iter().copied()).collect();
        let last_exit = |g: &[usize]| g.iter().map(|&i| colls[i].last_exit()).fold(f64::NEG_INFINITY, f64::max);
        let mut steps = Vec::new();
        for k in 1..groups.len() {
            let (begin, end) = (last_exit(groups[k - 1]), last_exit(groups[k]));
            if end <= begin {
                continue;
            }
            let mut members: BTreeSet<usize> = groups[k].iter().copied().collect();
            members.extend(others.iter().copied().filter(|&i| (begin - 1e-6..end).contains(&colls[i].first_arrival())));
            // Step ids count periods of the main communicator's sequence numbers: stable
            // however much history is looked at (a step found again later keeps its id).
            let id = colls[groups[k][0]].seq / p as u64;
            let step = Step { id, begin, end, source: StepSource::Period, ranks: BTreeMap::new() };
            steps.push(Found { job: main.to_string(), step, members: members.into_iter().collect() });
        }
        if !steps.is_empty() {
            return Some((main, steps));
        }
    }
    None
}

/// Where a period of `p` collectives begins, as a sequence number modulo `p`: before the
/// collective that follows the longest idle time (median over periods) — the step's compute.
/// A property of the job, not of how much history is looked at, so step boundaries and ids
/// stay put as the history window moves.
fn phase(colls: &[Collective], seq: &[usize], p: usize) -> u64 {
    if p <= 1 {
        return 0;
    }
    let mut gaps: Vec<Vec<f64>> = vec![Vec::new(); p];
    for w in seq.windows(2) {
        let (a, b) = (&colls[w[0]], &colls[w[1]]);
        gaps[(b.seq % p as u64) as usize].push(b.first_arrival() - a.last_exit());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NEG_INFINITY)
    };
    (0..p).max_by(|&x, &y| median(&mut gaps[x].clone()).total_cmp(&median(&mut gaps[y].clone()))).unwrap_or(0) as u64
}

/// What the steps are attributed from: the joined collectives (as [`find_steps`] got them),
/// the NIC counters (when any were sampled), each host's sampled requests sorted by post time,
/// which NICs each process uses, and when probe events went missing.
pub struct Inputs<'c, 'o> {
    pub colls: &'c [Collective],
    pub log: Option<&'o CounterLog>,
    pub nets: &'o [Vec<NetSample>],
    pub links: &'o Links,
    pub gaps: &'o Gaps,
}

/// Wall-time spans, on the steps' clock, in which probe events went missing: `dropped` by
/// the kernel (a full ring: `sources::collectives::gaps`), `lost` with processes that exited
/// before the agent could inspect them. A step overlapping either is incomplete. The daemon
/// passes its own host's spans, the cluster every peer's (from `/api/v1/collectives`).
#[derive(Clone, Debug, Default)]
pub struct Gaps {
    pub dropped: Vec<(f64, f64)>,
    pub lost: Vec<(f64, f64)>,
}

impl Gaps {
    /// (dropped, lost) overlap `[begin, end]`.
    fn during(&self, begin: f64, end: f64) -> (bool, bool) {
        let hit = |v: &[(f64, f64)]| v.iter().any(|&(a, b)| a <= end && b >= begin);
        (hit(&self.dropped), hit(&self.lost))
    }
}

/// What attribution needs of one step beyond the step itself.
pub struct StepInputs<'a> {
    pub collectives: Vec<&'a Collective>,
    /// Per collective (same order), the deltas of the NICs its ranks use over its transfer
    /// interval; empty without counters.
    pub windows: Vec<Vec<NicWindow>>,
    /// The step's sampled network requests, of one host.
    pub net: Vec<NetSample>,
    /// Per collective (same order), its measured same-host transfers.
    pub same_host: Vec<Option<attribution::SameHost>>,
    /// How the step's NICs were linked to its ranks (empty without links).
    pub linked: Vec<String>,
}

/// How far beyond a step the collectives whose activity shapes its windows are looked for:
/// longer than the sweep `interval`'s upper bound in practice (1 s by default).
const ACTIVITY_REACH: f64 = 2.0;

/// A step's collectives, their counter windows reduced to the NICs their ranks use
/// ([`Links::filter`]) and the sampled requests of the step. In-flight limits are per
/// connection, so one host's requests are used — the host with the most in the step — rather
/// than outstanding requests summed over hosts. A request posted more than a second before the
/// step began is not looked at.
pub fn step_inputs<'c>(inp: &Inputs<'c, '_>, f: &Found) -> StepInputs<'c> {
    let collectives: Vec<&Collective> = f.members.iter().map(|&i| &inp.colls[i]).collect();
    let (b, e) = (f.step.begin, f.step.end);
    // The job's bytes are interpolated over its active time in the sample intervals around
    // the step (`timeline::activity`), which reach at most a sweep `interval` beyond it.
    let act = Activity::of(inp.colls, b - ACTIVITY_REACH, e + ACTIVITY_REACH);
    let windows =
        collectives.iter().map(|c| inp.log.map(|l| inp.links.filter(c, l.window_in(c.last_arrival(), c.last_exit(), &act))).unwrap_or_default()).collect();
    let same_host = collectives.iter().map(|c| inp.log.and_then(|l| attribution::measure_same_host(c, l, &act, |w| inp.links.filter(c, w)))).collect();
    let net = inp
        .nets
        .iter()
        .map(|v| {
            let (lo, hi) = (v.partition_point(|n| n.posted < b - 1.0), v.partition_point(|n| n.posted < e));
            v[lo..hi.max(lo)].iter().filter(|n| n.completed > b).cloned().collect::<Vec<_>>()
        })
        .max_by_key(|v| v.len())
        .unwrap_or_default();
    let mut linked: Vec<String> = collectives.iter().flat_map(|c| inp.links.describe(c)).collect();
    linked.sort();
    linked.dedup();
    StepInputs { collectives, windows, net, same_host, linked }
}

/// Attributes step `f`: [`step_inputs`], then [`attribution::attribute`], with a note naming the
/// NICs linked to its ranks; incomplete, and saying why, when it overlaps one of `inp.gaps`.
pub fn attribute<'c>(inp: &Inputs<'c, '_>, f: &Found, params: &Params) -> (Attribution, StepInputs<'c>) {
    let si = step_inputs(inp, f);
    let (dropped, lost) = inp.gaps.during(f.step.begin, f.step.end);
    let mut a = attribution::attribute(
        &StepData { step: &f.step, collectives: &si.collectives, windows: &si.windows, net: &si.net, same_host: &si.same_host, dropped_events: dropped },
        params,
    );
    if let Some(n) = coarse_counters(inp, &si) {
        a.notes.push(n);
    }
    if !si.linked.is_empty() {
        const SHOWN: usize = 8;
        let more = si.linked.len().saturating_sub(SHOWN);
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        a.notes.push(format!("NICs of this step's ranks (only these carry its collectives): {}{tail}", si.linked[..si.linked.len().min(SHOWN)].join(", ")));
    }
    if lost {
        a.incomplete = true;
        a.notes.push("incomplete data: probe events of processes that exited before the agent could inspect them were lost (a starved agent; see stepwise_probe_decode_errors_total{kind=\"process_gone\"})".to_string());
    }
    (a, si)
}

/// A note when the counter samples around one of the step's transfers lie more than twice
/// its length apart: the transfer's counter deltas are then the span's interpolated share,
/// not its own bytes, pauses and queues. Collectives of one host use no counters.
fn coarse_counters(inp: &Inputs<'_, '_>, si: &StepInputs<'_>) -> Option<String> {
    let log = inp.log?;
    let (span, transfer) = si
        .collectives
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.one_host())
        .filter_map(|(k, c)| {
            let (t0, t1) = (c.last_arrival(), c.last_exit());
            // The NICs that carried bytes in the transfer's window (the fast lane reads
            // those often); every NIC when none did.
            let busy: Vec<&str> = si.windows.get(k).into_iter().flatten().filter(|w| w.tx_bytes + w.rx_bytes > 0.0).map(|w| w.nic.name.as_str()).collect();
            let (b, edges) = log.bracket(t0, t1, &busy)?;
            // Coarse when the samples lie far apart around it and most of it is interpolated.
            (t1 > t0 && b > 2.0 * (t1 - t0) && edges > 0.5 * (t1 - t0)).then_some((b, t1 - t0))
        })
        .max_by(|x, y| (x.0 / x.1).total_cmp(&(y.0 / y.1)))?;
    // The e2e flat ring's 363 ms transfers were resolved at 100 ms (within 15 %), not at 1 s.
    let needed = (transfer * 1e3 / 3.0).round();
    let advice = if needed >= 10.0 {
        format!("sample at `interval` ≤ {needed:.0} ms to resolve it")
    } else {
        "shorter than counter sampling resolves (10 ms at least)".to_string()
    };
    Some(format!(
        "counters not resolved: samples {span:.2} s apart bracket a {:.0} ms transfer of this step, so its NIC bytes, pauses and queues are that span's interpolated share: rail imbalance and congestion here are approximate (low when the step's own traffic fills the transfer, high when other traffic falls elsewhere in the span) and what they miss is unexplained; {advice}",
        transfer * 1e3
    ))
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
