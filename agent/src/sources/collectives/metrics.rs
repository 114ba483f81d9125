//! Metrics of the collective probes. Cardinality is bounded: library and op come from fixed
//! tables (user ops are capped), ranks are capped at [`MAX_RANK_LABELS`], communicators are
//! never labels.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::decode::Call;

/// Local ranks beyond this share the label value `other`.
pub const MAX_RANK_LABELS: u32 = 64;
const MAX_USER_OPS: usize = 32;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub library: &'static str,
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankLabels {
    pub rank: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LibLabels {
    pub library: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

type HistFamily = Family<OpLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 10 µs … ~20 s
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1e-5, 2.0, 22))
}

pub struct CollectiveMetrics {
    calls: Family<OpLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    duration: HistFamily,
    rank_seconds: Family<RankLabels, Counter<f64, AtomicU64>>,
    aborted: Family<LibLabels, Counter>,
    attached: Family<LibLabels, Gauge>,
    decode_errors: Family<KindLabels, Counter>,
    pub events: Counter,
    pub drops: Counter,
    pub net_requests: Counter,
    pub clock_error: Gauge<f64, AtomicU64>,
    pub comms: Gauge,
    pub processes: Gauge,
    user_ops: std::sync::Mutex<Vec<String>>,
}

impl CollectiveMetrics {
    pub fn register(r: &mut Registry) -> CollectiveMetrics {
        let m = CollectiveMetrics {
            calls: Family::default(),
            bytes: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            rank_seconds: Family::default(),
            aborted: Family::default(),
            attached: Family::default(),
            decode_errors: Family::default(),
            events: Counter::default(),
            drops: Counter::default(),
            net_requests: Counter::default(),
            clock_error: Gauge::default(),
            comms: Gauge::default(),
            processes: Gauge::default(),
            user_ops: Default::default(),
        };
        r.register("stepwise_collective_calls", "Collective library calls seen, by library and operation", m.calls.clone());
        r.register("stepwise_collective_bytes", "Payload bytes of collective calls (count x element size)", m.bytes.clone());
        r.register("stepwise_collective_duration_seconds", "Time inside one collective call (entry to return)", m.duration.clone());
        r.register("stepwise_rank_collective_seconds", "Time spent inside collective calls per local rank", m.rank_seconds.clone());
        r.register("stepwise_collective_aborted_calls", "Calls still open when their process exited (killed inside a collective)", m.aborted.clone());
        r.register("stepwise_probe_attached", "Probed functions currently attached, by library", m.attached.clone());
        r.register("stepwise_probe_decode_errors", "Probe events that could not be decoded, by kind", m.decode_errors.clone());
        r.register("stepwise_probe_events", "Probe events received from the kernel", m.events.clone());
        r.register("stepwise_probe_drops", "Probe events dropped in the kernel because the ring buffer was full", m.drops.clone());
        r.register("stepwise_net_requests", "Completed requests of NCCL's network transport seen in sampled windows", m.net_requests.clone());
        r.register("stepwise_clock_error_seconds", "Error bound of monotonic to wall-clock conversion (adjtimex maxerror)", m.clock_error.clone());
        r.register("stepwise_collective_communicators", "Communicators currently tracked", m.comms.clone());
        r.register("stepwise_probe_processes", "Traced processes currently selected", m.processes.clone());
        m
    }

    fn op_label(&self, c: &Call) -> String {
        if c.library != super::targets::Family::User {
            return c.op.to_string();
        }
        let Ok(mut ops) = self.user_ops.lock() else { return "other".into() };
        if ops.iter().any(|o| **o == *c.op) {
            return c.op.to_string();
        }
        if ops.len() < MAX_USER_OPS {
            ops.push(c.op.to_string());
            return c.op.to_string();
        }
        "other".into()
    }

    pub fn observe(&self, c: &Call) {
        let l = OpLabels { library: c.library.as_str(), op: self.op_label(c) };
        self.calls.get_or_create(&l).inc();
        if let Some(b) = c.bytes {
            self.bytes.get_or_create(&l).inc_by(b);
        }
        let secs = c.exit_ns.saturating_sub(c.enter_ns) as f64 * 1e-9;
        self.duration.get_or_create(&l).observe(secs);
        if c.aborted {
            self.aborted.get_or_create(&LibLabels { library: c.library.as_str() }).inc();
        }
        if let Some(r) = c.rank {
            let rank = if r < MAX_RANK_LABELS { r.to_string() } else { "other".into() };
            self.rank_seconds.get_or_create(&RankLabels { rank }).inc_by(secs);
        }
    }

    pub fn decode_error(&self, kind: &'static str) {
        self.decode_errors.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn set_attached(&self, library: &'static str, n: i64) {
        self.attached.get_or_create(&LibLabels { library }).set(n);
    }
}
