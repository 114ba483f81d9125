//! The built library as NCCL loads it: dlopen, the newest table first, each version's own
//! descriptor layout and init argument order, records out through the sender thread to
//! `STEPWISE_PROFILER_SOCKET`.

use std::{
    ffi::{c_char, c_int, c_void, CStr},
    os::unix::net::UnixDatagram,
    path::PathBuf,
    ptr::null_mut,
    time::{Duration, Instant},
};

use nccl_profiler::wire;

/// `target/<profile>/libnccl_profiler.so`, next to this test's `deps/` directory.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let lib = dir.join("libnccl_profiler.so");
    assert!(
        lib.exists(),
        "{} not built: `cargo test` does not emit the cdylib, run `cargo build -p nccl-profiler` first (`cargo xtask test unit` does)",
        lib.display()
    );
    lib
}

#[repr(C)]
struct CollV4 {
    seq_number: u64,
    func: *const c_char,
    send_buff: *const c_void,
    recv_buff: *mut c_void,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    n_channels: u8,
    n_warps: u8,
    algo: *const c_char,
    proto: *const c_char,
}

/// `ncclProfilerEventDescr_v4_t` as its header declares it: a one-byte `type`.
#[repr(C)]
struct DescrV4 {
    type_: u8,
    parent_obj: *mut c_void,
    rank: c_int,
    coll: CollV4,
}

/// The `kernelCh` member of the descriptor's union (8-aligned, like the union: offset 24).
#[repr(C)]
struct KernelCh {
    channel_id: u8,
    p_timer: u64,
}

#[repr(C)]
struct KernelV4 {
    type_: u8,
    parent_obj: *mut c_void,
    rank: c_int,
    kernel_ch: KernelCh,
}

type InitV4 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int, *const c_char, u64, c_int, c_int, c_int, *const c_void) -> c_int;
type Start = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
type Stop = unsafe extern "C" fn(*mut c_void) -> c_int;
type Record = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
type Fin = unsafe extern "C" fn(*mut c_void) -> c_int;

#[repr(C)]
struct TableV4 {
    name: *const c_char,
    init: InitV4,
    start: Start,
    stop: Stop,
    record: Record,
    finalize: Fin,
}

#[test]
fn the_test_layouts_are_the_headers() {
    assert_eq!(std::mem::offset_of!(KernelV4, kernel_ch), 24);
    assert_eq!(std::mem::offset_of!(DescrV4, coll), 24);
    assert_eq!(std::mem::offset_of!(KernelCh, p_timer), 8);
}

#[test]
fn nccl_finds_every_table_and_a_v4_communicator_reports_its_collectives() {
    let dir = std::env::temp_dir().join(format!("swprof-dl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let sock = dir.join("p.sock");
    let rx = UnixDatagram::bind(&sock).expect("bind");
    rx.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    // Read by the plugin's sender thread when the first communicator is created.
    std::env::set_var("STEPWISE_PROFILER_SOCKET", &sock);
    std::env::set_var("STEPWISE_PROFILER_EVENTS", "coll,kernel");
    let path = std::ffi::CString::new(library().to_str().expect("utf8")).expect("path");
    // SAFETY: dlopen/dlsym of the library under test, as NCCL does (RTLD_NOW | RTLD_LOCAL).
    let t = unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen: {:?}", CStr::from_ptr(libc::dlerror()));
        for v in [c"ncclProfiler_v7", c"ncclProfiler_v6", c"ncclProfiler_v5"] {
            assert!(!libc::dlsym(h, v.as_ptr()).is_null(), "{v:?} exported");
        }
        assert!(libc::dlsym(h, c"ncclProfiler_v3".as_ptr()).is_null(), "no v3 table");
        &*(libc::dlsym(h, c"ncclProfiler_v4".as_ptr()) as *const TableV4)
    };
    // SAFETY: the callbacks in NCCL's v4 order and layouts.
    unsafe {
        assert_eq!(CStr::from_ptr(t.name).to_str(), Ok("Stepwise"));
        let (mut ctx, mut mask) = (null_mut(), 0);
        // v4: (ctx, mask, commName, commHash, nNodes, nranks, rank, logfn).
        assert_eq!((t.init)(&mut ctx, &mut mask, c"c".as_ptr(), 0xC0FFEE, 1, 8, 5, std::ptr::null()), 0);
        assert_eq!(mask, (1 << 1) | (1 << 6), "STEPWISE_PROFILER_EVENTS=coll,kernel");
        let mut d = DescrV4 {
            type_: 1 << 1,
            parent_obj: null_mut(),
            rank: 5,
            coll: CollV4 {
                seq_number: 77,
                func: c"AllGather".as_ptr(),
                send_buff: std::ptr::null(),
                recv_buff: null_mut(),
                count: 1000,
                root: 0,
                datatype: c"ncclBfloat16".as_ptr(),
                n_channels: 1,
                n_warps: 8,
                algo: c"RING".as_ptr(),
                proto: c"LL".as_ptr(),
            },
        };
        let mut coll = null_mut();
        (t.start)(ctx, &mut coll, (&mut d as *mut DescrV4).cast());
        assert!(!coll.is_null());
        (t.stop)(coll);
        let mut k = KernelV4 { type_: 1 << 6, parent_obj: coll, rank: 0, kernel_ch: KernelCh { channel_id: 0, p_timer: 1_000_000 } };
        let mut kh = null_mut();
        (t.start)(ctx, &mut kh, (&mut k as *mut KernelV4).cast());
        let mut end = 1_250_000u64;
        (t.record)(kh, 22, (&mut end as *mut u64).cast());
        (t.stop)(kh);
        (t.finalize)(ctx);
    }
    let mut buf = vec![0u8; 65536];
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < end, "no record arrived");
        let n = rx.recv(&mut buf).expect("a datagram");
        let (h, recs) = wire::decode(&buf[..n]).expect("decode");
        // The progress record sent at the first KernelCh start (FLAG_STARTED) may come first,
        // alone or in the same datagram: the full record is the one to check.
        let Some(r) = recs.iter().find(|r| r.seq == 77 && r.flags & wire::FLAG_STARTED == 0) else { continue };
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.event_mask, (1 << 1) | (1 << 6));
        assert_eq!((r.comm_hash, r.rank, r.nranks, r.bytes), (0xC0FFEE, 5, 8, 2000));
        assert_eq!((wire::name_of(&wire::FUNC_OPS, r.func), wire::name_of(&wire::PROTOS, r.proto)), ("all_gather", "LL"));
        assert_eq!((r.gpu_start_ptimer, r.gpu_end_ptimer, r.flags), (1_000_000, 1_250_000, wire::FLAG_COMPLETE));
        break;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
