//! Stepwise eBPF programs: one uprobe and one uretprobe, attached by the agent to every
//! probed library function. The uprobe cookie (see `agent_common::cookie`) carries the probe
//! id and capture flags, so one pair of programs serves every symbol; argument decoding
//! happens in userspace.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod programs {
    use agent_common::{ProbeEvent, BLOB_BYTES, COOKIE_DEREF_SHIFT, COOKIE_STACK_ARGS, COOKIE_STACK_BLOB, EVENTS_RING_BYTES, KIND_ENTER, KIND_EXIT, KNOWN_ENTRIES, TCP_TP_FAMILY_OFFSET, TCP_TP_SADDR_OFFSET, TCP_TP_SADDR_V6_OFFSET};
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

    /// Submit flags. The first event of a process wakes the agent (default flags: a wakeup
    /// when it waits in poll), so it reads the process's /proc entry while it exists. After
    /// that, and always for hot probes (COOKIE_LAZY_WAKE), events do not wake it — it drains
    /// on a 20 ms timer anyway, and a wakeup per event costs the traced thread more than the
    /// probe itself — except the one that fills the ring past each sixteenth, and every one
    /// past three quarters.
    #[inline(always)]
    fn wake_flags(cookie: u64, tgid: u32) -> u64 {
        const BPF_RB_AVAIL_DATA: u64 = 0;
        const BPF_RB_NO_WAKEUP: u64 = 1;
        const BPF_RB_FORCE_WAKEUP: u64 = 2;
        if cookie & agent_common::COOKIE_LAZY_WAKE == 0 {
            // SAFETY: map lookup by value; only presence is used.
            if unsafe { KNOWN.get(&tgid) }.is_none() {
                let _ = KNOWN.insert(&tgid, &1, 0);
                return 0;
            }
        }
        // Only the record that fills the ring past each sixteenth forces a wakeup (about one
        // in 280 events while it fills): the agent is woken early and often enough to keep up,
        // and the traced thread pays for one irq_work per sixteenth. Forcing one on every
        // record past a quarter queued an irq_work (a self-IPI, a VM exit in a guest) per
        // event while the agent was on its way: 9 µs per call measured.
        // Past three quarters (the agent lags: drops are near) every record forces one.
        let step = (EVENTS_RING_BYTES / 16) as u64;
        let avail = EVENTS.query(BPF_RB_AVAIL_DATA);
        let before = avail.saturating_sub(RECORD_BYTES);
        if avail >= 12 * step || (avail >= step && avail / step != before / step) { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP }
    }

    /// Bytes one event takes in the ring (8-byte record header, 8-byte aligned).
    const RECORD_BYTES: u64 = ((core::mem::size_of::<ProbeEvent>() + 8 + 7) & !7) as u64;

    #[inline(always)]
    fn count_drop() {
        if let Some(p) = DROPS.get_ptr_mut(0) {
            // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
            unsafe { *p += 1 };
        }
    }

    #[inline(always)]
    fn fill_header(ev: &mut ProbeEvent, cookie: u64, kind: u32) {
        let pid_tgid = bpf_get_current_pid_tgid();
        // SAFETY: helper without arguments.
        ev.ts_ns = unsafe { bpf_ktime_get_ns() };
        ev.pid = (pid_tgid >> 32) as u32;
        ev.tid = pid_tgid as u32;
        ev.kind = kind;
        ev.probe_id = cookie as u32;
        ev.has_blob = 0;
        ev.has_deref = 0;
    }

    #[uprobe]
    pub fn call_enter(ctx: ProbeContext) -> u32 {
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        let Some(mut entry) = EVENTS.reserve::<ProbeEvent>(0) else {
            count_drop();
            return 0;
        };
        let ev = entry.as_mut_ptr();
        // SAFETY: `ev` points at a reserved, exclusively owned RingBuf record of our type.
        let ev = unsafe { &mut *ev };
        fill_header(ev, cookie, KIND_ENTER);
        ev.args[0] = ctx.arg::<u64>(0).unwrap_or(0);
        ev.args[1] = ctx.arg::<u64>(1).unwrap_or(0);
        ev.args[2] = ctx.arg::<u64>(2).unwrap_or(0);
        ev.args[3] = ctx.arg::<u64>(3).unwrap_or(0);
        ev.args[4] = ctx.arg::<u64>(4).unwrap_or(0);
        ev.args[5] = ctx.arg::<u64>(5).unwrap_or(0);
        // SysV x86-64: at entry [rsp] is the return address, stack arguments start at rsp+8.
        // SAFETY: regs points at the probed thread's saved registers.
        let rsp = unsafe { (*ctx.regs).rsp };
        if cookie & COOKIE_STACK_ARGS != 0 {
            // SAFETY: user memory reads through the helper; a fault yields an error, not a crash.
            ev.stack[0] = unsafe { bpf_probe_read_user((rsp + 8) as *const u64) }.unwrap_or(0);
            ev.stack[1] = unsafe { bpf_probe_read_user((rsp + 16) as *const u64) }.unwrap_or(0);
        } else {
            ev.stack = [0; 2];
        }
        if cookie & COOKIE_STACK_BLOB != 0 {
            // SAFETY: as above; the destination is the record's own buffer.
            let ok = unsafe { bpf_probe_read_user_buf((rsp + 8) as *const u8, &mut ev.blob[..BLOB_BYTES]) }.is_ok();
            ev.has_blob = ok as u32;
        }
        let deref = (cookie >> COOKIE_DEREF_SHIFT) & 0xff;
        if deref != 0 {
            let idx = (deref - 1) as usize;
            // 0..5: register arguments; 6, 7: the first two stack arguments.
            let ptr = if idx < 6 { ev.args[idx] } else if idx == 6 { ev.stack[0] } else { ev.stack[1] };
            let _ = OUTPTR.insert(&ev.tid, &ptr, 0);
        }
        let pid = ev.pid;
        entry.submit(wake_flags(cookie, pid));
        0
    }

    #[uretprobe]
    pub fn call_exit(ctx: RetProbeContext) -> u32 {
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        let Some(mut entry) = EVENTS.reserve::<ProbeEvent>(0) else {
            count_drop();
            return 0;
        };
        // SAFETY: exclusively owned reserved record.
        let ev = unsafe { &mut *entry.as_mut_ptr() };
        fill_header(ev, cookie, KIND_EXIT);
        ev.args[0] = ctx.ret::<u64>();
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
        let pid = ev.pid;
        entry.submit(wake_flags(cookie, pid));
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
