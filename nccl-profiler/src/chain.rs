//! A second profiler plugin beside this one (docs/profiler-plugin.md, "Chaining"). NCCL loads
//! one profiler plugin; `STEPWISE_PROFILER_CHAIN=<path or name>` makes this one load another
//! (NCCL Inspector, say) and forward it every callback, so a job keeps that plugin's output.
//!
//! - Loading, at the first init: `dlopen` of the value as given, then (a bare name) of
//!   `libnccl-profiler-<name>.so`, as NCCL opens `NCCL_PROFILER_PLUGIN`; the newest table not
//!   newer than the one NCCL is using with Stepwise (`ncclProfiler_v7` … `_v4`). A missing
//!   file, no table, Stepwise itself, or a failing init of the chained plugin is logged once
//!   (through NCCL's logger) and the job goes on with Stepwise alone.
//! - Per communicator NCCL gets a [`ChainCtx`] holding Stepwise's context and the chained
//!   plugin's, and is told the union of both activation masks.
//! - Per event NCCL gets a [`Link`]: Stepwise's handle and the chained plugin's. An event
//!   reaches Stepwise only when its type is in Stepwise's mask, and the chained plugin only
//!   when NCCL would have given it that event alone ([`delivered`]: the types of its mask and
//!   the parents NCCL starts for them); descriptors go to it converted to its version
//!   (as NCCL's own adapters do: newer members and states dropped, v4's Group parent) and with
//!   `parentObj` / `parentGroup` replaced by its own handles.
//!
//! Links come from two rings per communicator, allocated at init: leaves (ProxyStep,
//! ProxyCtrl, KernelCh, NetPlugin, KernelPhase) are free again at their stop; the other events
//! may be parents after their stop (NCCL stops a Coll at enqueue, its KernelCh and ProxyOp
//! events start later), so their slot is reused only when the ring comes round again
//! ([`PARENT_LINKS`] later). A ring whose next slots are all in use falls back to the heap.

use std::{
    ffi::{c_char, c_int, c_ulong, c_void, CStr, CString},
    ptr::null_mut,
    sync::{
        atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*},
        OnceLock,
    },
};

use crate::{
    abi::*,
    events::{Context, EV_COLL},
    InitArgs,
};

/// The environment variable naming the chained plugin.
pub const ENV: &str = "STEPWISE_PROFILER_CHAIN";
/// Links per communicator for events that may be parents, and for leaves.
pub const PARENT_LINKS: usize = 8192;
pub const LEAF_LINKS: usize = 8192;
/// Slots tried before a link comes from the heap.
const PROBES: usize = 32;
/// ProxyStep | ProxyCtrl | KernelCh | NetPlugin | KernelPhase.
const LEAVES: u64 = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 15);
const EV_P2P: u64 = 1 << 2;

type RawStart = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
type Logger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// A function table as `dlsym` finds it (every version has this shape; null entries are
/// rejected).
#[repr(C)]
struct RawTable {
    name: *const c_char,
    init: Option<unsafe extern "C" fn()>,
    start: Option<RawStart>,
    stop: Option<StopFn>,
    record: Option<RecordFn>,
    finalize: Option<FinalizeFn>,
}

/// The chained plugin.
pub struct Table {
    pub version: u8,
    pub name: String,
    init: unsafe extern "C" fn(),
    start: RawStart,
    stop: StopFn,
    record: RecordFn,
    finalize: FinalizeFn,
}

static CHAIN: OnceLock<Option<Table>> = OnceLock::new();
static INIT_FAILED: AtomicBool = AtomicBool::new(false);

/// Loads the chained plugin at the first call (`nccl`: the table version NCCL uses with
/// Stepwise); whether one is loaded.
pub fn setup(nccl: u8, log: *const c_void) -> bool {
    CHAIN.get_or_init(|| load(nccl, log)).is_some()
}

/// Whether a chained plugin is loaded (fixed at the first init, before NCCL has any context
/// or handle of this plugin).
pub fn active() -> bool {
    matches!(CHAIN.get(), Some(Some(_)))
}

/// The chained plugin, if loaded.
pub fn table() -> Option<&'static Table> {
    CHAIN.get().and_then(Option::as_ref)
}

/// Logs through NCCL's logger (a warning: shown by default), or to stderr without one.
fn warn(log: *const c_void, msg: &str) {
    let line = format!("Stepwise profiler: {msg}");
    match CString::new(line.clone()) {
        Ok(c) if !log.is_null() => {
            // SAFETY: `log` is the `ncclDebugLogger_t` NCCL passed to init: (level, flags,
            // file, line, fmt, ...); NCCL_LOG_WARN = 2, NCCL_INIT = 1, a "%s" format.
            unsafe {
                let f: Logger = std::mem::transmute::<*const c_void, Logger>(log);
                f(2, 1, c"stepwise".as_ptr(), 0, c"%s".as_ptr(), c.as_ptr());
            }
        }
        _ => eprintln!("{line}"),
    }
}

fn load(nccl: u8, log: *const c_void) -> Option<Table> {
    let name = std::env::var(ENV).ok().filter(|s| !s.trim().is_empty())?;
    match open(name.trim(), nccl) {
        Ok(t) => Some(t),
        Err(e) => {
            warn(log, &format!("{ENV}={name}: {e}; continuing without a chained plugin"));
            None
        }
    }
}

fn dlopen(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| "a NUL in the name".to_string())?;
    // SAFETY: a NUL-terminated name; dlerror's message is copied before any other dl call.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            let e = libc::dlerror();
            return Err(if e.is_null() { "dlopen failed".into() } else { CStr::from_ptr(e).to_string_lossy().into_owned() });
        }
        Ok(h)
    }
}

/// Stepwise's own tables: chaining to itself would forward to itself forever.
fn is_self(t: *const c_void) -> bool {
    [
        &crate::ncclProfiler_v7 as *const ProfilerV5 as *const c_void,
        &crate::ncclProfiler_v6 as *const ProfilerV5 as *const c_void,
        &crate::ncclProfiler_v5 as *const ProfilerV5 as *const c_void,
        &crate::ncclProfiler_v4 as *const ProfilerV4 as *const c_void,
    ]
    .contains(&t)
}

fn open(name: &str, nccl: u8) -> Result<Table, String> {
    let lib_name = name.starts_with("lib") && name.ends_with(".so");
    let bare = !(name.contains('/') || lib_name);
    let lib = match dlopen(name) {
        Ok(h) => h,
        Err(e) if bare => dlopen(&format!("libnccl-profiler-{name}.so")).map_err(|e2| format!("{e}; {e2}"))?,
        Err(e) => return Err(e),
    };
    for v in (4..=nccl.clamp(4, 7)).rev() {
        let sym = CString::new(format!("ncclProfiler_v{v}")).map_err(|e| e.to_string())?;
        // SAFETY: dlsym on a handle dlopen returned, with a NUL-terminated name.
        let t = unsafe { libc::dlsym(lib, sym.as_ptr()) } as *const RawTable;
        if t.is_null() {
            continue;
        }
        if is_self(t.cast()) {
            return Err("it is Stepwise's own plugin".into());
        }
        // SAFETY: the exported `ncclProfiler_vN` table has this layout (every version).
        let t = unsafe { &*t };
        let (Some(init), Some(start), Some(stop), Some(record), Some(finalize)) = (t.init, t.start, t.stop, t.record, t.finalize) else {
            return Err(format!("ncclProfiler_v{v} has a null function"));
        };
        // SAFETY: null or the table's static NUL-terminated name.
        let name = if t.name.is_null() { String::new() } else { unsafe { CStr::from_ptr(t.name) }.to_string_lossy().into_owned() };
        // The library stays loaded for the life of the process, as this plugin does.
        return Ok(Table { version: v, name, init, start, stop, record, finalize });
    }
    // SAFETY: a handle from dlopen, none of its symbols kept.
    unsafe { libc::dlclose(lib) };
    Err(format!("exports no ncclProfiler_v{}..v4", nccl.clamp(4, 7)))
}

/// One event as NCCL holds it: Stepwise's handle and the chained plugin's.
#[repr(align(32))]
pub struct Link {
    own: AtomicUsize,
    chained: AtomicPtr<c_void>,
    busy: AtomicBool,
    leaf: AtomicBool,
    heap: bool,
}

impl Link {
    fn new(heap: bool) -> Link {
        Link { own: AtomicUsize::new(0), chained: AtomicPtr::new(null_mut()), busy: AtomicBool::new(false), leaf: AtomicBool::new(false), heap }
    }
}

struct Ring {
    links: Box<[Link]>,
    next: AtomicUsize,
}

impl Ring {
    fn new(n: usize) -> Ring {
        Ring { links: (0..n).map(|_| Link::new(false)).collect(), next: AtomicUsize::new(0) }
    }

    /// A free link, taken; from the heap when the next [`PROBES`] slots are all in use.
    fn take(&self) -> *const Link {
        for _ in 0..PROBES {
            let i = self.next.fetch_add(1, Relaxed) % self.links.len().max(1);
            if let Some(l) = self.links.get(i) {
                if l.busy.compare_exchange(false, true, Acquire, Relaxed).is_ok() {
                    return l;
                }
            }
        }
        let l = Link::new(true);
        l.busy.store(true, Relaxed);
        Box::into_raw(Box::new(l))
    }
}

/// What NCCL gets as the context of a communicator when a plugin is chained.
pub struct ChainCtx {
    own: *mut Context,
    own_mask: u64,
    nccl: u8,
    chained: *mut c_void,
    /// The types forwarded: [`delivered`] by the chained plugin's mask.
    chained_mask: u64,
    parents: Ring,
    leaves: Ring,
}

/// Calls the chained plugin's init; returns the context for NCCL and the mask to tell it
/// (Stepwise's `own_mask` | what the chained plugin asked for).
pub fn init(own: *mut Context, own_mask: u64, mask_in: c_int, a: &InitArgs) -> (*mut c_void, u64) {
    let (chained, chained_mask) = table().map_or((null_mut(), 0), |t| init_chained(t, mask_in, a));
    let delivered = delivered(chained_mask) & types_of(a.version);
    let ctx = ChainCtx { own, own_mask, nccl: a.version, chained, chained_mask: delivered, parents: Ring::new(PARENT_LINKS), leaves: Ring::new(LEAF_LINKS) };
    (Box::into_raw(Box::new(ctx)).cast(), own_mask | chained_mask)
}

fn init_chained(t: &Table, mask_in: c_int, a: &InitArgs) -> (*mut c_void, u64) {
    let (mut ctx, mut mask) = (null_mut(), mask_in);
    // SAFETY: the chained plugin's init, with its version's argument order; valid
    // out-pointers; the other arguments are NCCL's.
    let err = unsafe {
        if t.version == 4 {
            let f = std::mem::transmute::<unsafe extern "C" fn(), InitV4>(t.init);
            f(&mut ctx, &mut mask, a.name, a.comm, a.nnodes, a.nranks, a.rank, a.log)
        } else {
            let f = std::mem::transmute::<unsafe extern "C" fn(), InitV5>(t.init);
            f(&mut ctx, a.comm, &mut mask, a.name, a.nnodes, a.nranks, a.rank, a.log)
        }
    };
    if err != 0 {
        if !INIT_FAILED.swap(true, Relaxed) {
            warn(a.log, &format!("chained profiler {} (v{}): init failed with error {err}; this communicator continues without it", t.name, t.version));
        }
        return (null_mut(), 0);
    }
    (ctx, (mask as u32 as u64) & types_of(t.version) & types_of(a.version))
}

/// The event types NCCL gives a plugin with activation mask `m` (`src/plugin/profiler.cc`):
/// those in the mask and the parents NCCL starts for them: the Group and API events for any
/// task-level type, Coll and P2p for their proxy and kernel events, ProxyOp for ProxyStep and
/// NetPlugin, ProxyStep for NetPlugin, CeColl for CeSync and CeBatch, KernelCh for KernelPhase.
pub fn delivered(m: u64) -> u64 {
    const GROUP_API: u64 = 1 << 8;
    const COLL_API: u64 = 1 << 9;
    const P2P_API: u64 = 1 << 10;
    const KERNEL_LAUNCH: u64 = 1 << 11;
    const CE: u64 = 0x7 << 12;
    // Coll | ProxyOp | ProxyStep | KernelCh | NetPlugin.
    const TASK: u64 = (1 << 1) | (1 << 3) | (1 << 4) | (1 << 6) | (1 << 7);
    let rules: [(u64, u64); 10] = [
        (GROUP_API, GROUP_API | COLL_API | P2P_API | KERNEL_LAUNCH | 1 | TASK | EV_P2P | CE),
        (COLL_API, COLL_API | TASK | CE),
        (P2P_API, P2P_API | EV_P2P | (TASK & !EV_COLL)),
        (1, 1 | TASK | EV_P2P),
        (EV_COLL, TASK),
        (EV_P2P, EV_P2P | (TASK & !EV_COLL)),
        (1 << 3, (1 << 3) | (1 << 4) | (1 << 7)),
        (1 << 4, (1 << 4) | (1 << 7)),
        (1 << 12, CE),
        // v7: KernelPhase needs KernelCh (NCCL sets the bit itself).
        (1 << 6, 1 << 15),
    ];
    rules.iter().filter(|(_, trigger)| m & trigger != 0).fold(m, |acc, (ty, _)| acc | ty)
}

/// `p` read at `off` bytes into `buf`.
fn ptr_at(buf: &[u8; 136], off: usize) -> *mut c_void {
    let mut b = [0u8; 8];
    b.copy_from_slice(buf.get(off..off + 8).unwrap_or(&[0; 8]));
    usize::from_ne_bytes(b) as *mut c_void
}

fn set_ptr(buf: &mut [u8; 136], off: usize, p: *mut c_void) {
    if let Some(s) = buf.get_mut(off..off + 8) {
        s.copy_from_slice(&(p as usize).to_ne_bytes());
    }
}

/// The chained plugin's handle of a link NCCL passed back (null for null).
///
/// # Safety
/// `p` is null or a link of this module that NCCL got from [`start`].
unsafe fn chained_of(p: *mut c_void) -> *mut c_void {
    // SAFETY: per the contract (ring links live as long as their context, heap parents forever).
    unsafe { (p as *const Link).as_ref() }.map_or(null_mut(), |l| l.chained.load(Acquire))
}

/// Starts the event in the chained plugin: a copy of NCCL's descriptor in that plugin's
/// version, with its own handles as parents.
///
/// # Safety
/// `d` is NCCL's descriptor of version `c.nccl`, type `ty`, its parents links of `c`.
unsafe fn start_chained(t: &Table, c: &ChainCtx, ty: u64, d: *const c_void) -> *mut c_void {
    let mut buf = [0u8; 136];
    let n = descr_size(c.nccl).min(buf.len());
    // SAFETY: NCCL's descriptor of its version is `descr_size` bytes long.
    unsafe { std::ptr::copy_nonoverlapping(d.cast::<u8>(), buf.as_mut_ptr(), n) };
    // SAFETY: parentObj is null or a link (per the contract).
    let parent = unsafe { chained_of(ptr_at(&buf, OFF_PARENT_OBJ)) };
    set_ptr(&mut buf, OFF_PARENT_OBJ, parent);
    let group_at = match ty {
        EV_COLL if c.nccl >= 5 => Some(OFF_COLL_PARENT_GROUP),
        EV_P2P if c.nccl >= 5 => Some(OFF_P2P_PARENT_GROUP),
        _ => None,
    };
    if let Some(off) = group_at {
        // SAFETY: parentGroup is null or a link (per the contract).
        let g = unsafe { chained_of(ptr_at(&buf, off)) };
        // v4 has no parentGroup: its Coll and P2p events have the Group as parent.
        set_ptr(&mut buf, if t.version == 4 { OFF_PARENT_OBJ } else { off }, g);
    }
    // A v4 `type` is one byte: on little-endian targets the u64 type (< 256: only v4 types
    // reach a v4 plugin) already starts with it, followed by the padding NCCL zeroes.
    #[cfg(target_endian = "big")]
    compile_error!("chain.rs writes v4 descriptors for little-endian targets only");
    let mut h = null_mut();
    // SAFETY: the chained plugin's startEvent with its context and a descriptor of its
    // version, valid for the call.
    unsafe { (t.start)(c.chained, &mut h, buf.as_mut_ptr().cast()) };
    h
}

/// startEvent with chaining on: the link for NCCL (null when neither plugin records it).
///
/// # Safety
/// `ctx` is a [`ChainCtx`] from [`init`] (or null); `d` NCCL's valid descriptor.
pub unsafe fn start(ctx: *mut c_void, d: *const c_void) -> *mut c_void {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { (ctx as *const ChainCtx).as_ref() }) else { return null_mut() };
    // SAFETY: a one-byte type in v4, eight bytes from v5.
    let ty = unsafe {
        if c.nccl == 4 {
            u64::from(*d.cast::<u8>())
        } else {
            *d.cast::<u64>()
        }
    };
    // SAFETY: parentObj (offset 8 in every version) is null or a link of this context.
    let parent = unsafe { (*d.cast::<u8>().add(OFF_PARENT_OBJ).cast::<*const Link>()).as_ref() };
    // CollApi too: its handle marks graph capture for the Coll events of later replays.
    let own = if ty & (c.own_mask | crate::events::EV_COLL_API) != 0 {
        // SAFETY: Stepwise's context and NCCL's descriptor; the parent's Stepwise handle.
        unsafe { crate::own_start_raw(c.own, c.nccl, d, parent.map_or(0, |l| l.own.load(Acquire))) }
    } else {
        0
    };
    let chained = match table() {
        // SAFETY: per the contract.
        Some(t) if !c.chained.is_null() && ty & c.chained_mask != 0 => unsafe { start_chained(t, c, ty, d) },
        _ => null_mut(),
    };
    if own == 0 && chained.is_null() {
        return null_mut();
    }
    let leaf = ty & LEAVES != 0;
    let l = if leaf { c.leaves.take() } else { c.parents.take() };
    // SAFETY: a link just taken (busy): only this thread writes it until it is returned.
    let l = unsafe { &*l };
    l.leaf.store(leaf, Relaxed);
    l.own.store(own, Release);
    l.chained.store(chained, Release);
    (l as *const Link).cast_mut().cast()
}

/// stopEvent with chaining on.
///
/// # Safety
/// `h` is null or a link from [`start`] not yet stopped.
pub unsafe fn stop(h: *mut c_void) {
    // SAFETY: per the contract.
    let Some(l) = (unsafe { (h as *const Link).as_ref() }) else { return };
    let own = l.own.load(Acquire);
    if own != 0 {
        // SAFETY: Stepwise's handle of a live context.
        unsafe { crate::own_stop(own) };
    }
    let ch = l.chained.load(Acquire);
    if let (Some(t), false) = (table(), ch.is_null()) {
        // SAFETY: the chained plugin's handle of this event.
        unsafe { (t.stop)(ch) };
    }
    if l.leaf.load(Relaxed) {
        if l.heap {
            // SAFETY: a heap leaf is freed once, at its stop; NCCL does not use it after.
            drop(unsafe { Box::from_raw(h as *mut Link) });
            return;
        }
        l.busy.store(false, Release);
    } else if !l.heap {
        // A parent may still be named by children: its slot is reused a ring later.
        l.busy.store(false, Release);
    }
}

/// recordEventState with chaining on.
///
/// # Safety
/// `h` is null or a live link from [`start`]; `args` NCCL's state arguments or null.
pub unsafe fn record(h: *mut c_void, state: c_int, args: *mut c_void) {
    // SAFETY: per the contract.
    let Some(l) = (unsafe { (h as *const Link).as_ref() }) else { return };
    let own = l.own.load(Acquire);
    if own != 0 {
        // SAFETY: Stepwise's handle of a live context, NCCL's arguments.
        unsafe { crate::own_record(own, state, args) };
    }
    let ch = l.chained.load(Acquire);
    if let (Some(t), false) = (table(), ch.is_null()) {
        if state_in(t.version, state) {
            // SAFETY: the chained plugin's handle; the state arguments are one union of the
            // same layout in every version.
            unsafe { (t.record)(ch, state, args) };
        }
    }
}

/// finalize with chaining on: the chained plugin's, then Stepwise's.
///
/// # Safety
/// `ctx` is a [`ChainCtx`] from [`init`] (or null), finalized once; NCCL uses none of its
/// links after.
pub unsafe fn finalize(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: per the contract.
    let c = unsafe { Box::from_raw(ctx as *mut ChainCtx) };
    if let (Some(t), false) = (table(), c.chained.is_null()) {
        // SAFETY: the chained plugin's context from its init.
        unsafe { (t.finalize)(c.chained) };
    }
    // SAFETY: Stepwise's context from init.
    unsafe { crate::own_finalize(c.own) };
}
