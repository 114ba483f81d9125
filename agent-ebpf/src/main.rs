//! Stepwise eBPF programs: one uprobe and one uretprobe, attached by the agent to every
//! probed library function, and one uprobe *session* program for asynchronous NCCL calls
//! (entry and, per call, return; loaded by `agent/src/ebpf/multi.rs`). The uprobe cookie
//! (see `agent_common::cookie`) carries the probe id and capture flags, so one pair of
//! programs serves every symbol; argument decoding happens in userspace.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(all(target_arch = "bpf", not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64"))))]
compile_error!("the probes decode arguments for x86_64 and aarch64 only");

#[cfg(target_arch = "bpf")]
mod programs {
    use agent_common::{
        CpuState, EnterRecord, EnterStackRecord, ExitRecord, ProbeEvent, BLOB_BYTES, COOKIE_BLOB_ARG_SHIFT, COOKIE_DEREF_SHIFT, COOKIE_STACK_ARGS,
        COOKIE_STACK_BLOB, ENTRY_ALONE_ENTRIES, EVENTS_RING_BYTES, KIND_ENTER, KIND_ENTER_ALONE, KIND_EXIT, KNOWN_ENTRIES, SESSION_IS_RETURN_PLACEHOLDER,
        TCP_TP_FAMILY_OFFSET, TCP_TP_SADDR_OFFSET, TCP_TP_SADDR_V6_OFFSET, WAKE_EVERY_RECORDS,
    };
    use aya_ebpf::{
        helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf, generated::bpf_get_attach_cookie},
        macros::{map, tracepoint, uprobe, uretprobe},
        maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
        programs::{ProbeContext, RetProbeContext, TracePointContext},
        EbpfContext,
    };

    #[map(name = "EVENTS")]
    static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

    /// Index 0: events dropped because the RingBuf was full. A full ring never blocks the
    /// traced thread: the event is dropped and counted.
    #[map(name = "DROPS")]
    static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

    /// tid → out-pointer saved at entry, read at return (cookie deref flag).
    #[map(name = "OUTPTR")]
    static OUTPTR: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

    /// Processes (tgid) whose first event already woke the agent; the agent forgets a
    /// process when it exits (a reused pid wakes it again).
    #[map(name = "KNOWN")]
    static KNOWN: LruHashMap<u32, u8> = LruHashMap::with_max_entries(KNOWN_ENTRIES, 0);

    /// Per CPU: the last process announced here and the records written here (see
    /// [`enter_flags`], [`lazy_flags`]).
    #[map(name = "CPU_STATE")]
    static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;

    /// Submit flags of an entry. The first event of a process wakes the agent (default flags:
    /// a wakeup when it waits in poll), so it reads the process's /proc entry while it
    /// exists. A thread calling collectives in a loop finds its process in this CPU's
    /// `last_tgid` and skips the `KNOWN` hash lookup. After that, and always for hot probes
    /// (COOKIE_LAZY_WAKE), entries are lazy ([`lazy_flags`]).
    #[inline(always)]
    fn enter_flags(cookie: u64, tgid: u32) -> u64 {
        let state = CPU_STATE.get_ptr_mut(0);
        if cookie & agent_common::COOKIE_LAZY_WAKE == 0 {
            // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
            let seen_here = state.is_some_and(|p| unsafe { (*p).last_tgid } == tgid);
            if !seen_here {
                // SAFETY: map lookup by value; only presence is used.
                if unsafe { KNOWN.get(&tgid) }.is_none() {
                    let _ = KNOWN.insert(&tgid, &1, 0);
                    return 0;
                }
                if let Some(p) = state {
                    // SAFETY: as above.
                    unsafe { (*p).last_tgid = tgid };
                }
            }
        }
        lazy_flags(state)
    }

    /// Submit flags of a lazy record (every return: its entry already announced the
    /// process). The agent drains on a 20 ms timer anyway, and a wakeup per event would cost
    /// the traced thread more than the probe itself (an irq_work: a self-IPI, a VM exit in
    /// a guest): every [`WAKE_EVERY_RECORDS`]th record written on a CPU forces one, so the
    /// agent is woken about once per that many records host-wide (≤ 232 KiB of a 1 MiB
    /// ring, 72 KiB for entry/return pairs) whatever the number of CPUs. A per-CPU count
    /// instead of the ring's fill level (`bpf_ringbuf_query`): one helper call less per record.
    #[inline(always)]
    fn lazy_flags(state: Option<*mut CpuState>) -> u64 {
        let Some(p) = state else { return BPF_RB_NO_WAKEUP };
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        let n = unsafe { (*p).records.wrapping_add(1) };
        unsafe { (*p).records = n };
        if n % WAKE_EVERY_RECORDS == 0 {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        }
    }

    #[inline(always)]
    fn count_drop() {
        if let Some(p) = DROPS.get_ptr_mut(0) {
            // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
            unsafe { *p += 1 };
        }
    }

    /// Header and register arguments of an entry record (any of the three entry layouts:
    /// they share these fields at the same offsets).
    macro_rules! fill_enter {
        ($ev:expr, $ctx:expr, $cookie:expr) => {{
            let pid_tgid = bpf_get_current_pid_tgid();
            // SAFETY: helper without arguments.
            $ev.ts_ns = unsafe { bpf_ktime_get_ns() };
            $ev.pid = (pid_tgid >> 32) as u32;
            $ev.tid = pid_tgid as u32;
            $ev.kind = KIND_ENTER;
            $ev.probe_id = $cookie as u32;
            $ev.has_blob = 0;
            $ev.has_deref = 0;
            $ev.args[0] = $ctx.arg::<u64>(0).unwrap_or(0);
            $ev.args[1] = $ctx.arg::<u64>(1).unwrap_or(0);
            $ev.args[2] = $ctx.arg::<u64>(2).unwrap_or(0);
            $ev.args[3] = $ctx.arg::<u64>(3).unwrap_or(0);
            $ev.args[4] = $ctx.arg::<u64>(4).unwrap_or(0);
            $ev.args[5] = $ctx.arg::<u64>(5).unwrap_or(0);
        }};
    }

    /// Where the arguments passed in memory begin at entry. SysV x86-64: [rsp] is the return
    /// address, they start at rsp+8.
    #[cfg(bpf_target_arch = "x86_64")]
    #[inline(always)]
    fn memory_args(ctx: &ProbeContext) -> u64 {
        // SAFETY: regs points at the probed thread's saved registers.
        unsafe { (*ctx.regs).rsp + 8 }
    }

    /// AAPCS64: the return address is in the link register, memory arguments start at sp.
    #[cfg(bpf_target_arch = "aarch64")]
    #[inline(always)]
    fn memory_args(ctx: &ProbeContext) -> u64 {
        // SAFETY: regs points at the probed thread's saved registers.
        unsafe { (*ctx.regs).sp }
    }

    /// Integer arguments 7 and 8 (the record's `stack` words). SysV x86-64 passes six in
    /// registers, so these are the first two words in memory.
    #[cfg(bpf_target_arch = "x86_64")]
    #[inline(always)]
    fn args_7_8(ctx: &ProbeContext) -> [u64; 2] {
        let at = memory_args(ctx);
        // SAFETY: user memory reads through the helper; a fault yields an error, not a crash.
        unsafe { [bpf_probe_read_user(at as *const u64).unwrap_or(0), bpf_probe_read_user((at + 8) as *const u64).unwrap_or(0)] }
    }

    /// AAPCS64 passes eight integer arguments in registers: 7 and 8 are x6 and x7.
    #[cfg(bpf_target_arch = "aarch64")]
    #[inline(always)]
    fn args_7_8(ctx: &ProbeContext) -> [u64; 2] {
        [ctx.arg::<u64>(6).unwrap_or(0), ctx.arg::<u64>(7).unwrap_or(0)]
    }

    /// The integer return value at a session program's return (rax; x0).
    #[cfg(bpf_target_arch = "x86_64")]
    #[inline(always)]
    fn return_value(ctx: &ProbeContext) -> u64 {
        // SAFETY: regs points at the probed thread's saved registers.
        unsafe { (*ctx.regs).rax }
    }

    #[cfg(bpf_target_arch = "aarch64")]
    #[inline(always)]
    fn return_value(ctx: &ProbeContext) -> u64 {
        // SAFETY: regs points at the probed thread's saved registers.
        unsafe { (*ctx.regs).regs[0] }
    }

    /// Saves the out-pointer argument the return will dereference (cookie deref index:
    /// 0..5 register arguments, 6 and 7 the first two stack arguments).
    #[inline(always)]
    fn save_outptr(cookie: u64, tid: u32, args: &[u64; 6], stack: [u64; 2]) {
        let deref = (cookie >> COOKIE_DEREF_SHIFT) & 0xff;
        if deref != 0 {
            let idx = (deref - 1) as usize;
            let ptr = if idx < 6 {
                args[idx]
            } else if idx == 6 {
                stack[0]
            } else {
                stack[1]
            };
            let _ = OUTPTR.insert(&tid, &ptr, 0);
        }
    }

    /// Entry: writes the shortest record the probe needs (register arguments; plus the two
    /// stack words; plus the 128-byte stack blob), of `kind` ([`KIND_ENTER`], or
    /// [`KIND_ENTER_ALONE`] when no return will follow).
    #[inline(always)]
    fn record_enter(ctx: &ProbeContext, cookie: u64, kind: u32) {
        if cookie & COOKIE_STACK_BLOB != 0 {
            let Some(mut entry) = EVENTS.reserve::<ProbeEvent>(0) else {
                count_drop();
                return;
            };
            // SAFETY: `ev` points at a reserved, exclusively owned RingBuf record of our type.
            let ev = unsafe { &mut *entry.as_mut_ptr() };
            fill_enter!(ev, ctx, cookie);
            ev.kind = kind;
            ev.stack = args_7_8(ctx);
            // The stack arguments, or the object a register argument points at.
            let src = match (cookie >> COOKIE_BLOB_ARG_SHIFT) & 0xff {
                1 => ev.args[0],
                2 => ev.args[1],
                3 => ev.args[2],
                4 => ev.args[3],
                5 => ev.args[4],
                6 => ev.args[5],
                _ => memory_args(ctx),
            };
            // SAFETY: user memory read into the record's own buffer; a fault is an error.
            let ok = unsafe { bpf_probe_read_user_buf(src as *const u8, &mut ev.blob[..BLOB_BYTES]) }.is_ok();
            ev.has_blob = ok as u32;
            save_outptr(cookie, ev.tid, &ev.args, ev.stack);
            let flags = enter_flags(cookie, ev.pid);
            entry.submit(flags);
        } else if cookie & COOKIE_STACK_ARGS != 0 {
            let Some(mut entry) = EVENTS.reserve::<EnterStackRecord>(0) else {
                count_drop();
                return;
            };
            // SAFETY: as above.
            let ev = unsafe { &mut *entry.as_mut_ptr() };
            fill_enter!(ev, ctx, cookie);
            ev.kind = kind;
            ev.stack = args_7_8(ctx);
            save_outptr(cookie, ev.tid, &ev.args, ev.stack);
            let flags = enter_flags(cookie, ev.pid);
            entry.submit(flags);
        } else {
            let Some(mut entry) = EVENTS.reserve::<EnterRecord>(0) else {
                count_drop();
                return;
            };
            // SAFETY: as above.
            let ev = unsafe { &mut *entry.as_mut_ptr() };
            fill_enter!(ev, ctx, cookie);
            ev.kind = kind;
            save_outptr(cookie, ev.tid, &ev.args, [0; 2]);
            let flags = enter_flags(cookie, ev.pid);
            entry.submit(flags);
        }
    }

    /// Return: the return value `ret` and, for an out-pointer probe, the value it points at.
    #[inline(always)]
    fn record_exit(cookie: u64, ret: u64) {
        let Some(mut entry) = EVENTS.reserve::<ExitRecord>(0) else {
            count_drop();
            return;
        };
        // SAFETY: exclusively owned reserved record.
        let ev = unsafe { &mut *entry.as_mut_ptr() };
        let pid_tgid = bpf_get_current_pid_tgid();
        // SAFETY: helper without arguments.
        ev.ts_ns = unsafe { bpf_ktime_get_ns() };
        ev.pid = (pid_tgid >> 32) as u32;
        ev.tid = pid_tgid as u32;
        ev.kind = KIND_EXIT;
        ev.probe_id = cookie as u32;
        ev.has_blob = 0;
        ev.has_deref = 0;
        ev.args[0] = ret;
        ev.args[1] = 0;
        if (cookie >> COOKIE_DEREF_SHIFT) & 0xff != 0 {
            // SAFETY: map lookup by value; the pointer is read with the user-read helper.
            if let Some(ptr) = unsafe { OUTPTR.get(&ev.tid) } {
                let p = *ptr;
                if let Ok(v) = unsafe { bpf_probe_read_user(p as *const u64) } {
                    ev.args[1] = v;
                    ev.has_deref = 1;
                }
            }
            let _ = OUTPTR.remove(&ev.tid);
        }
        entry.submit(lazy_flags(CPU_STATE.get_ptr_mut(0)));
    }

    /// Entry of a probe attached with its return program.
    #[uprobe]
    pub fn call_enter(ctx: ProbeContext) -> u32 {
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        record_enter(&ctx, cookie, KIND_ENTER);
        0
    }

    /// Return of a probe attached with [`call_enter`].
    #[uretprobe]
    pub fn call_exit(ctx: RetProbeContext) -> u32 {
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        record_exit(cookie, ctx.ret::<u64>());
        0
    }

    /// Processes whose session-probed calls are complete at their entry (see
    /// `agent_common::ENTRY_ALONE_MAP`).
    #[map(name = "ENTRY_ALONE")]
    static ENTRY_ALONE: HashMap<u32, u8> = HashMap::with_max_entries(ENTRY_ALONE_ENTRIES, 0);

    /// `bpf_session_is_return()`: the loader rewrites this call (a helper id no helper has)
    /// into a call of the kfunc; only its low byte is defined (a C `bool`).
    #[inline(always)]
    fn session_is_return() -> bool {
        // SAFETY: a call instruction the loader patches into the kfunc call; no arguments.
        let f: unsafe extern "C" fn() -> u64 = unsafe { core::mem::transmute(SESSION_IS_RETURN_PLACEHOLDER as usize) };
        unsafe { f() & 0xff != 0 }
    }

    /// Entry and return in one program (a uprobe session): the entry of a call by a process
    /// in `ENTRY_ALONE` is recorded as the whole call and returns 1, which tells the kernel not
    /// to run the return for this call — one probe hit per asynchronous NCCL call. Any other
    /// process keeps its return (0), recorded as with [`call_exit`].
    ///
    /// Written without `#[uprobe]`: its expansion returns 0 whatever the function returns,
    /// and this program's return value is the decision.
    #[unsafe(no_mangle)]
    #[unsafe(link_section = "uprobe")]
    pub fn call_session(raw: *mut core::ffi::c_void) -> u32 {
        let ctx = ProbeContext::new(raw);
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        if session_is_return() {
            record_exit(cookie, return_value(&ctx));
            return 0;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // SAFETY: map lookup by value; only presence is used.
        let alone = unsafe { ENTRY_ALONE.get(&tgid) }.is_some();
        record_enter(&ctx, cookie, if alone { KIND_ENTER_ALONE } else { KIND_ENTER });
        alone as u32
    }

    /// The baseline of `bench probes` (never attached by the agent): a uprobe running a BPF
    /// program that does nothing, the cost any uprobe-based tracer starts from.
    #[uprobe]
    pub fn empty_enter(_ctx: ProbeContext) -> u32 {
        0
    }

    /// The return half of the baseline.
    #[uretprobe]
    pub fn empty_exit(_ctx: RetProbeContext) -> u32 {
        0
    }

    /// Source address (v4-mapped IPv6) → retransmitted segments, per CPU.
    #[map(name = "TCP_RETRANS")]
    static TCP_RETRANS: PerCpuHashMap<[u8; 16], u64> = PerCpuHashMap::with_max_entries(4096, 0);

    /// `tcp:tcp_retransmit_skb`: the congestion signal when collectives run over TCP.
    #[tracepoint]
    pub fn tcp_retransmit(ctx: TracePointContext) -> u32 {
        // SAFETY: reads inside the tracepoint record at offsets the agent verified.
        let family: u16 = unsafe { ctx.read_at(TCP_TP_FAMILY_OFFSET) }.unwrap_or(0);
        let mut key = [0u8; 16];
        if family == 2 {
            let v4: [u8; 4] = unsafe { ctx.read_at(TCP_TP_SADDR_OFFSET) }.unwrap_or([0; 4]);
            key[10] = 0xff;
            key[11] = 0xff;
            key[12] = v4[0];
            key[13] = v4[1];
            key[14] = v4[2];
            key[15] = v4[3];
        } else {
            key = unsafe { ctx.read_at(TCP_TP_SADDR_V6_OFFSET) }.unwrap_or([0; 16]);
        }
        match TCP_RETRANS.get_ptr_mut(&key) {
            // SAFETY: per-CPU value, no concurrent writer on this CPU.
            Some(p) => unsafe { *p += 1 },
            None => {
                let _ = TCP_RETRANS.insert(&key, &1, 0);
            }
        }
        0
    }

    #[cfg(not(test))]
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

/// Host builds (clippy, `cargo check --workspace`) compile this stub instead.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
