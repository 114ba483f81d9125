//! What the callbacks do. A communicator's context holds a fixed pool of collective slots and
//! one of proxy-step slots, allocated at init; a callback only stores into atomics of a slot and,
//! when a collective's last channel stops, pushes its record into the ring. No lock, no
//! allocation, no system call but `clock_gettime` (vDSO) on the hot paths.
//!
//! Handles given to NCCL are slot addresses (64-byte aligned) with the event kind in the low
//! bits: a Coll handle is the plain address (it is the `parentObj` of its KernelCh and ProxyOp
//! events), ProxyOp = coll | 1, KernelCh = coll | 2, ProxyStep = step slot | 3.
//!
//! NCCL stops a Coll event when the collective is enqueued; its KernelCh events come later from
//! the proxy thread. The record is sent when as many channels stopped as the Coll announced
//! (`nChannels`), or — with whatever it has, flagged [`FLAG_EVICTED`] — when its slot is needed
//! for a collective [`COLL_SLOTS`] later.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

use crate::{
    clock::{monotonic_ns, realtime_ns, OffsetEstimator},
    ring::Ring,
    wire::{self, Record, FLAG_COMPLETE, FLAG_EVICTED, FLAG_GRAPH, FLAG_NO_KERNEL, FLAG_STARTED},
};

/// NCCL's event types (`nccl_profiler.h`).
pub const EV_COLL: u64 = 1 << 1;
pub const EV_PROXY_OP: u64 = 1 << 3;
pub const EV_PROXY_STEP: u64 = 1 << 4;
pub const EV_KERNEL_CH: u64 = 1 << 6;
/// `ncclProfileCollApi` (v5+): NCCL starts it for every collective API call when Coll (or a
/// child event) is in the mask, whether or not this bit is.
pub const EV_COLL_API: u64 = 1 << 9;
/// `ncclProfilerKernelChStop`.
pub const STATE_KERNEL_CH_STOP: i32 = 22;

/// Collectives of one communicator that may be outstanding (enqueued, GPU not done) at once.
pub const COLL_SLOTS: usize = 2048;
/// Proxy steps of one communicator that may be open at once.
pub const STEP_SLOTS: usize = 4096;

const TAG_MASK: usize = 3;
const TAG_PROXY_OP: usize = 1;
const TAG_KERNEL: usize = 2;
const TAG_STEP: usize = 3;

/// What a CollApi handle says: two static marks, never freed. NCCL keeps the handle in the
/// task and names it as the Coll event's parent at every replay of a captured graph, long
/// after the CollApi event stopped, so the handle must outlive any slot.
#[repr(align(64))]
struct ApiMark(#[allow(dead_code)] u8);
static API_CAPTURED: ApiMark = ApiMark(1);
static API_PLAIN: ApiMark = ApiMark(0);

/// The handle of a CollApi event: non-null (so that NCCL advances `seqNumber` at graph
/// replays, docs/profiler-plugin.md), and whether the call was captured into a graph.
pub fn coll_api_handle(graph_captured: bool) -> usize {
    let m = if graph_captured { &API_CAPTURED } else { &API_PLAIN };
    m as *const ApiMark as usize
}

#[repr(align(64))]
pub struct CollSlot {
    ctx: AtomicPtr<Context>,
    /// Sent (or never used): nothing pending.
    emitted: AtomicBool,
    seq: AtomicU64,
    count: AtomicU64,
    bytes: AtomicU64,
    enqueue_ns: AtomicU64,
    /// func, datatype, algo, proto, nChannels packed little-endian.
    meta: AtomicU64,
    gpu_start: AtomicU64,
    gpu_end: AtomicU64,
    kernel_stops: AtomicU32,
    waits: [AtomicU64; 6],
    /// Network requests of the proxy steps, [send, recv]: how many, and their bytes.
    requests: [AtomicU64; 2],
    request_bytes: [AtomicU64; 2],
}

#[repr(align(64))]
pub struct StepSlot {
    coll: AtomicPtr<CollSlot>,
    /// Index + 1 into [`wire::PROXY_STATES`] of the state the step is in; 0: none timed.
    state: AtomicU32,
    since_ns: AtomicU64,
}

/// What init was told, and the pools.
pub struct Context {
    pub comm_hash: u64,
    pub rank: i32,
    pub nranks: i32,
    pub mask: u64,
    colls: Box<[CollSlot]>,
    next_coll: AtomicU64,
    steps: Box<[StepSlot]>,
    next_step: AtomicU64,
    clock: OffsetEstimator,
    ring: &'static Ring,
}

/// The Coll descriptor fields read (NCCL's `coll` struct, identical in v4-v6 up to `proto`).
pub struct CollInfo<'a> {
    pub seq: u64,
    pub func: &'a [u8],
    pub count: u64,
    pub datatype: &'a [u8],
    pub n_channels: u8,
    pub algo: &'a [u8],
    pub proto: &'a [u8],
    /// Its parent CollApi was captured into a CUDA graph: this is a replay.
    pub graph: bool,
}

impl Context {
    /// A boxed context; its slots point back at it, so it must not move (it is handed to NCCL
    /// as a raw pointer and freed in [`Context::free`]).
    pub fn new(comm_hash: u64, rank: i32, nranks: i32, mask: u64, ring: &'static Ring) -> *mut Context {
        let colls = (0..COLL_SLOTS)
            .map(|_| CollSlot {
                ctx: AtomicPtr::new(std::ptr::null_mut()),
                emitted: AtomicBool::new(true),
                seq: AtomicU64::new(0),
                count: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                enqueue_ns: AtomicU64::new(0),
                meta: AtomicU64::new(0),
                gpu_start: AtomicU64::new(u64::MAX),
                gpu_end: AtomicU64::new(0),
                kernel_stops: AtomicU32::new(0),
                waits: Default::default(),
                requests: Default::default(),
                request_bytes: Default::default(),
            })
            .collect();
        let steps =
            (0..STEP_SLOTS).map(|_| StepSlot { coll: AtomicPtr::new(std::ptr::null_mut()), state: AtomicU32::new(0), since_ns: AtomicU64::new(0) }).collect();
        let ctx = Box::into_raw(Box::new(Context {
            comm_hash,
            rank,
            nranks,
            mask,
            colls,
            next_coll: AtomicU64::new(0),
            steps,
            next_step: AtomicU64::new(0),
            clock: OffsetEstimator::default(),
            ring,
        }));
        // SAFETY: just allocated, not shared yet.
        for s in unsafe { &*ctx }.colls.iter() {
            s.ctx.store(ctx, Relaxed);
        }
        ctx
    }

    /// Frees a context from [`Context::new`].
    ///
    /// # Safety
    /// `ctx` came from [`Context::new`], is freed once, and no handle of it is used after.
    pub unsafe fn free(ctx: *mut Context) {
        if !ctx.is_null() {
            // SAFETY: per the contract above.
            let c = unsafe { Box::from_raw(ctx) };
            // Collectives whose channels never all stopped still go out, flagged.
            for s in c.colls.iter() {
                if !s.emitted.load(Acquire) {
                    c.emit(s, FLAG_EVICTED);
                }
            }
        }
    }

    /// A Coll event started (the collective is being enqueued): its handle.
    pub fn coll_start(&self, c: &CollInfo<'_>) -> usize {
        let i = (self.next_coll.fetch_add(1, Relaxed) as usize) & (COLL_SLOTS - 1);
        let Some(s) = self.colls.get(i) else { return 0 };
        if !s.emitted.load(Acquire) {
            self.emit(s, FLAG_EVICTED);
        }
        let dt = wire::code_of(&wire::DATATYPES.map(|d| d.0), c.datatype);
        let size = (dt as usize).checked_sub(1).and_then(|i| wire::DATATYPES.get(i)).map_or(0, |d| d.1);
        let meta = u64::from_le_bytes([
            wire::code_of(&wire::FUNCS, c.func),
            dt,
            wire::code_of(&wire::ALGOS, c.algo),
            wire::code_of(&wire::PROTOS, c.proto),
            c.n_channels,
            u8::from(c.graph),
            0,
            0,
        ]);
        s.seq.store(c.seq, Relaxed);
        s.count.store(c.count, Relaxed);
        s.bytes.store(c.count.saturating_mul(size), Relaxed);
        s.enqueue_ns.store(realtime_ns(), Relaxed);
        s.meta.store(meta, Relaxed);
        s.gpu_start.store(u64::MAX, Relaxed);
        s.gpu_end.store(0, Relaxed);
        s.kernel_stops.store(0, Relaxed);
        for w in s.waits.iter().chain(&s.requests).chain(&s.request_bytes) {
            w.store(0, Relaxed);
        }
        s.emitted.store(false, Release);
        s as *const CollSlot as usize
    }

    /// The Coll event stopped (enqueued). Without KernelCh events nothing more will come.
    pub fn coll_stop(&self, s: &CollSlot) {
        if self.mask & EV_KERNEL_CH == 0 {
            self.emit(s, FLAG_NO_KERNEL);
        }
    }

    /// Sends a slot's record once (whoever gets here first).
    fn emit(&self, s: &CollSlot, flags: u8) {
        if s.emitted.swap(true, AcqRel) {
            return;
        }
        self.ring.push(&self.record_of(s, flags));
    }

    /// The slot's record as it stands.
    fn record_of(&self, s: &CollSlot, flags: u8) -> Record {
        let m = s.meta.load(Relaxed).to_le_bytes();
        let start = s.gpu_start.load(Relaxed);
        let (offset_ns, offset_error_ns) = self.clock.estimate().unwrap_or((0, u64::MAX));
        let mut r = Record {
            comm_hash: self.comm_hash,
            seq: s.seq.load(Relaxed),
            rank: self.rank,
            nranks: self.nranks,
            bytes: s.bytes.load(Relaxed),
            count: s.count.load(Relaxed),
            enqueue_ns: s.enqueue_ns.load(Relaxed),
            gpu_start_ptimer: if start == u64::MAX { 0 } else { start },
            gpu_end_ptimer: s.gpu_end.load(Relaxed),
            offset_ns,
            offset_error_ns,
            proxy_wait_ns: [0; 6],
            requests: s.requests.each_ref().map(|v| v.load(Relaxed)),
            request_bytes: s.request_bytes.each_ref().map(|v| v.load(Relaxed)),
            func: m[0],
            datatype: m[1],
            algo: m[2],
            proto: m[3],
            n_channels: m[4],
            kernel_stops: s.kernel_stops.load(Relaxed).min(255) as u8,
            flags: if m[5] & 1 != 0 { flags | FLAG_GRAPH } else { flags },
        };
        for (o, w) in r.proxy_wait_ns.iter_mut().zip(&s.waits) {
            *o = w.load(Relaxed);
        }
        r
    }

    /// A channel's kernel started at GPU time `ptimer`: the KernelCh handle. The first
    /// channel's start also sends a [`FLAG_STARTED`] progress record.
    pub fn kernel_start(&self, s: &CollSlot, ptimer: u64) -> usize {
        let now = realtime_ns();
        let first = s.gpu_start.fetch_min(ptimer, Relaxed) == u64::MAX;
        self.clock.observe_upper(now, ptimer);
        self.clock.observe_lower(now, s.enqueue_ns.load(Relaxed), ptimer);
        if first && !s.emitted.load(Acquire) {
            let mut r = self.record_of(s, FLAG_STARTED);
            (r.gpu_start_ptimer, r.gpu_end_ptimer, r.kernel_stops) = (ptimer, 0, 0);
            self.ring.push(&r);
        }
        (s as *const CollSlot as usize) | TAG_KERNEL
    }

    /// KernelChStop with the channel's end GPU time.
    pub fn kernel_stop_state(&self, s: &CollSlot, ptimer: u64) {
        s.gpu_end.fetch_max(ptimer, Relaxed);
        self.clock.observe_upper(realtime_ns(), ptimer);
    }

    /// A KernelCh event stopped: the record goes once every announced channel stopped.
    pub fn kernel_stop(&self, s: &CollSlot) {
        let n = s.kernel_stops.fetch_add(1, AcqRel).saturating_add(1);
        let want = s.meta.load(Relaxed).to_le_bytes()[4];
        if n >= u32::from(want.max(1)) {
            self.emit(s, FLAG_COMPLETE);
        }
    }

    /// A proxy step of a ProxyOp (whose parent is `coll`) started: its handle.
    pub fn step_start(&self, coll: *const CollSlot) -> usize {
        let i = (self.next_step.fetch_add(1, Relaxed) as usize) & (STEP_SLOTS - 1);
        let Some(st) = self.steps.get(i) else { return 0 };
        st.coll.store(coll as *mut CollSlot, Relaxed);
        st.state.store(0, Relaxed);
        st.since_ns.store(monotonic_ns(), Relaxed);
        (st as *const StepSlot as usize) | TAG_STEP
    }
}

/// Index into [`wire::PROXY_STATES`] of SendWait (a send posted to the network, until it
/// completes) and RecvWait (a receive posted, until data arrived).
const SEND_WAIT: u32 = 2;
const RECV_WAIT: u32 = 3;

/// A proxy step entered NCCL state `state` (or stopped: `None`), with the state's `transSize`
/// when NCCL gave one: the time spent in the state it leaves is added to its collective's
/// total. A step entering SendWait is one send request of `transSize` bytes; a step leaving
/// RecvWait is one completed receive of the size the next state carries.
pub fn step_state(st: &StepSlot, state: Option<i32>, trans_size: Option<u64>) {
    let next = state.and_then(|v| wire::PROXY_STATES.iter().position(|p| p.1 as i32 == v)).map_or(0, |k| k as u32 + 1);
    let now = monotonic_ns();
    let prev = st.state.swap(next, AcqRel);
    let since = st.since_ns.swap(now, AcqRel);
    let coll = st.coll.load(Relaxed);
    if coll.is_null() {
        return;
    }
    // SAFETY: step slots only ever point at collective slots of the same context, which live
    // as long as the context (NCCL uses no handle after finalize).
    let c = unsafe { &*coll };
    let request = if prev == next {
        None
    } else if next == SEND_WAIT + 1 {
        Some(0)
    } else if prev == RECV_WAIT + 1 {
        Some(1)
    } else {
        None
    };
    if let Some(d) = request {
        c.requests[d].fetch_add(1, Relaxed);
        c.request_bytes[d].fetch_add(trans_size.unwrap_or(0), Relaxed);
    }
    if let Some(w) = prev.checked_sub(1).and_then(|k| c.waits.get(k as usize)) {
        w.fetch_add(now.saturating_sub(since), Relaxed);
    }
}

/// What a handle is.
pub enum Handle<'a> {
    Coll(&'a CollSlot),
    ProxyOp(&'a CollSlot),
    Kernel(&'a CollSlot),
    Step(&'a StepSlot),
    /// A CollApi event; `true`: captured into a CUDA graph.
    CollApi(bool),
}

/// Reads a handle this plugin gave NCCL.
///
/// # Safety
/// `h` is 0 or a handle returned by this module's functions whose context is alive.
pub unsafe fn handle<'a>(h: usize) -> Option<Handle<'a>> {
    if h == 0 {
        return None;
    }
    if h == coll_api_handle(true) || h == coll_api_handle(false) {
        return Some(Handle::CollApi(h == coll_api_handle(true)));
    }
    let p = h & !TAG_MASK;
    // SAFETY: per the contract, `p` is a live slot of the kind the tag says.
    unsafe {
        Some(match h & TAG_MASK {
            0 => Handle::Coll(&*(p as *const CollSlot)),
            TAG_PROXY_OP => Handle::ProxyOp(&*(p as *const CollSlot)),
            TAG_KERNEL => Handle::Kernel(&*(p as *const CollSlot)),
            _ => Handle::Step(&*(p as *const StepSlot)),
        })
    }
}

impl CollSlot {
    /// The context this slot belongs to.
    pub fn context(&self) -> Option<&Context> {
        // SAFETY: set once at creation to the owning (live) context.
        unsafe { self.ctx.load(Relaxed).as_ref() }
    }
    pub fn handle(&self) -> usize {
        self as *const CollSlot as usize
    }
    pub fn proxy_op_handle(&self) -> usize {
        self.handle() | TAG_PROXY_OP
    }
}
