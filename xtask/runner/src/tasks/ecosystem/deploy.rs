//! deploy/: the kustomize base and the Helm chart render, lint and validate with the real
//! tools, produce the same objects, and give the agent exactly the least-privilege security
//! context; the ConfigMap's agent.toml is accepted by the agent and agrees with the mounts;
//! the systemd unit verifies and grants the same capabilities.

use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{run_ok, stdout, tools::Tools, write};
use crate::tasks::root;

/// The capabilities the agent is granted everywhere (tests/tests/capabilities.rs shows why
/// each one is needed).
pub const CAPS: &[&str] = &["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"];
/// Kubernetes versions validated against (the two newest kubernetes-validate bundles).
const K8S: &[&str] = &["1.36.0", "1.37.0"];

pub fn check(t: &Tools, work: &Path, agent: &Path) -> Result<()> {
    let base = stdout(&run_ok(Command::new(&t.kubectl).arg("kustomize").arg(root().join("deploy/kubernetes")))?);
    // The PodMonitor variant: an overlay outside the base (kustomize refuses cycles), as users
    // would write it.
    let overlay = work.join("overlay-podmonitor");
    write(&overlay, "kustomization.yaml", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../../deploy/kubernetes\ncomponents:\n  - ../../../deploy/kubernetes/components/podmonitor\n")?;
    let base_pm = stdout(&run_ok(Command::new(&t.kubectl).arg("kustomize").arg(&overlay))?);

    let chart = root().join("deploy/helm/stepwise");
    let lint = run_ok(Command::new(&t.helm).args(["lint", "--strict"]).arg(&chart))?;
    let lint_out = stdout(&lint);
    if lint_out.contains('[') || !lint_out.contains("1 chart(s) linted, 0 chart(s) failed") {
        bail!("helm lint is not clean:\n{lint_out}");
    }
    eprintln!("helm lint --strict: clean (no INFO, WARNING or ERROR)");
    let template = |extra: &[&str]| -> Result<String> {
        Ok(stdout(&run_ok(
            Command::new(&t.helm).args(["template", "stepwise"]).arg(&chart).args(["--namespace", "stepwise", "--set", "createNamespace=true"]).args(extra),
        )?))
    };
    let helm = template(&[])?;
    let helm_pm = template(&["--set", "serviceMonitor.enabled=false", "--set", "podMonitor.enabled=true"])?;
    let helm_plain = stdout(&run_ok(Command::new(&t.helm).args(["template", "stepwise"]).arg(&chart).args(["--namespace", "gpu-observability"]))?);

    let renders = [
        ("kustomize base", &base),
        ("kustomize + podmonitor component", &base_pm),
        ("helm template", &helm),
        ("helm template (podMonitor)", &helm_pm),
        ("helm template (defaults, other namespace)", &helm_plain),
    ];
    validate(t, work, &renders)?;
    for (name, yaml) in renders {
        let docs = t.yaml_docs(yaml)?;
        monitors(t, work, name, &docs)?;
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").with_context(|| format!("{name}: no DaemonSet"))?;
        security_context(name, ds)?;
        let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").with_context(|| format!("{name}: no ConfigMap"))?;
        config(t, work, agent, name, ds, cm)?;
    }
    // Negative controls: the checks must reject a wrong field type and an extra capability.
    let bad = base.replacen("readOnlyRootFilesystem: true", "readOnlyRootFilesystem: \"yes\"", 1);
    if validate(t, work, &[("negative control", &bad)]).is_ok() {
        bail!("kubernetes-validate accepted readOnlyRootFilesystem: \"yes\": it cannot catch such mistakes");
    }
    let mut ds = t.yaml_docs(&base)?.into_iter().find(|d| d["kind"] == "DaemonSet").context("DaemonSet")?;
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"].as_array_mut().context("add")?.push("NET_ADMIN".into());
    if security_context("negative control", &ds).is_ok() {
        bail!("the security-context check accepted an extra NET_ADMIN capability");
    }
    eprintln!("negative controls rejected: a string for readOnlyRootFilesystem (kubernetes-validate), an extra NET_ADMIN (security context)");
    same_objects("kustomize base", &t.yaml_docs(&base)?, "helm template", &t.yaml_docs(&helm)?)?;
    same_objects("kustomize + podmonitor", &t.yaml_docs(&base_pm)?, "helm template --set podMonitor.enabled=true", &t.yaml_docs(&helm_pm)?)?;
    Ok(())
}

/// kubernetes-validate (strict: unknown fields refused) of every render, for each Kubernetes
/// version (one run per version: the tool takes seconds to load its schemas). It has no
/// schema for the Prometheus Operator kinds; [`monitors`] checks those.
fn validate(t: &Tools, work: &Path, renders: &[(&str, &String)]) -> Result<()> {
    let mut all = String::new();
    let mut core = 0;
    for (name, yaml) in renders {
        core += t.yaml_docs(yaml)?.iter().filter(|d| d["apiVersion"].as_str().is_some_and(|a| !a.starts_with("monitoring.coreos.com/"))).count();
        all.push_str(&format!("# {name}\n---\n{yaml}\n---\n"));
    }
    let file = write(work, "renders.yaml", &all)?;
    for v in K8S {
        let out = Command::new(&t.kubernetes_validate).args(["--strict", "-k", v]).arg(&file).output()?;
        let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        let unvalidated: Vec<&str> = text.lines().filter(|l| l.contains("Couldn't find schema")).collect();
        let passed = text.lines().filter(|l| l.contains(" passed for resource ")).count();
        if !out.status.success() || text.contains("ERROR") || unvalidated.iter().any(|l| !(l.contains("kind ServiceMonitor") || l.contains("kind PodMonitor")))
        {
            bail!("kubernetes-validate --strict -k {v} failed:\n{text}");
        }
        if passed != core {
            bail!("kubernetes-validate {v} passed {passed} of {core} core objects:\n{text}");
        }
    }
    eprintln!("kubernetes-validate --strict: all {core} core objects of the {} renders valid for Kubernetes {}", renders.len(), K8S.join(" and "));
    Ok(())
}

/// ServiceMonitor/PodMonitor against the CRD schemas of @kubernetes-models/prometheus-operator.
fn monitors(t: &Tools, work: &Path, name: &str, docs: &[Value]) -> Result<()> {
    let monitors: Vec<&Value> = docs.iter().filter(|d| d["apiVersion"] == "monitoring.coreos.com/v1").collect();
    let script = "const docs = JSON.parse(require('fs').readFileSync(0, 'utf8'));\nfor (const d of docs) {\n  const { [d.kind]: Model } = require(process.argv[2] + '/node_modules/@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/' + d.kind);\n  new Model(d).validate();\n  console.log(d.kind + '/' + d.metadata.name + ' valid');\n}\n";
    let js = write(work, "validate-monitors.js", script)?;
    let mut child = Command::new("node")
        .arg(&js)
        .arg(&t.npm)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        child.stdin.take().context("stdin")?.write_all(serde_json::to_string(&monitors)?.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() || monitors.is_empty() {
        bail!("{name}: Prometheus Operator CRD validation failed ({} monitors):\n{}{}", monitors.len(), stdout(&out), String::from_utf8_lossy(&out.stderr));
    }
    eprintln!("{name}: {} objects; {} against the prometheus-operator CRD schemas", docs.len(), stdout(&out).trim().replace('\n', ", "));
    Ok(())
}

/// The least-privilege pod: not privileged, no escalation, read-only root, uid 0 with exactly
/// CAPS after dropping ALL, read-only host /sys and /proc, tracefs and bpffs, probes on
/// /healthz and /readyz, GPU-node scheduling, resources.
fn security_context(name: &str, ds: &Value) -> Result<()> {
    let pod = &ds["spec"]["template"]["spec"];
    let c = pod["containers"].as_array().and_then(|v| v.first()).with_context(|| format!("{name}: no container"))?;
    let sc = &c["securityContext"];
    let mut errs = Vec::new();
    let mut want = |ok: bool, what: &str| {
        if !ok {
            errs.push(what.to_string());
        }
    };
    want(sc["privileged"] == false, "privileged: false");
    want(sc["allowPrivilegeEscalation"] == false, "allowPrivilegeEscalation: false");
    want(sc["readOnlyRootFilesystem"] == true, "readOnlyRootFilesystem: true");
    want(sc["runAsUser"] == 0, "runAsUser: 0");
    want(sc["capabilities"]["drop"] == serde_json::json!(["ALL"]), "capabilities.drop: [ALL]");
    let add: BTreeSet<&str> = sc["capabilities"]["add"].as_array().map(|v| v.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    want(add == CAPS.iter().copied().collect(), &format!("capabilities.add exactly {CAPS:?} (got {add:?})"));
    want(pod["hostPID"] == true, "hostPID: true");
    want(pod["hostNetwork"] == true, "hostNetwork: true");
    want(pod["automountServiceAccountToken"] == false, "automountServiceAccountToken: false");
    want(pod["nodeSelector"].as_object().is_some_and(|m| !m.is_empty()), "a GPU nodeSelector");
    want(pod["tolerations"].as_array().is_some_and(|v| v.iter().any(|t| t["key"] == "nvidia.com/gpu")), "a nvidia.com/gpu toleration");
    want(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "livenessProbe on /healthz");
    want(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "readinessProbe on /readyz");
    want(c["resources"]["requests"].is_object() && c["resources"]["limits"]["memory"].is_string(), "resources with requests and a memory limit");
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
    let mount_of = |host: &str| -> Option<&Value> {
        let v = volumes.iter().find(|v| v["hostPath"]["path"] == host)?;
        mounts.iter().find(|m| m["name"] == v["name"])
    };
    for (host, ro) in
        [("/sys", true), ("/proc", true), ("/sys/kernel/tracing", true), ("/sys/fs/bpf", true), ("/var/lib/stepwise", false), ("/run/stepwise", false)]
    {
        match mount_of(host) {
            Some(m) => want((m["readOnly"] == true) == ro, &format!("hostPath {host} mounted {}", if ro { "read-only" } else { "read-write" })),
            None => want(false, &format!("hostPath {host} mounted")),
        }
    }
    if !errs.is_empty() {
        bail!("{name}: the DaemonSet's security context / pod spec is wrong:\n  {}", errs.join("\n  "));
    }
    eprintln!(
        "{name}: DaemonSet not privileged, no escalation, read-only root, uid 0, drop ALL, add exactly {CAPS:?}; host /sys, /proc, tracefs, bpffs read-only"
    );
    Ok(())
}

/// The ConfigMap's agent.toml: accepted by the agent's own config loader, and pointing at the
/// places the DaemonSet mounts (host sysfs/procfs, state and marker directories).
fn config(t: &Tools, work: &Path, agent: &Path, name: &str, ds: &Value, cm: &Value) -> Result<()> {
    let toml = cm["data"]["agent.toml"].as_str().with_context(|| format!("{name}: ConfigMap without agent.toml"))?;
    let file = write(work, "configmap-agent.toml", toml)?;
    let out = Command::new(agent).args(["check", "--json", "--config"]).arg(&file).output()?;
    let report: Value = serde_json::from_slice(&out.stdout).with_context(|| format!("agent check --json: {}", String::from_utf8_lossy(&out.stderr)))?;
    if let Some(bad) = report["checks"].as_array().and_then(|v| v.iter().find(|c| c["name"] == "config")) {
        bail!("{name}: the agent refuses the ConfigMap's agent.toml: {}", bad["detail"]);
    }
    let parsed = stdout(&run_ok(
        Command::new(&t.python).args(["-c", "import sys, tomllib, json; print(json.dumps(tomllib.load(open(sys.argv[1], 'rb'))))"]).arg(&file),
    )?);
    let cfg: Value = serde_json::from_str(&parsed)?;
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let mounted = |path: &str| c["volumeMounts"].as_array().is_some_and(|v| v.iter().any(|m| m["mountPath"].as_str().is_some_and(|p| path.starts_with(p))));
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    for (key, path) in [
        ("sysfs_root", s(&cfg["sysfs_root"])),
        ("collectives.proc_root", s(&cfg["collectives"]["proc_root"])),
        ("steps.marker_socket", s(&cfg["steps"]["marker_socket"])),
        ("store.path", s(&cfg["store"]["path"])),
    ] {
        if path.is_empty() || !mounted(&path) {
            bail!("{name}: agent.toml {key} = {path:?} is not under any volume the DaemonSet mounts");
        }
    }
    if cfg["listen"].as_str().and_then(|l| l.rsplit(':').next()) != c["ports"][0]["containerPort"].as_u64().map(|p| p.to_string()).as_deref() {
        bail!("{name}: agent.toml listen {} does not match the container port {}", cfg["listen"], c["ports"][0]["containerPort"]);
    }
    Ok(())
}

/// Same kinds, names, namespaces and content, ignoring Helm's own bookkeeping labels and the
/// config checksum annotation.
fn same_objects(an: &str, a: &[Value], bn: &str, b: &[Value]) -> Result<()> {
    fn strip(m: &mut Value) {
        if let Some(l) = m["labels"].as_object_mut() {
            for k in ["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"] {
                l.remove(k);
            }
        }
        if let Some(o) = m.as_object_mut() {
            if let Some(an) = o.get_mut("annotations").and_then(Value::as_object_mut) {
                an.remove("checksum/config");
                if an.is_empty() {
                    o.remove("annotations");
                }
            }
        }
    }
    let norm = |docs: &[Value]| -> std::collections::BTreeMap<(String, String), Value> {
        docs.iter()
            .map(|d| {
                let mut d = d.clone();
                strip(&mut d["metadata"]);
                if d["kind"] == "DaemonSet" {
                    strip(&mut d["spec"]["template"]["metadata"]);
                }
                ((d["kind"].as_str().unwrap_or("").to_string(), d["metadata"]["name"].as_str().unwrap_or("").to_string()), d)
            })
            .collect()
    };
    let (na, nb) = (norm(a), norm(b));
    let (ka, kb): (Vec<_>, Vec<_>) = (na.keys().collect(), nb.keys().collect());
    if ka != kb {
        bail!("{an} renders {ka:?} but {bn} renders {kb:?}");
    }
    for (k, va) in &na {
        if Some(va) != nb.get(k) {
            bail!("{an} and {bn} differ in {k:?}:\n{an}: {}\n{bn}: {}", serde_json::to_string_pretty(va)?, serde_json::to_string_pretty(&nb[k])?);
        }
    }
    eprintln!("{an} and {bn}: the same {} objects ({})", na.len(), ka.iter().map(|(k, n)| format!("{k}/{n}")).collect::<Vec<_>>().join(", "));
    Ok(())
}

/// systemd-analyze verify (with ExecStart on the built binary, which must exist for it), the
/// exposure score, and the same capabilities as the DaemonSet.
pub fn systemd(agent: &Path, work: &Path) -> Result<()> {
    let unit = std::fs::read_to_string(root().join("deploy/systemd/stepwise-agent.service"))?;
    let keys = |k: &str| -> Vec<String> { unit.lines().filter_map(|l| l.strip_prefix(&format!("{k}="))).map(String::from).collect() };
    let want: BTreeSet<String> = CAPS.iter().map(|c| format!("CAP_{c}")).collect();
    for k in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let got: BTreeSet<String> = keys(k).iter().flat_map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>()).collect();
        if got != want {
            bail!("stepwise-agent.service: {k} = {got:?}, expected {want:?} (the DaemonSet's)");
        }
    }
    for (k, v) in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("StateDirectory", "stepwise"), ("RuntimeDirectory", "stepwise"), ("User", "root")]
    {
        if keys(k) != [v.to_string()] {
            bail!("stepwise-agent.service: expected {k}={v}, found {:?}", keys(k));
        }
    }
    if !unit.contains("ExecStart=/usr/local/bin/agent run ") {
        bail!("stepwise-agent.service: ExecStart must run /usr/local/bin/agent run");
    }
    let local = write(work, "stepwise-agent.service", &unit.replace("/usr/local/bin/agent", &agent.display().to_string()))?;
    let out = Command::new("systemd-analyze").arg("verify").arg(&local).output()?;
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() || !text.trim().is_empty() {
        bail!("systemd-analyze verify stepwise-agent.service:\n{text}");
    }
    let sec = Command::new("systemd-analyze").args(["security", "--offline=true"]).arg(&local).output()?;
    let score = stdout(&sec).lines().find(|l| l.contains("Overall exposure level")).unwrap_or("").trim().to_string();
    eprintln!("systemd-analyze verify: clean; capabilities {want:?} = the DaemonSet's; {score}");
    Ok(())
}
