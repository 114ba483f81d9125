//! Access path and connection state (docs/models.md §6; for `agent model`, not used in live
//! attribution).
//!
//! One 64 B remote read is the sum of its stage latencies; the total is `fixed + 2L` for a
//! one-way link latency `L`. Which stages each path crosses is the per-path stage table of
//! docs/models.md §6, transcribed row for row into [`TABLE`] (critical-path order, "—" = `None`).
//! Every stage carries the category the chapter stacks its bars by, so a path's total also
//! splits into software post, PCIe crossings, on-chip bus, NIC pipeline, wire, and memory and
//! completion. The fourth path (a NIC-internal descriptor processor) is the chapter's "PCIe
//! path without doorbell and descriptor DMA".

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
    /// The PCIe NIC with a descriptor processor inside the NIC: no doorbell, no descriptor DMA.
    NicInternal,
}

impl AccessPath {
    pub const ALL: [AccessPath; 4] = [AccessPath::PcieNic, AccessPath::UbAsync, AccessPath::Load, AccessPath::NicInternal];
    pub fn name(self) -> &'static str {
        match self {
            AccessPath::PcieNic => "pcie-nic",
            AccessPath::UbAsync => "ub-async",
            AccessPath::Load => "load",
            AccessPath::NicInternal => "nic-internal",
        }
    }
    /// The chapter's name for the path.
    pub fn label(self) -> &'static str {
        match self {
            AccessPath::PcieNic => "PCIe NIC",
            AccessPath::UbAsync => "UB async read",
            AccessPath::Load => "UB load",
            AccessPath::NicInternal => "NIC-internal descriptor processing",
        }
    }
    /// NIC pipeline cycles per NIC stage on this path (the NIC-internal path is a PCIe NIC).
    pub fn nic_cycles(self) -> f64 {
        match self {
            AccessPath::PcieNic | AccessPath::NicInternal => 9.0,
            AccessPath::UbAsync => 25.0,
            AccessPath::Load => 8.0,
        }
    }
    /// Column of this path in [`TABLE`].
    fn column(self) -> usize {
        self as usize
    }
}

/// What a stage's time is spent on: the stacks of the chapter's access-path figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    SoftwarePost,
    PcieCrossing,
    OnChipBus,
    NicPipeline,
    Wire,
    MemoryAndCompletion,
}

impl Category {
    pub const ALL: [Category; 6] =
        [Category::SoftwarePost, Category::PcieCrossing, Category::OnChipBus, Category::NicPipeline, Category::Wire, Category::MemoryAndCompletion];
    pub fn name(self) -> &'static str {
        match self {
            Category::SoftwarePost => "software post",
            Category::PcieCrossing => "PCIe crossing",
            Category::OnChipBus => "on-chip bus",
            Category::NicPipeline => "NIC pipeline",
            Category::Wire => "wire",
            Category::MemoryAndCompletion => "memory and completion",
        }
    }
}

/// A stage's cost on one path.
#[derive(Clone, Copy, Debug)]
enum Cost {
    Ns(f64),
    /// The path's NIC pipeline cycles at [`NIC_CLOCK_HZ`].
    Cycles,
    /// The one-way link latency `L`.
    Link,
}

/// One row of the docs/models.md §6 stage table; `cost` per path in [`AccessPath::ALL`] order.
struct Row {
    stage: &'static str,
    category: Category,
    cost: [Option<Cost>; 4],
}

const fn ns(x: f64) -> Option<Cost> {
    Some(Cost::Ns(x))
}
const CY: Option<Cost> = Some(Cost::Cycles);
const L: Option<Cost> = Some(Cost::Link);
const NO: Option<Cost> = None;

const fn row(stage: &'static str, category: Category, cost: [Option<Cost>; 4]) -> Row {
    Row { stage, category, cost }
}

use Category::{MemoryAndCompletion as Mem, NicPipeline as Nic, OnChipBus as Bus, PcieCrossing as Pcie, SoftwarePost as Sw, Wire};

/// docs/models.md §6, columns PCIe NIC | UB async read | UB load | NIC-internal (the PCIe column
/// without doorbell and descriptor DMA). The serialised sequence-number allocation is work the
/// library does to issue the request, so it stacks with the software post.
#[rustfmt::skip]
const TABLE: [Row; 20] = [
    row("software post (library)",                 Sw,   [ns(50.0),  ns(50.0), NO,       ns(50.0)]),
    row("request descriptor build",                Sw,   [ns(30.0),  ns(30.0), NO,       ns(30.0)]),
    row("doorbell write (PCIe)",                   Pcie, [ns(150.0), NO,       NO,       NO]),
    row("descriptor DMA read by the NIC (PCIe)",   Pcie, [ns(500.0), NO,       NO,       NO]),
    row("on-chip bus, send",                       Bus,  [NO,        ns(30.0), ns(30.0), NO]),
    row("NIC tx pipeline",                         Nic,  [CY,        CY,       CY,       CY]),
    row("wire, request",                           Wire, [L,         L,        L,        L]),
    row("target NIC rx pipeline",                  Nic,  [CY,        CY,       CY,       CY]),
    row("target host-memory DMA read (PCIe)",      Pcie, [ns(500.0), NO,       NO,       ns(500.0)]),
    row("target on-chip bus memory access",        Bus,  [NO,        ns(30.0), ns(30.0), NO]),
    row("target DRAM row hit",                     Mem,  [ns(30.0),  ns(30.0), ns(30.0), ns(30.0)]),
    row("target NIC response pipeline",            Nic,  [CY,        CY,       CY,       CY]),
    row("wire, response",                          Wire, [L,         L,        L,        L]),
    row("requester NIC rx pipeline",               Nic,  [CY,        CY,       CY,       CY]),
    row("payload DMA write (PCIe)",                Pcie, [ns(250.0), NO,       NO,       ns(250.0)]),
    row("completion DMA write (PCIe)",             Pcie, [ns(250.0), NO,       NO,       ns(250.0)]),
    row("on-chip bus, completion",                 Bus,  [NO,        ns(30.0), ns(30.0), NO]),
    row("CQ poll",                                 Mem,  [ns(70.0),  ns(5.0),  NO,       ns(70.0)]),
    row("library poll",                            Mem,  [ns(30.0),  ns(30.0), NO,       ns(30.0)]),
    row("sequence-number allocation (serialised)", Sw,   [ns(50.0),  NO,       NO,       ns(50.0)]),
];

/// One stage of a remote read.
#[derive(Clone, Debug, Serialize)]
pub struct Stage {
    pub name: &'static str,
    pub category: Category,
    pub latency: Seconds,
    /// NIC pipeline stages: the cycles behind `latency`.
    pub cycles: Option<f64>,
    /// The stage is the link's one-way latency `L` (a wire stage).
    pub link: bool,
}

/// The time one path spends in one category, and its share of the path's total.
#[derive(Clone, Debug, Serialize)]
pub struct CategorySum {
    pub category: Category,
    pub latency: Seconds,
    pub share: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct AccessReport {
    pub path: AccessPath,
    pub label: &'static str,
    pub stages: Vec<Stage>,
    /// Every category in [`Category::ALL`] order (zero where the path has none of it).
    pub by_category: Vec<CategorySum>,
    /// Sum of the stage latencies without the link.
    pub fixed: Seconds,
    /// `fixed + 2L`
    pub total: Seconds,
}

impl AccessReport {
    /// Time spent in `c` on this path.
    pub fn category(&self, c: Category) -> &CategorySum {
        &self.by_category[Category::ALL.iter().position(|&x| x == c).unwrap_or(0)]
    }
}

/// Stage table of one 64 B remote read on `path` with one-way link latency `link`.
pub fn remote_read(path: AccessPath, link: Seconds) -> Result<AccessReport, ModelError> {
    non_negative("link latency", link.0)?;
    let cycles = path.nic_cycles();
    let stages: Vec<Stage> = TABLE
        .iter()
        .filter_map(|r| {
            let (latency, cycles, is_link) = match r.cost[path.column()]? {
                Cost::Ns(x) => (Seconds::ns(x), None, false),
                Cost::Cycles => (Seconds(cycles / NIC_CLOCK_HZ), Some(cycles), false),
                Cost::Link => (link, None, true),
            };
            Some(Stage { name: r.stage, category: r.category, latency, cycles, link: is_link })
        })
        .collect();
    let total: Seconds = stages.iter().map(|s| s.latency).sum();
    let fixed: Seconds = stages.iter().filter(|s| !s.link).map(|s| s.latency).sum();
    let by_category = Category::ALL
        .iter()
        .map(|&c| {
            // Folded from +0.0: an empty float sum is −0.0, which would print as "-0.0 %".
            let latency = Seconds(stages.iter().filter(|s| s.category == c).fold(0.0, |acc, s| acc + s.latency.0));
            CategorySum { category: c, latency, share: if total.0 > 0.0 { latency / total } else { 0.0 } }
        })
        .collect();
    Ok(AccessReport { path, label: path.label(), stages, by_category, fixed, total })
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

    /// Whole nanoseconds, the precision the chapter prints its totals to.
    fn whole_ns(s: Seconds) -> i64 {
        s.in_ns().round() as i64
    }

    /// Nanoseconds to two decimals (27.95 ns for 9 cycles).
    fn ns2(s: Seconds) -> f64 {
        (s.in_ns() * 100.0).round() / 100.0
    }

    fn at_100ns(path: AccessPath) -> AccessReport {
        remote_read(path, Seconds::ns(100.0)).unwrap()
    }

    #[test]
    fn chapter_totals_at_l_100ns() {
        // docs/models.md §6 table summed with unrounded pipeline times (4 NIC stages per path):
        // PCIe 1910 + 4·27.95 + 2L, UB async 235 + 4·77.64 + 2L, UB load 120 + 4·24.84 + 2L,
        // NIC-internal = PCIe − doorbell 150 − descriptor DMA 500 (the chapter's ~1 572 ns).
        assert_eq!(whole_ns(at_100ns(AccessPath::PcieNic).total), 2222);
        assert_eq!(whole_ns(at_100ns(AccessPath::UbAsync).total), 746);
        assert_eq!(whole_ns(at_100ns(AccessPath::Load).total), 419);
        assert_eq!(whole_ns(at_100ns(AccessPath::NicInternal).total), 1572);
        assert_eq!(ns2(at_100ns(AccessPath::PcieNic).total), 2221.80);
        assert_eq!(ns2(at_100ns(AccessPath::UbAsync).total), 745.56);
        assert_eq!(ns2(at_100ns(AccessPath::Load).total), 419.38);
        assert_eq!(ns2(at_100ns(AccessPath::NicInternal).total), 1571.80);
    }

    #[test]
    fn paths_have_the_tables_stages() {
        // TABLE's columns are in AccessPath::ALL order.
        assert!(AccessPath::ALL.iter().enumerate().all(|(i, p)| p.column() == i));
        let count = |r: &AccessReport, c: Category| r.stages.iter().filter(|s| s.category == c).count();
        for path in AccessPath::ALL {
            let r = at_100ns(path);
            assert_eq!(count(&r, Category::NicPipeline), 4, "{}: four NIC pipeline stages", path.name());
            assert_eq!(count(&r, Category::Wire), 2, "{}: request and response on the wire", path.name());
        }
        let names = |p| at_100ns(p).stages.iter().map(|s| s.name).collect::<Vec<_>>();
        // The load path has no software post, no descriptor and no completion polling.
        assert_eq!(count(&at_100ns(AccessPath::Load), Category::SoftwarePost), 0);
        assert_eq!(names(AccessPath::Load).len(), 10);
        assert!(!names(AccessPath::Load).iter().any(|n| n.contains("poll")));
        // Only the PCIe paths allocate sequence numbers serially.
        for (p, has) in [(AccessPath::PcieNic, true), (AccessPath::UbAsync, false), (AccessPath::Load, false), (AccessPath::NicInternal, true)] {
            assert_eq!(names(p).contains(&"sequence-number allocation (serialised)"), has, "{}", p.name());
        }
        // The NIC-internal path is the PCIe path minus doorbell and descriptor DMA.
        let mut pcie = names(AccessPath::PcieNic);
        pcie.retain(|n| !n.starts_with("doorbell") && !n.starts_with("descriptor DMA"));
        assert_eq!(names(AccessPath::NicInternal), pcie);
        assert_eq!(ns2(at_100ns(AccessPath::PcieNic).total - at_100ns(AccessPath::NicInternal).total), 650.0);
        // 9 NIC cycles at 322 MHz ≈ 27.95 ns.
        assert_eq!(ns2(at_100ns(AccessPath::PcieNic).stages[4].latency), 27.95);
        assert_eq!(at_100ns(AccessPath::PcieNic).stages[4].cycles, Some(9.0));
    }

    #[test]
    fn category_sums() {
        use Category::*;
        let want: [(AccessPath, [f64; 6]); 4] = [
            (AccessPath::PcieNic, [130.0, 1650.0, 0.0, 111.80, 200.0, 130.0]),
            (AccessPath::UbAsync, [80.0, 0.0, 90.0, 310.56, 200.0, 65.0]),
            (AccessPath::Load, [0.0, 0.0, 90.0, 99.38, 200.0, 30.0]),
            (AccessPath::NicInternal, [130.0, 1000.0, 0.0, 111.80, 200.0, 130.0]),
        ];
        for (path, sums) in want {
            let r = at_100ns(path);
            let got: Vec<f64> = r.by_category.iter().map(|c| ns2(c.latency)).collect();
            assert_eq!(got, sums, "{}", path.name());
            assert_eq!(r.by_category.iter().map(|c| c.category).collect::<Vec<_>>(), Category::ALL);
            close(r.by_category.iter().map(|c| c.share).sum(), 1.0, 1e-12, "shares add up");
        }
        // PCIe crossings are 1650 of the PCIe path's 2221.80 ns: 74.3 %.
        let pcie = at_100ns(AccessPath::PcieNic);
        assert_eq!((pcie.category(PcieCrossing).share * 1000.0).round() / 10.0, 74.3);
        assert_eq!(pcie.category(Wire).latency, Seconds::ns(100.0) * 2.0);
    }

    #[test]
    fn total_is_fixed_plus_two_link_latencies() {
        for path in AccessPath::ALL {
            let a = remote_read(path, Seconds(0.0)).unwrap();
            let b = remote_read(path, Seconds::us(1.0)).unwrap();
            close((b.total - a.total).in_us(), 2.0, 1e-9, path.name());
            close(a.fixed.0, a.total.0, 1e-12, "L = 0: the total is the fixed part");
            close(b.fixed.0, a.fixed.0, 1e-12, "the fixed part does not depend on L");
        }
        assert!(remote_read(AccessPath::Load, Seconds(-1e-9)).is_err());
    }

    #[test]
    fn stage_in_crossover_from_the_path_totals() {
        // The `agent model access` defaults: t_s = 10 µs, t_l = 100 ns, r* = t_s / (t_r − t_l).
        let r = |p| {
            let s = stage_in(at_100ns(p).total, Seconds::us(10.0), Seconds::ns(100.0), 10.0).unwrap();
            (s.crossover.unwrap() * 100.0).round() / 100.0
        };
        assert_eq!(r(AccessPath::PcieNic), 4.71);
        assert_eq!(r(AccessPath::UbAsync), 15.49);
        assert_eq!(r(AccessPath::Load), 31.31);
        assert_eq!(r(AccessPath::NicInternal), 6.79);
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
