//! Metrics of the collective probes. Cardinality is bounded: library and op come from fixed
//! tables (user ops are capped), ranks are capped at [`crate::labels::MAX_RANK_LABELS`] distinct values, communicators are
//! never labels.

use crate::export::reference::RegisterSampled as _;
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::decode::Call;

const MAX_USER_OPS: usize = 32;

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub library: &'static str,
    pub op: String,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankLabels {
    pub rank: String,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LibLabels {
    pub library: &'static str,
}

#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// `stepwise_rank_info`: who a traced process is (one series per process, removed when it
/// exits, so bounded by the processes on the node).
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankInfoLabels {
    pub rank: String,
    pub local_rank: String,
    /// The job's identity (`STEPWISE_JOB=…`, `TORCHELASTIC_RUN_ID=…`, …; the OTLP spans'
    /// `stepwise.job`). Not `job`, `k8s_*` rather than `pod`/`namespace`, `container_id` rather
    /// than `container`: those are target labels every Prometheus (`job`) or the Prometheus
    /// Operator (the rest) sets to the agent's own, which would rename these to `exported_*`
    /// (docs/prometheus-operator.md).
    pub stepwise_job: String,
    pub k8s_pod_name: String,
    pub k8s_namespace_name: String,
    /// The container ID's first 12 hex digits (as `crictl ps` shows it).
    pub container_id: String,
    /// The netdev its traffic uses (`several` when more than one; empty until linked).
    pub nic: String,
    /// Its GPU's PCI address (sysfs spelling, `0000:1b:00.0`), from the profiler plugin;
    /// empty when unknown.
    pub gpu: String,
    /// The same address as dcgm-exporter's `pci_bus_id` spells it (`00000000:1B:00.0`), for
    /// a join without `label_replace` (docs/dcgm-join.md); empty when unknown.
    pub pci_bus_id: String,
    /// The GPU's UUID (`GPU-…`, dcgm-exporter's `UUID`) where the NVIDIA driver exposes it
    /// under the configured proc root; empty otherwise.
    pub gpu_uuid: String,
}

impl RankInfoLabels {
    fn of(p: &super::decode::ProcInfo) -> RankInfoLabels {
        let opt = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_default();
        let pod = p.pod.as_ref();
        RankInfoLabels {
            rank: opt(p.world_rank()),
            local_rank: opt(p.local_rank()),
            stepwise_job: p.job(),
            k8s_pod_name: pod.and_then(|p| p.name.clone()).unwrap_or_default(),
            k8s_namespace_name: pod.and_then(|p| p.namespace.clone()).unwrap_or_default(),
            container_id: pod.and_then(|p| p.container_id.as_ref()).map(|c| c.chars().take(12).collect()).unwrap_or_default(),
            nic: p.nic.clone(),
            gpu: p.gpu.clone(),
            pci_bus_id: super::gpu_id::dcgm_pci_bus_id(&p.gpu),
            gpu_uuid: p.gpu_uuid.clone(),
        }
    }
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
    pub net_requests_unsampled: Counter,
    pub clock_error: Gauge<f64, AtomicU64>,
    pub comms: Gauge,
    pub processes: Gauge,
    rank_info: Family<RankInfoLabels, Gauge>,
    rank_labels: crate::labels::RankLabels,
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
            net_requests_unsampled: Counter::default(),
            clock_error: Gauge::default(),
            comms: Gauge::default(),
            processes: Gauge::default(),
            rank_info: Family::default(),
            rank_labels: Default::default(),
            user_ops: Default::default(),
        };
        r.register_sampled("stepwise_collective_calls", "Collective library calls seen, by library and operation", m.calls.clone());
        r.register_sampled("stepwise_collective_bytes", "Payload bytes of collective calls (count x element size)", m.bytes.clone());
        r.register_sampled("stepwise_collective_duration_seconds", "Time inside one collective call (entry to return)", m.duration.clone());
        r.register_sampled(
            "stepwise_rank_collective_seconds",
            "Seconds inside collective calls, by global rank of the processes on this host",
            m.rank_seconds.clone(),
        );
        r.register_sampled("stepwise_collective_aborted_calls", "Calls still open when their process exited (killed inside a collective)", m.aborted.clone());
        r.register_sampled("stepwise_probe_attached", "Probed functions currently attached, by library", m.attached.clone());
        r.register_sampled("stepwise_probe_decode_errors", "Probe events that could not be decoded, by kind", m.decode_errors.clone());
        r.register_sampled("stepwise_probe_events", "Probe events received from the kernel", m.events.clone());
        r.register_sampled("stepwise_probe_drops", "Probe events dropped in the kernel because the ring buffer was full", m.drops.clone());
        r.register_sampled("stepwise_net_requests", "Completed requests of NCCL's network transport seen in sampled windows", m.net_requests.clone());
        r.register_sampled(
            "stepwise_net_requests_unsampled",
            "Requests of NCCL's network transport seen while a closed window's probes were torn down (posted outside any sampled window): not counted",
            m.net_requests_unsampled.clone(),
        );
        r.register_sampled("stepwise_clock_error_seconds", "Error bound of monotonic to wall-clock conversion (adjtimex maxerror)", m.clock_error.clone());
        r.register_sampled("stepwise_collective_communicators", "Communicators currently tracked", m.comms.clone());
        r.register_sampled("stepwise_probe_processes", "Traced processes currently selected", m.processes.clone());
        r.register_sampled(
            "stepwise_rank_info",
            "A traced process: its global and local rank, job, Kubernetes pod, namespace and container, the NIC its traffic uses, its GPU's PCI address (sysfs and dcgm-exporter spellings) and UUID (1 while it runs)",
            m.rank_info.clone(),
        );
        m
    }

    pub fn set_rank_info(&self, p: &super::decode::ProcInfo) {
        self.rank_info.get_or_create(&RankInfoLabels::of(p)).set(1);
    }

    /// Puts each process's linked NIC ([`super::net_metrics::nic_label`]) and its GPU (the
    /// plugin's, `gpus`) on its `stepwise_rank_info` series, replacing the series whose labels
    /// changed. A GPU's UUID is read from the NVIDIA driver under `proc_root` when its
    /// address changes.
    pub fn label_nics<'a>(
        &self,
        procs: impl Iterator<Item = (&'a u32, &'a mut super::decode::ProcInfo)>,
        links: &[crate::timeline::links::ProcessLink],
        gpus: &std::collections::BTreeMap<u32, String>,
        proc_root: &std::path::Path,
    ) {
        for (pid, info) in procs {
            let nic = match super::net_metrics::nic_label(links, *pid) {
                n if n == "unknown" => String::new(),
                n => n,
            };
            let gpu = gpus.get(pid).cloned().unwrap_or_default();
            if nic != info.nic || gpu != info.gpu {
                self.forget_rank_info(info);
                info.nic = nic;
                if gpu != info.gpu {
                    info.gpu_uuid = super::gpu_id::nvidia_uuid(proc_root, &gpu);
                }
                info.gpu = gpu;
                self.set_rank_info(info);
            }
        }
    }

    pub fn forget_rank_info(&self, p: &super::decode::ProcInfo) {
        self.rank_info.remove(&RankInfoLabels::of(p));
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
            let (rank, old) = self.rank_labels.label(r);
            if let Some(old) = old {
                self.rank_seconds.remove(&RankLabels { rank: old.to_string() });
            }
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::timeline::links::ProcessLink;

    fn info_lines(r: &Registry) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, r).expect("encode");
        text.lines().filter(|l| l.starts_with("stepwise_rank_info{")).map(String::from).collect()
    }

    fn link(pid: u32, nics: &[&str]) -> ProcessLink {
        ProcessLink { host: "h".into(), pid, nics: nics.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>(), how: BTreeMap::new(), complete: true }
    }

    #[test]
    fn rank_info_names_the_nic_once_linked_and_replaces_its_series() {
        let mut r = Registry::default();
        let m = CollectiveMetrics::register(&mut r);
        let env = |rank: &str| [("OMPI_COMM_WORLD_RANK".to_string(), rank.to_string())].into_iter().collect();
        let mut procs: BTreeMap<u32, super::super::decode::ProcInfo> = [
            (10, super::super::decode::ProcInfo { env: env("0"), ..Default::default() }),
            (11, super::super::decode::ProcInfo { env: env("1"), ..Default::default() }),
        ]
        .into_iter()
        .collect();
        for p in procs.values() {
            m.set_rank_info(p);
        }
        assert!(info_lines(&r).iter().all(|l| l.contains("nic=\"\"")), "not linked yet: {:?}", info_lines(&r));
        m.label_nics(procs.iter_mut(), &[link(10, &["rail0"]), link(11, &["rail1", "rail2"])], &BTreeMap::new(), std::path::Path::new("/nonexistent"));
        let lines = info_lines(&r);
        assert_eq!(lines.len(), 2, "one series per process: {lines:?}");
        assert!(lines.iter().any(|l| l.contains("rank=\"0\"") && l.contains("nic=\"rail0\"")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("rank=\"1\"") && l.contains("nic=\"several\"")), "{lines:?}");
        // Rank 0 moves to another NIC; an unlinked process goes back to empty.
        m.label_nics(procs.iter_mut(), &[link(10, &["rail3"])], &BTreeMap::new(), std::path::Path::new("/nonexistent"));
        let lines = info_lines(&r);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("rank=\"0\"") && l.contains("nic=\"rail3\"")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("rank=\"1\"") && l.contains("nic=\"\"")), "{lines:?}");
        // Rank 1's plugin reports its GPU: the same series, now with it.
        let gpus: BTreeMap<u32, String> = [(11, "0000:52:00.0".to_string())].into();
        let proc_root = tempfile::tempdir().expect("tempdir");
        let dir = proc_root.path().join("driver/nvidia/gpus/0000:52:00.0");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("information"), "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-0a1b2c3d-0000-1111-2222-333344445555\n").expect("write");
        m.label_nics(procs.iter_mut(), &[link(10, &["rail3"])], &gpus, proc_root.path());
        let lines = info_lines(&r);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let one = lines.iter().find(|l| l.contains("rank=\"1\"")).expect("rank 1");
        assert!(one.contains("gpu=\"0000:52:00.0\""), "{one}");
        // dcgm-exporter's spelling and the driver's UUID, for the join of docs/dcgm-join.md.
        assert!(one.contains("pci_bus_id=\"00000000:52:00.0\""), "{one}");
        assert!(one.contains("gpu_uuid=\"GPU-0a1b2c3d-0000-1111-2222-333344445555\""), "{one}");
        assert!(lines.iter().any(|l| l.contains("rank=\"0\"") && l.contains("gpu=\"\"")), "{lines:?}");
    }
}
