//! The round model and AllReduce placements (docs/models.md §1.3–§1.6).
//!
//! A collective is a sequence of synchronous rounds; in a round every rank sends to its
//! partner, the bytes land on resources (a GPU's local link, a NIC port, a shared PCIe slot,
//! each direction separately: full duplex, §1.1), and
//! `T_comm = Σ_rounds (α + max_e V_{r,e} / B_e)` (§1.3).

use serde::Serialize;

use super::{at_least, non_negative, positive, ModelError};
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

/// Resource layout of a [`Cluster`]: local tx/rx per GPU, NIC tx/rx per port, slot tx/rx
/// per host.
struct Fabric<'a> {
    c: &'a Cluster,
    resources: Vec<Resource>,
}

impl<'a> Fabric<'a> {
    fn new(c: &'a Cluster) -> Fabric<'a> {
        let mut resources = Vec::new();
        for dir in ["tx", "rx"] {
            for r in 0..c.ranks() {
                resources.push(Resource { name: format!("h{}.gpu{} local-{dir}", r / c.gpus_per_host, r % c.gpus_per_host), bandwidth: c.local });
            }
        }
        for dir in ["tx", "rx"] {
            for h in 0..c.hosts {
                for port in 0..c.ports_per_host {
                    resources.push(Resource { name: format!("h{h}.nic{port} {dir}"), bandwidth: c.nic });
                }
            }
        }
        if let Some(slot) = c.slot {
            for dir in ["tx", "rx"] {
                for h in 0..c.hosts {
                    resources.push(Resource { name: format!("h{h}.slot {dir}"), bandwidth: slot });
                }
            }
        }
        Fabric { c, resources }
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
        let mut loads = vec![Bytes(0.0); self.resources.len()];
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
}

/// Ring ReduceScatter + AllGather over `order`: 2(p−1) rounds of `M/p` to the successor.
fn ring_schedule(order: &[usize], m: Bytes) -> Vec<(&'static str, Vec<Transfer>)> {
    let p = order.len();
    if p < 2 {
        return Vec::new();
    }
    let chunk = m / p as f64;
    let round: Vec<Transfer> = (0..p).map(|i| Transfer::P2p { src: order[i], dst: order[(i + 1) % p], bytes: chunk }).collect();
    let mut out = Vec::new();
    for phase in ["reduce-scatter", "all-gather"] {
        for _ in 0..p - 1 {
            out.push((phase, round.clone()));
        }
    }
    out
}

/// Ring over the GPUs of every host at once, `rounds` rounds of `chunk`.
fn local_ring(c: &Cluster, phase: &'static str, chunk: Bytes) -> Vec<(&'static str, Vec<Transfer>)> {
    let g = c.gpus_per_host;
    if g < 2 {
        return Vec::new();
    }
    let round: Vec<Transfer> = (0..c.ranks())
        .map(|r| {
            let (h, l) = (r / g, r % g);
            Transfer::P2p { src: r, dst: h * g + (l + 1) % g, bytes: chunk }
        })
        .collect();
    vec![(phase, round); g - 1]
}

fn schedule(c: &Cluster, m: Bytes, algo: Algo) -> Vec<(&'static str, Vec<Transfer>)> {
    let (h, g) = (c.hosts, c.gpus_per_host);
    match algo {
        Algo::Ring => ring_schedule(&(0..c.ranks()).collect::<Vec<_>>(), m),
        Algo::Interleaved => {
            let order: Vec<usize> = (0..g).flat_map(|l| (0..h).map(move |host| host * g + l)).collect();
            ring_schedule(&order, m)
        }
        Algo::Hierarchical | Algo::InNetwork => {
            let shard = m / g as f64;
            let mut out = local_ring(c, "local reduce-scatter", shard);
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
                    for phase in ["cross-host reduce-scatter", "cross-host all-gather"] {
                        for _ in 0..h - 1 {
                            out.push((phase, round.clone()));
                        }
                    }
                } else {
                    // One round: each NIC sends its shard once, receives the result once (§1.6).
                    let round = (0..c.ranks()).map(|r| Transfer::ViaSwitch { rank: r, bytes: shard }).collect();
                    out.push(("in-network reduce", round));
                }
            }
            out.extend(local_ring(c, "local all-gather", shard));
            out
        }
    }
}

/// One round of an AllReduce report.
#[derive(Clone, Debug, Serialize)]
pub struct RoundReport {
    pub index: usize,
    pub phase: &'static str,
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
    pub rounds: Vec<RoundReport>,
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

pub fn allreduce(c: &Cluster, m: Bytes, algo: Algo) -> Result<AllReduceReport, ModelError> {
    c.validate()?;
    non_negative("bytes", m.0)?;
    let fabric = Fabric::new(c);
    let nic_tx = |port: usize| fabric.nic(port / c.ports_per_host, port % c.ports_per_host, false);
    let mut nic_tx_bytes = vec![Bytes(0.0); c.hosts * c.ports_per_host];
    let mut rounds = Vec::new();
    let mut cross_host_bytes = Bytes(0.0);
    let mut rank_bytes = vec![Bytes(0.0); c.ranks()];
    for (index, (phase, transfers)) in schedule(c, m, algo).into_iter().enumerate() {
        for t in &transfers {
            match *t {
                Transfer::P2p { src, bytes, .. } => rank_bytes[src] += bytes,
                Transfer::ViaSwitch { rank, bytes } => rank_bytes[rank] += bytes,
            }
        }
        let (loads, cross) = fabric.loads(&transfers);
        cross_host_bytes += cross;
        for (port, sent) in nic_tx_bytes.iter_mut().enumerate() {
            *sent += loads[nic_tx(port)];
        }
        let t = round_time(&fabric.resources, &loads, c.alpha);
        let (bottleneck, bottleneck_bytes, bottleneck_bandwidth) = match t.bottleneck {
            Some(e) => (fabric.resources[e].name.clone(), loads[e], fabric.resources[e].bandwidth),
            None => ("none".to_string(), Bytes(0.0), BytesPerSecond(0.0)),
        };
        rounds.push(RoundReport { index, phase, time: t.time, bottleneck, bottleneck_bytes, bottleneck_bandwidth });
    }
    let total = rounds.iter().map(|r| r.time).sum();
    let max_nic_bytes = nic_tx_bytes.iter().copied().fold(Bytes(0.0), Bytes::max);
    Ok(AllReduceReport {
        algo,
        ranks: c.ranks(),
        bytes: m,
        latency: c.alpha * rounds.len() as f64,
        rounds,
        total,
        cross_host_bytes,
        nic_tx_bytes,
        max_nic_bytes,
        max_rank_bytes: rank_bytes.iter().copied().fold(Bytes(0.0), Bytes::max),
        total_bytes: rank_bytes.into_iter().sum(),
    })
}

/// Local bandwidth at which the hierarchical AllReduce costs exactly what the flat ring costs
/// on this cluster today (§1.5: ≈ 50 GB/s = one NIC on the HGX box). Above it hierarchy wins.
/// `None` when no local bandwidth makes hierarchy win (its cross-host phase alone is slower).
pub fn break_even_local(c: &Cluster, m: Bytes) -> Result<Option<BytesPerSecond>, ModelError> {
    let target = allreduce(c, m, Algo::Ring)?.total;
    let hier = |b: f64| -> Result<f64, ModelError> {
        let c2 = Cluster { local: BytesPerSecond(b), ..c.clone() };
        Ok(allreduce(&c2, m, Algo::Hierarchical)?.total.0)
    };
    // The hierarchical time falls monotonically with local bandwidth; bisect in log space.
    let (mut lo, mut hi) = (1.0f64.ln(), 1e18f64.ln());
    if hier(hi.exp())? >= target.0 {
        return Ok(None);
    }
    if hier(lo.exp())? <= target.0 {
        return Ok(Some(BytesPerSecond(lo.exp())));
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if hier(mid.exp())? > target.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(BytesPerSecond(hi.exp())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{close, digit};

    fn m() -> Bytes {
        Bytes::mib(192.0)
    }

    #[test]
    fn check_ring_volume() {
        // §1.4 [check]: p = 16, M = 192 MiB: 360 MiB per rank, 5760 MiB total, 30 rounds.
        let v = ring_volume(16, m()).unwrap();
        assert_eq!(v.per_rank, Bytes::mib(360.0));
        assert_eq!(v.total, Bytes::mib(5760.0));
        assert_eq!(v.rounds, 30);
        let r = allreduce(&Cluster::hgx(), m(), Algo::Ring).unwrap();
        close(r.max_rank_bytes.in_mib(), 360.0, 1e-12, "per rank");
        close(r.total_bytes.in_mib(), 5760.0, 1e-12, "total");
    }

    #[test]
    fn check_placements_on_hgx() {
        // §1.5 [check]: flat ≈ 7.6 ms, interleaved ≈ 7.6 ms, hierarchical ≈ 1.3 ms;
        // cross-server bytes 720 / 5760 / 384 MiB; −47 % bytes, −83 % time.
        let c = Cluster::hgx();
        let flat = allreduce(&c, m(), Algo::Ring).unwrap();
        let inter = allreduce(&c, m(), Algo::Interleaved).unwrap();
        let hier = allreduce(&c, m(), Algo::Hierarchical).unwrap();
        digit(flat.total.in_ms(), 7.6, 0.1, "flat");
        digit(inter.total.in_ms(), 7.6, 0.1, "interleaved");
        digit(hier.total.in_ms(), 1.3, 0.1, "hierarchical");
        assert_eq!(flat.rounds.len(), 30);
        assert_eq!(hier.rounds.len(), 16);
        close(flat.cross_host_bytes.in_mib(), 720.0, 1e-12, "flat cross");
        close(inter.cross_host_bytes.in_mib(), 5760.0, 1e-12, "interleaved cross");
        close(hier.cross_host_bytes.in_mib(), 384.0, 1e-12, "hierarchical cross");
        digit((1.0 - hier.cross_host_bytes / flat.cross_host_bytes) * 100.0, 47.0, 1.0, "bytes saved %");
        digit((1.0 - hier.total / flat.total) * 100.0, 83.0, 1.0, "time saved %");
        // The book's closed form: 14·24 MiB/450 GB/s + 2·12 MiB/50 GB/s + 16·α.
        let closed = Bytes::mib(24.0) * 14.0 / c.local + Bytes::mib(12.0) * 2.0 / c.nic + c.alpha * 16.0;
        close(hier.total.0, closed.0, 1e-12, "closed form");
        // Flat ring: one NIC per server carries 12 MiB per round.
        assert!(flat.rounds[0].bottleneck.contains("nic7"), "{}", flat.rounds[0].bottleneck);
        close(flat.rounds[0].bottleneck_bytes.in_mib(), 12.0, 1e-12, "per-round NIC bytes");
    }

    #[test]
    fn check_break_even_local_bandwidth() {
        // §1.5 [check]: break-even local bandwidth ≈ 50 GB/s (= one NIC).
        let b = break_even_local(&Cluster::hgx(), m()).unwrap().unwrap();
        close(b.in_gb_s(), 50.0, 0.01, "break-even");
    }

    #[test]
    fn check_pcie_reference_flips() {
        // §1.5 [check]: on the PCIe box flat ≈ 11.0 ms and hierarchical is larger.
        let c = Cluster::pcie_reference();
        let flat = allreduce(&c, m(), Algo::Ring).unwrap();
        let hier = allreduce(&c, m(), Algo::Hierarchical).unwrap();
        digit(flat.total.in_ms(), 11.0, 0.1, "PCIe flat");
        assert!(hier.total.0 > flat.total.0, "hierarchical {} vs flat {}", hier.total, flat.total);
        let cross = hier.rounds.iter().find(|r| r.phase.starts_with("cross")).unwrap();
        assert!(cross.bottleneck.contains("slot"), "{}", cross.bottleneck);
        // Hierarchy would need more local bandwidth than the box has.
        let b = break_even_local(&c, m()).unwrap().unwrap();
        assert!(b.0 > c.local.0);
    }

    #[test]
    fn in_network_has_one_cross_round() {
        let c = Cluster::hgx();
        let r = allreduce(&c, m(), Algo::InNetwork).unwrap();
        assert_eq!(r.rounds.len(), 15);
        close(r.max_nic_bytes.in_mib(), 24.0, 1e-12, "each NIC sends its shard once");
        // Across S servers the ring sends 2(S−1)/S shards per NIC: more than one for S > 2.
        let big = Cluster { hosts: 8, ..Cluster::hgx() };
        let ring = allreduce(&big, m(), Algo::Hierarchical).unwrap();
        let inn = allreduce(&big, m(), Algo::InNetwork).unwrap();
        close(ring.max_nic_bytes / inn.max_nic_bytes, 2.0 * 7.0 / 8.0, 1e-12, "shards per NIC");
    }

    #[test]
    fn property_one_resource_rounds_equal_cut_bound() {
        // §1.3 vs §1.1: with α = 0 and one resource per round, Σ rounds = V / B.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..50 {
            let n = 1 + (crate::model::ecmp::xorshift(&mut seed) % 20) as usize;
            let b = BytesPerSecond(1e9 + (crate::model::ecmp::xorshift(&mut seed) % 1000) as f64 * 1e8);
            let res = [Resource { name: "cut".into(), bandwidth: b }];
            let rounds: Vec<Vec<Bytes>> = (0..n).map(|_| vec![Bytes((crate::model::ecmp::xorshift(&mut seed) % 1_000_000) as f64)]).collect();
            let total: Bytes = rounds.iter().map(|r| r[0]).sum();
            close(rounds_time(&res, &rounds, Seconds(0.0)).0, (total / b).0, 1e-12, "cut bound");
        }
        // The flat ring on a single host with α = 0 is pure NVLink: 2(p−1)/p·M / B_L.
        let c = Cluster { hosts: 1, alpha: Seconds(0.0), ..Cluster::hgx() };
        let r = allreduce(&c, m(), Algo::Ring).unwrap();
        close(r.total.0, (ring_volume(8, m()).unwrap().per_rank / c.local).0, 1e-12, "single host ring");
    }

    #[test]
    fn bad_clusters_are_errors() {
        let c = Cluster { nic: BytesPerSecond(0.0), ..Cluster::hgx() };
        assert!(matches!(allreduce(&c, m(), Algo::Ring), Err(ModelError::NotPositive { .. })));
        let c = Cluster { hosts: 0, ..Cluster::hgx() };
        assert!(allreduce(&c, m(), Algo::Ring).is_err());
    }
}
