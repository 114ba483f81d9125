//! Per-communicator progress kept beside the call history: the calls open now (entered, not
//! returned), the last collective each process completed, recent call durations and the
//! processes that exited (and how). Fed by the probe thread and, for NCCL processes that load
//! the profiler plugin, by its records: a collective is open on the GPU from its first
//! channel's start to its completion (an asynchronous NCCL call returns at once, so the host
//! side shows nothing open while the GPUs wait for a peer). Read as a
//! [`HostProgress`] by `/api/v1/open` and the hang detector. Bounded: at most
//! [`MAX_COMMS`] communicators, [`MAX_MEMBERS`] processes each, [`DURATIONS`] durations each;
//! exited processes are forgotten after [`EXITED_KEEP_SECONDS`].

use std::collections::{HashMap, VecDeque};

use super::decode::{Call, CommId};
use crate::timeline::{
    join::Timing,
    open::{CommProgress, DoneCall, Exit, HostProgress, OpenCall, RankProgress},
};

/// Communicators tracked at most (the least recently active is forgotten first).
pub const MAX_COMMS: usize = 256;
/// Processes tracked per communicator at most.
pub const MAX_MEMBERS: usize = 4096;
/// Completed-call durations kept per communicator for its median.
pub const DURATIONS: usize = 64;
/// How long an exited process stays in the view.
pub const EXITED_KEEP_SECONDS: f64 = 3600.0;

#[derive(Clone, Debug, Default)]
struct Member {
    rank: Option<u32>,
    last_done: Option<DoneCall>,
    aborted: Option<OpenCall>,
    exited: Option<Exit>,
    /// Its last call was timed at the enqueue.
    enqueue_only: bool,
}

#[derive(Clone, Debug, Default)]
struct Comm {
    global: bool,
    library: &'static str,
    nranks: Option<u32>,
    durations: VecDeque<f64>,
    members: HashMap<u32, Member>,
    /// Wall time of the last call seen (for eviction).
    touched: f64,
}

/// One open call as the decoder holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Open {
    pub comm: CommId,
    pub pid: u32,
    pub call: OpenCall,
}

#[derive(Debug, Default)]
pub struct Progress {
    comms: HashMap<CommId, Comm>,
    open: Vec<Open>,
    /// Collectives open on the GPU (profiler plugin), per (communicator, process): at most
    /// one each, so bounded by the communicators × members.
    gpu_open: HashMap<(CommId, u32), OpenCall>,
}

fn median(v: &VecDeque<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s: Vec<f64> = v.iter().copied().collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 })
}

impl Progress {
    fn comm_mut(&mut self, id: CommId, c: &Call, t: f64) -> &mut Comm {
        if !self.comms.contains_key(&id) && self.comms.len() >= MAX_COMMS {
            if let Some(old) = self.comms.iter().min_by(|a, b| a.1.touched.total_cmp(&b.1.touched)).map(|(k, _)| *k) {
                self.comms.remove(&old);
            }
        }
        let e = self.comms.entry(id).or_default();
        e.global |= c.comm_global;
        e.library = c.library.as_str();
        e.nranks = c.nranks.or(e.nranks);
        e.touched = e.touched.max(t);
        e
    }

    /// A decoded collective (returned or aborted) at wall times `enter`..`exit`, timed by
    /// `timing`.
    pub fn observe(&mut self, c: &Call, enter: f64, exit: f64, timing: Timing) {
        let (Some(id), Some(seq)) = (c.comm, c.seq) else { return };
        if self.gpu_open.get(&(id, c.pid)).is_some_and(|o| o.seq <= seq) {
            self.gpu_open.remove(&(id, c.pid));
        }
        let comm = self.comm_mut(id, c, exit);
        if !comm.members.contains_key(&c.pid) && comm.members.len() >= MAX_MEMBERS {
            return;
        }
        let m = comm.members.entry(c.pid).or_default();
        m.rank = c.rank.or(m.rank);
        m.enqueue_only = timing == Timing::HostEnqueue;
        if c.aborted {
            m.aborted = Some(OpenCall { seq, op: c.op.to_string(), bytes: c.bytes, tid: c.tid, since: enter });
            return;
        }
        if m.last_done.as_ref().is_none_or(|d| d.seq <= seq) {
            m.last_done = Some(DoneCall { seq, op: c.op.to_string(), bytes: c.bytes, exit });
        }

        if comm.durations.len() >= DURATIONS {
            comm.durations.pop_front();
        }
        comm.durations.push_back((exit - enter).max(0.0));
    }

    /// The calls open now, replacing the previous set; their processes become members.
    pub fn set_open(&mut self, open: Vec<(Call, f64)>) {
        self.open.clear();
        for (c, since) in open {
            let (Some(id), Some(seq)) = (c.comm, c.seq) else { continue };
            let comm = self.comm_mut(id, &c, since);
            if comm.members.len() < MAX_MEMBERS || comm.members.contains_key(&c.pid) {
                let m = comm.members.entry(c.pid).or_default();
                m.rank = c.rank.or(m.rank);
            }
            self.open.push(Open { comm: id, pid: c.pid, call: OpenCall { seq, op: c.op.to_string(), bytes: c.bytes, tid: c.tid, since } });
        }
    }

    /// The GPU of `c`'s process started collective `c` at wall time `since` (the profiler
    /// plugin's progress record); open until its completed record is observed.
    pub fn gpu_started(&mut self, c: &Call, since: f64) {
        let (Some(id), Some(seq)) = (c.comm, c.seq) else { return };
        let comm = self.comm_mut(id, c, since);
        if !comm.members.contains_key(&c.pid) && comm.members.len() >= MAX_MEMBERS {
            return;
        }
        let m = comm.members.entry(c.pid).or_default();
        m.rank = c.rank.or(m.rank);
        if m.last_done.as_ref().is_none_or(|d| d.seq < seq) && self.gpu_open.get(&(id, c.pid)).is_none_or(|o| o.seq < seq) {
            self.gpu_open.insert((id, c.pid), OpenCall { seq, op: c.op.to_string(), bytes: c.bytes, tid: 0, since });
        }
    }

    /// A traced process was found exited at wall time `at`.
    pub fn exited(&mut self, pid: u32, exit: Exit) {
        self.open.retain(|o| o.pid != pid);
        self.gpu_open.retain(|(_, p), _| *p != pid);
        for c in self.comms.values_mut() {
            if let Some(m) = c.members.get_mut(&pid) {
                m.exited = Some(exit.clone());
            }
        }
    }

    /// Forgets processes that exited long ago and communicators left with no member.
    pub fn prune(&mut self, now: f64) {
        for c in self.comms.values_mut() {
            c.members.retain(|_, m| m.exited.as_ref().is_none_or(|e| now - e.at < EXITED_KEEP_SECONDS));
        }
        self.comms.retain(|_, c| !c.members.is_empty());
        let comms = &self.comms;
        self.gpu_open.retain(|(id, pid), _| comms.get(id).is_some_and(|c| c.members.contains_key(pid)));
    }

    pub fn open_calls(&self) -> &[Open] {
        &self.open
    }

    /// The view served by `/api/v1/open` (states not filled).
    pub fn snapshot(&self, host: &str, as_of: f64) -> HostProgress {
        let mut comms: Vec<CommProgress> = self
            .comms
            .iter()
            .map(|(id, c)| {
                let mut ranks: Vec<RankProgress> = c
                    .members
                    .iter()
                    .map(|(pid, m)| RankProgress {
                        rank: m.rank,
                        pid: *pid,
                        host: host.to_string(),
                        // An entry whose return was lost (a dropped event) while the process
                        // went on to complete a later call is not open.
                        open: self
                            .open
                            .iter()
                            .filter(|o| o.comm == *id && o.pid == *pid)
                            .map(|o| &o.call)
                            .chain(self.gpu_open.get(&(*id, *pid)))
                            .find(|o| m.last_done.as_ref().is_none_or(|d| d.seq < o.seq))
                            .cloned(),
                        last_done: m.last_done.clone(),
                        aborted: m.aborted.clone(),
                        exited: m.exited.clone(),
                        state: None,
                        enqueue_only: m.enqueue_only,
                    })
                    .collect();
                ranks.sort_by_key(|r| (r.rank.unwrap_or(u32::MAX), r.pid));
                CommProgress {
                    comm: id.to_string(),
                    global: c.global,
                    library: c.library.to_string(),
                    nranks: c.nranks,
                    median_seconds: median(&c.durations),
                    samples: c.durations.len(),
                    ranks,
                }
            })
            .collect();
        comms.sort_by(|a, b| a.comm.cmp(&b.comm));
        HostProgress { host: host.to_string(), as_of, comms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::collectives::targets::Family;

    fn call(pid: u32, rank: u32, seq: u64) -> Call {
        Call {
            pid,
            tid: pid,
            library: Family::Mpi,
            op: "all_reduce".into(),
            bytes: Some(8),
            comm: Some(CommId(7)),
            comm_global: true,
            rank: Some(rank),
            nranks: Some(2),
            seq: Some(seq),
            enter_ns: 0,
            exit_ns: 0,
            ret: Some(0),
            aborted: false,
            grouped: false,
        }
    }

    #[test]
    fn open_done_aborted_and_exited_ranks_are_reported() {
        let mut p = Progress::default();
        for (seq, d) in [(0, 0.1), (1, 0.3), (2, 0.2)] {
            p.observe(&call(10, 0, seq), 100.0 + seq as f64, 100.0 + seq as f64 + d, crate::timeline::join::Timing::HostCompletion);
            p.observe(&call(11, 1, seq), 100.0 + seq as f64, 100.0 + seq as f64 + d, crate::timeline::join::Timing::HostCompletion);
        }
        p.set_open(vec![(call(10, 0, 3), 104.0), (call(11, 1, 3), 104.5)]);
        let mut killed = call(11, 1, 3);
        killed.aborted = true;
        p.observe(&killed, 104.5, 106.0, crate::timeline::join::Timing::HostCompletion);
        p.exited(11, Exit { at: 106.0, signal: Some(9), code: None });
        let v = p.snapshot("h", 107.0);
        assert_eq!(v.comms.len(), 1);
        let c = &v.comms[0];
        assert_eq!((c.comm.as_str(), c.nranks, c.samples), ("0000000000000007", Some(2), 6));
        assert!((c.median_seconds.expect("median") - 0.2).abs() < 1e-9);
        let r0 = &c.ranks[0];
        assert_eq!((r0.rank, r0.open.as_ref().map(|o| o.seq), r0.last_done.as_ref().map(|d| d.seq)), (Some(0), Some(3), Some(2)));
        let r1 = &c.ranks[1];
        assert!(r1.open.is_none(), "an exited process has no open call");
        assert_eq!(r1.aborted.as_ref().map(|a| a.seq), Some(3));
        assert_eq!(r1.exited.as_ref().and_then(|e| e.signal), Some(9));
        // A stale entry (its return lost) behind a completed later call is not open.
        p.set_open(vec![(call(10, 0, 1), 101.0)]);
        assert!(p.snapshot("h", 107.0).comms[0].ranks[0].open.is_none());
        p.prune(106.0 + EXITED_KEEP_SECONDS + 1.0);
        assert_eq!(p.snapshot("h", 0.0).comms[0].ranks.len(), 1, "the long-exited process is forgotten");
    }

    #[test]
    fn a_collective_open_on_the_gpu_is_open_until_its_completion() {
        // Four ranks' GPUs finished seq 4; three started seq 5, rank 2's GPU never did.
        let mut p = Progress::default();
        for r in 0..4u32 {
            p.observe(&call(10 + r, r, 4), 100.0, 100.1, crate::timeline::join::Timing::HostCompletion);
        }
        for r in [0u32, 1, 3] {
            p.gpu_started(&call(10 + r, r, 5), 100.2 + f64::from(r) * 0.01);
        }
        let v = p.snapshot("h", 110.0);
        let open: Vec<(Option<u32>, Option<u64>)> = v.comms[0].ranks.iter().map(|r| (r.rank, r.open.as_ref().map(|o| o.seq))).collect();
        assert_eq!(open, [(Some(0), Some(5)), (Some(1), Some(5)), (Some(2), None), (Some(3), Some(5))]);
        assert_eq!(v.comms[0].ranks[0].open.as_ref().map(|o| o.since), Some(100.2));
        // A late progress record of an already completed collective opens nothing.
        p.observe(&call(10, 0, 5), 100.2, 100.3, crate::timeline::join::Timing::HostCompletion);
        p.gpu_started(&call(10, 0, 5), 100.2);
        let v = p.snapshot("h", 110.0);
        assert!(v.comms[0].ranks[0].open.is_none(), "completed: {:?}", v.comms[0].ranks[0]);
        assert_eq!(v.comms[0].ranks[1].open.as_ref().map(|o| o.seq), Some(5), "rank 1 still inside");
        // The host-side open set is replaced wholesale; the GPU side is not.
        p.set_open(Vec::new());
        assert!(p.snapshot("h", 110.0).comms[0].ranks[1].open.is_some());
        p.exited(11, Exit { at: 111.0, signal: Some(9), code: None });
        assert!(p.snapshot("h", 111.0).comms[0].ranks[1].open.is_none(), "an exited process has nothing open");
    }

    #[test]
    fn communicators_are_bounded() {
        let mut p = Progress::default();
        for i in 0..(MAX_COMMS as u64 + 10) {
            let mut c = call(1, 0, 0);
            c.comm = Some(CommId(i));
            p.observe(&c, i as f64, i as f64 + 1.0, crate::timeline::join::Timing::HostCompletion);
        }
        let v = p.snapshot("h", 0.0);
        assert_eq!(v.comms.len(), MAX_COMMS);
        assert!(!v.comms.iter().any(|c| c.comm == CommId(0).to_string()), "the least recently active went first");
    }
}
