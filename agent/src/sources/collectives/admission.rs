//! Admission of the NCCL profiler plugin's records (issue 38): 15 s of forged records made
//! 10 066 steps and grew the store from 57 KB to 75.6 MB, each claiming any pid it liked.
//!
//! - The pid a datagram's header claims must be its sender's, as the kernel reports it
//!   (`SCM_CREDENTIALS`): equal to it, or, for a sender in a child pid namespace (a
//!   container), one of its pids there (`NSpid` in `/proc/<pid>/status`), then mapped to the
//!   agent's view of it. Anything else is refused.
//! - The sender must be a process the agent watches (`[collectives] select`: its network
//!   namespace, cgroup or pids), as its probes do: records from any other process are not
//!   the job's. The verdict is kept per process for [`SELECTION_TTL_SECONDS`].
//! - Like markers (`timeline::admission`), each sending process is within a rate (records/s,
//!   a token bucket with a burst of twice that), and communicators new to the agent — each a
//!   new sequence, so new steps — are bounded per second over all senders.
//!
//! Refusals are counted in `stepwise_profiler_records_dropped_total{reason}`.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::{sources::sockpath::Peer, timeline::admission::Bucket};

/// A sending process not heard from for this long is forgotten.
const PROCESS_IDLE_SECONDS: f64 = 60.0;
/// Processes tracked at most (the plugin store keeps as many).
const MAX_PROCESSES: usize = 1024;
/// Communicators remembered as known (the newest).
const COMMS_REMEMBERED: usize = 8192;
/// How long a sender's selection verdict is kept before `/proc` is read again.
pub const SELECTION_TTL_SECONDS: f64 = 5.0;
/// Senders whose verdict is kept at most (all forgotten when full).
const SELECTION_CACHE: usize = 4096;

/// The bounds; the defaults leave room for a process issuing 4 000 collectives a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub process_records_per_second: f64,
    pub new_comms_per_second: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { process_records_per_second: 4000.0, new_comms_per_second: 20.0 }
    }
}

/// Why a datagram or record was refused (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials came with the datagram.
    NoCredentials,
    /// The sender's process is not visible in the agent's pid namespace.
    PidUnmapped,
    /// The header's pid is none of the sender's.
    PidMismatch,
    /// The sender is not a process the agent watches (`[collectives] select`).
    NotSelected,
    TooManyProcesses,
    ProcessRate,
    NewCommunicators,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoCredentials => "no_credentials",
            Refusal::PidUnmapped => "pid_unmapped",
            Refusal::PidMismatch => "pid_mismatch",
            Refusal::NotSelected => "not_selected",
            Refusal::TooManyProcesses => "too_many_processes",
            Refusal::ProcessRate => "process_rate",
            Refusal::NewCommunicators => "new_communicators",
        }
    }
}

/// The pid the agent files a datagram's records under: the sender's (in the agent's pid
/// namespace) when `claimed` is it, or is its pid in a nested namespace (`nspids`: the
/// `NSpid` line of its `/proc/<pid>/status`, read only then).
pub fn sender_pid(claimed: u32, peer: Option<Peer>, nspids: impl FnOnce(u32) -> Vec<u32>) -> Result<u32, Refusal> {
    let peer = peer.ok_or(Refusal::NoCredentials)?;
    if peer.pid == 0 {
        return Err(Refusal::PidUnmapped);
    }
    if peer.pid == claimed || nspids(peer.pid).contains(&claimed) {
        Ok(peer.pid)
    } else {
        Err(Refusal::PidMismatch)
    }
}

/// The `NSpid` line of `/proc/<pid>/status`: the process's pid in each pid namespace it is in,
/// outermost first (empty when unreadable).
pub fn nspids(pid: u32) -> Vec<u32> {
    let Ok(text) = crate::sources::fsread::read_to_string(std::path::Path::new(&format!("/proc/{pid}/status"))) else { return Vec::new() };
    parse_nspid(&text)
}

fn parse_nspid(status: &str) -> Vec<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:")).unwrap_or("");
    line.split_whitespace().filter_map(|v| v.parse().ok()).collect()
}

/// Whether a sender is a process the agent watches: `[collectives] select` applied to its
/// pid under `proc_root`, the verdict cached per pid.
#[derive(Debug, Default)]
pub struct SenderSelection {
    selector: super::procs::Selector,
    proc_root: std::path::PathBuf,
    verdicts: HashMap<u32, (bool, f64)>,
}

impl SenderSelection {
    pub fn new(selector: super::procs::Selector, proc_root: std::path::PathBuf) -> SenderSelection {
        SenderSelection { selector, proc_root, verdicts: HashMap::new() }
    }

    /// Whether `pid` (in the agent's pid namespace) is selected, at `now` seconds.
    pub fn selects(&mut self, pid: u32, now: f64) -> bool {
        if let Some(&(v, at)) = self.verdicts.get(&pid) {
            if now - at < SELECTION_TTL_SECONDS {
                return v;
            }
        }
        if self.verdicts.len() >= SELECTION_CACHE {
            self.verdicts.clear();
        }
        let v = self.selector.selects(&self.proc_root, pid);
        self.verdicts.insert(pid, (v, now));
        v
    }
}

#[derive(Debug)]
struct Process {
    bucket: Bucket,
    seen: f64,
}

/// The admission state of the profiler socket's records.
#[derive(Debug)]
pub struct RecordAdmission {
    limits: Limits,
    procs: HashMap<u32, Process>,
    comms: HashSet<u64>,
    order: VecDeque<u64>,
    new_comms: Bucket,
}

impl Default for RecordAdmission {
    fn default() -> Self {
        RecordAdmission::new(Limits::default())
    }
}

impl RecordAdmission {
    pub fn new(limits: Limits) -> RecordAdmission {
        RecordAdmission {
            limits,
            procs: HashMap::new(),
            comms: HashSet::new(),
            order: VecDeque::new(),
            new_comms: Bucket::full(limits.new_comms_per_second, 0.0),
        }
    }

    /// Admits one record of process `pid` (already checked against its credentials) on the
    /// communicator `comm`, at `now` seconds of a monotonic clock.
    pub fn admit(&mut self, pid: u32, comm: u64, now: f64) -> Result<(), Refusal> {
        let l = self.limits;
        if !self.procs.contains_key(&pid) && self.procs.len() >= MAX_PROCESSES {
            self.procs.retain(|_, p| now - p.seen < PROCESS_IDLE_SECONDS);
            if self.procs.len() >= MAX_PROCESSES {
                return Err(Refusal::TooManyProcesses);
            }
        }
        let p = self.procs.entry(pid).or_insert_with(|| Process { bucket: Bucket::full(l.process_records_per_second, now), seen: now });
        p.seen = now;
        if !p.bucket.take(l.process_records_per_second, now) {
            return Err(Refusal::ProcessRate);
        }
        if !self.comms.contains(&comm) {
            if !self.new_comms.take(l.new_comms_per_second, now) {
                return Err(Refusal::NewCommunicators);
            }
            self.comms.insert(comm);
            self.order.push_back(comm);
            if self.order.len() > COMMS_REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.comms.remove(&old);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(pid: u32) -> Option<Peer> {
        Some(Peer { pid, uid: 0 })
    }

    #[test]
    fn only_selected_senders_pass_and_a_verdict_is_kept_for_its_ttl() {
        let root = tempfile::tempdir().expect("tmp");
        for (pid, cg) in [(100, "0::/job/rank0\n"), (200, "0::/other\n")] {
            std::fs::create_dir_all(root.path().join(pid.to_string())).expect("dir");
            std::fs::write(root.path().join(format!("{pid}/cgroup")), cg).expect("cgroup");
        }
        let sel = crate::config::collectives::Selection { cgroup: Some("/job".into()), ..Default::default() }.resolve().expect("resolve");
        let mut s = SenderSelection::new(sel, root.path().to_path_buf());
        assert!(s.selects(100, 10.0));
        assert!(!s.selects(200, 10.0));
        assert!(!s.selects(300, 10.0), "a process that is not there is not selected");
        // Moved into the job's cgroup: seen once the verdict's time is up.
        std::fs::write(root.path().join("200/cgroup"), "0::/job/rank1\n").expect("cgroup");
        assert!(!s.selects(200, 10.0 + SELECTION_TTL_SECONDS * 0.5));
        assert!(s.selects(200, 10.0 + SELECTION_TTL_SECONDS));
    }

    #[test]
    fn a_record_claims_only_its_senders_pid_mapped_from_a_nested_namespace() {
        let none = |_| Vec::new();
        assert_eq!(sender_pid(4242, peer(4242), none), Ok(4242));
        for forged in [0, 1, u32::MAX] {
            assert_eq!(sender_pid(forged, peer(4242), none), Err(Refusal::PidMismatch), "pid {forged}");
        }
        assert_eq!(sender_pid(4242, None, none), Err(Refusal::NoCredentials));
        assert_eq!(sender_pid(7, peer(0), none), Err(Refusal::PidUnmapped));
        // A container's process: pid 7 in its namespace, 4242 in the agent's.
        let status = "Name:\tpython\nTgid:\t4242\nNSpid:\t4242\t7\nPPid:\t1\n";
        assert_eq!(parse_nspid(status), vec![4242, 7]);
        assert_eq!(sender_pid(7, peer(4242), |_| parse_nspid(status)), Ok(4242));
        assert_eq!(sender_pid(8, peer(4242), |_| parse_nspid(status)), Err(Refusal::PidMismatch));
        assert!(nspids(std::process::id()).contains(&std::process::id()));
    }

    #[test]
    fn each_process_has_its_rate_and_new_communicators_are_bounded() {
        let mut a = RecordAdmission::new(Limits { process_records_per_second: 100.0, new_comms_per_second: 5.0 });
        let burst = (0..1000).filter(|_| a.admit(1, 0, 0.0).is_ok()).count();
        assert_eq!(burst, 200, "a burst of twice the rate");
        assert_eq!(a.admit(1, 0, 0.0), Err(Refusal::ProcessRate));
        assert!(a.admit(2, 0, 0.0).is_ok(), "another process has its own rate");
        assert!(a.admit(1, 0, 0.1).is_ok(), "refilled");
        // Communicator 0 took one of the burst of 10 at 0 s; 0.5 refilled by 0.1 s: 9 more.
        let new = (1..100u64).filter(|c| a.admit(3, *c, 0.1).is_ok()).count();
        assert_eq!(new, 9);
        assert_eq!(a.admit(3, 500, 0.1), Err(Refusal::NewCommunicators));
        assert!(a.admit(3, 5, 0.1).is_ok(), "a known communicator passes");
    }
}
