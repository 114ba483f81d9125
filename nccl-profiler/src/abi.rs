//! NCCL's profiler-plugin ABI as far as this plugin uses it: the descriptor and function-table
//! layouts of `profiler_v4.h`-`profiler_v7.h` (`src/include/plugin/profiler/` in NCCL's
//! sources; v7 first appears in NCCL 2.31.2, whose loader looks up `ncclProfiler_v7` first).
//!
//! The descriptors of every version share a header (`type`, `parentObj` at 8, `rank` at 16,
//! the union at 24; `type` is one byte in v4, eight from v5). Each version's union members
//! are those of the one before with fields appended at their ends (v5 adds `parentGroup` to
//! `coll` and `p2p`; v7 adds `kernelVariant`, `isSymColl`, `userTag` to `coll`, `userTag` to
//! the API, `p2p` and `ceColl` members), plus new members: the API events (v5), the CE events
//! (v6), `kernelPhase` (v7). The state arguments are one 8-byte union in every version.

use std::ffi::{c_char, c_int, c_void};

/// NCCL's `coll` descriptor (v4-v7 agree up to `proto`; v5+ append `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// The v7 `coll` member in full (layout tests and the test harness; the callbacks read the
/// [`CollDescr`] prefix).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescrV7 {
    pub base: CollDescr,
    pub parent_group: *mut c_void,
    pub kernel_variant: *const c_char,
    pub is_sym_coll: bool,
    pub user_tag: u64,
}

/// NCCL's `kernelCh` descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChDescr {
    pub channel_id: u8,
    pub p_timer: u64,
}

/// The v7 `kernelPhase` member (a sub-event of KernelCh; not asked for by Stepwise).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelPhaseDescr {
    pub channel_id: u8,
    pub phase_id: u8,
    pub phase_name: *const c_char,
    pub p_timer: u64,
}

/// NCCL's `collApi` descriptor (v5+; v7 appends `userTag`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
pub union DescrUnion {
    pub coll: CollDescr,
    pub coll_api: CollApiDescr,
    pub kernel_ch: KernelChDescr,
}

/// `ncclProfilerEventDescr_vN_t` as far as read: `T` is `u8` in v4, `u64` in v5-v7.
#[repr(C)]
pub struct Descr<T> {
    pub type_: T,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnion,
}

/// Offsets in a descriptor (every version).
pub const OFF_PARENT_OBJ: usize = 8;
pub const OFF_UNION: usize = 24;
/// `coll.parentGroup` and `p2p.parentGroup` (v5+), from the descriptor's start.
pub const OFF_COLL_PARENT_GROUP: usize = OFF_UNION + 80;
pub const OFF_P2P_PARENT_GROUP: usize = OFF_UNION + 40;

/// `sizeof(ncclProfilerEventDescr_vN_t)` on LP64: the union's largest member is `coll`
/// (v4: 80 bytes, v5/v6: 88, v7: 112; v6's `ceColl` is 88 too).
pub const fn descr_size(version: u8) -> usize {
    match version {
        4 => OFF_UNION + 80,
        5 | 6 => OFF_UNION + 88,
        _ => OFF_UNION + 112,
    }
}

/// The event types (descriptor `type`, activation-mask bits) that exist in a version:
/// v4 Group..NetPlugin, v5 adds the API events and KernelLaunch, v6 the CE events, v7
/// KernelPhase.
pub const fn types_of(version: u8) -> u64 {
    match version {
        4 => 0xff,
        5 => 0xfff,
        6 => 0x7fff,
        _ => 0xffff,
    }
}

/// Whether a version knows a state (`ncclProfilerEventState_t`): the group-API states 23-24
/// are v5+, the CE states 25-30 v6+, KernelPhaseStop (31) v7.
pub const fn state_in(version: u8, state: c_int) -> bool {
    match state {
        23 | 24 => version >= 5,
        25..=30 => version >= 6,
        31 => version >= 7,
        _ => true,
    }
}

pub type StartFn<T> = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut Descr<T>) -> c_int;
pub type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
pub type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// v5-v7 init: (ctx, commId, mask, commName, nNodes, nranks, rank, logfn).
pub type InitV5 = unsafe extern "C" fn(*mut *mut c_void, u64, *mut c_int, *const c_char, c_int, c_int, c_int, *const c_void) -> c_int;
/// v4 init: (ctx, mask, commName, commHash, nNodes, nranks, rank, logfn).
pub type InitV4 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int, *const c_char, u64, c_int, c_int, c_int, *const c_void) -> c_int;

/// `ncclProfiler_v5_t`, `_v6_t` and `_v7_t` (the same function table; the descriptor they
/// pass differs, see [`descr_size`]).
#[repr(C)]
pub struct ProfilerV5 {
    pub name: *const c_char,
    pub init: InitV5,
    pub start_event: StartFn<u64>,
    pub stop_event: StopFn,
    pub record_event_state: RecordFn,
    pub finalize: FinalizeFn,
}

/// `ncclProfiler_v4_t`.
#[repr(C)]
pub struct ProfilerV4 {
    pub name: *const c_char,
    pub init: InitV4,
    pub start_event: StartFn<u8>,
    pub stop_event: StopFn,
    pub record_event_state: RecordFn,
    pub finalize: FinalizeFn,
}

// SAFETY: immutable tables of a static string and functions.
unsafe impl Sync for ProfilerV5 {}
// SAFETY: as above.
unsafe impl Sync for ProfilerV4 {}
