//! eBPF RingBuf records → calls. The decoder's input is whatever the kernel copied out of the
//! traced processes' registers and stack (any values: a process can call `ncclAllReduce` with
//! garbage), in any order (a process killed mid-call, a tid reused, records dropped when the
//! ring is full). Records arrive raw (48 to 224 bytes, any content, short ones included) or shaped
//! (real probe ids, few pids/tids, so entries and exits pair and communicators recur).
#![no_main]

use std::sync::LazyLock;

use agent_common::{ProbeEvent, ENTER_RECORD_BYTES, ENTER_STACK_RECORD_BYTES, EXIT_RECORD_BYTES, KIND_ENTER, KIND_ENTER_ALONE, KIND_EXIT, MIN_RECORD_BYTES};
use libfuzzer_sys::fuzz_target;
use stepwise::{
    attribution::{attribute, Params, StepData},
    config::collectives::UserProbe,
    ebpf::event_from_record,
    sources::collectives::{
        decode::{CallDecoder, Decoded, ProbeInfo, ProcInfo},
        history::History,
        procs::parse_environ,
        targets,
    },
    timeline::{join::CallView, join_calls, Collective, NicWindow, Step, StepSource},
};

const EVENT: usize = std::mem::size_of::<ProbeEvent>();

/// Every probe of the NCCL, MPI and Gloo targets and one user probe, numbered from 1 — built
/// once (building the targets' tables was a tenth of an input's time).
fn probes() -> &'static [(u32, ProbeInfo)] {
    static PROBES: LazyLock<Vec<(u32, ProbeInfo)>> = LazyLock::new(|| {
        let user = UserProbe {
            library: "libx.so".into(),
            symbol: "x".into(),
            op: "x_op".into(),
            count_arg: Some(7),
            elem_size: u64::MAX,
            comm_arg: Some(200),
            blocking: true,
        };
        let mut out = Vec::new();
        for t in [targets::nccl(), targets::mpi(), targets::gloo(), user.target()] {
            for p in t.probes {
                let id = out.len() as u32 + 1;
                out.push((id, ProbeInfo { family: p.family, op: p.op, decoder: p.decoder, user_op: p.user_op }));
            }
        }
        out
    });
    &PROBES
}

/// A fresh decoder per input (its state must not carry over), with every probe registered.
fn decoder() -> (CallDecoder, u32) {
    let mut d = CallDecoder::default();
    for (id, info) in probes() {
        d.register(*id, info.clone());
    }
    (d, probes().len() as u32)
}

/// The processes the records come from: one without facts, one an OpenMPI rank. Read-only
/// to the decoder, so built once.
static PROCS: LazyLock<[ProcInfo; 2]> = LazyLock::new(|| {
    let mut p = ProcInfo { env: parse_environ(b"OMPI_COMM_WORLD_RANK=1\0OMPI_COMM_WORLD_SIZE=4\0PMIX_NAMESPACE=job7\0"), ..Default::default() };
    p.ompi_world = Some(0x10);
    p.ompi_types.insert(0x20, 4);
    p.ompi_types.insert(0x21, 8);
    [ProcInfo::default(), p]
});

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u64 {
        let b = self.take(2);
        u64::from(b.first().copied().unwrap_or(0)) | u64::from(b.get(1).copied().unwrap_or(0)) << 8
    }
}

fuzz_target!(|data: &[u8]| {
    let (mut d, nprobes) = decoder();
    let procs = &*PROCS;
    let mut r = Reader(data);
    let mut ts = 1_000_000u64;
    let mut hist = History::new("fuzz".into(), 64);
    while !r.0.is_empty() {
        let ctl = r.u8();
        let ev = match ctl % 4 {
            // A raw record of any length the programs write (48, 80, 96, 224 bytes) or
            // another, possibly too short (then skipped, as `drain` does).
            0 => {
                let len = if ctl & 0x80 != 0 {
                    EVENT - usize::from(ctl >> 2 & 0x1f) * 7
                } else {
                    [EVENT, EXIT_RECORD_BYTES, ENTER_RECORD_BYTES, ENTER_STACK_RECORD_BYTES][usize::from(ctl >> 2 & 3)]
                };
                let rec = r.take(len);
                match event_from_record(rec) {
                    Some(ev) => {
                        // A record's bytes, then zeros.
                        let n = rec.len().min(EVENT);
                        // SAFETY: reading the bytes of a repr(C) integer-only struct.
                        let bytes = unsafe { std::slice::from_raw_parts((&ev as *const ProbeEvent).cast::<u8>(), EVENT) };
                        assert!(bytes[..n] == rec[..n] && bytes[n..].iter().all(|b| *b == 0));
                        ev
                    }
                    None => {
                        assert!(rec.len() < MIN_RECORD_BYTES);
                        continue;
                    }
                }
            }
            // The process exited: its calls in flight come back aborted.
            1 => {
                let pid = u32::from(r.u8() % 3);
                for c in d.process_exited(pid, ts) {
                    assert!(c.aborted && c.pid == pid);
                }
                continue;
            }
            // A shaped record: 2 + 2 + 16 bytes.
            _ => {
                let who = r.u8();
                let probe_id = u32::from(r.u8()) % (nprobes + 2);
                ts = ts.saturating_add(r.u16());
                let pid = u32::from(who & 3) % 3;
                let mut ev = ProbeEvent {
                    ts_ns: ts,
                    pid,
                    tid: pid * 4 + u32::from(who >> 2 & 3),
                    kind: match (who & 0x10 != 0, r.u8() & 7) {
                        (true, _) => KIND_EXIT,
                        (false, 0) => KIND_ENTER_ALONE,
                        (false, _) => KIND_ENTER,
                    },
                    probe_id,
                    has_blob: u32::from(who >> 5 & 1),
                    has_deref: u32::from(who >> 6 & 1),
                    ..ProbeEvent::default()
                };
                for a in ev.args.iter_mut() {
                    *a = r.u16();
                }
                for s in ev.stack.iter_mut() {
                    *s = r.u16();
                }
                ev.blob = [who; agent_common::BLOB_BYTES];
                ev
            }
        };
        match d.feed(&ev, &procs[usize::from(ctl >> 7)]) {
            Ok(Decoded::Call(c)) => hist.push_call(c),
            Ok(Decoded::CallWithError(c, e)) => {
                let _ = e.kind();
                assert_eq!((c.enter_ns, c.exit_ns), (ev.ts_ns, ev.ts_ns), "a call left alone is complete at its entry");
                hist.push_call(c);
            }
            Ok(Decoded::Net(n)) => {
                assert_eq!(n.pid, ev.pid);
                hist.push_net(n);
            }
            Ok(Decoded::Nothing) => {}
            Err(e) => {
                let _ = e.kind();
            }
        }
    }
    // Bounded state: what is tracked never exceeds what was fed.
    assert!(d.tracked_comms() <= data.len());

    // Downstream, as the API serves the calls and `diagnose` joins and attributes them.
    let json = serde_json::to_value(hist.calls_since(f64::MIN, usize::MAX)).expect("calls serialize");
    let _ = serde_json::to_string(&hist.net_since(f64::MIN, usize::MAX)).expect("net serializes");
    let views: Vec<CallView> = serde_json::from_value(json).expect("served calls read back as CallView");
    let joined: Vec<Collective> = join_calls(views.iter());
    let (begin, end) = joined.iter().fold((f64::MAX, f64::MIN), |(b, e), c| (b.min(c.first_arrival()), e.max(c.last_exit())));
    if joined.is_empty() || !(begin < end) {
        return;
    }
    let step = Step { id: 1, begin, end, source: StepSource::Period, ranks: Default::default() };
    let refs: Vec<&Collective> = joined.iter().collect();
    let windows: Vec<Vec<NicWindow>> = joined.iter().map(|_| Vec::new()).collect();
    let a = attribute(&StepData { step: &step, collectives: &refs, windows: &windows, net: &[], same_host: &[], dropped_events: false }, &Params::default());
    assert!(a.seconds.is_finite() && a.causes.iter().all(|c| c.seconds.is_finite() && c.share.is_finite()), "{a:?}");
});
