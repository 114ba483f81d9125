//! The embedded eBPF object: loading, attaching uprobes, and a self-test used by
//! `agent check` that proves the whole pipeline (load → attach → RingBuf) on this kernel.

use std::{
    path::Path,
    time::{Duration, Instant},
};

mod multi;

use multi::{MultiKind, MultiProgram};

use agent_common::{
    CpuState, ProbeEvent, CPU_STATE_MAP, DROPS_MAP, ENTRY_ALONE_MAP, EVENTS_MAP, KIND_ENTER, KIND_EXIT, KNOWN_MAP, MIN_RECORD_BYTES, PROG_CALL_ENTER,
    PROG_CALL_EXIT, PROG_CALL_SESSION, PROG_EMPTY_ENTER, PROG_EMPTY_EXIT,
};
use aya::{
    maps::{PerCpuArray, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};

/// Links handed to the detacher and not closed yet.
static DETACHING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Links being detached in the background right now (see [`Probes::detach`]).
pub fn detaching() -> usize {
    DETACHING.load(std::sync::atomic::Ordering::Relaxed)
}

/// A link on its way to the detacher: an aya uprobe link or a session link's fd.
type Owned = Box<dyn Send>;

/// Threads closing one batch of links at most: each close waits for an RCU grace period,
/// and concurrent waits share one.
const DETACH_THREADS: usize = 64;

/// The thread that drops (and so detaches) links handed over by [`Probes::detach`]: what is
/// queued is closed as one batch, concurrently (closing a uprobe link waits for an RCU
/// tasks-trace grace period; one after another, 300 links took 37 s).
fn detacher() -> Option<&'static std::sync::Mutex<std::sync::mpsc::Sender<Owned>>> {
    static TX: std::sync::OnceLock<Option<std::sync::Mutex<std::sync::mpsc::Sender<Owned>>>> = std::sync::OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Owned>();
        let run = move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                batch.extend(rx.try_iter());
                let n = batch.len();
                close_concurrently(batch);
                DETACHING.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
            }
        };
        std::thread::Builder::new().name("stepwise-detach".into()).spawn(run).ok().map(|_| std::sync::Mutex::new(tx))
    })
    .as_ref()
}

/// Drops `links` on up to [`DETACH_THREADS`] threads at once.
fn close_concurrently(links: Vec<Owned>) {
    if links.len() == 1 {
        drop(links);
        return;
    }
    let per = links.len().div_ceil(DETACH_THREADS);
    let mut chunks: Vec<Vec<Owned>> = Vec::new();
    let mut it = links.into_iter().peekable();
    while it.peek().is_some() {
        chunks.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|s| {
        for chunk in chunks {
            // A thread that cannot start closes nothing here; its chunk is dropped (closed) by
            // the failed spawn, on this thread.
            let _ = std::thread::Builder::new().name("stepwise-detach".into()).spawn_scoped(s, move || drop(chunk));
        }
    });
}

/// Waits until every link handed to the detacher is closed, or `timeout` passed; returns
/// how many are still open.
pub fn wait_detached(timeout: Duration) -> usize {
    let end = Instant::now() + timeout;
    while detaching() > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    detaching()
}

/// One attached program: entry or return at one location (a perf-event uprobe), or a
/// program at every location of one uprobe-multi link ([`Probes::attach_multi`],
/// [`Probes::attach_session`]).
#[derive(Debug)]
pub enum AttachedLink {
    Probe { program: &'static str, id: UProbeLinkId },
    Multi { fd: std::os::fd::OwnedFd },
}

/// The eBPF object built by the agent-ebpf-object crate (empty only with AYA_BUILD_SKIP=1).
static OBJECT: &[u8] = agent_ebpf_object::OBJECT;

/// Whether this binary carries its eBPF programs.
pub fn embedded() -> bool {
    agent_ebpf_object::embedded()
}

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error(
        "this agent was built without its eBPF object (AYA_BUILD_SKIP=1 was set at build time); rebuild without it (`cargo xtask setup` installs bpf-linker)"
    )]
    NotEmbedded,
    #[error("cannot load the eBPF object: {0} (the agent needs CAP_BPF and CAP_PERFMON: run as root or grant them)")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF program {name} missing or invalid: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("cannot attach uprobe to {symbol} in {target}: {source} (the agent needs CAP_BPF and CAP_PERFMON, plus CAP_SYS_ADMIN for uprobes on Linux 6.16+ / kernels with the CVE-2025-38466 fix)")]
    Attach {
        symbol: String,
        target: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("cannot link {program} to {symbol} in {target}: {source}")]
    AttachMulti {
        program: &'static str,
        symbol: String,
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} unavailable for uprobe-multi links: {why}")]
    NoMulti { program: &'static str, why: String },
    #[error("eBPF map {0} missing from the object")]
    Map(&'static str),
    #[error("{0}")]
    Layout(&'static str),
}

/// The uprobe program `name` of the object.
fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut UProbe, EbpfError> {
    ebpf.program_mut(name)
        .ok_or(EbpfError::Program { name, source: aya::programs::ProgramError::UnexpectedProgramType })?
        .try_into()
        .map_err(|source| EbpfError::Program { name, source })
}

/// Links `program` at `points` of `target` (`what` names them for errors).
fn link_multi(program: &MultiProgram, name: &'static str, target: &Path, points: &[(u64, u64)], what: &str) -> Result<AttachedLink, EbpfError> {
    match program.attach(target, points) {
        Ok(fd) => Ok(AttachedLink::Multi { fd }),
        Err(source) => Err(EbpfError::AttachMulti { program: name, symbol: what.to_string(), target: target.display().to_string(), source }),
    }
}

/// Loaded programs with their RingBuf (taken out of the object once, so draining does not
/// re-map the ring every time).
pub struct Probes {
    ebpf: Ebpf,
    ring: Option<RingBuf<aya::maps::MapData>>,
    /// The session program, or why this kernel cannot run it.
    session: Result<multi::MultiProgram, String>,
    /// The entry and return programs for uprobe-multi links, or why this kernel cannot
    /// link them.
    pairs: Result<(multi::MultiProgram, multi::MultiProgram), String>,
}

impl Probes {
    /// Loads the embedded object and both programs into the kernel.
    pub fn load() -> Result<Probes, EbpfError> {
        if !embedded() {
            return Err(EbpfError::NotEmbedded);
        }
        // One parse of the kernel's BTF serves aya's loader and the session program's kfunc.
        let btf = aya::Btf::from_sys_fs().ok();
        let mut ebpf = aya::EbpfLoader::new().btf(btf.as_ref()).load(OBJECT).map_err(EbpfError::Load)?;
        for name in [PROG_CALL_ENTER, PROG_CALL_EXIT] {
            uprobe(&mut ebpf, name)?.load().map_err(|source| EbpfError::Program { name, source })?;
        }
        let session = MultiProgram::load(OBJECT, PROG_CALL_SESSION, MultiKind::Session, &ebpf, btf.as_ref()).map_err(|e| e.to_string());
        drop(btf);
        let pairs = MultiProgram::load(OBJECT, PROG_CALL_ENTER, MultiKind::Entry, &ebpf, None)
            .and_then(|entry| Ok((entry, MultiProgram::load(OBJECT, PROG_CALL_EXIT, MultiKind::Return, &ebpf, None)?)))
            .map_err(|e| e.to_string());
        let ring = ebpf.take_map(EVENTS_MAP).and_then(|m| RingBuf::try_from(m).ok());
        Ok(Probes { ebpf, ring, session, pairs })
    }

    /// Why session programs are not available (`None` when they are): the agent then attaches
    /// entry and return programs where it would attach the session program.
    pub fn session_unavailable(&self) -> Option<&str> {
        self.session.as_ref().err().map(String::as_str)
    }

    /// Attaches the session program at `points` (file offset, cookie) of `target` for every
    /// process, in one link: entry, and return unless [`Probes::set_entry_alone`] said the
    /// process's calls are complete at their entry.
    pub fn attach_session(&mut self, target: &Path, points: &[(u64, u64)], what: &str) -> Result<AttachedLink, EbpfError> {
        let program = self.session.as_ref().map_err(|why| EbpfError::NoMulti { program: PROG_CALL_SESSION, why: why.clone() })?;
        link_multi(program, PROG_CALL_SESSION, target, points, what)
    }

    /// Attaches the entry and return programs at `points` (file offset, cookie) of `target`
    /// for every process: two uprobe-multi links, whatever the number of points.
    pub fn attach_multi(&mut self, target: &Path, points: &[(u64, u64)], what: &str) -> Result<Vec<AttachedLink>, EbpfError> {
        let (entry, ret) = self.pairs.as_ref().map_err(|why| EbpfError::NoMulti { program: PROG_CALL_ENTER, why: why.clone() })?;
        let entry = link_multi(entry, PROG_CALL_ENTER, target, points, what)?;
        match link_multi(ret, PROG_CALL_EXIT, target, points, what) {
            Ok(ret) => Ok(vec![entry, ret]),
            Err(e) => {
                self.detach(entry);
                Err(e)
            }
        }
    }

    /// Marks `pid`'s session-probed calls as complete at their entry (its return is skipped
    /// and the entry recorded as the whole call), or undoes it.
    pub fn set_entry_alone(&mut self, pid: u32, alone: bool) {
        let Some(map) = self.ebpf.map_mut(ENTRY_ALONE_MAP) else { return };
        let Ok(mut m) = aya::maps::HashMap::<_, u32, u8>::try_from(map) else { return };
        let _ = if alone { m.insert(pid, 1, 0) } else { m.remove(&pid) };
    }

    /// Attaches the entry and return programs to `symbol` in `target` for every process;
    /// `cookie` (see `agent_common::cookie`) carries the probe id and capture flags.
    pub fn attach(&mut self, target: &Path, symbol: &str, cookie: u64) -> Result<Vec<AttachedLink>, EbpfError> {
        self.attach_at(target, UProbeAttachLocation::Symbol(symbol), symbol, cookie, [PROG_CALL_ENTER, PROG_CALL_EXIT])
    }

    /// Attaches at a file offset (used to attach once per offset when several symbols —
    /// NCCL's weak `ncclX` and strong `pncclX` — share one address).
    pub fn attach_offset(&mut self, target: &Path, offset: u64, what: &str, cookie: u64) -> Result<Vec<AttachedLink>, EbpfError> {
        self.attach_at(target, UProbeAttachLocation::AbsoluteOffset(offset), what, cookie, [PROG_CALL_ENTER, PROG_CALL_EXIT])
    }

    /// Attaches the *empty* programs (`empty_enter`/`empty_exit`, which do nothing) at a file
    /// offset: the baseline `bench probes` compares the agent's programs with. Loaded on first
    /// use; the agent itself never attaches them.
    pub fn attach_empty_offset(&mut self, target: &Path, offset: u64, what: &str) -> Result<Vec<AttachedLink>, EbpfError> {
        for name in [PROG_EMPTY_ENTER, PROG_EMPTY_EXIT] {
            let p = uprobe(&mut self.ebpf, name)?;
            if p.fd().is_err() {
                p.load().map_err(|source| EbpfError::Program { name, source })?;
            }
        }
        self.attach_at(target, UProbeAttachLocation::AbsoluteOffset(offset), what, 0, [PROG_EMPTY_ENTER, PROG_EMPTY_EXIT])
    }

    fn attach_at(
        &mut self,
        target: &Path,
        location: UProbeAttachLocation<'_>,
        symbol: &str,
        cookie: u64,
        programs: [&'static str; 2],
    ) -> Result<Vec<AttachedLink>, EbpfError> {
        let mut links = Vec::with_capacity(2);
        for name in programs {
            let p = uprobe(&mut self.ebpf, name)?;
            let loc = match &location {
                UProbeAttachLocation::Symbol(s) => UProbeAttachLocation::Symbol(s),
                UProbeAttachLocation::AbsoluteOffset(o) => UProbeAttachLocation::AbsoluteOffset(*o),
                UProbeAttachLocation::SymbolOffset(s, o) => UProbeAttachLocation::SymbolOffset(s, *o),
            };
            let point = UProbeAttachPoint { location: loc, cookie: Some(cookie) };
            let attached = p.attach(point, target, UProbeScope::AllProcesses);
            match attached {
                Ok(id) => links.push(AttachedLink::Probe { program: name, id }),
                Err(source) => {
                    // Roll back the half-attached pair.
                    for l in links.drain(..) {
                        self.detach(l);
                    }
                    return Err(EbpfError::Attach { symbol: symbol.to_string(), target: target.display().to_string(), source });
                }
            }
        }
        Ok(links)
    }

    /// Detaches one link (errors are ignored: the target may be gone already). The link is
    /// closed on a background thread: unregistering a uprobe waits for RCU grace periods,
    /// seconds for a library's links on a loaded host, and the caller (the probe thread)
    /// must keep draining events meanwhile.
    pub fn detach(&mut self, link: AttachedLink) {
        let owned: Owned = match link {
            AttachedLink::Multi { fd } => Box::new(fd),
            AttachedLink::Probe { program, id } => {
                let Some(p) = self.ebpf.program_mut(program) else { return };
                let p: Result<&mut UProbe, _> = p.try_into();
                let Ok(Ok(owned)) = p.map(|p| p.take_link(id)) else { return };
                Box::new(owned)
            }
        };
        match detacher() {
            Some(tx) => {
                let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
                DETACHING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Err(std::sync::mpsc::SendError(owned)) = tx.send(owned) {
                    drop(owned); // the detacher is gone: detach here
                    DETACHING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            None => drop(owned),
        }
    }

    /// Events dropped in the kernel because the RingBuf was full (sum over CPUs).
    pub fn drops(&self) -> u64 {
        let Some(map) = self.ebpf.map(DROPS_MAP) else { return 0 };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else { return 0 };
        arr.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Forgets an exited process in the programs' table of processes already announced
    /// (`KNOWN`): a later process with the same pid wakes the agent with its first event again.
    pub fn forget_process(&mut self, pid: u32) {
        self.set_entry_alone(pid, false);
        if let Some(map) = self.ebpf.map_mut(KNOWN_MAP) {
            if let Ok(mut known) = aya::maps::HashMap::<_, u32, u8>::try_from(map) {
                let _ = known.remove(&pid);
            }
        }
        // The per-CPU record of the last announced process, where it still names this pid.
        if let Some(map) = self.ebpf.map_mut(CPU_STATE_MAP) {
            if let Ok(mut states) = PerCpuArray::<_, CpuState>::try_from(map) {
                if let Ok(v) = states.get(&0, 0) {
                    if v.iter().any(|s| s.last_tgid == pid) {
                        let cleared: Vec<CpuState> = v.iter().map(|s| CpuState { last_tgid: if s.last_tgid == pid { 0 } else { s.last_tgid }, ..*s }).collect();
                        if let Ok(values) = aya::maps::PerCpuValues::try_from(cleared) {
                            let _ = states.set(0, values, 0);
                        }
                    }
                }
            }
        }
    }

    /// Takes the RingBuf out, for a thread of its own ([`RingReader`]): attaching a probe
    /// can take seconds on a busy host (the kernel registers it in every process mapping the
    /// file), and events must keep flowing meanwhile. [`Probes::drain`] finds nothing after.
    pub fn take_ring(&mut self) -> Option<RingReader> {
        self.ring.take().map(|ring| RingReader { ring })
    }

    /// Gives back a ring taken by [`Probes::take_ring`] (its thread could not start):
    /// [`Probes::drain`] reads it again.
    pub fn restore_ring(&mut self, reader: RingReader) {
        self.ring = Some(reader.ring);
    }

    /// Raw fd of the RingBuf, for poll(2).
    pub fn ring_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        self.ring.as_ref().map(|r| r.as_raw_fd())
    }

    /// Drains all events currently in the RingBuf.
    pub fn drain(&mut self, out: &mut Vec<ProbeEvent>) -> Result<usize, EbpfError> {
        let ring = self.ring.as_mut().ok_or(EbpfError::Map(EVENTS_MAP))?;
        let mut n = 0;
        while let Some(item) = ring.next() {
            if let Some(ev) = event_from_record(&item) {
                out.push(ev);
                n += 1;
            }
        }
        Ok(n)
    }
}

/// The consumer side of the events RingBuf, movable to another thread.
pub struct RingReader {
    ring: RingBuf<aya::maps::MapData>,
}

impl RingReader {
    /// Raw fd of the RingBuf, for poll(2).
    pub fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.ring.as_raw_fd()
    }

    /// Appends up to `max` events currently in the RingBuf to `out`; returns how many.
    pub fn drain(&mut self, out: &mut Vec<ProbeEvent>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            if let Some(ev) = event_from_record(&item) {
                out.push(ev);
                n += 1;
            }
        }
        n
    }
}

/// One RingBuf record as a [`ProbeEvent`]; `None` for a record shorter than the shortest the
/// programs write (skipped). The programs write only the prefix a hit needs (a return is 48
/// bytes, an entry 80, 96 or 224: `agent_common::*_RECORD_BYTES`); the rest of the event reads
/// 0, and longer records keep their first `size_of::<ProbeEvent>()` bytes. Any bytes are a
/// valid event (`ProbeEvent` is Pod: integers only), so the decoder must cope with whatever
/// they say (fuzz target `probe_events`).
pub fn event_from_record(item: &[u8]) -> Option<ProbeEvent> {
    if item.len() < MIN_RECORD_BYTES {
        return None;
    }
    let mut ev = ProbeEvent::default();
    let n = item.len().min(std::mem::size_of::<ProbeEvent>());
    // SAFETY: `n` bytes fit in both; every bit pattern is a valid ProbeEvent (repr(C), no
    // padding, integer fields only), so overwriting a prefix of its bytes keeps it valid.
    unsafe { std::ptr::copy_nonoverlapping(item.as_ptr(), (&mut ev as *mut ProbeEvent).cast::<u8>(), n) };
    Some(ev)
}

/// The function the self-test probes: exported, never inlined, starts like a library entry.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn stepwise_selftest_target(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(3).wrapping_add(1))
}

/// Result of [`self_test`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct SelfTest {
    pub calls: u64,
    pub enter_events: u64,
    pub exit_events: u64,
    pub args_ok: bool,
}

/// Loads the programs, attaches them to [`stepwise_selftest_target`] in this very binary,
/// calls it `calls` times and counts the events that come back.
pub fn self_test(calls: u64) -> Result<SelfTest, EbpfError> {
    let mut probes = Probes::load()?;
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_else(|_| "/proc/self/exe".into());
    let _links = probes.attach(&exe, "stepwise_selftest_target", agent_common::cookie(7, false, None))?;
    for i in 0..calls {
        std::hint::black_box(stepwise_selftest_target(1000 + i));
    }
    let mine = drain_own(&mut probes, 7, 2 * calls as usize)?;
    let enters: Vec<_> = mine.iter().filter(|e| e.kind == KIND_ENTER).collect();
    let exits = mine.iter().filter(|e| e.kind == KIND_EXIT).count() as u64;
    let args_ok = enters.iter().enumerate().all(|(i, e)| e.args[0] == 1000 + i as u64);
    Ok(SelfTest { calls, enter_events: enters.len() as u64, exit_events: exits, args_ok })
}

/// Result of [`session_self_test`]: events of `calls` calls while the process keeps its
/// returns, then of `calls` more after it was marked entry-alone.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionSelfTest {
    pub calls: u64,
    pub paired_entries: u64,
    pub paired_returns: u64,
    pub alone_entries: u64,
    /// Entries waiting for a return and returns after the mark (must be none).
    pub alone_paired_events: u64,
}

/// Drains `probes` until `want` events of this process with probe id `id` arrived (or 2 s).
fn drain_own(probes: &mut Probes, id: u32, want: usize) -> Result<Vec<ProbeEvent>, EbpfError> {
    let me = std::process::id();
    let (mut evs, mut mine) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && mine.len() < want {
        probes.drain(&mut evs)?;
        mine.extend(evs.drain(..).filter(|e| e.pid == me && e.probe_id == id));
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(mine)
}

/// Attaches the session program to [`stepwise_selftest_target`] in this binary and checks
/// both of its modes: entry and return per call, then the entry alone once the process is
/// marked entry-alone (the kernel skips the return).
pub fn session_self_test(calls: u64) -> Result<SessionSelfTest, EbpfError> {
    const ID: u32 = 8;
    let mut probes = Probes::load()?;
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_else(|_| "/proc/self/exe".into());
    let symbol = "stepwise_selftest_target";
    let offset = crate::sources::collectives::elf::SymbolTable::read(&exe, &[symbol])
        .ok()
        .and_then(|t| t.offset(symbol))
        .ok_or(EbpfError::Layout("the self-test symbol is missing from the agent's binary"))?;
    let link = probes.attach_session(&exe, &[(offset, agent_common::cookie(ID, false, None))], symbol)?;
    let me = std::process::id();
    let count = |evs: &[ProbeEvent], kind: u32| evs.iter().filter(|e| e.kind == kind).count() as u64;
    for i in 0..calls {
        std::hint::black_box(stepwise_selftest_target(i));
    }
    let paired = drain_own(&mut probes, ID, 2 * calls as usize)?;
    probes.set_entry_alone(me, true);
    for i in 0..calls {
        std::hint::black_box(stepwise_selftest_target(i));
    }
    let alone = drain_own(&mut probes, ID, calls as usize)?;
    probes.set_entry_alone(me, false);
    probes.detach(link);
    Ok(SessionSelfTest {
        calls,
        paired_entries: count(&paired, KIND_ENTER),
        paired_returns: count(&paired, KIND_EXIT),
        alone_entries: count(&alone, agent_common::KIND_ENTER_ALONE),
        alone_paired_events: count(&alone, KIND_EXIT) + count(&alone, KIND_ENTER),
    })
}

/// The `tcp:tcp_retransmit_skb` tracepoint with its per-address counters.
pub struct TcpRetransmits {
    ebpf: Ebpf,
}

/// The tracefs format file of the tracepoint (tracefs may be mounted in either place).
fn tcp_format() -> Option<String> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"].iter().find_map(|d| std::fs::read_to_string(format!("{d}/events/tcp/tcp_retransmit_skb/format")).ok())
}

/// Whether the kernel's record layout matches the offsets compiled into the program.
pub fn tcp_format_matches(format: &str) -> bool {
    let has = |field: &str, off: usize| format.lines().any(|l| l.contains(field) && l.contains(&format!("offset:{off};")));
    has("__u16 family;", agent_common::TCP_TP_FAMILY_OFFSET)
        && has("__u8 saddr[4];", agent_common::TCP_TP_SADDR_OFFSET)
        && has("__u8 saddr_v6[16];", agent_common::TCP_TP_SADDR_V6_OFFSET)
}

impl TcpRetransmits {
    /// Loads and attaches the tracepoint program.
    pub fn load() -> Result<TcpRetransmits, EbpfError> {
        if !embedded() {
            return Err(EbpfError::NotEmbedded);
        }
        match tcp_format() {
            Some(f) if tcp_format_matches(&f) => {}
            Some(_) => return Err(EbpfError::Layout("tcp:tcp_retransmit_skb has a different record layout on this kernel")),
            None => return Err(EbpfError::Layout("tcp:tcp_retransmit_skb format not found (is tracefs mounted? `agent check --mount`)")),
        }
        let mut ebpf = Ebpf::load(OBJECT).map_err(EbpfError::Load)?;
        let name = agent_common::PROG_TCP_RETRANSMIT;
        let p: &mut aya::programs::TracePoint = ebpf
            .program_mut(name)
            .ok_or(EbpfError::Program { name, source: aya::programs::ProgramError::UnexpectedProgramType })?
            .try_into()
            .map_err(|source| EbpfError::Program { name, source })?;
        p.load().map_err(|source| EbpfError::Program { name, source })?;
        p.attach("tcp", "tcp_retransmit_skb").map_err(|source| EbpfError::Attach {
            symbol: "tcp:tcp_retransmit_skb".into(),
            target: "tracepoint".into(),
            source,
        })?;
        Ok(TcpRetransmits { ebpf })
    }

    /// Retransmitted segments per source address since load (sum over CPUs).
    pub fn counts(&self) -> Vec<(std::net::IpAddr, u64)> {
        let Some(map) = self.ebpf.map(agent_common::TCP_RETRANS_MAP) else { return Vec::new() };
        let Ok(m) = aya::maps::PerCpuHashMap::<_, [u8; 16], u64>::try_from(map) else { return Vec::new() };
        m.iter()
            .filter_map(|r| r.ok())
            .map(|(k, v)| {
                let ip = std::net::Ipv6Addr::from(k);
                let ip = ip.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(std::net::IpAddr::V6(ip));
                (ip, v.iter().sum())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use agent_common::{
        EnterRecord, ExitRecord, ProbeEvent, ENTER_RECORD_BYTES, ENTER_STACK_RECORD_BYTES, EXIT_RECORD_BYTES, KIND_ENTER, KIND_EXIT, MIN_RECORD_BYTES,
    };

    use super::event_from_record;

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: the record types are repr(C) integers without padding.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
    }

    #[test]
    fn short_records_read_as_events_with_the_rest_zero() {
        let exit = ExitRecord { ts_ns: 9, pid: 4, tid: 5, kind: KIND_EXIT, probe_id: 3, has_blob: 0, has_deref: 1, args: [0, 0xabc] };
        let ev = event_from_record(&bytes(&exit)).expect("exit record");
        assert_eq!((ev.ts_ns, ev.pid, ev.tid, ev.kind, ev.probe_id, ev.has_deref, ev.args), (9, 4, 5, KIND_EXIT, 3, 1, [0, 0xabc, 0, 0, 0, 0]));
        assert_eq!((ev.stack, ev.has_blob), ([0, 0], 0));
        assert!(ev.blob.iter().all(|b| *b == 0));

        let enter = EnterRecord { ts_ns: 1, pid: 2, tid: 2, kind: KIND_ENTER, probe_id: 7, has_blob: 0, has_deref: 0, args: [1, 2, 3, 4, 5, 6] };
        let ev = event_from_record(&bytes(&enter)).expect("enter record");
        assert_eq!((ev.kind, ev.probe_id, ev.args, ev.stack), (KIND_ENTER, 7, [1, 2, 3, 4, 5, 6], [0, 0]));

        // The full event (entry with the stack blob) and anything longer keep their bytes.
        let full = ProbeEvent { ts_ns: 5, kind: KIND_ENTER, stack: [8, 9], has_blob: 1, blob: [0x5a; agent_common::BLOB_BYTES], ..ProbeEvent::default() };
        let mut long = bytes(&full);
        assert_eq!(event_from_record(&long), Some(full));
        long.extend_from_slice(&[0xff; 16]);
        assert_eq!(event_from_record(&long), Some(full));
        // Truncated to the stack-words layout: the blob reads zero.
        let ev = event_from_record(&long[..ENTER_STACK_RECORD_BYTES]).expect("stack record");
        assert_eq!((ev.stack, ev.has_blob, ev.blob[0]), ([8, 9], 1, 0));
        assert_eq!(event_from_record(&long[..ENTER_RECORD_BYTES]).map(|e| e.stack), Some([0, 0]));
        assert_eq!(EXIT_RECORD_BYTES, MIN_RECORD_BYTES);
        assert_eq!(event_from_record(&long[..MIN_RECORD_BYTES - 1]), None);
        assert_eq!(event_from_record(&[]), None);
    }
}
