//! Stepwise eBPF programs: one uprobe and one uretprobe, attached by the agent to every
//! probed library function. The agent sets a per-attachment cookie (`probe_id`) so one pair of
//! programs serves every symbol; decoding of arguments happens in userspace.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod programs {
    use agent_common::{ProbeEvent, EVENTS_RING_BYTES, KIND_ENTER, KIND_EXIT};
    use aya_ebpf::{
        helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_attach_cookie},
        macros::{map, uprobe, uretprobe},
        maps::{PerCpuArray, RingBuf},
        programs::{ProbeContext, RetProbeContext},
        EbpfContext,
    };

    #[map(name = "EVENTS")]
    static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

    /// Index 0: events dropped because the RingBuf was full. A full ring never blocks the
    /// traced thread: the event is dropped and counted.
    #[map(name = "DROPS")]
    static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

    #[inline(always)]
    fn count_drop() {
        if let Some(p) = DROPS.get_ptr_mut(0) {
            // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
            unsafe { *p += 1 };
        }
    }

    #[inline(always)]
    fn header(cookie: u64, kind: u32) -> ProbeEvent {
        let pid_tgid = bpf_get_current_pid_tgid();
        ProbeEvent {
            // SAFETY: helper without arguments.
            ts_ns: unsafe { bpf_ktime_get_ns() },
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
            kind,
            probe_id: cookie as u32,
            args: [0; 6],
            stack: [0; 2],
        }
    }

    #[uprobe]
    pub fn call_enter(ctx: ProbeContext) -> u32 {
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        let mut ev = header(cookie, KIND_ENTER);
        let mut i = 0;
        while i < 6 {
            ev.args[i] = ctx.arg::<u64>(i).unwrap_or(0);
            i += 1;
        }
        // SysV x86-64: at entry [rsp] is the return address, stack arguments start at rsp+8.
        // SAFETY: regs points at the probed thread's saved registers.
        let rsp = unsafe { (*ctx.regs).rsp };
        // SAFETY: user memory read through the helper; a fault yields an error, not a crash.
        ev.stack[0] = unsafe { bpf_probe_read_user((rsp + 8) as *const u64) }.unwrap_or(0);
        ev.stack[1] = unsafe { bpf_probe_read_user((rsp + 16) as *const u64) }.unwrap_or(0);
        if EVENTS.output::<ProbeEvent>(&ev, 0).is_err() {
            count_drop();
        }
        0
    }

    #[uretprobe]
    pub fn call_exit(ctx: RetProbeContext) -> u32 {
        // SAFETY: the context pointer is the program's own.
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        let mut ev = header(cookie, KIND_EXIT);
        ev.args[0] = ctx.ret::<u64>();
        if EVENTS.output::<ProbeEvent>(&ev, 0).is_err() {
            count_drop();
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
