//! What the other-traffic scenarios share: the NCCL-ABI job's ranks on the namespace servers,
//! an unrelated bulk flow between them, its span, server 0's attributed steps and the
//! workload's own all-reduce times.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{
    harness::Proc,
    scenarios::{rail_addr, JobOutput, RankSpec, Servers},
};

/// One rank of the NCCL-ABI workload on `server`, run as real NCCL runs — calls only enqueue
/// (`CUDA_LAUNCH_BLOCKING=0`), the profiler `plugin` times the collectives and reports to its
/// server's agent — with its markers to its server's socket; `env` says the rest (algorithm,
/// addresses).
pub fn async_rank(s: &Servers, dir: &Path, plugin: &Path, server: usize, rank: u32, mut env: Vec<(String, String)>) -> RankSpec {
    env.extend([
        ("STEPWISE_PROFILER_SOCKET".into(), dir.join(format!("profiler-{server}.sock")).display().to_string()),
        ("CUDA_LAUNCH_BLOCKING".into(), "0".into()),
        ("NCCL_PROFILER_PLUGIN".into(), plugin.display().to_string()),
    ]);
    RankSpec { ns: s.ns(server).to_string(), rank, env, args: vec!["--marker-socket".into(), dir.join(format!("markers-{server}.sock")).display().to_string()] }
}

/// The 8 ranks of a job with `algo` on the two 4-rail servers: 4 per server, rank r bound
/// to rail r % 4 of its server ([`async_rank`]).
pub fn eight_ranks(s: &Servers, dir: &Path, algo: &str) -> Vec<RankSpec> {
    let peers: Vec<String> = (0..8).map(|r| rail_addr(r / 4, r % 4).to_string()).collect();
    let plugin = crate::workloads::profiler_plugin().expect("profiler plugin");
    (0..8u32)
        .map(|r| {
            let server = (r / 4) as usize;
            let env = vec![
                ("NCCL_ABI_ALGO".into(), algo.into()),
                ("NCCL_ABI_HOST".into(), format!("server{server}")),
                ("NCCL_ABI_LOCAL_SIZE".into(), "4".into()),
                ("NCCL_ABI_IFACE_ADDR".into(), rail_addr(server, (r % 4) as usize).to_string()),
                ("NCCL_ABI_PEER_ADDRS".into(), peers.join(",")),
            ];
            async_rank(s, dir, &plugin, server, r, env)
        })
        .collect()
}

/// The NCCL-ABI workload's arguments: `--steps`, `--bytes`, `--compute-us`.
pub fn job_args(steps: u64, bytes: u64, compute_us: u64) -> Vec<String> {
    [("--steps", steps), ("--bytes", bytes), ("--compute-us", compute_us)].iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect()
}

/// An unrelated bulk TCP flow from server 0 to server 1 over `rail` for `secs` seconds (a
/// receiver and a sender, neither traced). Returns the wall-clock span it sent in.
pub fn bulk_flow(s: &Servers, dir: &Path, rail: usize, delay: f64, secs: f64) -> (Proc, Proc) {
    let (a, b) = (rail_addr(0, rail), rail_addr(1, rail));
    let rx = format!(
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('{b}',7100))\ns.listen(1)\nc,_=s.accept()\n\
         while c.recv(1<<16): pass\n"
    );
    let tx = format!(
        "import socket,time\ntime.sleep({delay})\nc=socket.create_connection(('{b}',7100),source_address=('{a}',0))\nbuf=b'x'*65536\n\
         t0=time.time()\nprint('start',t0,flush=True)\nwhile time.time()<t0+{secs}: c.send(buf)\nprint('end',time.time(),flush=True)\nc.close()\n"
    );
    let spawn = |k: usize, name: &str, code: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", s.ns(k), "python3", "-c", code]).stdin(Stdio::null());
        Proc::spawn(name, &mut c, dir.join(format!("{name}.log"))).expect("python3")
    };
    let r = spawn(1, "bulk-rx", &rx);
    std::thread::sleep(Duration::from_millis(300));
    (r, spawn(0, "bulk-tx", &tx))
}

/// The flow's (start, end) wall-clock seconds from the sender's log.
pub fn flow_span(tx: &mut Proc) -> (f64, f64) {
    crate::harness::wait_for(Duration::from_secs(30), "the bulk flow to end", || (!tx.alive()).then_some(())).expect("the flow ends");
    let log = tx.log_text();
    let at = |w: &str| log.lines().find_map(|l| l.strip_prefix(w)?.trim().parse::<f64>().ok()).unwrap_or_else(|| panic!("no {w:?} in the flow's log: {log}"));
    (at("start "), at("end "))
}

/// Server 0's attributed steps whose span lies in [t0, t1], by step id.
pub fn steps_of(s: &Servers, t0: f64, t1: f64, n: usize) -> BTreeMap<u64, Value> {
    crate::harness::wait_for(Duration::from_secs(15), "the job's steps attributed", || {
        let v: BTreeMap<u64, Value> = s
            .steps(0)
            .ok()?
            .into_iter()
            .filter(|x| x["begin"].as_f64().is_some_and(|b| b >= t0) && x["end"].as_f64().is_some_and(|e| e <= t1))
            .filter_map(|x| Some((x["step"].as_u64()?, x)))
            .collect();
        (v.len() >= n).then_some(v)
    })
    .unwrap_or_else(|e| panic!("{e}: {}", s.agents[0].proc.log_text()))
}

/// Per step, the longest all-reduce of server 0's ranks (`0..server0_ranks`) by the
/// workload's own clock.
pub fn allreduce_s(out: &JobOutput, server0_ranks: u32) -> BTreeMap<u64, f64> {
    let mut m: BTreeMap<u64, f64> = BTreeMap::new();
    for l in out.lines.iter().filter(|l| l.rank < server0_ranks) {
        let e = m.entry(l.step).or_default();
        *e = e.max(l.allreduce_us * 1e-6);
    }
    m
}
