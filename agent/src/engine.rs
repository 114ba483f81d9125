//! The daemon's pipeline from inputs to causes: counter samples → [`CounterLog`], markers and
//! collective calls → steps → [`attribution::attribute`] → step history, metrics (and the
//! store). One `Engine` lives behind a mutex; the sampler thread feeds it samples and calls
//! [`Engine::tick`] after every sweep; HTTP handlers read it.

use crate::export::reference::RegisterSampled as _;
use std::collections::{BTreeMap, HashMap, VecDeque};

use prometheus_client::{metrics::counter::Counter, registry::Registry};

use crate::{
    attribution::{Attribution, NetSample},
    config::StepsConfig,
    pipeline,
    sources::{collectives::SharedHistory, nic},
    timeline::{join::CallView, join_calls, links::Links, windows::NicInfo, Collective, CounterLog, Marker, NicSample, StepSource},
};

/// `stepwise_markers` and `stepwise_marker_errors`.
struct MarkerMetrics {
    markers: Counter,
    marker_errors: Counter,
}

impl MarkerMetrics {
    fn register(r: &mut Registry) -> MarkerMetrics {
        let m = MarkerMetrics { markers: Counter::default(), marker_errors: Counter::default() };
        r.register_sampled("stepwise_markers", "Step markers received", m.markers.clone());
        r.register_sampled("stepwise_marker_errors", "Malformed step markers refused", m.marker_errors.clone());
        m
    }
}

/// Most markers kept.
const MAX_MARKERS: usize = 200_000;
/// Markers older than this are dropped: steps are formed from the last ~11 minutes
/// (attribution lookback) and `diagnose` asks for 10 by default; without an age bound the
/// deque would grow for hours of steps up to `MAX_MARKERS`.
const MARKER_KEEP_SECONDS: f64 = 900.0;

pub struct Engine {
    cfg: StepsConfig,
    host: String,
    log: CounterLog,
    markers: VecDeque<Marker>,
    /// The latest steps, also served by the API ([`RecentSteps`]).
    recent: RecentSteps,
    /// (job key, step id, begin in µs for marker steps) already attributed → the step's end.
    done: BTreeMap<(String, u64, i64), f64>,
    rates: HashMap<String, f64>,
    metrics: sink::StepMetrics,
    marker_metrics: MarkerMetrics,
    calls: Option<SharedHistory>,
    /// Wall time up to which steps were attributed.
    pub last_attributed: f64,
    /// Time of the latest counter sweep pushed (None: no NIC sampled).
    counters_until: Option<f64>,
    /// Where each attributed step goes besides the step metrics and the history above.
    sinks: Vec<Box<dyn StepSink>>,
    /// Bounds what a marker flood can cost (`timeline::admission`).
    admission: crate::timeline::admission::Admission,
    /// Judges the open calls at every tick (`[hang]`).
    hang: crate::hang::detector::Detector,
    /// Compares the ranks' calls at every tick (`timeline::desync`).
    desync: crate::hang::desync::Watch,
}

/// Seconds of recent calls the desync watch compares at each tick.
const DESYNC_WINDOW_SECONDS: f64 = 120.0;

mod sink;

pub use sink::{FinishedStep, RecentSteps, StepMetrics, StepSink, StoreQueue, StoredStep, STEP_BUCKETS, STORE_QUEUE_MAX};

pub fn wall_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0) + crate::testclock::offset_seconds()
}

/// What the probe thread has recorded since the lookback: calls, sampled network requests,
/// its watermark and the spans of dropped and lost events.
struct CallsIn {
    views: Vec<CallView>,
    net: Vec<NetSample>,
    drained_until: f64,
    gaps: pipeline::Gaps,
    links: Links,
    identities: BTreeMap<u32, crate::labels::RankIdentity>,
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
        let step_host = host.clone();
        let mut rates = HashMap::new();
        for (k, v) in &cfg.nic_rates {
            rates.insert(k.clone(), crate::units::parse_rate_pos(v)?.0);
        }
        Ok(Engine {
            host,
            log: CounterLog::new(cfg.counter_samples),
            markers: VecDeque::new(),
            recent: RecentSteps::new(cfg.history),
            done: BTreeMap::new(),
            rates,
            metrics: sink::StepMetrics::register(registry, step_host, cfg.slow_step),
            marker_metrics: MarkerMetrics::register(registry),
            admission: crate::timeline::admission::Admission::register(registry, Default::default()),
            hang: crate::hang::detector::Detector::new(Default::default(), registry),
            desync: crate::hang::desync::Watch::new(registry),
            calls: None,
            last_attributed: 0.0,
            counters_until: None,
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
        self.metrics.set_slow_step(cfg.slow_step);
        self.recent.set_cap(cfg.history);
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

    /// The desyncs found in the last 10 minutes (`/api/v1/open`).
    pub fn desyncs(&self) -> Vec<crate::timeline::desync::Desync> {
        self.desync.desyncs()
    }

    /// Judges this host's open calls as of the probe consumer's watermark; the view judged.
    fn judge_hangs(&mut self, now: f64) -> Option<crate::timeline::open::HostProgress> {
        let calls = self.calls.as_ref()?;
        let (mut view, proc_root) = {
            let h = match calls.lock() {
                Ok(h) => h,
                Err(p) => p.into_inner(),
            };
            if h.drained_until <= 0.0 {
                return None;
            }
            (h.progress.snapshot(&h.host, h.drained_until), h.proc_root.clone())
        };
        // Whether a rank inside a long-open call is stopped (the rule's "not progressing").
        crate::sources::collectives::exits::fill_inside_states(&mut view, &proc_root, self.hang.config().floor.as_secs_f64());
        self.hang.update(&view, now);
        Some(view)
    }

    pub fn steps_config(&self) -> &StepsConfig {
        &self.cfg
    }

    pub fn set_calls(&mut self, h: SharedHistory) {
        self.calls = Some(h);
    }

    /// Adds a sink that sees every step from now on (the history store, OTLP export).
    pub fn add_step_sink(&mut self, sink: Box<dyn StepSink>) {
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
            if let Some(r) = info.rate_bytes_per_second {
                self.metrics.nic_rate(&name, r);
            }
            info.host = Some(self.host.clone());
            s.time = time;
            self.log.push(info, s);
        }
    }

    pub fn add_marker(&mut self, m: Marker) {
        self.add_marker_from(m, None);
    }

    /// [`Engine::add_marker`] sent by process `sender` (the marker socket's credentials):
    /// admission holds each sending process to its share of the ranks.
    pub fn add_marker_from(&mut self, mut m: Marker, sender: Option<u32>) {
        if self.admission.admit_from(&m, sender).is_err() {
            return;
        }
        m.host.get_or_insert_with(|| self.host.clone());
        if self.markers.len() >= MAX_MARKERS {
            self.markers.pop_front();
        }
        self.markers.push_back(m);
        self.marker_metrics.markers.inc();
    }

    pub fn marker_error(&self) {
        self.marker_metrics.marker_errors.inc();
    }

    pub fn markers_since(&self, since: f64) -> Vec<Marker> {
        self.markers.iter().filter(|m| m.time.unwrap_or(0.0) >= since).cloned().collect()
    }

    /// At most `limit` markers with a time in `[since, until]`, in the order received.
    pub fn markers_between(&self, since: f64, until: f64, limit: usize) -> Vec<Marker> {
        self.markers.iter().filter(|m| (since..=until).contains(&m.time.unwrap_or(0.0))).take(limit).cloned().collect()
    }

    /// The counter log's NICs (what [`Engine::nic_samples`] takes).
    pub fn nic_names(&self) -> Vec<String> {
        self.log.nic_names()
    }

    pub fn nic_samples(&self, name: &str, t0: f64, t1: f64, limit: usize) -> Option<(NicInfo, Vec<NicSample>)> {
        self.log.nic_samples(name, t0, t1, limit)
    }

    pub fn samples(&self, t0: f64, t1: f64) -> Vec<(NicInfo, Vec<NicSample>)> {
        self.log.samples(t0, t1)
    }

    /// Copies of the latest attributed steps, oldest first.
    pub fn steps(&self) -> Vec<Attribution> {
        self.recent.select(|_| true)
    }

    /// The latest steps, shared: what `/api/v1/steps` reads without the engine lock.
    pub fn recent_steps(&self) -> RecentSteps {
        self.recent.clone()
    }

    /// Attributes every step that ended at least `grace` ago, whose probe events and counter
    /// samples are in (or that ended `max_wait` ago), and was not attributed yet.
    pub fn tick(&mut self, now: f64, dropped_events: u64) {
        while self.markers.front().is_some_and(|m| m.time.unwrap_or(now) < now - MARKER_KEEP_SECONDS) {
            self.markers.pop_front();
        }
        let open = self.judge_hangs(now);
        // With probes, a step also waits out the margin by which drops seen at a later tick
        // are dated back (`gaps::DROP_MARGIN_SECONDS`): no drop span recorded after a step
        // was attributed can reach into it, so the spans served to cluster `diagnose` mark the
        // same steps as the daemon did.
        let hold = if self.calls.is_some() { crate::sources::collectives::gaps::DROP_MARGIN_SECONDS } else { 0.0 };
        let horizon = now - self.cfg.grace.as_secs_f64().max(hold);
        let deadline = now - self.cfg.max_wait.as_secs_f64().max(self.cfg.grace.as_secs_f64());
        let lookback = self.last_attributed.max(now - 600.0) - 60.0;
        let CallsIn { views, net, drained_until, gaps, links, identities } = self.calls_in(now, dropped_events, lookback);
        self.metrics.set_identities(identities);
        let counters_until = self.counters_until.unwrap_or(f64::INFINITY);
        let colls = join_calls(&views);
        let recent: Vec<&CallView> = views.iter().filter(|c| c.enter >= now - DESYNC_WINDOW_SECONDS).collect();
        self.desync.update(crate::timeline::desync::find(&recent, open.as_slice()), now);
        let desyncs = self.desync.desyncs();
        let markers: Vec<Marker> = self.markers_since(lookback);
        let (found, _) = pipeline::find_steps(&markers, &colls);
        let mut net = net;
        net.sort_by(|a, b| a.posted.total_cmp(&b.posted));
        let nets = [net];
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
            // Steps overlapping dropped or lost probe events are incomplete (`pipeline::Gaps`),
            // also one attributed ticks later, after its grace period.
            let inp = pipeline::Inputs { colls: &colls, log: Some(&self.log), nets: &nets, links: &links, gaps: &gaps };
            let (mut att, inputs) = pipeline::attribute(&inp, f, &self.cfg.params);
            if let Some(what) = missing {
                att.incomplete = true;
                att.notes.push(format!("incomplete data: closed {:.1} s after its end (steps.max_wait) before {what}", now - step.end));
            }
            let step_windows = self.log.window(step.begin, step.end);
            att.desyncs = crate::timeline::desync::of_step(&desyncs, &inputs.collectives);
            let mine: Vec<Collective> = inputs.collectives.into_iter().cloned().collect();
            let done = FinishedStep { job: &f.job, attribution: &att, collectives: &mine, windows: &inputs.windows, step_windows: &step_windows };
            self.metrics.step(&done);
            self.recent.step(&done);
            for sink in &mut self.sinks {
                sink.step(&done);
            }
            self.done.insert(key, step.end);
            self.last_attributed = self.last_attributed.max(step.end);
        }
        // Forget keys far behind so the set stays bounded.
        let cut = self.last_attributed - 900.0;
        self.done.retain(|_, end| *end >= cut);
    }

    /// The probe thread's calls since `since`, after recording that the probes had dropped
    /// `dropped_events` by `now` (kept in the history, where `/api/v1/collectives` serves
    /// them). Without collective probes (`[collectives] enabled = false`) markers still make
    /// steps: there are no calls to join, none to wait for, and no probe to drop events.
    fn calls_in(&self, now: f64, dropped_events: u64, since: f64) -> CallsIn {
        let Some(calls) = &self.calls else {
            return CallsIn {
                views: Vec::new(),
                net: Vec::new(),
                drained_until: f64::INFINITY,
                gaps: Default::default(),
                links: Links::default(),
                identities: BTreeMap::new(),
            };
        };
        let mut h = match calls.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        h.drops.record(now, dropped_events);
        CallsIn {
            views: h.calls_since(since, 1_000_000).iter().map(|c| c.view()).collect(),
            net: h
                .net_since(since, 1_000_000)
                .into_iter()
                .map(|n| NetSample { bytes: n.req.bytes.unwrap_or(0) as f64, posted: n.posted, completed: n.completed, send: n.req.send })
                .collect(),
            drained_until: h.drained_until,
            // A step can begin up to a minute before the lookback (`tick` skips only steps that
            // ended a minute before the last attributed one).
            gaps: pipeline::Gaps { dropped: h.drops.since(since - 60.0), lost: h.lost_since(since) },
            links: Links::new(h.links.iter().cloned()),
            identities: h.identities.clone(),
        }
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod marker_tests;

#[cfg(test)]
mod watermark_tests;
