use super::*;
use crate::sources::collectives::{decode::Call, history::History};

fn rec(rank: i32, seq: u64, start_ms: u64, end_ms: u64) -> Record {
    Record {
        comm_hash: 0xabcdef,
        seq,
        rank,
        nranks: 4,
        bytes: 4 << 20,
        count: 1 << 20,
        enqueue_ns: 1_000_000_000_000 + start_ms * 1_000_000 - 2_000_000,
        // GPU timer = host − 5 s.
        gpu_start_ptimer: 995_000_000_000 + start_ms * 1_000_000,
        gpu_end_ptimer: 995_000_000_000 + end_ms * 1_000_000,
        offset_ns: 5_000_000_000,
        offset_error_ns: 20_000,
        proxy_wait_ns: [0, 0, 3_000_000, 0, 0, 0],
        requests: [4, 0],
        request_bytes: [4 << 20, 0],
        func: 1,
        datatype: 8,
        algo: 2,
        proto: 3,
        n_channels: 2,
        kernel_stops: 2,
        flags: wire::FLAG_COMPLETE,
    }
}

fn datagram(pid: u32, recs: &[Record], dropped_full: u64) -> Vec<u8> {
    let mut b = Vec::new();
    // The plugin of process 10 found its CUDA device (the driver's spelling: upper case).
    let mut gpu_pci = [0u8; 16];
    if pid == 10 {
        gpu_pci[..12].copy_from_slice(b"0000:B2:00.0");
    }
    let h = Header { pid, nccl_version: 22907, event_mask: 0x5a, dropped_full, dropped_unsent: 0, sent: 0, gpu_pci };
    wire::encode(&h, recs, &mut b);
    b
}

fn peer(pid: u32) -> Option<Peer> {
    Some(Peer { pid, uid: 0 })
}

fn dropped(m: &ProfilerMetrics, reason: &'static str) -> u64 {
    m.dropped.get_or_create(&ReasonLabel { reason }).get()
}

#[test]
fn forged_pids_are_refused_and_a_record_flood_is_bounded_like_markers() {
    let m = ProfilerMetrics::register(&mut Registry::default());
    let mut h = History::new("host-a".into(), 1 << 16);
    // Process 4242 claims to be 0, 1 and 2^32-1: nothing is kept.
    for forged in [0, 1, u32::MAX] {
        handle_datagram(&mut h, &datagram(forged, &[rec(0, 0, 30, 42)], 0), peer(4242), |_| true, &m, 1000.0);
    }
    handle_datagram(&mut h, &datagram(4242, &[rec(0, 0, 30, 42)], 0), None, |_| true, &m, 1000.0);
    // Its own pid, but not a process the agent watches.
    handle_datagram(&mut h, &datagram(4242, &[rec(0, 0, 30, 42), rec(0, 1, 30, 42)], 0), peer(4242), |pid| pid != 4242, &m, 1000.0);
    assert!(h.plugin.procs.is_empty(), "{:?}", h.plugin.procs.keys());
    assert_eq!((dropped(&m, "pid_mismatch"), dropped(&m, "no_credentials"), dropped(&m, "not_selected")), (3, 1, 2));
    // 15 s of 1 000 datagrams/s, 8 records each on a new communicator every datagram.
    let mut sent = 0u64;
    for i in 0..15_000u64 {
        let recs: Vec<Record> = (0..8).map(|k| Record { comm_hash: i, ..rec(0, k, 30, 42) }).collect();
        handle_datagram(&mut h, &datagram(4242, &recs, 0), peer(4242), |_| true, &m, 1000.0 + i as f64 / 1000.0);
        sent += 8;
    }
    let kept = h.plugin.procs[&4242].records;
    let comms: std::collections::BTreeSet<u64> = h.plugin.calls_since(0.0, usize::MAX).filter_map(|c| c.call.comm).map(|c| c.0).collect();
    assert!(kept <= 2 * 4000 + 15 * 4000, "{kept} of {sent} records kept");
    assert!(comms.len() <= 40 + 15 * 20, "{} communicators", comms.len());
    assert_eq!(dropped(&m, "process_rate") + dropped(&m, "new_communicators"), sent - kept);
}

fn uprobe(pid: u32, seq: u64, enter_ns: u64) -> Call {
    Call {
        pid,
        tid: pid,
        library: Lib::Nccl,
        op: "all_reduce".into(),
        bytes: Some(4 << 20),
        comm: Some(CommId(77)),
        comm_global: true,
        rank: Some(0),
        nranks: Some(4),
        seq: Some(seq),
        enter_ns,
        exit_ns: enter_ns + 20_000,
        ret: Some(0),
        aborted: false,
        grouped: false,
    }
}

#[test]
fn plugin_records_replace_the_enqueue_times_of_their_process() {
    let mut reg = Registry::default();
    let m = ProfilerMetrics::register(&mut reg);
    let mut h = History::new("host-a".into(), 64);
    h.clock = ClockMap { offset_ns: 0, error_seconds: 0.0, synchronized: true };
    // Process 10 (plugin) and 11 (no plugin) called all_reduce; 10's host call entered 5 ms
    // before its Coll start callback (the plugin's enqueue time, 1000.028 s: preempted, or a
    // first call that started the stream's worker) and returned after it.
    let mut first = uprobe(10, 0, 1_000_023_000_000);
    first.exit_ns = 1_000_028_010_000;
    h.push_call(first);
    h.push_call(uprobe(11, 0, 1_000_000_000_000));
    handle_datagram(&mut h, &datagram(10, &[rec(0, 0, 30, 42), rec(0, 1, 100, 111)], 3), peer(10), |_| true, &m, 1001.0);
    handle_datagram(&mut h, b"garbage", peer(10), |_| true, &m, 1001.0);
    let calls = h.calls_since(0.0, 100);
    let views: Vec<_> = calls.iter().map(|c| c.view()).collect();
    // Process 10's uprobe call is replaced; 11's stays, timed at enqueue.
    assert_eq!(views.iter().filter(|v| v.pid == 10).count(), 2);
    let other = views.iter().find(|v| v.pid == 11).expect("uprobe call kept");
    assert_eq!(other.clock.timing, Timing::HostEnqueue);
    let g = views.iter().find(|v| v.pid == 10 && v.seq == Some(0)).expect("plugin call");
    assert_eq!(g.clock.timing, Timing::Gpu);
    assert!((g.enter - 1000.030).abs() < 1e-6 && (g.exit - 1000.042).abs() < 1e-6, "{} {}", g.enter, g.exit);
    assert!((g.clock.host_enqueue.expect("enqueue") - 1000.028).abs() < 1e-6);
    assert_eq!(g.clock.gpu_offset_error, Some(20e-6));
    assert_eq!(h.plugin.gpus(), [(10, "0000:b2:00.0".to_string())].into(), "process 10's GPU, in sysfs's spelling");
    let w = g.clock.proxy_wait.clone().expect("waits");
    assert!((w.send_wait - 0.003).abs() < 1e-12);
    assert_eq!((w.send_requests, w.send_bytes, w.recv_requests), (4.0, f64::from(4 << 20), 0.0), "the proxy's requests reach the join");
    assert_eq!((g.op.as_str(), g.library.as_str(), g.bytes, g.rank, g.nranks), ("all_reduce", "nccl", Some(4 << 20), Some(0), Some(4)));
    assert_eq!(g.comm.as_deref(), Some(comm_of(0xabcdef, 1).to_string().as_str()));
    // The API's JSON reads back to the same view (the diagnose fan-out path).
    let via_json: crate::timeline::join::CallView = serde_json::from_value(serde_json::to_value(&calls[0]).expect("json")).expect("view");
    assert_eq!(via_json, calls[0].view());
    // Status and metrics.
    let st = h.plugin.status(1001.0);
    assert_eq!(st["active_gpu"], 1);
    assert_eq!(st["processes"][0]["pid"], 10);
    assert_eq!(st["processes"][0]["dropped_ring_full"], 3);
    m.update(&h.plugin, 1001.0);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
    assert!(text.contains("stepwise_profiler_records_total 2"), "{text}");
    assert!(text.contains("stepwise_profiler_datagrams_refused_total 1"), "{text}");
    assert!(text.contains("stepwise_profiler_plugin_drops_total{reason=\"ring_full\"} 3"), "{text}");
    assert!(text.contains("stepwise_profiler_plugin_processes{timing=\"gpu\"} 1"), "{text}");
    assert!(text.contains("stepwise_proxy_requests_total{comm=\"0000000000abcdef\",direction=\"send\"} 8"), "both records' requests, per communicator: {text}");
    // 30 s later the process no longer counts as active.
    assert_eq!(h.plugin.active(1040.0), (0, 0));
}

#[test]
fn ranks_join_on_the_communicator_hash_and_a_gpu_late_rank_is_the_late_arrival() {
    let host: std::sync::Arc<str> = "h".into();
    let clock = ClockMap::default();
    let mut calls = Vec::new();
    for rank in 0..4 {
        // Every CPU enqueued at the same time; rank 2's GPU reached the collective 30 ms late.
        let start = if rank == 2 { 40 } else { 10 };
        calls.push(call_of(&rec(rank, 5, start, 60), 100 + rank as u32, &host, &clock).view());
    }
    let j = crate::timeline::join_calls(&calls);
    assert_eq!(j.len(), 1);
    assert!(j[0].complete());
    assert!((j[0].skew() - 0.030).abs() < 1e-6, "{}", j[0].skew());
    assert_eq!(j[0].late_rank().map(|a| a.rank), Some(2));
    assert!(!j[0].host_enqueue_timed());
}

#[test]
fn kernel_less_records_are_enqueue_timed() {
    let mut r = rec(0, 1, 10, 20);
    r.gpu_start_ptimer = 0;
    r.gpu_end_ptimer = 0;
    r.flags = wire::FLAG_NO_KERNEL;
    let c = call_of(&r, 5, &"h".into(), &ClockMap::default());
    assert_eq!(c.clock.timing, Timing::HostEnqueue);
    assert_eq!(c.enter, c.exit);
    assert_eq!(c.clock.host_enqueue, None);
}

#[test]
fn binding_refuses_a_live_socket_and_replaces_a_stale_one() {
    let dir = std::env::temp_dir().join(format!("sw-prof-rx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("sub/p.sock");
    let a = Receiver::bind(&path).expect("first bind (creates the directory)");
    let e = Receiver::bind(&path).err().expect("second bind refused");
    assert!(e.contains("in use"), "{e}");
    drop(a);
    // The file stays behind with nobody listening: replaced.
    assert!(path.exists());
    let b = Receiver::bind(&path).expect("stale socket replaced");
    drop(b);
    let e = Receiver::bind(Path::new("/proc/nope/p.sock")).err().expect("unbindable");
    assert!(e.contains("/proc/nope"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The attribution hook: enqueue-timed NCCL arrivals charge no skew and name no rank; GPU
/// arrivals do.
#[test]
fn attribution_charges_skew_from_gpu_times_never_from_enqueue_times() {
    use crate::{
        attribution::{attribute, CauseKind, Params, StepData},
        timeline::{join::Arrival, Collective, Step, StepSource},
    };
    let coll = |timing: Timing| Collective {
        comm: "c".into(),
        seq: 0,
        op: "all_reduce".into(),
        library: "nccl".into(),
        bytes: Some(4096),
        nranks: Some(4),
        arrivals: (0..4u32)
            .map(|rank| {
                // Rank 3 is 30 ms late by these times; the call lasts until 51 ms.
                let enter = if rank == 3 { 0.050 } else { 0.020 };
                let proxy_wait = (timing == Timing::Gpu).then_some(Box::new(ProxyWait { send_wait: 0.002, ..Default::default() }));
                Arrival { rank, host: "a".into(), pid: rank, enter, exit: 0.051, aborted: false, clock: Clocking { timing, proxy_wait, ..Default::default() } }
            })
            .collect(),
    };
    let step = Step { id: 1, begin: 0.0, end: 0.052, source: StepSource::Markers, ranks: Default::default() };
    let run = |c: &Collective| {
        attribute(&StepData { step: &step, collectives: &[c], windows: &[vec![]], net: &[], same_host: &[], dropped_events: false }, &Params::default())
    };
    let gpu = run(&coll(Timing::Gpu));
    assert!((gpu.cause(CauseKind::ReadinessSkew) - 0.030).abs() < 1e-9);
    assert_eq!(gpu.causes.iter().find(|c| c.kind == CauseKind::ReadinessSkew).and_then(|c| c.rank), Some(3));
    assert_eq!(gpu.timing, "gpu");
    let inflight = gpu.causes.iter().find(|c| c.kind == CauseKind::InFlightLimit).expect("cause");
    assert_eq!(inflight.evidence["nccl_proxy_wait_seconds"]["send_wait"], 0.008, "4 ranks × 2 ms");
    let enq = run(&coll(Timing::HostEnqueue));
    assert_eq!(enq.cause(CauseKind::ReadinessSkew), 0.0);
    assert!(enq.causes.iter().all(|c| c.rank.is_none()), "no straggler named from enqueue times");
    assert!(enq.ranks.iter().all(|r| r.late_seconds == 0.0 && r.wait_seconds == 0.0));
    assert_eq!(enq.timing, "host_enqueue");
    let skew = enq.causes.iter().find(|c| c.kind == CauseKind::ReadinessSkew).expect("cause");
    assert!((skew.evidence["host_enqueue_skew_seconds"].as_f64().expect("figure") - 0.030).abs() < 1e-9);
    assert!(enq.notes.iter().any(|n| n.contains("host-only timing") && n.contains("30.0 ms")), "{:?}", enq.notes);
    let sum: f64 = enq.causes.iter().map(|c| c.seconds).sum();
    assert!((sum - 0.052).abs() < 1e-12, "the parts still sum to the step");
}

#[test]
fn the_plugin_is_installed_whole_by_rename() {
    let dir = std::env::temp_dir().join(format!("sw-prof-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let src = dir.join("src.so");
    std::fs::write(&src, b"new plugin").expect("src");
    let dst = dir.join("host/run/libnccl-profiler-stepwise.so");
    install_plugin(&src, &dst).expect("first install creates the directory");
    // A job holding the old file open keeps its contents; the path gets the new one.
    let held = std::fs::File::open(&dst).expect("open");
    std::fs::write(&src, b"newer plugin").expect("src");
    install_plugin(&src, &dst).expect("reinstall");
    assert_eq!(std::fs::read(&dst).expect("read"), b"newer plugin");
    let mut old = String::new();
    std::io::Read::read_to_string(&mut &held, &mut old).expect("read held");
    assert_eq!(old, "new plugin");
    assert_eq!(std::fs::read_dir(dst.parent().expect("dir")).expect("ls").count(), 1, "no temporary file left");
    let e = install_plugin(&dir.join("missing.so"), &dst).expect_err("missing source");
    assert!(e.contains("missing.so"), "{e}");
    assert!(bundled_plugin().expect("path").ends_with("lib/stepwise/libnccl-profiler-stepwise.so"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_says_whether_an_agent_listens_and_what_would_be_installed() {
    let dir = std::env::temp_dir().join(format!("sw-prof-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = crate::config::CollectivesConfig { profiler_socket: dir.join("p.sock"), ..Default::default() };
    let (ok, d) = check(&cfg);
    assert!(ok && d.contains("not bound now"), "{d}");
    let rx = Receiver::bind(&cfg.profiler_socket).expect("bind");
    let (ok, d) = check(&cfg);
    assert!(ok && d.contains("an agent listens"), "{d}");
    drop(rx);
    // The test binary has no lib/stepwise/ next to it: nothing to install is a warning.
    let cfg = crate::config::CollectivesConfig { profiler_plugin_install: dir.join("lib.so"), ..cfg };
    let (ok, d) = check(&cfg);
    assert!(!ok && d.contains("is missing"), "{d}");
    let off = crate::config::CollectivesConfig { profiler_socket: PathBuf::new(), ..Default::default() };
    assert!(check(&off).1.contains("timed at enqueue"));
    let _ = std::fs::remove_dir_all(&dir);
}
