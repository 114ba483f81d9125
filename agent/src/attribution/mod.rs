//! Step + collectives + counter windows → seconds per cause (docs/architecture.md "What a cause's
//! seconds mean"). Each cause is a counterfactual on the step's dependency graph
//! (docs/models.md §3): the seconds that would disappear if that cause were removed.
//!
//! The step's time is split exactly:
//! - the union of collective intervals is communication; the rest is `compute` (compute,
//!   data loading, optimizer — everything outside collectives);
//! - inside a collective, [first arrival, last arrival] is `readiness_skew` (§3.2: the
//!   collective starts when its last participant is ready) and names the late rank;
//! - [last arrival, last exit] is the transfer: `ideal_comm` (the cut bound of the bytes
//!   the NICs carried, balanced over every rail at nominal rate, §1.1/§1.10) plus the
//!   excess, split in order into `congestion` (pauses, transmit wait, queueing behind other
//!   traffic, drops; §4), `rail_imbalance` (busiest NIC vs balanced, §1.10), `in_flight_limit`
//!   (V/(N·m/T) − V/B, §2), `intra_host` (the measured seconds in which only the links
//!   between ranks of one host carried the job's bytes, §1.14) and `unexplained`. Each is bounded by what is left, so the parts
//!   sum to the step time; a negative remainder (the ideal was slower than reality) is
//!   reported in `unexplained` as model error, never hidden.

pub mod busbw;
mod congestion;
mod evidence;
pub mod graph;
mod ideal;
mod in_flight;
mod intra_host;
pub use intra_host::{measure as measure_same_host, SameHost};
mod rails;
mod skew;
pub use skew::{fall_back_to_clock_free, use_clock_free};
mod transport;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The attribution parameters are configuration (`[steps.params]`).
pub use crate::config::Params;
use crate::timeline::{Collective, NicWindow, Step};

pub use evidence::{fix_for, NetSample};

/// The causes, with the exact names of the JSON `kind` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    Compute,
    IdealComm,
    IntraHost,
    ReadinessSkew,
    RailImbalance,
    InFlightLimit,
    Congestion,
    Unexplained,
}

impl CauseKind {
    pub const ALL: [CauseKind; 8] = [
        CauseKind::Compute,
        CauseKind::IdealComm,
        CauseKind::IntraHost,
        CauseKind::ReadinessSkew,
        CauseKind::RailImbalance,
        CauseKind::InFlightLimit,
        CauseKind::Congestion,
        CauseKind::Unexplained,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::Compute => "compute",
            CauseKind::IdealComm => "ideal_comm",
            CauseKind::IntraHost => "intra_host",
            CauseKind::ReadinessSkew => "readiness_skew",
            CauseKind::RailImbalance => "rail_imbalance",
            CauseKind::InFlightLimit => "in_flight_limit",
            CauseKind::Congestion => "congestion",
            CauseKind::Unexplained => "unexplained",
        }
    }
    /// Causes a user can act on (everything but compute, ideal communication and the
    /// transfers between ranks of one host, which a hierarchical collective needs).
    pub fn is_problem(self) -> bool {
        !matches!(self, CauseKind::Compute | CauseKind::IdealComm | CauseKind::IntraHost)
    }
}

/// One cause with its seconds, evidence and a fix in the user's terms.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Cause {
    pub kind: CauseKind,
    pub seconds: f64,
    /// Fraction of the step time.
    pub share: f64,
    pub evidence: BTreeMap<String, serde_json::Value>,
    /// What to do about it; empty for a cause of 0 s (or less), which needs nothing done.
    pub fix: String,
    /// The late rank (readiness skew).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// Per-rank view of the step.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RankTime {
    pub rank: u32,
    pub host: String,
    /// Seconds this rank arrived after the first rank, summed over the step's collectives.
    pub late_seconds: f64,
    /// Seconds this rank waited inside collectives for the last rank to arrive.
    pub wait_seconds: f64,
    /// Seconds inside collective calls.
    pub inside_seconds: f64,
}

/// The attribution of one step.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Attribution {
    pub step: u64,
    pub begin: f64,
    pub end: f64,
    pub seconds: f64,
    /// All eight causes, largest first; `seconds` sum to the step time.
    pub causes: Vec<Cause>,
    pub ranks: Vec<RankTime>,
    pub collectives: usize,
    /// Data was missing (ranks not seen, probe events dropped): numbers are a lower bound.
    pub incomplete: bool,
    pub notes: Vec<String>,
    /// Where the arrivals' times came from: `gpu` (NCCL profiler plugin), `host_completion`,
    /// `host_enqueue` (asynchronous NCCL without the plugin: no readiness skew computed),
    /// `unknown`, or `mixed (gpu 6, host_enqueue 2)`. Empty without collectives.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timing: String,
    /// Ranks that disagree at one of this step's sequence numbers (`timeline::desync`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub desyncs: Vec<crate::timeline::desync::Desync>,
    /// Some of the step's collectives were launched by CUDA-graph replay: how many, and what
    /// is and is not timed for them ([`graph`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_replay: Option<graph::GraphReplay>,
}

impl Attribution {
    pub fn cause(&self, k: CauseKind) -> f64 {
        self.causes.iter().find(|c| c.kind == k).map(|c| c.seconds).unwrap_or(0.0)
    }
    /// The largest problem cause, if any is above `threshold` seconds.
    pub fn top_problem(&self, threshold: f64) -> Option<&Cause> {
        self.causes.iter().filter(|c| c.kind.is_problem() && c.seconds > threshold).max_by(|a, b| a.seconds.total_cmp(&b.seconds))
    }
}

/// Inputs for one step.
pub struct StepData<'a> {
    pub step: &'a Step,
    /// The step's collectives (joined, any order).
    pub collectives: &'a [&'a Collective],
    /// Per-NIC deltas for each collective's transfer interval (same order as `collectives`);
    /// empty when no counters cover it.
    pub windows: &'a [Vec<NicWindow>],
    /// Completed network requests sampled during the step (in-flight analysis).
    pub net: &'a [NetSample],
    /// Per collective (same order), its measured same-host transfers ([`measure_same_host`]);
    /// empty, or `None` for a collective, when not measured.
    pub same_host: &'a [Option<SameHost>],
    /// Probe events were dropped during the step.
    pub dropped_events: bool,
}

fn ev(pairs: &[(&str, serde_json::Value)]) -> BTreeMap<String, serde_json::Value> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// Per-step accumulators of the causes' parts.
struct Acc<'a> {
    s: [f64; CauseKind::ALL.len()],
    cover: skew::Cover,
    ranks: skew::RankAcc,
    notes: Vec<String>,
    incomplete: bool,
    rails: rails::Tally<'a>,
    cong: congestion::Congestion,
    in_flight: in_flight::Charge,
    latency: Option<(f64, bool)>,
    payload: f64,
    intra_host: usize,
    same_host: intra_host::Tally,
    /// NICs whose job's own bytes were not measured (other traffic inferred there).
    own_unmeasured: std::collections::BTreeSet<String>,
}

impl<'a> Acc<'a> {
    /// Adds collective `i` of the step: its skew, then its transfer split into ideal and the
    /// excess causes, each bounded by what is left.
    fn collective(&mut self, d: &StepData<'a>, i: usize, p: &Params) {
        let c = d.collectives[i];
        if !c.complete() {
            self.incomplete = true;
        }
        let span = skew::add(&mut self.cover, &mut self.ranks, c, d.step.begin, d.step.end);
        self.s[CauseKind::ReadinessSkew as usize] += span.skew;
        self.payload += c.bytes.unwrap_or(0) as f64;
        let transfer = span.transfer;
        let r = match rails::select(c, d.windows.get(i), p) {
            Ok(r) if transfer > 0.0 => r,
            Err(rails::NoRails::RateUnknown) if transfer > 0.0 => {
                self.notes.push(format!("{} seq {}: NIC rate unknown; transfer counted as ideal", c.op, c.seq));
                self.s[CauseKind::IdealComm as usize] += transfer;
                return;
            }
            _ => {
                // No NIC carried this collective's bytes (one host, or no NIC moved anything):
                // its measured transfer is the ideal we can state.
                self.intra_host += (transfer > 0.0) as usize;
                self.s[CauseKind::IdealComm as usize] += transfer;
                return;
            }
        };
        let (rate, frac) = (r.rate, span.frac);
        // The job's own bytes per rail where measured: rails and the ideal time are the job's
        // bytes only, other traffic on the links it used is congestion.
        let own = rails::own_bytes(c, &r.wins);
        if own.is_none() {
            self.own_unmeasured.extend(r.wins.iter().filter(|w| w.own_tx.is_none() || w.opaque_tx_bytes > 0.0).map(|w| w.nic.name.clone()));
        }
        let (sum_tx, max_tx) = self.rails.add(&r.wins, own.as_deref());
        let n = r.wins.len().max(1) as f64;
        let expected = |h: &str| congestion::expected_cross_host_bytes(c, &[h]);
        let (c_last, c_exit) = (c.last_arrival(), c.last_exit());
        let cg = congestion::Congestion::from_windows(&r.wins, rate, own.as_deref(), c_exit - c_last, &expected, p);
        let (ours, max_ours) = if own.is_some() {
            (sum_tx, max_tx)
        } else {
            // Other traffic that queued ahead of ours is congestion: it is not part of the
            // ideal time of *our* bytes (counting it in both would leave congestion no room).
            let other = if cg.other_traffic_seconds > 0.0 { cg.other_traffic_all_hosts_bytes.min(sum_tx) } else { 0.0 };
            let ours = sum_tx - other;
            (ours, if sum_tx > 0.0 { max_tx * ours / sum_tx } else { 0.0 })
        };
        let (lat, measured) = transport::round_latency(&r.wins, &transport::Requests { net: d.net, t0: c_last, t1: c_exit, rate }, p.alpha);
        self.latency = Some((lat, measured || self.latency.is_some_and(|l| l.1)));
        let ideal = frac * ideal::seconds(c, ours / n, rate, lat);
        self.s[CauseKind::IdealComm as usize] += ideal;
        let mut left = transfer - ideal;
        let cong = (frac * cg.seconds).min(left.max(0.0));
        left -= cong;
        self.cong.merge(&if frac < 1.0 { cg.scaled(frac) } else { cg });
        self.s[CauseKind::Congestion as usize] += cong;
        let rail = (frac * rails::imbalance_seconds(max_ours, ours, n, rate)).max(0.0).min(left.max(0.0));
        left -= rail;
        self.s[CauseKind::RailImbalance as usize] += rail;
        let t = in_flight::Transfer {
            coll: c,
            net: d.net,
            wins: &r.wins,
            t0: c_last,
            t1: c_exit,
            span: span.full,
            rate,
            bytes: max_ours.max(c.bytes.unwrap_or(0) as f64),
            frac,
            congestion: cong,
        };
        let extra = self.in_flight.add(&t, left);
        left -= extra;
        self.s[CauseKind::InFlightLimit as usize] += extra;
        // The local phases last: the NICs' causes come from their bytes and take precedence
        // (a flat ring's local hops run beside its NIC hop, not before or after it).
        left = self.same_host(d, i, frac, left);
        self.s[CauseKind::Unexplained as usize] += left;
    }
}

impl Acc<'_> {
    /// Charges collective `i`'s measured local phases (§1.14) out of `left`; what is left.
    fn same_host(&mut self, d: &StepData<'_>, i: usize, frac: f64, left: f64) -> f64 {
        let Some(m) = d.same_host.get(i).and_then(Option::as_ref) else {
            // Looked for (the pipeline measures every collective) and not seen.
            if !d.same_host.is_empty() {
                self.same_host.unmeasured += intra_host::shares_a_host(d.collectives[i]) as usize;
            }
            return left;
        };
        self.same_host.add(m, frac);
        let local = (frac * m.seconds).min(left.max(0.0));
        self.s[CauseKind::IntraHost as usize] += local;
        left - local
    }
}

/// Attributes one step.
pub fn attribute(d: &StepData<'_>, p: &Params) -> Attribution {
    let (t0, t1) = (d.step.begin, d.step.end);
    let total = d.step.duration();
    let mut order: Vec<usize> = (0..d.collectives.len()).collect();
    let first: Vec<f64> = d.collectives.iter().map(|c| c.first_arrival()).collect();
    order.sort_by(|&a, &b| first[a].total_cmp(&first[b]));
    let mut acc = Acc {
        s: [0.0; CauseKind::ALL.len()],
        cover: Default::default(),
        ranks: Default::default(),
        notes: Vec::new(),
        incomplete: d.dropped_events,
        rails: Default::default(),
        cong: Default::default(),
        in_flight: Default::default(),
        latency: None,
        payload: 0.0,
        intra_host: 0,
        same_host: Default::default(),
        own_unmeasured: Default::default(),
    };
    if d.dropped_events {
        acc.notes.push("incomplete data: probe events were dropped during this step (the event ring was full; see stepwise_probe_drops_total)".to_string());
    }
    for &i in &order {
        acc.collective(d, i, p);
    }
    let comm_span: f64 = acc.cover.spans.iter().map(|(a, b)| b - a).sum();
    acc.s[CauseKind::Compute as usize] = total - comm_span;
    if acc.intra_host > 0 {
        acc.notes
            .push(format!("{} collective(s) moved no bytes over a NIC (same host): their transfer time is counted as ideal communication", acc.intra_host));
    }
    if !acc.own_unmeasured.is_empty() {
        let nics: Vec<&str> = acc.own_unmeasured.iter().map(String::as_str).collect();
        acc.notes.push(format!(
            "the job's own bytes were not measured on {} (RDMA, or no TCP dump of its connections): other traffic there is inferred from the bytes the collectives should have sent",
            nics.join(", ")
        ));
    }
    if acc.same_host.unmeasured > 0 {
        acc.notes.push(format!(
            "{} collective(s) with ranks sharing a host moved no bytes the agent sees between them (no loopback TCP of the job: shared memory, NVLink and PCIe are invisible to it), so their local phases stay unexplained",
            acc.same_host.unmeasured
        ));
    }
    let ranks = std::mem::take(&mut acc.ranks).into_vec();
    let mut causes = causes(&acc, &ranks, order.len(), total);
    if let (Some(b), Some(c)) = (busbw::of(d.collectives), causes.iter_mut().find(|c| c.kind == CauseKind::IdealComm)) {
        c.evidence.insert("algbw_bytes_per_second".into(), b.algbw.into());
        c.evidence.insert("busbw_bytes_per_second".into(), b.busbw.into());
    }
    skew::timing_evidence(d.collectives, &mut causes, &mut acc.notes);
    let timing = crate::timeline::join::timing_summary(d.collectives);
    let graph_replay = graph::of(d.collectives);
    if let Some(g) = &graph_replay {
        acc.notes.push(graph::note(g));
    }
    Attribution {
        step: d.step.id,
        begin: t0,
        end: t1,
        seconds: total,
        causes,
        ranks,
        collectives: order.len(),
        incomplete: acc.incomplete,
        notes: acc.notes,
        timing,
        desyncs: Vec::new(),
        graph_replay,
    }
}

/// The eight causes with their evidence and fixes, largest first.
fn causes(acc: &Acc<'_>, ranks: &[RankTime], n_colls: usize, total: f64) -> Vec<Cause> {
    let (late, skew_ev) = skew::late_rank(ranks);
    let nic_tx = acc.rails.per_nic();
    let (nics_ev, rail_ev) = rails::evidence(&nic_tx, acc.s[CauseKind::RailImbalance as usize]);
    let mut causes: Vec<Cause> = CauseKind::ALL
        .iter()
        .map(|&k| {
            let secs = acc.s[k as usize];
            let evidence = match k {
                CauseKind::Compute => ev(&[("outside_collectives_seconds", secs.into())]),
                CauseKind::IdealComm => {
                    let mut e = ev(&[("collectives", n_colls.into()), ("payload_bytes", acc.payload.into()), ("nics", nics_ev.clone().into())]);
                    if let Some((lat, measured)) = acc.latency {
                        e.insert("round_latency_seconds".into(), lat.into());
                        e.insert("latency_measured".into(), measured.into());
                    }
                    e
                }
                CauseKind::IntraHost => acc.same_host.evidence(),
                CauseKind::ReadinessSkew => skew_ev.clone(),
                CauseKind::RailImbalance => rail_ev.clone(),
                CauseKind::Congestion => acc.cong.to_evidence(),
                CauseKind::InFlightLimit => acc.in_flight.evidence(),
                CauseKind::Unexplained => ev(&[("note", "time the models do not explain; large values are themselves a finding".into())]),
            };
            Cause {
                kind: k,
                seconds: secs,
                share: if total > 0.0 { secs / total } else { 0.0 },
                // A cause of 0 s needs no fix (its evidence would only fill placeholders).
                fix: if secs > 0.0 { fix_for(k, &evidence, late.as_ref()) } else { String::new() },
                evidence,
                rank: if k == CauseKind::ReadinessSkew { late.as_ref().map(|r| r.rank) } else { None },
            }
        })
        .collect();
    causes.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    causes
}

#[cfg(test)]
mod intra_host_tests;
#[cfg(test)]
mod own_tests;
#[cfg(test)]
mod tests;

/// What one host's agent sees of a multi-host job: its own ranks only, idle rails, a
/// management NIC, other jobs' bytes on a shared link.
#[cfg(test)]
mod per_host_view_tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::timeline::{join::Arrival, windows::NicInfo, Collective, NicWindow, Step, StepSource};

    fn step(begin: f64, end: f64) -> Step {
        Step { id: 1, begin, end, source: StepSource::Markers, ranks: BTreeMap::new() }
    }

    /// A collective of `nranks` of which only `seen` ranks (all on host "a") arrived.
    fn partial(nranks: u32, seen: &[u32], bytes: u64, t0: f64, t1: f64) -> Collective {
        Collective {
            comm: "c".into(),
            seq: 0,
            op: "all_reduce".into(),
            library: "nccl".into(),
            bytes: Some(bytes),
            nranks: Some(nranks),
            arrivals: seen
                .iter()
                .map(|&rank| Arrival { rank, host: "a".into(), pid: rank, enter: t0, exit: t1, aborted: false, clock: Default::default() })
                .collect(),
        }
    }

    fn nic(name: &str, tx: f64, rate: f64) -> NicWindow {
        NicWindow {
            nic: NicInfo { name: name.into(), host: Some("a".into()), rail: None, rate_bytes_per_second: Some(rate) },
            tx_bytes: tx,
            ..Default::default()
        }
    }

    fn sum(a: &Attribution) -> f64 {
        a.causes.iter().map(|c| c.seconds).sum()
    }

    #[test]
    fn idle_rails_of_the_same_rate_count_in_the_balanced_bound_a_management_nic_does_not() {
        // Flat ring, 8 ranks on 2 hosts: host a's 4 ranks send 1.75 × 1 MB over rail0 only;
        // rails 1–3 idle; a 10 GB/s management NIC carries nothing.
        let c = partial(8, &[0, 1, 2, 3], 1_000_000, 0.0, 1.75);
        let s = step(0.0, 1.75);
        let wins = vec![vec![nic("rail0", 1.75e6, 1e6), nic("rail1", 0.0, 1e6), nic("rail2", 100.0, 1e6), nic("rail3", 0.0, 1e6), nic("mgmt0", 2000.0, 10e9)]];
        let cs = [&c];
        let a = attribute(&StepData { step: &s, collectives: &cs, windows: &wins, net: &[], same_host: &[], dropped_events: false }, &Params::default());
        // Balanced over the 4 rails: 1.75e6/4 B at 1 MB/s = 0.4375 s; the rest is imbalance.
        assert!((a.cause(CauseKind::IdealComm) - 0.4375).abs() < 1e-3, "{:?}", a.causes);
        assert!((a.cause(CauseKind::RailImbalance) - 1.3125).abs() < 1e-3, "{:?}", a.causes);
        assert!((sum(&a) - 1.75).abs() < 1e-12);
        let rail = a.causes.iter().find(|c| c.kind == CauseKind::RailImbalance).expect("rail");
        let balanced = rail.evidence.get("balanced_transfer_seconds").and_then(|v| v.as_f64()).expect("balanced time");
        assert!((balanced - 0.437525).abs() < 1e-3, "{balanced}");
        let nics = rail.evidence.get("nics").and_then(|v| v.as_array()).expect("nics");
        assert_eq!(nics.len(), 4, "the management NIC is not a rail: {nics:?}");
    }

    #[test]
    fn another_jobs_bytes_queued_on_the_link_are_congestion_not_ideal() {
        // 2-rank job, one rank per host: this host's rank sends 1 MB; another job sent 1 MB
        // through the same 1 MB/s link at the same time and the queue backed up: 2 s.
        let c = partial(2, &[0], 1_000_000, 0.0, 2.0);
        let s = step(0.0, 2.0);
        let mut w = nic("uplink", 2e6, 1e6);
        w.max_backlog_bytes = 50_000.0;
        let cs = [&c];
        let a = attribute(
            &StepData { step: &s, collectives: &cs, windows: &[vec![w.clone()]], net: &[], same_host: &[], dropped_events: false },
            &Params::default(),
        );
        assert!((a.cause(CauseKind::IdealComm) - 1.0).abs() < 1e-3, "{:?}", a.causes);
        assert!((a.cause(CauseKind::Congestion) - 1.0).abs() < 1e-3, "{:?}", a.causes);
        assert_eq!(a.top_problem(1e-3).map(|c| c.kind), Some(CauseKind::Congestion));
        assert!((sum(&a) - 2.0).abs() < 1e-12);
        // Alone on the link (its own bytes only): no congestion, even with a queue.
        let c = partial(2, &[0], 1_000_000, 0.0, 1.0);
        let s = step(0.0, 1.0);
        w.tx_bytes = 1e6;
        let cs = [&c];
        let a = attribute(&StepData { step: &s, collectives: &cs, windows: &[vec![w]], net: &[], same_host: &[], dropped_events: false }, &Params::default());
        assert!(a.cause(CauseKind::Congestion) < 1e-9, "{:?}", a.causes);
        assert!((a.cause(CauseKind::IdealComm) - 1.0).abs() < 1e-3);
    }

    #[test]
    fn a_collective_overlapping_an_earlier_one_is_charged_only_for_its_new_time() {
        // Two jobs' 1 MB collectives on one 1 MB/s link, in the same window: the first
        // (0–2 s) saw the other's bytes queued ahead (congestion); the second (0.01–2.01 s)
        // adds only its last 10 ms, not another full second of ideal time.
        let c1 = partial(2, &[0], 1_000_000, 0.0, 2.0);
        let mut c2 = partial(2, &[0], 1_000_000, 0.01, 2.01);
        c2.comm = "other".into();
        let s = step(0.0, 2.01);
        let mut w = nic("uplink", 2e6, 1e6);
        w.max_backlog_bytes = 50_000.0;
        let cs = [&c1, &c2];
        let wins = vec![vec![w.clone()], vec![w]];
        let a = attribute(&StepData { step: &s, collectives: &cs, windows: &wins, net: &[], same_host: &[], dropped_events: false }, &Params::default());
        assert!((sum(&a) - 2.01).abs() < 1e-12);
        assert!(a.cause(CauseKind::Unexplained).abs() < 0.02, "{:?}", a.causes);
        assert!((a.cause(CauseKind::Congestion) - 1.0).abs() < 0.02, "{:?}", a.causes);
        assert!((a.cause(CauseKind::IdealComm) - 1.0).abs() < 0.02, "{:?}", a.causes);
        // The evidence counts the other job's bytes once, not once per collective.
        let ev = &a.causes.iter().find(|c| c.kind == CauseKind::Congestion).expect("congestion").evidence;
        let other = ev.get("other_traffic_bytes").and_then(|v| v.as_f64()).expect("other traffic");
        assert!((other - 1e6).abs() < 0.02e6, "{other}");
    }

    #[test]
    fn a_job_on_one_host_gets_no_network_cause_from_nics_it_never_used() {
        // All 4 ranks of the communicator on host a (shared memory): the host's NIC carried
        // another job's 2 MB and was paused for half the transfer, which is not this step's.
        let c = partial(4, &[0, 1, 2, 3], 1_000_000, 0.0, 1.0);
        let s = step(0.0, 1.0);
        let mut w = nic("mlx5_3", 2e6, 4e6);
        w.pause_seconds = 0.5;
        w.max_backlog_bytes = 50_000.0;
        let cs = [&c];
        let a = attribute(
            &StepData { step: &s, collectives: &cs, windows: &[vec![w.clone()]], net: &[], same_host: &[], dropped_events: false },
            &Params::default(),
        );
        for k in [CauseKind::Congestion, CauseKind::RailImbalance, CauseKind::InFlightLimit, CauseKind::Unexplained] {
            assert_eq!(a.cause(k), 0.0, "{k:?}: {:?}", a.causes);
        }
        assert!((a.cause(CauseKind::IdealComm) - 1.0).abs() < 1e-12, "{:?}", a.causes);
        assert!(a.notes.iter().any(|n| n.contains("moved no bytes over a NIC")), "{:?}", a.notes);
        // The same ranks as half of an 8-rank communicator: the others are elsewhere, so the
        // NIC carried part of it and its pause is congestion.
        let c = partial(8, &[0, 1, 2, 3], 1_000_000, 0.0, 1.0);
        let cs = [&c];
        let a = attribute(&StepData { step: &s, collectives: &cs, windows: &[vec![w]], net: &[], same_host: &[], dropped_events: false }, &Params::default());
        assert!(a.cause(CauseKind::Congestion) > 0.1, "{:?}", a.causes);
    }

    #[test]
    fn expected_bytes_from_a_partial_view_place_unseen_ranks_elsewhere() {
        // 8-rank ring, this host has ranks 0–3: only edge 3→4 leaves it, 2·7/8·M bytes.
        let c = partial(8, &[0, 1, 2, 3], 1000, 0.0, 1.0);
        assert_eq!(congestion::expected_cross_host_bytes(&c, &["a"]), Some(1750.0));
        // No arrival on these hosts, or a rank outside 0..p: unknown.
        assert_eq!(congestion::expected_cross_host_bytes(&c, &["b"]), None);
        let mut odd = c.clone();
        odd.arrivals[0].rank = u32::MAX;
        assert_eq!(congestion::expected_cross_host_bytes(&odd, &["a"]), None);
    }
}
