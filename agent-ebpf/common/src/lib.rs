//! Types shared between the eBPF programs and the agent: `#[repr(C)]`, `Copy`, no `bool`,
//! no implicit padding, sizes asserted at compile time (style.md).
#![no_std]

/// Name of the RingBuf map that carries [`ProbeEvent`]s to userspace.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU array counting events dropped because the RingBuf was full.
pub const DROPS_MAP: &str = "DROPS";
/// Size of the RingBuf in bytes (a power of two multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// Name of the LRU hash map of processes (tgid) whose first event already woke the agent.
pub const KNOWN_MAP: &str = "KNOWN";
/// Entries of [`KNOWN_MAP`] (processes on one host using probed libraries at once).
pub const KNOWN_ENTRIES: u32 = 8192;

/// Name of the per-CPU array of [`CpuState`].
pub const CPU_STATE_MAP: &str = "CPU_STATE";

/// Per CPU, in the programs: the last process (tgid) announced on this CPU (its entries skip
/// the [`KNOWN_MAP`] lookup) and the records written here (every [`WAKE_EVERY_RECORDS`]th
/// forces a wakeup of the agent).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    pub last_tgid: u32,
    pub records: u32,
}

#[cfg(feature = "user")]
// SAFETY: repr(C), two u32, no padding.
unsafe impl aya::Pod for CpuState {}

/// Records written on one CPU between two forced wakeups of the agent (a power of two).
pub const WAKE_EVERY_RECORDS: u32 = 1024;

/// Name of the hash map (tid → pointer argument) used to dereference an out-pointer at return.
pub const OUTPTR_MAP: &str = "OUTPTR";

/// Name of the per-CPU hash map counting TCP retransmissions by source address
/// (IPv4 addresses as v4-mapped IPv6, `::ffff:a.b.c.d`).
pub const TCP_RETRANS_MAP: &str = "TCP_RETRANS";
/// The `tcp:tcp_retransmit_skb` tracepoint program.
pub const PROG_TCP_RETRANSMIT: &str = "tcp_retransmit";
/// Offsets in the `tcp:tcp_retransmit_skb` record (checked against the tracefs `format` file
/// by the agent before attaching).
pub const TCP_TP_FAMILY_OFFSET: usize = 32;
pub const TCP_TP_SADDR_OFFSET: usize = 34;
pub const TCP_TP_SADDR_V6_OFFSET: usize = 42;

/// Program names, as exported from the eBPF object.
pub const PROG_CALL_ENTER: &str = "call_enter";
pub const PROG_CALL_EXIT: &str = "call_exit";
/// The session program (one program for entry and return, `BPF_TRACE_UPROBE_SESSION`):
/// attached to asynchronous NCCL calls, whose return it skips per call (see
/// [`ENTRY_ALONE_MAP`]).
pub const PROG_CALL_SESSION: &str = "call_session";
/// The helper id the session program calls in place of the kfunc `bpf_session_is_return`
/// (which aya-ebpf cannot declare): the agent's loader rewrites that call instruction into a
/// kfunc call (BTF id of the function in the running kernel) before loading. No helper has
/// this id, so an unpatched program fails verification instead of misbehaving.
pub const SESSION_IS_RETURN_PLACEHOLDER: u32 = 0x7fff_5e55;

/// Name of the hash map of processes (tgid) whose session-probed calls are complete at their
/// entry (an asynchronous NCCL call only enqueues): the session program tells the kernel to
/// skip their return and marks the entry [`KIND_ENTER_ALONE`]. Filled by the agent once it
/// has read a process's environment; a process not (yet) in it keeps its returns, so a
/// process whose calls block is timed from entry to return from its first call.
pub const ENTRY_ALONE_MAP: &str = "ENTRY_ALONE";
/// Entries of [`ENTRY_ALONE_MAP`].
pub const ENTRY_ALONE_ENTRIES: u32 = 8192;

/// Programs that do nothing: the baseline of `bench probes` (never attached by the agent).
pub const PROG_EMPTY_ENTER: &str = "empty_enter";
pub const PROG_EMPTY_EXIT: &str = "empty_exit";

/// Event kinds (`ProbeEvent::kind`).
pub const KIND_ENTER: u32 = 1;
pub const KIND_EXIT: u32 = 2;
/// An entry whose return will not be recorded: the call is complete at its entry.
pub const KIND_ENTER_ALONE: u32 = 3;

/// The uprobe cookie carries the probe id and per-symbol capture flags, so one pair of
/// programs serves every symbol:
/// - bits 0..32: probe id, echoed in [`ProbeEvent::probe_id`];
/// - bit 32 ([`COOKIE_STACK_BLOB`]): copy 128 bytes of the arguments in memory (from rsp+8;
///   sp on aarch64) into [`ProbeEvent::blob`] at entry — x86-64 passes NCCL's `ncclUniqueId`
///   by value there (aarch64 passes a pointer to a copy: see [`COOKIE_BLOB_ARG_SHIFT`]);
/// - bits 40..48 ([`COOKIE_DEREF_SHIFT`]): 1 + index of an out-pointer argument saved at entry
///   and read (8 bytes) at return into `args[1]` (the `ncclComm_t*` of `ncclCommInitRank`);
///   indices 0..5 are integer arguments 1-6, 6 and 7 arguments 7 and 8 (the `stack` words);
/// - bits 48..56 ([`COOKIE_BLOB_ARG_SHIFT`]): with [`COOKIE_STACK_BLOB`], 1 + index of a
///   register argument the blob is copied *from* instead of the stack: the object a pointer
///   or reference argument names (gloo's `*Options`, whose first word is the context; a
///   `std::string`, whose short text lies inside it).
pub const COOKIE_STACK_BLOB: u64 = 1 << 32;
/// Bit 33: a hot probe (called per network chunk): its events only wake the agent when they fill
/// the ring past a sixteenth (and each further one). Other probes wake it for the *first* event of each process (so a
/// short-lived process is seen while its `/proc` entry still exists — [`KNOWN_MAP`]) and are
/// lazy like hot probes after that: the agent drains on a 20 ms timer anyway, and a wakeup
/// per event would cost the traced thread more than the probe itself.
pub const COOKIE_LAZY_WAKE: u64 = 1 << 33;
/// Bit 34: read the first two stack argument words at entry into [`ProbeEvent::stack`]
/// (arguments 7 and 8; most probed functions have six or fewer, and two user-memory reads
/// are a measurable part of the probe's cost).
pub const COOKIE_STACK_ARGS: u64 = 1 << 34;
pub const COOKIE_DEREF_SHIFT: u32 = 40;
pub const COOKIE_BLOB_ARG_SHIFT: u32 = 48;

/// `cookie` whose blob is copied from the object register argument `arg` (0..5) points at.
pub const fn blob_from_arg(cookie: u64, arg: u8) -> u64 {
    ((cookie | COOKIE_STACK_BLOB) & !(0xff << COOKIE_BLOB_ARG_SHIFT)) | (((arg as u64) + 1) << COOKIE_BLOB_ARG_SHIFT)
}

/// Builds a cookie.
pub const fn cookie(probe_id: u32, stack_blob: bool, deref_arg: Option<u8>) -> u64 {
    let mut c = probe_id as u64;
    if stack_blob {
        c |= COOKIE_STACK_BLOB;
    }
    if let Some(i) = deref_arg {
        c |= ((i as u64) + 1) << COOKIE_DEREF_SHIFT;
    }
    c
}

/// Bytes of stack arguments captured when [`COOKIE_STACK_BLOB`] is set.
pub const BLOB_BYTES: usize = 128;

/// One probe hit: a function entry (with its first six integer arguments and two stack
/// words) or a function return (with its return value in `args[0]`).
///
/// The programs write only the prefix a hit needs ([`EXIT_RECORD_BYTES`],
/// [`ENTER_RECORD_BYTES`], [`ENTER_STACK_RECORD_BYTES`], or the whole event with the blob):
/// fewer bytes per hit cost the traced thread less and fit more hits in the ring. The agent
/// reads a record into a zeroed `ProbeEvent`, so the fields past a record's end read 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeEvent {
    /// CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Thread group id (userspace pid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `KIND_ENTER`, `KIND_ENTER_ALONE` or `KIND_EXIT`.
    pub kind: u32,
    /// Which attached symbol fired; set through the uprobe cookie by the agent.
    pub probe_id: u32,
    /// 1 if `blob` holds the stack argument bytes, 0 otherwise.
    pub has_blob: u32,
    /// 1 if `args[1]` of a return event holds the dereferenced out-pointer.
    pub has_deref: u32,
    /// Integer arguments 1-6 at entry (rdi, rsi, rdx, rcx, r8, r9 on x86-64; x0-x5 on
    /// aarch64); `args[0]` = the return value (rax; x0) at return, `args[1]` the dereferenced
    /// out-pointer.
    pub args: [u64; 6],
    /// Integer arguments 7 and 8 at entry: the first two words in memory on x86-64 ([rsp+8],
    /// [rsp+16]), x6 and x7 on aarch64 (only with [`COOKIE_STACK_ARGS`] or [`COOKIE_STACK_BLOB`]).
    pub stack: [u64; 2],
    /// 128 bytes of the arguments passed in memory (rsp+8 on x86-64, sp on aarch64), or of the
    /// object a register argument points at (only with [`COOKIE_STACK_BLOB`]).
    pub blob: [u8; BLOB_BYTES],
}

/// Header fields of every record: `ts_ns` .. `has_deref`.
pub const HEAD_BYTES: usize = 32;
/// A return: the header and `args[0..2]` (return value, dereferenced out-pointer).
pub const EXIT_RECORD_BYTES: usize = HEAD_BYTES + 16;
/// An entry with register arguments only.
pub const ENTER_RECORD_BYTES: usize = HEAD_BYTES + 48;
/// An entry with the two stack words too.
pub const ENTER_STACK_RECORD_BYTES: usize = ENTER_RECORD_BYTES + 16;
/// The shortest record the programs write.
pub const MIN_RECORD_BYTES: usize = EXIT_RECORD_BYTES;

const _: () = assert!(core::mem::size_of::<ProbeEvent>() == 96 + BLOB_BYTES);
const _: () = assert!(core::mem::offset_of!(ProbeEvent, args) == HEAD_BYTES);
const _: () = assert!(core::mem::offset_of!(ProbeEvent, stack) == ENTER_RECORD_BYTES);
const _: () = assert!(core::mem::offset_of!(ProbeEvent, blob) == ENTER_STACK_RECORD_BYTES);

/// The record of a return: the first [`EXIT_RECORD_BYTES`] of a [`ProbeEvent`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: u32,
    pub probe_id: u32,
    pub has_blob: u32,
    pub has_deref: u32,
    pub args: [u64; 2],
}

/// The record of an entry without stack arguments: the first [`ENTER_RECORD_BYTES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnterRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: u32,
    pub probe_id: u32,
    pub has_blob: u32,
    pub has_deref: u32,
    pub args: [u64; 6],
}

/// The record of an entry with the two stack words: the first [`ENTER_STACK_RECORD_BYTES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnterStackRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: u32,
    pub probe_id: u32,
    pub has_blob: u32,
    pub has_deref: u32,
    pub args: [u64; 6],
    pub stack: [u64; 2],
}

const _: () = assert!(core::mem::size_of::<ExitRecord>() == EXIT_RECORD_BYTES);
const _: () = assert!(core::mem::size_of::<EnterRecord>() == ENTER_RECORD_BYTES);
const _: () = assert!(core::mem::size_of::<EnterStackRecord>() == ENTER_STACK_RECORD_BYTES);

impl Default for ProbeEvent {
    fn default() -> Self {
        ProbeEvent { ts_ns: 0, pid: 0, tid: 0, kind: 0, probe_id: 0, args: [0; 6], stack: [0; 2], has_blob: 0, has_deref: 0, blob: [0; BLOB_BYTES] }
    }
}

#[cfg(feature = "user")]
// SAFETY: ProbeEvent is repr(C), Copy, and has no padding (size asserted above).
unsafe impl aya::Pod for ProbeEvent {}
