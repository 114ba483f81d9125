//! Raw probe events → `Call`s: entry/exit paired per thread, arguments decoded per target
//! table, communicators identified, and `(CommId, seq)` assigned per communicator in issue
//! order (NCCL and MPI require every rank to issue collectives in the same order, so the pair
//! matches across ranks and hosts). Pure: no I/O; the source feeds it events and process facts.

use std::collections::{BTreeMap, HashMap};

use agent_common::{ProbeEvent, BLOB_BYTES, KIND_ENTER, KIND_ENTER_ALONE, KIND_EXIT};
use serde::Serialize;

use super::comm_id;

#[path = "gloo_groups.rs"]
pub mod gloo_groups;
use super::targets::{mpich_type_size, nccl_type_size, Arg, Decoder, Derive, Family, Op, MPICH_COMM_WORLD};

/// A communicator's identity, shared by all its ranks (hex in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommId(pub u64);

impl Serialize for CommId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:016x}", self.0))
    }
}

impl std::fmt::Display for CommId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// FNV-1a 64: stable across hosts and builds (the same uniqueId hashes to the same CommId on
/// every rank; std's SipHash keys are not guaranteed stable).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What the decoder knows about one probe id.
#[derive(Clone, Debug)]
pub struct ProbeInfo {
    pub family: Family,
    pub op: Op,
    pub decoder: Decoder,
    pub user_op: Option<String>,
}

/// Facts about a traced process (from its allowlisted environment and its mappings).
#[derive(Clone, Debug, Default)]
pub struct ProcInfo {
    pub env: BTreeMap<String, String>,
    /// OpenMPI predefined datatype runtime addresses → element size.
    pub ompi_types: HashMap<u64, u64>,
    /// Runtime address of `ompi_mpi_comm_world`.
    pub ompi_world: Option<u64>,
    /// Its Kubernetes pod, when it runs in one.
    pub pod: Option<super::k8s::Pod>,
    /// A call of it has returned: its connections are open, so its NIC link can be complete.
    pub called: bool,
    /// The NIC its traffic uses, as `stepwise_rank_info` names it (`several`; empty until
    /// linked, see [`crate::timeline::links`]).
    pub nic: String,
    /// Its GPU's PCI address, from its profiler plugin (empty until reported).
    pub gpu: String,
    /// That GPU's UUID from the NVIDIA driver (`/proc/driver/nvidia/gpus/<pci>/information`;
    /// empty when the driver does not say).
    pub gpu_uuid: String,
    /// The node it runs on (the agent's host name): part of the identity of per-node
    /// communicators (`MPI_Comm_split_type`).
    pub host: String,
    /// Runtime address of `ompi_mpi_comm_null` (what OpenMPI's constructors return to a
    /// rank they give no communicator).
    pub ompi_null: Option<u64>,
}

impl ProcInfo {
    fn env_u32(&self, keys: &[&str]) -> Option<u32> {
        keys.iter().find_map(|k| self.env.get(*k).and_then(|v| v.parse().ok()))
    }
    /// The job identity used to match communicators across hosts when the library gives none.
    pub fn job(&self) -> String {
        for k in ["STEPWISE_JOB", "PMIX_NAMESPACE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"] {
            if let Some(v) = self.env.get(k) {
                return format!("{k}={v}");
            }
        }
        match (self.env.get("MASTER_ADDR"), self.env.get("MASTER_PORT")) {
            (Some(a), Some(p)) => format!("master={a}:{p}"),
            _ => "job=unknown".into(),
        }
    }
    /// The rank on this node, from the launcher's environment.
    /// Its labels on the per-rank series.
    pub fn identity(&self) -> crate::labels::RankIdentity {
        let pod = self.pod.as_ref();
        crate::labels::RankIdentity {
            local_rank: self.local_rank().map(|v| v.to_string()).unwrap_or_default(),
            namespace: pod.and_then(|p| p.namespace.clone()).unwrap_or_default(),
            pod: pod.and_then(|p| p.name.clone()).unwrap_or_default(),
            gpu: self.gpu.clone(),
        }
    }
    pub fn local_rank(&self) -> Option<u32> {
        self.env_u32(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"])
    }
    pub fn world_rank(&self) -> Option<u32> {
        self.env_u32(&["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK", "SLURM_PROCID", "STEPWISE_RANK"])
    }
    pub fn world_size(&self) -> Option<u32> {
        self.env_u32(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS"])
    }
}

/// One probed library call.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Call {
    pub pid: u32,
    pub tid: u32,
    pub library: Family,
    pub op: std::sync::Arc<str>,
    /// Payload bytes (count × element size), when the arguments say.
    pub bytes: Option<u64>,
    pub comm: Option<CommId>,
    /// Whether `comm` is shared by all ranks (from the library) or only local (unknown init).
    pub comm_global: bool,
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    /// Sequence number of this collective on its communicator (collectives only).
    pub seq: Option<u64>,
    /// CLOCK_MONOTONIC ns.
    pub enter_ns: u64,
    pub exit_ns: u64,
    /// Return value (ncclResult_t / MPI error code), if the call returned.
    pub ret: Option<i64>,
    /// The process exited (or was killed) inside the call.
    pub aborted: bool,
    /// Issued between ncclGroupStart and ncclGroupEnd.
    pub grouped: bool,
}

/// A request of NCCL's internal network transport (for in-flight analysis).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NetRequest {
    pub pid: u32,
    pub send: bool,
    pub bytes: Option<u64>,
    pub posted_ns: u64,
    pub completed_ns: u64,
}

#[derive(Clone, Debug)]
struct Pending {
    probe_id: u32,
    ev: ProbeEvent,
    seq: Option<u64>,
    comm: Option<(CommId, bool, Option<u32>, Option<u32>)>,
    grouped: bool,
    bytes: Option<u64>,
    /// (pid, communicator handle) of the call.
    comm_key: Option<(u32, u64)>,
    /// ncclCommSplit and MPI constructors: how many the parent had before this one.
    split_index: Option<u64>,
}

#[derive(Clone, Debug)]
struct CommState {
    id: CommId,
    global: bool,
    rank: Option<u32>,
    nranks: Option<u32>,
    next_seq: u64,
    /// ncclCommSplit calls and MPI constructors over the whole communicator issued on it so
    /// far (every rank of the parent issues them in the same order, so the n-th split is
    /// the same on every rank).
    splits: u64,
    /// `MPI_Comm_create_group` calls on it so far (collective over the group only: counted
    /// apart, so ranks outside a group keep the same count of the others).
    group_creates: u64,
}

/// Decode errors (counted, never fatal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    UnknownProbe,
    UnpairedExit,
    BadDatatype,
}

impl DecodeError {
    pub fn kind(self) -> &'static str {
        match self {
            DecodeError::UnknownProbe => "unknown_probe",
            DecodeError::UnpairedExit => "unpaired_exit",
            DecodeError::BadDatatype => "bad_datatype",
        }
    }
}

/// Output of one event.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    Nothing,
    Call(Call),
    /// A call complete at its entry whose arguments did not all decode (counted; the call
    /// is kept).
    CallWithError(Call, DecodeError),
    Net(NetRequest),
}

/// The stateful decoder.
#[derive(Default)]
pub struct CallDecoder {
    /// Each probe's facts and its operation name (shared by every call it makes: no
    /// allocation per call or per event).
    probes: HashMap<u32, (std::sync::Arc<ProbeInfo>, std::sync::Arc<str>)>,
    pending: HashMap<u32, Vec<Pending>>,
    comms: HashMap<(u32, u64), CommState>,
    group_depth: HashMap<u32, u32>,
    /// (pid, request handle) → (send, bytes, posted_ns)
    net_inflight: HashMap<(u32, u64), (bool, Option<u64>, u64)>,
    /// tid → (send, bytes, enter_ns) of an Isend/Irecv whose request is not known yet.
    net_posting: HashMap<u32, (bool, Option<u64>, u64)>,
    gloo: gloo_groups::GlooGroups,
}

pub(super) fn arg(ev: &ProbeEvent, a: Arg) -> u64 {
    match a {
        Arg::Reg(i) => ev.args.get(i as usize).copied().unwrap_or(0),
        Arg::Stack(i) => ev.stack.get(i as usize).copied().unwrap_or(0),
    }
}

impl CallDecoder {
    pub fn register(&mut self, probe_id: u32, info: ProbeInfo) {
        let op: std::sync::Arc<str> = std::sync::Arc::from(info.user_op.as_deref().unwrap_or(info.op.as_str()));
        self.probes.insert(probe_id, (std::sync::Arc::new(info), op));
    }

    /// Forgets a probe whose links were detached: events still fired by a link being torn
    /// down are then unknown (counted), never a second copy of a call the file's new
    /// attachment also sees.
    pub fn unregister(&mut self, probe_id: u32) {
        self.probes.remove(&probe_id);
    }

    pub fn tracked_comms(&self) -> usize {
        self.comms.len()
    }

    /// Forgets a process (after it exited): returns its calls still in flight as aborted.
    /// A tid reused by another process keeps that process's calls (fuzz target
    /// `probe_events`: they were reported as this one's, aborted, and lost).
    pub fn process_exited(&mut self, pid: u32, now_ns: u64) -> Vec<Call> {
        let tids: Vec<u32> = self.pending.iter().filter(|(_, v)| v.iter().any(|p| p.ev.pid == pid)).map(|(t, _)| *t).collect();
        let mut out = Vec::new();
        for tid in tids {
            let Some(stack) = self.pending.remove(&tid) else { continue };
            let (gone, kept): (Vec<Pending>, Vec<Pending>) = stack.into_iter().partition(|p| p.ev.pid == pid);
            for p in gone {
                if let Some((info, _)) = self.probes.get(&p.probe_id) {
                    if info.op.is_collective() || matches!(info.op, Op::Send | Op::Recv) {
                        out.push(self.make_call(info, &p, None, now_ns, true));
                    }
                }
            }
            if !kept.is_empty() {
                self.pending.insert(tid, kept);
                continue;
            }
            self.group_depth.remove(&tid);
            self.net_posting.remove(&tid);
        }
        self.comms.retain(|(p, _), _| *p != pid);
        self.net_inflight.retain(|(p, _), _| *p != pid);
        self.gloo_forget(pid);
        out
    }

    /// Collectives entered and not returned yet (`exit_ns` 0, no return value).
    pub fn open_calls(&self) -> Vec<Call> {
        let mut out = Vec::new();
        for p in self.pending.values().flatten().filter(|p| p.seq.is_some()) {
            if let Some((info, _)) = self.probes.get(&p.probe_id) {
                if info.op.is_collective() {
                    out.push(self.make_call(info, p, None, 0, false));
                }
            }
        }
        out
    }

    fn comm_for(&mut self, info: &ProbeInfo, ev: &ProbeEvent, handle: u64, proc: &ProcInfo) -> (CommId, bool, Option<u32>, Option<u32>) {
        let key = (ev.pid, handle);
        if let Some(c) = self.comms.get(&key) {
            return (c.id, c.global, c.rank, c.nranks);
        }
        // A communicator first seen without its creation (the process started before the
        // agent, or MPI): derive what identity the environment allows.
        let job = proc.job();
        let (id, global) = match info.family {
            Family::Mpi if handle == MPICH_COMM_WORLD || Some(handle) == proc.ompi_world => {
                (CommId(fnv1a(&[b"mpi-world", job.as_bytes()])), job != "job=unknown")
            }
            Family::Gloo => (gloo_groups::default_id(&job), job != "job=unknown"),
            _ => (CommId(fnv1a(&[b"local", &ev.pid.to_le_bytes(), &handle.to_le_bytes()])), false),
        };
        let world = matches!(info.family, Family::Mpi | Family::Gloo) && global;
        let st = CommState {
            id,
            global,
            rank: if world { proc.world_rank() } else { None },
            nranks: if world { proc.world_size() } else { None },
            next_seq: 0,
            splits: 0,
            group_creates: 0,
        };
        let out = (st.id, st.global, st.rank, st.nranks);
        self.comms.insert(key, st);
        out
    }

    fn bytes(info: &ProbeInfo, ev: &ProbeEvent, proc: &ProcInfo) -> Result<Option<u64>, DecodeError> {
        match info.decoder {
            Decoder::Data { count, dtype, .. } => {
                let n = arg(ev, count);
                let t = arg(ev, dtype);
                let size = match info.family {
                    Family::Nccl => nccl_type_size(t & 0xffff_ffff),
                    Family::Mpi => mpich_type_size(t).or_else(|| proc.ompi_types.get(&t).copied()),
                    _ => None,
                };
                match size {
                    Some(s) => Ok(Some((n & 0xffff_ffff_ffff).saturating_mul(s))),
                    None if info.family == Family::Nccl => Err(DecodeError::BadDatatype),
                    None => Ok(None),
                }
            }
            Decoder::Fixed { count: Some(c), elem_size, .. } => Ok(Some(arg(ev, c).saturating_mul(elem_size))),
            _ => Ok(None),
        }
    }

    fn comm_arg(info: &ProbeInfo) -> Option<Arg> {
        match info.decoder {
            Decoder::Data { comm, .. } | Decoder::Fixed { comm, .. } => comm,
            Decoder::CommOnly { comm } | Decoder::MpiCommQuery { comm } => Some(comm),
            Decoder::NcclSplit { parent } | Decoder::MpiCommNew { parent, .. } => Some(parent),
            _ => None,
        }
    }

    /// Feeds one event. Errors are returned for counting; state stays consistent.
    pub fn feed(&mut self, ev: &ProbeEvent, proc: &ProcInfo) -> Result<Decoded, DecodeError> {
        let info = self.probes.get(&ev.probe_id).map(|(i, _)| i.clone()).ok_or(DecodeError::UnknownProbe)?;
        if ev.kind == KIND_ENTER {
            let (pend, result) = self.enter(&info, ev, proc);
            self.push_pending(pend);
            return result.map(|_| Decoded::Nothing);
        }
        if ev.kind == KIND_ENTER_ALONE {
            // The session program skipped this call's return: an asynchronous NCCL call,
            // complete once enqueued at its entry.
            let (pend, result) = self.enter(&info, ev, proc);
            let c = self.make_call(&info, &pend, None, ev.ts_ns, false);
            return Ok(match result {
                Ok(()) => Decoded::Call(c),
                Err(e) => Decoded::CallWithError(c, e),
            });
        }
        if ev.kind != KIND_EXIT {
            return Err(DecodeError::UnknownProbe);
        }
        let stack = self.pending.get_mut(&ev.tid).ok_or(DecodeError::UnpairedExit)?;
        // Return probes fire in LIFO order per thread; find the newest entry of this probe by
        // this process (a tid may be reused by another process before the first is reaped).
        let pos = stack.iter().rposition(|p| p.probe_id == ev.probe_id && p.ev.pid == ev.pid).ok_or(DecodeError::UnpairedExit)?;
        let p = stack.remove(pos);
        if stack.is_empty() {
            self.pending.remove(&ev.tid);
        }
        let ret = ev.args[0] as i32 as i64;
        match info.op {
            Op::GroupStart => {
                *self.group_depth.entry(ev.tid).or_insert(0) += 1;
                Ok(Decoded::Nothing)
            }
            Op::GroupEnd => {
                if let Some(d) = self.group_depth.get_mut(&ev.tid) {
                    *d = d.saturating_sub(1);
                }
                Ok(Decoded::Nothing)
            }
            _ if matches!(info.decoder, Decoder::GlooContext | Decoder::GroupName) => Ok(Decoded::Nothing),
            Op::CommInit | Op::CommSplit | Op::CommDup | Op::CommCreate => Ok(Decoded::Call(self.created(&info, &p, ev, ret, proc))),
            Op::CommRank | Op::CommSize => {
                if let (Some(Arg::Reg(_)), 1) = (Self::comm_arg(&info), ev.has_deref) {
                    let handle = Self::comm_arg(&info).map(|a| arg(&p.ev, a)).unwrap_or(0);
                    let v = ev.args[1] as u32;
                    let _ = self.comm_for(&info, &p.ev, handle, proc);
                    if let Some(c) = self.comms.get_mut(&(ev.pid, handle)) {
                        if info.op == Op::CommRank {
                            c.rank = Some(v)
                        } else {
                            c.nranks = Some(v)
                        }
                    }
                }
                Ok(Decoded::Nothing)
            }
            Op::CommDestroy | Op::CommAbort => {
                let handle = Self::comm_arg(&info).map(|a| arg(&p.ev, a)).unwrap_or(0);
                let c = self.make_call(&info, &p, Some(ret), ev.ts_ns, false);
                self.comms.remove(&(ev.pid, handle));
                Ok(Decoded::Call(c))
            }
            Op::NetIsend | Op::NetIrecv => {
                let posting = self.net_posting.remove(&ev.tid);
                if ev.has_deref == 1 && ev.args[1] != 0 {
                    if let Some((send, bytes, t)) = posting {
                        self.net_inflight.insert((ev.pid, ev.args[1]), (send, bytes, t));
                    }
                }
                Ok(Decoded::Nothing)
            }
            Op::NetTest => {
                let done = ev.has_deref == 1 && (ev.args[1] as u32) != 0;
                let req = p.ev.args[0];
                if done {
                    if let Some((send, bytes, posted)) = self.net_inflight.remove(&(ev.pid, req)) {
                        return Ok(Decoded::Net(NetRequest { pid: ev.pid, send, bytes, posted_ns: posted, completed_ns: ev.ts_ns }));
                    }
                }
                Ok(Decoded::Nothing)
            }
            _ => Ok(Decoded::Call(self.make_call(&info, &p, Some(ret), ev.ts_ns, false))),
        }
    }

    /// The return of a call that makes a communicator: the new handle (through the
    /// out-pointer) is tracked under its identity, which the call carries. A call that
    /// returned none (an error, `NCCL_SPLIT_NOCOLOR`, `MPI_UNDEFINED`, `MPI_COMM_NULL`)
    /// belongs to no communicator, and must not carry the parent's identity.
    fn created(&mut self, info: &ProbeInfo, p: &Pending, ev: &ProbeEvent, ret: i64, proc: &ProcInfo) -> Call {
        let handle = ev.args[1];
        let null = handle == 0 || (info.family == Family::Mpi && (handle == comm_id::MPICH_COMM_NULL || Some(handle) == proc.ompi_null));
        let parent = p.comm.map(|c| c.0).unwrap_or(CommId(0));
        let global = p.comm.is_some_and(|c| c.1);
        let nth = p.split_index.unwrap_or(0);
        let made = match info.decoder {
            _ if ev.has_deref != 1 || ret != 0 || null => None,
            Decoder::NcclInit { nranks, rank } => {
                let id = if p.ev.has_blob == 1 {
                    CommId(fnv1a(&[&p.ev.blob[..BLOB_BYTES]]))
                } else {
                    CommId(fnv1a(&[b"local", &ev.pid.to_le_bytes(), &handle.to_le_bytes()]))
                };
                Some((id, p.ev.has_blob == 1, Some(arg(&p.ev, rank) as u32), Some(arg(&p.ev, nranks) as u32)))
            }
            Decoder::NcclSplit { .. } => Some((comm_id::nccl_split(parent, nth, p.ev.args[1] as u32), global, None, None)),
            Decoder::MpiCommNew { how, .. } => comm_id::mpi_child(parent, how, nth, &p.ev, &proc.host).map(|id| (id, global, None, None)),
            _ => None,
        };
        let mut c = self.make_call(info, p, Some(ret), ev.ts_ns, false);
        match made {
            Some((id, global, rank, nranks)) => {
                self.comms.insert((ev.pid, handle), CommState { id, global, rank, nranks, next_seq: 0, splits: 0, group_creates: 0 });
                (c.comm, c.comm_global, c.rank, c.nranks) = (Some(id), global, rank, nranks);
            }
            None if info.op != Op::CommInit => (c.comm, c.comm_global, c.rank, c.nranks) = (None, false, None, None),
            None => {}
        }
        c
    }

    /// The pending call an entry opens (sequence number, communicator, bytes), and whether
    /// its arguments all decoded.
    fn enter(&mut self, info: &ProbeInfo, ev: &ProbeEvent, proc: &ProcInfo) -> (Pending, Result<(), DecodeError>) {
        match info.decoder {
            Decoder::GlooContext => self.gloo_context(ev, proc),
            Decoder::GroupName => self.gloo_group_name(ev, proc),
            _ => {}
        }
        let grouped = self.group_depth.get(&ev.tid).copied().unwrap_or(0) > 0;
        let mut pend = Pending { probe_id: ev.probe_id, ev: *ev, seq: None, comm: None, grouped, bytes: None, comm_key: None, split_index: None };
        let mut result = Ok(());
        if let Some(a) = Self::comm_arg(info) {
            let handle = arg(ev, a);
            let c = self.comm_for(info, ev, handle, proc);
            pend.comm = Some(c);
            pend.comm_key = Some((ev.pid, handle));
            if info.op.derives_comm() {
                if let Some(st) = self.comms.get_mut(&(ev.pid, handle)) {
                    let n = match info.decoder {
                        Decoder::MpiCommNew { how: Derive::CreateGroup { .. }, .. } => &mut st.group_creates,
                        _ => &mut st.splits,
                    };
                    pend.split_index = Some(*n);
                    *n += 1;
                }
            } else if info.op.is_collective() {
                if let Some(st) = self.comms.get_mut(&(ev.pid, handle)) {
                    pend.seq = Some(st.next_seq);
                    st.next_seq += 1;
                }
            }
        } else if info.op.is_collective() && info.family == Family::Gloo {
            let handle = self.gloo_handle(ev);
            let c = self.comm_for(info, ev, handle, proc);
            pend.comm = Some(c);
            pend.comm_key = Some((ev.pid, handle));
            if let Some(st) = self.comms.get_mut(&(ev.pid, handle)) {
                pend.seq = Some(st.next_seq);
                st.next_seq += 1;
            }
        }
        if matches!(info.op, Op::NetIsend | Op::NetIrecv) {
            let bytes = match info.decoder {
                Decoder::NetPost { size: Some(a) } => Some(arg(ev, a)),
                _ => None,
            };
            self.net_posting.insert(ev.tid, (info.op == Op::NetIsend, bytes, ev.ts_ns));
        }
        if info.op.is_collective() || matches!(info.op, Op::Send | Op::Recv) {
            match Self::bytes(info, ev, proc) {
                Ok(b) => pend.bytes = b,
                Err(e) => result = Err(e),
            }
        }
        (pend, result)
    }

    /// Keeps an entry until its return.
    fn push_pending(&mut self, pend: Pending) {
        let stack = self.pending.entry(pend.ev.tid).or_default();
        // A thread that died mid-call and whose tid was reused would grow this forever: cap.
        if stack.len() >= 64 {
            stack.remove(0);
        }
        stack.push(pend);
    }

    fn make_call(&self, info: &ProbeInfo, p: &Pending, ret: Option<i64>, exit_ns: u64, aborted: bool) -> Call {
        let bytes = p.bytes;
        let (comm, global, rank, nranks) = match p.comm {
            Some((id, g, r, n)) => {
                // Rank/size learned after entry (MPI_Comm_rank) are picked up here.
                let st = p.comm_key.and_then(|k| self.comms.get(&k));
                (Some(id), g, st.and_then(|c| c.rank).or(r), st.and_then(|c| c.nranks).or(n))
            }
            None => (None, false, None, None),
        };
        Call {
            pid: p.ev.pid,
            tid: p.ev.tid,
            library: info.family,
            op: match self.probes.get(&p.probe_id) {
                Some((_, op)) => op.clone(),
                None => std::sync::Arc::from(info.user_op.as_deref().unwrap_or(info.op.as_str())),
            },
            bytes,
            comm,
            comm_global: global,
            rank,
            nranks,
            seq: p.seq,
            enter_ns: p.ev.ts_ns,
            exit_ns,
            ret,
            aborted,
            grouped: p.grouped,
        }
    }
}
