//! `agent model scale|access|state` (docs/models.md §5, §6).

use clap::Args;
use serde::Serialize;

use super::table::{kv, pct, title, Table};
use super::Output;
use crate::model::access::{remote_read, stage_in, AccessPath, AccessReport, Category, StageIn, StateInput, StateRow};
use crate::model::scale::{self, Egress, ScaleInput, ScaleReport, SWEEP};
use crate::model::ModelError;
use crate::units::{parse_bytes, parse_bytes_pos, parse_rate_pos, parse_seconds, Bytes, BytesPerSecond, Seconds, UnitError};

/// `scale` (S × 50 GB/s) or a fixed bandwidth such as `400GB/s`.
fn parse_egress(s: &str) -> Result<Egress, UnitError> {
    match s.trim() {
        "scale" | "scales" => Ok(Egress::Scales),
        other => parse_rate_pos(other).map(Egress::Fixed),
    }
}

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// GPUs per supernode S.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub supernode: usize,
    /// Supernode egress: `scale` (S × NIC) or a fixed bandwidth such as 400GB/s.
    #[arg(long, default_value = "scale", value_parser = parse_egress, allow_hyphen_values = true)]
    pub egress: Egress,
    /// Divides the egress.
    #[arg(long, default_value_t = 1.0, value_parser = super::factor, allow_hyphen_values = true)]
    pub oversubscription: f64,
    /// NVLink bandwidth per GPU.
    #[arg(long, default_value = "450GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub local: BytesPerSecond,
    /// NIC bandwidth per GPU.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub nic: BytesPerSecond,
    /// Tensor-parallel size (8, 16, 32, 64).
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub tp: usize,
    /// Tabulate S = 8, 64, 128, 256.
    #[arg(long)]
    pub sweep: bool,
}

#[derive(Serialize)]
struct ScaleOut<'a> {
    input: &'a ScaleInput,
    rows: &'a [ScaleReport],
}

fn tok(x: f64) -> String {
    format!("{:.3} M", x / 1e6)
}

pub fn scale(a: ScaleArgs) -> Result<Output, ModelError> {
    let input = ScaleInput {
        supernode: a.supernode,
        egress: a.egress,
        oversubscription: a.oversubscription,
        local: a.local,
        nic: a.nic,
        tp: a.tp,
        ..ScaleInput::chapter()
    };
    let egress = match a.egress {
        Egress::Scales => format!("egress S × {}", a.nic),
        Egress::Fixed(b) => format!("egress {b} per supernode"),
    };
    let head =
        title(&format!("1024 GPUs, TP{} × DP{}, 2^20 tokens/step, P = 32e9; {egress}, oversubscription {}:1", a.tp, 1024 / a.tp.max(1), a.oversubscription));
    if a.sweep {
        let rows = scale::sweep(&input, &SWEEP)?;
        let mut t = Table::new(&["S", "H", "q", "V_out", "B_out", "T_grad hier", "T_grad flat", "chosen", "step", "tokens/s", "R", "ε", "eff. tokens/s"]);
        for r in &rows {
            t.row(vec![
                r.supernode.to_string(),
                r.supernodes.to_string(),
                r.local_dp.to_string(),
                r.v_out.dec().to_string(),
                r.b_out.to_string(),
                r.t_grad_hierarchical.to_string(),
                r.t_grad_flat.to_string(),
                r.grad_algo.to_string(),
                r.step.to_string(),
                tok(r.tokens_per_s),
                r.recovery.to_string(),
                pct(r.ckpt_overhead),
                tok(r.effective_tokens_per_s),
            ]);
        }
        let text = format!("{head}{}", t.render());
        return Ok(Output::new(&ScaleOut { input: &input, rows: &rows }, text));
    }
    let r = scale::scale(&input)?;
    let text = format!(
        "{head}{}",
        kv(&[
            ("supernodes H, local DP q", format!("{} × {} GPUs, q = {}", r.supernodes, r.supernode, r.local_dp)),
            ("gradient shard G = 2P/t", r.shard.dec().to_string()),
            ("V_out per direction", format!("{} through {}", r.v_out.dec(), r.b_out)),
            ("T_grad hierarchical", r.t_grad_hierarchical.to_string()),
            ("T_grad flat ring", r.t_grad_flat.to_string()),
            ("T_grad", format!("{} ({})", r.t_grad, r.grad_algo)),
            ("compute", r.compute.to_string()),
            ("TP AllReduces", format!("{} (activation {} per AllReduce)", r.tp_time, r.activation)),
            ("optimizer", r.optimizer.to_string()),
            ("step", r.step.to_string()),
            ("tokens/s", tok(r.tokens_per_s)),
            ("job interrupted every", r.job_mtbf.to_string()),
            ("recovery R", r.recovery.to_string()),
            ("checkpoint overhead ε", pct(r.ckpt_overhead)),
            ("effective tokens/s", tok(r.effective_tokens_per_s)),
        ])
    );
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct AccessArgs {
    /// One-way link latency L (total = fixed + 2L).
    #[arg(long, default_value = "100ns", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub link_latency: Seconds,
    /// Time to stage the data in once, t_s.
    #[arg(long, default_value = "10us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub stage_in: Seconds,
    /// Local access time after staging, t_l.
    #[arg(long, default_value = "100ns", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub local_access: Seconds,
    /// Accesses per item r.
    #[arg(long, default_value_t = 10.0, value_parser = super::factor, allow_hyphen_values = true)]
    pub accesses: f64,
}

#[derive(Serialize)]
struct AccessOut {
    link_latency: Seconds,
    paths: Vec<AccessReport>,
    stage_in: Vec<StageInRow>,
}

#[derive(Serialize)]
struct StageInRow {
    path: AccessPath,
    #[serde(flatten)]
    result: StageIn,
}

/// One letter per category in the stacked bars.
const BAR_LETTERS: [(Category, char); 6] = [
    (Category::SoftwarePost, 'S'),
    (Category::PcieCrossing, 'P'),
    (Category::OnChipBus, 'B'),
    (Category::NicPipeline, 'N'),
    (Category::Wire, 'W'),
    (Category::MemoryAndCompletion, 'M'),
];
const BAR_WIDTH: f64 = 60.0;

/// The per-stage table of one path.
fn path_table(p: &AccessReport, link: Seconds) -> String {
    let head = format!("{} ({})", p.path.label(), p.path.name());
    let mut t = Table::new(&[&head, "latency", "category"]);
    for s in &p.stages {
        let v = match (s.cycles, s.link) {
            (Some(c), _) => format!("{} ({c} cycles)", s.latency),
            (None, true) => format!("{} (L)", s.latency),
            (None, false) => s.latency.to_string(),
        };
        t.row(vec![s.name.into(), v, s.category.name().into()]);
    }
    t.row(vec!["total = fixed + 2L".into(), format!("{} = {} + 2 × {link}", p.total, p.fixed), String::new()]);
    t.render()
}

/// Category × path table, then one bar per path on a common scale (the chapter's stacked bars).
fn stacked(paths: &[AccessReport]) -> String {
    let mut heads = vec!["category"];
    heads.extend(paths.iter().map(|p| p.path.label()));
    let mut t = Table::new(&heads);
    for c in Category::ALL {
        let mut cells = vec![c.name().to_string()];
        cells.extend(paths.iter().map(|p| {
            let s = p.category(c);
            if s.latency.0 == 0.0 {
                "—".to_string()
            } else {
                format!("{} ({})", s.latency, pct(s.share))
            }
        }));
        t.row(cells);
    }
    let mut totals = vec!["total".to_string()];
    totals.extend(paths.iter().map(|p| p.total.to_string()));
    t.row(totals);
    let longest = paths.iter().map(|p| p.total.0).fold(0.0, f64::max);
    let scale = if longest > 0.0 { BAR_WIDTH / longest } else { 0.0 };
    let mut bars = Table::new(&["path", "stacked by category", "total"]);
    for p in paths {
        // Round the running sum, not each piece, so every bar is as long as its total.
        let (mut bar, mut acc) = (String::new(), 0.0);
        for (c, letter) in BAR_LETTERS {
            let start = (acc * scale).round() as usize;
            acc += p.category(c).latency.0;
            bar.extend(std::iter::repeat_n(letter, ((acc * scale).round() as usize).saturating_sub(start)));
        }
        // Padded to the full width so the right-aligned column keeps every bar's start aligned.
        let pad = (BAR_WIDTH as usize).saturating_sub(bar.chars().count());
        bars.row(vec![p.path.name().into(), format!("{bar}{}", " ".repeat(pad)), p.total.to_string()]);
    }
    let legend = BAR_LETTERS.iter().map(|(c, l)| format!("{l} {}", c.name())).collect::<Vec<_>>().join(", ");
    format!("Stacked by category\n\n{}\n{}{legend}\n", t.render(), bars.render())
}

pub fn access(a: AccessArgs) -> Result<Output, ModelError> {
    let paths = AccessPath::ALL.iter().map(|&p| remote_read(p, a.link_latency)).collect::<Result<Vec<_>, _>>()?;
    let stage = paths
        .iter()
        .map(|p| Ok(StageInRow { path: p.path, result: stage_in(p.total, a.stage_in, a.local_access, a.accesses)? }))
        .collect::<Result<Vec<_>, ModelError>>()?;
    let mut text = title(&format!("One 64 B remote read, L = {} one way (stage table of docs/models.md §6)", a.link_latency));
    for p in &paths {
        text.push_str(&path_table(p, a.link_latency));
        text.push('\n');
    }
    text.push_str(&stacked(&paths));
    text.push('\n');
    let mut t = Table::new(&["path", "t_r", "remote t_r·r", "staged t_s + t_l·r", "stage-in wins above r ="]);
    for (p, s) in paths.iter().zip(&stage) {
        let s = &s.result;
        let cross = s.crossover.map_or_else(|| "never".into(), |x| format!("{x:.2}"));
        t.row(vec![p.path.name().into(), p.total.to_string(), s.remote.to_string(), s.staged.to_string(), cross]);
    }
    text.push_str(&format!("Stage-in (t_s = {}, t_l = {}) vs remote, r = {} accesses\n\n{}", a.stage_in, a.local_access, a.accesses, t.render()));
    Ok(Output::new(&AccessOut { link_latency: a.link_latency, paths, stage_in: stage }, text))
}

#[derive(Debug, Args)]
pub struct StateArgs {
    /// Local processes L.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub processes: usize,
    /// Peers P.
    #[arg(long, default_value_t = 1023, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub peers: usize,
    /// Per-process endpoint state e.
    #[arg(long, default_value = "64B", value_parser = parse_bytes, allow_hyphen_values = true)]
    pub endpoint: Bytes,
    /// Per (process, peer) addressing state r.
    #[arg(long, default_value = "16B", value_parser = parse_bytes, allow_hyphen_values = true)]
    pub addressing: Bytes,
    /// Per connection transport state t.
    #[arg(long, default_value = "256B", value_parser = parse_bytes, allow_hyphen_values = true)]
    pub transport: Bytes,
    /// Shared-transport groups K.
    #[arg(long, default_value_t = 4, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub groups: usize,
    /// RC comparison: nodes N …
    #[arg(long, default_value_t = 1024, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub nodes: usize,
    /// … and processes per node M.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub per_node: usize,
    /// On-chip cache for connection state.
    #[arg(long, default_value = "2MiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub cache: Bytes,
}

#[derive(Serialize)]
struct StateOut {
    input: StateInput,
    rows: Vec<StateRow>,
}

pub fn state(a: StateArgs) -> Result<Output, ModelError> {
    let input = StateInput {
        processes: a.processes,
        peers: a.peers,
        endpoint: a.endpoint,
        addressing: a.addressing,
        transport: a.transport,
        groups: a.groups,
        nodes: a.nodes,
        per_node: a.per_node,
        cache: a.cache,
    };
    let rows = crate::model::access::state(&input)?;
    let mut t = Table::new(&["scheme", "state", "fits the cache", "overflows beyond"]);
    for (i, r) in rows.iter().enumerate() {
        let unit = if i < 3 { "peers" } else { "nodes" };
        t.row(vec![
            r.scheme.into(),
            r.bytes.to_string(),
            if r.fits_cache { "yes".into() } else { "no".into() },
            r.max_fitting.map_or_else(|| "always".into(), |m| if m == u64::MAX { "never".into() } else { format!("{m} {unit}") }),
        ]);
    }
    let text = format!(
        "{}{}",
        title(&format!(
            "Connection state: L = {}, P = {}, e = {}, r = {}, t = {}, K = {}; N = {}, M = {}; cache {}",
            a.processes, a.peers, a.endpoint, a.addressing, a.transport, a.groups, a.nodes, a.per_node, a.cache
        )),
        t.render()
    );
    Ok(Output::new(&StateOut { input, rows }, text))
}
