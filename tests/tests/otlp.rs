//! OpenTelemetry export against a protocol-correct peer: `tests/otlp/receiver.py`, built on the
//! official `opentelemetry-proto` messages and the `grpcio` server (pip-installed into
//! `~/.cache/stepwise/py` on first use). The agent watches the straggler job of
//! `e2e_straggler.rs` (4 MPI ranks in a netns, rank 2 30 ms late every 5th step) and exports:
//!
//! 1. over OTLP/gRPC (gzip): every metric family of `/metrics` with its type, and one trace per
//!    attributed step (a `step` span with collective and cause children; the
//!    readiness_skew cause span names rank 2);
//! 2. over OTLP/HTTP-protobuf, configured by the standard `OTEL_*` variables only: the same,
//!    gzip-compressed, with the headers and resource attributes those variables give;
//! 3. to a collector that accepts connections and never answers: exports time out and
//!    are counted, steps beyond the queue are dropped and counted, and sampling and
//!    attribution go on at their own pace.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use stepwise_tests::{
    harness::{free_port, sample, wait_for, Agent, Proc},
    netns::Netns,
    workloads,
};

/// The receiver's Python packages, installed once per machine.
fn python_path() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    let dir = home.join(".cache/stepwise/py");
    let check = || {
        Command::new("python3")
            .args(["-c", "import grpc; from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc"])
            .env("PYTHONPATH", &dir)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !check() {
        let out = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(&dir)
            .args(["opentelemetry-proto", "grpcio"])
            .output()
            .expect("python3 -m pip");
        assert!(
            out.status.success(),
            "pip install opentelemetry-proto grpcio into {} failed (needs PyPI):\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(check(), "grpc and opentelemetry.proto not importable from {} after pip install", dir.display());
    }
    dir
}

struct Receiver {
    _proc: Proc,
    grpc: u16,
    http: u16,
    /// With a certificate: the gRPC-over-TLS and HTTPS ports.
    tls: (u16, u16),
    out: PathBuf,
}

impl Receiver {
    /// `tls`: the server's certificate and key (PEM) for the TLS ports.
    fn start(dir: &Path, tls: Option<(&Path, &Path)>) -> Receiver {
        let py = python_path();
        let (grpc, http) = (free_port(), free_port());
        let tls_ports = (free_port(), free_port());
        let out = dir.join("otlp.jsonl");
        let script = stepwise_tests::harness::workspace_root().join("tests/otlp/receiver.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(["--grpc-port", &grpc.to_string(), "--http-port", &http.to_string(), "--out"]).arg(&out).env("PYTHONPATH", py);
        if let Some((cert, key)) = tls {
            cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
            cmd.args(["--grpc-tls-port", &tls_ports.0.to_string(), "--https-port", &tls_ports.1.to_string()]);
        }
        let mut proc = Proc::spawn("otlp receiver", &mut cmd, dir.join("receiver.log")).expect("receiver starts");
        wait_for(Duration::from_secs(20), "receiver ready", || {
            assert!(proc.alive(), "receiver exited:\n{}", proc.log_text());
            proc.log_text().contains("ready").then_some(())
        })
        .expect("receiver ready");
        Receiver { _proc: proc, grpc, http, tls: tls_ports, out }
    }

    /// Every request decoded so far.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }
}

fn requests<'a>(lines: &'a [Value], transport: &str, signal: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["transport"] == transport && l["signal"] == signal).collect()
}

/// An attribute's AnyValue (`{"int_value": "2"}` etc.) from a list of key/values.
fn attr<'a>(kvs: &'a Value, key: &str) -> Option<&'a Value> {
    kvs.as_array()?.iter().find(|kv| kv["key"] == key).map(|kv| &kv["value"])
}
fn attr_i(kvs: &Value, key: &str) -> Option<i64> {
    let v = &attr(kvs, key)?["int_value"];
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64())
}
fn attr_f(kvs: &Value, key: &str) -> Option<f64> {
    attr(kvs, key)?["double_value"].as_f64()
}
fn attr_s<'a>(kvs: &'a Value, key: &str) -> Option<&'a str> {
    attr(kvs, key)?["string_value"].as_str()
}

fn spans(lines: &[&Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for l in lines {
        for rs in l["request"]["resource_spans"].as_array().into_iter().flatten() {
            for ss in rs["scope_spans"].as_array().into_iter().flatten() {
                out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    out
}

fn metrics(l: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for rm in l["request"]["resource_metrics"].as_array().into_iter().flatten() {
        // The default name, or the one OTEL_SERVICE_NAME gave (part 2).
        assert!(
            matches!(attr_s(&rm["resource"]["attributes"], "service.name"), Some("stepwise-agent" | "stepwise-node-agent")),
            "resource: {}",
            rm["resource"]
        );
        assert!(attr_s(&rm["resource"]["attributes"], "host.name").is_some_and(|h| !h.is_empty()));
        for sm in rm["scope_metrics"].as_array().into_iter().flatten() {
            out.extend(sm["metrics"].as_array().into_iter().flatten().cloned());
        }
    }
    out
}

/// `# TYPE` families of a `/metrics` text (Prometheus 0.0.4: counters named `…_total`) as
/// OTLP names them (counters without `_total`) → type.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (if t == "counter" { n.strip_suffix("_total").unwrap_or(n) } else { n }.to_string(), t.to_string()))
        .collect()
}

fn config(dir: &Path, ns: &Netns, sock: &Path, otlp: &str) -> PathBuf {
    let cfg = dir.join(format!("agent-{}.toml", free_port()));
    std::fs::write(
        &cfg,
        format!(
            "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\n[otlp]\nenabled = true\n{otlp}",
            ns.name(),
            sock.display()
        ),
    )
    .expect("config");
    cfg
}

/// The straggler job: `steps` steps, rank 2 30 ms late every 5th.
fn job(ns: &Netns, sock: &Path, steps: u32) {
    let out = workloads::run_ok(&mut workloads::mpi_steps(
        ns.name(),
        4,
        &[
            "--steps",
            &steps.to_string(),
            "--bytes",
            "1048576",
            "--compute-us",
            "20000",
            "--delay-rank",
            "2",
            "--delay-us",
            "30000",
            "--delay-every",
            "5",
            "--marker-socket",
            sock.to_str().expect("utf8"),
        ],
    ))
    .expect("mpi job");
    assert!(String::from_utf8_lossy(&out.stdout).contains("summary"));
}

/// Checks one transport's traces: a trace for delayed step `step` whose children are its
/// collective(s) and the eight causes, readiness_skew naming rank 2.
fn check_step_trace(all: &[Value], step: i64, transport: &str, agent: &Agent) {
    let root = all
        .iter()
        .find(|s| s["name"] == "step" && attr_i(&s["attributes"], "stepwise.step") == Some(step))
        .unwrap_or_else(|| panic!("{transport}: no step span for step {step} among {} spans", all.len()));
    assert_eq!(attr_s(&root["attributes"], "stepwise.job"), Some("markers"));
    assert_eq!(attr_s(&root["attributes"], "stepwise.top_cause"), Some("readiness_skew"), "{root}");
    let (start, end) = (
        root["start_time_unix_nano"].as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0),
        root["end_time_unix_nano"].as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0),
    );
    assert!(end > start && start > 1_600_000_000_000_000_000, "{transport}: step span times {start}..{end}");
    let children: Vec<&Value> = all.iter().filter(|s| s["trace_id"] == root["trace_id"] && s["parent_span_id"] == root["span_id"]).collect();
    let colls: Vec<&&Value> = children.iter().filter(|s| attr_s(&s["attributes"], "stepwise.span") == Some("collective")).collect();
    assert!(!colls.is_empty(), "{transport}: collective children of step {step}");
    let ar = colls.iter().find(|s| s["name"] == "all_reduce").unwrap_or_else(|| panic!("{transport}: an all_reduce child: {colls:?}"));
    let a = &ar["attributes"];
    assert_eq!(attr_s(a, "stepwise.op"), Some("all_reduce"));
    assert_eq!(attr_i(a, "stepwise.bytes"), Some(1048576));
    assert!(attr_s(a, "stepwise.comm").is_some_and(|c| !c.is_empty()));
    assert!(attr_f(a, "stepwise.seconds").is_some_and(|s| s > 0.0));
    assert_eq!(attr_i(a, "stepwise.rank"), Some(2), "{transport}: the collective names the late rank");
    assert_eq!(ar["events"].as_array().map(Vec::len), Some(4), "{transport}: one arrival event per rank");
    let causes: BTreeMap<&str, &&Value> = children
        .iter()
        .filter(|s| attr_s(&s["attributes"], "stepwise.span") == Some("cause"))
        .filter_map(|s| Some((attr_s(&s["attributes"], "stepwise.kind")?, s)))
        .collect();
    let kinds: BTreeSet<&str> = causes.keys().copied().collect();
    assert_eq!(
        kinds,
        ["compute", "congestion", "ideal_comm", "in_flight_limit", "intra_host", "rail_imbalance", "readiness_skew", "unexplained"].into_iter().collect(),
        "{transport}: eight cause spans"
    );
    let skew = &causes["readiness_skew"]["attributes"];
    assert_eq!(attr_i(skew, "stepwise.rank"), Some(2), "{transport}: readiness_skew span names rank 2: {skew}");
    // The span carries what the agent attributed (accuracy is e2e_straggler's subject).
    let api: Value = serde_json::from_str(&agent.get(&format!("/api/v1/steps?step={step}")).expect("steps").body).expect("json");
    let want = api["steps"][0]["causes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["kind"] == "readiness_skew"))
        .and_then(|c| c["seconds"].as_f64())
        .expect("step in /api/v1/steps");
    let got = attr_f(skew, "stepwise.seconds").unwrap_or(f64::NAN);
    assert!((got - want).abs() < 1e-9 && got > 0.015, "{transport}: readiness_skew span {got} s, attributed {want} s (30 ms injected)");
}

/// Checks that the latest metrics request received after `/metrics` was read carries every
/// family with its type, and the step metrics the job produced.
fn check_metrics(rx: &Receiver, agent: &Agent, transport: &str) {
    let text = agent.metrics().expect("/metrics");
    let fams = families(&text);
    assert!(fams.len() >= 20, "{fams:?}");
    let seen = requests(&rx.lines(), transport, "metrics").len();
    let line = wait_for(Duration::from_secs(15), "a metrics export after /metrics was read", || {
        let lines = rx.lines();
        requests(&lines, transport, "metrics").get(seen).map(|l| (*l).clone())
    })
    .expect("metrics export");
    let ms = metrics(&line);
    let by_name: BTreeMap<&str, &Value> = ms.iter().filter_map(|m| Some((m["name"].as_str()?, m))).collect();
    for (name, ty) in &fams {
        let m = by_name.get(name.as_str()).unwrap_or_else(|| panic!("{transport}: family {name} ({ty}) of /metrics not exported; got {:?}", by_name.keys()));
        match ty.as_str() {
            "counter" => {
                assert_eq!(m["sum"]["is_monotonic"], true, "{name}: {m}");
                assert_eq!(m["sum"]["aggregation_temporality"], "AGGREGATION_TEMPORALITY_CUMULATIVE", "{name}");
            }
            "gauge" => assert!(m.get("gauge").is_some(), "{name}: {m}"),
            "histogram" => {
                assert_eq!(m["histogram"]["aggregation_temporality"], "AGGREGATION_TEMPORALITY_CUMULATIVE", "{name}: {m}");
            }
            // info, stateset, unknown: gauges of their samples.
            _ => assert!(m.get("gauge").is_some(), "{name} ({ty}): {m}"),
        }
    }
    let points = |name: &str, kind: &str| by_name.get(name).map(|m| m[kind]["data_points"].as_array().cloned().unwrap_or_default()).unwrap_or_default();
    let steps = points("stepwise_steps", "sum").first().and_then(|p| p["as_int"].as_str().and_then(|s| s.parse::<i64>().ok())).unwrap_or(0);
    assert!(steps >= 4, "{transport}: stepwise_steps = {steps}");
    assert!(points("stepwise_step_attributed_seconds", "sum")
        .iter()
        .any(|p| attr_s(&p["attributes"], "cause") == Some("readiness_skew") && p["as_double"].as_f64().unwrap_or(0.0) > 0.015));
    assert!(points("stepwise_rank_late_seconds", "sum").iter().any(|p| attr_s(&p["attributes"], "rank") == Some("2")), "{transport}: rank label kept");
    let h = points("stepwise_step_duration_seconds", "histogram");
    let count = h.first().and_then(|p| p["count"].as_str().and_then(|s| s.parse::<i64>().ok())).unwrap_or(0);
    assert_eq!(count, steps, "{transport}: histogram count = steps");
    let buckets: i64 =
        h.first().and_then(|p| p["bucket_counts"].as_array()).into_iter().flatten().filter_map(|b| b.as_str().and_then(|s| s.parse::<i64>().ok())).sum();
    assert_eq!(buckets, count, "{transport}: per-bucket counts add up to the count");
}

#[test]
fn steps_and_metrics_reach_an_otlp_receiver_over_grpc_and_http_and_a_dead_collector_blocks_nothing() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-otlp-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let rx = Receiver::start(dir.path(), None);
    let sock = dir.path().join("markers.sock");

    // 1. gRPC.
    let cfg = config(
        dir.path(),
        &ns,
        &sock,
        &format!("endpoint = \"http://127.0.0.1:{}\"\ninterval = \"1s\"\ncompression = \"gzip\"\n[otlp.headers]\nx-stepwise-test = \"grpc\"\n", rx.grpc),
    );
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    job(&ns, &sock, 10);
    let step_ids = |s: &[Value]| s.iter().filter(|s| s["name"] == "step").filter_map(|s| attr_i(&s["attributes"], "stepwise.step")).collect::<BTreeSet<i64>>();
    let traces = wait_for(Duration::from_secs(20), "steps 0-8 as traces over gRPC", || {
        let lines = rx.lines();
        let s = spans(&requests(&lines, "grpc", "traces"));
        (0..9).all(|k| step_ids(&s).contains(&k)).then_some(s)
    })
    .unwrap_or_else(|e| panic!("{e}; got steps {:?}; agent log:\n{}", step_ids(&spans(&requests(&rx.lines(), "grpc", "traces"))), agent.proc.log_text()));
    assert_eq!(traces.iter().filter(|s| s["name"] == "step").count(), step_ids(&traces).len(), "one trace per step, none twice");
    check_step_trace(&traces, 4, "grpc", &agent);
    check_metrics(&rx, &agent, "grpc");
    let lines = rx.lines();
    assert!(requests(&lines, "grpc", "traces").iter().all(|l| l["headers"]["x-stepwise-test"] == "grpc"), "configured headers as gRPC metadata");
    assert!(
        lines.iter().all(|l| l.get("error").is_none()),
        "every request decoded: {:?}",
        lines.iter().filter(|l| l.get("error").is_some()).collect::<Vec<_>>()
    );
    let m = agent.metrics().expect("metrics");
    assert!(sample(&m, "stepwise_otlp_exports_total", &[("signal", "traces")]).unwrap_or(0.0) >= 1.0);
    assert_eq!(sample(&m, "stepwise_otlp_export_errors_total", &[("signal", "metrics")]), Some(0.0));
    drop(agent);

    // 2. HTTP/protobuf, configured the way collectors' users configure every SDK: by the
    // standard OTEL_* variables (the endpoint with a trailing slash, as users write it), gzip.
    let cfg = config(dir.path(), &ns, &sock, "interval = \"1s\"\n");
    let endpoint = format!("http://127.0.0.1:{}/", rx.http);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-stepwise-test=http,authorization=Bearer%20t0ken"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=test-cluster,deployment.environment=ci%2Clocal"),
        ("OTEL_SERVICE_NAME", "stepwise-node-agent"),
    ];
    let agent = Agent::start_env(dir.path(), &["--config", cfg.to_str().expect("utf8")], &env).expect("agent starts");
    job(&ns, &sock, 10);
    let traces = wait_for(Duration::from_secs(20), "step 4's trace over HTTP", || {
        let lines = rx.lines();
        let s = spans(&requests(&lines, "http", "traces"));
        s.iter().any(|s| s["name"] == "step" && attr_i(&s["attributes"], "stepwise.step") == Some(4)).then_some(s)
    })
    .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", agent.proc.log_text()));
    check_step_trace(&traces, 4, "http", &agent);
    check_metrics(&rx, &agent, "http");
    let lines = rx.lines();
    let http = requests(&lines, "http", "metrics");
    assert!(http.iter().all(|l| l["headers"]["x-stepwise-test"] == "http"
        && l["headers"]["authorization"] == "Bearer t0ken"
        && l["headers"]["content-type"] == "application/x-protobuf"
        && l["headers"]["content-encoding"] == "gzip"));
    let res = &http[0]["request"]["resource_metrics"][0]["resource"]["attributes"];
    assert_eq!(attr_s(res, "service.name"), Some("stepwise-node-agent"), "OTEL_SERVICE_NAME: {res}");
    assert_eq!(attr_s(res, "k8s.cluster.name"), Some("test-cluster"), "OTEL_RESOURCE_ATTRIBUTES: {res}");
    assert_eq!(attr_s(res, "deployment.environment"), Some("ci,local"), "percent-decoded: {res}");
    assert!(attr_s(res, "host.name").is_some_and(|h| !h.is_empty()), "host.name kept: {res}");
    assert!(lines.iter().all(|l| l.get("error").is_none()), "every gzip body inflated and decoded");
    drop(agent);

    // 3. A collector that accepts and never answers: 1 s timeouts, a queue of 2 steps.
    let hole = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hole_addr = hole.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in hole.incoming().flatten() {
            held.push(c); // keep every connection open, read nothing
        }
    });
    let cfg = config(dir.path(), &ns, &sock, &format!("endpoint = \"http://{hole_addr}\"\ninterval = \"200ms\"\ntimeout = \"1s\"\nqueue = 2\n"));
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    let sweeps = |a: &Agent| a.status().ok().and_then(|s| s["sweeps"].as_u64()).unwrap_or(0);
    let (s0, t0) = (sweeps(&agent), Instant::now());
    job(&ns, &sock, 10);
    std::thread::sleep(Duration::from_millis(3000));
    let (s1, dt) = (sweeps(&agent), t0.elapsed().as_secs_f64());
    // 100 ms interval: a blocked sampler would show ~0 sweeps while exports hang for 1 s
    // each; a loaded 2-core machine still manages well over 30 % of the nominal count.
    assert!((s1 - s0) as f64 >= 0.3 * dt / 0.1, "sampling stalled behind a dead collector: {} sweeps in {dt:.1} s", s1 - s0);
    let steps: Value = serde_json::from_str(&agent.get("/api/v1/steps?limit=100").expect("steps").body).expect("json");
    assert!(steps["steps"].as_array().map(Vec::len).unwrap_or(0) >= 9, "attribution went on: {}", steps["steps"]);
    let m = agent.metrics().expect("metrics");
    let errors = sample(&m, "stepwise_otlp_export_errors_total", &[("signal", "metrics")]).unwrap_or(0.0)
        + sample(&m, "stepwise_otlp_export_errors_total", &[("signal", "traces")]).unwrap_or(0.0);
    let dropped = sample(&m, "stepwise_otlp_dropped_total", &[("signal", "traces")]).unwrap_or(0.0);
    assert!(errors >= 2.0, "timed-out exports counted: {errors}");
    assert!(dropped >= 1.0, "steps beyond the queue (or in failed exports) counted: {dropped}");
    assert_eq!(agent.get("/readyz").map(|r| r.status).ok(), Some(200), "API answers");
    // Shutdown makes one last export attempt per signal, each bounded by the timeout (the
    // rest of the agent's shutdown waits up to 5 s per task, run.rs).
    let mut agent = agent;
    assert_eq!(agent.proc.terminate(Duration::from_secs(40)), Some(0), "clean exit on SIGTERM behind a dead collector:\n{}", agent.proc.log_text());
}

/// A test CA and a certificate it signed for `localhost` / 127.0.0.1 (openssl): (ca, cert, key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let p = |n: &str| dir.join(n);
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (Debian package openssl)");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=stepwise test CA"]);
    run(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
    std::fs::write(
        p("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    (p("ca.pem"), p("server.pem"), p("server.key"))
}

/// Export counts of an agent: (exports, errors) over both signals.
fn export_counts(a: &Agent) -> (f64, f64) {
    let m = a.metrics().unwrap_or_default();
    let sum = |name: &str| ["metrics", "traces"].iter().map(|s| sample(&m, name, &[("signal", s)]).unwrap_or(0.0)).sum::<f64>();
    (sum("stepwise_otlp_exports_total"), sum("stepwise_otlp_export_errors_total"))
}

#[test]
fn https_collectors_are_verified_against_the_ca_file_or_refused() {
    let dir = tempfile::Builder::new().prefix("stepwise-otlp-tls-").tempdir().expect("tmp");
    let (ca, cert, key) = certificates(dir.path());
    let rx = Receiver::start(dir.path(), Some((&cert, &key)));
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let sock = dir.path().join("markers.sock");
    // gRPC over TLS, the CA from [otlp] ca_file; the name verified is the endpoint's host.
    let grpc =
        config(dir.path(), &ns, &sock, &format!("endpoint = \"https://localhost:{}\"\ninterval = \"500ms\"\nca_file = \"{}\"\n", rx.tls.0, ca.display()));
    let a = Agent::start(dir.path(), &["--config", grpc.to_str().expect("utf8")]).expect("agent starts");
    // OTLP/HTTP over TLS, configured by the standard variables only (an IP address verified
    // against the certificate's IP SAN).
    // Each agent its own marker socket: a live agent's socket is never taken over.
    let http = config(dir.path(), &ns, &dir.path().join("markers-b.sock"), "interval = \"500ms\"\n");
    let endpoint = format!("https://127.0.0.1:{}", rx.tls.1);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.to_str().expect("utf8")),
    ];
    let b = Agent::start_env(dir.path(), &["--config", http.to_str().expect("utf8")], &env).expect("agent starts");
    // The same collector without the CA: the system's roots do not know it, so every export
    // fails on the certificate and is counted; nothing is sent in the clear.
    let refused = config(
        dir.path(),
        &ns,
        &dir.path().join("markers-c.sock"),
        &format!("endpoint = \"https://localhost:{}\"\ninterval = \"500ms\"\ntimeout = \"2s\"\n", rx.tls.0),
    );
    let c = Agent::start(dir.path(), &["--config", refused.to_str().expect("utf8")]).expect("agent starts");

    for transport in ["grpc-tls", "https"] {
        wait_for(Duration::from_secs(30), transport, || {
            let lines = rx.lines();
            let got = requests(&lines, transport, "metrics");
            got.iter().any(|l| l["request"]["resource_metrics"][0]["scope_metrics"].as_array().is_some_and(|s| !s.is_empty())).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}: metrics over {transport}; agent logs:\n{}\n{}", a.proc.log_text(), b.proc.log_text()));
    }
    wait_for(Duration::from_secs(30), "refused exports counted", || (export_counts(&c).1 >= 2.0).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", export_counts(&c), c.proc.log_text()));
    let lines = rx.lines();
    assert!(lines.iter().all(|l| l.get("error").is_none()), "every TLS request decoded");
    assert_eq!(export_counts(&c).0, 0.0, "no export succeeded without the CA");
    assert!(c.proc.log_text().to_lowercase().contains("certificate"), "the refusal names the certificate:\n{}", c.proc.log_text());
    for (name, agent) in [("grpc", &a), ("http", &b)] {
        let (ok, errors) = export_counts(agent);
        assert!(ok >= 2.0 && errors == 0.0, "{name} over TLS: {ok} exports, {errors} errors");
    }
}
