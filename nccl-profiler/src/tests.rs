//! The callbacks driven as NCCL drives them (profiler.cc / transport/profiler.cc), on a
//! context with its own ring.

use std::{mem::offset_of, ptr::null_mut};

use super::*;
use crate::{ring::Ring, wire::*};

fn ring() -> &'static Ring {
    Box::leak(Box::new(Ring::new(4096)))
}

#[test]
fn descriptor_layouts_match_the_headers() {
    assert_eq!(offset_of!(Descr<u64>, parent_obj), 8);
    assert_eq!(offset_of!(Descr<u64>, rank), 16);
    assert_eq!(offset_of!(Descr<u64>, u), 24);
    assert_eq!(offset_of!(Descr<u8>, parent_obj), 8);
    assert_eq!(offset_of!(Descr<u8>, u), 24);
    assert_eq!(offset_of!(CollDescr, func), 8);
    assert_eq!(offset_of!(CollDescr, count), 32);
    assert_eq!(offset_of!(CollDescr, root), 40);
    assert_eq!(offset_of!(CollDescr, datatype), 48);
    assert_eq!(offset_of!(CollDescr, n_channels), 56);
    assert_eq!(offset_of!(CollDescr, n_warps), 57);
    assert_eq!(offset_of!(CollDescr, algo), 64);
    assert_eq!(offset_of!(CollDescr, proto), 72);
    assert_eq!(offset_of!(KernelChDescr, p_timer), 8);
    // profiler_v5.h / _v6.h collApi: func, count, datatype, root, stream, graphCaptured.
    assert_eq!(offset_of!(CollApiDescr, root), 24);
    assert_eq!(offset_of!(CollApiDescr, stream), 32);
    assert_eq!(offset_of!(CollApiDescr, graph_captured), 40);
}

fn coll_api(graph_captured: bool) -> Descr<u64> {
    let api = CollApiDescr { func: c"AllReduce".as_ptr(), count: 1 << 20, datatype: c"ncclFloat32".as_ptr(), root: 0, stream: null_mut(), graph_captured };
    Descr { type_: events::EV_COLL_API, parent_obj: null_mut(), rank: 0, u: DescrUnion { coll_api: api } }
}

/// NCCL 2.30.7 under CUDA graphs: the CollApi event at capture (graphCaptured), stopped; at
/// each replay a Coll event whose parent is that same CollApi handle, then its kernel.
#[test]
fn a_replayed_collective_is_flagged_graph_and_an_ordinary_one_is_not() {
    let r = ring();
    let ctx = Context::new(7, 0, 2, EV_COLL | EV_KERNEL_CH, r).cast::<c_void>();
    // SAFETY: the callbacks with this test's context, in NCCL's order.
    unsafe {
        let captured = start(ctx, &mut coll_api(true));
        let plain = start(ctx, &mut coll_api(false));
        assert!(!captured.is_null() && !plain.is_null() && captured != plain, "non-null: NCCL advances seqNumber at replay only then");
        (ncclProfiler_v5.stop_event)(captured);
        (ncclProfiler_v5.stop_event)(plain);
        for (seq, parent, want) in [(0, captured, FLAG_GRAPH), (1, captured, FLAG_GRAPH), (2, plain, 0)] {
            let mut d = coll_descr(seq, 1);
            d.parent_obj = parent;
            let coll = start(ctx, &mut d);
            (ncclProfiler_v5.stop_event)(coll);
            let k = start(ctx, &mut child(EV_KERNEL_CH, coll, 1_000 + seq));
            let started = r.pop().expect("progress record");
            assert_eq!(started.flags, FLAG_STARTED | want, "seq {seq}");
            let mut end = 2_000 + seq;
            (ncclProfiler_v5.record_event_state)(k, STATE_KERNEL_CH_STOP, (&mut end as *mut u64).cast());
            (ncclProfiler_v5.stop_event)(k);
            let rec = r.pop().expect("record");
            assert_eq!((rec.seq, rec.flags), (seq, FLAG_COMPLETE | want));
        }
        (ncclProfiler_v5.finalize)(ctx);
    }
}

fn coll_descr(seq: u64, n_channels: u8) -> Descr<u64> {
    Descr {
        type_: EV_COLL,
        parent_obj: null_mut(),
        rank: 1,
        u: DescrUnion {
            coll: CollDescr {
                seq_number: seq,
                func: c"AllReduce".as_ptr(),
                send_buff: std::ptr::null(),
                recv_buff: null_mut(),
                count: 1 << 20,
                root: 0,
                datatype: c"ncclFloat32".as_ptr(),
                n_channels,
                n_warps: 16,
                algo: c"RING".as_ptr(),
                proto: c"SIMPLE".as_ptr(),
            },
        },
    }
}

fn child(ty: u64, parent: *mut c_void, p_timer: u64) -> Descr<u64> {
    Descr { type_: ty, parent_obj: parent, rank: 0, u: DescrUnion { kernel_ch: KernelChDescr { channel_id: 0, p_timer } } }
}

unsafe fn start(ctx: *mut c_void, d: &mut Descr<u64>) -> *mut c_void {
    let mut h = null_mut();
    // SAFETY: a context of this test and descriptors built as NCCL does.
    assert_eq!(unsafe { (ncclProfiler_v5.start_event)(ctx, &mut h, d) }, 0);
    h
}

#[test]
fn a_collective_is_recorded_when_its_last_channel_stops() {
    let r = ring();
    let ctx = Context::new(0xfeed, 1, 4, choose_mask(22907, None), r).cast::<c_void>();
    // SAFETY: the callbacks with this test's context, in NCCL's order.
    unsafe {
        let coll = start(ctx, &mut coll_descr(41, 2));
        assert!(!coll.is_null());
        (ncclProfiler_v5.stop_event)(coll); // enqueued
        assert!(r.pop().is_none(), "the enqueue is not the end");
        let op = start(ctx, &mut child(EV_PROXY_OP, coll, 0));
        let step = start(ctx, &mut child(EV_PROXY_STEP, op, 0));
        assert!(!op.is_null() && !step.is_null());
        let mut size = 0usize;
        (ncclProfiler_v5.record_event_state)(step, 8, (&mut size as *mut usize).cast()); // SendGPUWait
        size = 1 << 20;
        (ncclProfiler_v5.record_event_state)(step, 9, (&mut size as *mut usize).cast()); // SendWait
        std::thread::sleep(std::time::Duration::from_millis(3));
        (ncclProfiler_v5.stop_event)(step);
        // A receive step: posted (RecvWait), data in (RecvFlushWait, transSize), to the GPU.
        let recv = start(ctx, &mut child(EV_PROXY_STEP, op, 1));
        (ncclProfiler_v5.record_event_state)(recv, 10, (&mut size as *mut usize).cast());
        size = 1 << 19;
        (ncclProfiler_v5.record_event_state)(recv, 11, (&mut size as *mut usize).cast());
        (ncclProfiler_v5.record_event_state)(recv, 12, (&mut size as *mut usize).cast());
        (ncclProfiler_v5.stop_event)(recv);
        (ncclProfiler_v5.stop_event)(op);
        let now = crate::clock::realtime_ns();
        let k0 = start(ctx, &mut child(EV_KERNEL_CH, coll, 5_000_200));
        // The first channel's start is sent at once: the GPU reached the collective.
        let started = r.pop().expect("a progress record at the first channel's start");
        assert_eq!((started.seq, started.flags, started.gpu_start_ptimer, started.gpu_end_ptimer), (41, FLAG_STARTED, 5_000_200, 0));
        let k1 = start(ctx, &mut child(EV_KERNEL_CH, coll, 5_000_100));
        assert!(r.pop().is_none(), "one progress record per collective");
        let mut end = 9_000_000u64;
        (ncclProfiler_v5.record_event_state)(k0, STATE_KERNEL_CH_STOP, (&mut end as *mut u64).cast());
        (ncclProfiler_v5.stop_event)(k0);
        assert!(r.pop().is_none(), "one of two channels stopped");
        let mut end = 9_500_000u64;
        (ncclProfiler_v5.record_event_state)(k1, STATE_KERNEL_CH_STOP, (&mut end as *mut u64).cast());
        (ncclProfiler_v5.stop_event)(k1);
        let rec = r.pop().expect("record after the last channel");
        assert_eq!((rec.comm_hash, rec.seq, rec.rank, rec.nranks), (0xfeed, 41, 1, 4));
        assert_eq!(rec.bytes, 4 << 20);
        assert_eq!((name_of(&FUNC_OPS, rec.func), name_of(&ALGOS, rec.algo), name_of(&PROTOS, rec.proto)), ("all_reduce", "RING", "SIMPLE"));
        assert_eq!((rec.gpu_start_ptimer, rec.gpu_end_ptimer), (5_000_100, 9_500_000));
        assert_eq!((rec.n_channels, rec.kernel_stops, rec.flags), (2, 2, FLAG_COMPLETE));
        assert!(rec.proxy_wait_ns[2] >= 3_000_000, "send_wait {}", rec.proxy_wait_ns[2]);
        assert_eq!((rec.requests, rec.request_bytes), ([1, 1], [1 << 20, 1 << 19]), "one send request of 1 MiB, one receive of 512 KiB");
        // Offset ≈ host − pTimer at the callbacks: the GPU start maps to about `now`.
        let host = rec.gpu_start_host_ns().expect("mapped");
        assert!((host - now as i128).abs() < 50_000_000, "{host} vs {now}");
        assert!(r.pop().is_none(), "sent once");
        (ncclProfiler_v5.finalize)(ctx);
    }
}

#[test]
fn evicted_and_kernel_less_collectives_still_go_out() {
    let r = ring();
    let ctx = Context::new(1, 0, 2, EV_COLL | EV_KERNEL_CH, r).cast::<c_void>();
    // SAFETY: as above.
    unsafe {
        for seq in 0..=events::COLL_SLOTS as u64 {
            let h = start(ctx, &mut coll_descr(seq, 1));
            (ncclProfiler_v5.stop_event)(h);
        }
        let rec = r.pop().expect("the first slot was reused");
        assert_eq!((rec.seq, rec.flags, rec.gpu_start_ptimer), (0, FLAG_EVICTED, 0));
        (ncclProfiler_v5.finalize)(ctx);
        // Finalize sends the ones still pending.
        assert_eq!(std::iter::from_fn(|| r.pop()).count(), events::COLL_SLOTS);
    }
    let ctx = Context::new(2, 0, 2, EV_COLL, r).cast::<c_void>();
    // SAFETY: as above.
    unsafe {
        let h = start(ctx, &mut coll_descr(7, 1));
        (ncclProfiler_v5.stop_event)(h);
        let rec = r.pop().expect("sent at enqueue without KernelCh events");
        assert_eq!((rec.seq, rec.flags), (7, FLAG_NO_KERNEL));
        assert!(rec.enqueue_ns > 0);
        (ncclProfiler_v5.finalize)(ctx);
    }
}

#[test]
fn unknown_events_and_nulls_are_ignored() {
    let r = ring();
    let ctx = Context::new(3, 0, 2, EV_COLL | EV_KERNEL_CH, r).cast::<c_void>();
    // SAFETY: as above, plus the null cases NCCL may produce.
    unsafe {
        // A KernelCh of a p2p task (parent null) gets no handle; stopping null is harmless.
        assert!(start(ctx, &mut child(EV_KERNEL_CH, null_mut(), 5)).is_null());
        assert_eq!((ncclProfiler_v5.stop_event)(null_mut()), 0);
        assert_eq!((ncclProfiler_v5.record_event_state)(null_mut(), 22, null_mut()), 0);
        assert!(start(ctx, &mut child(1 << 8, null_mut(), 0)).is_null()); // GroupApi
        assert_eq!((ncclProfiler_v5.start_event)(ctx, null_mut(), null_mut()), 0);
        let mut h = null_mut();
        assert_eq!((ncclProfiler_v5.start_event)(null_mut(), &mut h, &mut coll_descr(0, 1)), 0);
        assert!(h.is_null());
        (ncclProfiler_v5.finalize)(ctx);
    }
    assert!(r.pop().is_none());
}

#[test]
fn the_event_mask_follows_the_nccl_version_and_the_environment() {
    let all = EV_COLL | EV_KERNEL_CH | EV_PROXY_OP | EV_PROXY_STEP;
    assert_eq!(choose_mask(22907, None), all);
    assert_eq!(choose_mask(23007, Some("auto")), all);
    assert_eq!(choose_mask(23104, None), EV_COLL, "2.31.x: KernelCh costs too much");
    assert_eq!(choose_mask(23200, None), all);
    assert_eq!(choose_mask(23104, Some("coll,kernel")), EV_COLL | EV_KERNEL_CH);
    assert_eq!(choose_mask(22907, Some("proxy")), EV_COLL | EV_PROXY_OP | EV_PROXY_STEP);
}

#[test]
fn a_communicator_preallocates_640_kib() {
    let bytes = events::COLL_SLOTS * std::mem::size_of::<events::CollSlot>() + events::STEP_SLOTS * std::mem::size_of::<events::StepSlot>();
    assert_eq!(std::mem::size_of::<events::CollSlot>(), 192);
    assert_eq!(std::mem::size_of::<events::StepSlot>(), 64);
    assert_eq!(bytes, 640 << 10, "docs/profiler-plugin.md says 640 KiB");
}

#[test]
fn the_v7_layouts_match_profiler_v7_h() {
    assert_eq!(offset_of!(CollDescrV7, parent_group), 80);
    assert_eq!(offset_of!(CollDescrV7, kernel_variant), 88);
    assert_eq!(offset_of!(CollDescrV7, is_sym_coll), 96);
    assert_eq!(offset_of!(CollDescrV7, user_tag), 104);
    assert_eq!(std::mem::size_of::<CollDescrV7>(), 112);
    assert_eq!(offset_of!(KernelPhaseDescr, phase_name), 8);
    assert_eq!(offset_of!(KernelPhaseDescr, p_timer), 16);
    // The descriptor sizes the chained plugin's copy relies on: header + largest member.
    assert_eq!(descr_size(7), OFF_UNION + std::mem::size_of::<CollDescrV7>());
    assert_eq!(descr_size(6), OFF_UNION + offset_of!(CollDescrV7, kernel_variant));
    assert_eq!(descr_size(4), OFF_UNION + std::mem::size_of::<CollDescr>());
    assert_eq!(OFF_COLL_PARENT_GROUP, OFF_UNION + offset_of!(CollDescrV7, parent_group));
}

#[test]
fn each_version_knows_its_types_and_states() {
    assert_eq!(types_of(4), 0xff, "Group..NetPlugin");
    assert_eq!(types_of(5) & (1 << 9), 1 << 9, "CollApi from v5");
    assert_eq!(types_of(6) & (1 << 12), 1 << 12, "CeColl from v6");
    assert_eq!(types_of(6) & (1 << 15), 0, "KernelPhase only in v7");
    assert_eq!(types_of(7) & (1 << 15), 1 << 15);
    assert!(state_in(4, 22) && !state_in(4, 23) && state_in(5, 24) && !state_in(5, 25));
    assert!(state_in(6, 30) && !state_in(6, 31) && state_in(7, 31));
}

#[test]
fn a_chained_plugin_gets_the_parents_nccl_starts_for_its_mask() {
    use chain::delivered;
    // Coll: its Group and the API events above it; no P2p, no proxy or kernel events.
    assert_eq!(delivered(EV_COLL), EV_COLL | 1 | (1 << 8) | (1 << 9));
    // KernelCh: Coll and P2p tasks are its parents, with their Group and API events.
    assert_eq!(delivered(EV_KERNEL_CH), EV_KERNEL_CH | EV_COLL | (1 << 2) | 1 | (1 << 8) | (1 << 9) | (1 << 10));
    // ProxyStep: its ProxyOp too.
    assert_eq!(delivered(EV_PROXY_STEP) & EV_PROXY_OP, EV_PROXY_OP);
    // ProxyCtrl and KernelLaunch alone: themselves (KernelLaunch under a GroupApi).
    assert_eq!(delivered(1 << 5), 1 << 5);
    assert_eq!(delivered(1 << 11), (1 << 11) | (1 << 8));
    assert_eq!(delivered(0), 0);
}

/// `ncclProfilerEventDescr_v7_t` with its `coll` member.
#[repr(C)]
struct DescrV7 {
    type_: u64,
    parent_obj: *mut c_void,
    rank: i32,
    coll: CollDescrV7,
}

#[test]
fn a_v7_collective_reads_as_v6() {
    let r = ring();
    let ctx = Context::new(0xabc, 0, 2, EV_COLL, r).cast::<c_void>();
    let mut d = DescrV7 {
        type_: EV_COLL,
        parent_obj: null_mut(),
        rank: 0,
        coll: CollDescrV7 {
            // SAFETY: a plain-data copy of the v6 test descriptor's `coll` member.
            base: unsafe { coll_descr(9, 1).u.coll },
            parent_group: null_mut(),
            kernel_variant: c"Default".as_ptr(),
            is_sym_coll: true,
            user_tag: u64::MAX,
        },
    };
    assert_eq!(offset_of!(DescrV7, coll), OFF_UNION);
    // SAFETY: the v7 table's callbacks with this test's context and a v7 descriptor.
    unsafe {
        let mut h = null_mut();
        assert_eq!((ncclProfiler_v7.start_event)(ctx, &mut h, (&mut d as *mut DescrV7).cast()), 0);
        (ncclProfiler_v7.stop_event)(h);
        let rec = r.pop().expect("a Coll-only collective is sent at enqueue");
        assert_eq!((rec.seq, rec.bytes, wire::name_of(&FUNC_OPS, rec.func)), (9, 4 << 20, "all_reduce"));
        (ncclProfiler_v7.finalize)(ctx);
    }
}

#[test]
fn chaining_preallocates_512_kib_per_communicator() {
    assert_eq!(std::mem::size_of::<chain::Link>(), 32);
    let bytes = (chain::PARENT_LINKS + chain::LEAF_LINKS) * std::mem::size_of::<chain::Link>();
    assert_eq!(bytes, 512 << 10, "docs/profiler-plugin.md says 512 KiB");
}
