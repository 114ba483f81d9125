//! The list endpoints' pages: typed structs serialized straight into the response body.
//! Built with `serde_json::json!`, a page went through a `serde_json::Value` tree first; 10
//! parallel listings of 10 000 markers then raised the agent's peak RSS by ~24 MiB (measured
//! with 10 000 markers held, flood + listings + 300 idle connections per round: VmHWM 43.9 →
//! 67.8 MiB in the first round; typed, it stayed at the start-up peak, 44.0 MiB, over 4 rounds).

#[derive(Default, serde::Serialize)]
pub struct CollectivesPage {
    pub host: String,
    pub clock_error_seconds: f64,
    pub clock_synchronized: bool,
    pub evicted: u64,
    pub drained_until: f64,
    pub calls: Vec<crate::sources::collectives::history::CallRecord>,
    pub net_requests: Vec<crate::sources::collectives::history::NetRecord>,
    /// The NICs each traced process uses (`timeline::links`).
    pub links: Vec<crate::timeline::links::ProcessLink>,
}

#[derive(serde::Serialize)]
pub struct StepsPage {
    pub host: String,
    pub steps: Vec<crate::attribution::Attribution>,
}

#[derive(serde::Serialize)]
pub struct MarkersPage {
    pub host: String,
    pub markers: Vec<crate::timeline::Marker>,
    pub truncated: bool,
}

#[derive(serde::Serialize)]
pub struct NicSamples {
    pub nic: crate::timeline::NicInfo,
    pub samples: Vec<crate::timeline::NicSample>,
}

#[derive(serde::Serialize)]
pub struct WindowsPage {
    pub host: String,
    pub nics: Vec<NicSamples>,
}

/// `/api/v1/collectives?format=compact`: the same calls with only what a cluster join needs
/// (`timeline::join::CallView` less the host, which is the page's), one array per call and
/// each string once. A call is ~75 bytes of JSON instead of ~350, so `agent diagnose` over
/// 128 hosts × 8 ranks × 1 000 steps moves ~75 MB instead of ~360 MB.
#[derive(serde::Serialize)]
pub struct CompactCollectivesPage {
    pub host: String,
    pub clock_error_seconds: f64,
    pub clock_synchronized: bool,
    pub evicted: u64,
    pub drained_until: f64,
    /// Communicator ids (16 hex digits) the rows name by index.
    pub comms: Vec<String>,
    /// Operation names the rows name by index.
    pub ops: Vec<String>,
    /// Library names (`nccl`, `mpi`, …) the rows name by index.
    pub libraries: Vec<String>,
    /// How calls were timed (`gpu`, `host_completion`, …), named by index.
    pub timings: Vec<crate::timeline::join::Timing>,
    pub rows: Vec<CallRow>,
    pub net_requests: Vec<crate::sources::collectives::history::NetRecord>,
    pub links: Vec<crate::timeline::links::ProcessLink>,
}

/// One call of a [`CompactCollectivesPage`]: comm (index), seq, op (index), library (index),
/// bytes, rank, nranks, pid, enter, exit (wall seconds), flags ([`CallRow::GLOBAL`],
/// [`CallRow::ABORTED`]), timing (index), and the GPU timing's extras (`null` without).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallRow(
    pub Option<u32>,
    pub Option<u64>,
    pub u32,
    pub u32,
    pub Option<u64>,
    pub Option<u32>,
    pub Option<u32>,
    pub u32,
    pub f64,
    pub f64,
    pub u8,
    pub u32,
    pub Option<GpuClock>,
);

/// A GPU-timed call's `host_enqueue`, `gpu_offset_error` and `proxy_wait`
/// (`timeline::join::Clocking` less the timing).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuClock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_enqueue: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_offset_error: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_wait: Option<crate::timeline::join::ProxyWait>,
}

impl GpuClock {
    /// `None` when the call has none of the three.
    pub fn of(c: &crate::timeline::join::Clocking) -> Option<GpuClock> {
        let g = GpuClock { host_enqueue: c.host_enqueue, gpu_offset_error: c.gpu_offset_error, proxy_wait: c.proxy_wait };
        (g.host_enqueue.is_some() || g.gpu_offset_error.is_some() || g.proxy_wait.is_some()).then_some(g)
    }
}

impl CallRow {
    /// The communicator is shared by all ranks (`comm_global`).
    pub const GLOBAL: u8 = 1;
    /// The process exited inside the call.
    pub const ABORTED: u8 = 2;
}

/// Interns strings in order of first use.
#[derive(Default)]
struct Table<'a> {
    index: std::collections::HashMap<&'a str, u32>,
    out: Vec<String>,
}

impl<'a> Table<'a> {
    fn get(&mut self, s: &'a str) -> u32 {
        *self.index.entry(s).or_insert_with(|| {
            self.out.push(s.to_string());
            self.out.len() as u32 - 1
        })
    }
}

impl CompactCollectivesPage {
    /// `full`'s calls as rows (its other fields moved over).
    pub fn from_page(full: CollectivesPage) -> CompactCollectivesPage {
        // Each communicator's id formatted once, not once per call.
        let mut ids: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
        for r in &full.calls {
            if let Some(c) = r.call.comm {
                ids.entry(c.0).or_insert_with(|| c.to_string());
            }
        }
        let (mut comms, mut ops, mut libs) = (Table::default(), Table::default(), Table::default());
        let mut timings: Vec<crate::timeline::join::Timing> = Vec::new();
        let rows = full
            .calls
            .iter()
            .map(|r| {
                let c = &r.call;
                let flags = if c.comm_global { CallRow::GLOBAL } else { 0 } | if c.aborted { CallRow::ABORTED } else { 0 };
                let comm = c.comm.and_then(|id| ids.get(&id.0)).map(|s| comms.get(s));
                let timing = timings.iter().position(|t| *t == r.clock.timing).unwrap_or_else(|| {
                    timings.push(r.clock.timing);
                    timings.len() - 1
                }) as u32;
                let gpu = GpuClock::of(&r.clock);
                CallRow(comm, c.seq, ops.get(&c.op), libs.get(c.library.as_str()), c.bytes, c.rank, c.nranks, c.pid, r.enter, r.exit, flags, timing, gpu)
            })
            .collect();
        CompactCollectivesPage {
            comms: comms.out,
            ops: ops.out,
            libraries: libs.out,
            timings,
            rows,
            host: full.host,
            clock_error_seconds: full.clock_error_seconds,
            clock_synchronized: full.clock_synchronized,
            evicted: full.evicted,
            drained_until: full.drained_until,
            net_requests: full.net_requests,
            links: full.links,
        }
    }
}
