//! Access path and connection state (docs/models.md §6; for `agent model`, not used in live
//! attribution).
//!
//! One 64 B remote read is the sum of its stage latencies; the total is `fixed + 2L` for a
//! one-way link latency `L`. docs/models.md lists the stage costs; which stages each path crosses
//! is this module's reading of the chapter: the PCIe NIC path posts a descriptor, rings a
//! doorbell and has the NIC fetch the descriptor and write payload and completion back by
//! DMA; the UB async engine sits on the on-chip bus (bus crossings instead of PCIe, an
//! on-chip CQ polled in 5 ns, a sequence number per request); the load path is a CPU load
//! that crosses the on-chip bus and the NIC stages with no software or completion at all.

use serde::Serialize;

use super::{non_negative, positive, ModelError};
use crate::units::{Bytes, Seconds};

/// NIC pipeline clock: 322 MHz.
pub const NIC_CLOCK_HZ: f64 = 322e6;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessPath {
    PcieNic,
    UbAsync,
    Load,
}

impl AccessPath {
    pub const ALL: [AccessPath; 3] = [AccessPath::PcieNic, AccessPath::UbAsync, AccessPath::Load];
    pub fn name(self) -> &'static str {
        match self {
            AccessPath::PcieNic => "pcie-nic",
            AccessPath::UbAsync => "ub-async",
            AccessPath::Load => "load",
        }
    }
    /// NIC pipeline cycles per NIC stage on this path.
    pub fn nic_cycles(self) -> f64 {
        match self {
            AccessPath::PcieNic => 9.0,
            AccessPath::UbAsync => 25.0,
            AccessPath::Load => 8.0,
        }
    }
}

/// One stage of a remote read.
#[derive(Clone, Debug, Serialize)]
pub struct Stage {
    pub name: &'static str,
    pub latency: Seconds,
    /// Whether the stage also carries the link's one-way latency `L`.
    pub plus_link: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct AccessReport {
    pub path: AccessPath,
    pub stages: Vec<Stage>,
    /// Sum of the stage latencies without the link.
    pub fixed: Seconds,
    /// `fixed + 2L`
    pub total: Seconds,
}

fn stage(name: &'static str, ns: f64) -> Stage {
    Stage { name, latency: Seconds::ns(ns), plus_link: false }
}

/// Stage table of one 64 B remote read on `path` with one-way link latency `link`.
pub fn remote_read(path: AccessPath, link: Seconds) -> Result<AccessReport, ModelError> {
    non_negative("link latency", link.0)?;
    let nic = path.nic_cycles() / NIC_CLOCK_HZ * 1e9;
    let wire = |name| Stage { name, latency: Seconds::ns(100.0), plus_link: true };
    let stages = match path {
        AccessPath::PcieNic => vec![
            stage("software post", 50.0),
            stage("descriptor write", 30.0),
            stage("doorbell (MMIO over PCIe)", 150.0),
            stage("descriptor DMA read", 500.0),
            stage("NIC pipeline, requester tx", nic),
            wire("wire, request"),
            stage("NIC pipeline, responder rx", nic),
            stage("DRAM row hit", 30.0),
            stage("NIC pipeline, responder tx", nic),
            wire("wire, response"),
            stage("NIC pipeline, requester rx", nic),
            stage("payload DMA write", 250.0),
            stage("completion DMA write", 250.0),
            stage("CQ poll", 70.0),
            stage("library poll", 30.0),
        ],
        AccessPath::UbAsync => vec![
            stage("software post", 50.0),
            stage("sequence allocation", 50.0),
            stage("descriptor write", 30.0),
            stage("on-chip bus to engine", 30.0),
            stage("NIC pipeline, requester tx", nic),
            wire("wire, request"),
            stage("NIC pipeline, responder rx", nic),
            stage("on-chip bus to memory", 30.0),
            stage("DRAM row hit", 30.0),
            stage("on-chip bus from memory", 30.0),
            stage("NIC pipeline, responder tx", nic),
            wire("wire, response"),
            stage("NIC pipeline, requester rx", nic),
            stage("on-chip bus, payload write", 30.0),
            stage("CQ poll (on-chip)", 5.0),
            stage("library poll", 30.0),
        ],
        AccessPath::Load => vec![
            stage("on-chip bus, core to port", 30.0),
            stage("NIC pipeline, requester tx", nic),
            wire("wire, request"),
            stage("NIC pipeline, responder rx", nic),
            stage("on-chip bus to memory", 30.0),
            stage("DRAM row hit", 30.0),
            stage("on-chip bus from memory", 30.0),
            stage("NIC pipeline, responder tx", nic),
            wire("wire, response"),
            stage("NIC pipeline, requester rx", nic),
            stage("on-chip bus, port to core", 30.0),
        ],
    };
    let fixed: Seconds = stages.iter().map(|s| s.latency).sum();
    let links = stages.iter().filter(|s| s.plus_link).count() as f64;
    Ok(AccessReport { path, stages, fixed, total: fixed + link * links })
}

/// Stage-in (copy once, then access locally) vs accessing remotely every time.
#[derive(Clone, Debug, Serialize)]
pub struct StageIn {
    /// `T_remote = t_r · r`
    pub remote: Seconds,
    /// `T_stage = t_s + t_l · r`
    pub staged: Seconds,
    /// `t_s / (t_r − t_l)`: staging wins above this many accesses (`None`: never).
    pub crossover: Option<f64>,
}

pub fn stage_in(t_remote: Seconds, t_stage: Seconds, t_local: Seconds, reuse: f64) -> Result<StageIn, ModelError> {
    non_negative("remote access time", t_remote.0)?;
    non_negative("stage-in time", t_stage.0)?;
    non_negative("local access time", t_local.0)?;
    non_negative("accesses", reuse)?;
    let gain = t_remote - t_local;
    Ok(StageIn { remote: t_remote * reuse, staged: t_stage + t_local * reuse, crossover: (gain.0 > 0.0).then(|| t_stage / gain) })
}

/// Connection state sizes (§6). `L` local processes, `P` peers, `e` bytes per endpoint, `r`
/// bytes of addressing per (process, peer), `t` bytes of transport state per connection,
/// `K` shared-transport groups.
#[derive(Clone, Debug, Serialize)]
pub struct StateInput {
    pub processes: usize,
    pub peers: usize,
    pub endpoint: Bytes,
    pub addressing: Bytes,
    pub transport: Bytes,
    pub groups: usize,
    /// RC comparison: `N` nodes, `M` processes per node.
    pub nodes: usize,
    pub per_node: usize,
    pub cache: Bytes,
}

#[derive(Clone, Debug, Serialize)]
pub struct StateRow {
    pub scheme: &'static str,
    pub bytes: Bytes,
    pub fits_cache: bool,
    /// Largest peer (or node) count that still fits the cache.
    pub max_fitting: Option<u64>,
}

/// `bytes = a + b·x`: largest whole `x` with `bytes ≤ cache`.
fn max_fit(a: f64, b: f64, cache: f64) -> Option<u64> {
    if a > cache {
        None
    } else if b <= 0.0 {
        Some(u64::MAX)
    } else {
        Some(((cache - a) / b + 1e-9).floor() as u64)
    }
}

pub fn state(i: &StateInput) -> Result<Vec<StateRow>, ModelError> {
    positive("cache size", i.cache.0)?;
    for (what, b) in [("endpoint state", i.endpoint), ("addressing state", i.addressing), ("transport state", i.transport)] {
        non_negative(what, b.0)?;
    }
    let (l, p, k) = (i.processes as f64, i.peers as f64, i.groups as f64);
    let (e, r, t) = (i.endpoint.0, i.addressing.0, i.transport.0);
    let (n, m) = (i.nodes as f64, i.per_node as f64);
    let cache = i.cache.0;
    // Each scheme as a + b·x in its scaling variable (peers P, or nodes N for the RC rows).
    let rows: [(&'static str, f64, f64); 5] = [
        ("private: L e + L P (r + t)", l * e, l * (r + t)),
        ("shared: L e + L P r + P t", l * e, l * r + t),
        ("K groups: L e + L P r + K P t", l * e, l * r + k * t),
        ("per-pair RC: 512 N M + 32 N", 0.0, 512.0 * m + 32.0),
        ("shared endpoints: 52 N + 56 M", 56.0 * m, 52.0),
    ];
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(idx, (scheme, a, b))| {
            let x = if idx < 3 { p } else { n };
            let bytes = a + b * x;
            StateRow { scheme, bytes: Bytes(bytes), fits_cache: bytes <= cache, max_fitting: max_fit(a, b, cache) }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::close;

    #[test]
    fn total_is_fixed_plus_two_link_latencies() {
        for path in AccessPath::ALL {
            let a = remote_read(path, Seconds(0.0)).unwrap();
            let b = remote_read(path, Seconds::us(1.0)).unwrap();
            close((b.total - a.total).in_us(), 2.0, 1e-9, path.name());
            close(a.fixed.0, a.stages.iter().map(|s| s.latency.0).sum(), 1e-12, "sum of stages");
        }
        // Fewer software and DMA stages make the load path the shortest.
        let pcie = remote_read(AccessPath::PcieNic, Seconds(0.0)).unwrap().total;
        let load = remote_read(AccessPath::Load, Seconds(0.0)).unwrap().total;
        assert!(load.0 < pcie.0);
        // 9 NIC cycles at 322 MHz ≈ 27.95 ns.
        close(AccessPath::PcieNic.nic_cycles() / NIC_CLOCK_HZ * 1e9, 27.950_310_559, 1e-9, "cycles");
    }

    #[test]
    fn stage_in_crossover() {
        let s = stage_in(Seconds::us(2.0), Seconds::us(10.0), Seconds::ns(100.0), 10.0).unwrap();
        close(s.crossover.unwrap(), 10.0 / 1.9, 1e-12, "r* = t_s/(t_r − t_l)");
        close(s.remote.in_us(), 20.0, 1e-12, "remote");
        close(s.staged.in_us(), 11.0, 1e-12, "staged");
        assert!(stage_in(Seconds::ns(50.0), Seconds::us(1.0), Seconds::ns(100.0), 1.0).unwrap().crossover.is_none());
    }

    #[test]
    fn state_formulas() {
        let i = StateInput {
            processes: 8,
            peers: 1000,
            endpoint: Bytes(64.0),
            addressing: Bytes(16.0),
            transport: Bytes(256.0),
            groups: 2,
            nodes: 1000,
            per_node: 8,
            cache: Bytes::mib(2.0),
        };
        let rows = state(&i).unwrap();
        close(rows[0].bytes.0, 8.0 * 64.0 + 8.0 * 1000.0 * (16.0 + 256.0), 1e-12, "private");
        close(rows[1].bytes.0, 8.0 * 64.0 + 8.0 * 1000.0 * 16.0 + 1000.0 * 256.0, 1e-12, "shared");
        close(rows[2].bytes.0, 8.0 * 64.0 + 8.0 * 1000.0 * 16.0 + 2.0 * 1000.0 * 256.0, 1e-12, "K groups");
        close(rows[3].bytes.0, 512.0 * 1000.0 * 8.0 + 32.0 * 1000.0, 1e-12, "RC");
        close(rows[4].bytes.0, 52.0 * 1000.0 + 56.0 * 8.0, 1e-12, "shared endpoints");
        // The overflow point is where the state crosses the cache.
        for r in &rows[..3] {
            let m = r.max_fitting.unwrap() as f64;
            let fits = |x: f64| {
                let one = state(&StateInput { peers: x as usize, ..i.clone() }).unwrap();
                one.into_iter().find(|o| o.scheme == r.scheme).unwrap().fits_cache
            };
            assert!(fits(m) && !fits(m + 1.0), "{}", r.scheme);
        }
    }
}
