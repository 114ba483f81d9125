//! Jobs with several communicators, across two network-namespace servers, each watched by
//! its own agent: every collective joins exactly its own communicator's ranks, across
//! hosts, and each communicator's sequence numbers count its own collectives only.
//!
//! MPI: real OpenMPI `mpi_groups`, 4 ranks, 2 per server; `MPI_Comm_split` by node (two
//! same-host groups), by rail (two cross-host groups), an `MPI_Comm_dup` of the rail one
//! (the same ranks, another communicator), and the world's barrier.
//!
//! gloo: real PyTorch `groups.py`, 4 ranks, 2 per server, gloo over the rail between them:
//! a local group per server, a rail group per local index (across the servers), the
//! world's barrier.

use std::collections::{BTreeMap, BTreeSet};

use stepwise::timeline::join::CallView;
use stepwise_tests::{
    harness::workspace_root,
    scenarios::{rail_addr, rail_dev, Servers},
    torch, workloads,
};

const STEPS: u64 = 12;

/// The shipped defaults, but for what two agents on one machine may not share (host name,
/// store, sockets) and the selection of the server's processes.
fn agent_config(s: &Servers, k: usize, dir: &std::path::Path) -> String {
    format!(
        "[collectives]\nhost = \"server{k}\"\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[store]\npath = \"{}\"\n[steps]\nmarker_socket = \"{}\"\n",
        s.ns(k),
        dir.join(format!("agent-{k}.db")).display(),
        dir.join(format!("markers-{k}.sock")).display()
    )
}

/// One scenario at a time: each runs a 4-rank job on the 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls both agents until they hold `want` calls of `library` (they drain their probe
/// events on a timer), for at most 30 s.
fn calls_when_drained(s: &Servers, library: &str, want: usize) -> Vec<CallView> {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut all = calls(s, library);
    while all.len() < want && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(500));
        all = calls(s, library);
    }
    assert_eq!(all.len(), want, "every collective seen once");
    let hosts: BTreeSet<&str> = all.iter().map(|c| c.host.as_str()).collect();
    assert_eq!(hosts.len(), 2, "two agents, one per server: {hosts:?}");
    all
}

/// Communicators by their members: how many have each member set.
fn by_members<T>(comms: &BTreeMap<String, (BTreeSet<u32>, T)>) -> BTreeMap<Vec<u32>, usize> {
    comms.values().fold(BTreeMap::new(), |mut m, (members, _)| {
        *m.entry(members.iter().copied().collect()).or_default() += 1;
        m
    })
}

/// `init rank=R … pid=P …` lines: pid → world rank.
fn ranks_by_pid(out: &str) -> BTreeMap<u32, u32> {
    let field = |l: &str, k: &str| l.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse::<u32>().ok());
    out.lines().filter(|l| l.starts_with("init ")).filter_map(|l| Some((field(l, "pid=")?, field(l, "rank=")?))).collect()
}

/// Every agent's calls of `library`.
fn calls(s: &Servers, library: &str) -> Vec<CallView> {
    let mut all = Vec::new();
    for a in &s.agents {
        let v = s.get_json(&a.addr, "/api/v1/collectives?limit=100000").expect("collectives");
        let views: Vec<CallView> = serde_json::from_value(v["calls"].clone()).expect("call views");
        all.extend(views.into_iter().filter(|c| c.library == library && c.seq.is_some()));
    }
    all
}

/// Per sequence number of a communicator: world rank → its (rank, nranks) in the communicator.
type Seqs = BTreeMap<u64, BTreeMap<u32, (Option<u32>, Option<u32>)>>;
/// Per communicator: its members (world ranks) and [`Seqs`].
type Comms = BTreeMap<String, (BTreeSet<u32>, Seqs)>;

/// Per communicator: its members (world ranks) and, per sequence number, the world ranks
/// whose call carries it with their (rank, nranks) in the communicator. Asserts that every
/// sequence number of a communicator is one collective of one operation, joined by exactly
/// the communicator's members.
fn communicators(calls: &[CallView], world: &BTreeMap<u32, u32>) -> Comms {
    let mut by: Comms = BTreeMap::new();
    let mut ops: BTreeMap<(String, u64), BTreeSet<String>> = BTreeMap::new();
    for c in calls {
        let (Some(comm), Some(seq)) = (c.comm.clone(), c.seq) else { continue };
        let w = *world.get(&c.pid).unwrap_or_else(|| panic!("a call of pid {} outside the job: {c:?}", c.pid));
        let e = by.entry(comm.clone()).or_default();
        e.0.insert(w);
        assert!(e.1.entry(seq).or_default().insert(w, (c.rank, c.nranks)).is_none(), "rank {w} has two calls as {comm}#{seq}");
        ops.entry((comm, seq)).or_default().insert(c.op.clone());
    }
    for ((comm, seq), o) in &ops {
        assert_eq!(o.len(), 1, "{comm}#{seq} joins different operations: {o:?}");
    }
    for (comm, (members, seqs)) in &by {
        assert!(c_global(calls, comm), "{comm}: every communicator of the job is shared across hosts");
        for (seq, who) in seqs {
            let got: BTreeSet<u32> = who.keys().copied().collect();
            assert_eq!(&got, members, "{comm}#{seq} joins ranks {got:?} of a communicator of {members:?}");
        }
        let want: Vec<u64> = (0..seqs.len() as u64).collect();
        assert_eq!(seqs.keys().copied().collect::<Vec<_>>(), want, "{comm}: its own collectives, numbered without gaps");
    }
    by
}

fn c_global(calls: &[CallView], comm: &str) -> bool {
    calls.iter().filter(|c| c.comm.as_deref() == Some(comm)).all(|c| c.comm_global)
}

#[test]
fn mpi_split_and_dup_communicators_join_their_own_ranks_across_hosts() {
    let _serial = serial();
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-groups-mpi-").tempdir().expect("tmp");
    let mut s = Servers::new(1, 1500, None).expect("two servers (needs root)");
    for k in 0..2 {
        let cfg = agent_config(&s, k, dir.path());
        s.start_agent_for(k, dir.path(), &cfg, &[], "mpi").expect("agent");
    }
    let servers = [(s.ns(0).to_string(), rail_addr(0, 0)), (s.ns(1).to_string(), rail_addr(1, 0))];
    let servers: Vec<(&str, std::net::Ipv4Addr)> = servers.iter().map(|(n, a)| (n.as_str(), *a)).collect();
    let mut cmd = workloads::mpi_groups_across(&servers, &rail_dev(0), 2, dir.path(), &["--steps", &STEPS.to_string(), "--bytes", "65536"]).expect("mpirun");
    cmd.current_dir(workspace_root());
    let out = workloads::run_ok(&mut cmd).expect("mpi_groups across the two servers");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(text.lines().filter(|l| l.starts_with("summary ") && l.contains("bad=0")).count(), 4, "{text}");
    let world = ranks_by_pid(&text);
    assert_eq!(world.len(), 4, "{text}");

    // 7 communicators × STEPS collectives × their ranks: 3 × 2-rank all-reduces per rank
    // and the world barrier.
    let all = calls_when_drained(&s, "mpi", (STEPS * 4 * 4) as usize);
    let comms = communicators(&all, &world);
    let groups = by_members(&comms);
    // Node groups once each; rail groups twice each (the split and its dup); the world once.
    let want: BTreeMap<Vec<u32>, usize> = [(vec![0, 1], 1), (vec![2, 3], 1), (vec![0, 2], 2), (vec![1, 3], 2), (vec![0, 1, 2, 3], 1)].into_iter().collect();
    assert_eq!(groups, want, "communicators by members");
    for (comm, (members, seqs)) in &comms {
        assert_eq!(seqs.len() as u64, STEPS, "{comm}: one collective per step");
        for (seq, who) in seqs {
            for (w, (rank, nranks)) in who {
                // Members in world-rank order (the workload's split key), as MPI_Comm_rank/size told.
                let want = members.iter().position(|m| m == w).map(|i| i as u32);
                assert_eq!((*rank, *nranks), (want, Some(members.len() as u32)), "{comm}#{seq}: world rank {w}");
            }
        }
    }
    println!("mpi_groups across two servers: {} calls, {} communicators joined: {groups:?}", all.len(), comms.len());
}

#[test]
fn gloo_process_groups_join_their_own_ranks_across_hosts() {
    let _serial = serial();
    let lib = torch::lib_dir().expect("PyTorch (pip install torch into ~/.cache/stepwise/torch)");
    let dir = tempfile::Builder::new().prefix("stepwise-groups-gloo-").tempdir().expect("tmp");
    let mut s = Servers::new(1, 1500, None).expect("two servers (needs root)");
    for k in 0..2 {
        // PyTorch's library lies in a virtual environment, outside the default library_dirs:
        // probed before the job starts, so every group's making is seen.
        let cfg = agent_config(&s, k, dir.path()).replacen("[collectives]\n", &format!("[collectives]\nlibrary_dirs = [\"{}\"]\n", lib.display()), 1);
        s.start_agent_for(k, dir.path(), &cfg, &[], "gloo").expect("agent");
    }
    let ranks: Vec<(String, u32, Vec<String>)> =
        (0..4u32).map(|r| (s.ns((r / 2) as usize).to_string(), r, vec![format!("GLOO_SOCKET_IFNAME={}", rail_dev(0))])).collect();
    let args = ["--per-node", "2", "--steps", &STEPS.to_string(), "--bytes", "65536"];
    let mut job = torch::GlooJob::start_script(&torch::groups_script(), dir.path(), "groups", &rail_addr(0, 0).to_string(), &ranks, &args).expect("job");
    let text = job.wait(std::time::Duration::from_secs(300)).expect("gloo groups job");
    assert_eq!(text.lines().filter(|l| l.starts_with("summary ") && l.contains("bad=0")).count(), 4, "{text}");
    let world = ranks_by_pid(&text);
    assert_eq!(world.len(), 4, "{text}");

    // Per step and rank: an all-reduce on its local group, one on its rail group, the
    // world's barrier.
    let all = calls_when_drained(&s, "gloo", (STEPS * 4 * 3) as usize);
    let comms = communicators(&all, &world);
    let groups = by_members(&comms);
    let want: BTreeMap<Vec<u32>, usize> = [(vec![0, 1], 1), (vec![2, 3], 1), (vec![0, 2], 1), (vec![1, 3], 1), (vec![0, 1, 2, 3], 1)].into_iter().collect();
    assert_eq!(groups, want, "communicators by members");
    for (comm, (members, seqs)) in &comms {
        assert_eq!(seqs.len() as u64, STEPS, "{comm}: one collective per step");
        for (seq, who) in seqs {
            for (w, (rank, nranks)) in who {
                // new_group ranks in world-rank order: the group rank is the index.
                let want = members.iter().position(|m| m == w).map(|i| i as u32);
                assert_eq!((*rank, *nranks), (want, Some(members.len() as u32)), "{comm}#{seq}: world rank {w}");
            }
        }
    }
    println!("gloo groups across two servers: {} calls, {} communicators joined: {groups:?}", all.len(), comms.len());
}
