//! The per-rank series under the Prometheus Operator's defaults (issue 33 item 1): a real
//! Prometheus scrapes a real agent with the scrape configs the Operator generates for the
//! chart's rendered ServiceMonitor and PodMonitor (`tests/src/operator.rs`: the Operator's
//! relabel rules, `honor_labels` as the chart renders it, the discovered target's
//! `__meta_kubernetes_*` labels), while a 2-rank job runs in a "pod" (`training/llama-worker-0`,
//! a kubelet-named cgroup and log directory).
//!
//! Checks, for both monitors: the rank's identity keeps its names (`k8s_namespace_name`,
//! `k8s_pod_name`, `container_id`, `stepwise_job`); the target labels (`namespace`, `pod`,
//! `container`, `instance`, `job`, `endpoint`, and `service` for the ServiceMonitor) are the
//! agent pod's; no label of any series the job scrapes is `exported_*`; and the dashboards'
//! namespace and pod variables list the training job's namespace and pod, not the agent's.

use std::time::Duration;

use serde_json::Value;
use stepwise_tests::{
    harness::{wait_for, workspace_root, Agent, Prometheus},
    kubepods::PodCgroup,
    netns::Netns,
    operator::{render, scrape_config, AgentPod, Monitor, NAMESPACE},
    workloads,
};

const AGENT_POD: &str = "stepwise-agent-x7k2p";
const NODE: &str = "gpu-node-07";

/// The label values of `series` (a query result) under `name`, sorted and deduplicated.
fn values(series: &[Value], name: &str) -> Vec<String> {
    let mut v: Vec<String> = series.iter().filter_map(|s| s["metric"][name].as_str().map(String::from)).collect();
    v.sort();
    v.dedup();
    v
}

/// A dashboard variable's `label_values(selector, label)` query from ranks-skew.json, every
/// other variable at All (`.*`), evaluated as Grafana does: the label's values among the
/// selector's series.
fn dashboard_variable(prom: &Prometheus, var: &str) -> Vec<String> {
    let path = workspace_root().join("dashboards/ranks-skew.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard")).expect("json");
    let list = dash["templating"]["list"].as_array().expect("variables");
    let v = list.iter().find(|v| v["name"] == var).unwrap_or_else(|| panic!("no variable {var}"));
    let q = v["query"]["query"].as_str().or_else(|| v["query"].as_str()).unwrap_or_else(|| panic!("variable {var}: {v}"));
    let inner = q.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).unwrap_or_else(|| panic!("{var}: {q}"));
    let (selector, label) = inner.rsplit_once(',').expect("label_values(selector, label)");
    let mut sel = selector.to_string();
    for o in ["cluster", "job", "host", "namespace", "pod", "local_rank"] {
        sel = sel.replace(&format!("${o}"), ".*");
    }
    let r = prom.query(&format!("count by ({l}) ({sel})", l = label.trim())).unwrap_or_else(|e| panic!("{var}: {e}"));
    values(&r, label.trim())
}

/// Asserts what one monitor's scrape job made of the agent's series.
fn check(prom: &Prometheus, job: &str, monitor: Monitor, container: &str) {
    let info = wait_for(Duration::from_secs(60), &format!("{job}: both ranks' stepwise_rank_info"), || {
        prom.query(&format!("stepwise_rank_info{{job=\"{job}\", k8s_pod_name=\"llama-worker-0\"}}")).ok().filter(|r| values(r, "rank").len() >= 2)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", prom.query(&format!("last_over_time(stepwise_rank_info{{job=\"{job}\"}}[5m])"))));
    for s in &info {
        let m = &s["metric"];
        assert_eq!(m["k8s_namespace_name"], "training", "{job}: the rank's namespace: {m}");
        assert_eq!(m["container_id"], container, "{job}: the rank's container: {m}");
        assert_eq!(m["stepwise_job"], "STEPWISE_JOB=llama-70b", "{job}: the rank's job: {m}");
        assert_eq!(m["namespace"], NAMESPACE, "{job}: the target's namespace is the agent pod's: {m}");
        assert_eq!(m["pod"], AGENT_POD, "{job}: the target's pod is the agent's: {m}");
        assert_eq!(m["container"], "agent", "{job}: the target's container: {m}");
        assert_eq!(m["instance"], NODE, "{job}: instance is the node (the chart's relabeling): {m}");
        assert_eq!(m["endpoint"], "http", "{job}: {m}");
        let service = if monitor == Monitor::Service { Value::from("stepwise-agent") } else { Value::Null };
        assert_eq!(m["service"], service, "{job}: {m}");
    }
    let per_rank = wait_for(Duration::from_secs(60), &format!("{job}: per-rank wait series of the pod"), || {
        prom.query(&format!("stepwise_rank_wait_seconds_total{{job=\"{job}\", k8s_pod_name=\"llama-worker-0\"}}")).ok().filter(|r| values(r, "rank").len() >= 2)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", prom.query(&format!("last_over_time(stepwise_rank_wait_seconds_total{{job=\"{job}\"}}[5m])"))));
    assert_eq!(values(&per_rank, "k8s_namespace_name"), ["training"], "{job}: {per_rank:?}");
    assert_eq!(values(&per_rank, "pod"), [AGENT_POD], "{job}: {per_rank:?}");

    let all = prom.query(&format!("{{job=\"{job}\"}}")).expect("every series of the job");
    assert!(all.len() > 50, "{job}: the agent's series: {}", all.len());
    let renamed: Vec<&Value> = all.iter().filter(|s| s["metric"].as_object().is_some_and(|m| m.keys().any(|k| k.starts_with("exported_")))).collect();
    assert!(renamed.is_empty(), "{job}: labels renamed to exported_* (a clash with a target label): {renamed:?}");
}

#[test]
fn the_rank_identity_survives_the_operators_servicemonitor_and_podmonitor_target_labels() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-operator-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let cg = PodCgroup::new(dir.path(), "training", "llama-worker-0").expect("the pod's cgroup");
    let cfg = dir.path().join("agent.toml");
    let text = format!(
        "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nrescan = \"200ms\"\npod_logs = \"{}\"\n[collectives.select]\nnetns = \"/run/netns/{}\"\n",
        cg.pod_logs.display(),
        ns.name()
    );
    std::fs::write(&cfg, text).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");

    let pod = AgentPod { name: AGENT_POD.into(), node: NODE.into() };
    let mut jobs = Vec::new();
    let mut configs = Vec::new();
    for monitor in [Monitor::Service, Monitor::Pod] {
        let docs = render(monitor, &[]).expect("helm template");
        let c = scrape_config(&docs, monitor, &agent.addr, &pod).expect("the Operator's scrape config");
        assert_eq!(c["honor_labels"], false, "the chart's default: {c}");
        jobs.push((monitor, if monitor == Monitor::Service { "stepwise-agent".to_string() } else { format!("{NAMESPACE}/stepwise-agent") }));
        configs.push(c);
    }
    let prom = Prometheus::start_with(dir.path(), &Value::Array(configs).to_string()).expect("prometheus");

    let mut cmd = workloads::mpi_steps_with(ns.name(), 2, &["-x", "STEPWISE_JOB=llama-70b"], &["--steps", "600", "--compute-us", "50000"]);
    let procs = cg.enter(&mut cmd).expect("join the cgroup");
    let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().expect("mpirun");
    drop(procs);

    for (monitor, job) in &jobs {
        check(&prom, job, *monitor, &cg.container);
    }
    // The dashboards' variables list the training job's namespace and pod, in both shapes.
    assert_eq!(dashboard_variable(&prom, "namespace"), ["training"], "the namespace variable");
    assert_eq!(dashboard_variable(&prom, "pod"), ["llama-worker-0"], "the pod variable");
    // mpirun forwards SIGTERM to its ranks.
    // SAFETY: kill(2) on the child this test spawned and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    drop(agent);
}
