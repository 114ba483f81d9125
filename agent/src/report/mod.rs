//! Renderers of attributed steps: a text table for terminals ([`text`]), JSON for scripts
//! ([`json`]) and a self-contained HTML page ([`html`]). Shared by `agent diagnose` and the
//! daemon. A [`Report`] holds everything they show; renderers only format it.

pub mod hang;
pub mod html;
pub mod json;
pub mod ras;
pub mod text;
pub mod timeline;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    attribution::{Attribution, Cause, CauseKind},
    timeline::Collective,
};

/// A peer that did not answer (`agent diagnose --peers`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PeerFailure {
    pub peer: String,
    pub error: String,
}

/// Which peers answered (cluster mode; empty in local mode).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Peers {
    pub answered: Vec<String>,
    pub failed: Vec<PeerFailure>,
}

/// Readiness skew measured two ways (docs/architecture.md "Cluster scale"): from wall clocks
/// (last − first arrival, only as good as the hosts' clock error) and clock-free, from the
/// time each rank spent inside the blocking collective: every rank leaves together, so the
/// rank that arrived last spent the *shortest* time inside, and max − min of the time inside
/// is the skew without comparing two hosts' clocks.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Skew {
    /// Readiness skew attributed from wall-clock arrivals.
    pub wall_seconds: f64,
    /// Clock-free estimate: Σ over collectives of max(inside) − min(inside).
    pub clock_free_seconds: Option<f64>,
    /// The rank with the least time inside (the late one), by the clock-free estimate.
    pub clock_free_late_rank: Option<u32>,
}

impl Skew {
    /// Clock-free estimate from per-rank totals (when only the attribution is at hand,
    /// e.g. from the store): exact when the same rank is the late one in every collective.
    /// None when a collective was timed at the host enqueue: the time inside such a call is
    /// the enqueue, and the rank that spent the least there is no straggler.
    pub fn from_ranks(a: &Attribution) -> Skew {
        if a.timing.contains("host_enqueue") {
            return Skew { wall_seconds: a.cause(CauseKind::ReadinessSkew), clock_free_seconds: None, clock_free_late_rank: None };
        }
        let inside = a.ranks.iter().map(|r| (r.rank, r.inside_seconds));
        let min = inside.clone().min_by(|x, y| x.1.total_cmp(&y.1));
        let max = inside.map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let (cf, late) = match min {
            Some((r, lo)) if a.ranks.len() >= 2 && max > lo => (Some(max - lo), Some(r)),
            Some(_) if a.ranks.len() >= 2 => (Some(0.0), None),
            _ => (None, None),
        };
        Skew { wall_seconds: a.cause(CauseKind::ReadinessSkew), clock_free_seconds: cf, clock_free_late_rank: late }
    }
}

/// Bytes one NIC sent during the step's collectives.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NicBytes {
    /// `host/netdev` in cluster mode.
    pub nic: String,
    pub tx_bytes: f64,
    /// Fraction of all NICs' bytes.
    pub share: f64,
    pub rate_bytes_per_second: Option<f64>,
}

/// Per-NIC bytes of a step, from the evidence the attribution keeps (`ideal_comm.nics`).
pub fn nics_of(a: &Attribution) -> Vec<NicBytes> {
    let list =
        a.causes.iter().find(|c| c.kind == CauseKind::IdealComm).and_then(|c| c.evidence.get("nics")).and_then(|v| v.as_array()).cloned().unwrap_or_default();
    let mut out: Vec<NicBytes> = list
        .iter()
        .filter_map(|v| {
            Some(NicBytes {
                nic: v.get("nic")?.as_str()?.to_string(),
                tx_bytes: v.get("tx_bytes").and_then(|x| x.as_f64()).unwrap_or(0.0),
                share: 0.0,
                rate_bytes_per_second: v.get("rate_bytes_per_second").and_then(|x| x.as_f64()),
            })
        })
        .collect();
    let total: f64 = out.iter().map(|n| n.tx_bytes).sum();
    for n in &mut out {
        n.share = if total > 0.0 { n.tx_bytes / total } else { 0.0 };
    }
    out
}

/// One attributed step with what the renderers add around it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    pub attribution: Attribution,
    pub skew: Skew,
    pub nics: Vec<NicBytes>,
    /// The step's collectives with every rank's arrival (the HTML timeline); empty when the
    /// source does not carry them (`--agent`).
    pub collectives: Vec<Collective>,
}

impl StepReport {
    /// Skew and NICs derived from the attribution alone. A cause of 0 s carries no fix, also
    /// in a step attributed before that rule (a history store, an older peer).
    pub fn from_attribution(mut a: Attribution) -> StepReport {
        for c in a.causes.iter_mut().filter(|c| c.seconds <= 0.0) {
            c.fix.clear();
        }
        StepReport { skew: Skew::from_ranks(&a), nics: nics_of(&a), attribution: a, collectives: Vec::new() }
    }

    /// The same report with the step's collectives (from the store or the peers).
    pub fn with_collectives(mut self, c: Vec<Collective>) -> StepReport {
        self.collectives = c;
        self
    }

    /// Problem causes above `threshold` seconds, largest first.
    pub fn ranked(&self, threshold: f64) -> Vec<&Cause> {
        let mut v: Vec<&Cause> = self.attribution.causes.iter().filter(|c| c.kind.is_problem() && c.seconds > threshold).collect();
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        v
    }
}

/// Everything `agent diagnose` shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Where the steps came from ("store /var/lib/stepwise/agent.db", "cluster of 3 peers").
    pub source: String,
    pub steps: Vec<StepReport>,
    pub peers: Peers,
    /// Largest clock error bound of the hosts whose arrivals were compared (cluster mode);
    /// `None` when every arrival came from one host's clock.
    pub clock_error_seconds: Option<f64>,
    /// Cluster mode: each host's clock offset against the reference host, from the
    /// collectives (`timeline::clocks`).
    pub clocks: Option<crate::timeline::clocks::Clocks>,
    /// Causes at or below this many seconds are not listed as findings.
    pub threshold_seconds: f64,
    pub notes: Vec<String>,
}

/// A duration with one decimal in the unit a human reads it in: `16.0 s`, `250.0 ms`,
/// `40.0 µs`, `2.5 ns`. Zero, which has no magnitude, is `0.0 ms`, the unit most of a step
/// report is in. The unit is chosen after rounding (0.99996 s is `1.0 s`, never `1000.0 ms`).
pub fn duration(seconds: f64) -> String {
    const UNITS: [(f64, &str); 4] = [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")];
    let a = seconds.abs();
    if a == 0.0 {
        return "0.0 ms".into();
    }
    if !a.is_finite() {
        return format!("{seconds} s");
    }
    // 999.95 of the smaller unit prints as 1000.0: that is already the larger unit.
    let (k, unit) = UNITS.into_iter().find(|(k, _)| a >= k * 0.999_95).unwrap_or(UNITS[UNITS.len() - 1]);
    format!("{:.1} {unit}", seconds / k)
}

/// Percent with one decimal.
pub fn pct(fraction: f64) -> String {
    format!("{:.1} %", fraction * 100.0)
}

/// Bytes with a binary unit (KiB/MiB/GiB), as the rest of the CLI prints them.
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b;
    let mut u = 0;
    while x.abs() >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{x:.0} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

/// Evidence as (JSON key, value for humans) pairs: seconds in ms, bytes with units, rates in
/// GB/s, shares in %; lists (the per-NIC table) are left to their own section.
pub fn evidence_pairs(e: &BTreeMap<String, serde_json::Value>) -> Vec<(String, String)> {
    e.iter()
        .filter_map(|(k, v)| {
            let shown = match v {
                serde_json::Value::Number(n) => {
                    let x = n.as_f64()?;
                    if k.ends_with("_bytes_per_second") {
                        format!("{:.2} GB/s", x / 1e9)
                    } else if k.ends_with("_seconds") {
                        duration(x)
                    } else if k.ends_with("_bytes") {
                        bytes(x)
                    } else if k.ends_with("share") {
                        pct(x)
                    } else if x.fract() == 0.0 && x.abs() < 1e15 {
                        format!("{x:.0}")
                    } else {
                        format!("{x:.3}")
                    }
                }
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            Some((k.clone(), shown))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! A realistic attributed step: 8 ranks on two hosts, rank 5 on node-b 30 ms late, one
    //! busy NIC.
    use std::collections::BTreeMap;

    use super::*;
    use crate::attribution::{fix_for, RankTime};

    pub fn attribution() -> Attribution {
        let total = 0.2;
        let parts = [
            (CauseKind::Compute, 0.150),
            (CauseKind::ReadinessSkew, 0.030),
            (CauseKind::IdealComm, 0.012),
            (CauseKind::RailImbalance, 0.006),
            (CauseKind::Unexplained, 0.002),
            (CauseKind::Congestion, 0.0),
            (CauseKind::InFlightLimit, 0.0),
            (CauseKind::IntraHost, 0.0),
        ];
        let late = RankTime { rank: 5, host: "node-b".into(), late_seconds: 0.030, wait_seconds: 0.0, inside_seconds: 0.020 };
        let nics = serde_json::json!([
            {"nic": "node-a/eth0", "tx_bytes": 300e6, "rate_bytes_per_second": 12.5e9},
            {"nic": "node-a/eth1", "tx_bytes": 100e6, "rate_bytes_per_second": 12.5e9},
        ]);
        let causes = parts
            .iter()
            .map(|&(k, s)| {
                let mut evidence = BTreeMap::new();
                match k {
                    CauseKind::ReadinessSkew => {
                        evidence.insert("late_rank".into(), 5.into());
                        evidence.insert("late_host".into(), "node-b".into());
                        evidence.insert("late_rank_seconds".into(), 0.030.into());
                    }
                    CauseKind::IdealComm => {
                        evidence.insert("nics".into(), nics.clone());
                        evidence.insert("payload_bytes".into(), (64.0 * 1024.0 * 1024.0).into());
                    }
                    CauseKind::RailImbalance => {
                        evidence.insert("busiest_nic".into(), "node-a/eth0".into());
                        evidence.insert("busiest_share".into(), 0.75.into());
                    }
                    _ => {}
                }
                Cause {
                    kind: k,
                    seconds: s,
                    share: s / total,
                    fix: fix_for(k, &evidence, Some(&late)),
                    evidence,
                    rank: (k == CauseKind::ReadinessSkew).then_some(5),
                }
            })
            .collect();
        let ranks = (0..8)
            .map(|r| {
                if r == 5 {
                    late.clone()
                } else {
                    RankTime { rank: r, host: if r < 4 { "node-a" } else { "node-b" }.into(), late_seconds: 0.0, wait_seconds: 0.030, inside_seconds: 0.050 }
                }
            })
            .collect();
        Attribution {
            step: 42,
            begin: 1_764_500_000.0,
            end: 1_764_500_000.2,
            seconds: total,
            causes,
            ranks,
            collectives: 2,
            incomplete: false,
            notes: vec![],
            timing: String::new(),
            desyncs: Vec::new(),
            graph_replay: None,
        }
    }

    pub fn report() -> Report {
        let a = attribution();
        Report {
            source: "cluster of 3 peers".into(),
            steps: vec![StepReport::from_attribution(a)],
            peers: Peers {
                answered: vec!["10.0.0.1:9477".into(), "10.0.0.2:9477".into()],
                failed: vec![PeerFailure { peer: "10.0.0.3:9477".into(), error: "timed out after 5s".into() }],
            },
            clock_error_seconds: Some(0.002),
            clocks: None,
            threshold_seconds: 0.001,
            notes: vec!["period steps".into()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nics_and_clock_free_skew_come_from_the_attribution() {
        let r = StepReport::from_attribution(fixtures::attribution());
        assert_eq!(r.nics.len(), 2);
        assert_eq!(r.nics[0].nic, "node-a/eth0");
        assert!((r.nics[0].share - 0.75).abs() < 1e-12);
        assert!((r.skew.wall_seconds - 0.030).abs() < 1e-12);
        assert!((r.skew.clock_free_seconds.unwrap_or(0.0) - 0.030).abs() < 1e-12);
        assert_eq!(r.skew.clock_free_late_rank, Some(5));
        let ranked: Vec<CauseKind> = r.ranked(0.001).iter().map(|c| c.kind).collect();
        assert_eq!(ranked, vec![CauseKind::ReadinessSkew, CauseKind::RailImbalance, CauseKind::Unexplained]);
        // Timed at the host enqueue (real NCCL without the plugin, seen on a GPU): the time
        // inside the call is the enqueue, so there is no clock-free estimate and no late rank.
        for timing in ["host_enqueue", "mixed (gpu 6, host_enqueue 2)"] {
            let mut a = fixtures::attribution();
            a.timing = timing.into();
            let r = StepReport::from_attribution(a);
            assert_eq!((r.skew.clock_free_seconds, r.skew.clock_free_late_rank), (None, None), "{timing}");
        }
    }

    #[test]
    fn a_stored_cause_of_0_s_loses_its_placeholder_fix() {
        // Steps attributed before 0 s causes lost their fix (a store, an older peer).
        let mut a = fixtures::attribution();
        let zero = a.causes.iter().position(|c| c.seconds == 0.0).expect("a cause of 0 s");
        a.causes[zero].fix = "? carried 0 % of the bytes".into();
        let r = StepReport::from_attribution(a);
        assert_eq!(r.attribution.causes[zero].fix, "");
        assert!(r.attribution.causes.iter().filter(|c| c.seconds > 0.0).all(|c| !c.fix.is_empty()));
    }

    #[test]
    fn durations_take_the_unit_a_human_reads() {
        assert_eq!(duration(16.0), "16.0 s", "a clock error of 16 s, not 16000.0 ms");
        assert_eq!(duration(0.25), "250.0 ms");
        assert_eq!(duration(40e-6), "40.0 µs");
        assert_eq!(duration(2.5e-9), "2.5 ns");
        assert_eq!(duration(0.0), "0.0 ms");
        assert_eq!(duration(-0.030), "-30.0 ms");
        // The unit is the one the rounded value has: never "1000.0 ms".
        assert_eq!(duration(0.999_96), "1.0 s");
        assert_eq!(duration(0.999_9), "999.9 ms");
        assert_eq!(duration(999.96e-6), "1.0 ms");
        assert_eq!(duration(3600.0), "3600.0 s");
        assert_eq!(duration(f64::INFINITY), "inf s");
    }

    #[test]
    fn formats() {
        assert_eq!(duration(0.0304), "30.4 ms");
        assert_eq!(pct(0.152), "15.2 %");
        assert_eq!(bytes(64.0 * 1024.0 * 1024.0), "64.0 MiB");
        assert_eq!(bytes(12.0), "12 B");
        let e: BTreeMap<String, serde_json::Value> = [
            ("late_rank_seconds", serde_json::json!(0.03)),
            ("busiest_share", serde_json::json!(0.75)),
            ("nics", serde_json::json!([])),
            ("path_bytes_per_second", serde_json::json!(12.5e9)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let p = evidence_pairs(&e);
        assert!(p.contains(&("late_rank_seconds".into(), "30.0 ms".into())), "{p:?}");
        assert!(p.contains(&("busiest_share".into(), "75.0 %".into())), "{p:?}");
        assert!(p.contains(&("path_bytes_per_second".into(), "12.50 GB/s".into())), "{p:?}");
        assert!(!p.iter().any(|(k, _)| k == "nics"));
    }
}
