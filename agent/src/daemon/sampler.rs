//! The sampler thread: every interval it sweeps each counter source (sysfs reads and ioctls
//! block, so this is a blocking thread), hands the per-NIC samples to the engine and lets it
//! attribute the steps that ended, reads the traced jobs' NICs again between sweeps
//! ([`super::fast`]), writes the steps the store's sink queued (outside the
//! engine lock: a slow disk never blocks the API), applies the store's retention and
//! publishes `/api/v1/status`.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tracing::warn;

use super::detail;
use crate::{
    config::StoreConfig,
    engine::{Engine, StoreQueue},
    export::{
        api::AppState,
        metrics::{AgentMetrics, SourceLabel},
        watchdog::Watchdog,
    },
    sources::{Source, SourceError},
    store::{Health, Store},
};

pub struct Sampler {
    pub srcs: Vec<Box<dyn Source>>,
    pub engine: Arc<Mutex<Engine>>,
    pub state: AppState,
    pub agent_metrics: AgentMetrics,
    pub watchdog: Watchdog,
    pub store: Option<Store>,
    pub store_cfg: StoreConfig,
    pub store_health: Health,
    pub store_queue: StoreQueue,
    /// The collective probes' part of the status (enabled, up, error).
    pub probes_status: serde_json::Value,
    pub interval: Duration,
    /// Probe events the kernel dropped so far (steps overlapping new drops are incomplete).
    pub drops: Arc<AtomicU64>,
    /// Reads between the full sweeps while a traced job communicates (`None`: off).
    pub fast: Option<super::fast::FastLane>,
}

/// What the loop keeps between rounds.
struct Clock {
    started: Instant,
    sweeps: u64,
    last_retention: Option<Instant>,
    /// When the store's path was last compared with its open file.
    last_identity: Instant,
    last_trim: Instant,
    last_tick: Option<Instant>,
}

impl Sampler {
    /// Runs rounds every interval until `stop` says so (checked every 50 ms while waiting).
    pub fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut c =
            Clock { started: Instant::now(), sweeps: 0, last_retention: None, last_identity: Instant::now(), last_trim: Instant::now(), last_tick: None };
        let detail_every = detail::every(self.interval);
        let mut next = Instant::now();
        loop {
            let fresh_detail = c.sweeps.is_multiple_of(detail_every);
            let round_start = crate::engine::wall_now();
            let reports = self.sweep(fresh_detail, c.sweeps == 0);
            c.sweeps += 1;
            self.attribute(round_start, &mut c);
            self.write_store(&mut c);
            if c.last_trim.elapsed() >= Duration::from_secs(10) {
                c.last_trim = Instant::now();
                super::trim_heap();
            }
            self.publish(reports, fresh_detail, &c);
            next += self.interval;
            let now = Instant::now();
            if next < now {
                next = now; // fell behind: do not burst to catch up
            }
            if let Some(f) = self.fast.as_mut() {
                if f.run_until(next, &mut self.srcs, &self.engine, &mut stop) {
                    return;
                }
                continue;
            }
            // Sleep in short slices so shutdown is prompt.
            while Instant::now() < next {
                if *stop.borrow_and_update() {
                    return;
                }
                std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
            }
        }
    }

    /// Sweeps every source; returns each one's status report.
    fn sweep(&mut self, fresh_detail: bool, first: bool) -> serde_json::Map<String, serde_json::Value> {
        let mut reports = serde_json::Map::new();
        for s in self.srcs.iter_mut() {
            let t0 = Instant::now();
            self.watchdog.begin(s.name());
            let r = s.sweep();
            self.watchdog.end();
            let label = SourceLabel { source: s.name() };
            self.agent_metrics.sweep_seconds.get_or_create(&label).observe(t0.elapsed().as_secs_f64());
            let up = match &r {
                Ok(_) => 1,
                Err(e) => {
                    if first {
                        warn!(source = s.name(), "{e}");
                    }
                    // A source with nothing to read here is absent, not down.
                    i64::from(e.is_absent())
                }
            };
            let absent = r.as_ref().err().is_some_and(SourceError::is_absent);
            self.agent_metrics.source_up.get_or_create(&label).set(up);
            let devices = r.as_ref().map_or(0, |x| i64::try_from(x.devices).unwrap_or(i64::MAX));
            self.agent_metrics.source_devices.get_or_create(&label).set(devices);
            // Built by moving values in: `json!` would deep-copy the detail (and again below),
            // which cost more than a 16-NIC sweep's own parsing.
            let report: serde_json::Map<String, serde_json::Value> = [
                ("up", (up == 1).into()),
                ("absent", absent.into()),
                ("last_sweep", r.as_ref().ok().and_then(|x| serde_json::to_value(x).ok()).unwrap_or_default()),
                ("error", r.as_ref().err().map_or(serde_json::Value::Null, |e| e.to_string().into())),
                ("detail", if fresh_detail { s.status() } else { serde_json::Value::Null }),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            reports.insert(s.name().to_string(), report.into());
        }
        reports
    }

    /// Per-NIC samples for step windows, then the steps that ended are attributed.
    fn attribute(&mut self, round_start: f64, c: &mut Clock) {
        let per_source: Vec<_> = self.srcs.iter().map(|s| s.nic_samples()).collect();
        if let Some(f) = self.fast.as_mut() {
            f.set_full(&per_source);
        }
        let parts: Vec<_> = per_source.into_iter().flatten().collect();
        if let Ok(mut e) = self.engine.lock() {
            let now = crate::engine::wall_now();
            // Counters were read during the round: stamped at its middle, so a round
            // stretched by a busy CPU shifts them by half as much.
            e.push_samples(round_start + (now - round_start) / 2.0, parts);
            // Attribution looks at the last minute of calls: at most ten times a second
            // however fast the counters are sampled (steps wait a grace period of a second).
            if c.last_tick.is_none_or(|t| t.elapsed() >= Duration::from_millis(100)) {
                e.tick(now, self.drops.load(Ordering::Relaxed));
                c.last_tick = Some(Instant::now());
            }
        }
    }

    /// Writes the steps the store's sink queued (into a reopened file when the store's was
    /// deleted or replaced: [`crate::store::health::keep_open`]), and applies retention: periodically (age
    /// and size), and as soon as the file passes max_bytes (at most once a second), down to
    /// 90 % so the next pass is not at once.
    fn write_store(&mut self, c: &mut Clock) {
        let pending = self.store_queue.take();
        let Some(st) = self.store.as_mut() else { return };
        // Once a second, and before the batch is written: a file deleted under the agent is
        // reopened rather than written unseen.
        if c.last_identity.elapsed() >= Duration::from_secs(1) {
            c.last_identity = Instant::now();
            crate::store::health::keep_open(st, &self.store_health);
        }
        for p in &pending {
            match st.put_step(&p.job, &p.attribution, &p.collectives, &p.windows) {
                Ok(_) => self.store_health.ok(),
                Err(e) => {
                    warn!("history store: {e}");
                    self.store_health.failed(&e);
                }
            }
        }
        let cfg = &self.store_cfg;
        let over_budget =
            !pending.is_empty() && c.last_retention.is_some_and(|t| t.elapsed() >= Duration::from_secs(1)) && st.size_bytes().is_ok_and(|b| b > cfg.max_bytes);
        if over_budget || c.last_retention.is_none_or(|t| t.elapsed() >= cfg.retention_interval) {
            c.last_retention = Some(Instant::now());
            if let Err(e) = st.retention(cfg.max_age, cfg.max_bytes - cfg.max_bytes / 10) {
                warn!("history store retention: {e}");
                self.store_health.failed(&e);
            }
        }
    }

    /// Swaps the new `/api/v1/status` in (the previous one is dropped after the lock).
    fn publish(&self, reports: serde_json::Map<String, serde_json::Value>, fresh_detail: bool, c: &Clock) {
        let mut status = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": c.started.elapsed().as_secs_f64(),
            "interval_seconds": self.interval.as_secs_f64(),
            "sweeps": c.sweeps,
            "ebpf_embedded": crate::ebpf::embedded(),
            "collectives": self.probes_status,
            "store": self.store_health.json(),
            "fast_lane": self.fast.as_ref().map(super::fast::FastLane::status),
        });
        status["sources"] = reports.into();
        if let Ok(mut st) = self.state.status.write() {
            if !fresh_detail {
                detail::carry(&mut st, &mut status);
            }
            status = std::mem::replace(&mut *st, status);
        }
        drop(status);
        self.state.ready.store(true, Ordering::Relaxed);
    }
}
