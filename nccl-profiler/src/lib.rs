//! Stepwise's NCCL profiler plugin (docs/profiler-plugin.md).
//!
//! A job loads it with `NCCL_PROFILER_PLUGIN=/path/to/libnccl-profiler-stepwise.so` (cargo
//! builds `libnccl_profiler.so`; `cargo xtask plugin` and the test harness copy it under the
//! hyphenated name). NCCL looks up `ncclProfiler_v6`, then `_v5`, then `_v4`, … : those three
//! are exported, with the layouts of the `profiler_v4.h`-`profiler_v6.h` headers of the NCCL
//! sources this was written against (2.30.7; the v4 header first appears in NCCL 2.27.3, v5 in
//! 2.28.3, v6 in 2.29.2, so older NCCLs, which look up v3 at most, do not load it). A
//! `ncclProfiler_v7` is not exported: no v7 header was available to write it from.
//!
//! Per collective it records the communicator hash, rank, nranks, NCCL's sequence number, the
//! function, bytes, algorithm, protocol, channels, the host enqueue time (CLOCK_REALTIME at the
//! Coll start), the GPU start (earliest KernelCh `pTimer`) and end (latest KernelChStop
//! `pTimer`), the GPU-timer-to-host offset with its error bound ([`clock`]), and the time proxy
//! steps spent in each wait state. Records go into a preallocated lock-free ring ([`ring`]); a
//! background thread sends them to the agent ([`sender`], format in [`wire`]).
//!
//! Panics: every exported callback is `extern "C"`, so a panic would abort the process rather
//! than unwind into NCCL (Rust ≥ 1.81). The callbacks are written not to panic at all: no
//! indexing without `get`, no unwrap, no arithmetic that can overflow-check, no allocation
//! after init, and every pointer from NCCL is checked for null.

#![allow(non_upper_case_globals)]

pub mod clock;
pub mod events;
pub mod gpu;
pub mod ring;
pub mod sender;
pub mod wire;

use std::{
    ffi::{c_char, c_int, c_void, CStr},
    sync::{atomic::Ordering::Relaxed, OnceLock},
};

use events::{handle, CollInfo, Context, Handle, EV_COLL, EV_COLL_API, EV_KERNEL_CH, EV_PROXY_OP, EV_PROXY_STEP, STATE_KERNEL_CH_STOP};

/// `ncclSuccess`.
const OK: c_int = 0;
/// Records the ring holds (about 1.2 MB).
pub const RING_RECORDS: usize = 8192;

/// NCCL's `coll` descriptor (v4-v6 agree up to `proto`; v5/v6 append `parentGroup`).
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

/// NCCL's `kernelCh` descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChDescr {
    pub channel_id: u8,
    pub p_timer: u64,
}

/// NCCL's `collApi` descriptor (v5, v6).
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

/// `ncclProfilerEventDescr_vN_t`: `T` is `u8` in v4, `u64` in v5 and v6.
#[repr(C)]
pub struct Descr<T> {
    pub type_: T,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnion,
}

type StartFn<T> = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut Descr<T>) -> c_int;
type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type InitV5 = unsafe extern "C" fn(*mut *mut c_void, u64, *mut c_int, *const c_char, c_int, c_int, c_int, *const c_void) -> c_int;
type InitV4 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int, *const c_char, u64, c_int, c_int, c_int, *const c_void) -> c_int;

/// `ncclProfiler_v5_t` / `ncclProfiler_v6_t` (the same function table).
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

const NAME: &CStr = c"Stepwise";

#[no_mangle]
pub static ncclProfiler_v6: ProfilerV5 = ProfilerV5 { name: NAME.as_ptr(), init: init_v5, start_event: start_v5, stop_event, record_event_state, finalize };

#[no_mangle]
pub static ncclProfiler_v5: ProfilerV5 = ProfilerV5 { name: NAME.as_ptr(), init: init_v5, start_event: start_v5, stop_event, record_event_state, finalize };

#[no_mangle]
pub static ncclProfiler_v4: ProfilerV4 = ProfilerV4 { name: NAME.as_ptr(), init: init_v4, start_event: start_v4, stop_event, record_event_state, finalize };

/// The process-wide ring and counters; the sender thread starts with the first init.
pub struct Global {
    pub ring: ring::Ring,
    pub counters: sender::Counters,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

pub fn global() -> &'static Global {
    GLOBAL.get_or_init(|| Global { ring: ring::Ring::new(RING_RECORDS), counters: Default::default() })
}

fn start_sender(g: &'static Global) {
    static STARTED: OnceLock<bool> = OnceLock::new();
    STARTED.get_or_init(|| {
        let s = sender::Sender::new(&sender::socket_path());
        // A thread that cannot start leaves the ring to fill: records are then dropped and
        // counted, the job is unaffected.
        std::thread::Builder::new().name("stepwise-prof".into()).spawn(move || s.run(&g.ring, &g.counters)).is_ok()
    });
}

/// `ncclGetVersion` of the NCCL that loaded the plugin (e.g. 23007 for 2.30.7), 0 when not
/// found. `log` is the logger NCCL passed to init, a function inside NCCL itself: PyTorch
/// loads NCCL as a dependency of a library Python opened with RTLD_LOCAL, so NCCL's symbols
/// are not in the global scope (seen on a GPU with PyTorch 2.11 and NCCL 2.28.9) and the
/// library is found from that address instead.
fn nccl_version(log: *const c_void) -> u32 {
    // SAFETY: dlsym/dladdr/dlopen with valid NUL-terminated names and an address NCCL passed
    // (or null, which dladdr rejects); the symbol, if any, has NCCL's signature
    // `ncclResult_t ncclGetVersion(int*)`. RTLD_NOLOAD never loads a library: the handle is
    // of one already mapped, and dlclose only drops the reference it took.
    unsafe {
        let mut f = libc::dlsym(libc::RTLD_DEFAULT, c"ncclGetVersion".as_ptr());
        if f.is_null() && !log.is_null() {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(log, &mut info) != 0 && !info.dli_fname.is_null() {
                let h = libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
                if !h.is_null() {
                    f = libc::dlsym(h, c"ncclGetVersion".as_ptr());
                    libc::dlclose(h);
                }
            }
        }
        if f.is_null() {
            return 0;
        }
        let f: unsafe extern "C" fn(*mut c_int) -> c_int = std::mem::transmute(f);
        let mut v: c_int = 0;
        if f(&mut v) == OK && v > 0 {
            v as u32
        } else {
            0
        }
    }
}

/// The events asked of NCCL. `STEPWISE_PROFILER_EVENTS` = a comma list of `coll` (always on),
/// `kernel`, `proxy`, or `auto` (default): everything except on NCCL 2.31.x, where KernelCh
/// events cost 4-13 % of a step (NVIDIA/nccl issue 2355) and only Coll events are asked for
/// (host enqueue times; the agent says GPU timing is off).
pub fn choose_mask(version: u32, env: Option<&str>) -> u64 {
    let all = EV_COLL | EV_KERNEL_CH | EV_PROXY_OP | EV_PROXY_STEP;
    match env.map(str::trim) {
        None | Some("") | Some("auto") => {
            if (23100..23200).contains(&version) {
                EV_COLL
            } else {
                all
            }
        }
        Some(list) => list.split(',').fold(EV_COLL, |m, w| match w.trim() {
            "kernel" => m | EV_KERNEL_CH,
            "proxy" => m | EV_PROXY_OP | EV_PROXY_STEP,
            _ => m,
        }),
    }
}

fn init_common(context: *mut *mut c_void, comm: u64, mask_out: *mut c_int, nranks: c_int, rank: c_int, log: *const c_void) -> c_int {
    if context.is_null() || mask_out.is_null() {
        return OK;
    }
    let g = global();
    if g.counters.nccl_version.load(Relaxed) == 0 {
        g.counters.nccl_version.store(nccl_version(log), Relaxed);
    }
    if g.counters.gpu_pci.get().is_none() {
        if let Some(pci) = gpu::current_pci() {
            let _ = g.counters.gpu_pci.set(pci);
        }
    }
    start_sender(g);
    let env = std::env::var("STEPWISE_PROFILER_EVENTS").ok();
    let mask = choose_mask(g.counters.nccl_version.load(Relaxed), env.as_deref());
    g.counters.mask.store(mask as u32, Relaxed);
    let ctx = Context::new(comm, rank, nranks, mask, &g.ring);
    // SAFETY: both checked non-null; NCCL passes valid out-pointers.
    unsafe {
        *context = ctx.cast();
        *mask_out = mask as c_int;
    }
    OK
}

unsafe extern "C" fn init_v5(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    _name: *const c_char,
    _nodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: *const c_void,
) -> c_int {
    init_common(context, comm_id, mask, nranks, rank, log)
}

unsafe extern "C" fn init_v4(
    context: *mut *mut c_void,
    mask: *mut c_int,
    _name: *const c_char,
    comm_hash: u64,
    _nodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: *const c_void,
) -> c_int {
    init_common(context, comm_hash, mask, nranks, rank, log)
}

/// A C string NCCL passed (empty for null).
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn cstr<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        b""
    } else {
        // SAFETY: per the contract.
        unsafe { CStr::from_ptr(p) }.to_bytes()
    }
}

/// Shared by every version once the type is read.
///
/// # Safety
/// NCCL's contract: a live context from init, a valid out-pointer, a descriptor of `ty`.
unsafe fn start_common<T>(ctx: *mut c_void, out: *mut *mut c_void, ty: u64, d: &Descr<T>) -> c_int {
    if out.is_null() {
        return OK;
    }
    // SAFETY: NCCL's out-pointer.
    unsafe { *out = std::ptr::null_mut() };
    // SAFETY: the context init returned (or null).
    let Some(ctx) = (unsafe { (ctx as *const Context).as_ref() }) else { return OK };
    // SAFETY: parentObj is null or a handle this plugin returned for the same communicator.
    let parent = unsafe { handle(d.parent_obj as usize) };
    let graph = matches!(parent, Some(Handle::CollApi(true)));
    let h = match (ty, parent) {
        (EV_COLL, _) => {
            // SAFETY: a Coll descriptor: the `coll` member is the one NCCL filled.
            let c = unsafe { d.u.coll };
            // SAFETY: NCCL's strings are static NUL-terminated names or null.
            let info = unsafe {
                CollInfo {
                    seq: c.seq_number,
                    func: cstr(c.func),
                    count: c.count as u64,
                    datatype: cstr(c.datatype),
                    n_channels: c.n_channels,
                    algo: cstr(c.algo),
                    proto: cstr(c.proto),
                    graph,
                }
            };
            ctx.coll_start(&info)
        }
        // SAFETY: a CollApi descriptor (v5+ only: a v4 type byte cannot hold the bit).
        (EV_COLL_API, _) => events::coll_api_handle(unsafe { d.u.coll_api.graph_captured }),
        // SAFETY: a KernelCh descriptor: the `kernelCh` member is the one NCCL filled.
        (EV_KERNEL_CH, Some(Handle::Coll(s))) => ctx.kernel_start(s, unsafe { d.u.kernel_ch.p_timer }),
        (EV_PROXY_OP, Some(Handle::Coll(s))) => s.proxy_op_handle(),
        (EV_PROXY_STEP, Some(Handle::ProxyOp(s))) => ctx.step_start(s),
        _ => 0,
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { *out = h as *mut c_void };
    OK
}

unsafe extern "C" fn start_v5(ctx: *mut c_void, out: *mut *mut c_void, d: *mut Descr<u64>) -> c_int {
    // SAFETY: NCCL passes a valid descriptor or null.
    match unsafe { d.as_ref() } {
        // SAFETY: forwarded contract.
        Some(d) => unsafe { start_common(ctx, out, d.type_, d) },
        None => OK,
    }
}

unsafe extern "C" fn start_v4(ctx: *mut c_void, out: *mut *mut c_void, d: *mut Descr<u8>) -> c_int {
    // SAFETY: NCCL passes a valid descriptor or null.
    match unsafe { d.as_ref() } {
        // SAFETY: forwarded contract.
        Some(d) => unsafe { start_common(ctx, out, u64::from(d.type_), d) },
        None => OK,
    }
}

unsafe extern "C" fn stop_event(h: *mut c_void) -> c_int {
    // SAFETY: a handle this plugin returned (or null).
    match unsafe { handle(h as usize) } {
        Some(Handle::Coll(s)) => {
            if let Some(c) = s.context() {
                c.coll_stop(s);
            }
        }
        Some(Handle::Kernel(s)) => {
            if let Some(c) = s.context() {
                c.kernel_stop(s);
            }
        }
        Some(Handle::Step(st)) => events::step_state(st, None, None),
        Some(Handle::ProxyOp(_)) | Some(Handle::CollApi(_)) | None => {}
    }
    OK
}

unsafe extern "C" fn record_event_state(h: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: a handle this plugin returned (or null).
    match unsafe { handle(h as usize) } {
        Some(Handle::Kernel(s)) if state == STATE_KERNEL_CH_STOP && !args.is_null() => {
            // SAFETY: for KernelChStop the state args' `kernelCh.pTimer` (a u64 at offset 0) is set.
            let t = unsafe { *(args as *const u64) };
            if let Some(c) = s.context() {
                c.kernel_stop_state(s, t);
            }
        }
        Some(Handle::Step(st)) => {
            // SAFETY: a proxy step's state args are `proxyStep.transSize` (a size_t at offset 0).
            let size = (!args.is_null()).then(|| unsafe { *(args as *const usize) } as u64);
            events::step_state(st, Some(state), size)
        }
        _ => {}
    }
    OK
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> c_int {
    // SAFETY: the context init returned; NCCL uses none of its handles after finalize.
    unsafe { Context::free(ctx.cast()) };
    // The communicator's last records (its collectives are complete: ncclCommDestroy waited
    // for them) go out now: a process often exits right after destroying its communicators,
    // before the sender thread's next look at the ring. Non-blocking sends, bounded.
    if let Some(g) = GLOBAL.get() {
        sender::Sender::once(&sender::socket_path()).flush(&g.ring, &g.counters);
    }
    OK
}

#[cfg(test)]
mod tests;
