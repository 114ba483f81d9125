//! What the Prometheus Operator makes of the chart's ServiceMonitor and PodMonitor: the chart
//! rendered by `helm template` (as the ecosystem tier renders it), and the scrape config the
//! Operator generates for the rendered monitor, written out rule for rule after
//! `generateServiceMonitorConfig` / `generatePodMonitorConfig` in prometheus-operator's
//! `pkg/prometheus/promcfg.go` (main, 6adcebc5, August 2026): `honor_labels` from the
//! endpoint, the selector and port `keep` rules, the `namespace`/`service`/`pod`/`container`
//! target labels, `job`, `endpoint`, the monitor's own relabelings, then the sharding rules
//! (one shard, `$(SHARD)` as the config reloader substitutes it).
//!
//! Kubernetes service discovery needs an API server, so the discovered target is written as a
//! static target with the `__meta_kubernetes_*` labels discovery would give the agent's pod
//! (role `endpoints`, the Operator's default, for a ServiceMonitor; role `pod` for a
//! PodMonitor), taken from the rendered Service and DaemonSet.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// The chart's namespace and release as the tests render it.
pub const NAMESPACE: &str = "gpu-observability";
pub const RELEASE: &str = "stepwise-agent";

/// Which monitor the chart renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Monitor {
    Service,
    Pod,
}

/// The agent's pod as Kubernetes discovery would see it.
pub struct AgentPod {
    pub name: String,
    pub node: String,
}

/// helm: `STEPWISE_HELM` (the integration tier passes the ecosystem tier's pinned helm), else
/// on PATH, else where the ecosystem tier installs it (`<cache>/helm/helm/helm`).
pub fn helm() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("STEPWISE_HELM") {
        return Ok(h.into());
    }
    if let Some(h) = crate::harness::which("helm") {
        return Ok(h);
    }
    let cache = std::env::var_os("STEPWISE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"));
        base.join("stepwise")
    });
    let h = cache.join("helm/helm/helm");
    h.is_file().then_some(h.clone()).ok_or_else(|| anyhow!("helm not found (STEPWISE_HELM, PATH, {}): `cargo xtask test integration` installs it", h.display()))
}

/// The chart rendered for a cluster that serves the Operator's API, with `monitor` enabled
/// (the other off) and `args` (`--set …`) after: its objects as JSON.
pub fn render(monitor: Monitor, args: &[&str]) -> Result<Vec<Value>> {
    let chart = crate::harness::workspace_root().join("deploy/helm/stepwise");
    let pm = monitor == Monitor::Pod;
    let out = Command::new(helm()?)
        .args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE, "--api-versions", "monitoring.coreos.com/v1"])
        .args(["--set", &format!("serviceMonitor.enabled={}", !pm), "--set", &format!("podMonitor.enabled={pm}")])
        .args(args)
        .output()
        .context("helm template")?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    yaml_docs(&out.stdout)
}

/// YAML documents as JSON (PyYAML, as the ecosystem tier parses them): `STEPWISE_PYTHON`
/// (the integration tier passes the ecosystem tier's), else `python3`.
fn yaml_docs(yaml: &[u8]) -> Result<Vec<Value>> {
    use std::io::Write;
    let python = std::env::var_os("STEPWISE_PYTHON").unwrap_or_else(|| "python3".into());
    let mut child = Command::new(python)
        .args(["-c", "import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d is not None]))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("python3")?;
    child.stdin.take().context("stdin")?.write_all(yaml)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("invalid YAML (python3 with PyYAML): {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn object<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter().find(|d| d["kind"] == kind).ok_or_else(|| anyhow!("the chart rendered no {kind}"))
}

/// Label name as discovery writes it (`sanitizeLabelName`: anything but `[a-zA-Z0-9_]` → `_`).
fn sanitize(k: &str) -> String {
    k.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

fn str_of<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| anyhow!("{what} missing: {v}"))
}

/// `__meta_kubernetes_<kind>_label_<k>` and `…_labelpresent_<k>` of `labels`.
fn meta_labels(into: &mut serde_json::Map<String, Value>, kind: &str, labels: &Value) {
    for (k, v) in labels.as_object().into_iter().flatten() {
        into.insert(format!("__meta_kubernetes_{kind}_label_{}", sanitize(k)), v.clone());
        into.insert(format!("__meta_kubernetes_{kind}_labelpresent_{}", sanitize(k)), json!("true"));
    }
}

/// The labels discovery gives the agent pod's target: role `endpoints` through the Service for
/// a ServiceMonitor, role `pod` for a PodMonitor.
pub fn discovered(docs: &[Value], monitor: Monitor, pod: &AgentPod) -> Result<Value> {
    let ds = object(docs, "DaemonSet")?;
    let template = &ds["spec"]["template"];
    let ns = str_of(&ds["metadata"]["namespace"], "DaemonSet namespace")?;
    let containers = template["spec"]["containers"].as_array().context("containers")?;
    let (container, port) =
        containers.iter().find_map(|c| c["ports"].as_array()?.first().map(|p| (c, p))).ok_or_else(|| anyhow!("no container with a port: {containers:?}"))?;
    let mut m = serde_json::Map::new();
    for (k, v) in [
        ("namespace", ns),
        ("pod_name", pod.name.as_str()),
        ("pod_node_name", pod.node.as_str()),
        ("pod_phase", "Running"),
        ("pod_ready", "true"),
        ("pod_container_name", str_of(&container["name"], "container name")?),
        ("pod_container_port_name", str_of(&port["name"], "port name")?),
        ("pod_container_port_protocol", "TCP"),
    ] {
        m.insert(format!("__meta_kubernetes_{k}"), json!(v));
    }
    m.insert("__meta_kubernetes_pod_container_port_number".into(), json!(port["containerPort"].to_string()));
    meta_labels(&mut m, "pod", &template["metadata"]["labels"]);
    if monitor == Monitor::Service {
        let svc = object(docs, "Service")?;
        let sport = svc["spec"]["ports"].as_array().and_then(|p| p.first()).context("Service port")?;
        m.insert("__meta_kubernetes_service_name".into(), svc["metadata"]["name"].clone());
        meta_labels(&mut m, "service", &svc["metadata"]["labels"]);
        m.insert("__meta_kubernetes_endpoint_port_name".into(), sport["name"].clone());
        m.insert("__meta_kubernetes_endpoint_port_protocol".into(), json!("TCP"));
        m.insert("__meta_kubernetes_endpoint_ready".into(), json!("true"));
        m.insert("__meta_kubernetes_endpoint_address_target_kind".into(), json!("Pod"));
        m.insert("__meta_kubernetes_endpoint_address_target_name".into(), json!(pod.name));
    }
    Ok(Value::Object(m))
}

fn copy(from: &str, to: &str) -> Value {
    json!({"source_labels": [from], "target_label": to})
}

/// The selector's `keep` rules (`matchLabels` sorted, as the Operator sorts them).
fn selector_rules(spec: &Value, kind: &str) -> Vec<Value> {
    let mut keys: Vec<(&String, &Value)> = spec["selector"]["matchLabels"].as_object().into_iter().flatten().collect();
    keys.sort_by_key(|(k, _)| *k);
    keys.into_iter()
        .map(|(k, v)| {
            let k = sanitize(k);
            json!({"action": "keep", "source_labels": [format!("__meta_kubernetes_{kind}_label_{k}"), format!("__meta_kubernetes_{kind}_labelpresent_{k}")],
                   "regex": format!("({});true", v.as_str().unwrap_or_default())})
        })
        .collect()
}

/// The monitor's own relabelings (the CRD's camelCase as Prometheus's snake_case).
fn own_rules(ep: &Value) -> Vec<Value> {
    let snake = |k: &str| match k {
        "sourceLabels" => "source_labels".to_string(),
        "targetLabel" => "target_label".to_string(),
        k => k.to_string(),
    };
    ep["relabelings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Value::Object(r.as_object().into_iter().flatten().map(|(k, v)| (snake(k), v.clone())).collect()))
        .collect()
}

/// The relabel rules before the monitor's own: `generateServiceMonitorConfig` (role
/// `endpoints`) or `generatePodMonitorConfig`.
fn operator_rules(monitor: Monitor, mon: &Value, port: &str) -> Result<Vec<Value>> {
    let (spec, ns, name) = (&mon["spec"], str_of(&mon["metadata"]["namespace"], "namespace")?, str_of(&mon["metadata"]["name"], "name")?);
    let running = json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"});
    let mut r = vec![copy("job", "__tmp_prometheus_job_name")];
    if monitor == Monitor::Service {
        r.extend(selector_rules(spec, "service"));
        r.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port}));
        let target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"];
        r.push(json!({"source_labels": target, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"}));
        r.push(json!({"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"}));
        r.push(copy("__meta_kubernetes_namespace", "namespace"));
        r.push(copy("__meta_kubernetes_service_name", "service"));
        r.push(copy("__meta_kubernetes_pod_name", "pod"));
        r.push(copy("__meta_kubernetes_pod_container_name", "container"));
        r.push(running);
        r.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}));
    } else {
        r.push(running);
        r.extend(selector_rules(spec, "pod"));
        r.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}));
        r.push(copy("__meta_kubernetes_namespace", "namespace"));
        r.push(copy("__meta_kubernetes_pod_container_name", "container"));
        r.push(copy("__meta_kubernetes_pod_name", "pod"));
        r.push(json!({"target_label": "job", "replacement": format!("{ns}/{name}")}));
    }
    r.push(json!({"target_label": "endpoint", "replacement": port}));
    Ok(r)
}

/// The scrape config the Operator generates for the chart's rendered monitor, its target
/// `address` with the labels discovery would give it. The one change: the scrape interval and
/// timeout are the test's (1 s), not the chart's 15 s.
pub fn scrape_config(docs: &[Value], monitor: Monitor, address: &str, pod: &AgentPod) -> Result<Value> {
    let (kind, eps, prefix) = match monitor {
        Monitor::Service => ("ServiceMonitor", "endpoints", "serviceMonitor"),
        Monitor::Pod => ("PodMonitor", "podMetricsEndpoints", "podMonitor"),
    };
    let mon = object(docs, kind)?;
    let ep = mon["spec"][eps].as_array().and_then(|e| e.first()).ok_or_else(|| anyhow!("{kind} has no endpoint: {mon}"))?;
    let port = str_of(&ep["port"], "endpoint port")?;
    let mut relabel = operator_rules(monitor, mon, port)?;
    relabel.extend(own_rules(ep));
    relabel.extend([
        json!({"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash", "regex": "(.+);", "replacement": "$1", "action": "replace"}),
        json!({"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"}),
        json!({"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": "0;|.+;.+", "action": "keep"}),
    ]);
    let name = format!("{prefix}/{}/{}/0", str_of(&mon["metadata"]["namespace"], "namespace")?, str_of(&mon["metadata"]["name"], "name")?);
    Ok(json!({
        "job_name": name,
        "honor_labels": ep["honorLabels"].as_bool().unwrap_or(false),
        "scrape_interval": "1s",
        "scrape_timeout": "900ms",
        "metrics_path": ep["path"].as_str().unwrap_or("/metrics"),
        "static_configs": [{"targets": [address], "labels": discovered(docs, monitor, pod)?}],
        "relabel_configs": relabel,
    }))
}
