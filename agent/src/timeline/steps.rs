//! Step windows: from explicit markers, or from the period of a communicator's `(op, bytes)`
//! sequence when a job sends no markers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{join::Collective, markers::{Marker, Phase}};

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StepSource {
    Markers,
    Period,
}

/// One training step of the job (all ranks).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Step {
    pub id: u64,
    /// Earliest begin over ranks (wall seconds).
    pub begin: f64,
    /// Latest end over ranks.
    pub end: f64,
    pub source: StepSource,
    /// Per-rank (begin, end), when markers give them.
    pub ranks: BTreeMap<u32, (f64, f64)>,
}

impl Step {
    pub fn duration(&self) -> f64 {
        (self.end - self.begin).max(0.0)
    }
    /// Collectives that belong to this step: first arrival inside the window.
    pub fn collectives<'a>(&self, all: &'a [Collective]) -> Vec<&'a Collective> {
        all.iter().filter(|c| c.first_arrival() >= self.begin - 1e-6 && c.first_arrival() < self.end).collect()
    }
}

/// Steps from markers: a step exists once at least one rank sent both begin and end; its
/// window spans every rank's markers.
pub fn steps_from_markers(markers: &[Marker]) -> Vec<Step> {
    type BeginEnd = (Option<f64>, Option<f64>);
    let mut per: BTreeMap<u64, BTreeMap<u32, BeginEnd>> = BTreeMap::new();
    for m in markers {
        let Some(t) = m.time else { continue };
        let e = per.entry(m.step).or_default().entry(m.rank).or_default();
        match m.phase {
            Phase::Begin => e.0 = Some(e.0.map_or(t, |x: f64| x.min(t))),
            Phase::End => e.1 = Some(e.1.map_or(t, |x: f64| x.max(t))),
        }
    }
    per.into_iter()
        .filter_map(|(id, ranks)| {
            let full: BTreeMap<u32, (f64, f64)> = ranks.into_iter().filter_map(|(r, (b, e))| Some((r, (b?, e?)))).filter(|(_, (b, e))| e >= b).collect();
            if full.is_empty() {
                return None;
            }
            let begin = full.values().map(|v| v.0).fold(f64::INFINITY, f64::min);
            let end = full.values().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max);
            Some(Step { id, begin, end, source: StepSource::Markers, ranks: full })
        })
        .collect()
}

/// Smallest period of a signature sequence, tolerant of a warm-up prefix and stray calls:
/// the period P (≤ n/3) for which at least 90 % of positions after the warm-up match the
/// position P later. Returns (warm-up length, period).
pub fn detect_period<T: PartialEq>(sig: &[T]) -> Option<(usize, usize)> {
    let n = sig.len();
    for p in 1..=n / 3 {
        for warm in 0..=(n / 4).min(16) {
            let span = n - warm;
            if span < 3 * p {
                break;
            }
            let pairs = span - p;
            let matches = (warm..n - p).filter(|&i| sig[i] == sig[i + p]).count();
            if matches * 10 >= pairs * 9 {
                // Start at the first clean repetition, so a stray warm-up call is not
                // folded into step 1.
                let start = (0..n.saturating_sub(2 * p)).find(|&i| sig[i..i + p] == sig[i + p..i + 2 * p]).unwrap_or(warm);
                return Some((start, p));
            }
        }
    }
    None
}

/// Steps from the period of one communicator's collectives (sorted by seq): step k spans from
/// the end of the previous period's last collective to the end of its own. The first group
/// only starts a step (its compute began before anything was observed).
pub fn steps_from_period(colls: &[&Collective]) -> Vec<Step> {
    let sig: Vec<(&str, Option<u64>)> = colls.iter().map(|c| (c.op.as_str(), c.bytes)).collect();
    let Some((warm, p)) = detect_period(&sig) else { return Vec::new() };
    let groups: Vec<&[&Collective]> = colls[warm..].chunks(p).filter(|g| g.len() == p).collect();
    let mut out = Vec::new();
    for k in 1..groups.len() {
        let begin = groups[k - 1].iter().map(|c| c.last_exit()).fold(f64::NEG_INFINITY, f64::max);
        let end = groups[k].iter().map(|c| c.last_exit()).fold(f64::NEG_INFINITY, f64::max);
        if end > begin {
            out.push(Step { id: k as u64, begin, end, source: StepSource::Period, ranks: BTreeMap::new() });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::join::Arrival;

    fn m(rank: u32, step: u64, phase: Phase, t: f64) -> Marker {
        Marker { rank, step, phase, time: Some(t), host: None }
    }

    #[test]
    fn marker_steps_span_all_ranks() {
        let ms = vec![m(0, 1, Phase::Begin, 10.0), m(1, 1, Phase::Begin, 10.01), m(0, 1, Phase::End, 10.5), m(1, 1, Phase::End, 10.52), m(0, 2, Phase::Begin, 10.6)];
        let s = steps_from_markers(&ms);
        assert_eq!(s.len(), 1, "step 2 has no end yet");
        assert_eq!((s[0].begin, s[0].end), (10.0, 10.52));
        assert_eq!(s[0].ranks.len(), 2);
        assert!((s[0].duration() - 0.52).abs() < 1e-12);
    }

    #[test]
    fn period_detection_tolerates_warmup_and_strays() {
        let seq = [9, 9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3];
        assert_eq!(detect_period(&seq), Some((2, 3)));
        let mut noisy: Vec<u32> = std::iter::repeat_n([1, 2], 20).flatten().collect();
        noisy[17] = 7;
        assert_eq!(detect_period(&noisy).map(|x| x.1), Some(2));
        assert_eq!(detect_period(&[1, 2, 3, 4, 5, 6, 7]), None);
    }

    fn coll(seq: u64, op: &str, t: f64) -> Collective {
        Collective {
            comm: "c".into(),
            seq,
            op: op.into(),
            library: "nccl".into(),
            bytes: Some(4),
            nranks: Some(1),
            arrivals: vec![Arrival { rank: 0, host: "h".into(), pid: 1, enter: t, exit: t + 0.01, aborted: false }],
        }
    }

    #[test]
    fn period_steps_end_at_each_groups_last_collective() {
        let cs: Vec<Collective> = (0..8u64).map(|i| coll(i, if i % 2 == 0 { "all_reduce" } else { "broadcast" }, i as f64)).collect();
        let refs: Vec<&Collective> = cs.iter().collect();
        let s = steps_from_period(&refs);
        assert_eq!(s.len(), 3);
        assert!((s[0].begin - 1.01).abs() < 1e-9 && (s[0].end - 3.01).abs() < 1e-9);
        assert_eq!(s[0].collectives(&cs).len(), 2);
    }
}
