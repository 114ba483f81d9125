//! `agent model allreduce` (docs/models.md §1.3–§1.6).

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::table::{kv, title, Table};
use super::Output;
use crate::model::collective::{allreduce as run_allreduce, break_even_local, Algo, AllReduceReport, Cluster};
use crate::model::ModelError;
use crate::units::{parse_bytes_pos, parse_rate_pos, parse_seconds, Bytes, BytesPerSecond, Seconds};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AlgoArg {
    Ring,
    Interleaved,
    Hierarchical,
    InNetwork,
}

impl From<AlgoArg> for Algo {
    fn from(a: AlgoArg) -> Algo {
        match a {
            AlgoArg::Ring => Algo::Ring,
            AlgoArg::Interleaved => Algo::Interleaved,
            AlgoArg::Hierarchical => Algo::Hierarchical,
            AlgoArg::InNetwork => Algo::InNetwork,
        }
    }
}

/// The cluster flags shared by `allreduce` and `step`; unset flags come from the preset.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Start from the reference PCIe box (4 GPUs at 32 GB/s, 2 × 25 GB/s ports behind one
    /// 32 GB/s slot) instead of the HGX pair.
    #[arg(long)]
    pub pcie_reference: bool,
    /// Servers [default: 2].
    #[arg(long, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub hosts: Option<usize>,
    /// GPUs per server [default: 8].
    #[arg(long, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub gpus_per_host: Option<usize>,
    /// Per-rank gradient size.
    #[arg(long, default_value = "192MiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub bytes: Bytes,
    /// Bandwidth per NIC port per direction [default: 50GB/s].
    #[arg(long, value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub nic: Option<BytesPerSecond>,
    /// Local (NVLink) bandwidth per GPU per direction [default: 450GB/s].
    #[arg(long, value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub local: Option<BytesPerSecond>,
    /// Launch latency per round [default: 0.833us].
    #[arg(long, value_parser = parse_seconds, allow_hyphen_values = true)]
    pub alpha: Option<Seconds>,
    /// NIC ports per server [default: one per GPU]; fewer than GPUs = ports shared by all.
    #[arg(long, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub ports_per_host: Option<usize>,
    /// A PCIe slot all ports of a server sit behind, per direction [default: none].
    #[arg(long, value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub slot: Option<BytesPerSecond>,
}

impl ClusterArgs {
    pub fn cluster(&self) -> Cluster {
        let base = if self.pcie_reference { Cluster::pcie_reference() } else { Cluster::hgx() };
        let gpus_per_host = self.gpus_per_host.unwrap_or(base.gpus_per_host);
        let ports_default = if self.gpus_per_host.is_some() && !self.pcie_reference { gpus_per_host } else { base.ports_per_host };
        Cluster {
            hosts: self.hosts.unwrap_or(base.hosts),
            gpus_per_host,
            nic: self.nic.unwrap_or(base.nic),
            local: self.local.unwrap_or(base.local),
            ports_per_host: self.ports_per_host.unwrap_or(ports_default),
            slot: self.slot.or(base.slot),
            alpha: self.alpha.unwrap_or(base.alpha),
        }
    }
}

#[derive(Debug, Args)]
pub struct AllreduceArgs {
    /// Algorithm and placement.
    #[arg(long, value_enum, default_value = "ring")]
    pub algo: AlgoArg,
    /// All algorithms side by side.
    #[arg(long)]
    pub compare: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Serialize)]
struct Single<'a> {
    cluster: &'a Cluster,
    #[serde(flatten)]
    report: &'a AllReduceReport,
    break_even_local: Option<BytesPerSecond>,
}

#[derive(Serialize)]
struct Compare<'a> {
    cluster: &'a Cluster,
    bytes: Bytes,
    algorithms: &'a [AllReduceReport],
    break_even_local: Option<BytesPerSecond>,
}

fn describe(c: &Cluster, m: Bytes) -> String {
    let slot = c.slot.map_or(String::new(), |s| format!(", ports behind a {s} slot"));
    format!(
        "{} servers × {} GPUs, {} per rank, local {}, {} NIC port(s) per server at {}{slot}, α = {}",
        c.hosts, c.gpus_per_host, m, c.local, c.ports_per_host, c.nic, c.alpha
    )
}

fn break_even_line(b: Option<BytesPerSecond>, c: &Cluster) -> String {
    match b {
        Some(b) => format!(
            "{b} (hierarchy beats the flat ring above it; this box has {}: {})",
            c.local,
            if c.local.0 > b.0 { "hierarchy wins" } else { "flat ring wins" }
        ),
        None => "none (the cross-server phase alone is slower than the flat ring)".to_string(),
    }
}

/// Consecutive rounds with the same phase, time and bottleneck, as one row.
fn rounds_table(r: &AllReduceReport) -> String {
    let mut t = Table::new(&["rounds", "phase", "time/round", "bottleneck", "bytes on it", "its bandwidth"]);
    let mut i = 0;
    while i < r.rounds.len() {
        let a = &r.rounds[i];
        let mut j = i + 1;
        while j < r.rounds.len() && r.rounds[j].phase == a.phase && r.rounds[j].bottleneck == a.bottleneck && (r.rounds[j].time.0 - a.time.0).abs() <= 1e-15 {
            j += 1;
        }
        let range = if j - i == 1 { format!("{}", i + 1) } else { format!("{}–{}", i + 1, j) };
        t.row(vec![range, a.phase.to_string(), a.time.to_string(), a.bottleneck.clone(), a.bottleneck_bytes.to_string(), a.bottleneck_bandwidth.to_string()]);
        i = j;
    }
    t.render()
}

pub fn allreduce(a: AllreduceArgs) -> Result<Output, ModelError> {
    let c = a.cluster.cluster();
    let m = a.cluster.bytes;
    let be = break_even_local(&c, m)?;
    if a.compare {
        let reports = Algo::ALL.iter().map(|&al| run_allreduce(&c, m, al)).collect::<Result<Vec<_>, _>>()?;
        let flat = &reports[0];
        let mut t = Table::new(&["algorithm", "rounds", "total", "vs ring", "cross-server", "max per NIC", "latency part"]);
        for r in &reports {
            t.row(vec![
                r.algo.name().to_string(),
                r.rounds.len().to_string(),
                r.total.to_string(),
                format!("{:+.0} %", (r.total / flat.total - 1.0) * 100.0),
                r.cross_host_bytes.to_string(),
                r.max_nic_bytes.to_string(),
                r.latency.to_string(),
            ]);
        }
        let text = format!(
            "{}{}\n{}",
            title(&format!("AllReduce, all algorithms: {}", describe(&c, m))),
            t.render(),
            kv(&[("break-even local bandwidth", break_even_line(be, &c))])
        );
        return Ok(Output::new(&Compare { cluster: &c, bytes: m, algorithms: &reports, break_even_local: be }, text));
    }
    let r = run_allreduce(&c, m, a.algo.into())?;
    let per_nic: Vec<String> = r.nic_tx_bytes.iter().map(ToString::to_string).collect();
    let text = format!(
        "{}{}\n{}",
        title(&format!("AllReduce, {}: {}", r.algo.name(), describe(&c, m))),
        rounds_table(&r),
        kv(&[
            ("total", format!("{} ({} rounds, {} of it launch latency)", r.total, r.rounds.len(), r.latency)),
            ("cross-server bytes", format!("{} (both directions)", r.cross_host_bytes)),
            ("bytes sent", format!("{} per rank (max), {} in all", r.max_rank_bytes, r.total_bytes)),
            ("max bytes per NIC", format!("{} sent", r.max_nic_bytes)),
            ("bytes sent per NIC", per_nic.join(" ")),
            ("break-even local bandwidth", break_even_line(be, &c)),
        ])
    );
    Ok(Output::new(&Single { cluster: &c, report: &r, break_even_local: be }, text))
}
