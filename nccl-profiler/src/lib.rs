//! Stepwise's NCCL profiler plugin (docs/profiler-plugin.md).
//!
//! A job loads it with `NCCL_PROFILER_PLUGIN=/path/to/libnccl-profiler-stepwise.so` (cargo
//! builds `libnccl_profiler.so`; `cargo xtask plugin` and the test harness copy it under the
//! hyphenated name). NCCL looks up `ncclProfiler_v7`, then `_v6`, `_v5`, `_v4`, … : those four
//! are exported, with the layouts of the `profiler_v4.h`-`profiler_v7.h` headers of NCCL's
//! sources ([`abi`]; the v4 header first appears in NCCL 2.27.3, v5 in 2.28.3, v6 in 2.29.2,
//! v7 in 2.31.2, so older NCCLs, which look up v3 at most, do not load it).
//!
//! `STEPWISE_PROFILER_CHAIN` names a second profiler plugin (NCCL Inspector, say) that this
//! one loads and forwards every callback to, with that plugin's own context and handles
//! ([`chain`]): NCCL loads only one.
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

pub mod abi;
pub mod chain;
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

pub use abi::*;
use events::{handle, CollInfo, Context, Handle, EV_COLL, EV_COLL_API, EV_KERNEL_CH, EV_PROXY_OP, EV_PROXY_STEP, STATE_KERNEL_CH_STOP};

/// `ncclSuccess`.
const OK: c_int = 0;
/// Records the ring holds (about 1.2 MB).
pub const RING_RECORDS: usize = 8192;

const NAME: &CStr = c"Stepwise";

#[no_mangle]
pub static ncclProfiler_v7: ProfilerV5 = ProfilerV5 { name: NAME.as_ptr(), init: init_v7, start_event: start_v5, stop_event, record_event_state, finalize };

#[no_mangle]
pub static ncclProfiler_v6: ProfilerV5 = ProfilerV5 { name: NAME.as_ptr(), init: init_v6, start_event: start_v5, stop_event, record_event_state, finalize };

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

/// What NCCL passed to init (every version's arguments, in one order).
pub struct InitArgs {
    pub version: u8,
    pub comm: u64,
    pub name: *const c_char,
    pub nnodes: c_int,
    pub nranks: c_int,
    pub rank: c_int,
    pub log: *const c_void,
}

fn init_common(context: *mut *mut c_void, mask_out: *mut c_int, a: &InitArgs) -> c_int {
    if context.is_null() || mask_out.is_null() {
        return OK;
    }
    let g = global();
    if g.counters.nccl_version.load(Relaxed) == 0 {
        g.counters.nccl_version.store(nccl_version(a.log), Relaxed);
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
    let ctx = Context::new(a.comm, a.rank, a.nranks, mask, &g.ring);
    let (ctx, told) = if chain::setup(a.version, a.log) {
        // SAFETY: NCCL's mask out-pointer (checked non-null) holds the mask so far.
        let mask_in = unsafe { *mask_out };
        chain::init(ctx, mask, mask_in, a)
    } else {
        (ctx.cast(), mask)
    };
    // SAFETY: both checked non-null; NCCL passes valid out-pointers.
    unsafe {
        *context = ctx;
        *mask_out = told as c_int;
    }
    OK
}

macro_rules! init_v5_like {
    ($name:ident, $v:literal) => {
        unsafe extern "C" fn $name(
            context: *mut *mut c_void,
            comm: u64,
            mask: *mut c_int,
            name: *const c_char,
            nnodes: c_int,
            nranks: c_int,
            rank: c_int,
            log: *const c_void,
        ) -> c_int {
            init_common(context, mask, &InitArgs { version: $v, comm, name, nnodes, nranks, rank, log })
        }
    };
}
init_v5_like!(init_v7, 7);
init_v5_like!(init_v6, 6);
init_v5_like!(init_v5, 5);

unsafe extern "C" fn init_v4(
    context: *mut *mut c_void,
    mask: *mut c_int,
    name: *const c_char,
    comm: u64,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: *const c_void,
) -> c_int {
    init_common(context, mask, &InitArgs { version: 4, comm, name, nnodes, nranks, rank, log })
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

/// Stepwise's own handling of a started event of type `ty` whose parent is Stepwise's handle
/// `parent` (0: none): its handle, 0 when it is not recorded. Types outside the context's
/// mask are not recorded (with a chained plugin NCCL also sends what that plugin asked for).
///
/// # Safety
/// NCCL's contract: a descriptor of `ty`; `parent` is 0 or a handle of this context.
unsafe fn own_start<T>(ctx: &Context, ty: u64, parent: usize, d: &Descr<T>) -> usize {
    // NCCL starts CollApi for every collective call when Coll is in the mask, whether or not
    // its own bit is: its handle is kept (not recorded) whatever the mask.
    if ty & ctx.mask == 0 && ty != EV_COLL_API {
        return 0;
    }
    // SAFETY: per the contract.
    let parent = unsafe { handle(parent) };
    let graph = matches!(parent, Some(Handle::CollApi(true)));
    match (ty, parent) {
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
    }
}

/// [`own_start`] on a descriptor of NCCL version `version` (a one-byte type in v4).
///
/// # Safety
/// `ctx` is a live context from init or null; `d` a valid descriptor of that version;
/// `parent` as for [`own_start`].
pub(crate) unsafe fn own_start_raw(ctx: *const Context, version: u8, d: *const c_void, parent: usize) -> usize {
    // SAFETY: per the contract.
    unsafe {
        let Some(ctx) = ctx.as_ref() else { return 0 };
        if version == 4 {
            let d = &*(d as *const Descr<u8>);
            own_start(ctx, u64::from(d.type_), parent, d)
        } else {
            let d = &*(d as *const Descr<u64>);
            own_start(ctx, d.type_, parent, d)
        }
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
    let h = if chain::active() {
        // SAFETY: with chaining on, every context given to NCCL is a chain context.
        unsafe { chain::start(ctx, (d as *const Descr<T>).cast()) }
    } else {
        // SAFETY: the context init returned (or null).
        match unsafe { (ctx as *const Context).as_ref() } {
            // SAFETY: NCCL's descriptor of `ty`; parentObj is null or a handle this plugin
            // returned for the same communicator.
            Some(c) => unsafe { own_start(c, ty, d.parent_obj as usize, d) as *mut c_void },
            None => std::ptr::null_mut(),
        }
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { *out = h };
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

/// Stepwise's own stop of one of its handles.
///
/// # Safety
/// `h` is 0 or a handle this plugin returned whose context is alive.
pub(crate) unsafe fn own_stop(h: usize) {
    // SAFETY: per the contract.
    match unsafe { handle(h) } {
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
}

unsafe extern "C" fn stop_event(h: *mut c_void) -> c_int {
    if chain::active() {
        // SAFETY: with chaining on, every handle given to NCCL is a chain link (or null).
        unsafe { chain::stop(h) };
    } else {
        // SAFETY: a handle this plugin returned (or null).
        unsafe { own_stop(h as usize) };
    }
    OK
}

/// Stepwise's own state record on one of its handles.
///
/// # Safety
/// As [`own_stop`]; `args` is null or NCCL's state arguments for `state`.
pub(crate) unsafe fn own_record(h: usize, state: c_int, args: *mut c_void) {
    // SAFETY: per the contract.
    match unsafe { handle(h) } {
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
}

unsafe extern "C" fn record_event_state(h: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    if chain::active() {
        // SAFETY: with chaining on, every handle given to NCCL is a chain link (or null).
        unsafe { chain::record(h, state, args) };
    } else {
        // SAFETY: a handle this plugin returned (or null), NCCL's state arguments.
        unsafe { own_record(h as usize, state, args) };
    }
    OK
}

/// Stepwise's own finalize of a context from init.
///
/// # Safety
/// `ctx` came from init (or is null); NCCL uses none of its handles after finalize.
pub(crate) unsafe fn own_finalize(ctx: *mut Context) {
    // SAFETY: per the contract.
    unsafe { Context::free(ctx) };
    // The communicator's last records (its collectives are complete: ncclCommDestroy waited
    // for them) go out now: a process often exits right after destroying its communicators,
    // before the sender thread's next look at the ring. Non-blocking sends, bounded.
    if let Some(g) = GLOBAL.get() {
        sender::Sender::once(&sender::socket_path()).flush(&g.ring, &g.counters);
    }
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> c_int {
    if chain::active() {
        // SAFETY: with chaining on, the context is a chain context from init.
        unsafe { chain::finalize(ctx) };
    } else {
        // SAFETY: the context init returned; NCCL uses none of its handles after finalize.
        unsafe { own_finalize(ctx.cast()) };
    }
    OK
}

#[cfg(test)]
mod tests;
