//! `agent model path|cut|msg|pipeline|ep` (docs/models.md §1.1, §1.2, §1.7–§1.9, §4 item 5).

use clap::Args;
use serde::Serialize;

use super::table::{kv, pct, title, Table};
use super::Output;
use crate::model::traffic::{
    self, cut_time, ep_volume_each_way, matrix_time, message_crossover, message_time, micro_batches_for, relay_table, shared_interface_time, strong_scaling,
    strong_scaling_crossover, MatrixTime, MessageCost, PathRow, ScalingRow, TrafficMatrix,
};
use crate::model::ModelError;
use crate::units::{
    parse_bytes, parse_bytes_list, parse_bytes_pos, parse_rate_list, parse_rate_pos, parse_seconds, parse_seconds_pos, Bytes, BytesPerSecond, List, Seconds,
};

#[derive(Debug, Args)]
pub struct PathArgs {
    /// Bytes to move.
    #[arg(long, default_value = "1.125GiB", value_parser = parse_bytes, allow_hyphen_values = true)]
    pub bytes: Bytes,
    /// The GPU's own NIC.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub direct: BytesPerSecond,
    /// The relay hop (NVLink).
    #[arg(long, default_value = "450GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub hop: BytesPerSecond,
    /// The neighbours' NICs used by the relay.
    #[arg(long, default_value = "50GB/s,50GB/s", value_parser = parse_rate_list, allow_hyphen_values = true)]
    pub neighbours: List<BytesPerSecond>,
    /// Downstream bandwidths to evaluate.
    #[arg(long, default_value = "50GB/s,100GB/s,150GB/s", value_parser = parse_rate_list, allow_hyphen_values = true)]
    pub downstream: List<BytesPerSecond>,
    /// Also: segments in series (bandwidth = min).
    #[arg(long, value_parser = parse_rate_list, allow_hyphen_values = true)]
    pub serial: Option<List<BytesPerSecond>>,
    /// Also: branches in parallel (bandwidth = sum).
    #[arg(long, value_parser = parse_rate_list, allow_hyphen_values = true)]
    pub parallel: Option<List<BytesPerSecond>>,
}

#[derive(Serialize)]
struct Composite {
    bandwidth: BytesPerSecond,
    time: Seconds,
}

#[derive(Serialize)]
struct PathOut {
    bytes: Bytes,
    relay: Vec<PathRow>,
    serial: Option<Composite>,
    parallel: Option<Composite>,
}

pub fn path(a: PathArgs) -> Result<Output, ModelError> {
    let rows = relay_table(a.bytes, a.direct, a.hop, &a.neighbours.0, &a.downstream.0)?;
    let composite = |v: &Option<List<BytesPerSecond>>, serial: bool| -> Result<Option<Composite>, ModelError> {
        let Some(v) = v else { return Ok(None) };
        let links = v.0.iter().map(|&b| traffic::Path::Link(b)).collect();
        let p = if serial { traffic::Path::Serial(links) } else { traffic::Path::Parallel(links) };
        let bandwidth = p.bandwidth();
        Ok(Some(Composite { bandwidth, time: cut_time(a.bytes, bandwidth)? }))
    };
    let out = PathOut { bytes: a.bytes, relay: rows, serial: composite(&a.serial, true)?, parallel: composite(&a.parallel, false)? };
    let neigh: Vec<String> = a.neighbours.0.iter().map(ToString::to_string).collect();
    let mut t = Table::new(&["downstream", "B_eff", "time"]);
    for r in &out.relay {
        t.row(vec![r.downstream.to_string(), r.effective.to_string(), r.time.to_string()]);
    }
    let mut text = format!("{}{}", title(&format!("{} over min(B_D, {} + min({}, {}))", a.bytes, a.direct, a.hop, neigh.join(" + "))), t.render());
    for (name, c) in [("serial (min)", &out.serial), ("parallel (sum)", &out.parallel)] {
        if let Some(c) = c {
            text.push_str(&kv(&[(name, format!("{} → {}", c.bandwidth, c.time))]));
        }
    }
    Ok(Output::new(&out, text))
}

#[derive(Debug, Args)]
pub struct CutArgs {
    /// Bytes crossing the cut in one direction.
    #[arg(long, default_value = "360MiB", value_parser = parse_bytes, allow_hyphen_values = true)]
    pub bytes: Bytes,
    /// Bandwidth of the cut in that direction.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub bandwidth: BytesPerSecond,
    /// Compute time at scale-out factor 1 (it divides; the cut does not).
    #[arg(long, default_value = "20ms", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub compute: Seconds,
    /// Scale-out factors to tabulate.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub factors: Vec<f64>,
    /// Bytes per port behind a shared interface (needs --port-bandwidth and --interface).
    #[arg(long, value_parser = parse_bytes_list, allow_hyphen_values = true, requires_all = ["port_bandwidth", "interface"])]
    pub port_bytes: Option<List<Bytes>>,
    #[arg(long, value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub port_bandwidth: Option<BytesPerSecond>,
    #[arg(long, value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub interface: Option<BytesPerSecond>,
}

#[derive(Serialize)]
struct CutOut {
    bytes: Bytes,
    bandwidth: BytesPerSecond,
    time: Seconds,
    compute: Seconds,
    crossover: f64,
    scaling: Vec<ScalingRow>,
    shared_interface_time: Option<Seconds>,
}

pub fn cut(a: CutArgs) -> Result<Output, ModelError> {
    let time = cut_time(a.bytes, a.bandwidth)?;
    let crossover = strong_scaling_crossover(a.compute, time)?;
    let scaling = a.factors.iter().map(|&x| strong_scaling(a.compute, time, x)).collect::<Result<Vec<_>, _>>()?;
    let shared = match (&a.port_bytes, a.port_bandwidth, a.interface) {
        (Some(p), Some(pb), Some(i)) => Some(shared_interface_time(&p.0, pb, i)?),
        _ => None,
    };
    let out = CutOut { bytes: a.bytes, bandwidth: a.bandwidth, time, compute: a.compute, crossover, scaling, shared_interface_time: shared };
    let mut t = Table::new(&["x", "compute/x", "overlapped", "serial"]);
    for r in &out.scaling {
        t.row(vec![format!("{}", r.factor), r.compute.to_string(), r.overlapped.to_string(), r.serial.to_string()]);
    }
    let mut pairs = vec![
        ("cut bound T_C = V/B", format!("{} / {} = {}", a.bytes, a.bandwidth, time)),
        ("strong-scaling crossover", format!("x ≈ {:.2} (compute {} / x meets the cut)", crossover, a.compute)),
    ];
    if let Some(s) = shared {
        pairs.push(("shared interface", format!("{s} (max of each port and the summed interface)")));
    }
    let text = format!("{}\n{}", kv(&pairs), t.render());
    Ok(Output::new(&out, text))
}

#[derive(Debug, Args)]
pub struct MsgArgs {
    /// Fixed cost per message.
    #[arg(long, default_value = "5us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub alpha: Seconds,
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub bandwidth: BytesPerSecond,
    /// Message sizes.
    #[arg(long, default_value = "64MiB,8KiB", value_parser = parse_bytes_list, allow_hyphen_values = true)]
    pub bytes: List<Bytes>,
}

#[derive(Serialize)]
struct MsgOut {
    alpha: Seconds,
    bandwidth: BytesPerSecond,
    crossover: Bytes,
    messages: Vec<MessageCost>,
}

pub fn msg(a: MsgArgs) -> Result<Output, ModelError> {
    let messages = a.bytes.0.iter().map(|&m| message_time(a.alpha, m, a.bandwidth)).collect::<Result<Vec<_>, _>>()?;
    let crossover = message_crossover(a.alpha, a.bandwidth);
    let mut t = Table::new(&["size", "T = α + M/B", "launch share"]);
    for m in &messages {
        t.row(vec![m.bytes.to_string(), m.time.to_string(), pct(m.launch_share)]);
    }
    let text = format!(
        "{}{}\n{}",
        title(&format!("Message cost, α = {}, B = {}", a.alpha, a.bandwidth)),
        t.render(),
        kv(&[("crossover M = αB", format!("{:.0} B = {} = {}", crossover.0, crossover.dec(), crossover))])
    );
    Ok(Output::new(&MsgOut { alpha: a.alpha, bandwidth: a.bandwidth, crossover, messages }, text))
}

#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Pipeline stages p.
    #[arg(long, default_value_t = 4, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub stages: usize,
    /// Micro-batches m.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub micro_batches: usize,
    /// Time per stage per micro-batch τ.
    #[arg(long, default_value = "1ms", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub stage_time: Seconds,
    /// Target utilisation for the micro-batch count question.
    #[arg(long, default_value_t = 0.9, value_parser = super::factor, allow_hyphen_values = true)]
    pub target: f64,
}

#[derive(Serialize)]
struct PipelineOut {
    #[serde(flatten)]
    pipeline: traffic::Pipeline,
    target: f64,
    micro_batches_for_target: usize,
}

pub fn pipeline(a: PipelineArgs) -> Result<Output, ModelError> {
    let p = traffic::pipeline(a.stages, a.micro_batches, a.stage_time)?;
    let need = micro_batches_for(a.stages, a.target)?;
    let text = kv(&[
        ("T_pipe = (m + p − 1)τ", format!("({} + {} − 1) × {} = {}", a.micro_batches, a.stages, a.stage_time, p.time)),
        ("U = m/(m + p − 1)", pct(p.utilisation)),
        ("micro-batches for target", format!("m ≥ {need} for U ≥ {}", pct(a.target))),
    ]);
    Ok(Output::new(&PipelineOut { pipeline: p, target: a.target, micro_batches_for_target: need }, text))
}

#[derive(Debug, Args)]
pub struct EpArgs {
    /// Tokens n.
    #[arg(long, default_value_t = 1024, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub tokens: usize,
    /// Experts per token k.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub topk: usize,
    /// Bytes per token copy d.
    #[arg(long, default_value = "8KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub token_bytes: Bytes,
    /// Fraction f of the copies that leave the server.
    #[arg(long, default_value_t = 0.5, value_parser = super::factor, allow_hyphen_values = true)]
    pub remote_fraction: f64,
    /// NIC bandwidth.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub nic: BytesPerSecond,
    /// Sending NICs the traffic spreads over.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub nics: usize,
    /// Receiving NICs [default: as many as sending].
    #[arg(long, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub receivers: Option<usize>,
    /// The reference PCIe slot: its ports' bandwidth, …
    #[arg(long, default_value = "25GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub slot_port: BytesPerSecond,
    /// … how many ports share it, …
    #[arg(long, default_value_t = 2, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub slot_ports: usize,
    /// … and the slot's bandwidth.
    #[arg(long, default_value = "32GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub slot: BytesPerSecond,
}

#[derive(Serialize)]
struct EpScenario {
    name: String,
    senders: usize,
    receivers: usize,
    #[serde(flatten)]
    time: MatrixTime,
}

#[derive(Serialize)]
struct EpOut {
    each_way: Bytes,
    dispatch_and_combine: Bytes,
    scenarios: Vec<EpScenario>,
    matrix: TrafficMatrix,
    row_sums: Vec<Bytes>,
    col_sums: Vec<Bytes>,
}

pub fn ep(a: EpArgs) -> Result<Output, ModelError> {
    let v = ep_volume_each_way(a.tokens, a.topk, a.remote_fraction, a.token_bytes)?;
    let receivers = a.receivers.unwrap_or(a.nics);
    let spread = TrafficMatrix::even(v, a.nics, receivers)?;
    let scenarios = vec![
        EpScenario { name: "all to one NIC".into(), senders: 1, receivers: 1, time: matrix_time(&TrafficMatrix::even(v, 1, 1)?, a.nic, None, None)? },
        EpScenario {
            name: format!("spread from {} to {} NICs", a.nics, receivers),
            senders: a.nics,
            receivers,
            time: matrix_time(&spread, a.nic, None, None)?,
        },
        EpScenario {
            name: format!("{} × {} ports behind one {} slot", a.slot_ports, a.slot_port, a.slot),
            senders: a.slot_ports,
            receivers: a.slot_ports,
            time: matrix_time(&TrafficMatrix::even(v, a.slot_ports, a.slot_ports)?, a.slot_port, Some(a.slot), None)?,
        },
    ];
    let mut t = Table::new(&["scenario", "max per NIC", "time ≥", "bound"]);
    for s in &scenarios {
        t.row(vec![s.name.clone(), s.time.max_send.max(s.time.max_receive).to_string(), s.time.time.to_string(), s.time.bound.into()]);
    }
    let text = format!(
        "{}{}\n{}",
        title(&format!(
            "Expert parallel: n = {}, k = {}, d = {}, f = {}: {} each way, {} dispatch + combine",
            a.tokens,
            a.topk,
            a.token_bytes,
            a.remote_fraction,
            v,
            v * 2.0
        )),
        t.render(),
        kv(&[("traffic matrix (spread)", format!("{} × {receivers} cells of {}; row sums = sent, column sums = received", a.nics, spread.v[0][0]))])
    );
    let out = EpOut { each_way: v, dispatch_and_combine: v * 2.0, scenarios, row_sums: spread.row_sums(), col_sums: spread.col_sums(), matrix: spread };
    Ok(Output::new(&out, text))
}
