//! `cargo xtask bench plugin`: what the plugin costs NCCL's threads, and how many records per
//! second reach a receiver with no drop.
//!
//! The callbacks are called through the exported `ncclProfiler_v5` table, as NCCL calls
//! them, and through an empty plugin's table (callbacks that only return) in the same run:
//! the difference is the plugin's own cost, with the loop and the clock reads cancelled out.
//! - calling thread, per collective: Coll start + Coll stop (what `ncclAllReduce` runs);
//! - proxy thread, per collective of 2 channels: 2 × (KernelCh start, KernelChStop, stop) and
//!   2 ProxyOps × 4 ProxySteps × (3 states + stop).
//!
//! Chaining (`--chain CHAINED.so --cdylib libnccl_profiler.so`): the same callbacks through a
//! second copy of the plugin (the cdylib, dlopened as NCCL does) with
//! `STEPWISE_PROFILER_CHAIN=CHAINED.so`, the chained plugin asking for the same events, and
//! through the chained plugin alone, beside the empty plugin and Stepwise alone measured again
//! in the same rounds: the forwarding cost is (Stepwise + chained) − Stepwise − (chained alone
//! − empty).
//!
//! Throughput: collectives produced at a paced rate on one thread (calling + proxy callbacks),
//! the plugin's sender thread sending to a Unix datagram socket this program reads with the
//! agent's decoder (`nccl_profiler::wire::decode`); received records/s and the drop counts the
//! plugin reports.

use std::{
    ffi::{c_int, c_void},
    os::unix::net::UnixDatagram,
    ptr::null_mut,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use nccl_profiler::{ncclProfiler_v5, wire, CollDescr, Descr, DescrUnion, KernelChDescr, ProfilerV5};

const COLL: u64 = 1 << 1;
const PROXY_OP: u64 = 1 << 3;
const PROXY_STEP: u64 = 1 << 4;
const KERNEL_CH: u64 = 1 << 6;

unsafe extern "C" fn e_init(
    ctx: *mut *mut c_void,
    _: u64,
    mask: *mut c_int,
    _: *const std::ffi::c_char,
    _: c_int,
    _: c_int,
    _: c_int,
    _: *const c_void,
) -> c_int {
    // SAFETY: valid out-pointers from this program.
    unsafe {
        *ctx = 8 as *mut c_void;
        *mask = 0x5a;
    }
    0
}
unsafe extern "C" fn e_start(_: *mut c_void, out: *mut *mut c_void, _: *mut Descr<u64>) -> c_int {
    // SAFETY: valid out-pointer from this program.
    unsafe { *out = 16 as *mut c_void };
    0
}
unsafe extern "C" fn e_stop(_: *mut c_void) -> c_int {
    0
}
unsafe extern "C" fn e_record(_: *mut c_void, _: c_int, _: *mut c_void) -> c_int {
    0
}
unsafe extern "C" fn e_fin(_: *mut c_void) -> c_int {
    0
}
static EMPTY: ProfilerV5 =
    ProfilerV5 { name: c"empty".as_ptr(), init: e_init, start_event: e_start, stop_event: e_stop, record_event_state: e_record, finalize: e_fin };

/// A descriptor as large as NCCL's (v7: 136 bytes), the fields past `Descr` zero (a chained
/// plugin reads `coll.parentGroup`; the chain copies the whole descriptor).
#[repr(C)]
struct Full {
    d: Descr<u64>,
    tail: [u64; 4],
}

impl Full {
    fn ptr(&mut self) -> *mut Descr<u64> {
        (self as *mut Full).cast()
    }
}

fn coll(seq: u64) -> Full {
    let d = Descr {
        type_: COLL,
        parent_obj: null_mut(),
        rank: 0,
        u: DescrUnion {
            coll: CollDescr {
                seq_number: seq,
                func: c"AllReduce".as_ptr(),
                send_buff: std::ptr::null(),
                recv_buff: null_mut(),
                count: 1 << 20,
                root: 0,
                datatype: c"ncclFloat32".as_ptr(),
                n_channels: 2,
                n_warps: 16,
                algo: c"RING".as_ptr(),
                proto: c"SIMPLE".as_ptr(),
            },
        },
    };
    Full { d, tail: [0; 4] }
}

fn child(ty: u64, parent: *mut c_void, t: u64) -> Full {
    let d = Descr { type_: ty, parent_obj: parent, rank: 0, u: DescrUnion { kernel_ch: KernelChDescr { channel_id: 0, p_timer: t } } };
    Full { d, tail: [0; 4] }
}

/// One collective's calling-thread callbacks; returns the Coll handle.
fn calling(p: &ProfilerV5, ctx: *mut c_void, seq: u64) -> *mut c_void {
    let mut h = null_mut();
    // SAFETY: NCCL's calling sequence on a context from `p.init`.
    unsafe {
        (p.start_event)(ctx, &mut h, coll(seq).ptr());
        (p.stop_event)(h);
    }
    h
}

/// One collective's proxy-thread callbacks (2 channels, 2 ProxyOps of 4 steps).
fn proxy(p: &ProfilerV5, ctx: *mut c_void, h: *mut c_void, t: u64) {
    // SAFETY: as above, with handles `p` returned.
    unsafe {
        for _ in 0..2 {
            let mut op = null_mut();
            (p.start_event)(ctx, &mut op, child(PROXY_OP, h, 0).ptr());
            for _ in 0..4 {
                let mut st = null_mut();
                (p.start_event)(ctx, &mut st, child(PROXY_STEP, op, 0).ptr());
                for state in [8, 9, 10] {
                    (p.record_event_state)(st, state, null_mut());
                }
                (p.stop_event)(st);
            }
            (p.stop_event)(op);
        }
        for c in 0..2u64 {
            let mut k = null_mut();
            (p.start_event)(ctx, &mut k, child(KERNEL_CH, h, t + c).ptr());
            let mut end = t + 1000 + c;
            (p.record_event_state)(k, 22, (&mut end as *mut u64).cast());
            (p.stop_event)(k);
        }
    }
}

fn init(p: &ProfilerV5) -> *mut c_void {
    let (mut ctx, mut mask) = (null_mut(), 0);
    // SAFETY: valid out-pointers.
    unsafe { (p.init)(&mut ctx, 0x1234, &mut mask, c"bench".as_ptr(), 1, 2, 0, std::ptr::null()) };
    ctx
}

/// ns per collective on (calling thread, proxy thread), best of 5 rounds of `n`.
fn cost(p: &ProfilerV5, n: u64) -> (f64, f64) {
    let ctx = init(p);
    let (mut best_c, mut best_p) = (f64::INFINITY, f64::INFINITY);
    let mut seq = 0;
    for _ in 0..5 {
        let (mut c_ns, mut p_ns) = (0u128, 0u128);
        for _ in 0..n {
            let t0 = Instant::now();
            let h = calling(p, ctx, seq);
            let t1 = Instant::now();
            proxy(p, ctx, h, seq * 10_000);
            let t2 = Instant::now();
            c_ns += (t1 - t0).as_nanos();
            p_ns += (t2 - t1).as_nanos();
            seq += 1;
        }
        best_c = best_c.min(c_ns as f64 / n as f64);
        best_p = best_p.min(p_ns as f64 / n as f64);
    }
    // SAFETY: the context from init, finalized once.
    unsafe { (p.finalize)(ctx) };
    (best_c, best_p)
}

/// The plugin's own counters: (sent, dropped: no receiver, dropped: ring full).
fn plugin_counters() -> (u64, u64, u64) {
    let g = nccl_profiler::global();
    (g.counters.sent.load(Relaxed), g.counters.unsent.load(Relaxed), g.ring.dropped.load(Relaxed))
}

fn main() {
    // `--agent SOCKET`: send to a running agent's profiler socket instead of this program's
    // receiver (then read its stepwise_profiler_records_total); the plugin's counters say what
    // it sent and dropped.
    let args: Vec<String> = std::env::args().collect();
    let external = args.iter().position(|a| a == "--agent").and_then(|i| args.get(i + 1)).map(std::path::PathBuf::from);
    let dir = std::env::temp_dir().join(format!("stepwise-bench-plugin-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let sock = external.clone().unwrap_or_else(|| dir.join("profiler.sock"));
    let rx = if external.is_some() { UnixDatagram::unbound().expect("socket") } else { UnixDatagram::bind(&sock).expect("bind the receiver") };
    rx.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    // Before the plugin's first init: the sender thread reads it once.
    std::env::set_var("STEPWISE_PROFILER_SOCKET", &sock);
    let got = Arc::new(AtomicU64::new(0));
    let drops = Arc::new(AtomicU64::new(0));
    let full = Arc::new(AtomicU64::new(0));
    {
        let (got, drops, full) = (got.clone(), drops.clone(), full.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                if let Ok(n) = rx.recv(&mut buf) {
                    if let Ok((h, r)) = wire::decode(&buf[..n]) {
                        got.fetch_add(r.len() as u64, Relaxed);
                        drops.fetch_max(h.dropped_full + h.dropped_unsent, Relaxed);
                        full.fetch_max(h.dropped_full, Relaxed);
                    }
                }
            }
        });
    }
    // With an external receiver only the throughput is measured (the cost rounds' burst of a
    // million collectives would only fill its queue first).
    let n = if external.is_some() { 1 } else { 200_000 };
    let (ec, ep) = cost(&EMPTY, n);
    let (sc, sp) = cost(&ncclProfiler_v5, n);
    println!("per collective, best of 5 × {n} (ns; Instant reads included in both):");
    println!("  calling thread (Coll start+stop):        stepwise {sc:7.1}  empty {ec:7.1}  plugin cost {:7.1} ns", sc - ec);
    println!("  proxy thread (2 KernelCh, 2×4 ProxyStep): stepwise {sp:7.1}  empty {ep:7.1}  plugin cost {:7.1} ns", sp - ep);
    std::thread::sleep(Duration::from_millis(300));
    println!("records sent during the cost rounds: {} received, {} dropped (ring full / not delivered)", got.load(Relaxed), drops.load(Relaxed));

    println!("throughput, 1 s per rate, one producer thread (calling + proxy callbacks):");
    let ctx = init(&ncclProfiler_v5);
    let mut seq = 1 << 40;
    for rate in [10_000u64, 100_000, 300_000, 1_000_000, 0] {
        std::thread::sleep(Duration::from_millis(300));
        let (g0, d0, f0) = (got.load(Relaxed), drops.load(Relaxed), full.load(Relaxed));
        let p0 = plugin_counters();
        let t0 = Instant::now();
        let mut made = 0u64;
        while t0.elapsed() < Duration::from_secs(1) {
            if rate > 0 && made as f64 > t0.elapsed().as_secs_f64() * rate as f64 {
                // Ahead of the rate: yield the core (the sender and the receiver need it).
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            let h = calling(&ncclProfiler_v5, ctx, seq);
            proxy(&ncclProfiler_v5, ctx, h, seq);
            seq += 1;
            made += 1;
        }
        std::thread::sleep(Duration::from_millis(300));
        let (g1, d1, f1) = (got.load(Relaxed), drops.load(Relaxed), full.load(Relaxed));
        let label = if rate == 0 { "unpaced".to_string() } else { format!("{rate}/s") };
        println!("  {label:>10}: produced {made:8} in 1 s, received {:8}, dropped {:8} (ring full {})", g1 - g0, d1 - d0, f1 - f0);
        let p1 = plugin_counters();
        println!("              the plugin: sent {}, not delivered {}, ring full {}", p1.0 - p0.0, p1.1 - p0.1, p1.2 - p0.2);
    }
    // SAFETY: the context from init.
    unsafe { (ncclProfiler_v5.finalize)(ctx) };
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    if let (Some(chained), Some(cdylib)) = (arg("--chain"), arg("--cdylib")) {
        chaining(&chained, &cdylib, n);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `ncclProfiler_v6` table of a library opened as NCCL opens a plugin.
fn dl_table(path: &str) -> &'static ProfilerV5 {
    let c = std::ffi::CString::new(path).expect("path");
    // SAFETY: dlopen/dlsym of a profiler plugin; the table has the v5/v6 layout and stays
    // mapped (the library is never closed).
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {path}: {:?}", std::ffi::CStr::from_ptr(libc::dlerror()));
        let t = libc::dlsym(h, c"ncclProfiler_v6".as_ptr()) as *const ProfilerV5;
        assert!(!t.is_null(), "{path} has no ncclProfiler_v6");
        &*t
    }
}

fn chaining(chained: &str, cdylib: &str, n: u64) {
    // Read by the chained plugin's init and the cdylib's first init: every event to both.
    std::env::set_var("CHAINTEST_MASK", "0x5a");
    std::env::set_var("STEPWISE_PROFILER_CHAIN", chained);
    let alone = dl_table(chained);
    let both = dl_table(cdylib);
    let arms: [&ProfilerV5; 4] = [&EMPTY, &ncclProfiler_v5, alone, both];
    // Arms interleaved over 3 rounds (drift and the other threads on this machine fall on
    // all of them alike), the best of each.
    let mut best = [(f64::INFINITY, f64::INFINITY); 4];
    for _ in 0..3 {
        for (b, p) in best.iter_mut().zip(arms) {
            let (c, q) = cost(p, n);
            *b = (b.0.min(c), b.1.min(q));
        }
    }
    let [(ec, ep), (sc, sp), (cc, cp), (wc, wp)] = best;
    println!("chaining (STEPWISE_PROFILER_CHAIN={chained}, asking for the same events), best of 3 × 5 × {n} (ns):");
    for (what, e, s, c, w) in [("calling thread", ec, sc, cc, wc), ("proxy thread  ", ep, sp, cp, wp)] {
        println!("  {what}: empty {e:7.1}  stepwise {s:7.1}  chained alone {c:7.1}  stepwise+chained {w:7.1}  forwarding cost {:7.1}", w - s - (c - e));
    }
}
