//! deploy/: the kustomize base and the Helm chart render, lint and validate with the real
//! tools, produce the same objects, and give the agent exactly the least-privilege security
//! context; the ConfigMap's agent.toml is accepted by the agent and agrees with the mounts;
//! the systemd unit verifies and grants the same capabilities.

use std::{collections::BTreeSet, path::Path, process::Command, time::Duration};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{run_ok, stdout, tools::Tools, write};
use crate::tasks::root;

/// The capabilities the agent is granted everywhere (tests/tests/capabilities.rs shows why
/// each one is needed).
pub const CAPS: &[&str] = &["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"];
/// Kubernetes versions validated against: the chart's minimum (Chart.yaml `kubeVersion:
/// >=1.25.0-0`, deploy/README.md) and the two newest kubernetes-validate bundles.
const K8S: &[&str] = &["1.25.0", "1.36.0", "1.37.0"];

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
    // The cluster serves the Prometheus Operator's API: `--api-versions` is what `helm
    // install` finds by discovery.
    const MON: &[&str] = &["--api-versions", "monitoring.coreos.com/v1"];
    let template = |extra: &[&str]| -> Result<String> {
        Ok(stdout(&run_ok(
            Command::new(&t.helm)
                .args(["template", "stepwise-agent"])
                .arg(&chart)
                .args(["--namespace", "stepwise", "--set", "createNamespace=true"])
                .args(extra),
        )?))
    };
    let helm = template(MON)?;
    let helm_pm = template(&[MON, &["--set", "serviceMonitor.enabled=false", "--set", "podMonitor.enabled=true"]].concat())?;
    let helm_plain = stdout(&run_ok(Command::new(&t.helm).args(["template", "stepwise-agent"]).arg(&chart).args(["--namespace", "gpu-observability"]))?);
    let helm_port = template(
        &[
            MON,
            &[
                "--set",
                "port=9500",
                "--set",
                "prometheusLabels.release=kube-prometheus-stack",
                "--set",
                "serviceMonitor.honorLabels=true",
                "--set",
                "serviceMonitor.relabelings[0].targetLabel=cluster",
                "--set",
                "serviceMonitor.relabelings[0].replacement=gpu-a",
            ],
        ]
        .concat(),
    )?;
    let helm_options = template(&[
        "--set",
        "listenAddress=hostIP",
        "--set",
        "port=9501",
        "--set",
        "markersOverTcp.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.from[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
        "--set",
        "podAnnotations.example\\.com/team=ml",
        "--set",
        "extraEnv[0].name=STEPWISE_LOG",
        "--set",
        "extraEnv[0].value=debug",
    ])?;
    let example = std::fs::read_to_string(root().join("deploy/examples/job-markers-over-tcp.yaml"))?;

    let renders = [
        ("kustomize base", &base),
        ("kustomize + podmonitor component", &base_pm),
        ("helm template --api-versions monitoring.coreos.com/v1", &helm),
        ("helm template (podMonitor)", &helm_pm),
        ("helm template (defaults, other namespace, no monitoring API)", &helm_plain),
        ("helm template --set port=9500 (monitoring API, release label)", &helm_port),
        ("helm template (hostIP, port 9501, markersOverTcp, networkPolicy, podAnnotations, extraEnv)", &helm_options),
        ("deploy/examples/job-markers-over-tcp.yaml", &example),
    ];
    validate(t, work, &renders)?;
    chart_values(t, work, &chart, &helm_plain, &helm_port, &helm_options)?;
    markers_route(t, work, agent, &helm_options, &example)?;
    for (name, yaml) in renders {
        let docs = t.yaml_docs(yaml)?;
        if name.starts_with("deploy/examples/") {
            continue;
        }
        if name.contains("no monitoring API") {
            if let Some(m) = docs.iter().find(|d| d["apiVersion"] == "monitoring.coreos.com/v1") {
                bail!("{name}: renders a {} although the cluster does not serve monitoring.coreos.com/v1 (the install would fail)", m["kind"]);
            }
        } else if !name.contains("hostIP") {
            monitors(t, work, name, &docs)?;
        }
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").with_context(|| format!("{name}: no DaemonSet"))?;
        security_context(name, ds)?;
        let cm = docs.iter().find(|d| is_agent_config(d)).with_context(|| format!("{name}: no ConfigMap with agent.toml"))?;
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
    // The chart's own extras (the PrometheusRule and the dashboards ConfigMap, which need files
    // the kustomize base does not carry) are checked by `alerts_and_dashboards`.
    same_objects("kustomize base", &t.yaml_docs(&base)?, "helm template", &chart_only_removed(&t.yaml_docs(&helm)?)?)?;
    same_objects(
        "kustomize + podmonitor",
        &t.yaml_docs(&base_pm)?,
        "helm template --set podMonitor.enabled=true",
        &chart_only_removed(&t.yaml_docs(&helm_pm)?)?,
    )?;
    alerts_and_dashboards(t, &t.yaml_docs(&helm)?, &t.yaml_docs(&helm_plain)?, &t.yaml_docs(&helm_port)?)?;
    Ok(())
}

/// The agent's ConfigMap (the one carrying agent.toml).
fn is_agent_config(d: &Value) -> bool {
    d["kind"] == "ConfigMap" && d["data"]["agent.toml"].is_string()
}

/// The render without the chart-only objects, which must be there.
fn chart_only_removed(docs: &[Value]) -> Result<Vec<Value>> {
    let extra = |d: &Value| d["kind"] == "PrometheusRule" || (d["kind"] == "ConfigMap" && d["metadata"]["name"] == "stepwise-agent-dashboards");
    if docs.iter().filter(|d| extra(d)).count() != 2 {
        bail!("the chart render lacks its PrometheusRule or dashboards ConfigMap");
    }
    Ok(docs.iter().filter(|d| !extra(d)).cloned().collect())
}

/// Issue 16 item 4 in the chart: the rules file (for a plain Prometheus) passes `promtool
/// check rules` and its unit tests (`promtool test rules`), the chart's copy is identical and
/// its PrometheusRule carries exactly those groups (with the release label, only when the
/// monitoring API is served); the dashboards ConfigMap carries every dashboard, byte for byte,
/// under the Grafana sidecar's label.
fn alerts_and_dashboards(t: &Tools, helm: &[Value], plain: &[Value], port: &[Value]) -> Result<()> {
    let rules = root().join("deploy/prometheus/stepwise-rules.yaml");
    let text = std::fs::read_to_string(&rules)?;
    let copy = std::fs::read_to_string(root().join("deploy/helm/stepwise/files/stepwise-rules.yaml"))?;
    if text != copy {
        bail!("deploy/helm/stepwise/files/stepwise-rules.yaml differs from deploy/prometheus/stepwise-rules.yaml: cp the latter over the former");
    }
    let check = run_ok(Command::new("promtool").args(["check", "rules"]).arg(&rules))?;
    // Also the dcgm-exporter joins of docs/dcgm-join.md (issue 33), as PromQL expression tests.
    let test = run_ok(
        Command::new("promtool")
            .args(["test", "rules"])
            .arg(root().join("deploy/prometheus/stepwise-rules.test.yaml"))
            .arg(root().join("deploy/prometheus/dcgm-join.test.yaml")),
    )?;
    let test_out = format!("{}{}", stdout(&test), String::from_utf8_lossy(&test.stderr));
    if !test_out.contains("SUCCESS") {
        bail!("promtool test rules:\n{test_out}");
    }
    let groups = &t.yaml_docs(&text)?[0]["groups"];
    let alerts: Vec<&str> = groups[0]["rules"].as_array().map(|v| v.iter().filter_map(|r| r["alert"].as_str()).collect()).unwrap_or_default();
    let want = ["StepwiseAgentDown", "StepwiseSourceDown", "StepwiseProbeDrops", "StepwiseSlowSteps", "StepwiseDominantCause", "StepwiseHangSuspected"];
    if alerts != want {
        bail!("stepwise-rules.yaml alerts {alerts:?}, expected {want:?}");
    }
    // Each alert has a unit test that expects it to fire.
    let tests = std::fs::read_to_string(root().join("deploy/prometheus/stepwise-rules.test.yaml"))?;
    for a in want {
        if !tests.contains(&format!("alertname: {a}\n        exp_alerts:\n          - exp_labels")) {
            bail!("stepwise-rules.test.yaml has no test where {a} fires");
        }
    }
    let rule = helm.iter().find(|d| d["kind"] == "PrometheusRule").context("no PrometheusRule with the monitoring API")?;
    if &rule["spec"]["groups"] != groups {
        bail!("the chart's PrometheusRule groups differ from stepwise-rules.yaml:\n{}", rule["spec"]["groups"]);
    }
    let labelled = port.iter().find(|d| d["kind"] == "PrometheusRule").context("PrometheusRule (port render)")?;
    if labelled["metadata"]["labels"]["release"] != "kube-prometheus-stack" {
        bail!("prometheusLabels.release not on the PrometheusRule: {}", labelled["metadata"]["labels"]);
    }
    // Dashboards: the sidecar ConfigMap (also without the monitoring API: it is a ConfigMap).
    for (name, docs) in [("helm template", helm), ("helm template (no monitoring API)", plain)] {
        let cm = docs.iter().find(|d| d["metadata"]["name"] == "stepwise-agent-dashboards").with_context(|| format!("{name}: no dashboards ConfigMap"))?;
        if cm["metadata"]["labels"]["grafana_dashboard"] != "1" {
            bail!("{name}: dashboards ConfigMap without the sidecar label grafana_dashboard: \"1\": {}", cm["metadata"]["labels"]);
        }
        let data = cm["data"].as_object().context("data")?;
        let mut files: Vec<String> =
            std::fs::read_dir(root().join("dashboards"))?.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".json")).collect();
        files.sort();
        if data.len() != files.len() || files.is_empty() {
            bail!("{name}: dashboards ConfigMap has {:?}, dashboards/ has {files:?}", data.keys().collect::<Vec<_>>());
        }
        for f in &files {
            let want = std::fs::read_to_string(root().join("dashboards").join(f))?;
            let got = data.get(&format!("stepwise-{f}")).and_then(Value::as_str).unwrap_or("");
            if got.trim_end() != want.trim_end() {
                bail!("{name}: dashboards ConfigMap key stepwise-{f} is not dashboards/{f} (regenerate: node dashboards/gen/generate.mjs)");
            }
        }
    }
    eprintln!(
        "alerts: {} ({} ); promtool test rules: {}; the chart's PrometheusRule = stepwise-rules.yaml (release label); dashboards ConfigMap: every dashboard, label grafana_dashboard=1",
        want.join(", "),
        stdout(&check).trim().replace('\n', " "),
        test_out.trim().replace('\n', " ")
    );
    Ok(())
}

/// What each chart value renders (the findings of issue 16 item 3, each failing if it
/// regressed): one `port` everywhere, monitors only with their API and with the release label,
/// honorLabels/relabelings, the hostIP listen, the markers token, the NetworkPolicy,
/// podAnnotations and extraEnv; values.schema.json and the template refuse bad values.
fn chart_values(t: &Tools, work: &Path, chart: &Path, plain: &str, port: &str, options: &str) -> Result<()> {
    // A kind, or "agent.toml": the agent's ConfigMap (the dashboards' is another).
    let find = |docs: &[Value], kind: &str| -> Result<Value> {
        docs.iter().find(|d| if kind == "agent.toml" { is_agent_config(d) } else { d["kind"] == kind }).cloned().with_context(|| format!("no {kind}"))
    };
    let listen = |cm: &Value| -> String {
        cm["data"]["agent.toml"].as_str().unwrap_or("").lines().find_map(|l| l.strip_prefix("listen = ")).unwrap_or("").trim_matches('"').to_string()
    };
    let mut errs = Vec::new();
    let mut want = |ok: bool, what: String| {
        if !ok {
            errs.push(what);
        }
    };

    // --set port=9500: listen, containerPort, Service and the monitor's named port agree.
    let docs = t.yaml_docs(port)?;
    let (ds, cm, svc, sm) = (find(&docs, "DaemonSet")?, find(&docs, "agent.toml")?, find(&docs, "Service")?, find(&docs, "ServiceMonitor")?);
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    want(listen(&cm) == "0.0.0.0:9500", format!("port=9500: agent.toml listen is {:?}", listen(&cm)));
    want(c["ports"][0]["containerPort"] == 9500 && c["ports"][0]["name"] == "http", format!("port=9500: containerPort {}", c["ports"][0]));
    want(c["readinessProbe"]["httpGet"]["port"] == "http" && c["livenessProbe"]["httpGet"]["port"] == "http", "probes on the named port http".into());
    want(
        svc["spec"]["ports"][0]["port"] == 9500 && svc["spec"]["ports"][0]["targetPort"] == "http",
        format!("port=9500: Service port {}", svc["spec"]["ports"][0]),
    );
    want(
        sm["metadata"]["labels"]["release"] == "kube-prometheus-stack",
        format!("prometheusLabels.release not on the ServiceMonitor: {}", sm["metadata"]["labels"]),
    );
    let ep = &sm["spec"]["endpoints"][0];
    want(ep["port"] == "http" && ep["honorLabels"] == true, format!("ServiceMonitor endpoint port http with honorLabels: {ep}"));
    let rl = ep["relabelings"].as_array().cloned().unwrap_or_default();
    want(
        rl.len() == 2 && rl[0]["targetLabel"] == "instance" && rl[1]["targetLabel"] == "cluster",
        format!("relabelings: the instance one, then serviceMonitor.relabelings: {rl:?}"),
    );
    // Defaults without the monitoring API: no monitor (checked by the caller), every taint
    // tolerated, system-node-critical (security_context), no env, no token.
    let docs = t.yaml_docs(plain)?;
    let ds = find(&docs, "DaemonSet")?;
    want(ds["spec"]["template"]["spec"]["containers"][0].get("env").is_none(), "defaults: no env".into());
    want(!docs.iter().any(|d| d["kind"] == "NetworkPolicy"), "defaults: no NetworkPolicy".into());

    // hostIP, markersOverTcp, networkPolicy, podAnnotations, extraEnv.
    let docs = t.yaml_docs(options)?;
    let (ds, cm, np) = (find(&docs, "DaemonSet")?, find(&docs, "agent.toml")?, find(&docs, "NetworkPolicy")?);
    let pod = &ds["spec"]["template"];
    let c = &pod["spec"]["containers"][0];
    let env = c["env"].as_array().cloned().unwrap_or_default();
    let var = |n: &str| env.iter().find(|e| e["name"] == n).cloned().unwrap_or(Value::Null);
    want(var("STEPWISE_HOST_IP")["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP", format!("hostIP: STEPWISE_HOST_IP from status.hostIP: {env:?}"));
    want(var("STEPWISE_LISTEN")["value"] == "$(STEPWISE_HOST_IP):9501", format!("hostIP: STEPWISE_LISTEN {}", var("STEPWISE_LISTEN")));
    want(
        env.iter().position(|e| e["name"] == "STEPWISE_HOST_IP") < env.iter().position(|e| e["name"] == "STEPWISE_LISTEN"),
        "STEPWISE_HOST_IP defined before STEPWISE_LISTEN (Kubernetes expands $(VAR) only from earlier entries)".into(),
    );
    want(var("STEPWISE_LOG")["value"] == "debug", "extraEnv STEPWISE_LOG=debug".into());
    want(pod["metadata"]["annotations"]["example.com/team"] == "ml", format!("podAnnotations: {}", pod["metadata"]["annotations"]));
    want(c["ports"][0]["containerPort"] == 9501 && listen(&cm) == "0.0.0.0:9501", "hostIP: port 9501 in containerPort and listen".into());
    let toml = cm["data"]["agent.toml"].as_str().unwrap_or("");
    want(
        toml.contains("[api]\n") && toml.contains("markers_over_tcp = true") && toml.contains("token_file = \"/etc/stepwise-token/token\""),
        format!("markersOverTcp: [api] markers_over_tcp and token_file in agent.toml:\n{toml}"),
    );
    let vol = pod["spec"]["volumes"].as_array().and_then(|v| v.iter().find(|v| v["secret"]["secretName"] == "stepwise-markers-token").cloned());
    let mount = vol.as_ref().and_then(|v| c["volumeMounts"].as_array().and_then(|m| m.iter().find(|m| m["name"] == v["name"]).cloned()));
    want(
        mount.as_ref().is_some_and(|m| m["mountPath"] == "/etc/stepwise-token" && m["readOnly"] == true),
        format!("markersOverTcp: Secret stepwise-markers-token mounted read-only at /etc/stepwise-token: {mount:?}"),
    );
    let ing = &np["spec"]["ingress"][0];
    want(
        np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "stepwise"
            && np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "stepwise-agent"
            && ing["ports"][0]["port"] == 9501
            && ing["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring",
        format!("NetworkPolicy: the agent pods, port 9501, from networkPolicy.from: {}", np["spec"]),
    );
    if !errs.is_empty() {
        bail!("the chart's values do not render as documented:\n  {}", errs.join("\n  "));
    }

    // Refused: what values.schema.json types (a string port, a misspelt key, an unknown
    // pull policy) and a config that sets `listen` itself.
    let bad_config = write(work, "bad-listen.yaml", "config: |\n  listen = \"0.0.0.0:1\"\n")?;
    for (what, args, expect) in [
        ("port=http", vec!["--set", "port=http"], "port"),
        ("prot=9500", vec!["--set", "prot=9500"], "prot"),
        ("image.pullPolicy=Sometimes", vec!["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        ("config setting listen", vec!["-f", bad_config.to_str().context("utf8")?], "must not set `listen`"),
    ] {
        let out = Command::new(&t.helm).args(["template", "stepwise-agent"]).arg(chart).args(&args).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !err.contains(expect) {
            bail!("helm template {what}: expected a refusal naming {expect:?}, got {} {err}", out.status);
        }
    }
    eprintln!(
        "chart values: port=9500 in listen, containerPort, Service and monitor; release label, honorLabels, relabelings; hostIP listen; markers token Secret; NetworkPolicy; podAnnotations; extraEnv; schema refuses port=http, prot=, pullPolicy=Sometimes; a config with listen refused"
    );
    Ok(())
}

/// The markers route for pods without the hostPath: the chart's agent.toml with markersOverTcp
/// (listenAddress=hostIP: STEPWISE_LISTEN as Kubernetes expands it, the node being
/// 127.0.0.1 here) runs the agent, and the container command of
/// deploy/examples/job-markers-over-tcp.yaml, with its env as the kubelet sets it, sends its
/// markers: they arrive; the same command with a wrong token is refused.
fn markers_route(t: &Tools, work: &Path, agent: &Path, options: &str, example: &str) -> Result<()> {
    let docs = t.yaml_docs(options)?;
    let cm = docs.iter().find(|d| is_agent_config(d)).context("ConfigMap")?;
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").context("DaemonSet")?;
    let toml = cm["data"]["agent.toml"].as_str().context("agent.toml")?;
    let dir = work.join("markers-route");
    std::fs::create_dir_all(&dir)?;
    let d = dir.to_str().context("utf8")?;
    let token = "route-test-token-0123456789abcdef";
    write(&dir, "token/token", &format!("{token}\n"))?;
    let cfg = toml
        .replace("\"/host/sys\"", "\"/sys\"")
        .replace("/host/proc", "/proc")
        .replace("[collectives]\n", "[collectives]\nenabled = false\n")
        .replace("/var/lib/stepwise/agent.db", &format!("{d}/agent.db"))
        .replace("/run/stepwise/markers.sock", &format!("{d}/markers.sock"))
        .replace("/etc/stepwise-token/", &format!("{d}/token/"));
    let cfg_file = write(&dir, "agent.toml", &cfg)?;
    // The DaemonSet's env, expanded as the kubelet does with status.hostIP = 127.0.0.1, on a
    // free port instead of 9501.
    let port = stepwise_tests::harness::free_port();
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"].as_array().context("env")?;
    let listen = env.iter().find(|e| e["name"] == "STEPWISE_LISTEN").and_then(|e| e["value"].as_str()).context("STEPWISE_LISTEN")?;
    let listen = listen.replace("$(STEPWISE_HOST_IP)", "127.0.0.1").replace(":9501", &format!(":{port}"));
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(agent)
        .args(["run", "--config"])
        .arg(&cfg_file)
        .env("STEPWISE_LISTEN", &listen)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("agent.stderr"))?)
        .spawn()?;
    let result = (|| -> Result<()> {
        stepwise_tests::harness::wait_for(Duration::from_secs(30), "the agent's /readyz", || {
            stepwise_tests::harness::http_get(&addr, "/readyz").ok().filter(|r| r.status == 200)
        })?;
        let pod = t.yaml_docs(example)?.into_iter().next().context("example pod")?;
        let c = &pod["spec"]["containers"][0];
        let cmd: Vec<String> = c["command"].as_array().context("command")?.iter().filter_map(|v| v.as_str().map(String::from)).collect();
        let mount = c["volumeMounts"].as_array().and_then(|m| m.first()).and_then(|m| m["mountPath"].as_str()).context("token mount")?.to_string();
        let run = |token_dir: &str| -> Result<std::process::Output> {
            let mut p = Command::new(&cmd[0]);
            p.args(&cmd[1..]).env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
            let mut vars: Vec<(String, String)> = Vec::new();
            for e in c["env"].as_array().context("env")? {
                let name = e["name"].as_str().context("name")?.to_string();
                let value = match (e["value"].as_str(), e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
                    (Some(v), _) => {
                        let mut v = v.replace(&mount, token_dir).replace(":9477", &format!(":{port}"));
                        for (n, val) in &vars {
                            v = v.replace(&format!("$({n})"), val);
                        }
                        v
                    }
                    (None, Some("status.hostIP")) => "127.0.0.1".into(),
                    other => bail!("example env {name}: unexpected source {other:?}"),
                };
                vars.push((name, value));
            }
            Ok(p.envs(vars).output()?)
        };
        let ok = run(&format!("{d}/token"))?;
        if !ok.status.success() {
            bail!("the example's command failed against the agent: {}", String::from_utf8_lossy(&ok.stderr));
        }
        let m: Value = serde_json::from_str(&stepwise_tests::harness::http_get(&addr, "/api/v1/markers")?.body)?;
        let got: BTreeSet<(u64, String)> = m["markers"]
            .as_array()
            .map(|v| v.iter().filter(|m| m["rank"] == 0).filter_map(|m| Some((m["step"].as_u64()?, m["phase"].as_str()?.to_string()))).collect())
            .unwrap_or_default();
        let expect: BTreeSet<(u64, String)> = (1..=3).flat_map(|s| [(s, "begin".to_string()), (s, "end".to_string())]).collect();
        if got != expect {
            bail!("markers sent by the example pod's command: expected {expect:?}, the agent holds {got:?}");
        }
        write(&dir, "wrong/token", "not-the-token-at-all-0000\n")?;
        let bad = run(&format!("{d}/wrong"))?;
        let err = String::from_utf8_lossy(&bad.stderr);
        if bad.status.success() || !err.contains("401") {
            bail!("the example's command with a wrong token: expected HTTP 401, got {} {err}", bad.status);
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result.map_err(|e| anyhow::anyhow!("{e:#}\nagent stderr:\n{}", std::fs::read_to_string(dir.join("agent.stderr")).unwrap_or_default()))?;
    eprintln!(
        "markers route: the chart's agent.toml with markersOverTcp and STEPWISE_LISTEN=$(STEPWISE_HOST_IP):port; deploy/examples/job-markers-over-tcp.yaml's command sent 6 markers, all held; a wrong token gets 401"
    );
    Ok(())
}

/// kubernetes-validate (strict: unknown fields refused) of every render, for each Kubernetes
/// version (one run per version: the tool takes seconds to load its schemas). It has no
/// schema for the Prometheus Operator kinds; [`monitors`] checks those.
pub(super) fn validate(t: &Tools, work: &Path, renders: &[(&str, &String)]) -> Result<()> {
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
        if !out.status.success()
            || text.contains("ERROR")
            || unvalidated.iter().any(|l| !["kind ServiceMonitor", "kind PodMonitor", "kind PrometheusRule"].iter().any(|k| l.contains(k)))
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
pub(super) fn monitors(t: &Tools, work: &Path, name: &str, docs: &[Value]) -> Result<()> {
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
    want(
        pod["tolerations"].as_array().is_some_and(|v| v.iter().any(|t| t["operator"] == "Exists" && t.get("key").is_none() && t.get("effect").is_none())),
        "a toleration of every taint (operator: Exists, no key, no effect)",
    );
    want(pod["priorityClassName"] == "system-node-critical", "priorityClassName: system-node-critical");
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
    // A token_file (markersOverTcp) is the mounted Secret: a stand-in token for `agent check`.
    let token = write(work, "configmap-token", "stand-in-token-0123456789\n")?;
    let checked = toml.replace("\"/etc/stepwise-token/token\"", &format!("{:?}", token.display().to_string()));
    let file = write(work, "configmap-agent.toml", &checked)?;
    let out = Command::new(agent).args(["check", "--json", "--config"]).arg(&file).output()?;
    let report: Value = serde_json::from_slice(&out.stdout).with_context(|| format!("agent check --json: {}", String::from_utf8_lossy(&out.stderr)))?;
    if let Some(bad) = report["checks"].as_array().and_then(|v| v.iter().find(|c| c["name"] == "config")) {
        bail!("{name}: the agent refuses the ConfigMap's agent.toml: {}", bad["detail"]);
    }
    let original = write(work, "configmap-agent-original.toml", toml)?;
    let parsed = stdout(&run_ok(
        Command::new(&t.python).args(["-c", "import sys, tomllib, json; print(json.dumps(tomllib.load(open(sys.argv[1], 'rb'))))"]).arg(&original),
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
        ("api.token_file", s(&cfg["api"]["token_file"])),
    ] {
        if key == "api.token_file" && path.is_empty() {
            continue;
        }
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
