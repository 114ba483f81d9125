//! Joining calls of all ranks on `(CommId, seq)`.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Where a call's `enter`/`exit` come from.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Timing {
    /// The rank's GPU: earliest channel start and latest channel end of the collective's
    /// kernel, from the NCCL profiler plugin (host clock, see `gpu_offset_error`).
    Gpu,
    /// The host call's entry and return, and the call returns when the operation is done
    /// (MPI, gloo, NCCL under `CUDA_LAUNCH_BLOCKING=1`).
    HostCompletion,
    /// The host call of an asynchronous NCCL: it returns once the work is *enqueued* on the
    /// stream, so neither time says when the rank's GPU reached the collective.
    HostEnqueue,
    /// Not recorded (stored steps, older agents).
    #[default]
    Unknown,
}

impl Timing {
    pub fn as_str(self) -> &'static str {
        match self {
            Timing::Gpu => "gpu",
            Timing::HostCompletion => "host_completion",
            Timing::HostEnqueue => "host_enqueue",
            Timing::Unknown => "unknown",
        }
    }
}

/// Seconds NCCL's proxy steps spent in each wait state during one rank's collective (the
/// profiler plugin's ProxyStep states, summed over steps and channels).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProxyWait {
    /// Send: waiting for the GPU to provide the data.
    pub send_gpu_wait: f64,
    /// Send: waiting for the peer to have a free buffer (clear to send).
    pub send_peer_wait: f64,
    /// Send: waiting for the network to complete the send.
    pub send_wait: f64,
    /// Receive: waiting for the network to deliver.
    pub recv_wait: f64,
    pub recv_flush_wait: f64,
    /// Receive: waiting for the GPU to consume the data.
    pub recv_gpu_wait: f64,
    /// Network requests the proxy steps posted (a send step entering SendWait, a receive
    /// leaving RecvWait) and their bytes: with `send_wait` / `recv_wait`, whose sums are
    /// their occupancy, Little's N, m and T of the transfer (docs/models.md §2).
    #[serde(default)]
    pub send_requests: f64,
    #[serde(default)]
    pub send_bytes: f64,
    #[serde(default)]
    pub recv_requests: f64,
    #[serde(default)]
    pub recv_bytes: f64,
}

impl ProxyWait {
    pub fn add(&mut self, o: &ProxyWait) {
        self.send_gpu_wait += o.send_gpu_wait;
        self.send_peer_wait += o.send_peer_wait;
        self.send_wait += o.send_wait;
        self.recv_wait += o.recv_wait;
        self.recv_flush_wait += o.recv_flush_wait;
        self.recv_gpu_wait += o.recv_gpu_wait;
        self.send_requests += o.send_requests;
        self.send_bytes += o.send_bytes;
        self.recv_requests += o.recv_requests;
        self.recv_bytes += o.recv_bytes;
    }

    /// The six wait states' seconds (without the request totals), as evidence.
    pub fn waits(&self) -> serde_json::Value {
        serde_json::json!({
            "send_gpu_wait": self.send_gpu_wait,
            "send_peer_wait": self.send_peer_wait,
            "send_wait": self.send_wait,
            "recv_wait": self.recv_wait,
            "recv_flush_wait": self.recv_flush_wait,
            "recv_gpu_wait": self.recv_gpu_wait,
        })
    }
}

/// How a call or arrival was timed (flattened into its JSON: `timing`, `host_enqueue`,
/// `gpu_offset_error`, `proxy_wait`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Clocking {
    #[serde(default)]
    pub timing: Timing,
    /// GPU-timed calls: when the host enqueued it (wall seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_enqueue: Option<f64>,
    /// GPU-timed calls: bound of the GPU-timer-to-host-clock error, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_offset_error: Option<f64>,
    /// Boxed: only plugin-timed calls have it, and an inline 88 bytes in every arrival
    /// nearly doubled what attribution reads per record (`cargo xtask bench attribution`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_wait: Option<Box<ProxyWait>>,
    /// Launched by a CUDA-graph replay (the plugin's `FLAG_GRAPH`): no host NCCL call ran.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub graph_replay: bool,
}

/// One rank's part in a collective. Times are wall-clock seconds since the epoch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Arrival {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    /// When the rank entered the call (its data was ready) — for [`Timing::Gpu`], when its
    /// GPU started the collective.
    pub enter: f64,
    /// When the call returned on that rank (the GPU finished, for [`Timing::Gpu`]).
    pub exit: f64,
    #[serde(default)]
    pub aborted: bool,
    #[serde(flatten)]
    pub clock: Clocking,
}

/// One collective operation seen on one or more ranks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Collective {
    pub comm: String,
    pub seq: u64,
    pub op: String,
    pub library: String,
    /// Payload bytes per rank (count × element size), when known.
    pub bytes: Option<u64>,
    pub nranks: Option<u32>,
    /// Sorted by rank.
    pub arrivals: Vec<Arrival>,
}

impl Collective {
    /// First and last arrival.
    pub fn first_arrival(&self) -> f64 {
        self.arrivals.iter().map(|a| a.enter).fold(f64::INFINITY, f64::min)
    }
    pub fn last_arrival(&self) -> f64 {
        self.arrivals.iter().map(|a| a.enter).fold(f64::NEG_INFINITY, f64::max)
    }
    pub fn last_exit(&self) -> f64 {
        self.arrivals.iter().map(|a| a.exit).fold(f64::NEG_INFINITY, f64::max)
    }
    /// Readiness skew: last arrival − first arrival (docs/models.md §3.2).
    pub fn skew(&self) -> f64 {
        if self.arrivals.len() < 2 {
            0.0
        } else {
            self.last_arrival() - self.first_arrival()
        }
    }
    /// The rank that arrived last.
    pub fn late_rank(&self) -> Option<&Arrival> {
        self.arrivals.iter().max_by(|a, b| a.enter.total_cmp(&b.enter))
    }
    /// Every rank of the communicator was seen.
    pub fn complete(&self) -> bool {
        self.nranks.is_some_and(|n| self.arrivals.len() as u32 >= n)
    }
    /// Every rank of the communicator was seen, all on one host: whatever the host's NICs
    /// carried meanwhile (another job's traffic, a paused port) is not this collective's.
    pub fn one_host(&self) -> bool {
        self.complete() && self.arrivals.iter().all(|a| a.host == self.arrivals[0].host)
    }
    /// Time from the last arrival to the last return: the transfer itself once everyone
    /// was ready.
    pub fn transfer(&self) -> f64 {
        (self.last_exit() - self.last_arrival()).max(0.0)
    }
    /// Some arrival is an asynchronous NCCL call timed at its enqueue: readiness (when each
    /// rank's GPU reached the collective) is unknown, so no skew may be computed from it.
    pub fn host_enqueue_timed(&self) -> bool {
        self.arrivals.iter().any(|a| a.clock.timing == Timing::HostEnqueue)
    }
}

/// Which timing sources a step's collectives used: the one name when all arrivals agree,
/// else `mixed` with the count of each (e.g. `mixed (gpu 6, host_enqueue 2)`). Empty without
/// arrivals.
pub fn timing_summary(colls: &[&Collective]) -> String {
    let mut n: BTreeMap<Timing, usize> = BTreeMap::new();
    for a in colls.iter().flat_map(|c| &c.arrivals) {
        *n.entry(a.clock.timing).or_default() += 1;
    }
    match n.len() {
        0 => String::new(),
        1 => n.keys().next().map(|t| t.as_str().to_string()).unwrap_or_default(),
        _ => format!("mixed ({})", n.iter().map(|(t, k)| format!("{} {k}", t.as_str())).collect::<Vec<_>>().join(", ")),
    }
}

/// The host enqueue skew of collectives timed at enqueue: summed (last − first enqueue) and
/// the rank that enqueued last most often. A CPU-side figure only: the GPUs may run far
/// behind their hosts' enqueues, so it names no straggler.
pub fn host_enqueue_skew(colls: &[&Collective]) -> Option<(f64, Option<u32>)> {
    let mut total = 0.0;
    let mut last: BTreeMap<u32, usize> = BTreeMap::new();
    let mut any = false;
    for c in colls.iter().filter(|c| c.host_enqueue_timed()) {
        any = true;
        total += c.skew();
        if let Some(a) = c.late_rank().filter(|_| c.arrivals.len() > 1) {
            *last.entry(a.rank).or_default() += 1;
        }
    }
    any.then(|| (total, last.into_iter().max_by_key(|e| e.1).map(|e| e.0)))
}

/// Proxy step waits summed over the arrivals that have them.
pub fn proxy_wait_total(colls: &[&Collective]) -> Option<ProxyWait> {
    let mut t: Option<ProxyWait> = None;
    for w in colls.iter().flat_map(|c| &c.arrivals).filter_map(|a| a.clock.proxy_wait.as_ref()) {
        t.get_or_insert_with(ProxyWait::default).add(w);
    }
    t
}

/// A call as the API serves it (the subset the join needs).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct CallView {
    pub comm: Option<String>,
    #[serde(default)]
    pub comm_global: bool,
    pub seq: Option<u64>,
    pub op: String,
    pub library: String,
    pub bytes: Option<u64>,
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    pub host: String,
    pub pid: u32,
    pub enter: f64,
    pub exit: f64,
    #[serde(default)]
    pub aborted: bool,
    #[serde(flatten)]
    pub clock: Clocking,
}

/// Collectives in which no rank returns before every rank has entered: each rank needs every
/// other rank's input.
const EVERY_RANK_NEEDED: [&str; 5] = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"];

/// A call the numbers are aligned by: timed to completion, not aborted, of a collective no
/// rank leaves before every rank has entered — so the same collective's calls overlap.
pub(super) fn aligns_by_overlap(c: &CallView) -> bool {
    c.clock.timing == Timing::HostCompletion && !c.aborted && EVERY_RANK_NEEDED.contains(&c.op.as_str())
}

/// Per `(comm, host, pid)`: how far each process's sequence numbers run ahead.
pub(super) type SeqOffsets<'a> = HashMap<(&'a str, &'a str, u32), u64>;

/// `raw` of `c`'s process on communicator `comm`, less its process's offset.
pub(super) fn aligned_seq(offsets: &SeqOffsets<'_>, comm: &str, c: &CallView, raw: u64) -> i64 {
    raw as i64 - offsets.get(&(comm, c.host.as_str(), c.pid)).copied().unwrap_or(0) as i64
}

/// How far each process's sequence numbers run ahead, per `(comm, host, pid)` (absent: 0).
///
/// Sequence numbers of MPI and gloo communicators count the calls each process was seen
/// making. Probes attached while a job runs (the agent found the library mapped by a running
/// process) miss the collective the ranks were inside at that moment, but a rank that had
/// not arrived yet — a straggler — sees it: its numbers run one ahead of the others' and every
/// join pairs its call with the others' next one (seen on this machine: the late rank
/// arriving "first" in every step, the others ~24 ms late). The same collective's calls
/// overlap in time on one host's clock when no rank can return before every rank entered
/// and the calls are timed to completion; so, per communicator and host, each process's call
/// that overlaps most with the reference process's first call is the same collective, and
/// the difference of their numbers is the offset. Offsets are taken relative to the process
/// that started counting last, so the joined numbers do not depend on the window of history.
pub(super) fn seq_offsets<'a>(calls: &[&'a CallView]) -> SeqOffsets<'a> {
    let mut groups: BTreeMap<(&str, &str), BTreeMap<u32, Vec<&CallView>>> = BTreeMap::new();
    for c in calls {
        let (Some(comm), Some(_)) = (c.comm.as_deref(), c.seq) else { continue };
        if aligns_by_overlap(c) {
            groups.entry((comm, c.host.as_str())).or_default().entry(c.pid).or_default().push(c);
        }
    }
    let mut out = HashMap::new();
    for ((comm, host), mut procs) in groups {
        if procs.len() < 2 {
            continue;
        }
        for v in procs.values_mut() {
            v.sort_by_key(|c| c.seq);
        }
        // The reference: the process whose first call here began last.
        let Some(first) = procs.values().map(|v| v[0]).max_by(|a, b| a.enter.total_cmp(&b.enter)) else { continue };
        let overlap = |c: &CallView| c.exit.min(first.exit) - c.enter.max(first.enter);
        let rel: Vec<(u32, i64)> = procs
            .iter()
            .filter_map(|(pid, v)| {
                let same = v.iter().filter(|c| overlap(c) >= 0.0).max_by(|a, b| overlap(a).total_cmp(&overlap(b)))?;
                Some((*pid, same.seq? as i64 - first.seq? as i64))
            })
            .collect();
        let low = rel.iter().map(|(_, d)| *d).min().unwrap_or(0);
        for (pid, d) in rel {
            if d > low {
                out.insert((comm, host, pid), (d - low) as u64);
            }
        }
    }
    out
}

/// Joins calls (from one or many hosts) on `(comm, seq)`, each process's numbers aligned by
/// [`seq_offsets`] and each host's onto the others' by [`super::align::host_shifts`]. Calls
/// without a communicator or a sequence number (p2p, lifecycle) are skipped. A rank seen
/// twice for the same key (two agents answering for one host) keeps its first call.
pub fn join_calls<'a>(calls: impl IntoIterator<Item = &'a CallView>) -> Vec<Collective> {
    let calls: Vec<&CallView> = calls.into_iter().collect();
    let offsets = seq_offsets(&calls);
    let shifts = super::align::host_shifts(&calls, &offsets);
    // Each collective with the ranks it has (a set: 1 024 ranks checked one by one against
    // every arrival made the join quadratic, ~5·10⁸ comparisons over 1 000 steps).
    let mut by_key: BTreeMap<(String, u64), (Collective, std::collections::HashSet<u32>)> = BTreeMap::new();
    for c in calls {
        let (Some(comm), Some(raw)) = (&c.comm, c.seq) else { continue };
        // A call before the others' first one (the collective they were inside when the
        // probes attached) has no partners to join.
        let shift = shifts.get(&(comm.as_str(), c.host.as_str())).copied().unwrap_or(0);
        let Some(seq) = aligned_seq(&offsets, comm, c, raw).checked_add(shift).and_then(|k| u64::try_from(k).ok()) else { continue };
        let (e, ranks) = by_key.entry((comm.clone(), seq)).or_insert_with(|| {
            let c =
                Collective { comm: comm.clone(), seq, op: c.op.clone(), library: c.library.clone(), bytes: c.bytes, nranks: c.nranks, arrivals: Vec::new() };
            (c, Default::default())
        });
        let rank = c.rank.unwrap_or(u32::MAX);
        let seen = if rank == u32::MAX { e.arrivals.iter().any(|a| a.rank == rank && a.pid == c.pid && a.host == c.host) } else { !ranks.insert(rank) };
        if seen {
            continue;
        }
        e.nranks = e.nranks.or(c.nranks);
        e.bytes = e.bytes.or(c.bytes);
        e.arrivals.push(Arrival { rank, host: c.host.clone(), pid: c.pid, enter: c.enter, exit: c.exit, aborted: c.aborted, clock: c.clock.clone() });
    }
    let mut out: Vec<Collective> = by_key.into_values().map(|(c, _)| c).collect();
    for c in &mut out {
        c.arrivals.sort_by_key(|a| a.rank);
    }
    out.sort_by(|a, b| a.first_arrival().total_cmp(&b.first_arrival()));
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn call(comm: &str, seq: u64, rank: u32, host: &str, enter: f64, exit: f64) -> CallView {
        CallView {
            comm: Some(comm.into()),
            comm_global: true,
            seq: Some(seq),
            op: "all_reduce".into(),
            library: "mpi".into(),
            bytes: Some(8000),
            rank: Some(rank),
            nranks: Some(4),
            host: host.into(),
            pid: 100 + rank,
            enter,
            exit,
            aborted: false,
            clock: Clocking::default(),
        }
    }

    #[test]
    fn joins_ranks_across_hosts_and_measures_skew() {
        let calls = vec![
            call("c1", 0, 0, "a", 10.000, 10.031),
            call("c1", 0, 1, "a", 10.001, 10.031),
            call("c1", 0, 2, "b", 10.000, 10.031),
            call("c1", 0, 3, "b", 10.030, 10.031),
            call("c1", 1, 0, "a", 10.100, 10.102),
            call("c1", 0, 3, "b", 10.030, 10.031), // duplicate answer
        ];
        let j = join_calls(&calls);
        assert_eq!(j.len(), 2);
        assert_eq!(j[0].arrivals.len(), 4);
        assert!(j[0].complete());
        assert!((j[0].skew() - 0.030).abs() < 1e-9);
        assert_eq!(j[0].late_rank().map(|a| (a.rank, a.host.as_str())), Some((3, "b")));
        assert!((j[0].transfer() - 0.001).abs() < 1e-9);
        assert!(!j[1].complete());
        assert_eq!(j[1].skew(), 0.0);
    }

    #[test]
    fn calls_without_comm_or_seq_are_skipped() {
        let mut c = call("c", 0, 0, "a", 1.0, 2.0);
        c.seq = None;
        assert!(join_calls(&[c]).is_empty());
    }

    /// Probes attached mid-job: ranks 0, 1, 3 were inside all-reduce #0 and missed it, rank 2
    /// (late) saw it, so rank 2's own numbers run one ahead. The join still pairs the same
    /// collectives, and the numbers do not depend on how much history is looked at.
    #[test]
    fn a_rank_that_saw_one_more_collective_is_aligned_by_overlap() {
        let mut calls = Vec::new();
        for k in 0..6u64 {
            let t = 10.0 + 0.1 * k as f64;
            for r in [0u32, 1, 3] {
                if k > 0 {
                    let mut c = call("w", k - 1, r, "a", t + 0.001 * f64::from(r), t + 0.035);
                    c.clock.timing = Timing::HostCompletion;
                    calls.push(c);
                }
            }
            let mut late = call("w", k, 2, "a", t + 0.030, t + 0.035);
            late.clock.timing = Timing::HostCompletion;
            calls.push(late);
        }
        let joined = join_calls(&calls);
        let full: Vec<&Collective> = joined.iter().filter(|c| c.arrivals.len() == 4).collect();
        assert_eq!(full.len(), 5, "all-reduces #1..#5 with their 4 ranks: {joined:?}");
        for c in &full {
            let last = c.arrivals.iter().max_by(|a, b| a.enter.total_cmp(&b.enter)).expect("arrivals");
            assert_eq!(last.rank, 2, "rank 2 is the late one in #{}", c.seq);
            assert!(c.arrivals.iter().all(|a| a.exit >= last.enter), "one collective's calls overlap: {c:?}");
        }
        // A window that starts mid-job joins the same collectives under the same numbers.
        let window: Vec<CallView> = calls.iter().filter(|c| c.enter > 10.25).cloned().collect();
        let again: Vec<(u64, usize)> = join_calls(&window).iter().map(|c| (c.seq, c.arrivals.len())).collect();
        let want: Vec<(u64, usize)> = full.iter().filter(|c| c.first_arrival() > 10.25).map(|c| (c.seq, 4)).collect();
        assert_eq!(again, want);
        // Calls not timed to completion (an asynchronous NCCL's enqueues) are never moved.
        let enq: Vec<CallView> = calls
            .iter()
            .cloned()
            .map(|mut c| {
                c.clock.timing = Timing::HostEnqueue;
                c
            })
            .collect();
        let raw = join_calls(&enq);
        let one = raw.iter().find(|c| c.seq == 1).expect("#1");
        let r2 = one.arrivals.iter().find(|a| a.rank == 2).expect("rank 2");
        assert!((r2.enter - 10.13).abs() < 1e-9, "enqueue-timed calls join on their own numbers: {one:?}");
    }
}
