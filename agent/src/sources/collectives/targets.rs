//! What to probe: per library family, the symbols and how to decode their arguments.
//! Integer arguments 1-6 are `Arg::Reg(0..6)`: rdi, rsi, rdx, rcx, r8, r9 on x86-64 (SysV) and
//! x0-x5 on aarch64 (AAPCS64). Arguments 7 and 8 are `Arg::Stack(0..2)`: the first two words in
//! memory on x86-64, x6 and x7 on aarch64 — the eBPF program puts them in the record's `stack`
//! words on both, so only an argument passed differently ([`Abi`]) needs a second layout.

use serde::Serialize;

/// Library families are configuration vocabulary (`[collectives] libraries`).
pub use crate::config::collectives::Family;
use crate::config::collectives::UserProbe;

/// Where an argument lives at function entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Reg(u8),
    Stack(u8),
}

impl Arg {
    /// Index for the eBPF deref cookie (0..5 registers, 6..7 stack).
    pub fn deref_index(self) -> u8 {
        match self {
            Arg::Reg(i) => i,
            Arg::Stack(i) => 6 + i,
        }
    }
}

/// Operations, as exported in metrics and the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
    Barrier,
    Send,
    Recv,
    GroupStart,
    GroupEnd,
    CommInit,
    CommSplit,
    CommDup,
    CommCreate,
    CommDestroy,
    CommAbort,
    CommRank,
    CommSize,
    NetIsend,
    NetIrecv,
    NetTest,
    /// A process group's name given (`c10d::ProcessGroup::setGroupName`).
    GroupName,
    /// A user-defined probe's operation name is carried separately.
    User,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
            Op::Barrier => "barrier",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::GroupStart => "group_start",
            Op::GroupEnd => "group_end",
            Op::CommInit => "comm_init",
            Op::CommSplit => "comm_split",
            Op::CommDup => "comm_dup",
            Op::CommCreate => "comm_create",
            Op::CommDestroy => "comm_destroy",
            Op::CommAbort => "comm_abort",
            Op::CommRank => "comm_rank",
            Op::CommSize => "comm_size",
            Op::NetIsend => "net_isend",
            Op::NetIrecv => "net_irecv",
            Op::NetTest => "net_test",
            Op::GroupName => "group_name",
            Op::User => "user",
        }
    }

    /// Collective operations: every rank of the communicator issues them in the same order,
    /// so they get a per-communicator sequence number `(CommId, seq)`.
    pub fn is_collective(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::AllGather | Op::Broadcast | Op::Reduce | Op::AllToAll | Op::Barrier | Op::User)
    }

    /// Calls that make a new communicator from a parent one (its handle read at return).
    pub fn derives_comm(self) -> bool {
        matches!(self, Op::CommSplit | Op::CommDup | Op::CommCreate)
    }
}

/// How an MPI communicator constructor derives the new communicator from its parent: the
/// arguments that, with the parent's identity and its count of constructors, name the same
/// communicator on every member rank (`comm_id::child`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Derive {
    /// `MPI_Comm_split(comm, color, key, newcomm*)`: one communicator per color.
    Split { color: Arg },
    /// `MPI_Comm_split_type(comm, split_type, key, info, newcomm*)`: one per node for
    /// `MPI_COMM_TYPE_SHARED`, so the node is part of its identity.
    SplitType { split_type: Arg },
    /// `MPI_Comm_dup`, `_dup_with_info`, `_idup`: the parent's n-th duplicate.
    Dup,
    /// `MPI_Comm_create(comm, group, newcomm*)`: collective over the parent.
    Create,
    /// `MPI_Comm_create_group(comm, group, tag, newcomm*)`: collective over the group only,
    /// counted apart from the parent's other constructors.
    CreateGroup { tag: Arg },
}

/// How to get bytes, communicator and identity out of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoder {
    /// A data-moving call: element count, datatype (family-specific encoding), communicator.
    Data { count: Arg, dtype: Arg, comm: Option<Arg> },
    /// Count × fixed element size (user probes).
    Fixed { count: Option<Arg>, elem_size: u64, comm: Option<Arg> },
    /// Only the communicator (barrier, destroy, abort).
    CommOnly { comm: Arg },
    /// Nothing to decode (group start/end).
    Nothing,
    /// NCCL communicator creation: nranks, rank, uniqueId by value on the stack, out-pointer.
    NcclInit { nranks: Arg, rank: Arg },
    /// `ncclCommSplit(comm, color, key, newcomm*, config)`.
    NcclSplit { parent: Arg },
    /// An MPI communicator constructor: parent, how the child derives from it (the new
    /// handle through the probe's out-pointer).
    MpiCommNew { parent: Arg, how: Derive },
    /// MPI_Comm_rank / MPI_Comm_size: communicator, int out-pointer.
    MpiCommQuery { comm: Arg },
    /// Internal network send/recv: size in bytes, request handle through an out-pointer.
    NetPost { size: Option<Arg> },
    /// Internal network test: request handle, `int* done` read at return.
    NetTest,
    /// A gloo collective `gloo::x(const xOptions&)`: the options object copied at entry
    /// (its first word is the `std::shared_ptr<gloo::Context>`'s pointer: the group's context).
    GlooOptions,
    /// `gloo::Context::Context(this, rank, size, base)`: a group's context being made.
    GlooContext,
    /// `c10d::ProcessGroup::setGroupName(this, const std::string& name)`: the `std::string`
    /// object copied at entry.
    GroupName,
}

/// One symbol to probe.
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    pub family: Family,
    /// Symbol names to try, in order (the first one found is attached; aliases at the same
    /// address are attached once).
    pub symbols: Vec<String>,
    pub op: Op,
    pub decoder: Decoder,
    /// Copy 128 bytes of stack arguments at entry (`ncclUniqueId` by value).
    pub stack_blob: bool,
    /// Copy 128 bytes at entry from the object this register argument (0..5) points at
    /// instead (gloo's options, a `std::string`).
    pub blob_from: Option<u8>,
    /// Out-pointer argument read at return.
    pub deref: Option<Arg>,
    /// Probed only in short sampled windows (hot internal functions like `ncclIbTest`).
    pub sampled: bool,
    /// A missing symbol is normal for this probe (internal symbols, optional entry points).
    pub optional: bool,
    /// Operation name for user probes.
    pub user_op: Option<String>,
    /// Asynchronous unless the process sets `CUDA_LAUNCH_BLOCKING=1`: attached with the
    /// session program (`ebpf::session`), which records the entry alone as the whole call for
    /// asynchronous processes (the call returns once its work is enqueued, so its return tells
    /// nothing) and entry and return for blocking ones.
    pub entry_only_async: bool,
}

/// A probe target: library file glob and its probes.
#[derive(Clone, Debug)]
pub struct Target {
    pub family: Family,
    /// Glob on the library file name (`libnccl.so*`).
    pub library: String,
    pub probes: Vec<ProbeSpec>,
}

impl Decoder {
    /// Whether an argument comes from the stack (the 7th or 8th).
    pub fn uses_stack(&self) -> bool {
        let st = |a: &Arg| matches!(a, Arg::Stack(_));
        match self {
            Decoder::Data { count, dtype, comm } => st(count) || st(dtype) || comm.as_ref().is_some_and(st),
            Decoder::Fixed { count, comm, .. } => count.as_ref().is_some_and(st) || comm.as_ref().is_some_and(st),
            Decoder::CommOnly { comm } | Decoder::NcclSplit { parent: comm } | Decoder::MpiCommQuery { comm } => st(comm),
            Decoder::MpiCommNew { parent, .. } => st(parent),
            Decoder::NcclInit { nranks, rank } => st(nranks) || st(rank),
            Decoder::NetPost { size } => size.as_ref().is_some_and(st),
            Decoder::Nothing | Decoder::NetTest | Decoder::GlooOptions | Decoder::GlooContext | Decoder::GroupName => false,
        }
    }
}

impl ProbeSpec {
    /// The eBPF cookie flags this probe needs besides its id (stack words, blob, out-pointer).
    pub fn reads_stack_args(&self) -> bool {
        self.decoder.uses_stack() || matches!(self.deref, Some(Arg::Stack(_)))
    }
}

fn spec(family: Family, names: &[&str], op: Op, decoder: Decoder) -> ProbeSpec {
    ProbeSpec {
        family,
        symbols: names.iter().map(|s| s.to_string()).collect(),
        op,
        decoder,
        stack_blob: false,
        blob_from: None,
        deref: None,
        sampled: false,
        optional: false,
        user_op: None,
        entry_only_async: false,
    }
}

use Arg::{Reg, Stack};

/// The calling convention of the probed processes. The agent probes processes of its own
/// architecture, so it is the agent's ([`Abi::HOST`]); tests build both layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abi {
    /// x86-64 System V.
    SysV64,
    /// aarch64 AAPCS64 (Grace).
    Aapcs64,
}

impl Abi {
    pub const HOST: Abi = if cfg!(target_arch = "aarch64") { Abi::Aapcs64 } else { Abi::SysV64 };
}

/// NCCL (`libnccl.so*`) as the agent's architecture calls it.
pub fn nccl() -> Target {
    nccl_for(Abi::HOST)
}

/// NCCL under calling convention `abi`. `ncclX` is a weak alias of `pncclX` at the same
/// address; the strong name is tried first and the attach is done once per file offset.
pub fn nccl_for(abi: Abi) -> Target {
    let f = Family::Nccl;
    let data = |count, dtype, comm| Decoder::Data { count, dtype, comm: Some(comm) };
    let mut probes = vec![
        // (sendbuff, recvbuff, count, datatype, op, comm, stream)
        spec(f, &["pncclAllReduce", "ncclAllReduce"], Op::AllReduce, data(Reg(2), Reg(3), Reg(5))),
        spec(f, &["pncclReduceScatter", "ncclReduceScatter"], Op::ReduceScatter, data(Reg(2), Reg(3), Reg(5))),
        // (sendbuff, recvbuff, sendcount, datatype, comm, stream)
        spec(f, &["pncclAllGather", "ncclAllGather"], Op::AllGather, data(Reg(2), Reg(3), Reg(4))),
        // (sendbuff, recvbuff, count, datatype, root, comm, stream)
        spec(f, &["pncclBroadcast", "ncclBroadcast"], Op::Broadcast, data(Reg(2), Reg(3), Reg(5))),
        // (sendbuff, recvbuff, count, datatype, op, root, comm, stream): comm on the stack
        spec(f, &["pncclReduce", "ncclReduce"], Op::Reduce, data(Reg(2), Reg(3), Stack(0))),
        // (buff, count, datatype, peer, comm, stream)
        spec(f, &["pncclSend", "ncclSend"], Op::Send, data(Reg(1), Reg(2), Reg(4))),
        spec(f, &["pncclRecv", "ncclRecv"], Op::Recv, data(Reg(1), Reg(2), Reg(4))),
    ];
    // Collectives and point-to-point calls only enqueue (one probe hit each); group and
    // communicator calls keep entry and return (group depth, the new communicator, hangs).
    for p in &mut probes {
        p.entry_only_async = true;
    }
    probes.extend([
        spec(f, &["pncclGroupStart", "ncclGroupStart"], Op::GroupStart, Decoder::Nothing),
        spec(f, &["pncclGroupEnd", "ncclGroupEnd"], Op::GroupEnd, Decoder::Nothing),
        spec(f, &["pncclCommDestroy", "ncclCommDestroy"], Op::CommDestroy, Decoder::CommOnly { comm: Reg(0) }),
        spec(f, &["pncclCommAbort", "ncclCommAbort"], Op::CommAbort, Decoder::CommOnly { comm: Reg(0) }),
    ]);
    // (ncclComm_t* comm, int nranks, ncclUniqueId commId /* 128 B by value */, int rank [, config])
    for name in [["pncclCommInitRank", "ncclCommInitRank"], ["pncclCommInitRankConfig", "ncclCommInitRankConfig"]] {
        let mut s = match abi {
            // The id is passed in memory and takes no register: rank is the third.
            Abi::SysV64 => {
                let mut s = spec(f, &name, Op::CommInit, Decoder::NcclInit { nranks: Reg(1), rank: Reg(2) });
                s.stack_blob = true;
                s
            }
            // A composite over 16 bytes is copied by the caller and passed as a pointer (x2).
            Abi::Aapcs64 => {
                let mut s = spec(f, &name, Op::CommInit, Decoder::NcclInit { nranks: Reg(1), rank: Reg(3) });
                s.blob_from = Some(2);
                s
            }
        };
        s.deref = Some(Reg(0));
        s.optional = name[0].ends_with("Config");
        probes.push(s);
    }
    let mut split = spec(f, &["pncclCommSplit", "ncclCommSplit"], Op::CommSplit, Decoder::NcclSplit { parent: Reg(0) });
    split.deref = Some(Reg(3));
    split.optional = true;
    probes.push(split);
    // Internal IB transport (docs/platform-facts.md "NCCL's internal network calls").
    // ncclIbIsend(sendComm, data, size, tag, mhandle, phandle, void** request): request on the stack.
    let mut isend = spec(f, &["_Z11ncclIbIsendPvS_miS_S_PS_"], Op::NetIsend, Decoder::NetPost { size: Some(Reg(2)) });
    isend.deref = Some(Stack(0));
    // ncclIbIrecv(recvComm, n, data**, sizes*, tags*, mhandles**, phandles**, void** request)
    let mut irecv = spec(f, &["_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_"], Op::NetIrecv, Decoder::NetPost { size: None });
    irecv.deref = Some(Stack(1));
    // ncclIbTest(request, int* done, int* sizes): polled continuously. All three run per
    // chunk (≈ 100 times per MiB), so they are attached only in short sampled windows; the
    // window sees posts and completions together.
    let mut test = spec(f, &["_Z10ncclIbTestPvPiS0_"], Op::NetTest, Decoder::NetTest);
    test.deref = Some(Reg(1));
    for mut s in [isend, irecv, test] {
        s.optional = true;
        s.sampled = true;
        probes.push(s);
    }
    Target { family: f, library: "libnccl.so*".into(), probes }
}

/// MPI (`libmpi.so*`, OpenMPI and MPICH).
pub fn mpi() -> Target {
    let f = Family::Mpi;
    let data = |count, dtype, comm| Decoder::Data { count, dtype, comm: Some(comm) };
    let mut probes = vec![
        // (sendbuf, recvbuf, count, datatype, op, comm)
        spec(f, &["PMPI_Allreduce", "MPI_Allreduce"], Op::AllReduce, data(Reg(2), Reg(3), Reg(5))),
        // (sendbuf, recvbuf, recvcount, datatype, op, comm)
        spec(f, &["PMPI_Reduce_scatter_block", "MPI_Reduce_scatter_block"], Op::ReduceScatter, data(Reg(2), Reg(3), Reg(5))),
        // (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm)
        spec(f, &["PMPI_Allgather", "MPI_Allgather"], Op::AllGather, data(Reg(1), Reg(2), Stack(0))),
        // (buffer, count, datatype, root, comm)
        spec(f, &["PMPI_Bcast", "MPI_Bcast"], Op::Broadcast, data(Reg(1), Reg(2), Reg(4))),
        // (sendbuf, recvbuf, count, datatype, op, root, comm)
        spec(f, &["PMPI_Reduce", "MPI_Reduce"], Op::Reduce, data(Reg(2), Reg(3), Stack(0))),
        // (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm)
        spec(f, &["PMPI_Alltoall", "MPI_Alltoall"], Op::AllToAll, data(Reg(1), Reg(2), Stack(0))),
        spec(f, &["PMPI_Barrier", "MPI_Barrier"], Op::Barrier, Decoder::CommOnly { comm: Reg(0) }),
    ];
    // MPI_Reduce_scatter(sendbuf, recvbuf, const int recvcounts[], datatype, op, comm): the
    // byte count would need the counts array; bytes are reported as unknown.
    probes.push(spec(f, &["PMPI_Reduce_scatter", "MPI_Reduce_scatter"], Op::ReduceScatter, Decoder::CommOnly { comm: Reg(5) }));
    for (names, op) in [(["PMPI_Comm_rank", "MPI_Comm_rank"], Op::CommRank), (["PMPI_Comm_size", "MPI_Comm_size"], Op::CommSize)] {
        let mut s = spec(f, &names, op, Decoder::MpiCommQuery { comm: Reg(0) });
        s.deref = Some(Reg(1));
        probes.push(s);
    }
    probes.extend(mpi_comm_constructors());
    Target { family: f, library: "libmpi.so*".into(), probes }
}

/// MPI's communicator constructors (MPI 3.1 §6.4.2): the new handle is read at return
/// through the out-pointer argument. Those beyond MPI-2 (`_split_type`, `_idup`,
/// `_create_group`, `_dup_with_info`) are optional.
fn mpi_comm_constructors() -> Vec<ProbeSpec> {
    let f = Family::Mpi;
    let table: [(&str, Op, Derive, u8, bool); 7] = [
        // (comm, color, key, newcomm*)
        ("Comm_split", Op::CommSplit, Derive::Split { color: Reg(1) }, 3, false),
        // (comm, split_type, key, info, newcomm*)
        ("Comm_split_type", Op::CommSplit, Derive::SplitType { split_type: Reg(1) }, 4, true),
        // (comm, newcomm*)
        ("Comm_dup", Op::CommDup, Derive::Dup, 1, false),
        // (comm, info, newcomm*)
        ("Comm_dup_with_info", Op::CommDup, Derive::Dup, 2, true),
        // (comm, newcomm*, request*)
        ("Comm_idup", Op::CommDup, Derive::Dup, 1, true),
        // (comm, group, newcomm*)
        ("Comm_create", Op::CommCreate, Derive::Create, 2, false),
        // (comm, group, tag, newcomm*)
        ("Comm_create_group", Op::CommCreate, Derive::CreateGroup { tag: Reg(2) }, 3, true),
    ];
    table
        .iter()
        .map(|(name, op, how, out, optional)| {
            let mut s = spec(f, &[&format!("PMPI_{name}"), &format!("MPI_{name}")], *op, Decoder::MpiCommNew { parent: Reg(0), how: *how });
            s.deref = Some(Reg(*out));
            s.optional = *optional;
            s
        })
        .collect()
}

/// gloo inside PyTorch's `libtorch_cpu.so` (mangled names from docs/platform-facts.md §4).
/// Byte counts live inside C++ option structs; they are reported as unknown. Each process
/// group is its own communicator (`docs/architecture.md`, `CommId`): its contexts are seen
/// made (`gloo::Context`'s constructor), named by the group's name (`setGroupName`, right
/// after, on the same thread), and found again in each collective's options.
pub fn gloo() -> Target {
    let f = Family::Gloo;
    let mut probes = Vec::new();
    for (name, op) in [
        ("_ZN4gloo9allreduceERKNS_16AllreduceOptionsE", Op::AllReduce),
        ("_ZN4gloo9allgatherERNS_16AllgatherOptionsE", Op::AllGather),
        ("_ZN4gloo9broadcastERNS_16BroadcastOptionsE", Op::Broadcast),
        ("_ZN4gloo6reduceERNS_13ReduceOptionsE", Op::Reduce),
        ("_ZN4gloo7barrierERNS_14BarrierOptionsE", Op::Barrier),
        ("_ZN4gloo8alltoallERNS_15AlltoallOptionsE", Op::AllToAll),
    ] {
        let mut s = spec(f, &[name], op, Decoder::GlooOptions);
        s.blob_from = Some(0);
        s.optional = true;
        probes.push(s);
    }
    let mut ctx = spec(f, &["_ZN4gloo7ContextC2Eiii", "_ZN4gloo7ContextC1Eiii"], Op::CommInit, Decoder::GlooContext);
    ctx.optional = true;
    let mut name = spec(f, &["_ZN4c10d12ProcessGroup12setGroupNameERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"], Op::GroupName, Decoder::GroupName);
    name.blob_from = Some(1);
    name.optional = true;
    probes.extend([ctx, name]);
    Target { family: f, library: "libtorch_cpu.so*".into(), probes }
}

fn arg_from_index(i: u8) -> Arg {
    if i < 6 {
        Reg(i)
    } else {
        Stack(i - 6)
    }
}

/// The probe target a `[[collectives.user]]` entry describes.
impl UserProbe {
    pub fn target(&self) -> Target {
        let mut s = spec(
            Family::User,
            &[self.symbol.as_str()],
            Op::User,
            Decoder::Fixed { count: self.count_arg.map(arg_from_index), elem_size: self.elem_size, comm: self.comm_arg.map(arg_from_index) },
        );
        s.user_op = Some(self.op.clone());
        Target { family: Family::User, library: self.library.clone(), probes: vec![s] }
    }
}

/// NCCL `ncclTypeSize` (src/include/collectives.h): 1 byte for int8/uint8/fp8, 2 for
/// half/bfloat16, 4 for int32/uint32/float, 8 for int64/uint64/double.
pub fn nccl_type_size(dtype: u64) -> Option<u64> {
    match dtype {
        0 | 1 | 10 | 11 => Some(1),
        6 | 9 => Some(2),
        2 | 3 | 7 => Some(4),
        4 | 5 | 8 => Some(8),
        _ => None,
    }
}

/// MPICH encodes the size of builtin datatypes in the handle: `0x4c00SSKK`, size in bytes
/// = `(handle >> 8) & 0xff`.
pub fn mpich_type_size(handle: u64) -> Option<u64> {
    if handle >> 24 == 0x4c && handle < (1 << 32) {
        Some((handle >> 8) & 0xff)
    } else {
        None
    }
}

/// OpenMPI predefined datatype symbols (MPI_FLOAT is `&ompi_mpi_float`) and their sizes.
pub const OMPI_DATATYPES: &[(&str, u64)] = &[
    ("ompi_mpi_char", 1),
    ("ompi_mpi_signed_char", 1),
    ("ompi_mpi_unsigned_char", 1),
    ("ompi_mpi_byte", 1),
    ("ompi_mpi_int8_t", 1),
    ("ompi_mpi_uint8_t", 1),
    ("ompi_mpi_short", 2),
    ("ompi_mpi_unsigned_short", 2),
    ("ompi_mpi_int16_t", 2),
    ("ompi_mpi_uint16_t", 2),
    ("ompi_mpi_int", 4),
    ("ompi_mpi_unsigned", 4),
    ("ompi_mpi_int32_t", 4),
    ("ompi_mpi_uint32_t", 4),
    ("ompi_mpi_float", 4),
    ("ompi_mpi_long", 8),
    ("ompi_mpi_unsigned_long", 8),
    ("ompi_mpi_long_long_int", 8),
    ("ompi_mpi_int64_t", 8),
    ("ompi_mpi_uint64_t", 8),
    ("ompi_mpi_double", 8),
    ("ompi_mpi_long_double", 16),
];

/// OpenMPI's world communicator symbol (MPI_COMM_WORLD is `&ompi_mpi_comm_world`).
pub const OMPI_COMM_WORLD: &str = "ompi_mpi_comm_world";
/// OpenMPI's null communicator symbol (MPI_COMM_NULL is `&ompi_mpi_comm_null`).
pub const OMPI_COMM_NULL: &str = "ompi_mpi_comm_null";
/// MPICH's MPI_COMM_WORLD handle.
pub const MPICH_COMM_WORLD: u64 = 0x4400_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_type_sizes_match_collectives_h() {
        let want = [(0, 1), (1, 1), (2, 4), (3, 4), (4, 8), (5, 8), (6, 2), (7, 4), (8, 8), (9, 2), (10, 1), (11, 1)];
        for (t, s) in want {
            assert_eq!(nccl_type_size(t), Some(s), "dtype {t}");
        }
        assert_eq!(nccl_type_size(12), None);
    }

    #[test]
    fn mpich_sizes_come_from_the_handle() {
        assert_eq!(mpich_type_size(0x4c00_040a), Some(4)); // MPI_FLOAT
        assert_eq!(mpich_type_size(0x4c00_080b), Some(8)); // MPI_DOUBLE
        assert_eq!(mpich_type_size(0x7f00_0000_1234), None);
    }

    #[test]
    fn every_nccl_collective_has_a_strong_and_weak_name() {
        let t = nccl();
        for p in t.probes.iter().filter(|p| p.op.is_collective()) {
            assert_eq!(p.symbols.len(), 2, "{:?}", p.symbols);
            assert_eq!(p.symbols[0], format!("p{}", p.symbols[1]));
        }
        let init = t.probes.iter().find(|p| p.op == Op::CommInit).expect("init");
        assert_eq!(init.deref, Some(Reg(0)));
        assert!(t.probes.iter().any(|p| p.op == Op::NetTest && p.sampled));
    }

    #[test]
    fn user_probe_args_map_to_registers_and_stack() {
        let u =
            UserProbe { library: "libx.so".into(), symbol: "f".into(), op: "halo".into(), count_arg: Some(7), elem_size: 4, comm_arg: Some(0), blocking: true };
        let t = u.target();
        assert_eq!(t.probes[0].decoder, Decoder::Fixed { count: Some(Stack(1)), elem_size: 4, comm: Some(Reg(0)) });
        assert!(t.probes[0].reads_stack_args());
    }

    #[test]
    fn only_probes_with_a_7th_or_8th_argument_read_the_stack() {
        let n = nccl();
        let by_op = |op: Op| n.probes.iter().find(|p| p.op == op).expect("op");
        // ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream): comm is 7th.
        assert!(by_op(Op::Reduce).reads_stack_args());
        assert!(!by_op(Op::AllReduce).reads_stack_args());
        assert!(!by_op(Op::GroupStart).reads_stack_args());
        // ncclIbIsend's request out-pointer is its 7th argument.
        assert!(by_op(Op::NetIsend).reads_stack_args());
        let m = mpi();
        assert!(m.probes.iter().find(|p| p.op == Op::AllGather).expect("allgather").reads_stack_args());
        assert!(!m.probes.iter().find(|p| p.op == Op::AllReduce).expect("allreduce").reads_stack_args());
        let u =
            UserProbe { library: "libx.so".into(), symbol: "f".into(), op: "halo".into(), count_arg: Some(1), elem_size: 4, comm_arg: None, blocking: true };
        assert!(!u.target().probes[0].reads_stack_args());
    }
}
