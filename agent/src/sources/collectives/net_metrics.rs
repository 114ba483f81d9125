//! The in-flight picture of NCCL's network transport from the sampled `ncclIb*` requests, in
//! the terms of the concurrency model (Little's law, N = λ·T): per direction,
//! - `stepwise_net_request_seconds` (histogram): a request's occupancy T, post → first
//!   successful test;
//! - `stepwise_net_request_bytes_total`: bytes of the completed requests (m = bytes / count);
//! - `stepwise_net_request_occupancy_seconds_total`: Σ T, so that
//!   N = rate(occupancy) / rate(`stepwise_net_sampled_seconds_total`) is the mean number of
//!   requests in flight while the sampled probes were attached, and
//!   N·m/T = rate(bytes) / rate(sampled seconds) the throughput they achieved;
//! - `stepwise_net_sampled_seconds_total`: how long the sampled probes were attached.
//!
//! Requests are seen only inside the sampled windows (`[collectives] sample_window` every
//! `sample_every`); a request posted before a window opened is not seen. Labels: `direction`
//! only (the request carries no device).

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::decode::NetRequest;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabel {
    pub direction: &'static str,
}

type HistFamily = Family<DirLabel, Histogram, fn() -> Histogram>;

fn occupancy_histogram() -> Histogram {
    // 1 µs … ~1 s
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1e-6, 2.0, 21))
}

pub struct NetMetrics {
    seconds: HistFamily,
    bytes: Family<DirLabel, Counter>,
    occupancy: Family<DirLabel, Counter<f64, AtomicU64>>,
    sampled: Counter<f64, AtomicU64>,
}

const DIRECTIONS: [&str; 2] = ["send", "recv"];

impl NetMetrics {
    pub fn register(r: &mut Registry) -> NetMetrics {
        let m = NetMetrics {
            seconds: Family::new_with_constructor(occupancy_histogram as fn() -> Histogram),
            bytes: Family::default(),
            occupancy: Family::default(),
            sampled: Counter::default(),
        };
        r.register("stepwise_net_request_seconds", "Occupancy T of a sampled NCCL network request (post to first successful test)", m.seconds.clone());
        r.register("stepwise_net_request_bytes", "Bytes of the sampled NCCL network requests that completed", m.bytes.clone());
        r.register(
            "stepwise_net_request_occupancy_seconds",
            "Sum of the sampled requests' occupancy; divided by stepwise_net_sampled_seconds_total it is the mean number in flight",
            m.occupancy.clone(),
        );
        r.register("stepwise_net_sampled_seconds", "Time the sampled NCCL network probes were attached", m.sampled.clone());
        for direction in DIRECTIONS {
            let l = DirLabel { direction };
            drop(m.seconds.get_or_create(&l));
            drop(m.bytes.get_or_create(&l));
            drop(m.occupancy.get_or_create(&l));
        }
        m
    }

    pub fn observe(&self, n: &NetRequest) {
        let l = DirLabel { direction: DIRECTIONS[usize::from(!n.send)] };
        let t = n.completed_ns.saturating_sub(n.posted_ns) as f64 * 1e-9;
        self.seconds.get_or_create(&l).observe(t);
        self.occupancy.get_or_create(&l).inc_by(t);
        if let Some(b) = n.bytes {
            self.bytes.get_or_create(&l).inc_by(b);
        }
    }

    /// A sampled window of `seconds` closed.
    pub fn window(&self, seconds: f64) {
        self.sampled.inc_by(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn littles_law_from_the_exported_sums() {
        let mut r = Registry::default();
        let m = NetMetrics::register(&mut r);
        // Window 1 s; 4 requests of 1 MiB in flight at a time, each 20 ms: 200 per second.
        for i in 0..200u64 {
            m.observe(&NetRequest { pid: 1, send: true, bytes: Some(1 << 20), posted_ns: i * 5_000_000, completed_ns: i * 5_000_000 + 20_000_000 });
        }
        m.observe(&NetRequest { pid: 1, send: false, bytes: None, posted_ns: 0, completed_ns: 1_000 });
        m.window(1.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        let v = |name: &str| text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).unwrap_or(f64::NAN);
        let n = v("stepwise_net_request_occupancy_seconds_total{direction=\"send\"}") / v("stepwise_net_sampled_seconds_total");
        assert!((n - 4.0).abs() < 1e-9, "N = {n}");
        assert_eq!(v("stepwise_net_request_bytes_total{direction=\"send\"}"), 200.0 * f64::from(1 << 20));
        assert_eq!(v("stepwise_net_request_seconds_count{direction=\"send\"}"), 200.0);
        assert_eq!(v("stepwise_net_request_seconds_count{direction=\"recv\"}"), 1.0);
    }
}
