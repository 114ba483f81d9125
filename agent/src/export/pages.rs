//! The list endpoints' pages: typed structs serialized straight into the response body.
//! Built with `serde_json::json!`, a page went through a `serde_json::Value` tree first; 10
//! parallel listings of 10 000 markers then raised the agent's peak RSS by ~24 MiB (measured
//! with 10 000 markers held, flood + listings + 300 idle connections per round: VmHWM 43.9 →
//! 67.8 MiB in the first round; typed, it stayed at the start-up peak, 44.0 MiB, over 4 rounds).
//!
//! The same structs are what `agent diagnose` reads back (`cli/diagnose/fetch.rs`, `--steps`
//! from an agent): one definition per format. Fields an older agent may not send are `#[serde(default)]`.
//! Where the agent serves internal records (a call's [`CallRecord`], a network request's
//! [`NetRecord`]) the page is generic over the element, and the reader names the view it
//! keeps ([`CallView`], [`NetView`]).

use serde::{Deserialize, Serialize};

use crate::{
    sources::collectives::history::{CallRecord, NetRecord},
    timeline::{
        join::{CallView, Clocking, Timing},
        links::ProcessLink,
        Marker, NicInfo, NicSample,
    },
};

/// `/api/v1/collectives` (the full format): as served, `CollectivesPage` (every field of
/// every call); as read back, `CollectivesPage<CallView, NetView>`.
#[derive(Serialize, Deserialize)]
pub struct CollectivesPage<C = CallRecord, N = NetRecord> {
    pub host: String,
    #[serde(default)]
    pub clock_error_seconds: f64,
    #[serde(default)]
    pub clock_synchronized: bool,
    #[serde(default)]
    pub evicted: u64,
    #[serde(default)]
    pub drained_until: f64,
    /// Wall-time spans in which the kernel dropped probe events (a full ring) and in which
    /// events of exited processes were lost: steps overlapping one are incomplete, in
    /// cluster `diagnose` as on the agent. Absent from older agents: none known.
    #[serde(default)]
    pub drop_spans: Vec<(f64, f64)>,
    #[serde(default)]
    pub lost_spans: Vec<(f64, f64)>,
    #[serde(default = "Vec::new")]
    pub calls: Vec<C>,
    #[serde(default = "Vec::new")]
    pub net_requests: Vec<N>,
    /// The NICs each traced process uses (`timeline::links`); absent from agents older than
    /// NIC linking: no links, every NIC a candidate.
    #[serde(default)]
    pub links: Vec<ProcessLink>,
}

// Not derived: the derive would ask `C: Default`, and `CallRecord` has none.
impl<C, N> Default for CollectivesPage<C, N> {
    fn default() -> Self {
        CollectivesPage {
            host: String::new(),
            clock_error_seconds: 0.0,
            clock_synchronized: false,
            evicted: 0,
            drained_until: 0.0,
            drop_spans: Vec::new(),
            lost_spans: Vec::new(),
            calls: Vec::new(),
            net_requests: Vec::new(),
            links: Vec::new(),
        }
    }
}

/// A network request as `diagnose` reads it (the part of a [`NetRecord`]'s JSON it uses).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetView {
    #[serde(default)]
    pub bytes: Option<f64>,
    pub posted: f64,
    pub completed: f64,
    /// Absent from agents older than the direction: a receive.
    #[serde(default)]
    pub send: bool,
}

/// `/api/v1/steps`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct StepsPage {
    pub host: String,
    pub steps: Vec<crate::attribution::Attribution>,
}

/// `/api/v1/markers`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct MarkersPage {
    /// Not read by `diagnose` (each marker names its host, else the calls' host is used).
    #[serde(default)]
    pub host: String,
    /// Read without the socket protocol's strictness about extra fields ([`Marker`] refuses
    /// them): a newer agent's markers still read.
    #[serde(deserialize_with = "lenient_markers")]
    pub markers: Vec<Marker>,
    /// More markers matched than one response carries.
    #[serde(default)]
    pub truncated: bool,
}

/// [`Marker`]'s fields, extra ones ignored. A remote definition: the compiler holds it to
/// `Marker`'s fields (one added or removed there fails to build here).
#[derive(Deserialize)]
#[serde(remote = "Marker")]
struct LenientMarker {
    rank: u32,
    step: u64,
    phase: crate::timeline::Phase,
    #[serde(default)]
    time: Option<f64>,
    #[serde(default)]
    host: Option<String>,
}

fn lenient_markers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Marker>, D::Error> {
    #[derive(Deserialize)]
    struct Lenient(#[serde(with = "LenientMarker")] Marker);
    Ok(Vec::<Lenient>::deserialize(d)?.into_iter().map(|m| m.0).collect())
}

/// One NIC of a [`WindowsPage`].
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct NicSamples {
    pub nic: NicInfo,
    pub samples: Vec<NicSample>,
}

/// `/api/v1/windows`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowsPage {
    /// Always sent; absent from older agents (their NICs are then the calls' host's).
    #[serde(default)]
    pub host: Option<String>,
    pub nics: Vec<NicSamples>,
}

/// One NIC's samples, as [`LiveWindowsPage`] asks for them.
pub type NicFetch = Box<dyn Fn(&str) -> Option<(NicInfo, Vec<NicSample>)> + Send>;

/// `/api/v1/windows` as served: a [`WindowsPage`]'s JSON, each NIC's samples copied (by
/// `fetch`, under the engine lock) only when the serializer reaches it, so a listing holds one
/// NIC's samples at a time instead of every NIC's (on a 500-device tree the copy of every
/// NIC was half as large as the JSON). A NIC gone by then is left out; without `until`, a NIC
/// reached later may carry samples taken after an earlier one was copied.
pub struct LiveWindowsPage {
    pub host: String,
    pub nics: Vec<String>,
    pub fetch: NicFetch,
}

impl Serialize for LiveWindowsPage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Nics<'a>(&'a LiveWindowsPage);
        impl Serialize for Nics<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.nics.iter().filter_map(|n| (self.0.fetch)(n)).map(|(nic, samples)| NicSamples { nic, samples }))
            }
        }
        // Field for field what `WindowsPage` writes.
        let mut st = s.serialize_struct("WindowsPage", 2)?;
        st.serialize_field("host", &Some(&self.host))?;
        st.serialize_field("nics", &Nics(self))?;
        st.end()
    }
}

/// `/api/v1/collectives?format=compact`: the same calls with only what a cluster join needs
/// (`timeline::join::CallView` less the host, which is the page's), one array per call and
/// each string once. A call is ~75 bytes of JSON instead of ~350, so `agent diagnose` over
/// 128 hosts × 8 ranks × 1 000 steps moves ~75 MB instead of ~360 MB.
///
/// As served, `CompactCollectivesPage`; as `diagnose` reads it back (it asks for
/// `format=compact`), `CompactCollectivesPage<NetView>`, which also reads an agent that
/// ignores the parameter and answers with the full page: its calls land in `calls`, the
/// tables and rows stay empty. [`CompactCollectivesPage::take_calls`] gives both as views.
#[derive(Serialize, Deserialize)]
pub struct CompactCollectivesPage<N = NetRecord> {
    pub host: String,
    #[serde(default)]
    pub clock_error_seconds: f64,
    #[serde(default)]
    pub clock_synchronized: bool,
    #[serde(default)]
    pub evicted: u64,
    #[serde(default)]
    pub drained_until: f64,
    /// Wall-time spans in which the kernel dropped probe events (a full ring) and in which
    /// events of exited processes were lost: steps overlapping one are incomplete, in
    /// cluster `diagnose` as on the agent. Absent from older agents: none known.
    #[serde(default)]
    pub drop_spans: Vec<(f64, f64)>,
    #[serde(default)]
    pub lost_spans: Vec<(f64, f64)>,
    /// Communicator ids (16 hex digits) the rows name by index.
    #[serde(default)]
    pub comms: Vec<String>,
    /// Operation names the rows name by index.
    #[serde(default)]
    pub ops: Vec<String>,
    /// Library names (`nccl`, `mpi`, …) the rows name by index.
    #[serde(default)]
    pub libraries: Vec<String>,
    /// How calls were timed (`gpu`, `host_completion`, …), named by index.
    #[serde(default)]
    pub timings: Vec<Timing>,
    #[serde(default)]
    pub rows: Vec<CallRow>,
    #[serde(default = "Vec::new")]
    pub net_requests: Vec<N>,
    /// As in [`CollectivesPage::links`].
    #[serde(default)]
    pub links: Vec<ProcessLink>,
    /// The calls of a full page, when the agent answered with one; never sent (empty here).
    #[serde(default, skip_serializing)]
    pub calls: Vec<CallView>,
}

/// One call of a [`CompactCollectivesPage`]: comm (index), seq, op (index), library (index),
/// bytes, rank, nranks, pid, enter, exit (wall seconds), flags ([`CallRow::GLOBAL`],
/// [`CallRow::ABORTED`]), timing (index), and the GPU timing's extras (`null` without).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuClock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_enqueue: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_offset_error: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_wait: Option<Box<crate::timeline::join::ProxyWait>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub graph_replay: bool,
}

impl GpuClock {
    /// `None` when the call has none of the four.
    pub fn of(c: &Clocking) -> Option<GpuClock> {
        let g = GpuClock { host_enqueue: c.host_enqueue, gpu_offset_error: c.gpu_offset_error, proxy_wait: c.proxy_wait.clone(), graph_replay: c.graph_replay };
        (g.host_enqueue.is_some() || g.gpu_offset_error.is_some() || g.proxy_wait.is_some() || g.graph_replay).then_some(g)
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
        let mut timings: Vec<Timing> = Vec::new();
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
            drop_spans: full.drop_spans,
            lost_spans: full.lost_spans,
            net_requests: full.net_requests,
            links: full.links,
            calls: Vec::new(),
        }
    }
}

impl<N> CompactCollectivesPage<N> {
    /// Every call as the join's view: a full page's calls, then the rows (which carry the
    /// page's host); `Err` names a row that points past a string table.
    pub fn take_calls(&mut self) -> Result<Vec<CallView>, String> {
        let mut calls = std::mem::take(&mut self.calls);
        calls.reserve(self.rows.len());
        let pick = |t: &[String], i: u32, what: &str| t.get(i as usize).cloned().ok_or_else(|| format!("row names {what} {i} of {}", t.len()));
        for CallRow(comm, seq, op, library, bytes, rank, nranks, pid, enter, exit, flags, timing, gpu) in std::mem::take(&mut self.rows) {
            let timing = *self.timings.get(timing as usize).ok_or_else(|| format!("row names timing {timing} of {}", self.timings.len()))?;
            let gpu = gpu.unwrap_or(GpuClock { host_enqueue: None, gpu_offset_error: None, proxy_wait: None, graph_replay: false });
            calls.push(CallView {
                comm: comm.map(|i| pick(&self.comms, i, "communicator")).transpose()?,
                comm_global: flags & CallRow::GLOBAL != 0,
                seq,
                op: pick(&self.ops, op, "op")?,
                library: pick(&self.libraries, library, "library")?,
                bytes,
                rank,
                nranks,
                host: self.host.clone(),
                pid,
                enter,
                exit,
                aborted: flags & CallRow::ABORTED != 0,
                clock: Clocking {
                    timing,
                    host_enqueue: gpu.host_enqueue,
                    gpu_offset_error: gpu.gpu_offset_error,
                    proxy_wait: gpu.proxy_wait,
                    graph_replay: gpu.graph_replay,
                },
            });
        }
        Ok(calls)
    }
}

#[cfg(test)]
#[path = "pages_tests.rs"]
mod tests;
