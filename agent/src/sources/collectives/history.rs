//! Bounded in-memory history of decoded calls and network requests, with wall-clock times,
//! served at `/api/v1/collectives`.

use std::collections::VecDeque;

use serde::Serialize;

use super::decode::{Call, NetRequest};

/// Monotonic → wall clock conversion with its error bound.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct ClockMap {
    /// CLOCK_REALTIME − CLOCK_MONOTONIC, in ns.
    pub offset_ns: i128,
    /// Error bound in seconds: the kernel's NTP `maxerror` plus the read gap.
    pub error_seconds: f64,
    /// Whether the kernel reports the clock synchronised (adjtimex not TIME_ERROR).
    pub synchronized: bool,
}

impl ClockMap {
    /// Reads both clocks and `adjtimex`.
    pub fn now() -> ClockMap {
        let read = |id| {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: valid out-pointer; clock ids are constants.
            unsafe { libc::clock_gettime(id, &mut ts) };
            ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
        };
        let m0 = read(libc::CLOCK_MONOTONIC);
        let r = read(libc::CLOCK_REALTIME);
        let m1 = read(libc::CLOCK_MONOTONIC);
        // SAFETY: zeroed timex with modes = 0 only reads.
        let mut tx: libc::timex = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a timex struct.
        let state = unsafe { libc::adjtimex(&mut tx) };
        let maxerror_s = tx.maxerror as f64 * 1e-6;
        let test_offset = (crate::testclock::offset_seconds() * 1e9) as i128;
        ClockMap { offset_ns: r - (m0 + m1) / 2 + test_offset, error_seconds: maxerror_s + (m1 - m0) as f64 * 1e-9, synchronized: state != libc::TIME_ERROR }
    }

    /// Wall-clock seconds since the epoch for a CLOCK_MONOTONIC ns value.
    pub fn wall(&self, mono_ns: u64) -> f64 {
        (mono_ns as i128 + self.offset_ns) as f64 * 1e-9
    }
}

/// One call as served by the API.
#[derive(Clone, Debug, Serialize)]
pub struct CallRecord {
    #[serde(flatten)]
    pub call: Call,
    /// Shared by every record of the history (no allocation per call).
    pub host: std::sync::Arc<str>,
    /// Wall-clock seconds since the epoch.
    pub enter: f64,
    pub exit: f64,
    /// Seconds inside the call.
    pub duration: f64,
    /// How `enter`/`exit` were timed (`timing`, and for the profiler plugin's calls
    /// `host_enqueue`, `gpu_offset_error`, `proxy_wait`).
    #[serde(flatten)]
    pub clock: crate::timeline::join::Clocking,
}

impl CallRecord {
    /// The view the join and the attribution use — the same fields as this record's JSON
    /// (a test holds the two equal), without a round trip through JSON.
    pub fn view(&self) -> crate::timeline::join::CallView {
        let c = &self.call;
        crate::timeline::join::CallView {
            comm: c.comm.map(|id| id.to_string()),
            comm_global: c.comm_global,
            seq: c.seq,
            op: c.op.to_string(),
            library: c.library.as_str().to_string(),
            bytes: c.bytes,
            rank: c.rank,
            nranks: c.nranks,
            host: self.host.to_string(),
            pid: c.pid,
            enter: self.enter,
            exit: self.exit,
            aborted: c.aborted,
            clock: self.clock.clone(),
        }
    }
}

/// How a probed call is timed: an NCCL call returns at enqueue unless the process runs with
/// `CUDA_LAUNCH_BLOCKING=1`; MPI, gloo and user probes return when done.
pub fn host_timing(library: super::targets::Family, launch_blocking: bool) -> crate::timeline::join::Timing {
    use crate::timeline::join::Timing;
    match library {
        super::targets::Family::Nccl if !launch_blocking => Timing::HostEnqueue,
        _ => Timing::HostCompletion,
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NetRecord {
    #[serde(flatten)]
    pub req: NetRequest,
    pub posted: f64,
    pub completed: f64,
}

/// Entries of each history ring allocated up front at most (see [`History::new`]).
pub const PREALLOC_MAX: usize = 1 << 18;

/// Ring buffers of the most recent calls and network requests.
#[derive(Debug)]
pub struct History {
    pub host: std::sync::Arc<str>,
    cap: usize,
    calls: VecDeque<CallRecord>,
    net: VecDeque<NetRecord>,
    pub clock: ClockMap,
    /// Calls dropped from the front because the ring was full.
    pub evicted: u64,
    /// Wall-clock watermark of the probe consumer: every probe event stamped before it has
    /// been drained and is in these rings (0 until the first drain). Steps ending after it
    /// may still be missing calls (see `Engine::tick`).
    pub drained_until: f64,
    /// Wall-time spans holding events that were lost because their process had exited before
    /// the agent could inspect it (merged when less than a second apart; bounded).
    lost: VecDeque<(f64, f64)>,
    /// Wall-time spans in which the kernel dropped probe events (a full ring), as the
    /// engine's ticks saw the drop count grow.
    pub drops: super::gaps::DropSpans,
    /// Open calls, last completed call per process, exits (`/api/v1/open`).
    pub progress: super::progress::Progress,
    /// Root of procfs the traced processes' states are read from.
    pub proc_root: std::path::PathBuf,
    /// The kubelet's pod log directory (`[collectives] pod_logs`), for a rank's pod name.
    pub pod_logs: std::path::PathBuf,
    /// The NCCL profiler plugin's calls and processes ([`super::profiler`]).
    pub plugin: super::profiler::PluginStore,
    /// The NICs each traced process uses ([`super::links`]), as last refreshed.
    pub links: Vec<crate::timeline::links::ProcessLink>,
    /// Each traced process's local rank, namespace and pod (the per-rank series' labels).
    pub identities: std::collections::BTreeMap<u32, crate::labels::RankIdentity>,
    /// Wall time of the last sign of a traced collective at work: a call entered or
    /// returned, a transport request, a profiler record, a call still open (the fast lane
    /// reads counters while it is recent).
    pub active_at: f64,
}

/// Lost-event spans kept at most.
const MAX_LOST_SPANS: usize = 4096;

impl History {
    /// Both rings are allocated at their full size up front (168 + 56 bytes per entry: 14 MiB
    /// at the default 65 536; sizes past [`PREALLOC_MAX`] grow as they fill). Pages become
    /// resident as the rings fill, and a growing `VecDeque` would copy itself into one twice
    /// its size at every power of two — 1.5× the ring resident at once while it does.
    pub fn new(host: String, cap: usize) -> History {
        let cap = cap.max(16);
        let reserve = cap.min(PREALLOC_MAX);
        History {
            host: std::sync::Arc::from(host),
            cap,
            calls: VecDeque::with_capacity(reserve),
            net: VecDeque::with_capacity(reserve),
            clock: ClockMap::now(),
            evicted: 0,
            drained_until: 0.0,
            lost: VecDeque::new(),
            drops: Default::default(),
            progress: Default::default(),
            proc_root: "/proc".into(),
            pod_logs: "/var/log/pods".into(),
            plugin: Default::default(),
            links: Vec::new(),
            identities: Default::default(),
            active_at: 0.0,
        }
    }

    /// Calls kept at most (per ring).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// An event at wall time `t` was lost (see [`History::lost_since`]).
    pub fn push_lost(&mut self, t: f64) {
        match self.lost.back_mut() {
            Some(last) if t >= last.0 - 1.0 && t <= last.1 + 1.0 => {
                last.0 = last.0.min(t);
                last.1 = last.1.max(t);
            }
            _ => {
                if self.lost.len() >= MAX_LOST_SPANS {
                    self.lost.pop_front();
                }
                self.lost.push_back((t, t));
            }
        }
    }

    /// Spans of lost events that end at or after `since`.
    pub fn lost_since(&self, since: f64) -> Vec<(f64, f64)> {
        self.lost.iter().filter(|s| s.1 >= since).copied().collect()
    }

    /// Every event stamped before `mono_ns` (CLOCK_MONOTONIC, the clock of the probes) has
    /// been handled. A record the kernel had reserved but not yet committed when the ring was
    /// read can be a few microseconds older: the watermark stays a millisecond behind.
    pub fn drained_to(&mut self, mono_ns: u64) {
        if mono_ns > 0 {
            self.drained_until = self.drained_until.max(self.clock.wall(mono_ns) - 1e-3);
        }
    }

    /// A probed call of a process without `CUDA_LAUNCH_BLOCKING=1` (see [`host_timing`]).
    pub fn push_call(&mut self, call: Call) {
        self.push_call_timed(call, false);
    }

    pub fn push_call_timed(&mut self, call: Call, launch_blocking: bool) {
        let clock = crate::timeline::join::Clocking { timing: host_timing(call.library, launch_blocking), ..Default::default() };
        let rec = CallRecord {
            clock,
            host: self.host.clone(),
            enter: self.clock.wall(call.enter_ns),
            exit: self.clock.wall(call.exit_ns),
            duration: call.exit_ns.saturating_sub(call.enter_ns) as f64 * 1e-9,
            call,
        };
        self.progress.observe(&rec.call, rec.enter, rec.exit, rec.clock.timing);
        self.active_at = self.active_at.max(rec.exit).max(rec.enter);
        if self.calls.len() >= self.cap {
            self.calls.pop_front();
            self.evicted += 1;
        }
        self.calls.push_back(rec);
    }

    /// The collectives open now (entered, not returned), from the decoder.
    pub fn set_open(&mut self, open: Vec<Call>) {
        let clock = self.clock;
        if !open.is_empty() {
            self.active_at = self.active_at.max(crate::engine::wall_now());
        }
        self.progress.set_open(open.into_iter().map(|c| (clock.wall(c.enter_ns), c)).map(|(since, c)| (c, since)).collect());
    }

    /// A traced process was found exited at CLOCK_MONOTONIC `seen_ns`.
    pub fn process_exited(&mut self, pid: u32, seen_ns: u64, (signal, code): (Option<i32>, Option<i32>)) {
        let at = self.clock.wall(seen_ns);
        self.progress.exited(pid, crate::timeline::open::Exit { at, signal, code });
        self.progress.prune(at);
    }

    pub fn push_net(&mut self, req: NetRequest) {
        let rec = NetRecord { posted: self.clock.wall(req.posted_ns), completed: self.clock.wall(req.completed_ns), req };
        self.active_at = self.active_at.max(rec.completed);
        if self.net.len() >= self.cap {
            self.net.pop_front();
        }
        self.net.push_back(rec);
    }

    /// Calls that entered at or after `since` (wall seconds), oldest first, at most `limit`:
    /// the probed calls and the profiler plugin's, less the probed NCCL collectives of
    /// processes whose plugin times them on the GPU ([`super::profiler::PluginStore::replaces`]).
    pub fn calls_since(&self, since: f64, limit: usize) -> Vec<CallRecord> {
        let start = self.calls.partition_point(|c| c.enter < since);
        if self.plugin.is_empty() {
            return self.calls.iter().skip(start).take(limit).cloned().collect();
        }
        let mut out: Vec<CallRecord> = self.calls.iter().skip(start).filter(|c| !self.plugin.replaces(c)).take(limit).cloned().collect();
        out.extend(self.plugin.calls_since(since, limit).cloned());
        out.sort_by(|a, b| a.enter.total_cmp(&b.enter));
        out.truncate(limit);
        out
    }

    pub fn net_since(&self, since: f64, limit: usize) -> Vec<NetRecord> {
        self.net.iter().filter(|n| n.posted >= since).take(limit).cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::collectives::targets::Family;

    fn call(enter_ns: u64) -> Call {
        Call {
            pid: 1,
            tid: 1,
            library: Family::Mpi,
            op: "all_reduce".into(),
            bytes: Some(8),
            comm: None,
            comm_global: false,
            rank: Some(0),
            nranks: Some(2),
            seq: Some(enter_ns),
            enter_ns,
            exit_ns: enter_ns + 1000,
            ret: Some(0),
            aborted: false,
            grouped: false,
        }
    }

    #[test]
    fn lost_events_merge_into_spans_a_second_apart() {
        let mut h = History::new("h".into(), 16);
        for t in [10.0, 10.4, 11.2, 14.0] {
            h.push_lost(t);
        }
        assert_eq!(h.lost_since(0.0), vec![(10.0, 11.2), (14.0, 14.0)]);
        assert_eq!(h.lost_since(12.0), vec![(14.0, 14.0)]);
    }

    #[test]
    fn clock_map_is_close_to_realtime() {
        let c = ClockMap::now();
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let wall = c.wall(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("epoch").as_secs_f64();
        assert!((wall - now).abs() < 0.05, "{wall} vs {now}");
        assert!(c.error_seconds >= 0.0);
    }

    #[test]
    fn history_is_bounded_and_filters_by_time() {
        let mut h = History::new("h".into(), 16);
        h.clock = ClockMap { offset_ns: 0, error_seconds: 0.0, synchronized: true };
        for i in 0..20u64 {
            h.push_call(call(i * 1_000_000_000));
        }
        assert_eq!(h.len(), 16);
        assert_eq!(h.evicted, 4);
        let v = h.calls_since(10.0, 3);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].call.enter_ns, 10_000_000_000);
        assert!((v[0].duration - 1e-6).abs() < 1e-12);
    }

    #[test]
    fn view_equals_the_api_json_read_back() {
        let mut h = History::new("host-a".into(), 16);
        let mut c = call(5_000_000_000);
        c.comm = Some(super::super::decode::CommId(0xabc));
        c.comm_global = true;
        c.aborted = true;
        c.library = Family::Nccl;
        h.push_call(c);
        h.push_call(call(6_000_000_000));
        for r in h.calls_since(0.0, 10) {
            let via_json: crate::timeline::join::CallView = serde_json::from_value(serde_json::to_value(&r).expect("json")).expect("view");
            assert_eq!(r.view(), via_json);
        }
    }
}
