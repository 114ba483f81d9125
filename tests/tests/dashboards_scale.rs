//! A 1 024-rank job (128 hosts × 8 ranks, rank 777 on host 97 late) seen the way an operator
//! sees it: 128 scrape targets, each serving what that host's agent exports (the agent's own
//! step metrics, `StepMetrics`, fed the job's attributed steps), scraped by a real Prometheus
//! (Debian `prometheus`), and the "Straggler across hosts" panel's two queries, read from
//! `dashboards/ranks-skew.json` and evaluated with every variable at All.
//!
//! Checks: every host exports the same number of series as a host of an 8-rank job (the job's
//! size does not grow a host's series), only its own 8 global ranks, and both straggler
//! queries name rank 777 on host 97's target and nothing else.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::TcpListener,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::{encoding::text::encode, registry::Registry};
use serde_json::Value;
use stepwise::{
    attribution::{Attribution, RankTime},
    engine::{FinishedStep, StepMetrics, StepSink},
    export::api::METRICS_CONTENT_TYPE,
};
use stepwise_tests::harness::{wait_for, workspace_root, Prometheus};

const HOSTS: u32 = 128;
const PER_HOST: u32 = 8;
const LATE_RANK: u32 = 777;
const STEPS: u64 = 8;

/// One step of a job of `ranks` ranks, 8 per host: the late rank arrives 30 ms after the rest
/// and waits for no one; every other rank waits for it.
fn step(id: u64, ranks: u32) -> Attribution {
    let ranks = (0..ranks)
        .map(|r| RankTime {
            rank: r,
            host: format!("node-{}", r / PER_HOST),
            late_seconds: if r == LATE_RANK { 0.030 } else { 0.0002 * f64::from(r % 5) },
            wait_seconds: if r == LATE_RANK { 0.0 } else { 0.030 - 0.0002 * f64::from(r % 5) },
            inside_seconds: 0.032,
        })
        .collect();
    Attribution {
        step: id,
        begin: 0.0,
        end: 0.1,
        seconds: 0.1,
        causes: Vec::new(),
        ranks,
        collectives: 1,
        incomplete: false,
        notes: Vec::new(),
        timing: String::new(),
        desyncs: Vec::new(),
        graph_replay: None,
    }
}

/// One host's agent metrics: its registry and step sink.
struct Host {
    registry: Registry,
    metrics: StepMetrics,
}

impl Host {
    fn new(h: u32) -> Host {
        let mut registry = Registry::default();
        let metrics = StepMetrics::register(&mut registry, format!("node-{h}"), Duration::ZERO);
        Host { registry, metrics }
    }
    fn step(&mut self, a: &Attribution) {
        self.metrics.step(&FinishedStep { job: "job", attribution: a, collectives: &[], windows: &[], step_windows: &[] });
    }
    fn text(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("encode");
        out
    }
}

fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count()
}

/// Serves `page` (replaced as steps happen) on a loopback port, one scrape per connection.
fn serve(page: Arc<Mutex<String>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = page.lock().expect("page").clone();
            let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {METRICS_CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes()));
        }
    });
    addr
}

/// The straggler panel's queries, every variable at All as Grafana substitutes it.
fn straggler_queries() -> Vec<(String, String)> {
    let path = workspace_root().join("dashboards/ranks-skew.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard")).expect("json");
    let panel = dash["panels"].as_array().expect("panels").iter().find(|p| p["title"] == "Straggler across hosts").expect("straggler panel");
    let mut out = Vec::new();
    for t in panel["targets"].as_array().expect("targets") {
        let mut e = t["expr"].as_str().expect("expr").replace("$__range", "1h");
        for v in ["cluster", "job", "host", "namespace", "pod", "local_rank"] {
            e = e.replace(&format!("${v}"), ".*");
        }
        assert!(!e.contains('$'), "unsubstituted variable in {e}");
        out.push((t["refId"].as_str().unwrap_or_default().to_string(), e));
    }
    out
}

/// Waits until Prometheus has every host at `steps` steps.
fn scraped(prom: &Prometheus, steps: u32) {
    wait_for(Duration::from_secs(60), "every target scraped", || {
        let r = prom.query(&format!("count(stepwise_steps_total == {steps})")).ok()?;
        (r.first().map(stepwise_tests::harness::value_of) == Some(f64::from(HOSTS))).then_some(())
    })
    .expect("scrapes");
}

#[test]
fn a_1024_rank_job_names_its_straggler_through_prometheus_with_bounded_series_per_host() {
    let d = tempfile::tempdir().expect("tmp");
    // A host of an 8-rank job: the series a host exports for a job that fits on it.
    let mut small = Host::new(0);
    small.step(&step(1, PER_HOST));
    let small_series = series(&small.text());

    let mut hosts: Vec<Host> = (0..HOSTS).map(Host::new).collect();
    let pages: Vec<Arc<Mutex<String>>> = hosts.iter().map(|h| Arc::new(Mutex::new(h.text()))).collect();
    let addrs: Vec<String> = pages.iter().map(|p| serve(p.clone())).collect();
    let prom = Prometheus::start(d.path(), &addrs.iter().map(String::as_str).collect::<Vec<_>>()).expect("prometheus");
    // One step per scrape round, as a job whose steps outlast the scrape interval: with only two
    // samples a series' `increase()` is extrapolated by up to an interval at each end (seen
    // here: 0.037 to 0.090 s for the same 0.030 s of wait), so a long job is the fair case.
    for id in 1..=STEPS {
        let a = step(id, HOSTS * PER_HOST);
        for (h, page) in hosts.iter_mut().zip(&pages) {
            h.step(&a);
            *page.lock().expect("page") = h.text();
        }
        scraped(&prom, id as u32);
    }

    for (h, host) in hosts.iter().enumerate() {
        let text = host.text();
        assert_eq!(series(&text), small_series, "host {h}: as many series as a host of an 8-rank job");
        let ranks: BTreeSet<&str> =
            text.lines().filter_map(|l| l.strip_prefix("stepwise_rank_late_seconds_total{rank=\"")).filter_map(|l| l.split_once('"')).map(|(r, _)| r).collect();
        let own: Vec<String> = (h as u32 * PER_HOST..(h as u32 + 1) * PER_HOST).map(|r| r.to_string()).collect();
        assert_eq!(ranks, own.iter().map(String::as_str).collect(), "host {h}: its own global ranks only");
    }
    let per_target = prom.query("count by (instance) ({__name__=~\"stepwise_rank_.+\"})").expect("count");
    assert_eq!(per_target.len(), HOSTS as usize, "{per_target:?}");
    assert!(per_target.iter().all(|s| stepwise_tests::harness::value_of(s) == f64::from(2 * PER_HOST)), "per-rank series per target: {per_target:?}");

    let late_host = &addrs[(LATE_RANK / PER_HOST) as usize];
    for (id, q) in straggler_queries() {
        let r = prom.query(&q).unwrap_or_else(|e| panic!("straggler {id}: {e}\n{q}"));
        let named: Vec<(&str, &str)> = r.iter().map(|s| (s["metric"]["instance"].as_str().unwrap_or(""), s["metric"]["rank"].as_str().unwrap_or(""))).collect();
        let w = "sum by (instance, rank) (increase(stepwise_rank_wait_seconds_total[1h]))";
        let dbg: Vec<String> = [format!("count({w})"), format!("quantile(0.5, {w})"), format!("bottomk(3, {w})"), format!("topk(3, {w})")]
            .iter()
            .map(|x| {
                format!(
                    "{x} = {:?}",
                    prom.query(x).map(|r| r.iter().map(|s| (s["metric"].to_string(), stepwise_tests::harness::value_of(s))).collect::<Vec<_>>())
                )
            })
            .collect();
        assert_eq!(named, vec![(late_host.as_str(), "777")], "straggler query {id} over 128 targets:\n{q}\n{}", dbg.join("\n"));
        eprintln!("straggler query {id}: {named:?}\n  {}", dbg.join("\n  "));
    }
}
