//! The chart's conventions (issue 36 item 3), as template tests: real `helm template` renders,
//! parsed and asserted on (the helm-unittest plugin is on GitHub releases only, which this
//! project's machines cannot reach). Two releases side by side in one namespace collide in no
//! object and select disjoint objects; nameOverride, fullnameOverride, namespaceOverride, the
//! image digest and global registry, serviceAccount, extra* and updateStrategy render as
//! values.yaml documents them; the kube-rbac-proxy option; every render is validated by
//! kubernetes-validate and the Prometheus Operator CRD schemas.

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{deploy, run_ok, stdout, tools::Tools};
use crate::tasks::root;

const MON: &[&str] = &["--api-versions", "monitoring.coreos.com/v1"];
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn chart() -> std::path::PathBuf {
    root().join("deploy/helm/stepwise")
}

/// `helm template <release> -n <ns> <args>`: the YAML text.
fn template(t: &Tools, release: &str, ns: &str, args: &[&str]) -> Result<String> {
    Ok(stdout(&run_ok(Command::new(&t.helm).args(["template", release]).arg(chart()).args(["--namespace", ns]).args(args))?))
}

/// A render that must be refused, naming `expect`.
fn refused(t: &Tools, what: &str, args: &[&str], expect: &str) -> Result<()> {
    let out = Command::new(&t.helm).args(["template", "r"]).arg(chart()).args(args).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !err.contains(expect) {
        bail!("helm template {what}: expected a refusal naming {expect:?}, got {} {err}", out.status);
    }
    Ok(())
}

pub fn check(t: &Tools, work: &Path) -> Result<()> {
    let mut renders: Vec<(String, String)> = Vec::new();
    side_by_side(t, &mut renders)?;
    overrides(t, &mut renders)?;
    proxy(t, &mut renders)?;
    let refs: Vec<(&str, &String)> = renders.iter().map(|(n, y)| (n.as_str(), y)).collect();
    deploy::validate(t, work, &refs)?;
    for (name, yaml) in &renders {
        let docs = t.yaml_docs(yaml)?;
        if docs.iter().any(|d| d["apiVersion"] == "monitoring.coreos.com/v1") {
            deploy::monitors(t, work, name, &docs)?;
        }
        if let Some(pdb) = docs.iter().find(|d| d["kind"] == "PodDisruptionBudget") {
            bail!("{name}: renders a PodDisruptionBudget ({}); the DaemonSet's updateStrategy paces it", pdb["metadata"]["name"]);
        }
    }
    super::readme::check(t)
}

/// kind/namespace/name of an object (namespace empty for cluster-scoped kinds).
fn key(d: &Value) -> String {
    format!("{}/{}/{}", d["kind"].as_str().unwrap_or("?"), d["metadata"]["namespace"].as_str().unwrap_or(""), d["metadata"]["name"].as_str().unwrap_or("?"))
}

/// Does `selector` (matchLabels) select an object labelled `labels`? An empty selector
/// selects nothing here (the chart never renders one; treating it as "all" would hide that).
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object().filter(|s| !s.is_empty()) else { return false };
    sel.iter().all(|(k, v)| &labels[k] == v)
}

/// Each selector of a release and what it must select: (what, selector, the kind selected).
fn selectors(docs: &[Value]) -> Vec<(String, Value, &'static str)> {
    let mut out = Vec::new();
    for d in docs {
        let (sel, target) = match d["kind"].as_str().unwrap_or("") {
            "DaemonSet" => (&d["spec"]["selector"]["matchLabels"], "Pod"),
            "Service" => (&d["spec"]["selector"], "Pod"),
            "NetworkPolicy" => (&d["spec"]["podSelector"]["matchLabels"], "Pod"),
            "ServiceMonitor" => (&d["spec"]["selector"]["matchLabels"], "Service"),
            "PodMonitor" => (&d["spec"]["selector"]["matchLabels"], "Pod"),
            _ => continue,
        };
        out.push((key(d), sel.clone(), target));
    }
    out
}

/// The labels of what selectors select: the pod template's, and the Services'.
fn targets(docs: &[Value], kind: &str) -> Vec<Value> {
    match kind {
        "Pod" => docs.iter().filter(|d| d["kind"] == "DaemonSet").map(|d| d["spec"]["template"]["metadata"]["labels"].clone()).collect(),
        _ => docs.iter().filter(|d| d["kind"] == kind).map(|d| d["metadata"]["labels"].clone()).collect(),
    }
}

/// Two releases' objects: no kind/namespace/name twice, every selector selects its own
/// release's objects and none of the other's, each ClusterRoleBinding binds its own account.
fn disjoint(a: &[Value], b: &[Value]) -> Result<()> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for d in a.iter().chain(b) {
        *seen.entry(key(d)).or_default() += 1;
    }
    let twice: Vec<&String> = seen.iter().filter(|(_, n)| **n > 1).map(|(k, _)| k).collect();
    if !twice.is_empty() {
        bail!("objects rendered by both releases: {twice:?}");
    }
    for (own, other) in [(a, b), (b, a)] {
        for (what, sel, kind) in selectors(own) {
            if !targets(own, kind).iter().any(|l| selects(&sel, l)) {
                bail!("{what}: selector {sel} selects no {kind} of its own release");
            }
            if let Some(l) = targets(other, kind).iter().find(|l| selects(&sel, l)) {
                bail!("{what}: selector {sel} also selects the other release's {kind} labelled {l}");
            }
        }
        let sa = own.iter().find(|d| d["kind"] == "DaemonSet").map(|d| d["spec"]["template"]["spec"]["serviceAccountName"].clone()).unwrap_or_default();
        for crb in own.iter().filter(|d| d["kind"] == "ClusterRoleBinding") {
            if crb["subjects"][0]["name"] != sa {
                bail!("{}: binds {}, not the release's account {sa}", key(crb), crb["subjects"][0]);
            }
        }
    }
    Ok(())
}

/// Releases "a" and "b" in one namespace, with defaults and with every optional object
/// (NetworkPolicy, kube-rbac-proxy's ClusterRole and binding; PodMonitor): disjoint. Negative
/// controls: the same fullnameOverride for both, and selectors without the instance label,
/// are caught.
fn side_by_side(t: &Tools, renders: &mut Vec<(String, String)>) -> Result<()> {
    let sets: [(&str, Vec<&str>); 3] = [
        ("defaults", MON.to_vec()),
        ("networkPolicy, kubeRBACProxy", [MON, &["--set", "networkPolicy.enabled=true", "--set", "kubeRBACProxy.enabled=true"]].concat()),
        ("podMonitor", [MON, &["--set", "serviceMonitor.enabled=false", "--set", "podMonitor.enabled=true"]].concat()),
    ];
    for (what, args) in &sets {
        let (ya, yb) = (template(t, "a", "shared", args)?, template(t, "b", "shared", args)?);
        let (a, b) = (t.yaml_docs(&ya)?, t.yaml_docs(&yb)?);
        disjoint(&a, &b).with_context(|| format!("releases a and b in namespace shared ({what})"))?;
        eprintln!("releases a and b side by side ({what}): {} + {} objects, no name twice, disjoint selectors", a.len(), b.len());
        renders.push((format!("release a ({what})"), ya));
        renders.push((format!("release b ({what})"), yb));
    }
    let same = [MON, &["--set", "fullnameOverride=stepwise-same"]].concat();
    if disjoint(&t.yaml_docs(&template(t, "a", "shared", &same)?)?, &t.yaml_docs(&template(t, "b", "shared", &same)?)?).is_ok() {
        bail!("negative control: two releases with one fullnameOverride passed the collision check");
    }
    let strip = |mut docs: Vec<Value>| -> Vec<Value> {
        for d in docs.iter_mut().filter(|d| d["kind"] == "DaemonSet") {
            if let Some(m) = d["spec"]["selector"]["matchLabels"].as_object_mut() {
                m.remove("app.kubernetes.io/instance");
            }
        }
        docs
    };
    let (a, b) = (strip(t.yaml_docs(&template(t, "a", "shared", MON)?)?), strip(t.yaml_docs(&template(t, "b", "shared", MON)?)?));
    if disjoint(&a, &b).is_ok() {
        bail!("negative control: DaemonSet selectors without app.kubernetes.io/instance passed the disjointness check");
    }
    eprintln!("negative controls caught: one fullnameOverride for two releases (names collide), selectors without the instance label (overlap)");
    Ok(())
}

/// Collects failed expectations and reports them all at once.
#[derive(Default)]
struct Want(Vec<String>);

impl Want {
    fn that(&mut self, ok: bool, what: String) {
        if !ok {
            self.0.push(what);
        }
    }
    fn done(self, what: &str) -> Result<()> {
        if !self.0.is_empty() {
            bail!("{what}:\n  {}", self.0.join("\n  "));
        }
        Ok(())
    }
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter().find(|d| d["kind"] == kind && !d["metadata"]["name"].as_str().unwrap_or("").ends_with("-dashboards")).with_context(|| format!("no {kind}"))
}

fn names(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|x| x["name"].as_str().map(String::from)).collect()).unwrap_or_default()
}

/// nameOverride, fullnameOverride, namespaceOverride, the image's digest, tag and global
/// registry, serviceAccount, extra*, updateStrategy: rendered as documented; the schema
/// refuses a malformed digest and a fullnameOverride that is not a DNS label.
fn overrides(t: &Tools, renders: &mut Vec<(String, String)>) -> Result<()> {
    let mut w = Want::default();
    let y = template(t, "x", "stepwise", &[MON, &["--set", "nameOverride=gpu-agent"]].concat())?;
    let docs = t.yaml_docs(&y)?;
    for d in &docs {
        let n = d["metadata"]["name"].as_str().unwrap_or("");
        w.that(n.starts_with("x-gpu-agent"), format!("nameOverride=gpu-agent, release x: {} is not named x-gpu-agent…", key(d)));
        w.that(d["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-agent", format!("nameOverride: {} labels {}", key(d), d["metadata"]["labels"]));
    }
    renders.push(("nameOverride=gpu-agent".into(), y));

    let y = template(
        t,
        "x",
        "stepwise",
        &[MON, &["--set", "fullnameOverride=custom", "--set", "namespaceOverride=other", "--set", "kubeRBACProxy.enabled=true"]].concat(),
    )?;
    let docs = t.yaml_docs(&y)?;
    for d in &docs {
        let (n, ns) = (d["metadata"]["name"].as_str().unwrap_or(""), d["metadata"]["namespace"].as_str());
        let cluster = matches!(d["kind"].as_str(), Some("ClusterRole" | "ClusterRoleBinding"));
        w.that(n == "custom" || n == "custom-dashboards" || (cluster && n == "other-custom"), format!("fullnameOverride=custom: {}", key(d)));
        w.that(if cluster { ns.is_none() } else { ns == Some("other") }, format!("namespaceOverride=other (release namespace stepwise): {}", key(d)));
    }
    let sm = find(&docs, "ServiceMonitor")?;
    w.that(
        sm["spec"]["namespaceSelector"]["matchNames"] == serde_json::json!(["other"]),
        format!("namespaceOverride: ServiceMonitor namespaceSelector {}", sm["spec"]["namespaceSelector"]),
    );
    let crb = find(&docs, "ClusterRoleBinding")?;
    w.that(
        crb["subjects"][0]["namespace"] == "other" && crb["subjects"][0]["name"] == "custom",
        format!("namespaceOverride: ClusterRoleBinding subject {}", crb["subjects"]),
    );
    renders.push(("fullnameOverride, namespaceOverride, kubeRBACProxy".into(), y));

    let image = |args: &[&str]| -> Result<(Vec<String>, String)> {
        let y = template(t, "x", "stepwise", args)?;
        let docs = t.yaml_docs(&y)?;
        let pod = &find(&docs, "DaemonSet")?["spec"]["template"]["spec"];
        let imgs = pod["containers"].as_array().map(|v| v.iter().filter_map(|c| c["image"].as_str().map(String::from)).collect()).unwrap_or_default();
        Ok((imgs, y))
    };
    let (imgs, y) =
        image(&["--set", &format!("image.digest={DIGEST}"), "--set", "global.imageRegistry=mirror.example.com", "--set", "kubeRBACProxy.enabled=true"])?;
    let want = vec![format!("mirror.example.com/stepwise/agent:0.1.0@{DIGEST}"), "mirror.example.com/brancz/kube-rbac-proxy:v0.20.2".to_string()];
    w.that(imgs == want, format!("image.digest + global.imageRegistry: images {imgs:?}, expected {want:?}"));
    renders.push(("image.digest, global.imageRegistry".into(), y));
    let (imgs, _) = image(&["--set", "image.tag=1.2.3", "--set", "image.registry=registry.example.com:5000"])?;
    w.that(imgs == ["registry.example.com:5000/stepwise/agent:1.2.3"], format!("image.tag + image.registry: {imgs:?}"));
    let (imgs, _) = image(&[])?;
    w.that(imgs == ["ghcr.io/stepwise/agent:0.1.0"], format!("defaults: image {imgs:?} (the chart's appVersion)"));

    service_account(t, &mut w, renders)?;
    extras(t, &mut w, renders)?;
    w.done("chart overrides do not render as documented")?;
    refused(t, "image.digest=latest", &["--set", "image.digest=latest"], "digest")?;
    refused(t, "fullnameOverride=Bad_Name", &["--set", "fullnameOverride=Bad_Name"], "fullnameOverride")?;
    refused(t, "maxUnavailable (moved to updateStrategy)", &["--set", "maxUnavailable=1"], "maxUnavailable")?;
    eprintln!("chart overrides: nameOverride, fullnameOverride, namespaceOverride, image digest/tag/registry and global.imageRegistry, serviceAccount, extra*, updateStrategy as documented; a bad digest, name or old key refused");
    Ok(())
}

/// serviceAccount.create=false (no ServiceAccount; the pods run as "default" or `name`),
/// a custom name and annotations.
fn service_account(t: &Tools, w: &mut Want, renders: &mut Vec<(String, String)>) -> Result<()> {
    let sa_of = |docs: &[Value]| -> Result<Value> { Ok(find(docs, "DaemonSet")?["spec"]["template"]["spec"]["serviceAccountName"].clone()) };
    let y = template(t, "x", "stepwise", &["--set", "serviceAccount.create=false"])?;
    let docs = t.yaml_docs(&y)?;
    w.that(!docs.iter().any(|d| d["kind"] == "ServiceAccount"), "serviceAccount.create=false: a ServiceAccount is rendered".into());
    w.that(sa_of(&docs)? == "default", format!("serviceAccount.create=false: pods run as {}", sa_of(&docs)?));
    renders.push(("serviceAccount.create=false".into(), y));
    let docs = t.yaml_docs(&template(t, "x", "stepwise", &["--set", "serviceAccount.create=false", "--set", "serviceAccount.name=existing"])?)?;
    w.that(sa_of(&docs)? == "existing", format!("serviceAccount.create=false, name=existing: pods run as {}", sa_of(&docs)?));
    let y = template(t, "x", "stepwise", &["--set", "serviceAccount.name=mine", "--set", "serviceAccount.annotations.example\\.com/owner=ml"])?;
    let docs = t.yaml_docs(&y)?;
    let sa = find(&docs, "ServiceAccount")?;
    w.that(
        sa["metadata"]["name"] == "mine" && sa["metadata"]["annotations"]["example.com/owner"] == "ml" && sa_of(&docs)? == "mine",
        format!("serviceAccount.name=mine with annotations: {} / pods as {}", sa["metadata"], sa_of(&docs)?),
    );
    renders.push(("serviceAccount.name, annotations".into(), y));
    Ok(())
}

/// extraArgs after the agent's own, extraVolumes and extraVolumeMounts added to the chart's,
/// extraEnv, and updateStrategy.
fn extras(t: &Tools, w: &mut Want, renders: &mut Vec<(String, String)>) -> Result<()> {
    let y = template(
        t,
        "x",
        "stepwise",
        &[
            "--set",
            "extraArgs={--interval,500ms}",
            "--set",
            "extraVolumes[0].name=nccl-topo",
            "--set",
            "extraVolumes[0].configMap.name=nccl-topology",
            "--set",
            "extraVolumeMounts[0].name=nccl-topo",
            "--set",
            "extraVolumeMounts[0].mountPath=/etc/nccl",
            "--set",
            "extraVolumeMounts[0].readOnly=true",
            "--set",
            "extraEnv[0].name=STEPWISE_LOG",
            "--set",
            "extraEnv[0].value=debug",
            "--set",
            "updateStrategy.rollingUpdate.maxUnavailable=1",
        ],
    )?;
    let docs = t.yaml_docs(&y)?;
    let ds = find(&docs, "DaemonSet")?;
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    w.that(c["args"] == serde_json::json!(["run", "--config", "/etc/stepwise/agent.toml", "--interval", "500ms"]), format!("extraArgs: args {}", c["args"]));
    let vols = names(&pod["volumes"]);
    w.that(vols.len() == 9 && vols.last().map(String::as_str) == Some("nccl-topo"), format!("extraVolumes after the chart's 8: {vols:?}"));
    let m = c["volumeMounts"].as_array().and_then(|v| v.last()).cloned().unwrap_or_default();
    w.that(m["name"] == "nccl-topo" && m["mountPath"] == "/etc/nccl" && m["readOnly"] == true, format!("extraVolumeMounts: last mount {m}"));
    w.that(c["env"][0]["name"] == "STEPWISE_LOG" && c["env"][0]["value"] == "debug", format!("extraEnv: {}", c["env"]));
    w.that(
        ds["spec"]["updateStrategy"] == serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}),
        format!("updateStrategy: {}", ds["spec"]["updateStrategy"]),
    );
    renders.push(("extraArgs, extraVolumes, extraVolumeMounts, extraEnv, updateStrategy".into(), y));
    Ok(())
}

/// kubeRBACProxy: the agent on the loopback behind the proxy's TLS port, the token only in
/// the proxy's container, probes through the proxy's ignored paths, HTTPS scrapes with
/// Prometheus's token, the proxy's RBAC; refused with markersOverTcp, a PodMonitor or one port.
fn proxy(t: &Tools, renders: &mut Vec<(String, String)>) -> Result<()> {
    let y = template(
        t,
        "x",
        "stepwise",
        &[MON, &["--set", "kubeRBACProxy.enabled=true", "--set", "listenAddress=hostIP", "--set", "kubeRBACProxy.tls.secretName=agent-tls"]].concat(),
    )?;
    let docs = t.yaml_docs(&y)?;
    let mut w = Want::default();
    let pod = &find(&docs, "DaemonSet")?["spec"]["template"]["spec"];
    let (agent, proxy) = (&pod["containers"][0], &pod["containers"][1]);
    let toml = find(&docs, "ConfigMap")?["data"]["agent.toml"].as_str().unwrap_or("").to_string();
    w.that(toml.contains("listen = \"127.0.0.1:9478\""), "the agent listens on 127.0.0.1:9478 (upstreamPort)".into());
    w.that(
        agent.get("ports").is_none() && agent.get("env").is_none(),
        format!("the agent container has no port and no STEPWISE_LISTEN: {} {}", agent["ports"], agent["env"]),
    );
    let args: Vec<&str> = proxy["args"].as_array().map(|v| v.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    for a in [
        "--secure-listen-address=$(STEPWISE_HOST_IP):9477",
        "--upstream=http://127.0.0.1:9478/",
        "--ignore-paths=/healthz,/readyz",
        "--tls-cert-file=/etc/kube-rbac-proxy-tls/tls.crt",
    ] {
        w.that(args.contains(&a), format!("kube-rbac-proxy args {args:?} lack {a}"));
    }
    w.that(proxy["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP", "listenAddress=hostIP: the proxy's STEPWISE_HOST_IP".into());
    w.that(proxy["ports"][0]["name"] == "https" && proxy["ports"][0]["containerPort"] == 9477, format!("proxy port https 9477: {}", proxy["ports"]));
    let token = |c: &Value| c["volumeMounts"].as_array().is_some_and(|v| v.iter().any(|m| m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"));
    w.that(token(proxy) && !token(agent) && pod["automountServiceAccountToken"] == false, "the token mounted in the proxy's container only".into());
    let psc = &proxy["securityContext"];
    w.that(
        psc["runAsNonRoot"] == true && psc["capabilities"]["drop"] == serde_json::json!(["ALL"]) && psc["capabilities"].get("add").is_none(),
        format!("proxy securityContext {psc}"),
    );
    for p in ["livenessProbe", "readinessProbe"] {
        let g = &agent[p]["httpGet"];
        w.that(g["port"] == 9477 && g["scheme"] == "HTTPS", format!("{p} through the proxy: {g}"));
    }
    let svc = find(&docs, "Service")?;
    w.that(svc["spec"]["ports"][0]["targetPort"] == "https", format!("Service targetPort {}", svc["spec"]["ports"][0]));
    let ep = &find(&docs, "ServiceMonitor")?["spec"]["endpoints"][0];
    w.that(
        ep["port"] == "https"
            && ep["scheme"] == "https"
            && ep["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
            && ep["tlsConfig"]["insecureSkipVerify"] == true,
        format!("ServiceMonitor endpoint: {ep}"),
    );
    let verbs: Vec<String> = find(&docs, "ClusterRole")?["rules"]
        .as_array()
        .map(|v| v.iter().map(|r| format!("{}/{}", r["resources"][0], r["verbs"][0])).collect())
        .unwrap_or_default();
    w.that(verbs == ["\"tokenreviews\"/\"create\"", "\"subjectaccessreviews\"/\"create\""], format!("ClusterRole rules {verbs:?}"));
    let off = t.yaml_docs(&template(t, "x", "stepwise", &[MON, &["--set", "kubeRBACProxy.enabled=true", "--set", "rbac.create=false"]].concat())?)?;
    w.that(!off.iter().any(|d| d["kind"] == "ClusterRole"), "rbac.create=false: a ClusterRole is rendered".into());
    w.done("kubeRBACProxy")?;
    renders.push(("kubeRBACProxy, hostIP, TLS Secret".into(), y));
    refused(
        t,
        "kubeRBACProxy + markersOverTcp",
        &["--set", "kubeRBACProxy.enabled=true", "--set", "markersOverTcp.enabled=true"],
        "markersOverTcp cannot be used with kubeRBACProxy",
    )?;
    refused(
        t,
        "kubeRBACProxy + podMonitor",
        &["--set", "kubeRBACProxy.enabled=true", "--set", "podMonitor.enabled=true"],
        "use the ServiceMonitor with kubeRBACProxy",
    )?;
    refused(
        t,
        "kubeRBACProxy.upstreamPort=port",
        &["--set", "kubeRBACProxy.enabled=true", "--set", "kubeRBACProxy.upstreamPort=9477"],
        "upstreamPort must differ",
    )?;
    eprintln!("kubeRBACProxy: agent on 127.0.0.1:9478, proxy TLS on 9477 (hostIP), token in the proxy only, probes via ignored paths, HTTPS ServiceMonitor, ClusterRole; 3 bad combinations refused");
    Ok(())
}
