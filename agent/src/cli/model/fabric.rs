//! `agent model rails|clos|ecmp` (docs/models.md §1.10–§1.12).

use clap::Args;
use serde::Serialize;

use super::table::{kv, pct, title, Table};
use super::Output;
use crate::model::ecmp::{ecmp as run_ecmp, monte_carlo_cdf, EcmpReport};
use crate::model::fabric::{clos as run_clos, hierarchical_pair_bytes, rails as run_rails, shifted_pairing, RailsInput, RailsReport};
use crate::model::ModelError;
use crate::units::{parse_bytes_pos, parse_rate_pos, parse_seconds, Bytes, BytesPerSecond, Seconds};

#[derive(Debug, Args)]
pub struct RailsArgs {
    /// Per-rank gradient; each cross-server pair carries 2(S−1)/S · M/g per direction.
    #[arg(long, default_value = "192MiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub bytes: Bytes,
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub gpus_per_host: usize,
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub nic: BytesPerSecond,
    #[arg(long, default_value = "0.833us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub alpha: Seconds,
    /// Rank i of server A pairs with rank (i + shift) mod g of server B; 0 = rail-aligned.
    #[arg(long, default_value_t = 0, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub shift: usize,
    /// Failed NICs on server A (their GPUs relay over NVLink to the survivors), e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub failed: Vec<usize>,
}

#[derive(Serialize)]
struct RailsOut {
    bytes_per_pair: Bytes,
    rounds: usize,
    pairing: Vec<usize>,
    #[serde(flatten)]
    report: RailsReport,
}

pub fn rails(a: RailsArgs) -> Result<Output, ModelError> {
    let (b, rounds) = hierarchical_pair_bytes(2, a.gpus_per_host, a.bytes)?;
    let pairing = shifted_pairing(a.gpus_per_host, a.shift);
    let r = run_rails(&RailsInput {
        gpus_per_host: a.gpus_per_host,
        pairing: pairing.clone(),
        bytes_per_pair: b,
        rounds,
        nic: a.nic,
        alpha: a.alpha,
        failed: a.failed.clone(),
    })?;
    let mut t = Table::new(&["rail", "A NIC", "A bytes/dir", "B bytes/dir"]);
    for row in &r.rails {
        t.row(vec![row.rail.to_string(), if row.failed { "failed".into() } else { "up".into() }, row.a_nic_bytes.to_string(), row.b_nic_bytes.to_string()]);
    }
    let pairs: Vec<String> = pairing.iter().enumerate().map(|(i, j)| format!("{i}↔{}", j + a.gpus_per_host)).collect();
    let text = format!(
        "{}{}\n{}",
        title(&format!("Rails: pairs {} carry {} per direction in {rounds} rounds", pairs.join(" "), b)),
        t.render(),
        kv(&[
            ("rail-aligned pairs", format!("{} of {}", r.aligned_pairs, a.gpus_per_host)),
            ("spine bytes", format!("{} per direction", r.spine_bytes)),
            ("busiest NIC", format!("{} per direction", r.max_nic_bytes)),
            ("time", format!("{} = {rounds}·α + {} / {}", r.time, r.max_nic_bytes, a.nic)),
        ])
    );
    Ok(Output::new(&RailsOut { bytes_per_pair: b, rounds, pairing, report: r }, text))
}

/// `3`, `3:1` or `48:16`.
fn parse_ratio(s: &str) -> Result<f64, String> {
    let bad = || format!("'{s}' is not an oversubscription ratio: write 3, 3:1 or 48:16");
    let (a, b) = match s.split_once(':') {
        Some((a, b)) => (a.trim().parse::<f64>().map_err(|_| bad())?, b.trim().parse::<f64>().map_err(|_| bad())?),
        None => (s.trim().parse::<f64>().map_err(|_| bad())?, 1.0),
    };
    if !(a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()) {
        return Err(format!("'{s}': an oversubscription ratio must be positive"));
    }
    if !(1.0 / super::MAX_FACTOR..=super::MAX_FACTOR).contains(&(a / b)) {
        return Err(format!("'{s}': an oversubscription ratio must lie between 1:{0:e} and {0:e}:1", super::MAX_FACTOR));
    }
    Ok(a / b)
}

#[derive(Debug, Args)]
pub struct ClosArgs {
    /// Ports per switch k.
    #[arg(long, default_value_t = 64, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub ports: usize,
    /// 2 (leaf–spine) or 3 (fat-tree).
    #[arg(long, default_value_t = 2, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub tiers: usize,
    /// Leaf down:up ratio r = d/u.
    #[arg(long, default_value = "1", value_parser = parse_ratio, allow_hyphen_values = true)]
    pub oversubscription: f64,
    /// Bandwidth per port.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub port_bandwidth: BytesPerSecond,
    /// A job on whole leaves: its cut is all their uplinks.
    #[arg(long, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub job_gpus: Option<usize>,
}

pub fn clos(a: ClosArgs) -> Result<Output, ModelError> {
    let r = run_clos(a.ports, a.tiers, a.oversubscription, a.port_bandwidth, a.job_gpus)?;
    let layout = if r.tiers == 2 {
        format!("{} leaves + {} spines", r.leaves, r.middle)
    } else {
        format!("{} leaves + {} aggregation + {} core", r.leaves, r.middle, r.core)
    };
    let mut pairs = vec![
        ("leaf ports", format!("{} down, {} up (r = {}:1)", r.leaf_down, r.leaf_up, r.oversubscription)),
        ("endpoints", r.endpoints.to_string()),
        ("switches", format!("{} ({layout})", r.switches)),
        ("bisection", r.bisection.to_string()),
        ("uplinks no bottleneck iff", format!("leaving fraction f ≤ 1/r = {}", pct(r.max_leaving_fraction))),
    ];
    if let Some(j) = &r.job {
        pairs.push(("job cut", format!("{} GPUs on {} leaves: {} uplinks = {}", j.gpus, j.leaves, j.uplinks, j.cut)));
    }
    let text = format!("{}{}", title(&format!("{}-tier Clos of {}-port switches", r.tiers, r.ports)), kv(&pairs));
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct EcmpArgs {
    /// Equal flows n.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub flows: usize,
    /// Uplinks m.
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub uplinks: usize,
    /// Also estimate the distribution from this many seeded random hashings.
    #[arg(long, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub monte_carlo: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Serialize)]
struct EcmpOut {
    #[serde(flatten)]
    report: EcmpReport,
    monte_carlo: Option<Vec<f64>>,
}

pub fn ecmp(a: EcmpArgs) -> Result<Output, ModelError> {
    let r = run_ecmp(a.flows, a.uplinks)?;
    let mc = a.monte_carlo.map(|n| monte_carlo_cdf(a.flows, a.uplinks, n, a.seed)).transpose()?;
    let mut t = Table::new(&["L_max", "P(L_max = t)", "P(L_max ≤ t)"]);
    for p in r.distribution.iter().filter(|p| p.p >= 1e-6 || p.flows == r.ideal) {
        t.row(vec![p.flows.to_string(), format!("{:.6}", p.p), format!("{:.6}", p.cdf)]);
    }
    let mut pairs = vec![
        ("E[L_max]", format!("{:.4} flows (ideal ⌈n/m⌉ = {})", r.expected_max, r.ideal)),
        ("p99 of L_max", r.p99.to_string()),
        ("P(no collision)", format!("{:.6}", r.p_no_collision)),
        ("P(perfectly even)", format!("{:.6}", r.p_balanced)),
        ("relative group speed", format!("{} (= ⌈n/m⌉ / E[L_max])", pct(r.relative_speed))),
    ];
    if let Some(mc) = &mc {
        let mean: f64 = mc.iter().take(a.flows).map(|c| 1.0 - c).sum();
        pairs.push(("Monte-Carlo E[L_max]", format!("{mean:.4} from {} trials", a.monte_carlo.unwrap_or(0))));
    }
    let text =
        format!("{}{}\n{}", title(&format!("ECMP: {} flows hashed onto {} uplinks (exact; rows with P ≥ 1e-6)", r.flows, r.uplinks)), t.render(), kv(&pairs));
    Ok(Output::new(&EcmpOut { report: r, monte_carlo: mc }, text))
}
