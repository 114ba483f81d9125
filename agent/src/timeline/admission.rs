//! Marker admission control: what a flood of markers can cost is bounded before they are held.
//!
//! A flood of ~11 k markers/s over ranks 0..10⁶ made 43 089 steps and 402 MB of RSS in 10 s.
//! Each marker is admitted only if
//! - its rank is one of at most [`Limits::max_ranks`] ranks seen recently (idle ranks are
//!   forgotten after [`RANK_IDLE_SECONDS`]); a sending process (the marker socket's
//!   credentials) holds at most [`Limits::max_ranks_per_sender`] of them, so one flooding
//!   process cannot take every slot, and when the slots are full a new rank takes the place of
//!   one not yet established (fewer than [`ESTABLISHED_MARKERS`] markers) of the process
//!   holding the most — an established rank is never displaced;
//! - its rank is within its rate ([`Limits::rank_per_second`], a token bucket with a burst of
//!   twice that);
//! - it names a step already seen, or new steps are within their rate
//!   ([`Limits::new_steps_per_second`]): steps created from markers are bounded per second.
//!
//! What is refused is counted in `stepwise_markers_dropped_total{reason}` and dropped.

use crate::export::reference::RegisterSampled as _;
use std::collections::{HashMap, HashSet, VecDeque};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::Marker;

/// A rank not heard from for this long no longer counts against [`Limits::max_ranks`].
pub const RANK_IDLE_SECONDS: f64 = 60.0;
/// A rank that sent this many markers (two steps' begin and end) is established: it is never
/// displaced by new ranks.
pub const ESTABLISHED_MARKERS: u32 = 4;
/// Step ids remembered as seen (the newest).
const STEPS_REMEMBERED: usize = 8192;

/// The bounds; the defaults leave room for 1024 ranks each marking 100 steps/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub max_ranks: usize,
    /// Ranks one sending process may hold (markers without a known sender, POSTed over the
    /// API with its token, are not bounded by it).
    pub max_ranks_per_sender: usize,
    pub rank_per_second: f64,
    pub new_steps_per_second: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_ranks: 1024, max_ranks_per_sender: 256, rank_per_second: 200.0, new_steps_per_second: 200.0 }
    }
}

/// Why a marker was dropped (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooManyRanks,
    SenderRanks,
    RankRate,
    StepRate,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::TooManyRanks => "too_many_ranks",
            Refusal::SenderRanks => "sender_ranks",
            Refusal::RankRate => "rank_rate",
            Refusal::StepRate => "step_rate",
        }
    }
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// A token bucket: `rate` per second, at most `2 × rate` saved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    at: f64,
}

impl Bucket {
    pub(crate) fn full(rate: f64, now: f64) -> Bucket {
        Bucket { tokens: 2.0 * rate, at: now }
    }
    pub(crate) fn take(&mut self, rate: f64, now: f64) -> bool {
        // A clock that went back refills nothing.
        self.tokens = (self.tokens + rate * (now - self.at).max(0.0)).min(2.0 * rate);
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
struct Rank {
    bucket: Bucket,
    seen: f64,
    /// The sending process (`None`: unknown, the API).
    owner: Option<u32>,
    markers: u32,
}

/// The admission state of one engine's marker stream.
pub struct Admission {
    limits: Limits,
    ranks: HashMap<u32, Rank>,
    /// Ranks held per sending process.
    held: HashMap<Option<u32>, usize>,
    /// When idle ranks were last forgotten.
    forgot: Option<f64>,
    steps: HashSet<u64>,
    order: VecDeque<u64>,
    new_steps: Bucket,
    dropped: Family<ReasonLabel, Counter>,
    origin: std::time::Instant,
}

impl Admission {
    pub fn register(registry: &mut Registry, limits: Limits) -> Admission {
        let dropped = Family::<ReasonLabel, Counter>::default();
        registry.register_sampled(
            "stepwise_markers_dropped",
            "Markers refused by admission control (too many ranks, a rank's or new steps' rate)",
            dropped.clone(),
        );
        Admission {
            limits,
            ranks: HashMap::new(),
            held: HashMap::new(),
            forgot: None,
            steps: HashSet::new(),
            order: VecDeque::new(),
            new_steps: Bucket::full(limits.new_steps_per_second, 0.0),
            dropped,
            origin: std::time::Instant::now(),
        }
    }

    /// Admits `m` now (monotonic clock); a refusal is counted.
    pub fn admit(&mut self, m: &Marker) -> Result<(), Refusal> {
        let now = self.origin.elapsed().as_secs_f64();
        self.admit_at(m, now)
    }

    /// [`Admission::admit`] of a marker sent by process `sender` (`None`: unknown).
    pub fn admit_from(&mut self, m: &Marker, sender: Option<u32>) -> Result<(), Refusal> {
        let now = self.origin.elapsed().as_secs_f64();
        self.admit_from_at(m, sender, now)
    }

    /// [`Admission::admit`] at `now` seconds of a monotonic clock.
    pub fn admit_at(&mut self, m: &Marker, now: f64) -> Result<(), Refusal> {
        self.admit_from_at(m, None, now)
    }

    /// [`Admission::admit_from`] at `now` seconds of a monotonic clock.
    pub fn admit_from_at(&mut self, m: &Marker, sender: Option<u32>, now: f64) -> Result<(), Refusal> {
        let r = self.check(m, sender, now);
        if let Err(why) = r {
            self.dropped.get_or_create(&ReasonLabel { reason: why.as_str() }).inc();
        }
        r
    }

    fn check(&mut self, m: &Marker, sender: Option<u32>, now: f64) -> Result<(), Refusal> {
        let l = self.limits;
        if !self.ranks.contains_key(&m.rank) {
            self.make_room(sender, now)?;
            *self.held.entry(sender).or_default() += 1;
        }
        let rank = self.ranks.entry(m.rank).or_insert_with(|| Rank { bucket: Bucket::full(l.rank_per_second, now), seen: now, owner: sender, markers: 0 });
        rank.seen = now;
        rank.markers = rank.markers.saturating_add(1);
        if !rank.bucket.take(l.rank_per_second, now) {
            return Err(Refusal::RankRate);
        }
        if !self.steps.contains(&m.step) {
            if !self.new_steps.take(l.new_steps_per_second, now) {
                return Err(Refusal::StepRate);
            }
            self.steps.insert(m.step);
            self.order.push_back(m.step);
            if self.order.len() > STEPS_REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.steps.remove(&old);
                }
            }
        }
        Ok(())
    }

    /// Room for one more rank of `sender`: within its share, and within [`Limits::max_ranks`]
    /// once idle ranks are forgotten, or by displacing a rank not yet established of the
    /// process holding the most ranks (more than `sender` would).
    fn make_room(&mut self, sender: Option<u32>, now: f64) -> Result<(), Refusal> {
        let l = self.limits;
        let over_share = |a: &Admission| sender.is_some() && a.held.get(&sender).copied().unwrap_or(0) >= l.max_ranks_per_sender;
        if over_share(self) || self.ranks.len() >= l.max_ranks {
            self.forget_idle(now);
        }
        if over_share(self) {
            return Err(Refusal::SenderRanks);
        }
        if self.ranks.len() < l.max_ranks {
            return Ok(());
        }
        let mine = self.held.get(&sender).copied().unwrap_or(0);
        let Some((&top, _)) = self.held.iter().filter(|(o, n)| **o != sender && **n > mine + 1).max_by_key(|(_, n)| **n) else {
            return Err(Refusal::TooManyRanks);
        };
        let victim =
            self.ranks.iter().filter(|(_, r)| r.owner == top && r.markers < ESTABLISHED_MARKERS).min_by(|a, b| a.1.seen.total_cmp(&b.1.seen)).map(|(k, _)| *k);
        let Some(victim) = victim else { return Err(Refusal::TooManyRanks) };
        self.ranks.remove(&victim);
        if let Some(n) = self.held.get_mut(&top) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    /// Forgets ranks idle for [`RANK_IDLE_SECONDS`], at most once a second (a flood refused
    /// marker by marker would otherwise scan every rank each time).
    fn forget_idle(&mut self, now: f64) {
        if self.forgot.is_some_and(|t| (0.0..1.0).contains(&(now - t))) {
            return;
        }
        self.forgot = Some(now);
        self.ranks.retain(|_, r| now - r.seen < RANK_IDLE_SECONDS);
        self.held.clear();
        for r in self.ranks.values() {
            *self.held.entry(r.owner).or_default() += 1;
        }
    }

    /// Markers dropped for `reason` so far.
    pub fn dropped(&self, reason: Refusal) -> u64 {
        self.dropped.get_or_create(&ReasonLabel { reason: reason.as_str() }).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Phase;

    fn marker(rank: u32, step: u64) -> Marker {
        Marker { rank, step, phase: Phase::Begin, time: Some(1.0), host: None }
    }

    fn admission(limits: Limits) -> Admission {
        Admission::register(&mut Registry::default(), limits)
    }

    #[test]
    fn a_real_job_is_never_refused() {
        // 8 ranks, 100 steps/s, begin and end each, for 10 s.
        let mut a = admission(Limits::default());
        for i in 0..1000u64 {
            let now = i as f64 / 100.0;
            for rank in 0..8 {
                for _ in 0..2 {
                    assert_eq!(a.admit_at(&marker(rank, i), now), Ok(()), "step {i} rank {rank}");
                }
            }
        }
    }

    #[test]
    fn a_flood_over_a_million_ranks_is_capped_and_counted() {
        let mut a = admission(Limits::default());
        let (mut ok, mut steps) = (0, HashSet::new());
        // The flood: ~11 k markers/s, ranks 0..10^6, 10 s.
        for i in 0..110_000u64 {
            let m = marker((i * 7919 % 1_000_000) as u32, i / 2);
            if a.admit_at(&m, i as f64 / 11_000.0).is_ok() {
                ok += 1;
                steps.insert(m.step);
            }
        }
        assert!(ok <= 1024 + 200 * 10 + 400, "admitted {ok}");
        assert!(steps.len() <= 200 * 10 + 400, "{} steps", steps.len());
        assert!(a.dropped(Refusal::TooManyRanks) > 100_000);
        assert_eq!(a.dropped(Refusal::TooManyRanks) + a.dropped(Refusal::StepRate) + a.dropped(Refusal::RankRate), 110_000 - ok);
    }

    #[test]
    fn one_rank_over_its_rate_is_dropped_and_idle_ranks_make_room() {
        let mut a = admission(Limits { max_ranks: 2, rank_per_second: 10.0, new_steps_per_second: 1000.0, ..Limits::default() });
        let burst = (0..100).filter(|_| a.admit_at(&marker(0, 1), 0.0).is_ok()).count();
        assert_eq!(burst, 20, "a burst of twice the rate");
        assert_eq!(a.dropped(Refusal::RankRate), 80);
        assert!(a.admit_at(&marker(0, 1), 0.1).is_ok(), "refilled");
        assert!(a.admit_at(&marker(1, 1), 0.1).is_ok());
        assert_eq!(a.admit_at(&marker(2, 1), 0.2), Err(Refusal::TooManyRanks));
        assert!(a.admit_at(&marker(2, 1), RANK_IDLE_SECONDS + 1.0).is_ok(), "ranks 0 and 1 went idle");
    }

    #[test]
    fn new_steps_are_bounded_per_second_known_ones_are_not() {
        let mut a = admission(Limits { max_ranks: 10, rank_per_second: 1e6, new_steps_per_second: 5.0, ..Limits::default() });
        let new = (0..100u64).filter(|s| a.admit_at(&marker(0, *s), 0.0).is_ok()).count();
        assert_eq!(new, 10);
        assert!((0..50).all(|_| a.admit_at(&marker(1, 3), 0.0).is_ok()), "markers of a known step pass");
        assert_eq!(a.admit_at(&marker(0, 500), 0.0), Err(Refusal::StepRate));
        assert!(a.admit_at(&marker(0, 500), 0.5).is_ok());
    }

    #[test]
    fn one_flooding_process_cannot_lock_real_ranks_out_and_established_ranks_stay() {
        let mut a = admission(Limits::default());
        // A job's 8 ranks (process 10), established: two steps each.
        for step in 0..2 {
            for rank in 0..8 {
                for _ in 0..2 {
                    assert!(a.admit_from_at(&marker(rank, step), Some(10), 0.0).is_ok());
                }
            }
        }
        // Process 66 floods 100 000 ranks; only its share is held.
        let flood = (0..100_000u32).filter(|r| a.admit_from_at(&marker(1000 + r, 5), Some(66), 0.5).is_ok()).count();
        assert_eq!(flood, 256);
        assert_eq!(a.dropped(Refusal::SenderRanks), 100_000 - 256);
        // Three more flooders fill the table: 8 + 4 × 256 ≥ 1024.
        for pid in 67..70 {
            for r in 0..300u32 {
                let _ = a.admit_from_at(&marker(2_000_000 + pid * 1000 + r, 5), Some(pid), 0.6);
            }
        }
        assert_eq!(a.ranks.len(), 1024);
        // A new job's ranks (process 11) still get in, each displacing a flooder's rank…
        for rank in 100..164 {
            assert_eq!(a.admit_from_at(&marker(rank, 7), Some(11), 1.0), Ok(()), "rank {rank}");
        }
        // …and the first job's established ranks were never displaced.
        assert!((0..8).all(|r| a.ranks.get(&r).is_some_and(|x| x.owner == Some(10))));
        assert_eq!(a.ranks.len(), 1024);
    }
}
