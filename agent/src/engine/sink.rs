//! Where an attributed step goes: one interface, [`StepSink`], that the step metrics
//! ([`StepMetrics`]), the recent steps the API serves ([`RecentSteps`]), the history store
//! ([`StoreQueue`], written by the sampler thread) and the OTLP exporter (`export::otlp`)
//! implement. Sinks run under the engine lock, so none may
//! block: the store's sink only queues, OTLP try-sends into a bounded channel.

use crate::export::reference::RegisterSampled as _;
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{
    attribution::{Attribution, CauseKind},
    labels::RankIdentity,
    timeline::{Collective, NicWindow},
};

/// One attributed step, as every sink sees it.
pub struct FinishedStep<'a> {
    /// The step's job key (`markers`, or a period job's main communicator).
    pub job: &'a str,
    pub attribution: &'a Attribution,
    pub collectives: &'a [Collective],
    /// Per collective (same order), the windows of the NICs attribution used.
    pub windows: &'a [Vec<NicWindow>],
    /// Every NIC's window over the whole step (what the store keeps with it).
    pub step_windows: &'a [NicWindow],
}

/// Receives every step as it is attributed.
pub trait StepSink: Send {
    fn step(&mut self, s: &FinishedStep<'_>);
}

/// The latest attributed steps (`[steps] history` of them) for `/api/v1/steps`: written by
/// its sink under the engine lock, read by the API under this queue's own lock only.
#[derive(Clone)]
pub struct RecentSteps {
    steps: Arc<Mutex<VecDeque<Attribution>>>,
    cap: Arc<std::sync::atomic::AtomicUsize>,
}

impl RecentSteps {
    pub fn new(cap: usize) -> RecentSteps {
        RecentSteps { steps: Arc::default(), cap: Arc::new(cap.max(1).into()) }
    }

    /// Keeps at most `cap` steps from the next one on (`[steps] history`, reloadable).
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap.max(1), Ordering::Relaxed);
    }

    /// Copies of the kept steps that `keep` selects, oldest first.
    pub fn select(&self, keep: impl Fn(&Attribution) -> bool) -> Vec<Attribution> {
        let q = match self.steps.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        };
        q.iter().filter(|a| keep(a)).cloned().collect()
    }
}

impl StepSink for RecentSteps {
    fn step(&mut self, s: &FinishedStep<'_>) {
        let mut q = match self.steps.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        };
        let cap = self.cap.load(Ordering::Relaxed);
        while q.len() >= cap {
            q.pop_front();
        }
        q.push_back(s.attribution.clone());
    }
}

/// A step as the store writes it.
#[derive(Clone, Debug)]
pub struct StoredStep {
    pub job: String,
    pub attribution: Attribution,
    pub collectives: Vec<Collective>,
    pub windows: Vec<NicWindow>,
}

/// Most steps waiting for the store (a stalled disk must not grow the agent without bound).
pub const STORE_QUEUE_MAX: usize = 10_000;

/// Steps waiting to be written to the history store: queued under the engine lock, taken
/// and written by the sampler thread outside it, so a slow disk never blocks the API.
#[derive(Clone, Default)]
pub struct StoreQueue {
    steps: Arc<Mutex<VecDeque<StoredStep>>>,
    /// Oldest steps dropped because the queue was full.
    pub dropped: Arc<AtomicU64>,
}

impl StoreQueue {
    /// Every queued step, oldest first.
    pub fn take(&self) -> Vec<StoredStep> {
        let mut q = match self.steps.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        };
        q.drain(..).collect()
    }
}

impl StepSink for StoreQueue {
    fn step(&mut self, s: &FinishedStep<'_>) {
        let mut q = match self.steps.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        };
        if q.len() >= STORE_QUEUE_MAX {
            q.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(StoredStep {
            job: s.job.to_string(),
            attribution: s.attribution.clone(),
            collectives: s.collectives.to_vec(),
            windows: s.step_windows.to_vec(),
        });
    }
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}
/// A per-rank series: the global rank and who its process is ([`RankIdentity`]).
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankLabel {
    rank: String,
    local_rank: String,
    /// The process's Kubernetes namespace and pod: not `namespace`/`pod`, which the
    /// Prometheus Operator sets to the agent's own pod (docs/prometheus-operator.md).
    k8s_namespace_name: String,
    k8s_pod_name: String,
    gpu: String,
}

impl RankLabel {
    fn new(rank: String, id: RankIdentity) -> RankLabel {
        RankLabel { rank, local_rank: id.local_rank, k8s_namespace_name: id.namespace, k8s_pod_name: id.pod, gpu: id.gpu }
    }
}
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RailLabel {
    rail: String,
}
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NicLabel {
    /// The NIC's name as attribution knows it: its netdev, or `device/port` for an RDMA port
    /// without one.
    netdev: String,
}

/// Upper bounds (`le`) of `stepwise_step_duration_seconds`, in seconds: written out so each
/// label is the exact decimal (an exponential series prints float noise such as
/// 0.0022500000000000004), from 5 ms collectives-only steps to multi-minute LLM steps (large
/// models' steps take 1-60 s; the last finite bucket is 300 s, beyond 120 s).
pub const STEP_BUCKETS: [f64; 28] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0,
    300.0,
];

pub struct StepMetrics {
    duration: Histogram,
    steps: Counter,
    slow: Counter,
    attributed: Family<CauseLabel, Counter<f64, AtomicU64>>,
    rank_wait: Family<RankLabel, Counter<f64, AtomicU64>>,
    rank_late: Family<RankLabel, Counter<f64, AtomicU64>>,
    rail_share: Family<RailLabel, Gauge<f64, AtomicU64>>,
    /// One series without labels, created by the first step with rail bytes: before it the
    /// family is empty (a 0 would read as "less than balanced", 1 is balanced).
    imbalance: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    /// The last step's collectives' algorithm and bus bandwidth (nccl-tests' definitions,
    /// `attribution::busbw`); created by the first step that has one.
    algbw: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    busbw: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    rank_labels: crate::labels::RankLabels,
    /// The labels of each rank value's series (a rank whose process changes, e.g. a new
    /// job's pod, gets new series and its old ones are removed).
    rank_series: HashMap<String, RankLabel>,
    /// Each traced process's identity, as the collective source last published it.
    identities: BTreeMap<u32, RankIdentity>,
    /// The nominal rate attribution uses per NIC (the dashboards' "vs rate" line).
    nic_rate: Family<NicLabel, Gauge<f64, AtomicU64>>,
    /// This host: per-rank series only for its ranks.
    host: String,
    /// `[steps] slow_step` (0: 1.5 × the median of `recent`).
    slow_step: Duration,
    recent: VecDeque<f64>,
}

impl StepMetrics {
    /// Records the nominal rate attribution uses for `nic` (NICs of unknown rate have none).
    pub fn nic_rate(&self, nic: &str, bytes_per_second: f64) {
        self.nic_rate.get_or_create(&NicLabel { netdev: nic.to_string() }).set(bytes_per_second);
    }

    pub fn register(r: &mut Registry, host: String, slow_step: Duration) -> StepMetrics {
        let m = StepMetrics {
            duration: Histogram::new(STEP_BUCKETS.iter().copied()),
            steps: Counter::default(),
            slow: Counter::default(),
            attributed: Family::default(),
            rank_wait: Family::default(),
            rank_late: Family::default(),
            rail_share: Family::default(),
            imbalance: Family::default(),
            algbw: Family::default(),
            busbw: Family::default(),
            rank_labels: Default::default(),
            rank_series: HashMap::new(),
            identities: BTreeMap::new(),
            nic_rate: Family::default(),
            host,
            slow_step,
            recent: VecDeque::new(),
        };
        r.register_sampled("stepwise_step_duration_seconds", "Duration of attributed training steps", m.duration.clone());
        r.register_sampled(
            "stepwise_nic_rate_bytes_per_second",
            "Nominal rate of each NIC as attribution uses it: [steps] nic_rates, else the rate its source reports (netdev speed, RDMA port rate)",
            m.nic_rate.clone(),
        );
        r.register_sampled("stepwise_steps", "Training steps attributed", m.steps.clone());
        r.register_sampled("stepwise_slow_steps", "Steps longer than the slow-step threshold", m.slow.clone());
        r.register_sampled("stepwise_step_attributed_seconds", "Step seconds attributed to each cause", m.attributed.clone());
        // Every cause from the start, at 0: a healthy node's dashboards and alerts see 0, not
        // an absent series.
        for c in CauseKind::ALL {
            let _ = m.attributed.get_or_create(&CauseLabel { cause: c.as_str() });
        }
        r.register_sampled(
            "stepwise_rank_wait_seconds",
            "Seconds each rank on this host waited inside its collectives for the communicator's last rank to arrive",
            m.rank_wait.clone(),
        );
        r.register_sampled(
            "stepwise_rank_late_seconds",
            "Seconds each rank on this host arrived after the first rank of its collectives (its lateness)",
            m.rank_late.clone(),
        );
        r.register_sampled("stepwise_rail_bytes_ratio", "Share of the step's NIC bytes carried by each rail (0 to 1)", m.rail_share.clone());
        r.register_sampled(
            "stepwise_rail_imbalance_ratio",
            "Busiest rail's bytes over the mean rail's bytes in the last step (1 = balanced)",
            m.imbalance.clone(),
        );
        r.register_sampled(
            "stepwise_step_algorithm_bandwidth_bytes_per_second",
            "The last step's collectives' data size over their transfer time (nccl-tests algbw)",
            m.algbw.clone(),
        );
        r.register_sampled(
            "stepwise_step_bus_bandwidth_bytes_per_second",
            "The last step's collectives' algbw times the operation's bus factor, e.g. 2(n-1)/n for all_reduce (nccl-tests busbw)",
            m.busbw.clone(),
        );
        m
    }

    /// The traced processes' identities (pid → local rank, namespace, pod, GPU), merged into
    /// those known: an exited process keeps its identity for the steps attributed after it is
    /// gone (bounded: past 4 096 processes only the current ones are kept).
    pub fn set_identities(&mut self, ids: BTreeMap<u32, RankIdentity>) {
        if self.identities.len() + ids.len() > 4096 {
            self.identities.retain(|p, _| ids.contains_key(p));
        }
        self.identities.extend(ids);
    }

    /// The series labels of `rank` (this host's) in step `s`: its process's identity, from
    /// any of its arrivals on this host.
    fn rank_label(&self, s: &FinishedStep<'_>, rank: u32, value: String) -> RankLabel {
        // `other` stands for many ranks: no one process's identity.
        if value == "other" {
            return RankLabel::new(value, RankIdentity::default());
        }
        let pid = s.collectives.iter().flat_map(|c| &c.arrivals).find(|a| a.rank == rank && a.host == self.host).map(|a| a.pid);
        match pid.and_then(|p| self.identities.get(&p)) {
            Some(id) => RankLabel::new(value, id.clone()),
            // Not published yet (a process younger than the collective source's last rescan):
            // the rank's series stay as they are rather than flicker.
            None => self.rank_series.get(&value).cloned().unwrap_or_else(|| RankLabel::new(value, RankIdentity::default())),
        }
    }

    /// Removes the series of a rank value's `old` labels.
    fn forget_rank(&mut self, old: &RankLabel) {
        self.rank_wait.remove(old);
        self.rank_late.remove(old);
    }

    /// `[steps] slow_step` after a reload.
    pub fn set_slow_step(&mut self, d: Duration) {
        self.slow_step = d;
    }
}

impl StepSink for StepMetrics {
    fn step(&mut self, s: &FinishedStep<'_>) {
        let (a, windows) = (s.attribution, s.windows);
        self.duration.observe(a.seconds);
        self.steps.inc();
        let slow = if self.slow_step > Duration::ZERO {
            a.seconds > self.slow_step.as_secs_f64()
        } else {
            let mut v: Vec<f64> = self.recent.iter().copied().collect();
            v.sort_by(f64::total_cmp);
            v.len() >= 5 && a.seconds > 1.5 * v[v.len() / 2]
        };
        if slow {
            self.slow.inc();
        }
        for c in &a.causes {
            if c.seconds > 0.0 {
                self.attributed.get_or_create(&CauseLabel { cause: c.kind.as_str() }).inc_by(c.seconds);
            }
        }
        // Per-rank metrics only for ranks on this host (another host's agent exports theirs).
        let host = self.host.clone();
        for r in a.ranks.iter().filter(|r| r.host == host) {
            let (rank, evicted) = self.rank_labels.label(r.rank);
            if let Some(old) = evicted.and_then(|v| self.rank_series.remove(&v.to_string())) {
                self.forget_rank(&old);
            }
            let label = self.rank_label(s, r.rank, rank.clone());
            match self.rank_series.insert(rank, label.clone()) {
                Some(old) if old != label => self.forget_rank(&old),
                _ => {}
            }
            self.rank_wait.get_or_create(&label).inc_by(r.wait_seconds);
            self.rank_late.get_or_create(&label).inc_by(r.late_seconds);
        }
        let colls: Vec<&Collective> = s.collectives.iter().collect();
        if let Some(b) = crate::attribution::busbw::of(&colls) {
            self.algbw.get_or_create(&Vec::new()).set(b.algbw);
            self.busbw.get_or_create(&Vec::new()).set(b.busbw);
        }
        let m = &*self;
        let mut per_rail: BTreeMap<String, f64> = BTreeMap::new();
        for w in windows.iter().flatten() {
            let rail = w.nic.rail.map(|r| r.to_string()).unwrap_or_else(|| w.nic.name.clone());
            *per_rail.entry(rail).or_default() += w.tx_bytes;
        }
        let total: f64 = per_rail.values().sum();
        if total > 0.0 && per_rail.len() <= 64 {
            for (rail, b) in &per_rail {
                m.rail_share.get_or_create(&RailLabel { rail: rail.clone() }).set(b / total);
            }
            let mean = total / per_rail.len() as f64;
            m.imbalance.get_or_create(&Vec::new()).set(per_rail.values().cloned().fold(0.0, f64::max) / mean);
        }
        self.recent.push_back(a.seconds);
        if self.recent.len() > 100 {
            self.recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: u64) -> Attribution {
        Attribution {
            step: id,
            begin: 0.0,
            end: 1.0,
            seconds: 1.0,
            causes: Vec::new(),
            ranks: Vec::new(),
            collectives: 0,
            incomplete: false,
            notes: Vec::new(),
            timing: String::new(),
            desyncs: Vec::new(),
            graph_replay: None,
        }
    }

    #[test]
    fn the_store_queue_keeps_the_newest_steps_and_counts_what_it_drops() {
        let mut q = StoreQueue::default();
        for id in 0..(STORE_QUEUE_MAX as u64 + 3) {
            let a = step(id);
            q.step(&FinishedStep { job: "j", attribution: &a, collectives: &[], windows: &[], step_windows: &[] });
        }
        let got = q.take();
        assert_eq!(got.len(), STORE_QUEUE_MAX);
        assert_eq!((got[0].attribution.step, q.dropped.load(Ordering::Relaxed)), (3, 3));
        assert!(q.take().is_empty());
    }
}
