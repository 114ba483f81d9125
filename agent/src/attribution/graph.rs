//! Collectives launched by CUDA-graph replay (issue 34, docs/profiler-plugin.md "CUDA
//! graphs"): what the step can and cannot say about them.
//!
//! A collective captured into a CUDA graph runs at every `cudaGraphLaunch` with no NCCL API
//! call on the host: the uprobes fire once, at capture. NCCL (2.28-2.30, src/enqueue.cc
//! `hostStreamPlanTask`) still starts the Coll event and its KernelCh/ProxyOp/ProxyStep events
//! at each replay, from the graph's host node, and the plugin flags those records; the GPU
//! times come from the kernel as for any launch. The host side is what is missing.

use serde::{Deserialize, Serialize};

use crate::timeline::join::Collective;

/// What is timed for this step's graph-replayed arrivals.
pub const TIMED: [&str; 3] = [
    "gpu_start (KernelCh start: the GPU reached the collective; readiness skew is computed from it)",
    "gpu_end (KernelCh stop)",
    "proxy_waits and network requests (ProxyStep events, when asked for)",
];
/// What is not.
pub const NOT_TIMED: [&str; 3] = [
    "host call: no NCCL API call runs at replay (the uprobes fired once, at capture), so there is no host-side arrival",
    "host enqueue skew: host_enqueue is when the graph's host node ran, not when the training loop reached the collective",
    "host-side hang evidence (a rank stuck inside a call): only the GPU-side progress records exist",
];

/// The step's collectives that came from graph replays.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GraphReplay {
    /// Arrivals (a rank's part in a collective) launched by graph replay.
    pub arrivals: usize,
    /// All the step's arrivals.
    pub of: usize,
    pub timed: Vec<String>,
    pub not_timed: Vec<String>,
}

/// `None` when no arrival of the step came from a graph replay.
pub fn of(colls: &[&Collective]) -> Option<GraphReplay> {
    let all = colls.iter().flat_map(|c| &c.arrivals);
    let of = all.clone().count();
    let arrivals = all.filter(|a| a.clock.graph_replay).count();
    (arrivals > 0).then(|| GraphReplay {
        arrivals,
        of,
        timed: TIMED.iter().map(|s| s.to_string()).collect(),
        not_timed: NOT_TIMED.iter().map(|s| s.to_string()).collect(),
    })
}

/// The step's note.
pub fn note(g: &GraphReplay) -> String {
    format!(
        "graph replay: {} of {} arrivals were launched by CUDA-graph replay (NCCL profiler events of the replay); timed from the GPU; not timed: the host call (no NCCL call at replay, probes fire at capture only), so no host-side arrival or host enqueue skew",
        g.arrivals, g.of
    )
}
