//! Probe overhead benchmark (issue 4), all measured in one run:
//!
//! 1. Per-call cost on one symbol, `stepwise_bench_target` in this binary (first instruction
//!    `push %rbp`, like NCCL/MPI entry points, so the kernel emulates it instead of
//!    single-stepping): no probe; a uprobe + uretprobe without BPF (perf counting events
//!    from the `uprobe` PMU: the kernel's uprobe path alone); the *empty* uprobe + uretprobe
//!    (`empty_enter`/`empty_exit` of the agent's object, BPF programs that return at once:
//!    the baseline of the ratio); and the agent's own `call_enter`/`call_exit` programs
//!    (same object, same cookie path, RingBuf drained and decoded by a consumer thread as in
//!    the agent). Median of 10 batches of `--calls`/10.
//! 2. Event path: the fastest rate the probes produce (one thread, tight loop) versus the
//!    rate drained and decoded with zero drops from several threads, and the consumer's own
//!    capacity (a pre-filled ring drained and decoded).
//! 3. Hits per collective: the real agent (`target/release/agent`) probing a private copy of
//!    the NCCL-ABI `libnccl.so.2` while 4 ranks of `nccl_steps` run 1 MiB all-reduces in a
//!    network namespace: probe program runs (events + drops) per ncclAllReduce.
//! 4. Step-time overhead: 4 ranks of `mpi_steps` (real OpenMPI, compute as sleep) with and
//!    without the agent attached, alternating runs, median step time both ways.
//!
//! `cargo xtask bench probes` (builds the release agent first) or
//! `cargo run --release -p agent --example bench_probes [-- --calls N] [--no-system]`.
//! Needs root (BPF, perf, netns). Prints a final line
//! `bench probes: per_call_ns=… empty_uprobe_ns=… ratio=… hits_per_collective=… events_per_s=… drops=… step_overhead_pct=…`
//! followed by extra fields.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use stepwise::{
    ebpf::Probes,
    sources::collectives::{
        decode::{CallDecoder, Decoded, ProbeInfo, ProcInfo},
        elf::SymbolTable,
        history::History,
        targets::{Arg, Decoder, Family, Op},
    },
};

// The probed function: a real prologue (`push %rbp`), a little work, `ret`. Written in
// assembly so the first instruction cannot change with the compiler (a leading `lea` would
// be single-stepped, ~30x slower here, and the benchmark would lie).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".text",
    ".globl stepwise_bench_target",
    ".type stepwise_bench_target,@function",
    ".p2align 4",
    "stepwise_bench_target:",
    "push %rbp",
    "mov %rsp, %rbp",
    "lea 1(%rdi,%rdi,2), %rax",
    "pop %rbp",
    "ret",
    ".size stepwise_bench_target, .-stepwise_bench_target",
    options(att_syntax)
);

// aarch64: the usual frame-record prologue (`stp x29, x30`), x * 3 + 1, `ret` (not measured
// here: the figures in docs come from x86-64).
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".text",
    ".globl stepwise_bench_target",
    ".type stepwise_bench_target,%function",
    ".p2align 4",
    "stepwise_bench_target:",
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "add x0, x0, x0, lsl #1",
    "add x0, x0, #1",
    "ldp x29, x30, [sp], #16",
    "ret",
    ".size stepwise_bench_target, .-stepwise_bench_target",
);

unsafe extern "C" {
    fn stepwise_bench_target(x: u64) -> u64;
}

const SYMBOL: &str = "stepwise_bench_target";
const PROBE_ID: u32 = 1;

#[inline(always)]
fn call(x: u64) -> u64 {
    // SAFETY: the assembly function above follows the platform's C ABI, reads only its argument.
    unsafe { stepwise_bench_target(std::hint::black_box(x)) }
}

/// ns per call of `n` calls on this thread.
fn time_calls(n: u64) -> f64 {
    let t = Instant::now();
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(call(i));
    }
    std::hint::black_box(acc);
    t.elapsed().as_nanos() as f64 / n as f64
}

/// Median over `batches` batches of `total / batches` calls.
fn per_call(total: u64, batches: u64) -> f64 {
    let mut v: Vec<f64> = (0..batches).map(|_| time_calls(total / batches)).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

// ---------------------------------------------------------------------------------------
// The empty uprobe: perf counting events of the `uprobe` PMU on this task.

/// `PERF_FLAG_FD_CLOEXEC` (include/uapi/linux/perf_event.h).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// A perf uprobe (or uretprobe) counting event; closing it removes the probe.
struct PerfUprobe {
    fd: i32,
    _path: std::ffi::CString,
}

impl PerfUprobe {
    fn open(path: &Path, offset: u64, ret: bool) -> Result<PerfUprobe> {
        let ty: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type").context("uprobe PMU type")?.trim().parse()?;
        let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
        // struct perf_event_attr (include/uapi/linux/perf_event.h), PERF_ATTR_SIZE_VER5:
        // type@0 u32, size@4 u32, config@8, sample_period@16, sample_type@24,
        // read_format@32, flag bits@40 (all clear: enabled, counting user and kernel),
        // wakeup_events@48, bp_type@52, config1@56 (uprobe_path), config2@64 (offset).
        let mut attr = [0u8; 136];
        attr[0..4].copy_from_slice(&ty.to_ne_bytes());
        attr[4..8].copy_from_slice(&112u32.to_ne_bytes());
        attr[8..16].copy_from_slice(&u64::from(ret).to_ne_bytes()); // config:0 = retprobe
        attr[56..64].copy_from_slice(&(cpath.as_ptr() as u64).to_ne_bytes());
        attr[64..72].copy_from_slice(&offset.to_ne_bytes());
        // SAFETY: perf_event_open(2) with a valid attr buffer; pid 0 = this process (all its
        // threads are covered by the uprobe since it is not inherit-only), any CPU.
        let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, PERF_FLAG_FD_CLOEXEC) } as i32;
        if fd < 0 {
            bail!("perf_event_open(uprobe {} +{offset:#x}): {}", path.display(), std::io::Error::last_os_error());
        }
        Ok(PerfUprobe { fd, _path: cpath })
    }

    fn count(&self) -> u64 {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes (read_format 0) into a u64.
        let n = unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            v
        } else {
            0
        }
    }
}

impl Drop for PerfUprobe {
    fn drop(&mut self) {
        // SAFETY: our own fd.
        unsafe { libc::close(self.fd) };
    }
}

// ---------------------------------------------------------------------------------------
// The agent's consumer: drain the RingBuf, decode, keep a history (what Collectives::run
// does per event, minus metrics).

struct Consumer {
    probes: Probes,
    decoder: CallDecoder,
    history: History,
    proc_info: ProcInfo,
    buf: Vec<agent_common::ProbeEvent>,
    drained: u64,
    calls: u64,
}

impl Consumer {
    fn new(probes: Probes) -> Consumer {
        let mut decoder = CallDecoder::default();
        decoder.register(
            PROBE_ID,
            ProbeInfo {
                family: Family::User,
                op: Op::User,
                decoder: Decoder::Fixed { count: Some(Arg::Reg(0)), elem_size: 4, comm: None },
                user_op: Some("bench".into()),
            },
        );
        Consumer {
            probes,
            decoder,
            history: History::new("bench".into(), 65536),
            proc_info: ProcInfo::default(),
            buf: Vec::with_capacity(8192),
            drained: 0,
            calls: 0,
        }
    }

    /// Drains what is in the ring now and decodes it; returns the number of events.
    fn drain_once(&mut self) -> usize {
        self.buf.clear();
        let n = self.probes.drain(&mut self.buf).unwrap_or(0);
        for ev in &self.buf {
            if let Ok(Decoded::Call(c)) = self.decoder.feed(ev, &self.proc_info) {
                self.history.push_call(c);
                self.calls += 1;
            }
        }
        self.drained += n as u64;
        n
    }

    /// Events drained plus events dropped in the kernel, since the programs were loaded.
    fn accounted(&self) -> u64 {
        self.drained + self.probes.drops()
    }

    /// Runs the agent's loop (poll with a 20 ms timeout, drain, decode) until `stop`.
    fn run(mut self, stop: Arc<AtomicBool>, drained: Arc<AtomicU64>) -> Consumer {
        let fd = self.probes.ring_fd();
        while !stop.load(Ordering::Relaxed) {
            if let Some(fd) = fd {
                let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 20) };
            }
            self.drain_once();
            drained.store(self.accounted(), Ordering::Relaxed);
        }
        self.drain_once();
        drained.store(self.accounted(), Ordering::Relaxed);
        self
    }
}

/// A consumer thread with its stop flag.
struct Running {
    stop: Arc<AtomicBool>,
    drained: Arc<AtomicU64>,
    handle: std::thread::JoinHandle<Consumer>,
}

fn start_consumer(c: Consumer) -> Running {
    start_consumer_on(c, &[])
}

/// A consumer thread pinned to `cpus` (any CPU when empty).
fn start_consumer_on(c: Consumer, cpus: &[usize]) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let drained = Arc::new(AtomicU64::new(c.accounted()));
    let (s, d) = (stop.clone(), drained.clone());
    let cpus = cpus.to_vec();
    let handle = std::thread::spawn(move || {
        pin_to(&cpus);
        c.run(s, d)
    });
    Running { stop, drained, handle }
}

/// CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it for this thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize).filter(|c| unsafe { libc::CPU_ISSET(*c, &set) }).collect()
}

/// Pins the calling thread to `cpus` (nothing when empty).
fn pin_to(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET within CPU_SETSIZE; pid 0 = this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cpus {
            libc::CPU_SET(*c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

impl Running {
    fn stop(self) -> Consumer {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("consumer thread")
    }
    /// Waits until `n` events in total were drained or dropped (or `t` passes).
    fn wait_drained(&self, n: u64, t: Duration) {
        let end = Instant::now() + t;
        while self.drained.load(Ordering::Relaxed) < n && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// `threads` threads calling the probed function in tight loops for `d`; returns calls.
fn hammer(threads: usize, d: Duration) -> u64 {
    let total = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let total = total.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut acc = 0u64;
                while start.elapsed() < d {
                    for i in 0..256u64 {
                        acc = acc.wrapping_add(call(i + t as u64));
                    }
                    n += 256;
                }
                std::hint::black_box(acc);
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
    total.load(Ordering::Relaxed)
}

/// `threads` threads together calling at about `calls_per_s` (each paced against its own
/// schedule in batches of 32) for `d`; returns calls made.
fn hammer_paced(threads: usize, calls_per_s: f64, d: Duration) -> u64 {
    let total = Arc::new(AtomicU64::new(0));
    let per_thread = calls_per_s / threads as f64;
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let total = total.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut acc = 0u64;
                while start.elapsed() < d {
                    for i in 0..32u64 {
                        acc = acc.wrapping_add(call(i));
                    }
                    n += 32;
                    let due = Duration::from_secs_f64(n as f64 / per_thread);
                    let el = start.elapsed();
                    if due > el {
                        std::thread::sleep(due - el);
                    }
                }
                std::hint::black_box(acc);
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
    total.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------
// System parts: the real agent, workloads, network namespaces.

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn agent_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("STEPWISE_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    // target/<profile>/examples/bench_probes → target/<profile>/agent
    let exe = std::env::current_exe()?;
    let p = exe.parent().and_then(Path::parent).map(|d| d.join("agent")).ok_or_else(|| anyhow!("no agent next to {}", exe.display()))?;
    if !p.is_file() {
        bail!("{} not found: build it first (`cargo build --release -p agent`, which `cargo xtask bench probes` does)", p.display());
    }
    Ok(p)
}

fn run_ok(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace with loopback up, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Result<Netns> {
        let name = format!("swb-{tag}-{}", std::process::id());
        run_ok(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns(name);
        run_ok(Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]))?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(|| anyhow!("bad response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {head}");
    }
    Ok(body.to_string())
}

fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(if labels.is_empty() { " " } else { "{" }) && l.contains(labels))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

/// The real agent on a free port; killed on drop.
struct AgentProc {
    child: Child,
    addr: String,
}

impl AgentProc {
    fn start(dir: &Path, config: &str) -> Result<AgentProc> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let cfg = dir.join(format!("agent-{port}.toml"));
        std::fs::write(&cfg, config)?;
        let log = std::fs::File::create(dir.join(format!("agent-{port}.log")))?;
        let child = Command::new(agent_bin()?)
            .args(["run", "--listen", &addr, "--config"])
            .arg(&cfg)
            .env("STEPWISE_LOG", "warn")
            .env("STEPWISE_DB", dir.join(format!("agent-{port}.db")))
            .env("STEPWISE_MARKER_SOCKET", dir.join(format!("markers-{port}.sock")))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let a = AgentProc { child, addr };
        let end = Instant::now() + Duration::from_secs(30);
        while http_get(&a.addr, "/readyz").is_err() {
            if Instant::now() > end {
                bail!("agent not ready; log in {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(a)
    }

    fn metrics(&self) -> String {
        http_get(&self.addr, "/metrics").unwrap_or_default()
    }

    /// Waits until `stepwise_probe_attached{library=…}` is positive (the probe thread
    /// preloads library_dirs after /readyz).
    fn wait_attached(&self, library: &str) -> Result<f64> {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(n) = metric(&self.metrics(), "stepwise_probe_attached", &format!("library=\"{library}\"")).filter(|n| *n > 0.0) {
                return Ok(n);
            }
            if Instant::now() > end {
                bail!("agent never attached to {library}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Other `agent` processes on this machine: their uprobes on shared libraries (libmpi in
/// the system dirs) also fire in "without the agent" runs.
fn other_agents() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten().filter(|e| e.file_name() != me.as_str() && std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "agent")).count()
        })
        .unwrap_or(0)
}

struct Hits {
    per_collective: f64,
    api_per_collective: f64,
    allreduces: u64,
    bytes: u64,
    drops: f64,
}

/// Probe program runs per ncclAllReduce under the real agent (events + drops over the
/// all-reduce calls; communicator init/destroy hits subtracted).
fn hits_per_collective(dir: &Path) -> Result<Hits> {
    let build = root().join("tests/workloads/build");
    // Private copies: a new inode only this agent probes, and nccl_steps finds it through
    // its rpath ($ORIGIN).
    let lib = dir.join("nccl");
    std::fs::create_dir_all(&lib)?;
    std::fs::copy(build.join("libnccl.so.2"), lib.join("libnccl.so.2"))?;
    std::fs::copy(build.join("nccl_steps"), lib.join("nccl_steps"))?;
    let ns = Netns::new("hits")?;
    // sample_every = 1h: no sampled ncclIbTest window during the job (reported separately).
    let agent = AgentProc::start(
        dir,
        &format!("interval = \"1s\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nlibrary_dirs = [{:?}]\nsample_every = \"1h\"\n[collectives.select]\nnetns = \"/run/netns/{}\"\n", lib.display().to_string(), ns.0),
    )?;
    agent.wait_attached("nccl")?;
    let m0 = agent.metrics();
    let ev0 = metric(&m0, "stepwise_probe_events_total", "").unwrap_or(0.0);
    let dr0 = metric(&m0, "stepwise_probe_drops_total", "").unwrap_or(0.0);
    let (n, steps, bytes) = (4u32, 20u64, 1u64 << 20);
    let id = dir.join("hits.id");
    let children: Vec<Child> = (0..n)
        .map(|r| {
            Command::new("ip")
                .args(["netns", "exec", &ns.0, "env", "STEPS_COMPUTE=sleep", "NCCL_ABI_IFACE_ADDR=127.0.0.1"])
                .arg(lib.join("nccl_steps"))
                .args(["--rank", &r.to_string(), "--nranks", &n.to_string(), "--id-file"])
                .arg(&id)
                .args(["--steps", &steps.to_string(), "--bytes", &bytes.to_string(), "--compute-us", "1000"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(anyhow::Error::from)
        })
        .collect::<Result<_>>()?;
    for c in children {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            bail!("nccl_steps failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let want = u64::from(n) * steps;
    let end = Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = agent.metrics();
        let ar = metric(&m, "stepwise_collective_calls_total", "op=\"all_reduce\"").unwrap_or(0.0);
        let destroy = metric(&m, "stepwise_collective_calls_total", "op=\"comm_destroy\"").unwrap_or(0.0);
        if (ar as u64 >= want && destroy as u64 >= u64::from(n)) || Instant::now() > end {
            std::thread::sleep(Duration::from_millis(300));
            break agent.metrics();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let ev = metric(&m, "stepwise_probe_events_total", "").unwrap_or(0.0) - ev0;
    let drops = metric(&m, "stepwise_probe_drops_total", "").unwrap_or(0.0) - dr0;
    let count = |op: &str| metric(&m, "stepwise_collective_calls_total", &format!("op=\"{op}\"")).unwrap_or(0.0);
    let ar = count("all_reduce");
    // Entry and return: communicator and group calls; the session program's entry alone: send
    // and recv (asynchronous, like the all-reduce).
    let other_calls: f64 = ["comm_init", "comm_destroy", "comm_split", "comm_abort", "group_start", "group_end"].iter().map(|o| 2.0 * count(o)).sum::<f64>()
        + ["send", "recv"].iter().map(|o| count(o)).sum::<f64>();
    if ar as u64 != want {
        bail!("the agent saw {ar} of {want} ncclAllReduce calls");
    }
    let runs = ev + drops - other_calls;
    Ok(Hits { per_collective: runs / ar, api_per_collective: 1.0, allreduces: ar as u64, bytes, drops })
}

/// One `mpi_steps` run on 4 ranks in `ns`; per-step times in µs (step 0 dropped).
fn mpi_run(ns: &str, steps: u32) -> Result<Vec<f64>> {
    let out = run_ok(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "env",
                "STEPS_COMPUTE=sleep",
                "mpirun",
                "--oversubscribe",
                "--allow-run-as-root",
                "--mca",
                "mpi_yield_when_idle",
                "1",
                "-x",
                "STEPS_COMPUTE",
                "-np",
                "4",
            ])
            .arg(root().join("tests/workloads/build/mpi_steps"))
            .args(["--steps", &steps.to_string(), "--bytes", "1048576", "--compute-us", "10000"]),
    )?;
    let v: Vec<f64> = out
        .lines()
        .filter(|l| l.starts_with("step ") && !l.contains(" step=0 "))
        .filter_map(|l| l.split_whitespace().find_map(|t| t.strip_prefix("step_us="))?.parse().ok())
        .collect();
    if v.len() < 4 * (steps as usize - 1) {
        bail!("mpi_steps printed {} step lines:\n{out}", v.len());
    }
    Ok(v)
}

struct StepOverhead {
    without_us: f64,
    with_us: f64,
    without_runs: Vec<f64>,
    with_runs: Vec<f64>,
    calls_seen: f64,
}

/// Median step time without and with the agent, alternating runs in A B B A order (the
/// kernel tears an agent's uprobes down after it exits, which must not land in the next
/// run: 2 s of settling after each agent).
fn step_overhead(dir: &Path, pairs: usize, steps: u32) -> Result<StepOverhead> {
    let ns = Netns::new("mpi")?;
    let cfg = format!("interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n", ns.0);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let (mut without_runs, mut with_runs) = (Vec::new(), Vec::new());
    let mut calls_seen = 0.0;
    for pair in 0..pairs {
        for agent_on in if pair % 2 == 0 { [false, true] } else { [true, false] } {
            if !agent_on {
                let mut a = mpi_run(&ns.0, steps)?;
                without_runs.push(median(&mut a));
                without.extend(a);
                continue;
            }
            let agent = AgentProc::start(dir, &cfg)?;
            agent.wait_attached("mpi")?;
            let mut b = mpi_run(&ns.0, steps)?;
            std::thread::sleep(Duration::from_millis(500));
            calls_seen += metric(&agent.metrics(), "stepwise_collective_calls_total", "op=\"all_reduce\"").unwrap_or(0.0);
            drop(agent);
            std::thread::sleep(Duration::from_secs(2));
            with_runs.push(median(&mut b));
            with.extend(b);
        }
    }
    Ok(StepOverhead { without_us: median(&mut without), with_us: median(&mut with), without_runs, with_runs, calls_seen })
}

// ---------------------------------------------------------------------------------------

/// The session program, ns per call: with the return kept (a process whose calls block) and
/// with this process marked entry-alone (an asynchronous NCCL call: the entry is the whole
/// call, the kernel skips the return). `None` where the kernel has no uprobe sessions. Checks
/// that the program ran twice, then once, per call and each call was decoded.
fn session_per_call(probes: Probes, exe: &Path, off: u64, per_round: u64, batches: u64, cpus: &[usize]) -> Result<(Option<(f64, f64)>, Probes)> {
    let mut probes = probes;
    if probes.session_unavailable().is_some() {
        return Ok((None, probes));
    }
    let n_round = per_round / batches * batches;
    let mut times = [0.0; 2];
    for (i, alone) in [false, true].into_iter().enumerate() {
        let link = probes.attach_session(exe, &[(off, agent_common::cookie(PROBE_ID, false, None))], SYMBOL)?;
        probes.set_entry_alone(std::process::id(), alone);
        let runs = if alone { n_round } else { 2 * n_round };
        let d0 = probes.drops();
        let consumer = start_consumer_on(Consumer::new(probes), cpus);
        times[i] = per_call(per_round, batches);
        consumer.wait_drained(runs + d0, Duration::from_secs(30));
        let mut c = consumer.stop();
        let drops = c.probes.drops() - d0;
        if c.drained + drops != runs || c.calls + drops != n_round {
            bail!("the session program (alone: {alone}) ran {} times and made {} calls for {n_round} calls", c.drained + drops, c.calls);
        }
        c.probes.set_entry_alone(std::process::id(), false);
        c.probes.detach(link);
        let end = Instant::now() + Duration::from_secs(30);
        while stepwise::ebpf::detaching() > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        probes = c.probes;
    }
    Ok((Some((times[0], times[1])), probes))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let total: u64 = args.iter().position(|a| a == "--calls").and_then(|i| args.get(i + 1)).map(|s| s.parse()).transpose()?.unwrap_or(1_000_000);
    let system = !args.iter().any(|a| a == "--no-system");
    let exe = std::fs::read_link("/proc/self/exe")?;
    let syms = SymbolTable::read(&exe, &[SYMBOL])?;
    let off = syms.offset(SYMBOL).ok_or_else(|| anyhow!("{SYMBOL} not in {}", exe.display()))?;
    let text = std::fs::read(&exe)?;
    if text.get(off as usize) != Some(&0x55) {
        bail!("{SYMBOL} does not start with push %rbp: {:02x?}", &text[off as usize..off as usize + 4]);
    }
    drop(text);
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "bench probes: {SYMBOL} (push %rbp) in {} at {off:#x}; {cpus} CPUs; {} other agent processes running; load {}",
        exe.display(),
        other_agents(),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );

    // 1. Per-call cost: rounds of (no probe, empty uprobe pair, agent programs) so every
    // ratio compares measurements taken seconds apart on a shared machine.
    // The calling thread on one CPU, the consumer on the others: what is measured is the
    // programs' cost to the traced thread. Unpinned, the scheduler may wake the consumer on
    // the producer's CPU, and its decoding (the agent's own CPU time, ~1/capacity per event)
    // is then charged to the traced thread's wall clock.
    let allowed = allowed_cpus();
    let (producer_cpu, consumer_cpus): (Vec<usize>, Vec<usize>) =
        if allowed.len() >= 2 { (allowed[..1].to_vec(), allowed[1..].to_vec()) } else { (Vec::new(), Vec::new()) };
    pin_to(&producer_cpu);
    let rounds = 3u64;
    let batches = 10u64;
    let per_round = total / rounds;
    let n_round = per_round / batches * batches;
    time_calls(per_round / 10); // warm up
    let (mut none_v, mut entry_v, mut empty_v, mut bpf_empty_v, mut agent_v, mut spin_v, mut ratios, mut perf_ratios) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut percall_drained, mut percall_drops) = (0u64, 0u64);
    let (mut alone_v, mut alone_ratios, mut session_pair_v, mut session_pair_ratios) = (vec![], vec![], vec![], vec![]);
    let mut kept: Option<(Consumer, Vec<stepwise::ebpf::AttachedLink>)> = None;
    for round in 0..rounds {
        let none = per_call(per_round, batches);
        let (entry_ns, pair_ns) = {
            let entry = PerfUprobe::open(&exe, off, false)?;
            let entry_ns = per_call(per_round, batches);
            let ret = PerfUprobe::open(&exe, off, true)?;
            let c0 = (entry.count(), ret.count());
            let pair_ns = per_call(per_round, batches);
            let c1 = (entry.count(), ret.count());
            if c1.0 - c0.0 != n_round || c1.1 - c0.1 != n_round {
                bail!("the empty uprobe did not fire once per call: entry {} return {} for {n_round} calls", c1.0 - c0.0, c1.1 - c0.1);
            }
            (entry_ns, pair_ns)
        };
        let mut probes = Probes::load()?;
        // The empty BPF programs on the same uprobe pair.
        let bpf_empty_ns = {
            let links = probes.attach_empty_offset(&exe, off, SYMBOL)?;
            let t = per_call(per_round, batches);
            for l in links {
                probes.detach(l);
            }
            let end = Instant::now() + Duration::from_secs(30);
            while stepwise::ebpf::detaching() > 0 && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            t
        };
        let (session, mut probes) = session_per_call(probes, &exe, off, per_round, batches, &consumer_cpus)?;
        if let Some((paired, alone)) = session {
            session_pair_v.push(paired);
            session_pair_ratios.push(paired / bpf_empty_ns);
            alone_v.push(alone);
            alone_ratios.push(alone / bpf_empty_ns);
        }
        let links = probes.attach_offset(&exe, off, SYMBOL, agent_common::cookie(PROBE_ID, false, None))?;
        let d0 = probes.drops();
        let consumer = start_consumer_on(Consumer::new(probes), &consumer_cpus);
        let agent = per_call(per_round, batches);
        consumer.wait_drained(2 * n_round + d0, Duration::from_secs(30));
        let mut c = consumer.stop();
        let drops = c.probes.drops() - d0;
        if c.drained + drops != 2 * n_round {
            bail!("the agent's programs ran {} times for {n_round} calls", c.drained + drops);
        }
        percall_drained += c.drained;
        percall_drops += drops;
        // Diagnosis: the same programs with a consumer that spins on the ring instead of
        // sleeping in poll(2) (nobody to wake up).
        let spin = {
            let stop = Arc::new(AtomicBool::new(false));
            let st = stop.clone();
            let cpus = consumer_cpus.clone();
            let h = std::thread::spawn(move || {
                pin_to(&cpus);
                while !st.load(Ordering::Relaxed) {
                    c.drain_once();
                }
                c.drain_once();
                c
            });
            let t = per_call(per_round / 4, batches);
            stop.store(true, Ordering::Relaxed);
            c = h.join().map_err(|_| anyhow!("spinning consumer panicked"))?;
            t
        };
        none_v.push(none);
        entry_v.push(entry_ns);
        empty_v.push(pair_ns);
        bpf_empty_v.push(bpf_empty_ns);
        agent_v.push(agent);
        spin_v.push(spin);
        ratios.push(agent / bpf_empty_ns);
        perf_ratios.push(agent / pair_ns);
        if round + 1 == rounds {
            kept = Some((c, links));
        } else {
            for l in links {
                c.probes.detach(l);
            }
        }
    }
    let (none_ns, empty_entry_ns, perf_ns, empty_ns, agent_ns, spin_ns) =
        (median(&mut none_v), median(&mut entry_v), median(&mut empty_v), median(&mut bpf_empty_v), median(&mut agent_v), median(&mut spin_v));
    let ratio = median(&mut ratios.clone());
    let perf_ratio = median(&mut perf_ratios.clone());
    let (mut c, links) = kept.ok_or_else(|| anyhow!("no rounds"))?;
    // The event path uses every CPU.
    pin_to(&allowed);
    // 2. Event path (programs of the last round still attached).
    let before = (c.drained, c.probes.drops());
    let running = start_consumer(c);
    let single_calls = hammer(1, Duration::from_secs(2));
    let single_rate = 2.0 * single_calls as f64 / 2.0;
    running.wait_drained(before.0 + before.1 + 2 * single_calls, Duration::from_secs(30));
    c = running.stop();
    let single_drops = c.probes.drops() - before.1;
    let threads = 4;
    let before = (c.drained, c.probes.drops());
    let running = start_consumer(c);
    let t0 = Instant::now();
    let multi_calls = hammer(threads, Duration::from_secs(3));
    running.wait_drained(before.0 + before.1 + 2 * multi_calls, Duration::from_secs(30));
    let multi_wall = t0.elapsed().as_secs_f64();
    c = running.stop();
    let multi_drained = c.drained - before.0;
    let multi_drops = c.probes.drops() - before.1;
    let multi_rate = multi_drained as f64 / 3.0;
    // Consumer capacity: fill the ring with the consumer stopped (1 MiB ring, 232 bytes per
    // record: 4000 events fit), then drain + decode it.
    // The fills also time the programs when no consumer waits in poll(2): the RingBuf then
    // sends no wakeup (adaptive wakeup notifies only when the consumer has caught up).
    let mut caps = Vec::new();
    let mut quiet = Vec::new();
    for _ in 0..25 {
        let d0 = c.probes.drops();
        let t = Instant::now();
        for i in 0..2000u64 {
            std::hint::black_box(call(i));
        }
        quiet.push(t.elapsed().as_nanos() as f64 / 2000.0);
        let t = Instant::now();
        let mut n = 0;
        while n < 4000 {
            let k = c.drain_once();
            if k == 0 && t.elapsed() > Duration::from_secs(2) {
                break;
            }
            n += k;
        }
        let dt = t.elapsed().as_secs_f64();
        if c.probes.drops() == d0 && n >= 4000 {
            caps.push(n as f64 / dt);
        }
    }
    let capacity = median(&mut caps);
    let quiet_ns = median(&mut quiet);
    // Highest rate several paced threads sustain with zero drops.
    let mut paced = Vec::new();
    for frac in [0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0] {
        let offered = single_rate * frac;
        let before = (c.drained, c.probes.drops());
        let running = start_consumer(c);
        let calls = hammer_paced(threads, offered / 2.0, Duration::from_millis(1500));
        running.wait_drained(before.0 + before.1 + 2 * calls, Duration::from_secs(30));
        c = running.stop();
        let drained = c.drained - before.0;
        let drops = c.probes.drops() - before.1;
        paced.push((offered, drained as f64 / 1.5, drops));
        if drops > 0 && frac >= 1.0 {
            break;
        }
    }
    // Sustained: the highest rate at which this and every lower rate tried had no drop.
    let zero_drop_rate = paced.iter().take_while(|p| p.2 == 0).map(|p| p.1).fold(0.0, f64::max);
    let overhead_ratio = (agent_ns - none_ns) / (empty_ns - none_ns);
    println!("  per call, {} calls each way in {rounds} rounds (median of {batches} batches per round, medians over rounds); calling thread on CPU {producer_cpu:?}, consumer on CPUs {consumer_cpus:?}:", n_round * rounds);
    println!("    no probe                                  {none_ns:>9.1} ns");
    println!("    uprobe, no BPF program (perf count)       {empty_entry_ns:>9.1} ns   (+ uretprobe: {perf_ns:.1} ns)");
    println!("    empty uprobe + uretprobe (BPF, return 0)  {empty_ns:>9.1} ns");
    println!("    agent call_enter + call_exit (RingBuf)    {agent_ns:>9.1} ns   ({percall_drained} events drained and decoded, {percall_drops} dropped)");
    if !session_pair_v.is_empty() {
        println!(
            "    agent session program, entry + return     {:>9.1} ns   = {:.3}x the empty uprobe pair (a blocking call: the same records through one uprobe-multi link; per round {:?})",
            median(&mut session_pair_v.clone()),
            median(&mut session_pair_ratios.clone()),
            session_pair_ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
    }
    match (alone_v.is_empty(), median(&mut alone_v.clone()), median(&mut alone_ratios.clone())) {
        (false, t, r) => println!("    agent session program, entry alone        {t:>9.1} ns   = {r:.3}x the empty uprobe pair (an asynchronous NCCL call: one hit, decoded as a whole call; per round {:?})", alone_ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>()),
        (true, ..) => println!("    agent session program, entry alone        (uprobe sessions unavailable on this kernel)"),
    }
    println!("    agent programs, consumer spinning         {spin_ns:>9.1} ns   (diagnosis: nobody sleeps in poll(2), so no thread wakeups)");
    println!("    agent programs, no consumer in poll(2)    {quiet_ns:>9.1} ns   (median of 2000-call fills of the ring: no RingBuf wakeups)");
    println!(
        "    ratio agent / empty uprobe pair           {ratio:>9.3}x  (target <= 1.25x, issue 18; 1.1x longer term; per round {:?}; medians over the no-probe time: {overhead_ratio:.3}x)",
        ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>()
    );
    println!("    ratio agent / uprobe pair without BPF     {perf_ratio:>9.3}x  (per round {:?}: what running any BPF program adds to the kernel's uprobe path is in this one)", perf_ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>());

    let events_ratio = zero_drop_rate / single_rate;
    println!("  event path:");
    println!("    fastest production, 1 thread tight loop   {single_rate:>12.0} events/s ({single_drops} dropped)");
    println!("    sustained, {threads} threads, drained+decoded  {multi_rate:>12.0} events/s ({multi_drops} dropped, {multi_drained} events, {multi_wall:.1} s incl. drain)");
    for (offered, got, drops) in &paced {
        println!("    paced, {threads} threads, offered {offered:>10.0} events/s: drained {got:>10.0} events/s, {drops} dropped");
    }
    println!("    sustained with zero drops, {threads} threads     {zero_drop_rate:>12.0} events/s = {events_ratio:.2}x the fastest single thread (target >= 1.5x, issue 18; {cpus} CPUs shared by producers and the consumer: {threads} producing threads make at most {cpus}x one thread's rate here, so the ceiling on this machine is below {cpus}x)");
    println!("    consumer capacity (pre-filled ring)       {capacity:>12.0} events/s = {:.1}x the fastest single-thread production", capacity / single_rate);
    for l in links {
        c.probes.detach(l);
    }
    drop(c);

    let alone_s = if alone_v.is_empty() { "n/a".to_string() } else { format!("{:.1}", median(&mut alone_v.clone())) };
    let session_pair_s = if session_pair_v.is_empty() { "n/a".to_string() } else { format!("{:.1}", median(&mut session_pair_v.clone())) };
    // 3 and 4: the real agent on real workloads.
    let (mut hits_s, mut overhead_s) = ("n/a".to_string(), "n/a".to_string());
    let mut extra = String::new();
    if system {
        run_ok(Command::new("bash").arg(root().join("tests/workloads/build.sh")))?;
        let dir = std::env::temp_dir().join(format!("stepwise-bench-probes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let h = hits_per_collective(&dir)?;
        println!("  hits per collective (real agent, NCCL-ABI, 4 ranks, {} x ncclAllReduce of {} B):", h.allreduces, h.bytes);
        println!("    probe program runs per ncclAllReduce      {:>9.2}   (target <= 2; the asynchronous call's entry alone = {:.0} once the agent has seen the rank, the rest is the permanently attached ncclIbIsend/ncclIbIrecv, one pair per chunk; {} dropped)", h.per_collective, h.api_per_collective, h.drops);
        hits_s = format!("{:.2}", h.per_collective);
        extra.push_str(&format!(" api_hits_per_collective={:.0}", h.api_per_collective));
        let (pairs, steps) = (5, 60);
        let o = step_overhead(&dir, pairs, steps)?;
        let pct = (o.with_us - o.without_us) / o.without_us * 100.0;
        println!("  step time, mpi_steps 4 ranks, 10 ms compute (sleep) + 1 MiB MPI_Allreduce, {pairs} x {steps} steps each way, alternating A B B A:");
        println!("    without the agent  median {:>9.0} µs   (per run {:?})", o.without_us, o.without_runs.iter().map(|v| v.round()).collect::<Vec<_>>());
        println!(
            "    with the agent     median {:>9.0} µs   (per run {:?}; {} MPI_Allreduce seen)",
            o.with_us,
            o.with_runs.iter().map(|v| v.round()).collect::<Vec<_>>(),
            o.calls_seen
        );
        println!("    difference         {:>+9.0} µs = {pct:+.2} %", o.with_us - o.without_us);
        overhead_s = format!("{pct:.2}");
        extra.push_str(&format!(" step_without_us={:.0} step_with_us={:.0}", o.without_us, o.with_us));
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!(
        "bench probes: per_call_ns={agent_ns:.1} empty_uprobe_ns={empty_ns:.1} ratio={ratio:.3} hits_per_collective={hits_s} events_per_s={zero_drop_rate:.0} drops=0 step_overhead_pct={overhead_s} none_ns={none_ns:.1} perf_uprobe_ns={perf_ns:.1} perf_ratio={perf_ratio:.3} empty_entry_only_ns={empty_entry_ns:.1} session_alone_ns={alone_s} session_pair_ns={session_pair_s} spin_consumer_ns={spin_ns:.1} quiet_per_call_ns={quiet_ns:.1} events_ratio={events_ratio:.2} fastest_events_per_s={single_rate:.0} full_blast_events_per_s={multi_rate:.0} full_blast_drops={multi_drops} consumer_capacity_per_s={capacity:.0}{extra}"
    );
    Ok(())
}
