//! `agent model step|skew|tail|smallmsg` (docs/models.md §3).

use clap::Args;
use serde::Serialize;

use super::collective::ClusterArgs;
use super::table::{kv, pct, title, Table};
use super::Output;
use crate::model::dependency::{self, small_message_crossover, small_messages, SmallMsgRow, StepInput};
use crate::model::ModelError;
use crate::units::{
    parse_bytes_list, parse_bytes_pos, parse_rate_pos, parse_seconds, parse_seconds_list, parse_seconds_pos, Bytes, BytesPerSecond, List, Seconds,
};

#[derive(Debug, Args)]
pub struct StepArgs {
    /// Compute time T_c.
    #[arg(long, default_value = "20ms", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub compute: Seconds,
    /// Optimizer update T_u.
    #[arg(long, default_value = "2ms", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub update: Seconds,
    /// Gradient ready time t_r for the overlapped rows.
    #[arg(long, default_value = "17ms", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub ready: Seconds,
    /// In-flight slots per NIC for the limited row.
    #[arg(long, default_value_t = 128, value_parser = super::count::<u64>, allow_hyphen_values = true)]
    pub slots: u64,
    /// Payload per request for the limited row.
    #[arg(long, default_value = "256B", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub payload: Bytes,
    /// Slot occupancy for the limited row.
    #[arg(long, default_value = "2us", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub occupancy: Seconds,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

pub fn step(a: StepArgs) -> Result<Output, ModelError> {
    let input = StepInput {
        compute: a.compute,
        update: a.update,
        ready: a.ready,
        cluster: a.cluster.cluster(),
        bytes: a.cluster.bytes,
        slots: a.slots,
        payload: a.payload,
        occupancy: a.occupancy,
    };
    let r = dependency::step(&input)?;
    let mut t = Table::new(&["timeline", "T_n", "T_step"]);
    for s in &r.scenarios {
        t.row(vec![s.name.clone(), s.comm.to_string(), s.step.to_string()]);
    }
    let text = format!(
        "{}{}\n{}",
        title(&format!("Step = max(T_c, t_r + T_n) + T_u (serial: T_c + T_n + T_u), T_c = {}, T_u = {}", a.compute, a.update)),
        t.render(),
        kv(&[
            ("latest t_r still hidden", format!("{} (hierarchical: T_c − T_n)", r.latest_hidden_ready)),
            ("comm speed-up flat → hier", format!("{:.2}×", r.comm_speedup)),
            ("whole-step speed-up (Amdahl)", format!("{:.3}×", r.amdahl)),
        ])
    );
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct SkewArgs {
    /// Time each rank becomes ready.
    #[arg(long, default_value = "0ms,0ms,0ms,2ms", value_parser = parse_seconds_list, allow_hyphen_values = true)]
    pub ready: List<Seconds>,
    /// Duration of the exchange once all are ready.
    #[arg(long, default_value = "0.4ms", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub exchange: Seconds,
}

pub fn skew(a: SkewArgs) -> Result<Output, ModelError> {
    let r = dependency::skew(&a.ready.0, a.exchange)?;
    let mut t = Table::new(&["rank", "ready", "waits in the call"]);
    for (i, (ready, wait)) in a.ready.0.iter().zip(&r.waits).enumerate() {
        t.row(vec![i.to_string(), ready.to_string(), wait.to_string()]);
    }
    let text = format!(
        "{}{}\n{}",
        title(&format!("Readiness skew: exchange {} starts when the last rank is ready", a.exchange)),
        t.render(),
        kv(&[
            ("done at", r.done.to_string()),
            ("critical path", r.critical_path.join(" → ")),
            ("with the exchange halved", r.done_with_half_exchange.to_string()),
            ("with no skew", r.done_without_skew.to_string()),
            ("skew", format!("{} — caused upstream (compute, data loading, jitter), not by the network", r.skew)),
        ])
    );
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// Samples; x*N repeats x N times.
    #[arg(long, default_value = "0.4ms*98,2.4ms,10.4ms", value_parser = parse_seconds_list, allow_hyphen_values = true)]
    pub samples: List<Seconds>,
}

pub fn tail(a: TailArgs) -> Result<Output, ModelError> {
    let r = dependency::tail(&a.samples.0)?;
    let text = kv(&[
        ("samples", r.samples.to_string()),
        ("mean", r.mean.to_string()),
        ("p50", r.p50.to_string()),
        ("p99 (element ⌈0.99 N⌉)", r.p99.to_string()),
        ("max", r.max.to_string()),
    ]);
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct SmallmsgArgs {
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub ranks: usize,
    #[arg(long, default_value = "5us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub alpha: Seconds,
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub bandwidth: BytesPerSecond,
    #[arg(long, default_value = "8MiB,8KiB", value_parser = parse_bytes_list, allow_hyphen_values = true)]
    pub bytes: List<Bytes>,
    /// Bandwidth multiplier for the "faster link" column.
    #[arg(long, default_value_t = 3.0, value_parser = super::factor, allow_hyphen_values = true)]
    pub speedup: f64,
    /// Reductions per step.
    #[arg(long, default_value_t = 72, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub count: usize,
    /// A lower α to compare with.
    #[arg(long, default_value = "2us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub lower_alpha: Seconds,
}

#[derive(Serialize)]
struct SmallmsgOut {
    crossover: Bytes,
    rows: Vec<SmallMsgRow>,
}

pub fn smallmsg(a: SmallmsgArgs) -> Result<Output, ModelError> {
    let rows = small_messages(a.ranks, a.alpha, a.bandwidth, &a.bytes.0, a.speedup, a.count, a.lower_alpha)?;
    let crossover = small_message_crossover(a.ranks, a.alpha, a.bandwidth);
    let mut t = Table::new(&["size", "T_AR", "latency share", "faster link", "× count", "α saving × count"]);
    for r in &rows {
        t.row(vec![
            r.bytes.to_string(),
            r.time.to_string(),
            pct(r.latency_share),
            r.time_faster_link.to_string(),
            r.total.to_string(),
            r.alpha_saving.to_string(),
        ]);
    }
    let p = a.ranks as f64;
    let text = format!(
        "{}{}\n{}",
        title(&format!(
            "{}-rank ring AllReduce T = {}α + {:.3}·M/B, α = {}, B = {}; faster link = {}×, count = {}, α → {}",
            a.ranks,
            2 * a.ranks.saturating_sub(1),
            2.0 * (p - 1.0) / p,
            a.alpha,
            a.bandwidth,
            a.speedup,
            a.count,
            a.lower_alpha
        )),
        t.render(),
        kv(&[("crossover M = p·α·B", format!("{} ({})", crossover.dec(), crossover))])
    );
    Ok(Output::new(&SmallmsgOut { crossover, rows }, text))
}
