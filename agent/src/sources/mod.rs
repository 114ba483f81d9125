//! Inputs. One folder per source; each owns its parsing, its metrics and its tests, and
//! adding one touches nothing central beyond its line in [`build_sources`].

pub mod by_unit;
pub mod collectives;
pub mod counter;
pub mod ethtool;
pub mod fsread;
pub mod netdev;
pub mod nic;
pub mod nofile;
pub mod qdisc;
pub mod ras;
pub mod rdma;
pub mod select;
pub mod sockpath;
pub mod tcp;

use crate::export::reference::RegisterSampled as _;
use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

pub use select::Selector;

/// Labels of `stepwise_errors_total`.
#[derive(Default, Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub source: &'static str,
    pub kind: &'static str,
}

/// `stepwise_errors_total{source,kind}`: every skipped value, failed read or vanished device.
/// Cheap to clone; all clones count into the same family.
#[derive(Clone, Default)]
pub struct Errors(Family<ErrorLabels, Counter>);

impl Errors {
    pub fn register(registry: &mut Registry) -> Self {
        let e = Errors::default();
        registry.register_sampled("stepwise_errors", "Errors by source and kind (bad values, failed reads, vanished devices)", e.0.clone());
        e
    }
    pub fn inc(&self, source: &'static str, kind: &'static str) {
        self.0.get_or_create(&ErrorLabels { source, kind }).inc();
    }
    pub fn get(&self, source: &'static str, kind: &'static str) -> u64 {
        self.0.get_or_create(&ErrorLabels { source, kind }).get()
    }
}

/// Error kinds used as `kind` label values, shared so names stay consistent.
pub mod kind {
    /// A file or attribute could not be read (I/O error other than "not found").
    pub const READ: &str = "read";
    /// A value did not parse (garbage, empty, wrong format).
    pub const PARSE: &str = "parse";
    /// The kernel said the value is not available (`N/A (no PMA)`).
    pub const NOT_AVAILABLE: &str = "not_available";
    /// A device present in the previous sweep is gone.
    pub const VANISHED: &str = "vanished";
    /// A device was skipped by probe-safe mode after failing reads.
    pub const PROBE_SAFE_SKIP: &str = "probe_safe_skip";
    /// A netlink request failed.
    pub const NETLINK: &str = "netlink";
    /// An ioctl failed.
    pub const IOCTL: &str = "ioctl";
    /// A counter was reset or saturated between two sweeps.
    pub const COUNTER_RESET: &str = "counter_reset";
    /// A reading was impossible (wider than the counter, or more than the link could carry
    /// since the previous one): not added (see [`counter::Guarded`](super::counter::Guarded)).
    pub const COUNTER_GLITCH: &str = "counter_glitch";
}

/// What every source gets at construction.
#[derive(Clone)]
pub struct SourceContext {
    /// Root under which every sysfs read happens (`--sysfs-root`, default `/sys`).
    pub sysfs_root: PathBuf,
    pub selector: Selector,
    pub errors: Errors,
    /// Sampling interval, for sources that must respect a hardware cache lifetime.
    pub interval: Duration,
    /// Rail overrides from config (RDMA device or netdev name → rail); see `topology`.
    pub rails: std::collections::BTreeMap<String, u32>,
    /// The processes the collectives source traces, whose own TCP bytes the tcp source
    /// counts per NIC.
    pub owners: tcp::own::Owners,
}

/// Outcome of one sweep, for logs and `/api/v1/status`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SweepReport {
    /// Devices (NIC ports, netdevs, qdiscs) read in this sweep.
    pub devices: usize,
    /// Counter values read.
    pub values: usize,
    /// Values skipped (garbage, N/A, unreadable).
    pub skipped: usize,
}

/// Failure of a whole source for one sweep (individual bad values are counted, not returned).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{source_name}: {what}: {err}")]
    Io {
        source_name: &'static str,
        what: String,
        #[source]
        err: std::io::Error,
    },
    #[error("{source_name}: not available on this host: {reason}")]
    Unavailable { source_name: &'static str, reason: String },
    /// Nothing to read on this host (no RDMA driver, no device): not a failure. The sampler
    /// exports `stepwise_source_up` 1 and `stepwise_source_devices` 0, so
    /// `StepwiseSourceDown` does not fire on a node that simply has no such hardware.
    #[error("{source_name}: not available on this host (absent, not down): {reason}")]
    Absent { source_name: &'static str, reason: String },
}

impl SourceError {
    /// The source has nothing to read here rather than failing to read it.
    pub fn is_absent(&self) -> bool {
        matches!(self, SourceError::Absent { .. })
    }
}

/// A counter source sampled every interval.
pub trait Source: Send + 'static {
    /// Stable name, used as the `source` label.
    fn name(&self) -> &'static str;
    /// Reads everything once and updates the source's own metrics.
    fn sweep(&mut self) -> Result<SweepReport, SourceError>;
    /// A JSON description of what the source currently sees (for `/api/v1/status`).
    fn status(&self) -> serde_json::Value;
    /// Cumulative per-NIC counters for step windows (see [`nic`]). Default: none.
    fn nic_samples(&self) -> Vec<nic::NicPart> {
        Vec::new()
    }
    /// The fast lane (`daemon::fast`): re-reads, of the NICs in `nics` only, the counters
    /// attribution uses, between full sweeps. `false` when the source has no fast read: its
    /// last sweep's values stand (cumulative, they stay consistent; their changes land at
    /// the next full sweep).
    fn fast_sweep(&mut self, _nics: &BTreeSet<String>) -> bool {
        false
    }
    /// Whether the last fast read found links the lane does not read yet (a job's new
    /// connections): the lane takes every source's [`Source::nic_samples`] as at a full
    /// sweep. Reset by the call.
    fn fast_found_links(&mut self) -> bool {
        false
    }
    /// Seconds of CPU the last fast reads spent on work the source charges to its own budget
    /// (a dump it would otherwise have made at the next sweep): the lane's budget leaves it
    /// out. Reset by the call.
    fn fast_cpu_charged_elsewhere(&mut self) -> f64 {
        0.0
    }
    /// [`Source::nic_samples`] of the NICs in `nics` only.
    fn nic_samples_of(&self, nics: &BTreeSet<String>) -> Vec<nic::NicPart> {
        self.nic_samples().into_iter().filter(|(i, _)| nics.contains(&i.name)).collect()
    }
}

/// The sources enabled by configuration, each registering its metrics.
pub fn build_sources(cfg: &crate::config::Config, ctx: &SourceContext, registry: &mut Registry) -> Vec<Box<dyn Source>> {
    let mut out: Vec<Box<dyn Source>> = Vec::new();
    if cfg.sources.rdma {
        out.push(Box::new(rdma::RdmaSource::new(ctx.clone(), registry).with_xmit_wait_tick_seconds(cfg.steps.params.xmit_wait_tick_seconds)));
    }
    if cfg.sources.ethtool {
        out.push(Box::new(ethtool::EthtoolSource::new(ctx.clone(), registry).with_pfc_priorities(cfg.sources.pfc_priorities.clone())));
    }
    if cfg.sources.netdev {
        out.push(Box::new(netdev::NetdevSource::new(ctx.clone(), registry)));
    }
    if cfg.sources.qdisc {
        out.push(Box::new(qdisc::QdiscSource::new(ctx.clone(), registry).with_per_queue(cfg.sources.qdisc_per_queue)));
    }
    if cfg.sources.tcp {
        out.push(Box::new(tcp::TcpSource::new(ctx.clone(), registry).with_cpu_budget(cfg.sources.tcp_cpu_budget)));
    }
    out
}

/// Nominal rate of a netdev in bytes/s from sysfs `speed` (Mb/s); `None` when unknown
/// (veth and virtual devices report -1 or nothing).
pub fn nic_rate(sysfs_root: &std::path::Path, netdev: &str) -> Option<f64> {
    let s = fsread::read_to_string(&sysfs_root.join("class/net").join(netdev).join("speed")).ok()?;
    let mbps: i64 = s.trim().parse().ok()?;
    (mbps > 0).then(|| mbps as f64 * 1e6 / 8.0)
}
