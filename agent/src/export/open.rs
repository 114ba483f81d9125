//! `/api/v1/open`: this host's open calls, last completed calls, exited ranks and the hang
//! detector's verdicts, with the scheduler state of every live traced process read from
//! procfs at request time. `agent diagnose --hang` joins every host's answer.

use std::collections::{HashMap, HashSet};

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};

use super::api::AppState;
use crate::{
    hang::Hang,
    sources::collectives::exits,
    timeline::open::{HostProgress, ProcState},
};

/// Processes whose state one response reads at most.
pub const MAX_STATES: usize = 256;

/// The wire form of `/api/v1/open` (also what `diagnose --hang` reads back).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpenWire {
    #[serde(flatten)]
    pub view: HostProgress,
    /// `[hang]` of this agent.
    pub hang: crate::config::HangConfig,
    /// The detector's verdicts (with hysteresis), the suspected first.
    pub hangs: Vec<Hang>,
    /// More communicators than `limit` were tracked.
    pub truncated: bool,
    /// Desyncs the agent found in the last 10 minutes (ranks whose calls at one sequence
    /// number differ), the latest first.
    #[serde(default)]
    pub desyncs: Vec<crate::timeline::desync::Desync>,
    /// The latest answer of NCCL's RAS service on this host (`sources::ras`); `None`: not
    /// asked (`ras_addr` empty, or an older agent).
    #[serde(default)]
    pub ras: Option<crate::sources::ras::RasView>,
}

/// Fills `state` of every live rank (each process read once, at most [`MAX_STATES`]).
fn fill_states(view: &mut HostProgress, proc_root: &std::path::Path, pod_logs: &std::path::Path) -> HashMap<u32, ProcState> {
    let inside: HashSet<u32> = view.comms.iter().flat_map(|c| c.ranks.iter()).filter(|r| r.open.is_some()).map(|r| r.pid).collect();
    let mut states: HashMap<u32, Option<ProcState>> = HashMap::new();
    for r in view.comms.iter_mut().flat_map(|c| c.ranks.iter_mut()).filter(|r| r.exited.is_none()) {
        if !states.contains_key(&r.pid) && states.len() >= MAX_STATES {
            continue;
        }
        r.state = states
            .entry(r.pid)
            .or_insert_with(|| {
                let pod = crate::sources::collectives::k8s::pod_of(proc_root, r.pid, pod_logs).map(|p| match (p.namespace, p.name) {
                    (Some(ns), Some(name)) => format!("{ns}/{name}"),
                    _ => format!("uid {}", p.uid),
                });
                exits::proc_state(proc_root, r.pid).map(|s| ProcState { in_probed_call: inside.contains(&r.pid), pod, ..s })
            })
            .clone();
    }
    states.into_iter().filter_map(|(p, s)| s.map(|s| (p, s))).collect()
}

pub fn page(s: &AppState, comm: Option<&str>, limit: usize) -> Response {
    let hist = s.collectives.read().ok().and_then(|g| g.clone());
    let Some(hist) = hist else {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({"error": "collective probes are not running (see /api/v1/status)"}))).into_response();
    };
    let (mut view, proc_root) = {
        let h = match hist.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        (h.progress.snapshot(&h.host, h.drained_until), (h.proc_root.clone(), h.pod_logs.clone()))
    };
    view.comms.retain(|c| comm.is_none_or(|id| c.comm == id));
    // The longest-open first, then the rest.
    let oldest = |c: &crate::timeline::open::CommProgress| c.ranks.iter().filter_map(|r| r.open.as_ref().map(|o| o.since)).fold(f64::INFINITY, f64::min);
    view.comms.sort_by(|a, b| oldest(a).total_cmp(&oldest(b)));
    let truncated = view.comms.len() > limit;
    view.comms.truncate(limit);
    let states = fill_states(&mut view, &proc_root.0, &proc_root.1);
    let (cfg, mut hangs, mut desyncs) = match &s.engine {
        Some(e) => {
            let e = match e.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            (e.hang().config().clone(), e.hang().hangs().to_vec(), e.desyncs())
        }
        None => (Default::default(), Vec::new(), Vec::new()),
    };
    desyncs.retain(|d| comm.is_none_or(|id| d.comm == id));
    hangs.retain(|h| view.comms.iter().any(|c| c.comm == h.comm));
    for m in hangs.iter_mut().flat_map(|h| h.missing.iter_mut()) {
        if let Some(st) = m.pid.and_then(|p| states.get(&p)) {
            m.state = Some(st.clone());
        }
    }
    Json(OpenWire { view, hang: cfg, hangs, truncated, desyncs, ras: crate::sources::ras::latest() }).into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::{
        extract::{Query, State},
        http::Uri,
    };

    use super::*;
    use crate::sources::collectives::{
        decode::{Call, CommId},
        history::History,
        targets::Family,
    };

    fn call(comm: u64, pid: u32, seq: u64) -> Call {
        Call {
            pid,
            tid: pid,
            library: Family::Mpi,
            op: "all_reduce".into(),
            bytes: None,
            comm: Some(CommId(comm)),
            comm_global: true,
            rank: Some(0),
            nranks: Some(1),
            seq: Some(seq),
            enter_ns: 0,
            exit_ns: 0,
            ret: Some(0),
            aborted: false,
            grouped: false,
        }
    }

    fn state(with_probes: bool) -> AppState {
        let s = AppState::new(prometheus_client::registry::Registry::default());
        if with_probes {
            let mut h = History::new("h".into(), 16);
            // Two communicators; this test process is the rank of the first (a live pid).
            h.progress.observe(&call(7, std::process::id(), 0), 1.0, 2.0, crate::timeline::join::Timing::HostCompletion);
            h.progress.set_open(vec![(call(7, std::process::id(), 1), 3.0)]);
            h.progress.observe(&call(8, 999_999_999, 0), 1.0, 2.0, crate::timeline::join::Timing::HostCompletion);
            *s.collectives.write().expect("lock") = Some(Arc::new(Mutex::new(h)));
        }
        s
    }

    async fn get(s: &AppState, q: &str) -> (u16, serde_json::Value) {
        let q = Query::try_from_uri(&format!("http://agent/api/v1/open?{q}").parse::<Uri>().expect("uri"));
        let r = super::super::api::open(State(s.clone()), q).await;
        let status = r.status().as_u16();
        let b = axum::body::to_bytes(r.into_body(), usize::MAX).await.expect("body");
        (status, serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null))
    }

    #[test]
    fn open_validates_its_query_pages_and_reads_live_states() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        rt.block_on(async {
            assert_eq!(get(&state(false), "").await.0, 503, "no probes: 503");
            let s = state(true);
            for bad in ["comm=xyz", "comm=00000000000000071", "limit=-1", "limit=x"] {
                assert_eq!(get(&s, bad).await.0, 400, "{bad}");
            }
            let (st, v) = get(&s, "").await;
            assert_eq!((st, v["comms"].as_array().map(Vec::len)), (200, Some(2)));
            assert_eq!(v["comms"][0]["comm"], "0000000000000007", "the one with an open call first");
            let me = &v["comms"][0]["ranks"][0];
            assert_eq!(me["open"]["seq"], 1);
            assert_eq!(me["state"]["in_probed_call"], true, "{me}");
            assert!(me["state"]["state"].as_str().is_some_and(|x| x.starts_with('R') || x.starts_with('S')), "{me}");
            assert!(v["comms"][1]["ranks"][0]["state"].is_null(), "a vanished pid has no state");
            let (_, one) = get(&s, "limit=1").await;
            assert_eq!((one["comms"].as_array().map(Vec::len), &one["truncated"]), (Some(1), &serde_json::Value::Bool(true)));
            let (_, only) = get(&s, "comm=0000000000000008").await;
            assert_eq!(only["comms"].as_array().map(|c| c.iter().map(|x| x["comm"].clone()).collect::<Vec<_>>()), Some(vec!["0000000000000008".into()]));
            assert_eq!(only["hang"]["floor"], "30s", "the agent's [hang] settings are served");
        });
    }

    #[test]
    fn the_served_page_reads_back_as_what_diagnose_hang_uses() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        rt.block_on(async {
            let (st, v) = get(&state(true), "limit=1").await;
            assert_eq!(st, 200);
            let w: OpenWire = serde_json::from_value(v.clone()).expect("parse");
            assert!(w.truncated && w.view.comms.len() == 1 && w.view.comms[0].ranks[0].state.is_some(), "{v}");
            assert_eq!(serde_json::to_value(&w).expect("json"), v, "nothing lost reading it back");
        });
        let w = OpenWire {
            hangs: vec![Hang { comm: "00000000000000aa".into(), suspected: true, suspected_since: Some(90.0), ..Default::default() }],
            ..Default::default()
        };
        assert_eq!(serde_json::from_str::<OpenWire>(&serde_json::to_string(&w).expect("json")).expect("parse"), w);
    }
}
