//! Congestion on RDMA counters nobody injected (issue 31): the RDMA counters of an mlx5-shaped
//! sysfs tree MIRROR a real job's rail. Two namespace servers are joined by four 10 Mbit/s TBF
//! rails; a 2-rank NCCL-ABI all-reduce job (one rank per server, asynchronous with the profiler
//! plugin) runs over rail 1, and an unrelated bulk TCP flow (a Python sender the agent does
//! not trace) shares that rail for a few seconds. Server 0's agent reads no netdev, qdisc or
//! TCP counter: only the fixture's four ConnectX-7 ports, whose netdevs carry the rails'
//! names. A writer thread inside server 0's namespace plays their hardware every 5 ms:
//!
//! - `port_xmit_data` / `port_rcv_data` (4-byte words): the veth's real tx/rx bytes since the
//!   previous tick (`/proc/thread-self/net/dev`);
//! - `port_xmit_wait` (4 ns ticks): the time the rail's real TBF qdisc held a backlog (data
//!   pending, not sent), from an `RTM_GETQDISC` dump.
//!
//! PFC pause duration is not mirrored: mlx5 reports it only through the ethtool ioctl
//! (`rx_prio{p}_pause_duration`, docs/platform-facts.md §2), which a sysfs tree cannot serve.
//!
//! As on a real RDMA port, no socket shows the job's own bytes: the agent infers the other
//! traffic from what the ring should have put on the NIC (docs/models.md §4.4). One rank per
//! host keeps that exact; an 8-rank hierarchical job's flow steps read ~26 % short there.
//!
//! The steps inside the flow name `congestion` with rail 1's transmit wait as evidence, the
//! median step within 15 % of its extra time over the clean steps (as e2e_other_traffic.rs);
//! the clean steps stay under 7.5 % congestion. Both agents sample every 10 ms
//! (`scenarios::agent_config_10ms`); server 0's reads only the fixture (see `servers`: the
//! fixture's files are replaced, not updated in place as sysfs's are, which the fast lane
//! would re-list at each read).

use std::{
    collections::BTreeMap,
    fs::File,
    os::fd::AsRawFd,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use netlink_packet_route::{tc::TcMessage, RouteNetlinkMessage};
use serde_json::Value;
use stepwise::sources::{netdev::rtnl::Rtnl, qdisc::parse_qdisc};
use stepwise_tests::{
    flows::{self, allreduce_s, bulk_flow, flow_span, steps_of},
    scenario::{memory_dir, Scenario, WAIT_TICKS_PER_SECOND},
    scenarios::{agent_config_10ms, cause, cause_seconds, median, rail_addr, rail_dev, start_job, summarize, top_problem, within, RankSpec, Servers, Shape},
    workloads,
};

const MBIT: u32 = 10;
const COMPUTE_US: u64 = 50_000;
const RAILS: usize = 4;
/// The rail the job and the bulk flow share.
const RAIL: usize = 1;
const BYTES: u64 = 256 * 1024;

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64()
}

/// The rails' cumulative (tx, rx) bytes from `/proc/thread-self/net/dev` (the calling
/// thread's network namespace).
fn rail_bytes() -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev").expect("net/dev");
    (0..RAILS)
        .map(|i| {
            let dev = rail_dev(i);
            let line = text.lines().find_map(|l| l.trim_start().strip_prefix(&format!("{dev}:"))).unwrap_or_else(|| panic!("{dev} not in net/dev"));
            let f: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (f[8], f[0])
        })
        .collect()
}

/// Each rail's root qdisc backlog in bytes, by rail index.
fn rail_backlogs(rtnl: &mut Rtnl, ifindex: &[u32]) -> Vec<u64> {
    let dump = rtnl.dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default())).expect("qdisc dump");
    let mut out = vec![0; RAILS];
    for m in &dump.messages {
        let RouteNetlinkMessage::NewQueueDiscipline(tc) = m else { continue };
        let Some(q) = parse_qdisc(tc).filter(|q| q.parent == "root") else { continue };
        if let Some(i) = ifindex.iter().position(|&x| x == q.ifindex) {
            out[i] = u64::from(q.backlog_bytes);
        }
    }
    out
}

/// What the mirror did: ticks written, the largest tick, transmit-wait ticks per rail.
#[derive(Debug, Default)]
struct Mirrored {
    ticks: u64,
    max_tick: Duration,
    wait_ticks: Vec<u64>,
}

/// The writer: enters `ns`, then every 5 ms moves each fixture port's counters by what its
/// rail did since the previous tick.
fn mirror(ns: String, mut sc: Scenario, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Mirrored> {
    std::thread::spawn(move || {
        let fd = File::open(Path::new("/run/netns").join(&ns)).expect("netns");
        // SAFETY: setns(2) on an open namespace descriptor changes only this thread's network
        // namespace; setpriority on this thread's own id changes nothing else. The writer
        // plays hardware, whose counters move with no delay: it runs ahead of the job and the
        // agent for the CPU (best effort).
        unsafe {
            assert_eq!(libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET), 0, "setns: {}", std::io::Error::last_os_error());
            libc::setpriority(libc::PRIO_PROCESS, libc::syscall(libc::SYS_gettid) as libc::id_t, -10);
        }
        let ifindex: Vec<u32> = (0..RAILS)
            .map(|i| {
                let name = std::ffi::CString::new(rail_dev(i)).expect("name");
                // SAFETY: a NUL-terminated name; the lookup runs in this thread's namespace.
                unsafe { libc::if_nametoindex(name.as_ptr()) }
            })
            .collect();
        assert!(ifindex.iter().all(|&i| i > 0), "rails in {ns}: {ifindex:?}");
        let mut rtnl = Rtnl::open().expect("rtnetlink");
        let (mut bytes, mut queued) = (rail_bytes(), rail_backlogs(&mut rtnl, &ifindex));
        let mut m = Mirrored { wait_ticks: vec![0; RAILS], ..Default::default() };
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            let dt = last.elapsed();
            last = Instant::now();
            let (b, q) = (rail_bytes(), rail_backlogs(&mut rtnl, &ifindex));
            // Data pending while the qdisc held a backlog: half the tick for each end of it
            // that saw one.
            let wait: Vec<u64> =
                (0..RAILS).map(|i| ((u8::from(queued[i] > 0) + u8::from(q[i] > 0)) as f64 / 2.0 * dt.as_secs_f64() * WAIT_TICKS_PER_SECOND) as u64).collect();
            sc.step(dt, |n| {
                let i = n.index;
                n.tx_bytes(b[i].0 - bytes[i].0).rx_bytes(b[i].1 - bytes[i].1).xmit_wait(wait[i]);
            })
            .expect("fixture tick");
            for (acc, w) in m.wait_ticks.iter_mut().zip(&wait) {
                *acc += w;
            }
            (bytes, queued) = (b, q);
            m.ticks += 1;
            m.max_tick = m.max_tick.max(last.elapsed() + dt);
        }
        m
    })
}

/// Server 0's agent on the fixture (its RDMA ports only: no netdev, qdisc or TCP counters),
/// server 1's as in e2e_other_traffic.rs; both with the rails' TBF rate.
fn servers(dir: &Path, sys: &Path) -> Servers {
    let mut s = Servers::new(RAILS, 9000, Some(Shape::mbit(MBIT, 16, 1024))).expect("servers (root, iproute2)");
    let rate = s.shape.as_ref().expect("shaped").agent_rate();
    let rates: BTreeMap<String, String> = (0..s.rails).map(|i| (rail_dev(i), rate.clone())).collect();
    for k in 0..2 {
        let mut cfg = agent_config_10ms(s.ns(k), dir, k, Some(&dir.join(format!("markers-{k}.sock"))), &rates, false);
        if k == 0 {
            // The fixture's RDMA ports alone, swept every 10 ms: the fixture's writer replaces
            // its files (rename) every 5 ms, which the fast lane must re-list and reopen at
            // each read — a cost real sysfs, updated in place, never has — so at the shipped
            // defaults its budget spaces the reads ~10× wider than on a real port.
            let rdma_only = "[sources]\nrdma = false\nethtool = false\ntcp_cpu_budget = 1.0\n";
            assert!(cfg.contains(rdma_only), "{cfg}");
            cfg = format!(
                "sysfs_root = \"{}\"\n{}",
                sys.display(),
                cfg.replace(rdma_only, "[sources]\nethtool = false\nnetdev = false\nqdisc = false\ntcp = false\n")
            );
        }
        s.start_agent(k, dir, &cfg).expect("agent starts");
    }
    s
}

/// A 2-rank all-reduce job, one rank per server, over rail 1 (`NCCL_IB_HCA` names that port,
/// as an RDMA job's environment would), asynchronous with the profiler plugin, started (not
/// waited). One rank per host: what a ring puts on each host's NIC is exact (the agent
/// infers other traffic on an RDMA NIC from it: no socket shows RDMA's own bytes).
fn start(s: &Servers, dir: &Path, steps: u64) -> stepwise_tests::scenarios::Job {
    let peers: Vec<String> = (0..2).map(|k| rail_addr(k, RAIL).to_string()).collect();
    let plugin = workloads::profiler_plugin().expect("profiler plugin");
    let ranks: Vec<RankSpec> = (0..2u32)
        .map(|r| {
            let server = r as usize;
            let env = vec![
                ("NCCL_ABI_ALGO".into(), "ring".into()),
                ("NCCL_ABI_HOST".into(), format!("server{server}")),
                ("NCCL_ABI_LOCAL_SIZE".into(), "1".into()),
                ("NCCL_ABI_IFACE_ADDR".into(), rail_addr(server, RAIL).to_string()),
                ("NCCL_ABI_PEER_ADDRS".into(), peers.join(",")),
                ("NCCL_IB_HCA".into(), format!("=mlx5_{RAIL}:1")),
            ];
            flows::async_rank(s, dir, &plugin, server, r, env)
        })
        .collect();
    start_job("ring2", dir, &ranks, &flows::job_args(steps, BYTES, COMPUTE_US)).expect("job starts")
}

/// One scenario at a time: tests in this binary time jobs on a 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_bulk_flow_on_a_rail_is_congestion_on_the_rdma_counters_that_mirror_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    workloads::build().expect("workloads");
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = tempfile::Builder::new().prefix("stepwise-mirror-").tempdir_in(memory_dir()).expect("fixture dir");
    let sys = fixture.path().join("sys");
    // Four ConnectX-7 ports whose netdevs are the rails: the agent links the ranks' sockets
    // and NCCL_IB_HCA to the same NICs, whose counters are the fixture's.
    let mut sc = Scenario::new(&sys).host_dgx(RAILS);
    for i in 0..RAILS {
        sc.nic_mut(i).netdev = rail_dev(i);
    }
    sc.write().expect("fixture");
    let s = servers(dir.path(), &sys);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = mirror(s.ns(0).to_string(), sc, stop.clone());
    let steps_n = 40;
    let t0 = now();
    let job = start(&s, dir.path(), steps_n);
    let (_rx, mut tx) = bulk_flow(&s, dir.path(), RAIL, 1.5, 4.0);
    let out = job.wait(Duration::from_secs(90)).expect("job");
    let t1 = now();
    let (f0, f1) = flow_span(&mut tx);
    let steps = steps_of(&s, t0, t1, steps_n as usize);
    stop.store(true, Ordering::Relaxed);
    let m = writer.join().expect("mirror");
    let ar = allreduce_s(&out, 1);
    // Inside: the step's span within the flow; clean: ended before it, or began 1.5 s after
    // it (the rail's 1 MiB queue drained), from step 2 on (step 0 is the connections' slow
    // start), as in e2e_other_traffic.rs.
    let span = |st: &Value| (st["begin"].as_f64().expect("begin"), st["end"].as_f64().expect("end"));
    let inside: Vec<&Value> = steps.values().filter(|st| span(st).0 >= f0 + 0.05 && span(st).1 <= f1).collect();
    let clean: Vec<&Value> = steps.iter().filter(|(id, st)| **id > 1 && (span(st).1 < f0 || span(st).0 > f1 + 1.5)).map(|(_, st)| st).collect();
    eprintln!(
        "mirror: {} ticks, longest {:.1} ms, transmit wait per rail {:?} s; flow {:.2}–{:.2} s after the job began; inside:\n{}\nclean:\n{}",
        m.ticks,
        m.max_tick.as_secs_f64() * 1e3,
        m.wait_ticks.iter().map(|t| (*t as f64 / WAIT_TICKS_PER_SECOND * 1e3).round() / 1e3).collect::<Vec<_>>(),
        f0 - t0,
        f1 - t0,
        summarize(&inside.iter().map(|v| (*v).clone()).collect::<Vec<_>>()),
        summarize(&clean.iter().map(|v| (*v).clone()).collect::<Vec<_>>())
    );
    assert!(inside.len() >= 3 && clean.len() >= 6, "{} steps inside the flow, {} clean", inside.len(), clean.len());
    let base = median(clean.iter().filter_map(|st| ar.get(&st["step"].as_u64()?).copied()).collect());
    for st in &inside {
        let id = st["step"].as_u64().expect("id");
        assert_eq!(top_problem(st).0, "congestion", "step {id}:\n{}", summarize(std::slice::from_ref(st)));
        let ev = &cause(st, "congestion")["evidence"];
        // From the RDMA counters: the transmit wait of the mirrored ports, on rail 1.
        assert!(ev["transmit_wait_seconds"].as_f64().is_some_and(|w| w > 0.0), "step {id}: {ev}");
        assert_eq!(ev["nic"], "rail1", "step {id}: {ev}");
    }
    for st in &clean {
        let secs = st["seconds"].as_f64().expect("seconds");
        let ev = &cause(st, "congestion")["evidence"];
        assert!(cause_seconds(st, "congestion") < 0.075 * secs, "clean step {}: {}\n{ev}", st["step"], summarize(std::slice::from_ref(st)));
    }
    let (got, extra) = (
        median(inside.iter().map(|st| cause_seconds(st, "congestion")).collect()),
        median(inside.iter().filter_map(|st| ar.get(&st["step"].as_u64()?).map(|a| a - base)).collect()),
    );
    eprintln!("rdma mirror: median congestion inside the flow {:.1} ms vs extra {:.1} ms", got * 1e3, extra * 1e3);
    assert!(within(got, extra, 0.15), "median step inside the flow: congestion {:.1} ms vs extra {:.1} ms", got * 1e3, extra * 1e3);
}
