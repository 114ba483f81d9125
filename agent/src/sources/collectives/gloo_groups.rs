//! gloo process groups, one communicator each (`docs/architecture.md`, `CommId`).
//!
//! PyTorch makes a group's gloo contexts inside `ProcessGroupGloo`'s constructor
//! (`gloo::Context::Context(rank, size, base)`: the context's address, the rank in the group
//! and its size) and names the group right after, on the same thread
//! (`c10d::ProcessGroup::setGroupName`). The name is what `torch.distributed` gives every
//! rank alike — a count of the groups created so far, which every rank advances, member or
//! not — so `job + name` is the group's identity on every host. Each collective's options
//! start with its context's address, which finds the group again.
//!
//! The process's first context is its default group's (`init_process_group` comes before any
//! `new_group`): it keeps the job-wide `gloo-default` identity, the one an agent that came in
//! after the groups were made gives every context it never saw made (so two hosts' agents
//! agree on the world group whenever each came in). A later context never named (a name
//! longer than the 15 bytes a `std::string` keeps inline, a PyTorch without `setGroupName`)
//! is local to its process.

use agent_common::ProbeEvent;

use super::{fnv1a, CallDecoder, CommId, CommState, ProcInfo};

/// Most contexts kept waiting for their group's name per thread.
const MAX_UNNAMED: usize = 64;

/// The text of a `std::string` (libstdc++: data pointer, length, then the inline buffer of up
/// to 15 bytes) copied from address `at` into the event's blob, when it lies inline.
pub fn short_string(ev: &ProbeEvent, at: u64) -> Option<&[u8]> {
    if ev.has_blob != 1 {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(ev.blob[i..i + 8].try_into().unwrap_or([0; 8]));
    let (ptr, len) = (word(0), word(8));
    (ptr == at.wrapping_add(16) && len <= 15).then(|| &ev.blob[16..16 + len as usize])
}

/// The identity of the gloo group named `name` in `job`.
pub fn group_id(job: &str, name: &[u8]) -> CommId {
    CommId(fnv1a(&[b"gloo-group", job.as_bytes(), name]))
}

/// The job-wide identity of a process's default group, when nothing better is known.
pub fn default_id(job: &str) -> CommId {
    CommId(fnv1a(&[b"gloo-default", job.as_bytes()]))
}

impl CallDecoder {
    /// `gloo::Context::Context(this, rank, size, base)` entered.
    pub(super) fn gloo_context(&mut self, ev: &ProbeEvent, proc: &ProcInfo) {
        let ctx = ev.args[0];
        let made = self.gloo.made.entry(ev.pid).or_default();
        let job = proc.job();
        let default = *made == 0;
        let (id, global) =
            if default { (default_id(&job), job != "job=unknown") } else { (CommId(fnv1a(&[b"local", &ev.pid.to_le_bytes(), &ctx.to_le_bytes()])), false) };
        *made += 1;
        let (rank, size) = (ev.args[1] as u32, ev.args[2] as u32);
        let st = CommState { id, global, rank: Some(rank), nranks: Some(size), next_seq: 0, splits: 0, group_creates: 0 };
        self.comms.insert((ev.pid, ctx), st);
        self.gloo.canonical.remove(&(ev.pid, ctx));
        if default {
            // The default group keeps the identity an agent that came in later gives it.
            return;
        }
        let waiting = self.gloo.unnamed.entry((ev.pid, ev.tid)).or_default();
        if waiting.len() >= MAX_UNNAMED {
            waiting.remove(0);
        }
        waiting.push(ctx);
    }

    /// `c10d::ProcessGroup::setGroupName(this, name)` entered: the contexts this thread made
    /// since are that group's.
    pub(super) fn gloo_group_name(&mut self, ev: &ProbeEvent, proc: &ProcInfo) {
        let Some(ctxs) = self.gloo.unnamed.remove(&(ev.pid, ev.tid)) else { return };
        let Some(name) = short_string(ev, ev.args[1]) else { return };
        let job = proc.job();
        let id = group_id(&job, name);
        let first = ctxs.first().copied();
        for ctx in ctxs {
            if let Some(st) = self.comms.get_mut(&(ev.pid, ctx)) {
                st.id = id;
                st.global = job != "job=unknown";
            }
            // A group of several contexts (one per device) numbers its collectives as one.
            if let Some(f) = first.filter(|f| *f != ctx) {
                self.gloo.canonical.insert((ev.pid, ctx), f);
            }
        }
    }

    /// The context a gloo collective's options name (the group's first when it has several;
    /// 0 when the options were not read).
    pub(super) fn gloo_handle(&self, ev: &ProbeEvent) -> u64 {
        if ev.has_blob != 1 {
            return 0;
        }
        let ctx = u64::from_le_bytes(ev.blob[..8].try_into().unwrap_or([0; 8]));
        self.gloo.canonical.get(&(ev.pid, ctx)).copied().unwrap_or(ctx)
    }

    pub(super) fn gloo_forget(&mut self, pid: u32) {
        self.gloo.made.remove(&pid);
        self.gloo.unnamed.retain(|(p, _), _| *p != pid);
        self.gloo.canonical.retain(|(p, _), _| *p != pid);
    }
}

/// What the decoder keeps about gloo groups.
#[derive(Default)]
pub struct GlooGroups {
    /// Per process: contexts made so far.
    made: std::collections::HashMap<u32, u64>,
    /// (pid, tid) → contexts made on that thread, not named yet.
    unnamed: std::collections::HashMap<(u32, u32), Vec<u64>>,
    /// (pid, context) → the first context of its group, whose count its collectives share.
    canonical: std::collections::HashMap<(u32, u64), u64>,
}
