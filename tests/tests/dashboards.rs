//! Every query of every panel of every dashboard in dashboards/ returns data from a real
//! Prometheus (Debian `prometheus`) scraping real agents:
//!
//! - host A: an agent on a dgx8-shaped sysfs tree evolved by the scenario writer (5 % line
//!   rate on every port, a PFC/ECN/CNP storm on mlx5_3), with mlx5 `ethtool -S` statistics
//!   for four of its netdevs from `tests/shims/ethtool_fixture.c` (no mlx5 driver here), and
//!   eBPF probes on the straggler OpenMPI job (4 ranks in a network namespace, rank 2 late
//!   by 30 ms every 5th step, step markers);
//! - host B: an agent inside another namespace (netdev, qdisc, ethtool and TCP sources) whose
//!   interface pushes a bulk TCP stream through a 2 Mbit/s TBF queue: backlog, drops and
//!   retransmissions. Prometheus reaches it through a small TCP relay into the namespace.
//!
//! Queries are evaluated as Grafana would send them: template variables substituted with `.*`
//! (All), then with each real value the variable queries return, `$__rate_interval` = 1m and
//! `$__range` = 1h. The straggler panel must name the rank the job's own clock says was late
//! (rank 2, unless the host delayed another rank more).

mod support;

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde_json::Value;
use stepwise_tests::{
    harness::{http_get, workspace_root, Prometheus},
    netns::{Netns, Veth},
    scenario::{Scenario, WAIT_TICKS_PER_SECOND},
};
use support::{start, straggler, Launch};

const RATE_INTERVAL: &str = "1m";
const RANGE: &str = "1h";
/// RDMA devices whose netdevs get mlx5 ethtool statistics from the shim; the others stay
/// unknown to the ioctl (a real `not_available` error for the Errors panel).
const ETHTOOL_NICS: usize = 4;

fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("stepwise-dash-{tag}-")).tempdir_in(stepwise_tests::scenario::memory_dir()).expect("tempdir")
}

/// Builds the ethtool fixture shim with the system C compiler.
fn build_shim(dir: &Path) -> PathBuf {
    let src = workspace_root().join("tests/shims/ethtool_fixture.c");
    let out = dir.join("libethtool_fixture.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("cc (build-essential) must be installed");
    assert!(st.success(), "cannot build {}", src.display());
    out
}

/// mlx5-shaped `ethtool -S` lines for one netdev: PFC on priority 3, ECN marks, link pauses.
fn ethtool_stats(pause_frames: u64, pause_us: u64, marked: u64) -> String {
    format!(
        "rx_prio3_bytes {}\ntx_prio3_bytes {}\nrx_prio3_pause {pause_frames}\nrx_prio3_pause_duration {pause_us}\nrx_prio3_pause_transition {pause_frames}\ntx_prio3_pause {}\ntx_prio3_pause_duration {}\nrx_prio3_marked {marked}\nrx_pause_ctrl_phy {pause_frames}\ntx_pause_ctrl_phy 0\n",
        1_000_000 + 10 * pause_us,
        2_000_000 + 10 * pause_us,
        pause_frames / 10,
        pause_us / 10
    )
}

fn write_atomic(path: &Path, text: &str) {
    let t = path.with_extension("tmp");
    std::fs::write(&t, text).expect("write");
    std::fs::rename(&t, path).expect("rename");
}

/// Forwards TCP connections from 127.0.0.1:<port> in this namespace to `target` inside
/// network namespace `ns` (each accepted connection gets a socket opened in `ns`).
struct Relay {
    addr: String,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn new(ns: &str, target: &str) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let addr = l.local_addr().expect("addr").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, target, st) = (ns.to_string(), target.to_string(), stop.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                if st.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = c else { continue };
                let (ns, target) = (ns.clone(), target.clone());
                std::thread::spawn(move || {
                    let Some(upstream) = connect_in(&ns, &target) else { return };
                    pipe(client, upstream);
                });
            }
        });
        Relay { addr, stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.addr);
    }
}

/// A TCP connection opened from inside network namespace `ns`.
fn connect_in(ns: &str, target: &str) -> Option<TcpStream> {
    let f = std::fs::File::open(Path::new("/run/netns").join(ns)).ok()?;
    let target = target.to_string();
    std::thread::spawn(move || {
        // SAFETY: setns(2) on an open namespace descriptor changes only this thread's network
        // namespace; the thread ends right after connecting (the socket keeps the namespace).
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return None;
        }
        TcpStream::connect(&target).ok()
    })
    .join()
    .ok()
    .flatten()
}

fn pipe(a: TcpStream, b: TcpStream) {
    let (mut a2, mut b2) = (a.try_clone().expect("clone"), b.try_clone().expect("clone"));
    let t = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a2, &mut b2);
        let _ = b2.shutdown(std::net::Shutdown::Write);
    });
    let (mut a, mut b) = (a, b);
    let _ = std::io::copy(&mut b, &mut a);
    let _ = a.shutdown(std::net::Shutdown::Write);
    let _ = t.join();
}

/// Percent-encodes a query-string value.
fn enc(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Grafana's escaping of a single variable value inside a PromQL regex matcher
/// (prometheusSpecialRegexEscape): regex metacharacters escaped, backslashes doubled for the
/// PromQL string.
fn regex_value(v: &str) -> String {
    v.chars().map(|c| if "\\^$*+?.()|{}[]".contains(c) { format!("\\\\{c}") } else { c.to_string() }).collect()
}

fn substitute(expr: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut e = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE);
    for (k, v) in vars {
        e = e.replace(&format!("${k}"), v);
    }
    assert!(!e.contains('$'), "unsubstituted variable in {e}");
    e
}

/// `label_values(SELECTOR, LABEL)` evaluated as Grafana does: the label's values among the
/// series matching the selector.
fn label_values(prom: &Prometheus, query: &str, vars: &BTreeMap<&str, String>) -> Vec<String> {
    let q = substitute(query, vars);
    let inner = q.strip_prefix("label_values(").and_then(|s| s.strip_suffix(')')).unwrap_or_else(|| panic!("variable query {q:?} is not label_values(…)"));
    let (sel, label) = inner.rsplit_once(',').expect("label_values(selector, label)");
    let r = http_get(&prom.addr, &format!("/api/v1/label/{}/values?match[]={}", label.trim(), enc(sel.trim()))).expect("label values");
    let v: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(v["status"], "success", "{q}: {}", r.body);
    v["data"].as_array().expect("data").iter().filter_map(|x| x.as_str().map(String::from)).collect()
}

fn finite(r: &[Value]) -> bool {
    r.iter().any(|s| stepwise_tests::harness::value_of(s).is_finite())
}

#[test]
fn every_panel_query_returns_series_from_real_agents() {
    let dir = tmp("run");
    let d = dir.path();
    straggler_prereqs();

    // Host A: fixture sysfs + ethtool shim + probes on the job's namespace.
    let sys = d.join("sys");
    let mut sc = Scenario::new(&sys).host_dgx(8);
    sc.write().expect("write fixture");
    let netdevs: Vec<String> = (0..8)
        .map(|i| std::fs::read_to_string(sys.join(format!("class/infiniband/mlx5_{i}/ports/1/gid_attrs/ndevs/0"))).expect("ndev").trim().to_string())
        .collect();
    let eth = d.join("ethtool");
    std::fs::create_dir_all(&eth).expect("mkdir");
    for n in &netdevs[..ETHTOOL_NICS] {
        write_atomic(&eth.join(n), &ethtool_stats(0, 0, 0));
    }
    let shim = build_shim(d);
    let job_ns = Netns::new().expect("netns (needs root and iproute2)");
    let sock = d.join("markers.sock");
    let cfg_a = d.join("a.toml");
    std::fs::write(
        &cfg_a,
        format!(
            "interval = \"100ms\"\n[sources]\nnetdev = false\nqdisc = false\ntcp = false\n\
             [collectives]\nlibrary_dirs = [\"{}\"]\nsample_every = \"100ms\"\nsample_window = \"10m\"\n\
             [collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\n",
            stepwise_tests::workloads::build().expect("workloads").display(),
            job_ns.name(),
            sock.display()
        ),
    )
    .expect("config a");
    let launch_a =
        Launch { env: vec![("LD_PRELOAD", shim.display().to_string()), ("STEPWISE_ETHTOOL_FIXTURE", eth.display().to_string())], ..Default::default() };
    let agent_a = start(
        d,
        &launch_a,
        &[
            "--config",
            cfg_a.to_str().expect("utf8"),
            "--sysfs-root",
            sys.to_str().expect("utf8"),
            "--db",
            d.join("a.db").to_str().expect("utf8"),
            "--profiler-socket",
            d.join("profiler.sock").to_str().expect("utf8"),
        ],
    );

    // Host B: its own namespace with a shaped link to a third one.
    let ns_b = Netns::new().expect("netns b");
    let ns_peer = Netns::new().expect("netns peer");
    let veth = Veth::new(&ns_b, "swda0", &ns_peer, "swdb0").expect("veth");
    ns_b.tbf("swda0", "2mbit", "3kb", "3kb").expect("tbf");
    let cfg_b = d.join("b.toml");
    std::fs::write(
        &cfg_b,
        format!("interval = \"200ms\"\n[sources]\nrdma = false\n[collectives]\nenabled = false\n[steps]\nmarker_socket = \"{}\"\n", d.join("b.sock").display()),
    )
    .expect("config b");
    let relay = Relay::new(ns_b.name(), "127.0.0.1:9477");
    // `ip netns exec` mounts a fresh sysfs for the namespace, without tracefs under it: mount
    // it again (in that private mount namespace) for the TCP tracepoint source.
    let prefix =
        ["ip", "netns", "exec", ns_b.name(), "sh", "-c", "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing; exec \"$0\" \"$@\""];
    let launch_b = Launch {
        prefix: prefix.iter().map(|s| s.to_string()).collect(),
        listen: Some("127.0.0.1:9477".into()),
        reach: Some(relay.addr.clone()),
        ..Default::default()
    };
    let agent_b = start(d, &launch_b, &["--config", cfg_b.to_str().expect("utf8"), "--db", d.join("b.db").to_str().expect("utf8")]);

    let prom = Prometheus::start(d, &[&agent_a.addr, &agent_b.addr]).expect("prometheus");
    prom.wait_series("up{job=\"stepwise\"} == 1", 2, Duration::from_secs(30)).expect("both agents scraped");
    // Healthy, idle nodes (no job, no storm yet): every counter panel shows 0, not "No data",
    // although several families do not exist yet (ranks' waits, TCP retransmissions…).
    std::thread::sleep(Duration::from_secs(3));
    let idle = idle_panels(&prom);
    eprintln!("idle nodes: {idle}");

    // The fixture writer: background RoCE traffic; during the storm mlx5_3 is paused 90 % of
    // the time, the fabric marks ECN, and its netdev's PFC counters climb.
    let storm = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (storm, stop, eth, netdevs) = (storm.clone(), stop.clone(), eth.clone(), netdevs.clone());
        std::thread::spawn(move || {
            let mut last = Instant::now();
            let (mut frames, mut paused_us, mut marked) = (0u64, 0u64, 0u64);
            let mut tick = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let dt = last.elapsed();
                last = Instant::now();
                let on = storm.load(Ordering::Relaxed);
                sc.step(dt, |n| {
                    let r = n.line_rate();
                    n.tx_rate(0.05 * r).rx_rate(0.05 * r);
                    if on && n.index == 3 {
                        let ticks = (0.9 * WAIT_TICKS_PER_SECOND * n.dt().as_secs_f64()) as u64;
                        n.pfc_pause(ticks).ecn(200).cnp_handled(180).retransmit("local_ack_timeout_err", 1);
                    }
                })
                .expect("scenario step");
                if on {
                    frames += 50;
                    paused_us += (0.9 * dt.as_secs_f64() * 1e6) as u64;
                    marked += 200;
                }
                tick += 1;
                if tick.is_multiple_of(5) {
                    write_atomic(&eth.join(&netdevs[3]), &ethtool_stats(frames, paused_us, marked));
                }
            }
        })
    };

    // Phase 1: the storm on host A's fabric and host B's bulk stream through the 3 KiB TBF
    // queue (backlog, drops, retransmissions). Phase 2: the job alone, so its ranks keep
    // their timing on two cores.
    std::thread::scope(|s| {
        s.spawn(|| bulk_tcp(&ns_b, &ns_peer, veth.b_addr, Duration::from_secs(3)));
        storm.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2000));
        storm.store(false, Ordering::Relaxed);
    });
    // 60 steps (~3 s): a counter series is born with its first value, which rate() and
    // increase() cannot see, so the job must outlast a few scrapes for its increments to show.
    let job = straggler::run_steps(&job_ns, &sock, 60);
    let late2: f64 = job.truth.values().filter(|(_, r)| *r == 2).map(|(s, _)| s).sum();
    assert!(late2 > 0.2, "rank 2 was late in the job: {:?}", job.truth);
    // Who the panel must name, by the job's own clock: B the rank with the most summed
    // lateness, A the rank that waited least (rank 2 unless the host delayed another rank more).
    let own = JobRanks::of(&job.lines);
    straggler::settle();
    // Phase 3: an asynchronous NCCL-ABI job with the profiler plugin (its proxy requests per
    // communicator) and the sampled ncclIb probes (their requests per NIC).
    nccl_job(d, &job_ns, &d.join("profiler.sock"));
    // The NCCL job sends no markers and ran after the marked job: its steps come from its
    // period (the markers kept from the first job do not hide it), GPU-timed by the plugin.
    let gpu_steps = || -> usize {
        let body = agent_a.get("/api/v1/steps?limit=1000").map(|r| r.body).unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["steps"].as_array().map_or(0, |a| a.iter().filter(|st| st["timing"] == "gpu").count())
    };
    let end = Instant::now() + Duration::from_secs(15);
    while gpu_steps() < 30 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(gpu_steps() >= 30, "the NCCL job's 40 steps after the marked job: {} GPU-timed steps", gpu_steps());
    prom.wait_series("stepwise_proxy_requests_total > 0", 1, Duration::from_secs(15)).expect("proxy requests scraped");
    prom.wait_series("stepwise_net_request_bytes_total > 0", 1, Duration::from_secs(15)).expect("sampled requests scraped");
    // Prometheus must have scraped the agents after the last step was attributed.
    prom.wait_series("stepwise_steps_total > 50", 1, Duration::from_secs(15)).expect("steps scraped");
    if let Err(e) = prom.wait_series("stepwise_tcp_retransmits_total > 0", 1, Duration::from_secs(15)) {
        let m = agent_b.metrics().unwrap_or_default();
        panic!(
            "{e}\nhost B tcp/qdisc series:\n{}\nstatus: {}\nlog:\n{}",
            m.lines().filter(|l| l.contains("tcp") || l.contains("qdisc_drops")).collect::<Vec<_>>().join("\n"),
            agent_b.status().map(|s| s["sources"]["tcp"].to_string()).unwrap_or_default(),
            tail(&agent_b.proc.log_text())
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    // Every family the two agents expose (probes, profiler, ethtool, TCP, per-rank series
    // included) has its entry in the metrics reference, with its type and labels.
    let doc = stepwise_tests::harness::metrics_reference();
    for (host, agent) in [("A", &agent_a), ("B", &agent_b)] {
        let text = agent.metrics().expect("scrape");
        let problems = stepwise::export::reference::check::against_exposition(&doc, &text);
        assert!(problems.is_empty(), "host {host}'s /metrics against docs/metrics.md:\n  {}", problems.join("\n  "));
        eprintln!("host {host}: {} families on /metrics, each with its entry in docs/metrics.md", text.lines().filter(|l| l.starts_with("# TYPE ")).count());
    }

    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in dashboard_files() {
        let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
        check_variables(&name, &dash);
        let vars = variables(&dash);
        for panel in dash["panels"].as_array().expect("panels") {
            let title = panel["title"].as_str().unwrap_or("?");
            for t in panel["targets"].as_array().expect("targets") {
                // The query itself, without its 0 fallback (checked by idle_panels), must find
                // the metrics.
                let expr = primary(t["expr"].as_str().expect("expr"));
                checked += 1;
                // Pass 1: every variable at All.
                let all: BTreeMap<&str, String> = vars.iter().map(|(k, _)| (k.as_str(), ".*".to_string())).collect();
                let q = substitute(expr, &all);
                let r = prom.query(&q).unwrap_or_else(|e| panic!("{name} / {title} / {}: {e}", t["refId"]));
                if r.is_empty() || !finite(&r) {
                    failures.push(format!("{name} / {title} / {}: {} series, none finite, for\n    {q}", t["refId"], r.len()));
                    continue;
                }
                // Pass 2: real values from the variable queries, chained as Grafana does.
                let concrete = concrete_match(&prom, &vars, expr);
                match concrete {
                    Some(desc) => report.push(format!("{name} / {title} / {}: {} series (All); with real values: {desc}", t["refId"], r.len())),
                    None => failures.push(format!("{name} / {title} / {}: no series for any real value of the variables", t["refId"])),
                }
                if title == "Straggler across hosts" {
                    let ranks: Vec<&str> = r.iter().filter_map(|s| s["metric"]["rank"].as_str()).collect();
                    let want = if t["refId"] == "B" { own.latest() } else { own.least_waiting() };
                    let late = |a: &stepwise_tests::harness::Agent| {
                        stepwise_tests::harness::samples(&a.metrics().unwrap_or_default(), "stepwise_rank_late_seconds_total")
                    };
                    assert_eq!(
                        ranks,
                        vec![want.to_string().as_str()],
                        "{title} / {}: the job's own clock names rank {want} ({own:?}), got {r:?}; lateness series now: A {:?}, B {:?}",
                        t["refId"],
                        late(&agent_a),
                        late(&agent_b)
                    );
                }
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "panel queries without data:\n  {}\n(agent A log:\n{}\nagent B log:\n{})",
        failures.join("\n  "),
        tail(&agent_a.proc.log_text()),
        tail(&agent_b.proc.log_text())
    );
    assert!(checked >= 30, "only {checked} panel queries found");
    eprintln!("{checked} panel queries of 5 dashboards returned data from a real Prometheus");
    drop(relay);
}

/// The 0 fallbacks dashboards/gen/generate.mjs appends to counter queries.
const FALLBACKS: [&str; 2] = [" or on(instance) 0 * group by (instance) (stepwise_build_info{", " or on() vector(0)"];

/// A target's query without its 0 fallback.
fn primary(expr: &str) -> &str {
    FALLBACKS.iter().find_map(|f| expr.find(f).map(|i| &expr[..i])).unwrap_or(expr)
}

/// Every target with a 0 fallback returns a finite value for every selected host on idle
/// agents; the ones whose own query finds nothing yet are counted (without any, the check
/// would prove nothing).
fn idle_panels(prom: &Prometheus) -> String {
    let (mut with_fallback, mut rescued, mut failures) = (0, Vec::new(), Vec::new());
    for path in dashboard_files() {
        let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        let vars = variables(&dash);
        let all: BTreeMap<&str, String> = vars.iter().map(|(k, _)| (k.as_str(), ".*".to_string())).collect();
        for panel in dash["panels"].as_array().expect("panels") {
            for t in panel["targets"].as_array().expect("targets") {
                let expr = t["expr"].as_str().expect("expr");
                if primary(expr) == expr {
                    continue;
                }
                with_fallback += 1;
                let what = format!("{} / {} / {}", path.file_name().and_then(|n| n.to_str()).unwrap_or("?"), panel["title"], t["refId"]);
                let r = prom.query(&substitute(expr, &all)).unwrap_or_else(|e| panic!("{what}: {e}"));
                if r.is_empty() || !r.iter().all(|s| stepwise_tests::harness::value_of(s).is_finite()) {
                    failures.push(format!("{what}: {r:?}"));
                }
                if prom.query(&substitute(primary(expr), &all)).map(|r| r.is_empty()).unwrap_or(true) {
                    rescued.push(what);
                }
            }
        }
    }
    assert!(failures.is_empty(), "idle nodes: counter panels without a finite value (\"No data\"):\n  {}", failures.join("\n  "));
    assert!(with_fallback >= 20, "only {with_fallback} targets have a 0 fallback");
    assert!(!rescued.is_empty(), "no counter panel lacked data on idle nodes: the check proves nothing");
    format!("{with_fallback} counter targets show finite values; {} of them only through their 0 fallback: {}", rescued.len(), rescued.join("; "))
}

/// The first Grafana release whose dashboard schema is each `schemaVersion`, measured from
/// the `@grafana/schema` npm packages (defaultDashboard.schemaVersion in
/// dist/esm/raw/dashboard/x/dashboard_types.gen.mjs): 12.1.0 has 41, 12.2.0 has 42 (as have
/// 12.3.0, 12.4.0, 13.0.1 and 13.2.3). Grafana does not load a dashboard newer than its own
/// schema correctly, so this is the minimum version.
const FIRST_GRAFANA: &[(u64, &str)] = &[(42, "12.2")];

#[test]
fn the_minimum_grafana_version_in_the_docs_matches_the_dashboards_schema_version() {
    let mut versions: Vec<u64> = dashboard_files()
        .iter()
        .map(|p| serde_json::from_str::<Value>(&std::fs::read_to_string(p).expect("read")).expect("json")["schemaVersion"].as_u64().expect("schemaVersion"))
        .collect();
    versions.sort();
    versions.dedup();
    assert_eq!(versions.len(), 1, "the dashboards have different schemaVersions: {versions:?}");
    let min = FIRST_GRAFANA
        .iter()
        .find(|(v, _)| *v == versions[0])
        .map(|(_, g)| *g)
        .unwrap_or_else(|| panic!("schemaVersion {} is not in FIRST_GRAFANA: measure which Grafana release introduced it", versions[0]));
    let want = format!("Grafana {min} or newer");
    for doc in ["dashboards/README.md", "deploy/README.md", "deploy/helm/stepwise/values.yaml"] {
        let text = std::fs::read_to_string(workspace_root().join(doc)).expect(doc);
        assert!(text.contains(&want), "{doc} must state the minimum Grafana version as \"{want}\" (schemaVersion {})", versions[0]);
        // No other "Grafana X or newer" anywhere in it.
        for (i, _) in text.match_indices("Grafana ") {
            let rest = &text[i..];
            let stated = rest.find(" or newer").filter(|&e| e < 20).map(|e| &rest[..e + " or newer".len()]);
            assert!(stated.is_none_or(|s| s == want), "{doc}: states {stated:?}, but the dashboards need {want}");
        }
    }
}

/// A 2-rank `nccl_steps` job, asynchronous, with the profiler plugin reporting to `sock`:
/// 4 requests of 16 KiB in flight over a 1 ms round trip, for about 4 s.
fn nccl_job(d: &Path, ns: &Netns, sock: &Path) {
    let bin = stepwise_tests::workloads::build().expect("build").join("nccl_steps");
    let plugin = stepwise_tests::workloads::profiler_plugin().expect("plugin");
    let id = d.join("nccl.id");
    let mut ranks: Vec<stepwise_tests::harness::Proc> = (0..2u32)
        .map(|r| {
            let mut c = Command::new("ip");
            c.args([
                "netns",
                "exec",
                ns.name(),
                "env",
                "-u",
                "CUDA_LAUNCH_BLOCKING",
                "STEPS_COMPUTE=sleep",
                "NCCL_ABI_WINDOW=4",
                "NCCL_ABI_CHUNK=16384",
                "NCCL_ABI_RTT_US=1000",
            ]);
            c.arg(format!("STEPWISE_PROFILER_SOCKET={}", sock.display())).arg(format!("NCCL_PROFILER_PLUGIN={}", plugin.display()));
            c.arg(&bin).args(["--rank", &r.to_string(), "--nranks", "2", "--id-file"]).arg(&id);
            c.args(["--steps", "40", "--bytes", "262144", "--compute-us", "50000"]);
            stepwise_tests::harness::Proc::spawn(&format!("nccl{r}"), &mut c, d.join(format!("nccl{r}.log"))).expect("spawn rank")
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(60);
    while ranks.iter_mut().any(|p| p.alive()) {
        assert!(Instant::now() < end, "the NCCL job did not finish:\n{}", ranks.iter().map(|p| p.log_text()).collect::<Vec<_>>().join("\n"));
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in &ranks {
        assert!(p.log_text().contains("summary tool=nccl_steps"), "the rank finished its steps:\n{}", p.log_text());
    }
}

/// Per rank, the summed lateness (arrival after the step's first) and wait (before the step's
/// last arrival) over the job's steps, from the workload's own arrival times. The first step
/// is left out: the per-rank series are born with it, and `increase()` does not count a
/// series' first value.
#[derive(Debug)]
struct JobRanks {
    late: BTreeMap<u32, f64>,
    wait: BTreeMap<u32, f64>,
}

impl JobRanks {
    fn of(lines: &[stepwise_tests::workloads::StepLine]) -> JobRanks {
        let mut steps: BTreeMap<u64, Vec<(u32, f64)>> = BTreeMap::new();
        for l in lines {
            steps.entry(l.step).or_default().push((l.rank, l.arrive_us * 1e-6));
        }
        let (mut late, mut wait) = (BTreeMap::new(), BTreeMap::new());
        for v in steps.values().skip(1) {
            let first = v.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
            let last = v.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            for &(r, t) in v {
                *late.entry(r).or_insert(0.0) += t - first;
                *wait.entry(r).or_insert(0.0) += last - t;
            }
        }
        JobRanks { late, wait }
    }
    fn latest(&self) -> u32 {
        self.late.iter().max_by(|a, b| a.1.total_cmp(b.1)).map(|x| *x.0).expect("ranks")
    }
    fn least_waiting(&self) -> u32 {
        self.wait.iter().min_by(|a, b| a.1.total_cmp(b.1)).map(|x| *x.0).expect("ranks")
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn straggler_prereqs() {
    stepwise_tests::workloads::build().expect("workloads build");
}

fn dashboard_files() -> Vec<PathBuf> {
    let dir = workspace_root().join("dashboards");
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(&dir).expect("dashboards/").filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    v.sort();
    assert_eq!(v.len(), 5, "five dashboards in {}: {v:?}", dir.display());
    v
}

/// (name, label_values query) of the query variables, in dashboard order.
fn variables(dash: &Value) -> Vec<(String, Option<String>)> {
    dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| (v["name"].as_str().expect("name").to_string(), v["query"].as_str().map(String::from)))
        .collect()
}

/// The variables the issue asks for, the data source one of type datasource/prometheus, and
/// every target on `${datasource}`.
fn check_variables(name: &str, dash: &Value) {
    let list = dash["templating"]["list"].as_array().expect("templating.list");
    let by = |n: &str| list.iter().find(|v| v["name"] == n).unwrap_or_else(|| panic!("{name}: no `{n}` variable"));
    let ds = by("datasource");
    assert!(ds["type"] == "datasource" && ds["query"] == "prometheus", "{name}: datasource variable {ds}");
    for v in ["cluster", "job", "host", "rank"] {
        assert_eq!(by(v)["type"], "query", "{name}: {v}");
    }
    assert!(by("host")["query"].as_str().is_some_and(|q| q.ends_with(", instance)")), "{name}: host comes from `instance`");
    assert_eq!(by("comm")["type"], "textbox", "{name}: comm");
    for p in dash["panels"].as_array().expect("panels") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {}", p["title"]);
        for t in p["targets"].as_array().expect("targets") {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}: {} {}", p["title"], t["refId"]);
        }
    }
}

/// Tries the target with concrete variable values, each variable taking the values its
/// query returns given the earlier ones; returns the first combination with a finite value.
fn concrete_match(prom: &Prometheus, vars: &[(String, Option<String>)], expr: &str) -> Option<String> {
    fn go<'a>(prom: &Prometheus, vars: &'a [(String, Option<String>)], i: usize, chosen: &mut BTreeMap<&'a str, String>, expr: &str) -> Option<String> {
        if i == vars.len() {
            let r = prom.query(&substitute(expr, chosen)).ok()?;
            return finite(&r).then(|| format!("{} series with {chosen:?}", r.len()));
        }
        let (name, query) = &vars[i];
        let values = query.as_deref().map(|q| label_values(prom, q, chosen)).unwrap_or_default();
        // A variable whose query finds no value (no `cluster` external label) stays at All.
        let candidates: Vec<String> = if values.is_empty() { vec![".*".into()] } else { values.iter().map(|v| regex_value(v)).collect() };
        for v in candidates {
            chosen.insert(name.as_str(), v);
            if let Some(found) = go(prom, vars, i + 1, chosen, expr) {
                return Some(found);
            }
        }
        chosen.remove(name.as_str());
        None
    }
    go(prom, vars, 0, &mut BTreeMap::new(), expr)
}

/// A bulk TCP stream from `a` to `addr` in `b` for `d` through whatever qdisc `a` has.
fn bulk_tcp(a: &Netns, b: &Netns, addr: Ipv4Addr, d: Duration) {
    let listener = b.run(|_| TcpListener::bind((addr, 5311))).expect("listen in peer");
    let reader = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return 0 };
        let mut buf = vec![0u8; 65536];
        let mut n = 0usize;
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    a.run(|_| {
        let mut s = TcpStream::connect((addr, 5311)).expect("connect through the shaped link");
        s.set_write_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let chunk = vec![7u8; 65536];
        let end = Instant::now() + d;
        while Instant::now() < end {
            if s.write(&chunk).is_err() {
                break;
            }
        }
    });
    let _ = reader.join();
}
