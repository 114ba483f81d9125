//! What the other-traffic scenarios share: an unrelated bulk flow between the namespace
//! servers, its span, server 0's attributed steps and the workload's own all-reduce times.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{
    harness::Proc,
    scenarios::{rail_addr, JobOutput, Servers},
};

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
