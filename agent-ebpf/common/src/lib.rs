//! Types shared between the eBPF programs and the agent: `#[repr(C)]`, `Copy`, no `bool`,
//! no implicit padding, sizes asserted at compile time (style.md).
#![no_std]

/// Name of the RingBuf map that carries [`ProbeEvent`]s to userspace.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU array counting events dropped because the RingBuf was full.
pub const DROPS_MAP: &str = "DROPS";
/// Size of the RingBuf in bytes (a power of two multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// Program names, as exported from the eBPF object.
pub const PROG_CALL_ENTER: &str = "call_enter";
pub const PROG_CALL_EXIT: &str = "call_exit";

/// Event kinds (`ProbeEvent::kind`).
pub const KIND_ENTER: u32 = 1;
pub const KIND_EXIT: u32 = 2;

/// One probe hit: a function entry (with its first six integer arguments and two stack
/// words) or a function return (with its return value in `args[0]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeEvent {
    /// CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Thread group id (userspace pid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `KIND_ENTER` or `KIND_EXIT`.
    pub kind: u32,
    /// Which attached symbol fired; set through the uprobe cookie by the agent.
    pub probe_id: u32,
    /// rdi, rsi, rdx, rcx, r8, r9 at entry; `args[0]` = rax at return.
    pub args: [u64; 6],
    /// The first two 8-byte stack arguments ([rsp+8], [rsp+16]) at entry.
    pub stack: [u64; 2],
}

const _: () = assert!(core::mem::size_of::<ProbeEvent>() == 88);

#[cfg(feature = "user")]
// SAFETY: ProbeEvent is repr(C), Copy, and has no padding (size asserted above).
unsafe impl aya::Pod for ProbeEvent {}
