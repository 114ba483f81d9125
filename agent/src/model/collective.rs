//! The round model and AllReduce placements (docs/models.md §1.3–§1.6).
//!
//! A collective is a sequence of synchronous rounds; in a round every rank sends to its
//! partner, the bytes land on resources (a GPU's local link, a NIC port, a shared PCIe slot,
//! each direction separately: full duplex, §1.1), and
//! `T_comm = Σ_rounds (α + max_e V_{r,e} / B_e)` (§1.3).

use serde::Serialize;

use super::{at_least, at_most, non_negative, positive, ModelError};
use crate::units::{Bytes, BytesPerSecond, Seconds};

/// Where the ranks sit and what connects them (docs/models.md §0).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cluster {
    pub hosts: usize,
    pub gpus_per_host: usize,
    /// Per NIC port, per direction.
    pub nic: BytesPerSecond,
    /// Per GPU, per direction, inside a host (NVLink, or PCIe on the reference box).
    pub local: BytesPerSecond,
    /// NIC ports per host. With one port per GPU (or more) GPU `g` uses port `g` (rail `g`);
    /// with fewer, the ports are shared by every GPU of the host and its cross-host bytes
    /// spread evenly over them.
    pub ports_per_host: usize,
    /// A PCIe slot all ports of a host sit behind (one direction); `None` = not a limit.
    pub slot: Option<BytesPerSecond>,
    /// Launch latency per round.
    pub alpha: Seconds,
}

impl Cluster {
    /// The running configuration of §0: 2 HGX servers, 8 GPUs, 450 GB/s NVLink, a 50 GB/s
    /// NIC per GPU, α = 0.833 µs.
    pub fn hgx() -> Cluster {
        Cluster {
            hosts: 2,
            gpus_per_host: 8,
            nic: BytesPerSecond::gb_s(50.0),
            local: BytesPerSecond::gb_s(450.0),
            ports_per_host: 8,
            slot: None,
            alpha: Seconds::us(0.833),
        }
    }

    /// The reference PCIe box of §0: 4 GPUs at 32 GB/s over PCIe, one dual-port 2 × 25 GB/s
    /// NIC behind one 32 GB/s slot.
    pub fn pcie_reference() -> Cluster {
        Cluster {
            hosts: 2,
            gpus_per_host: 4,
            nic: BytesPerSecond::gb_s(25.0),
            local: BytesPerSecond::gb_s(32.0),
            ports_per_host: 2,
            slot: Some(BytesPerSecond::gb_s(32.0)),
            alpha: Seconds::us(0.833),
        }
    }

    pub fn ranks(&self) -> usize {
        self.hosts * self.gpus_per_host
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        at_least("hosts", self.hosts, 1)?;
        at_least("GPUs per host", self.gpus_per_host, 1)?;
        at_least("NIC ports per host", self.ports_per_host, 1)?;
        at_most("GPUs per host", self.gpus_per_host, MAX_PER_HOST)?;
        at_most("NIC ports per host", self.ports_per_host, MAX_PER_HOST)?;
        at_most("ranks (hosts × GPUs per host)", self.hosts.saturating_mul(self.gpus_per_host), MAX_RANKS)?;
        at_most("NIC ports (hosts × ports per host)", self.hosts.saturating_mul(self.ports_per_host), MAX_RANKS)?;
        positive("NIC bandwidth", self.nic.0)?;
        positive("local bandwidth", self.local.0)?;
        if let Some(s) = self.slot {
            positive("slot bandwidth", s.0)?;
        }
        non_negative("α", self.alpha.0)?;
        Ok(())
    }

    fn dedicated_ports(&self) -> bool {
        self.ports_per_host >= self.gpus_per_host
    }
}

/// One resource with a bandwidth, one direction.
#[derive(Clone, Debug, Serialize)]
pub struct Resource {
    pub name: String,
    pub bandwidth: BytesPerSecond,
}

/// Timing of one round under the round model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundTiming {
    /// `α + max_e V_e / B_e`
    pub time: Seconds,
    /// Index of the slowest resource; `None` when the round moves no bytes.
    pub bottleneck: Option<usize>,
}

/// §1.3: inside a round the slowest resource decides. `loads[e]` are bytes on resource `e`.
pub fn round_time(resources: &[Resource], loads: &[Bytes], alpha: Seconds) -> RoundTiming {
    let mut worst = Seconds(0.0);
    let mut bottleneck = None;
    for (e, (r, &v)) in resources.iter().zip(loads).enumerate() {
        if v.0 > 0.0 {
            let t = v / r.bandwidth;
            if bottleneck.is_none() || t.0 > worst.0 {
                worst = t;
                bottleneck = Some(e);
            }
        }
    }
    RoundTiming { time: alpha + worst, bottleneck }
}

/// §1.3: rounds add up.
pub fn rounds_time(resources: &[Resource], rounds: &[Vec<Bytes>], alpha: Seconds) -> Seconds {
    rounds.iter().map(|l| round_time(resources, l, alpha).time).sum()
}

/// §1.4: ring AllReduce volumes on `p` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RingVolume {
    /// `2 (p − 1)/p · M`
    pub per_rank: Bytes,
    pub total: Bytes,
    /// `2 (p − 1)`
    pub rounds: usize,
}

pub fn ring_volume(p: usize, m: Bytes) -> Result<RingVolume, ModelError> {
    at_least("ranks", p, 1)?;
    non_negative("bytes", m.0)?;
    let per_rank = m * (2.0 * (p - 1) as f64 / p as f64);
    Ok(RingVolume { per_rank, total: per_rank * p as f64, rounds: 2 * (p - 1) })
}

/// The placements and algorithms of §1.5–§1.6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algo {
    /// Flat ring 0, 1, …, p−1: only host-boundary edges cross.
    Ring,
    /// Interleaved ring 0, 8, 1, 9, …: every edge crosses.
    Interleaved,
    /// Local ReduceScatter, per-shard ring across hosts on its own rail, local AllGather.
    Hierarchical,
    /// Local stages as hierarchical; the inter-host stage is one round through the switch.
    InNetwork,
}

impl Algo {
    pub const ALL: [Algo; 4] = [Algo::Ring, Algo::Interleaved, Algo::Hierarchical, Algo::InNetwork];
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Interleaved => "interleaved",
            Algo::Hierarchical => "hierarchical",
            Algo::InNetwork => "in-network",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Transfer {
    /// Rank to rank.
    P2p { src: usize, dst: usize, bytes: Bytes },
    /// A rank's shard up to the switch and the reduced result back down (§1.6).
    ViaSwitch { rank: usize, bytes: Bytes },
}

/// `count` identical consecutive rounds of `transfers`. Every placement repeats one round
/// per phase, so a schedule is a handful of stages whatever the cluster size: a flat ring on
/// 1024 × 8 ranks is 2 stages of 8191 rounds, not 16 382 copies of an 8192-transfer round
/// (4.3 GB and over 30 s before).
struct Stage {
    phase: &'static str,
    transfers: Vec<Transfer>,
    count: usize,
}

/// Most ranks (hosts × GPUs per host) and NIC ports (hosts × ports per host) a cluster may
/// have: 2.6× the largest training clusters built so far (~100 000 GPUs). At 2^18 ranks
/// `--compare` (four algorithms and the break-even) stays near a second even unoptimised;
/// 800 000 ranks took 3.7 s and 154 MB for one algorithm on a debug build.
pub const MAX_RANKS: usize = 1 << 18;
/// Most GPUs or NIC ports per host.
pub const MAX_PER_HOST: usize = 1024;

/// Resource layout of a [`Cluster`], by index: local tx then rx per rank, NIC tx then rx per
/// port (host-major), slot tx then rx per host. Names are built only for a bottleneck.
struct Fabric<'a> {
    c: &'a Cluster,
}

impl Fabric<'_> {
    fn len(&self) -> usize {
        2 * self.c.ranks() + 2 * self.c.hosts * self.c.ports_per_host + if self.c.slot.is_some() { 2 * self.c.hosts } else { 0 }
    }
    fn local(&self, rank: usize, rx: bool) -> usize {
        rank + usize::from(rx) * self.c.ranks()
    }
    fn nic(&self, host: usize, port: usize, rx: bool) -> usize {
        let n = self.c.ports_per_host;
        2 * self.c.ranks() + usize::from(rx) * self.c.hosts * n + host * n + port
    }
    fn slot(&self, host: usize, rx: bool) -> usize {
        2 * self.c.ranks() + 2 * self.c.hosts * self.c.ports_per_host + usize::from(rx) * self.c.hosts + host
    }

    /// Resource `e` with a local bandwidth of `local` (the cluster's, or one `break_even_local`
    /// tries).
    fn resource(&self, e: usize, local: BytesPerSecond) -> Resource {
        let c = self.c;
        let (p, ports) = (c.ranks(), c.hosts * c.ports_per_host);
        let dir = |rx: bool| if rx { "rx" } else { "tx" };
        if e < 2 * p {
            let r = e % p;
            let name = format!("h{}.gpu{} local-{}", r / c.gpus_per_host, r % c.gpus_per_host, dir(e >= p));
            return Resource { name, bandwidth: local };
        }
        let e = e - 2 * p;
        if e < 2 * ports {
            let q = e % ports;
            return Resource { name: format!("h{}.nic{} {}", q / c.ports_per_host, q % c.ports_per_host, dir(e >= ports)), bandwidth: c.nic };
        }
        let e = e - 2 * ports;
        Resource { name: format!("h{}.slot {}", e % c.hosts, dir(e >= c.hosts)), bandwidth: c.slot.unwrap_or(c.nic) }
    }

    /// The bandwidth of resource `e` given the local bandwidth (no name built).
    fn bandwidth(&self, e: usize, local: BytesPerSecond) -> BytesPerSecond {
        let c = self.c;
        if e < 2 * c.ranks() {
            local
        } else if e < 2 * c.ranks() + 2 * c.hosts * c.ports_per_host {
            c.nic
        } else {
            c.slot.unwrap_or(c.nic)
        }
    }

    /// Cross-host bytes of `rank` leaving (`rx = false`) or entering its host.
    fn nic_load(&self, loads: &mut [Bytes], rank: usize, bytes: Bytes, rx: bool) {
        let (h, g) = (rank / self.c.gpus_per_host, rank % self.c.gpus_per_host);
        if self.c.dedicated_ports() {
            loads[self.nic(h, g, rx)] += bytes;
        } else {
            // Ports behind one shared interface: the host's traffic spreads over them (§1.1).
            let share = bytes / self.c.ports_per_host as f64;
            for port in 0..self.c.ports_per_host {
                loads[self.nic(h, port, rx)] += share;
            }
        }
        if self.c.slot.is_some() {
            loads[self.slot(h, rx)] += bytes;
        }
    }

    /// Loads of one round; also returns the bytes that left their host.
    fn loads(&self, round: &[Transfer]) -> (Vec<Bytes>, Bytes) {
        let mut loads = vec![Bytes(0.0); self.len()];
        let mut cross = Bytes(0.0);
        let g = self.c.gpus_per_host;
        for t in round {
            match *t {
                Transfer::P2p { src, dst, bytes } if src / g == dst / g => {
                    loads[self.local(src, false)] += bytes;
                    loads[self.local(dst, true)] += bytes;
                }
                Transfer::P2p { src, dst, bytes } => {
                    self.nic_load(&mut loads, src, bytes, false);
                    self.nic_load(&mut loads, dst, bytes, true);
                    cross += bytes;
                }
                Transfer::ViaSwitch { rank, bytes } => {
                    self.nic_load(&mut loads, rank, bytes, false);
                    self.nic_load(&mut loads, rank, bytes, true);
                    cross += bytes;
                }
            }
        }
        (loads, cross)
    }

    /// The most loaded resource of each bandwidth class (local, NIC, slot), first index on a
    /// tie: a round's time under any local bandwidth follows from these alone (§1.3).
    fn peaks(&self, loads: &[Bytes]) -> Vec<(usize, Bytes)> {
        let c = self.c;
        let nic_end = 2 * c.ranks() + 2 * c.hosts * c.ports_per_host;
        [0..2 * c.ranks(), 2 * c.ranks()..nic_end, nic_end..loads.len()]
            .into_iter()
            .filter_map(|range| {
                let start = range.start;
                let (i, v) = loads[range].iter().enumerate().fold((0, Bytes(0.0)), |best, (i, &v)| if v.0 > best.1 .0 { (i, v) } else { best });
                (v.0 > 0.0).then_some((start + i, v))
            })
            .collect()
    }

    /// [`round_time`] over the per-class peaks of a round.
    fn timing(&self, peaks: &[(usize, Bytes)], local: BytesPerSecond) -> RoundTiming {
        let mut worst = Seconds(0.0);
        let mut bottleneck = None;
        for &(e, v) in peaks {
            let t = v / self.bandwidth(e, local);
            if bottleneck.is_none() || t.0 > worst.0 {
                worst = t;
                bottleneck = Some(e);
            }
        }
        RoundTiming { time: self.c.alpha + worst, bottleneck }
    }
}

/// Ring ReduceScatter + AllGather over `order`: 2(p−1) rounds of `M/p` to the successor.
fn ring_schedule(order: &[usize], m: Bytes) -> Vec<Stage> {
    let p = order.len();
    if p < 2 {
        return Vec::new();
    }
    let chunk = m / p as f64;
    let round: Vec<Transfer> = (0..p).map(|i| Transfer::P2p { src: order[i], dst: order[(i + 1) % p], bytes: chunk }).collect();
    vec![Stage { phase: "reduce-scatter", transfers: round.clone(), count: p - 1 }, Stage { phase: "all-gather", transfers: round, count: p - 1 }]
}

/// Ring over the GPUs of every host at once: `g − 1` rounds of `chunk`.
fn local_ring(c: &Cluster, phase: &'static str, chunk: Bytes) -> Option<Stage> {
    let g = c.gpus_per_host;
    if g < 2 {
        return None;
    }
    let round: Vec<Transfer> = (0..c.ranks())
        .map(|r| {
            let (h, l) = (r / g, r % g);
            Transfer::P2p { src: r, dst: h * g + (l + 1) % g, bytes: chunk }
        })
        .collect();
    Some(Stage { phase, transfers: round, count: g - 1 })
}

fn schedule(c: &Cluster, m: Bytes, algo: Algo) -> Vec<Stage> {
    let (h, g) = (c.hosts, c.gpus_per_host);
    match algo {
        Algo::Ring => ring_schedule(&(0..c.ranks()).collect::<Vec<_>>(), m),
        Algo::Interleaved => {
            let order: Vec<usize> = (0..g).flat_map(|l| (0..h).map(move |host| host * g + l)).collect();
            ring_schedule(&order, m)
        }
        Algo::Hierarchical | Algo::InNetwork => {
            let shard = m / g as f64;
            let mut out: Vec<Stage> = local_ring(c, "local reduce-scatter", shard).into_iter().collect();
            if h > 1 {
                if algo == Algo::Hierarchical {
                    // The S hosts holding the same shard run a ring on it, each pair on its
                    // own rail: 2(S−1) rounds of (M/g)/S per NIC (§1.5).
                    let round: Vec<Transfer> = (0..c.ranks())
                        .map(|r| {
                            let (host, l) = (r / g, r % g);
                            Transfer::P2p { src: r, dst: ((host + 1) % h) * g + l, bytes: shard / h as f64 }
                        })
                        .collect();
                    out.push(Stage { phase: "cross-host reduce-scatter", transfers: round.clone(), count: h - 1 });
                    out.push(Stage { phase: "cross-host all-gather", transfers: round, count: h - 1 });
                } else {
                    // One round: each NIC sends its shard once, receives the result once (§1.6).
                    let round = (0..c.ranks()).map(|r| Transfer::ViaSwitch { rank: r, bytes: shard }).collect();
                    out.push(Stage { phase: "in-network reduce", transfers: round, count: 1 });
                }
            }
            out.extend(local_ring(c, "local all-gather", shard));
            out
        }
    }
}

/// `count` consecutive identical rounds of an AllReduce report.
#[derive(Clone, Debug, Serialize)]
pub struct RoundGroup {
    /// Index of the group's first round (0-based).
    pub first: usize,
    pub count: usize,
    pub phase: &'static str,
    /// Time of one round of the group.
    pub time: Seconds,
    pub bottleneck: String,
    pub bottleneck_bytes: Bytes,
    pub bottleneck_bandwidth: BytesPerSecond,
}

/// An AllReduce of `bytes` per rank under one algorithm (§1.4–§1.6).
#[derive(Clone, Debug, Serialize)]
pub struct AllReduceReport {
    pub algo: Algo,
    pub ranks: usize,
    pub bytes: Bytes,
    /// Number of rounds.
    pub rounds: usize,
    /// The rounds, consecutive identical ones as one group.
    pub round_groups: Vec<RoundGroup>,
    pub total: Seconds,
    /// `rounds × α`
    pub latency: Seconds,
    /// Bytes that leave their host, both directions summed.
    pub cross_host_bytes: Bytes,
    /// Bytes sent by each NIC port (host-major).
    pub nic_tx_bytes: Vec<Bytes>,
    pub max_nic_bytes: Bytes,
    /// Most bytes sent by one rank (§1.4: `2(p−1)/p · M` for a ring).
    pub max_rank_bytes: Bytes,
    /// Bytes sent by all ranks together.
    pub total_bytes: Bytes,
}

/// A stage's per-class peak loads and repeat count, for re-timing under another local bandwidth.
type StagePeaks = (usize, Vec<(usize, Bytes)>);

/// The report and each stage's peaks.
fn evaluate(c: &Cluster, m: Bytes, algo: Algo) -> Result<(AllReduceReport, Vec<StagePeaks>), ModelError> {
    c.validate()?;
    non_negative("bytes", m.0)?;
    let fabric = Fabric { c };
    let mut nic_tx_bytes = vec![Bytes(0.0); c.hosts * c.ports_per_host];
    let mut rank_bytes = vec![Bytes(0.0); c.ranks()];
    let (mut groups, mut peaks, mut cross_host_bytes, mut first) = (Vec::new(), Vec::new(), Bytes(0.0), 0);
    for stage in schedule(c, m, algo) {
        let n = stage.count as f64;
        for t in &stage.transfers {
            match *t {
                Transfer::P2p { src, bytes, .. } => rank_bytes[src] += bytes * n,
                Transfer::ViaSwitch { rank, bytes } => rank_bytes[rank] += bytes * n,
            }
        }
        let (loads, cross) = fabric.loads(&stage.transfers);
        cross_host_bytes += cross * n;
        for (port, sent) in nic_tx_bytes.iter_mut().enumerate() {
            *sent += loads[fabric.nic(port / c.ports_per_host, port % c.ports_per_host, false)] * n;
        }
        let p = fabric.peaks(&loads);
        let t = fabric.timing(&p, c.local);
        let (bottleneck, bottleneck_bytes, bottleneck_bandwidth) = match t.bottleneck {
            Some(e) => {
                let r = fabric.resource(e, c.local);
                (r.name, loads[e], r.bandwidth)
            }
            None => ("none".to_string(), Bytes(0.0), BytesPerSecond(0.0)),
        };
        groups.push(RoundGroup { first, count: stage.count, phase: stage.phase, time: t.time, bottleneck, bottleneck_bytes, bottleneck_bandwidth });
        peaks.push((stage.count, p));
        first += stage.count;
    }
    let total = groups.iter().map(|g| g.time * g.count as f64).sum();
    let report = AllReduceReport {
        algo,
        ranks: c.ranks(),
        bytes: m,
        latency: c.alpha * first as f64,
        rounds: first,
        round_groups: groups,
        total,
        cross_host_bytes,
        max_nic_bytes: nic_tx_bytes.iter().copied().fold(Bytes(0.0), Bytes::max),
        nic_tx_bytes,
        max_rank_bytes: rank_bytes.iter().copied().fold(Bytes(0.0), Bytes::max),
        total_bytes: rank_bytes.into_iter().sum(),
    };
    Ok((report, peaks))
}

/// `T_comm = Σ_rounds (α + max_e V_{r,e} / B_e)` for `algo` on `c` (§1.3–§1.6). Cost grows
/// with ranks × stages, not ranks × rounds.
pub fn allreduce(c: &Cluster, m: Bytes, algo: Algo) -> Result<AllReduceReport, ModelError> {
    evaluate(c, m, algo).map(|(r, _)| r)
}

/// Local bandwidth at which the hierarchical AllReduce costs exactly what the flat ring costs
/// on this cluster today (§1.5: ≈ 50 GB/s = one NIC on the HGX box). Above it hierarchy wins.
/// `None` when no local bandwidth makes hierarchy win (its cross-host phase alone is slower).
/// The loads do not depend on the local bandwidth: they are computed once and only re-timed.
pub fn break_even_local(c: &Cluster, m: Bytes) -> Result<Option<BytesPerSecond>, ModelError> {
    let target = allreduce(c, m, Algo::Ring)?.total;
    let (_, stages) = evaluate(c, m, Algo::Hierarchical)?;
    let fabric = Fabric { c };
    let hier = |b: f64| -> f64 { stages.iter().map(|(n, p)| fabric.timing(p, BytesPerSecond(b)).time.0 * *n as f64).sum() };
    // The hierarchical time falls monotonically with local bandwidth; bisect in log space.
    let (mut lo, mut hi) = (1.0f64.ln(), 1e18f64.ln());
    if hier(hi.exp()) >= target.0 {
        return Ok(None);
    }
    if hier(lo.exp()) <= target.0 {
        return Ok(Some(BytesPerSecond(lo.exp())));
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if hier(mid.exp()) > target.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(BytesPerSecond(hi.exp())))
}

#[cfg(test)]
#[path = "collective_tests.rs"]
mod tests;
