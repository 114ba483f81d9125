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
//! and `nic`: the request carries no device, so it is the NIC its process is linked to
//! (`links`: NCCL_IB_HCA, the process's sockets), `several` when the process uses more than
//! one, `unknown` before its link is known.
//!
//! Per communicator, from the NCCL profiler plugin's proxy steps ([`ProxyMetrics`]): every
//! network request of the processes that loaded the plugin, not a sample —
//! `stepwise_proxy_requests_total`, `stepwise_proxy_request_bytes_total`,
//! `stepwise_proxy_request_occupancy_seconds_total{comm, direction}` (SendWait / RecvWait
//! time). rate(occupancy) is N, the mean requests in flight; occupancy / requests is T;
//! bytes / requests is m; rate(bytes) is N·m/T; rate(requests) the completions reaped per
//! second. `comm` is NCCL's communicator hash (16 hex digits), at most
//! [`crate::labels::MAX_COMM_LABELS`] at a time per host, then `other`.

use crate::export::reference::RegisterSampled as _;
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::decode::NetRequest;

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabel {
    pub direction: &'static str,
    pub nic: String,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommDir {
    pub comm: String,
    pub direction: &'static str,
}

type HistFamily = Family<DirLabel, Histogram, fn() -> Histogram>;

/// The `nic` label of a process's requests (see the module docs).
pub fn nic_label(links: &[crate::timeline::links::ProcessLink], pid: u32) -> String {
    let nics = links.iter().find(|l| l.pid == pid).map(|l| &l.nics);
    match nics.map(|n| (n.len(), n.iter().next())) {
        Some((1, Some(nic))) => nic.clone(),
        Some((n, _)) if n > 1 => "several".into(),
        _ => "unknown".into(),
    }
}

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
        r.register_sampled("stepwise_net_request_seconds", "Occupancy T of a sampled NCCL network request (post to first successful test)", m.seconds.clone());
        r.register_sampled("stepwise_net_request_bytes", "Bytes of the sampled NCCL network requests that completed", m.bytes.clone());
        r.register_sampled(
            "stepwise_net_request_occupancy_seconds",
            "Sum of the sampled requests' occupancy; divided by stepwise_net_sampled_seconds_total it is the mean number in flight",
            m.occupancy.clone(),
        );
        r.register_sampled("stepwise_net_sampled_seconds", "Time the sampled NCCL network probes were attached", m.sampled.clone());
        m
    }

    /// A sampled request of a process whose NIC label is `nic` ([`nic_label`]).
    pub fn observe(&self, n: &NetRequest, nic: String) {
        let l = DirLabel { direction: DIRECTIONS[usize::from(!n.send)], nic };
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

/// The profiler plugin's proxy-step requests per communicator (see the module docs).
#[derive(Clone, Default)]
pub struct ProxyMetrics {
    requests: Family<CommDir, Counter>,
    bytes: Family<CommDir, Counter>,
    occupancy: Family<CommDir, Counter<f64, AtomicU64>>,
    labels: std::sync::Arc<crate::labels::CommLabels>,
}

impl ProxyMetrics {
    pub fn register(r: &mut Registry) -> ProxyMetrics {
        let m = ProxyMetrics::default();
        r.register_sampled(
            "stepwise_proxy_requests",
            "Network requests NCCL's proxy completed (profiler plugin: send steps that entered SendWait, receives that left RecvWait)",
            m.requests.clone(),
        );
        r.register_sampled("stepwise_proxy_request_bytes", "Bytes of those requests (NCCL's transSize)", m.bytes.clone());
        r.register_sampled(
            "stepwise_proxy_request_occupancy_seconds",
            "Time those requests were posted to the network (SendWait / RecvWait); rate() is the mean number in flight",
            m.occupancy.clone(),
        );
        m
    }

    /// One collective's record from the plugin.
    pub fn observe(&self, r: &nccl_profiler::wire::Record) {
        if r.requests == [0, 0] {
            return;
        }
        let (comm, old) = self.labels.label(r.comm_hash);
        if let Some(old) = old.map(crate::labels::LabelValue::text) {
            for direction in DIRECTIONS {
                let l = CommDir { comm: old.clone(), direction };
                self.requests.remove(&l);
                self.bytes.remove(&l);
                self.occupancy.remove(&l);
            }
        }
        // proxy_wait_ns: [send_gpu_wait, send_peer_wait, send_wait, recv_wait, ...].
        for (d, direction) in DIRECTIONS.into_iter().enumerate() {
            let l = CommDir { comm: comm.clone(), direction };
            self.requests.get_or_create(&l).inc_by(r.requests[d]);
            self.bytes.get_or_create(&l).inc_by(r.request_bytes[d]);
            self.occupancy.get_or_create(&l).inc_by(r.proxy_wait_ns[2 + d] as f64 * 1e-9);
        }
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
            m.observe(
                &NetRequest { pid: 1, send: true, bytes: Some(1 << 20), posted_ns: i * 5_000_000, completed_ns: i * 5_000_000 + 20_000_000 },
                "ib0".into(),
            );
        }
        m.observe(&NetRequest { pid: 1, send: false, bytes: None, posted_ns: 0, completed_ns: 1_000 }, "ib0".into());
        m.window(1.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        let v = |name: &str| text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).unwrap_or(f64::NAN);
        let n = v("stepwise_net_request_occupancy_seconds_total{direction=\"send\",nic=\"ib0\"}") / v("stepwise_net_sampled_seconds_total");
        assert!((n - 4.0).abs() < 1e-9, "N = {n}");
        assert_eq!(v("stepwise_net_request_bytes_total{direction=\"send\",nic=\"ib0\"}"), 200.0 * f64::from(1 << 20));
        assert_eq!(v("stepwise_net_request_seconds_count{direction=\"send\",nic=\"ib0\"}"), 200.0);
        assert_eq!(v("stepwise_net_request_seconds_count{direction=\"recv\",nic=\"ib0\"}"), 1.0);
    }

    #[test]
    fn a_request_takes_the_nic_its_process_is_linked_to() {
        use crate::timeline::links::ProcessLink;
        let link = |pid: u32, nics: &[&str]| ProcessLink { pid, nics: nics.iter().map(|n| n.to_string()).collect(), ..Default::default() };
        let links = [link(1, &["mlx5_0"]), link(2, &["mlx5_0", "mlx5_1"]), link(3, &[])];
        assert_eq!(nic_label(&links, 1), "mlx5_0");
        assert_eq!(nic_label(&links, 2), "several");
        assert_eq!(nic_label(&links, 3), "unknown", "linked to no NIC yet");
        assert_eq!(nic_label(&links, 4), "unknown", "not linked");
    }

    #[test]
    fn proxy_requests_per_communicator_give_n_m_and_t() {
        let mut r = Registry::default();
        let m = ProxyMetrics::register(&mut r);
        // Two collectives of communicator 0xabc, each 64 send requests of 16 KiB held 2 ms
        // (SendWait), and 64 receives held 3 ms; one collective of another communicator.
        let rec = |comm: u64| nccl_profiler::wire::Record {
            comm_hash: comm,
            requests: [64, 64],
            request_bytes: [64 << 14, 64 << 14],
            proxy_wait_ns: [0, 0, 64 * 2_000_000, 64 * 3_000_000, 0, 0],
            ..Default::default()
        };
        m.observe(&rec(0xabc));
        m.observe(&rec(0xabc));
        m.observe(&rec(0xdef));
        m.observe(&nccl_profiler::wire::Record { comm_hash: 0x123, ..Default::default() });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        let v = |name: &str, comm: &str, dir: &str| {
            let key = format!("{name}{{comm=\"{comm}\",direction=\"{dir}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN)
        };
        let c = "0000000000000abc";
        let (n, b, occ) = (
            v("stepwise_proxy_requests_total", c, "send"),
            v("stepwise_proxy_request_bytes_total", c, "send"),
            v("stepwise_proxy_request_occupancy_seconds_total", c, "send"),
        );
        assert_eq!((n, b / n), (128.0, 16384.0), "m = 16 KiB");
        assert!((occ / n - 0.002).abs() < 1e-12, "T = 2 ms: {}", occ / n);
        assert!((v("stepwise_proxy_request_occupancy_seconds_total", c, "recv") / 128.0 - 0.003).abs() < 1e-12, "recv T = 3 ms");
        assert_eq!(v("stepwise_proxy_requests_total", "0000000000000def", "send"), 64.0);
        assert!(!text.contains("0000000000000123"), "a collective without proxy requests makes no series:\n{text}");
    }
}
