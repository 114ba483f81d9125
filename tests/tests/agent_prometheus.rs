//! The agent as users run it: a real process on fixture sysfs trees, scraped by a real
//! Prometheus (Debian `prometheus`), checked with `promtool`, queried with PromQL.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use stepwise_tests::harness::{self, agent_bin, sample, Agent, Prometheus};

fn fixture(name: &str) -> PathBuf {
    harness::workspace_root().join("tests/fixtures").join(name).join("sys")
}

fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("stepwise-{tag}-")).tempdir().expect("tempdir")
}

/// Only the RDMA source: the fixture's netdevs do not exist in this kernel.
fn rdma_only_config(dir: &Path) -> PathBuf {
    let p = dir.join("agent.toml");
    std::fs::write(&p, "interval = \"200ms\"\n[sources]\nethtool = false\nnetdev = false\nqdisc = false\n").expect("write config");
    p
}

fn start_on(fixture_name: &str, dir: &Path) -> Agent {
    let cfg = rdma_only_config(dir);
    let sys = fixture(fixture_name);
    assert!(sys.join("class/infiniband").is_dir(), "fixture {} missing (cargo xtask scenario write-fixtures)", sys.display());
    Agent::start(dir, &["--config", cfg.to_str().expect("utf8"), "--sysfs-root", sys.to_str().expect("utf8")]).expect("agent starts")
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().parse().unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn prometheus_scrapes_one_series_per_fixture_port_with_fixture_values() {
    let dir = tmp("prom");
    let agent = start_on("dgx8", dir.path());
    let prom = Prometheus::start(dir.path(), &[&agent.addr]).expect("prometheus starts");

    let up = prom.wait_series("up{job=\"stepwise\"} == 1", 1, Duration::from_secs(30)).expect("target up");
    assert_eq!(up.len(), 1);

    let series = prom.wait_series("stepwise_nic_transmit_bytes_total", 8, Duration::from_secs(30)).expect("8 NIC series");
    assert_eq!(series.len(), 8, "one series per fixture NIC port: {series:?}");
    let mut rails: Vec<String> = Vec::new();
    for s in &series {
        let m = &s["metric"];
        let dev = m["device"].as_str().expect("device label");
        let port = m["port"].as_str().expect("port label");
        assert!(m["netdev"].as_str().is_some_and(|n| !n.is_empty()), "netdev label on {m}");
        rails.push(m["rail"].as_str().expect("rail label").to_string());
        let words = read_u64(&fixture("dgx8").join(format!("class/infiniband/{dev}/ports/{port}/counters/port_xmit_data")));
        let got = harness::value_of(s);
        assert_eq!(got, (words * 4) as f64, "{dev}/{port}: port_xmit_data is in 4-byte words");
    }
    rails.sort();
    rails.dedup();
    assert_eq!(rails.len(), 8, "each NIC on its own rail: {rails:?}");

    let rx = prom.wait_series("stepwise_nic_receive_bytes_total", 8, Duration::from_secs(10)).expect("rx series");
    assert_eq!(rx.len(), 8);
    // Aggregation across NICs works as users would write it.
    let total = prom.query("sum by (cluster) (stepwise_nic_transmit_bytes_total)").expect("sum");
    let expect: f64 = series.iter().map(harness::value_of).sum();
    assert_eq!(total.len(), 1);
    assert!((harness::value_of(&total[0]) - expect).abs() < 1.0);
    let ok = prom.query("stepwise_source_up{source=\"rdma\"}").expect("source_up");
    assert_eq!(ok.first().map(harness::value_of), Some(1.0), "{ok:?}");
    let devices = prom.query("stepwise_source_devices{source=\"rdma\"}").expect("source_devices");
    assert_eq!(devices.first().map(harness::value_of), Some(8.0), "{devices:?}");
}

#[test]
fn a_host_without_rdma_has_the_source_absent_not_down() {
    let dir = tmp("absent");
    let cfg = rdma_only_config(dir.path());
    // A sysfs root with no class/infiniband: a node without RDMA hardware or driver.
    let sys = dir.path().join("sys");
    std::fs::create_dir_all(sys.join("class/net")).expect("mkdir");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8"), "--sysfs-root", sys.to_str().expect("utf8")]).expect("agent starts");
    std::thread::sleep(Duration::from_millis(600));
    let text = agent.metrics().expect("scrape");
    // StepwiseSourceDown is `min by (instance, source) (stepwise_source_up) == 0`: silent here.
    assert_eq!(sample(&text, "stepwise_source_up", &[("source", "rdma")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "stepwise_source_devices", &[("source", "rdma")]), Some(0.0), "{text}");
    let st = agent.status().expect("status");
    assert_eq!(st["sources"]["rdma"]["up"], true, "{st}");
    assert_eq!(st["sources"]["rdma"]["absent"], true, "{st}");
    assert!(st["sources"]["rdma"]["error"].as_str().is_some_and(|e| e.contains("absent")), "{st}");
}

#[test]
fn promtool_accepts_the_exposition() {
    let promtool = harness::which("promtool").expect("promtool not installed: run `cargo xtask setup` (apt package prometheus)");
    let dir = tmp("promtool");
    let agent = start_on("dgx8", dir.path());
    std::thread::sleep(Duration::from_millis(500));
    let text = agent.metrics().expect("scrape");
    assert!(text.contains("stepwise_nic_transmit_bytes_total"), "{text}");
    assert!(text.contains("stepwise_build_info"));
    let mut child =
        Command::new(promtool).args(["check", "metrics"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run promtool");
    {
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    }
    let out = child.wait_with_output().expect("promtool output");
    let msg = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && msg.trim().is_empty(), "promtool check metrics complained:\n{msg}");
}

#[test]
fn malformed_counters_are_counted_and_the_agent_stays_up() {
    let dir = tmp("malformed");
    let mut agent = start_on("malformed", dir.path());
    std::thread::sleep(Duration::from_secs(1));
    let text = agent.metrics().expect("scrape");
    let parse = sample(&text, "stepwise_errors_total", &[("source", "rdma"), ("kind", "parse")]).unwrap_or(0.0);
    let na = sample(&text, "stepwise_errors_total", &[("source", "rdma"), ("kind", "not_available")]).unwrap_or(0.0);
    assert!(parse > 0.0, "garbage values must be counted:\n{text}");
    assert!(na > 0.0, "`N/A (no PMA)` must be counted:\n{text}");
    // Good values next to bad ones are still exported.
    assert!(sample(&text, "stepwise_nic_transmit_bytes_total", &[]).is_some(), "{text}");
    assert!(agent.proc.alive(), "agent died:\n{}", agent.proc.log_text());
    assert_eq!(agent.get("/healthz").expect("healthz").status, 200);
    // Errors keep counting per sweep: the agent keeps sampling, it does not give up.
    std::thread::sleep(Duration::from_millis(600));
    let later = sample(&agent.metrics().expect("scrape"), "stepwise_errors_total", &[("source", "rdma"), ("kind", "parse")]).unwrap_or(0.0);
    assert!(later > parse, "parse errors should grow with sweeps ({parse} -> {later})");
}

#[test]
fn api_serves_topology_status_and_rejects_unknown_paths() {
    let dir = tmp("api");
    let agent = start_on("dgx8", dir.path());
    let topo: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/topology").expect("topology").body).expect("json");
    let nics = topo["nics"].as_array().expect("nics");
    assert_eq!(nics.len(), 8, "{topo}");
    for n in nics {
        assert!(n["gpu"].as_str().is_some(), "every fixture NIC has a nearest GPU: {n}");
        assert!(n["numa_node"].as_i64().is_some(), "{n}");
        assert_eq!(n["rate_bytes_per_second"].as_f64(), Some(50e9), "400 Gb/s = 50 GB/s: {n}");
    }
    let st = agent.status().expect("status");
    assert!(st["sweeps"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert_eq!(st["sources"]["rdma"]["up"], true, "{st}");
    let r = agent.get("/no/such/path").expect("404");
    assert_eq!(r.status, 404);
    let r = agent.get("/metrics?x=%ZZ").expect("bad query");
    assert!(r.status == 200 || r.status == 400, "{r:?}");
    assert_eq!(agent.get("/readyz").expect("readyz").status, 200);
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let dir = tmp("sigterm");
    let mut agent = start_on("dgx8", dir.path());
    let code = agent.proc.terminate(Duration::from_secs(10));
    assert_eq!(code, Some(0), "graceful exit on SIGTERM:\n{}", agent.proc.log_text());
}

#[test]
fn invalid_config_is_a_clear_error_with_exit_code_2() {
    let dir = tmp("badcfg");
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "interval = \"1ms\"\n").expect("write");
    let out = Command::new(agent_bin()).args(["run", "--config", p.to_str().expect("utf8")]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("interval") && err.contains("10ms"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    std::fs::write(&p, "listen = \"not an address\"\n").expect("write");
    let out = Command::new(agent_bin()).args(["run", "--config", p.to_str().expect("utf8")]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("listen"), "{}", String::from_utf8_lossy(&out.stderr));

    let out = Command::new(agent_bin()).args(["run", "--interval", "soon"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(agent_bin()).args(["run", "--config", "/nonexistent/agent.toml"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agent.toml"));
    // STEPWISE_* environment variables are honoured like flags.
    let out = Command::new(agent_bin()).args(["run"]).env("STEPWISE_INTERVAL", "5ms").output().expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Every family an agent on the dgx8 fixture exposes (all counter sources, the probes, the
/// engine fed with step markers) has its entry in docs/metrics.md, with its type and labels;
/// and the same exposition with one entry taken out of the document fails, naming it.
#[test]
fn every_exposed_family_has_its_entry_in_the_metrics_reference() {
    let dir = tmp("reference");
    let (cfg, sock) = (dir.path().join("agent.toml"), dir.path().join("markers.sock"));
    std::fs::write(&cfg, format!("interval = \"200ms\"\n[steps]\nmarker_socket = \"{}\"\n", sock.display())).expect("write config");
    let sys = fixture("dgx8");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8"), "--sysfs-root", sys.to_str().expect("utf8")]).expect("agent starts");
    let s = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    for step in 1..=6 {
        for phase in ["begin", "end"] {
            s.send_to(format!(r#"{{"rank":0,"step":{step},"phase":"{phase}"}}"#).as_bytes(), &sock).expect("send marker");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let doc = harness::metrics_reference();
    let text = agent.metrics().expect("scrape");
    let om =
        harness::http_request_with(&agent.addr, "GET", "/metrics", &[("Accept", "application/openmetrics-text; version=1.0.0")], None).expect("scrape").body;
    for (what, exposition) in [("text 0.0.4", &text), ("OpenMetrics", &om)] {
        let problems = stepwise::export::reference::check::against_exposition(&doc, exposition);
        assert!(problems.is_empty(), "{what} /metrics against docs/metrics.md:\n  {}", problems.join("\n  "));
    }
    let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    assert!(families >= 40, "only {families} families exposed:\n{text}");
    for must in ["stepwise_nic_transmit_bytes_total", "stepwise_markers_total", "stepwise_source_up"] {
        assert!(text.contains(&format!("# TYPE {must} ")), "{must} not exposed:\n{text}");
    }

    let without: String = doc.lines().filter(|l| !l.starts_with("| `stepwise_nic_transmit_bytes_total` ")).map(|l| format!("{l}\n")).collect();
    assert_eq!(
        stepwise::export::reference::check::against_exposition(&without, &text),
        ["stepwise_nic_transmit_bytes_total: on /metrics but has no entry in docs/metrics.md"]
    );
}
