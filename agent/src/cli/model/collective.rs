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

/// One row per group of identical rounds.
fn rounds_table(r: &AllReduceReport) -> String {
    let mut t = Table::new(&["rounds", "phase", "time/round", "bottleneck", "bytes on it", "its bandwidth"]);
    for g in &r.round_groups {
        let range = if g.count == 1 { format!("{}", g.first + 1) } else { format!("{}–{}", g.first + 1, g.first + g.count) };
        t.row(vec![range, g.phase.to_string(), g.time.to_string(), g.bottleneck.clone(), g.bottleneck_bytes.to_string(), g.bottleneck_bandwidth.to_string()]);
    }
    t.render()
}

/// Runs of equal values as `v ×n` (`0 B ×7 360 MiB 0 B ×7 360 MiB` on two HGX hosts); past 16
/// runs, each distinct value once with how many NICs sent it (`--json` lists every NIC).
fn runs(values: &[Bytes]) -> String {
    let show = |v: Bytes, n: usize| if n == 1 { v.to_string() } else { format!("{v} ×{n}") };
    let mut out: Vec<(Bytes, usize)> = Vec::new();
    for &v in values {
        match out.last_mut() {
            Some((last, n)) if last.0 == v.0 => *n += 1,
            _ => out.push((v, 1)),
        }
    }
    if out.len() <= 16 {
        return out.into_iter().map(|(v, n)| show(v, n)).collect::<Vec<_>>().join(" ");
    }
    let mut sorted: Vec<f64> = values.iter().map(|v| v.0).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut distinct: Vec<(Bytes, usize)> = Vec::new();
    for v in sorted {
        match distinct.last_mut() {
            Some((d, n)) if d.0 == v => *n += 1,
            _ => distinct.push((Bytes(v), 1)),
        }
    }
    if distinct.len() > 16 {
        let (max, min) = (distinct[0].0, distinct[distinct.len() - 1].0);
        return format!("{min} … {max} over {} NICs, {} different values (--json lists each NIC)", values.len(), distinct.len());
    }
    let listed: Vec<String> = distinct.iter().map(|&(v, n)| show(v, n)).collect();
    format!("{} (by value; --json lists each NIC)", listed.join(", "))
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
                r.rounds.to_string(),
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
    let text = format!(
        "{}{}\n{}",
        title(&format!("AllReduce, {}: {}", r.algo.name(), describe(&c, m))),
        rounds_table(&r),
        kv(&[
            ("total", format!("{} ({} rounds, {} of it launch latency)", r.total, r.rounds, r.latency)),
            ("cross-server bytes", format!("{} (both directions)", r.cross_host_bytes)),
            ("bytes sent", format!("{} per rank (max), {} in all", r.max_rank_bytes, r.total_bytes)),
            ("max bytes per NIC", format!("{} sent", r.max_nic_bytes)),
            ("bytes sent per NIC", runs(&r.nic_tx_bytes)),
            ("break-even local bandwidth", break_even_line(be, &c)),
        ])
    );
    Ok(Output::new(&Single { cluster: &c, report: &r, break_even_local: be }, text))
}
