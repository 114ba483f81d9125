//! Each page as the agent serves it, read back as `agent diagnose` reads it: the same data;
//! and a page from an older agent, without the optional fields, still reads.

use super::*;
use crate::{
    sources::collectives::{
        decode::{Call, CommId, NetRequest},
        targets::Family,
    },
    timeline::{join::ProxyWait, Phase},
};

fn record(comm: Option<u64>, rank: Option<u32>, op: &str, clock: Clocking, aborted: bool) -> CallRecord {
    let call = Call {
        pid: 7,
        tid: 8,
        library: if comm.is_some() { Family::Nccl } else { Family::Mpi },
        op: op.into(),
        bytes: rank.map(|r| 1024 * r as u64),
        comm: comm.map(CommId),
        comm_global: comm.is_some(),
        rank,
        nranks: rank.map(|_| 16),
        seq: comm.map(|c| c + 3),
        enter_ns: 1,
        exit_ns: 2,
        ret: Some(0),
        aborted,
        grouped: false,
    };
    CallRecord { call, host: "node-7".into(), enter: 1_764_000_000.25, exit: 1_764_000_000.5, duration: 0.25, clock }
}

fn records() -> Vec<CallRecord> {
    let gpu = Clocking {
        timing: Timing::Gpu,
        host_enqueue: Some(1_764_000_000.125),
        gpu_offset_error: Some(2e-6),
        proxy_wait: Some(Box::new(ProxyWait { send_wait: 0.01, recv_gpu_wait: 0.02, ..Default::default() })),
        graph_replay: true,
    };
    let host = Clocking { timing: Timing::HostEnqueue, ..Default::default() };
    vec![
        record(Some(0xabc), Some(3), "all_reduce", gpu, false),
        record(Some(0xdef), Some(4), "all_gather", host.clone(), true),
        record(None, None, "send", Clocking::default(), false),
        record(Some(0xabc), Some(5), "all_reduce", host, false),
    ]
}

fn link() -> ProcessLink {
    ProcessLink {
        host: "node-7".into(),
        pid: 42,
        nics: ["rail0".to_string()].into(),
        how: [("rail0".to_string(), "tcp 10.0.0.7:4000 → 10.0.0.8:5000".to_string())].into(),
        complete: true,
    }
}

fn net(send: bool, bytes: Option<u64>) -> NetRecord {
    NetRecord { req: NetRequest { pid: 7, send, bytes, posted_ns: 10, completed_ns: 20 }, posted: 1_764_000_000.5, completed: 1_764_000_000.75 }
}

fn page() -> CollectivesPage {
    CollectivesPage {
        host: "node-7".into(),
        clock_error_seconds: 1e-3,
        clock_synchronized: true,
        evicted: 5,
        drained_until: 1_764_000_001.0,
        drop_spans: vec![(1_764_000_000.25, 1_764_000_000.5)],
        lost_spans: vec![(1_764_000_000.75, 1_764_000_000.75)],
        calls: records(),
        net_requests: vec![net(true, Some(4096)), net(false, None)],
        links: vec![link()],
    }
}

fn net_views() -> Vec<NetView> {
    vec![
        NetView { bytes: Some(4096.0), posted: 1_764_000_000.5, completed: 1_764_000_000.75, send: true },
        NetView { bytes: None, posted: 1_764_000_000.5, completed: 1_764_000_000.75, send: false },
    ]
}

#[test]
fn full_collectives_page_reads_back_as_views() {
    let want: Vec<CallView> = records().iter().map(CallRecord::view).collect();
    let json = serde_json::to_string(&page()).expect("serialize");
    let back: CollectivesPage<CallView, NetView> = serde_json::from_str(&json).expect("parse");
    assert_eq!(
        (back.host.as_str(), back.clock_error_seconds, back.clock_synchronized, back.evicted, back.drained_until),
        ("node-7", 1e-3, true, 5, 1_764_000_001.0)
    );
    assert_eq!(back.calls, want);
    assert_eq!(back.net_requests, net_views());
    assert_eq!(back.links, vec![link()]);
    assert_eq!((back.drop_spans, back.lost_spans), (page().drop_spans, page().lost_spans));
    // What `diagnose` does with an agent that ignores `format=compact`: the full calls.
    let mut old: CompactCollectivesPage<NetView> = serde_json::from_str(&json).expect("parse");
    assert!(old.rows.is_empty() && old.comms.is_empty());
    assert_eq!(old.take_calls().expect("calls"), want);
    assert_eq!((old.net_requests, old.links), (net_views(), vec![link()]));
}

#[test]
fn compact_rows_read_back_as_the_records_views() {
    let want: Vec<CallView> = records().iter().map(CallRecord::view).collect();
    let json = serde_json::to_string(&CompactCollectivesPage::from_page(page())).expect("serialize");
    assert!(json.matches("abc").count() == 1 && json.matches("all_reduce").count() == 1, "each string once: {json}");
    assert!(!json.contains("\"calls\""), "the compact page sends no calls: {json}");
    let mut wire: CompactCollectivesPage<NetView> = serde_json::from_str(&json).expect("parse");
    assert_eq!(wire.take_calls().expect("rows"), want);
    assert_eq!(
        (wire.host.as_str(), wire.clock_error_seconds, wire.clock_synchronized, wire.evicted, wire.drained_until),
        ("node-7", 1e-3, true, 5, 1_764_000_001.0)
    );
    assert_eq!(wire.net_requests, net_views());
    // Which NICs each process uses travels with the calls.
    assert_eq!(wire.links, vec![link()]);
    // So do the spans of dropped and lost probe events (cluster `diagnose` marks the steps
    // they overlap incomplete, as the agent does).
    assert_eq!((wire.drop_spans, wire.lost_spans), (page().drop_spans, page().lost_spans));
    // A row naming a string that is not in its table is refused, not guessed.
    let bad = json.replacen("[0,2751,", "[9,2751,", 1);
    let mut wire: CompactCollectivesPage<NetView> = serde_json::from_str(&bad).expect("parse");
    assert!(wire.take_calls().is_err_and(|e| e.contains("communicator 9")), "{bad}");
}

#[test]
fn collectives_pages_without_the_optional_fields_read() {
    // An agent before clock bounds, links and the compact format; a request without `send`.
    let old = r#"{"host":"node-1","calls":[{"comm":"00000000000000ab","seq":1,"op":"all_reduce","library":"mpi","bytes":8,"rank":0,"nranks":2,"host":"node-1","pid":9,"enter":1.0,"exit":2.0}],"net_requests":[{"posted":1.0,"completed":1.5}]}"#;
    let mut c: CompactCollectivesPage<NetView> = serde_json::from_str(old).expect("old full page");
    let calls = c.take_calls().expect("calls");
    assert_eq!((calls.len(), calls[0].comm_global, calls[0].aborted, calls[0].clock.timing), (1, false, false, Timing::default()));
    assert_eq!((c.clock_error_seconds, c.clock_synchronized, c.links.len()), (0.0, false, 0));
    assert!(c.drop_spans.is_empty() && c.lost_spans.is_empty(), "an agent before the spans: none known");
    assert_eq!(c.net_requests, vec![NetView { bytes: None, posted: 1.0, completed: 1.5, send: false }]);
    let full: CollectivesPage<CallView, NetView> = serde_json::from_str(old).expect("old full page");
    assert_eq!(full.calls, calls);
    // Only the host is required.
    let bare: CompactCollectivesPage<NetView> = serde_json::from_str(r#"{"host":"h"}"#).expect("bare");
    assert!(bare.calls.is_empty() && bare.rows.is_empty() && bare.net_requests.is_empty());
    assert!(serde_json::from_str::<CompactCollectivesPage<NetView>>("{}").is_err(), "no host: not the agent's page");
}

#[test]
fn steps_page_reads_back() {
    let served = StepsPage { host: "node-a".into(), steps: vec![crate::report::fixtures::attribution()] };
    let back: StepsPage = serde_json::from_str(&serde_json::to_string(&served).expect("serialize")).expect("parse");
    assert_eq!(back, served);
}

#[test]
fn markers_page_reads_back_and_ignores_extra_fields() {
    let served = MarkersPage {
        host: "node-a".into(),
        markers: vec![
            Marker { rank: 0, step: 12, phase: Phase::Begin, time: Some(1_764_000_000.125), host: Some("node-a".into()) },
            Marker { rank: 1, step: 12, phase: Phase::End, time: None, host: None },
        ],
        truncated: true,
    };
    let json = serde_json::to_string(&served).expect("serialize");
    let back: MarkersPage = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, served);
    // A newer agent's marker with a field this one does not know still reads (the socket
    // protocol refuses it).
    let newer = json.replacen(r#""rank":0,"#, r#""rank":0,"pid":77,"#, 1);
    assert_ne!(newer, json);
    assert_eq!(serde_json::from_str::<MarkersPage>(&newer).expect("newer"), served);
    assert!(Marker::parse(br#"{"rank":0,"step":1,"phase":"begin","pid":77}"#, 0.0).is_err());
    // Without the host and `truncated` (older agents): one page, no host.
    let old: MarkersPage = serde_json::from_str(r#"{"markers":[{"rank":2,"step":3,"phase":"end"}]}"#).expect("old");
    assert_eq!((old.host.as_str(), old.truncated, old.markers.len(), old.markers[0].time), ("", false, 1, None));
}

#[test]
fn windows_page_reads_back() {
    let nic = NicInfo { name: "eth0".into(), host: None, rail: Some(0), rate_bytes_per_second: Some(12.5e9) };
    let sample = NicSample { time: 1_764_000_000.5, tx_bytes: 1e6, rx_bytes: 2e6, retransmits: 3.0, ..Default::default() };
    let served = WindowsPage { host: Some("node-a".into()), nics: vec![NicSamples { nic, samples: vec![sample] }] };
    let json = serde_json::to_string(&served).expect("serialize");
    assert!(json.starts_with(r#"{"host":"node-a","nics":["#), "the host as a plain string: {json}");
    let back: WindowsPage = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, served);
    // Older agents sent no host.
    let old: WindowsPage = serde_json::from_str(r#"{"nics":[]}"#).expect("old");
    assert_eq!(old.host, None);
}

#[test]
fn a_live_windows_page_writes_the_bytes_of_a_windows_page() {
    let log = std::sync::Arc::new(std::sync::Mutex::new(crate::timeline::CounterLog::new(64)));
    for (k, name) in ["mlx5_0", "mlx5_1", "eth0"].into_iter().enumerate() {
        for t in 0..10 {
            let s = crate::timeline::NicSample { time: f64::from(t), tx_bytes: (k * 1000 + t as usize) as f64, ..Default::default() };
            log.lock().unwrap().push(NicInfo { name: name.into(), rail: Some(k as u32), ..Default::default() }, s);
        }
    }
    let (since, until, limit) = (2.0, 8.0, 4);
    let l = log.lock().unwrap();
    let whole = WindowsPage {
        host: Some("h".into()),
        nics: l
            .samples(since, until)
            .into_iter()
            .map(|(nic, mut samples)| {
                samples.truncate(limit);
                NicSamples { nic, samples }
            })
            .collect(),
    };
    let mut nics = l.nic_names();
    drop(l);
    nics.push("gone".into());
    let fetch = move |n: &str| log.lock().unwrap().nic_samples(n, since, until, limit);
    let live = LiveWindowsPage { host: "h".into(), nics, fetch: Box::new(fetch) };
    assert_eq!(serde_json::to_string(&live).unwrap(), serde_json::to_string(&whole).unwrap());
}
