//! The daemon's pipeline from inputs to causes: counter samples → [`CounterLog`], markers and
//! collective calls → steps → [`attribution::attribute`] → step history, metrics (and the
//! store). One `Engine` lives behind a mutex; the sampler thread feeds it samples and calls
//! [`Engine::tick`] after every sweep; HTTP handlers read it.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::atomic::AtomicU64,
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use serde::{Deserialize, Serialize};

use crate::{
    attribution::{Attribution, CauseKind, NetSample, Params},
    pipeline,
    sources::{collectives::SharedHistory, nic},
    timeline::{join::CallView, join_calls, links::Links, windows::NicInfo, Collective, CounterLog, Marker, NicSample, NicWindow, StepSource},
};

/// `[steps]` configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StepsConfig {
    /// Unix datagram socket for step markers. Default `/run/stepwise/markers.sock`.
    pub marker_socket: std::path::PathBuf,
    /// A step is slow when longer than this; `0s` = 1.5 × the median of recent steps.
    /// Default `0s`.
    #[serde(with = "crate::config::duration_str")]
    pub slow_step: Duration,
    /// Wait at least this long after a step ends before attributing it (the other ranks'
    /// markers, period detection). Default `1s`.
    #[serde(with = "crate::config::duration_str")]
    pub grace: Duration,
    /// Past the grace, a step also waits until the probe consumer has drained every event up
    /// to its end and a counter sweep has passed it — for at most this long after its end;
    /// a step closed then is marked incomplete with a note. Default `10s`.
    #[serde(with = "crate::config::duration_str")]
    pub max_wait: Duration,
    /// Steps kept in memory for `/api/v1/steps`. Default 1000.
    pub history: usize,
    /// Nominal rate per NIC (`eth1 = "1Gbit/s"`), overriding sysfs `rate`/`speed` — for
    /// shaped links whose real bottleneck is a qdisc. Default empty.
    pub nic_rates: BTreeMap<String, String>,
    /// Attribution parameters (α, transmit-wait tick length, idle-NIC threshold).
    pub params: Params,
}

impl Default for StepsConfig {
    fn default() -> Self {
        StepsConfig {
            marker_socket: "/run/stepwise/markers.sock".into(),
            slow_step: Duration::ZERO,
            grace: Duration::from_secs(1),
            max_wait: Duration::from_secs(10),
            history: 1000,
            nic_rates: BTreeMap::new(),
            params: Params::default(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankLabel {
    rank: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RailLabel {
    rail: String,
}

/// Upper bounds (`le`) of `stepwise_step_duration_seconds`, in seconds: written out so each
/// label is the exact decimal (an exponential series prints float noise such as
/// 0.0022500000000000004), from 5 ms collectives-only steps to multi-minute LLM steps (large
/// models' steps take 1-60 s; the last finite bucket is 300 s, beyond 120 s).
pub const STEP_BUCKETS: [f64; 28] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0,
    300.0,
];

struct Metrics {
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
    markers: Counter,
    marker_errors: Counter,
    rank_labels: crate::labels::RankLabels,
}

impl Metrics {
    fn register(r: &mut Registry) -> Metrics {
        let m = Metrics {
            duration: Histogram::new(STEP_BUCKETS.iter().copied()),
            steps: Counter::default(),
            slow: Counter::default(),
            attributed: Family::default(),
            rank_wait: Family::default(),
            rank_late: Family::default(),
            rail_share: Family::default(),
            imbalance: Family::default(),
            markers: Counter::default(),
            marker_errors: Counter::default(),
            rank_labels: Default::default(),
        };
        r.register("stepwise_step_duration_seconds", "Duration of attributed training steps", m.duration.clone());
        r.register("stepwise_steps", "Training steps attributed", m.steps.clone());
        r.register("stepwise_slow_steps", "Steps longer than the slow-step threshold", m.slow.clone());
        r.register("stepwise_step_attributed_seconds", "Step seconds attributed to each cause", m.attributed.clone());
        // Every cause from the start, at 0: a healthy node's dashboards and alerts see 0, not
        // an absent series.
        for c in CauseKind::ALL {
            let _ = m.attributed.get_or_create(&CauseLabel { cause: c.as_str() });
        }
        r.register("stepwise_rank_wait_seconds", "Seconds a local rank waited inside collectives for the last rank", m.rank_wait.clone());
        r.register("stepwise_rank_late_seconds", "Seconds a local rank arrived after the first rank of its collectives", m.rank_late.clone());
        r.register("stepwise_rail_bytes_ratio", "Share of the step's NIC bytes carried by each rail (0 to 1)", m.rail_share.clone());
        r.register("stepwise_rail_imbalance_ratio", "Busiest rail's bytes over the mean rail's bytes in the last step (1 = balanced)", m.imbalance.clone());
        r.register("stepwise_markers", "Step markers received", m.markers.clone());
        r.register("stepwise_marker_errors", "Malformed step markers refused", m.marker_errors.clone());
        m
    }
}

/// Most markers kept.
const MAX_MARKERS: usize = 200_000;
/// Markers older than this are dropped: steps are formed from the last ~11 minutes
/// (attribution lookback) and `diagnose` asks for 10 by default; without an age bound the
/// deque would grow for hours of steps up to `MAX_MARKERS`.
const MARKER_KEEP_SECONDS: f64 = 900.0;
/// How far before the tick that saw new probe drops they may have happened (the probe
/// thread drains every 20 ms, later when starved of CPU).
const DROP_MARGIN_SECONDS: f64 = 1.0;
/// Drop intervals kept (one per tick with new drops; a tick is one counter interval).
const MAX_DROP_SPANS: usize = 100_000;

pub struct Engine {
    cfg: StepsConfig,
    host: String,
    log: CounterLog,
    markers: VecDeque<Marker>,
    steps: VecDeque<Attribution>,
    /// (job key, step id, begin in µs for marker steps) already attributed → the step's end.
    done: BTreeMap<(String, u64, i64), f64>,
    rates: HashMap<String, f64>,
    metrics: Metrics,
    recent: VecDeque<f64>,
    calls: Option<SharedHistory>,
    /// Wall time up to which steps were attributed.
    pub last_attributed: f64,
    /// Steps waiting to be written to the store by the owner.
    pub pending_store: Vec<(String, Attribution, Vec<Collective>, Vec<NicWindow>)>,
    drops_seen: u64,
    /// Wall time of the previous tick (start of the interval new drops fall into).
    last_tick: f64,
    /// Time of the latest counter sweep pushed (None: no NIC sampled).
    counters_until: Option<f64>,
    /// Wall-time intervals in which probe events were dropped: steps overlapping one are
    /// incomplete. Pruned with the attribution lookback.
    drop_spans: VecDeque<(f64, f64)>,
    sinks: Vec<StepSink>,
    /// Bounds what a marker flood can cost (`timeline::admission`).
    admission: crate::timeline::admission::Admission,
    /// Judges the open calls at every tick (`[hang]`).
    hang: crate::hang::detector::Detector,
}

/// Receives each step as it is attributed: job key, attribution and the step's collectives.
/// Called under the engine lock, so a sink must not block (the OTLP exporter try-sends into
/// a bounded queue and counts what it drops).
pub type StepSink = Box<dyn Fn(&str, &Attribution, &[Collective]) + Send>;

pub fn wall_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0) + crate::testclock::offset_seconds()
}

/// What the probe thread has recorded since the lookback: calls, sampled network requests,
/// its watermark and the spans of lost events.
struct CallsIn {
    views: Vec<CallView>,
    net: Vec<NetSample>,
    drained_until: f64,
    lost: Vec<(f64, f64)>,
    links: Links,
}

/// What a step ending at `end` still waits for, if anything: probe events not drained up to
/// its end, or no counter sweep after it.
fn missing_data(end: f64, drained_until: f64, counters_until: f64) -> Option<String> {
    if drained_until <= 0.0 {
        Some("the probe consumer drained its first events".to_string())
    } else if drained_until < end {
        Some(format!("the probe events up to its end were drained (the probe consumer was {:.1} s behind)", end - drained_until))
    } else if counters_until < end {
        Some("a counter sweep passed its end".to_string())
    } else {
        None
    }
}

impl Engine {
    pub fn new(cfg: StepsConfig, host: String, registry: &mut Registry) -> Result<Engine, crate::units::UnitError> {
        let mut rates = HashMap::new();
        for (k, v) in &cfg.nic_rates {
            rates.insert(k.clone(), crate::units::parse_rate_pos(v)?.0);
        }
        Ok(Engine {
            host,
            log: CounterLog::new(4096),
            markers: VecDeque::new(),
            steps: VecDeque::new(),
            done: BTreeMap::new(),
            rates,
            metrics: Metrics::register(registry),
            admission: crate::timeline::admission::Admission::register(registry, Default::default()),
            hang: crate::hang::detector::Detector::new(Default::default(), registry),
            recent: VecDeque::new(),
            calls: None,
            last_attributed: 0.0,
            pending_store: Vec::new(),
            drops_seen: 0,
            last_tick: 0.0,
            counters_until: None,
            drop_spans: VecDeque::new(),
            sinks: Vec::new(),
            cfg,
        })
    }

    /// Applies a reloaded `[steps]` section (SIGHUP). The marker socket stays the one bound at
    /// start; NIC rates are parsed first, so an invalid one changes nothing.
    pub fn set_steps_config(&mut self, mut cfg: StepsConfig) -> Result<(), crate::units::UnitError> {
        let mut rates = HashMap::new();
        for (k, v) in &cfg.nic_rates {
            rates.insert(k.clone(), crate::units::parse_rate_pos(v)?.0);
        }
        cfg.marker_socket = self.cfg.marker_socket.clone();
        self.rates = rates;
        self.cfg = cfg;
        Ok(())
    }

    /// The `[steps]` configuration in force.
    /// Applies `[hang]` (at start and on SIGHUP).
    pub fn set_hang_config(&mut self, cfg: crate::config::HangConfig) {
        self.hang.set_config(cfg);
    }

    /// The hang detector: its configuration and last verdicts (`/api/v1/open`).
    pub fn hang(&self) -> &crate::hang::detector::Detector {
        &self.hang
    }

    /// Judges this host's open calls as of the probe consumer's watermark.
    fn judge_hangs(&mut self, now: f64) {
        let Some(calls) = &self.calls else { return };
        let view = {
            let h = match calls.lock() {
                Ok(h) => h,
                Err(p) => p.into_inner(),
            };
            if h.drained_until <= 0.0 {
                return;
            }
            h.progress.snapshot(&h.host, h.drained_until)
        };
        self.hang.update(&view, now);
    }

    pub fn steps_config(&self) -> &StepsConfig {
        &self.cfg
    }

    pub fn set_calls(&mut self, h: SharedHistory) {
        self.calls = Some(h);
    }

    /// Adds a sink that sees every step from now on (OTLP export).
    pub fn add_step_sink(&mut self, sink: StepSink) {
        self.sinks.push(sink);
    }

    /// Adds one sweep round's per-NIC parts (from every source), stamped `time`.
    pub fn push_samples(&mut self, time: f64, parts: Vec<nic::NicPart>) {
        if !parts.is_empty() {
            self.counters_until = Some(self.counters_until.map_or(time, |t| t.max(time)));
        }
        let mut per: BTreeMap<String, (NicInfo, NicSample)> = BTreeMap::new();
        for (info, s) in parts {
            let e = per.entry(info.name.clone()).or_insert_with(|| (info.clone(), NicSample::default()));
            e.0.rail = e.0.rail.or(info.rail);
            e.0.rate_bytes_per_second = e.0.rate_bytes_per_second.or(info.rate_bytes_per_second);
            nic::merge(&mut e.1, &s);
        }
        for (name, (mut info, mut s)) in per {
            if let Some(r) = self.rates.get(&name) {
                info.rate_bytes_per_second = Some(*r);
            }
            info.host = Some(self.host.clone());
            s.time = time;
            self.log.push(info, s);
        }
    }

    pub fn add_marker(&mut self, mut m: Marker) {
        if self.admission.admit(&m).is_err() {
            return;
        }
        m.host.get_or_insert_with(|| self.host.clone());
        if self.markers.len() >= MAX_MARKERS {
            self.markers.pop_front();
        }
        self.markers.push_back(m);
        self.metrics.markers.inc();
    }

    pub fn marker_error(&self) {
        self.metrics.marker_errors.inc();
    }

    pub fn markers_since(&self, since: f64) -> Vec<Marker> {
        self.markers.iter().filter(|m| m.time.unwrap_or(0.0) >= since).cloned().collect()
    }

    /// At most `limit` markers with a time in `[since, until]`, in the order received.
    pub fn markers_between(&self, since: f64, until: f64, limit: usize) -> Vec<Marker> {
        self.markers.iter().filter(|m| (since..=until).contains(&m.time.unwrap_or(0.0))).take(limit).cloned().collect()
    }

    pub fn samples(&self, t0: f64, t1: f64) -> Vec<(NicInfo, Vec<NicSample>)> {
        self.log.samples(t0, t1)
    }

    pub fn steps(&self) -> impl Iterator<Item = &Attribution> {
        self.steps.iter()
    }

    /// Attributes every step that ended at least `grace` ago, whose probe events and counter
    /// samples are in (or that ended `max_wait` ago), and was not attributed yet.
    pub fn tick(&mut self, now: f64, dropped_events: u64) {
        while self.markers.front().is_some_and(|m| m.time.unwrap_or(now) < now - MARKER_KEEP_SECONDS) {
            self.markers.pop_front();
        }
        self.judge_hangs(now);
        let horizon = now - self.cfg.grace.as_secs_f64();
        let deadline = now - self.cfg.max_wait.as_secs_f64().max(self.cfg.grace.as_secs_f64());
        let lookback = self.last_attributed.max(now - 600.0) - 60.0;
        let CallsIn { views, net, drained_until, lost, links } = self.calls_in(lookback);
        let counters_until = self.counters_until.unwrap_or(f64::INFINITY);
        let colls = join_calls(&views);
        let markers: Vec<Marker> = self.markers_since(lookback);
        let (found, _) = pipeline::find_steps(&markers, &colls);
        let mut net = net;
        net.sort_by(|a, b| a.posted.total_cmp(&b.posted));
        let nets = [net];
        // Events dropped since the last tick were lost in (last tick, now] — or up to a
        // second earlier when the probe thread drained late (a loaded host): every step
        // overlapping that span is incomplete, also one attributed ticks later, after its
        // grace period (the steps attributed *now* ended before the drops). Erring early
        // marks a neighbour incomplete; never marking an affected step complete is the point.
        if dropped_events > self.drops_seen {
            let from = if self.last_tick > 0.0 { self.last_tick.min(now - DROP_MARGIN_SECONDS) } else { now - DROP_MARGIN_SECONDS };
            match self.drop_spans.back_mut() {
                // Drops on consecutive ticks: one span.
                Some(last) if last.1 >= from => last.1 = now,
                _ => self.drop_spans.push_back((from, now)),
            }
            if self.drop_spans.len() > MAX_DROP_SPANS {
                self.drop_spans.pop_front();
            }
        }
        self.drops_seen = dropped_events;
        self.last_tick = now;
        while self.drop_spans.front().is_some_and(|s| s.1 < lookback - 60.0) {
            self.drop_spans.pop_front();
        }
        for f in &found {
            let step = &f.step;
            // Never before its events are in: the probe consumer's watermark and the last
            // counter sweep must have passed the step's end (a loaded host drains late).
            let missing = missing_data(step.end, drained_until, counters_until);
            if step.end > horizon || (missing.is_some() && step.end > deadline) {
                continue;
            }
            // Period step ids are stable (they count the main communicator's periods); a
            // marker step id can repeat across jobs, so its begin tells incarnations apart.
            let begin_key = if step.source == StepSource::Markers { (step.begin * 1e6) as i64 } else { 0 };
            let key = (f.job.clone(), step.id, begin_key);
            if self.done.contains_key(&key) || step.end <= self.last_attributed - 60.0 {
                continue;
            }
            let dropped = self.drop_spans.iter().any(|&(a, b)| a <= step.end && b >= step.begin);
            let inp = pipeline::Inputs { colls: &colls, log: Some(&self.log), nets: &nets, links: &links };
            let (mut att, inputs) = pipeline::attribute(&inp, f, &self.cfg.params, dropped);
            if lost.iter().any(|&(a, b)| a <= step.end && b >= step.begin) {
                att.incomplete = true;
                att.notes.push("incomplete data: probe events of processes that exited before the agent could inspect them were lost (a starved agent; see stepwise_probe_decode_errors_total{kind=\"process_gone\"})".to_string());
            }
            if let Some(what) = missing {
                att.incomplete = true;
                att.notes.push(format!("incomplete data: closed {:.1} s after its end (steps.max_wait) before {what}", now - step.end));
            }
            let windows = inputs.windows;
            let mine = inputs.collectives;
            self.record(&att, &windows);
            let step_windows = self.log.window(step.begin, step.end);
            let mine: Vec<Collective> = mine.into_iter().cloned().collect();
            for sink in &self.sinks {
                sink(&f.job, &att, &mine);
            }
            self.pending_store.push((f.job.clone(), att.clone(), mine, step_windows));
            if self.steps.len() >= self.cfg.history.max(1) {
                self.steps.pop_front();
            }
            self.steps.push_back(att);
            self.done.insert(key, step.end);
            self.last_attributed = self.last_attributed.max(step.end);
        }
        // Forget keys far behind so the set stays bounded.
        let cut = self.last_attributed - 900.0;
        self.done.retain(|_, end| *end >= cut);
    }

    /// The probe thread's calls since `since`. Without collective probes (`[collectives]
    /// enabled = false`) markers still make steps: there are no calls to join, and none to
    /// wait for.
    fn calls_in(&self, since: f64) -> CallsIn {
        let Some(calls) = &self.calls else {
            return CallsIn { views: Vec::new(), net: Vec::new(), drained_until: f64::INFINITY, lost: Vec::new(), links: Links::default() };
        };
        let h = match calls.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        CallsIn {
            views: h.calls_since(since, 1_000_000).iter().map(|c| c.view()).collect(),
            net: h
                .net_since(since, 1_000_000)
                .into_iter()
                .map(|n| NetSample { bytes: n.req.bytes.unwrap_or(0) as f64, posted: n.posted, completed: n.completed, send: n.req.send })
                .collect(),
            drained_until: h.drained_until,
            lost: h.lost_since(since),
            links: Links::new(h.links.iter().cloned()),
        }
    }

    fn record(&mut self, a: &Attribution, windows: &[Vec<NicWindow>]) {
        let m = &self.metrics;
        m.duration.observe(a.seconds);
        m.steps.inc();
        let slow = if self.cfg.slow_step > Duration::ZERO {
            a.seconds > self.cfg.slow_step.as_secs_f64()
        } else {
            let mut v: Vec<f64> = self.recent.iter().copied().collect();
            v.sort_by(f64::total_cmp);
            v.len() >= 5 && a.seconds > 1.5 * v[v.len() / 2]
        };
        if slow {
            m.slow.inc();
        }
        self.recent.push_back(a.seconds);
        if self.recent.len() > 100 {
            self.recent.pop_front();
        }
        for c in &a.causes {
            if c.seconds > 0.0 {
                m.attributed.get_or_create(&CauseLabel { cause: c.kind.as_str() }).inc_by(c.seconds);
            }
        }
        // Per-rank metrics only for ranks on this host (another host's agent exports theirs).
        for r in a.ranks.iter().filter(|r| r.host == self.host) {
            let rank = m.rank_labels.label(r.rank);
            m.rank_wait.get_or_create(&RankLabel { rank: rank.clone() }).inc_by(r.wait_seconds);
            m.rank_late.get_or_create(&RankLabel { rank }).inc_by(r.late_seconds);
        }
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
        let _ = CauseKind::ALL;
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod marker_tests;

#[cfg(test)]
mod watermark_tests;
