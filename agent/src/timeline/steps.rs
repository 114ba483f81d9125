//! Step windows: from explicit markers, or from the period of a communicator's `(op, bytes)`
//! sequence when a job sends no markers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    join::Collective,
    markers::{Marker, Phase},
};

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
///
/// Step ids repeat across jobs (every job counts from 0 or 1) and the markers of the last
/// minutes are looked at together, so one id can have several *incarnations*: a rank's begin
/// after its end of the same id starts a new one, and ranks' (begin, end) spans that do not
/// overlap in time belong to different incarnations (the ranks of one step overlap: each ends
/// after the step's collectives, which need every rank to have begun). Each incarnation is
/// its own step — merging them would make one step span two jobs.
pub fn steps_from_markers(markers: &[Marker]) -> Vec<Step> {
    // (step, rank) → markers (time, is_begin)
    let mut per: BTreeMap<(u64, u32), Vec<(f64, bool)>> = BTreeMap::new();
    for m in markers {
        let Some(t) = m.time else { continue };
        per.entry((m.step, m.rank)).or_default().push((t, m.phase == Phase::Begin));
    }
    // step → every rank's (begin, end) spans
    let mut spans: BTreeMap<u64, Vec<(f64, f64, u32)>> = BTreeMap::new();
    for ((id, rank), mut ms) in per {
        ms.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut begin, mut end): (Option<f64>, Option<f64>) = (None, None);
        let out = spans.entry(id).or_default();
        for (t, is_begin) in ms {
            if is_begin {
                if let (Some(b), Some(e)) = (begin, end) {
                    out.push((b, e, rank));
                    end = None;
                    begin = Some(t);
                } else {
                    // A begin never ended (a job killed mid-step, restarted from a
                    // checkpoint with the same ids) is superseded by the next one.
                    begin = Some(t);
                }
            } else if begin.is_some() {
                end = Some(end.map_or(t, |x: f64| x.max(t)));
            }
        }
        if let (Some(b), Some(e)) = (begin, end) {
            out.push((b, e, rank));
        }
    }
    let mut steps = Vec::new();
    for (id, mut v) in spans {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cur: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        let mut cur_end = f64::NEG_INFINITY;
        for (b, e, rank) in v {
            if !cur.is_empty() && (b > cur_end || cur.contains_key(&rank)) {
                steps.push(marker_step(id, std::mem::take(&mut cur)));
                cur_end = f64::NEG_INFINITY;
            }
            cur.insert(rank, (b, e));
            cur_end = cur_end.max(e);
        }
        if !cur.is_empty() {
            steps.push(marker_step(id, cur));
        }
    }
    steps
}

fn marker_step(id: u64, ranks: BTreeMap<u32, (f64, f64)>) -> Step {
    let begin = ranks.values().map(|v| v.0).fold(f64::INFINITY, f64::min);
    let end = ranks.values().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max);
    Step { id, begin, end, source: StepSource::Markers, ranks }
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
        let ms =
            vec![m(0, 1, Phase::Begin, 10.0), m(1, 1, Phase::Begin, 10.01), m(0, 1, Phase::End, 10.5), m(1, 1, Phase::End, 10.52), m(0, 2, Phase::Begin, 10.6)];
        let s = steps_from_markers(&ms);
        assert_eq!(s.len(), 1, "step 2 has no end yet");
        assert_eq!((s[0].begin, s[0].end), (10.0, 10.52));
        assert_eq!(s[0].ranks.len(), 2);
        assert!((s[0].duration() - 0.52).abs() < 1e-12);
    }

    #[test]
    fn a_step_id_reused_by_a_later_job_is_a_new_step() {
        // Job A steps 1-2, then job B (same ranks, same ids) a few seconds later.
        let mut ms = Vec::new();
        for (t0, job) in [(10.0, 0.0), (20.0, 1.0)] {
            for step in 1..=2u64 {
                let b = t0 + step as f64;
                for rank in 0..2 {
                    ms.push(m(rank, step, Phase::Begin, b + 0.01 * rank as f64 + job * 0.001));
                    ms.push(m(rank, step, Phase::End, b + 0.5));
                }
            }
        }
        let s = steps_from_markers(&ms);
        let got: Vec<(u64, f64, f64, usize)> = s.iter().map(|s| (s.id, s.begin, s.end, s.ranks.len())).collect();
        assert_eq!(got, vec![(1, 11.0, 11.5, 2), (1, 21.001, 21.5, 2), (2, 12.0, 12.5, 2), (2, 22.001, 22.5, 2)]);
        // A rank's begin after its end of the same id starts a new incarnation even when the
        // spans touch; a begin that never ended (a killed job) is superseded by the next.
        let ms = vec![m(0, 5, Phase::Begin, 1.0), m(0, 5, Phase::Begin, 1.5), m(0, 5, Phase::End, 2.0), m(0, 5, Phase::Begin, 2.0), m(0, 5, Phase::End, 3.0)];
        let got: Vec<(f64, f64)> = steps_from_markers(&ms).iter().map(|s| (s.begin, s.end)).collect();
        assert_eq!(got, vec![(1.5, 2.0), (2.0, 3.0)]);
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
            arrivals: vec![Arrival { rank: 0, host: "h".into(), pid: 1, enter: t, exit: t + 0.01, aborted: false, clock: Default::default() }],
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
