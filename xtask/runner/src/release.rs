//! `cargo xtask release [--dry-run] [--tag vX.Y.Z] [--registry REG] [--dist DIR]`: what
//! .github/workflows/release.yml runs on a tag push (issue 36 item 2).
//!
//! One version, the workspace's (`[workspace.package] version` in Cargo.toml): the chart's
//! `version` and `appVersion`, the kustomize base's image tag and the pushed tag must all be
//! it. Then into the dist directory: the chart packaged (`helm package`), a CycloneDX SBOM of
//! the crates in the agent and the NCCL profiler plugin (from `cargo metadata` and
//! Cargo.lock's checksums), and SHA256SUMS of every file there. Without `--dry-run` it also
//! builds and pushes the multi-arch image (docker buildx, linux/amd64 and linux/arm64), records
//! its digest, and pushes the chart as an OCI artifact; with it, those commands are printed
//! instead, and nothing needs credentials or the network.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::tasks::{root, sh};

pub const PLATFORMS: &str = "linux/amd64,linux/arm64";
const CHART: &str = "deploy/helm/stepwise";

pub struct Options {
    pub dry_run: bool,
    pub tag: Option<String>,
    pub registry: String,
    pub dist: PathBuf,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options { dry_run: false, tag: None, registry: "ghcr.io/stepwise".into(), dist: root().join("target/dist") };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--dry-run" => o.dry_run = true,
            "--tag" => o.tag = Some(val()?),
            "--registry" => o.registry = val()?,
            "--dist" => o.dist = PathBuf::from(val()?),
            _ => bail!("usage: cargo xtask release [--dry-run] [--tag vX.Y.Z] [--registry REG (default ghcr.io/stepwise)] [--dist DIR (default target/dist)]"),
        }
    }
    // On a tag push, the workflow's tag (GITHUB_REF_NAME) must be the version too.
    if o.tag.is_none() && std::env::var("GITHUB_REF_TYPE").as_deref() == Ok("tag") {
        o.tag = std::env::var("GITHUB_REF_NAME").ok();
    }
    Ok(o)
}

pub fn release(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let v = run(&o)?;
    eprintln!("release {v}: {} ({})", o.dist.display(), if o.dry_run { "dry run: nothing pushed" } else { "pushed" });
    Ok(())
}

/// Does the release; returns the version.
pub fn run(o: &Options) -> Result<String> {
    let cargo_toml = std::fs::read_to_string(root().join("Cargo.toml"))?;
    let v = workspace_version(&cargo_toml)?;
    let errs = version_mismatches(
        &v,
        &std::fs::read_to_string(root().join(CHART).join("Chart.yaml"))?,
        &std::fs::read_to_string(root().join("deploy/kubernetes/kustomization.yaml"))?,
        o.tag.as_deref(),
    );
    if !errs.is_empty() {
        bail!("versions disagree with the workspace's {v} (Cargo.toml [workspace.package]):\n  {}", errs.join("\n  "));
    }
    eprintln!(
        "version {v}: Cargo.toml, Chart.yaml version and appVersion, kustomization newTag{} agree",
        o.tag.as_ref().map(|t| format!(", tag {t}")).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&o.dist);
    std::fs::create_dir_all(&o.dist)?;
    let helm = helm()?;
    sh(Command::new(&helm).args(["lint", "--strict"]).arg(root().join(CHART)))?;
    sh(Command::new(&helm).arg("package").arg(root().join(CHART)).args(["--version", &v, "--app-version", &v, "--destination"]).arg(&o.dist))?;
    let tgz = o.dist.join(format!("stepwise-{v}.tgz"));
    if !tgz.is_file() {
        bail!("helm package did not write {}", tgz.display());
    }
    let sbom = sbom(&v)?;
    std::fs::write(o.dist.join(format!("stepwise-{v}.cdx.json")), serde_json::to_string_pretty(&sbom)? + "\n")?;
    let image = format!("{}/agent:{v}", o.registry);
    let build = image_command(&image, &o.dist);
    let push = [helm.display().to_string(), "push".into(), tgz.display().to_string(), format!("oci://{}/charts", o.registry)];
    if o.dry_run {
        eprintln!("dry run: would build and push the image, then push the chart:\n  {}\n  {}", build.join(" "), push.join(" "));
    } else {
        sh(Command::new(&build[0]).args(&build[1..]).current_dir(root()))?;
        let meta: Value = serde_json::from_str(&std::fs::read_to_string(o.dist.join("image-metadata.json"))?)?;
        let digest = meta["containerimage.digest"].as_str().context("no containerimage.digest in the buildx metadata")?;
        std::fs::write(o.dist.join("image-digest.txt"), format!("{image}@{digest}\n"))?;
        std::fs::remove_file(o.dist.join("image-metadata.json"))?;
        sh(Command::new(&push[0]).args(&push[1..]))?;
        eprintln!("image {image}@{digest} (pin it: --set image.digest={digest})");
    }
    checksums(&o.dist)?;
    Ok(v)
}

/// The buildx command of the multi-arch image, one manifest list for both platforms.
pub fn image_command(image: &str, dist: &Path) -> Vec<String> {
    ["docker", "buildx", "build", "--platform", PLATFORMS, "--file", "deploy/Dockerfile", "--tag", image, "--push", "--metadata-file"]
        .iter()
        .map(|s| s.to_string())
        .chain([dist.join("image-metadata.json").display().to_string(), ".".into()])
        .collect()
}

/// helm: $HELM, else on PATH, else the ecosystem tier's pinned copy (installed if needed).
fn helm() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("HELM") {
        return Ok(PathBuf::from(h));
    }
    if let Some(h) = std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join("helm")).find(|f| f.is_file())) {
        return Ok(h);
    }
    crate::tasks::ecosystem_helm()
}

/// `[workspace.package] version` of the root Cargo.toml.
pub fn workspace_version(cargo_toml: &str) -> Result<String> {
    let section = cargo_toml.split("\n[workspace.package]\n").nth(1).context("Cargo.toml has no [workspace.package]")?;
    let section = section.split("\n[").next().unwrap_or(section);
    let v = section.lines().find_map(|l| l.strip_prefix("version = ")).context("[workspace.package] has no version")?;
    Ok(v.trim().trim_matches('"').to_string())
}

/// Every place that must carry the workspace version `v` and does not.
pub fn version_mismatches(v: &str, chart_yaml: &str, kustomization: &str, tag: Option<&str>) -> Vec<String> {
    let field = |text: &str, key: &str| -> Option<String> { text.lines().find_map(|l| l.strip_prefix(key)).map(|s| s.trim().trim_matches('"').to_string()) };
    let mut errs = Vec::new();
    for (what, got) in [
        ("Chart.yaml version", field(chart_yaml, "version:")),
        ("Chart.yaml appVersion", field(chart_yaml, "appVersion:")),
        ("deploy/kubernetes/kustomization.yaml newTag", field(kustomization, "    newTag:")),
    ] {
        if got.as_deref() != Some(v) {
            errs.push(format!("{what} is {got:?}"));
        }
    }
    if let Some(t) = tag {
        if t != format!("v{v}") {
            errs.push(format!("the tag is {t:?}, expected \"v{v}\""));
        }
    }
    errs
}

/// sha256 of every crate file in Cargo.lock, by (name, version).
fn lock_checksums() -> Result<BTreeMap<(String, String), String>> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock"))?;
    let mut out = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let get = |k: &str| block.lines().find_map(|l| l.strip_prefix(&format!("{k} = "))).map(|s| s.trim_matches('"').to_string());
        if let (Some(n), Some(v), Some(c)) = (get("name"), get("version"), get("checksum")) {
            out.insert((n, v), c);
        }
    }
    Ok(out)
}

/// CycloneDX 1.5 JSON of the packages the agent and the NCCL profiler plugin link (normal
/// dependencies, every target platform, features as `cargo build -p` resolves them), with their licences, purls, crate checksums and
/// dependency graph. Deterministic: the serial number derives from Cargo.lock, the timestamp
/// is the commit's.
pub fn sbom(version: &str) -> Result<Value> {
    let out = crate::tasks::cargo().args(["metadata", "--format-version", "1", "--locked"]).output()?;
    if !out.status.success() {
        bail!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: Value = serde_json::from_slice(&out.stdout)?;
    let pkgs: BTreeMap<&str, &Value> = meta["packages"].as_array().context("packages")?.iter().filter_map(|p| Some((p["id"].as_str()?, p))).collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"].as_array().context("resolve")?.iter().filter_map(|n| Some((n["id"].as_str()?, n))).collect();
    let normal = |n: &Value| -> Vec<String> {
        n["deps"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|d| d["dep_kinds"].as_array().is_some_and(|k| k.iter().any(|k| k["kind"].is_null())))
                    .filter_map(|d| d["pkg"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let roots: Vec<String> = pkgs
        .values()
        .filter(|p| matches!(p["name"].as_str(), Some("agent" | "nccl-profiler")) && p["source"].is_null())
        .filter_map(|p| p["id"].as_str().map(String::from))
        .collect();
    if roots.len() != 2 {
        bail!("cargo metadata: expected the workspace packages agent and nccl-profiler, found {roots:?}");
    }
    let (mut seen, mut todo): (BTreeSet<String>, Vec<String>) = (BTreeSet::new(), roots.clone());
    while let Some(id) = todo.pop() {
        if seen.insert(id.clone()) {
            todo.extend(nodes.get(id.as_str()).map(|n| normal(n)).unwrap_or_default());
        }
    }
    let built = built_crates()?;
    seen.retain(|id| {
        pkgs.get(id.as_str()).is_some_and(|p| built.contains(&format!("{} v{}", p["name"].as_str().unwrap_or(""), p["version"].as_str().unwrap_or(""))))
    });
    let normal = |n: &Value| -> Vec<String> { normal(n).into_iter().filter(|d| seen.contains(d)).collect() };
    let sums = lock_checksums()?;
    let mut components = Vec::new();
    let mut deps = Vec::new();
    for id in &seen {
        let p = pkgs.get(id.as_str()).with_context(|| format!("no package {id}"))?;
        let (name, ver) = (p["name"].as_str().unwrap_or(""), p["version"].as_str().unwrap_or(""));
        let mut c = json!({"type": if roots.contains(id) { "application" } else { "library" }, "bom-ref": id, "name": name, "version": ver, "purl": format!("pkg:cargo/{name}@{ver}")});
        if let Some(l) = p["license"].as_str() {
            c["licenses"] = json!([{"expression": l}]);
        }
        if let Some(h) = sums.get(&(name.to_string(), ver.to_string())) {
            c["hashes"] = json!([{"alg": "SHA-256", "content": h}]);
        }
        components.push(c);
        deps.push(json!({"ref": id, "dependsOn": nodes.get(id.as_str()).map(|n| normal(n)).unwrap_or_default()}));
    }
    let lock_hash = sha256_hex(&root().join("Cargo.lock"))?;
    let serial = format!("urn:uuid:{}-{}-4{}-8{}-{}", &lock_hash[0..8], &lock_hash[8..12], &lock_hash[13..16], &lock_hash[17..20], &lock_hash[20..32]);
    let time = Command::new("git")
        .args(["log", "-1", "--format=%cI"])
        .current_dir(root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": serial,
        "version": 1,
        "metadata": {
            "timestamp": if time.is_empty() { "1970-01-01T00:00:00Z".to_string() } else { time },
            "tools": {"components": [{"type": "application", "name": "cargo xtask release", "version": version}]},
            "component": {"type": "application", "bom-ref": "stepwise", "name": "stepwise", "version": version, "purl": format!("pkg:oci/agent@{version}?repository_url=ghcr.io/stepwise/agent")}
        },
        "components": components,
        "dependencies": deps,
    }))
}

/// "name vX.Y.Z" of every crate in the shipped binaries. `cargo metadata` resolves features
/// for the whole workspace at once (tests and xtask turn on features that pull in more
/// crates); `cargo tree -p` resolves them as `cargo build -p` does.
fn built_crates() -> Result<BTreeSet<String>> {
    let tree = crate::tasks::cargo()
        .args(["tree", "--locked", "-p", "agent", "-p", "nccl-profiler", "-e", "normal", "--target", "all", "--prefix", "none", "--format", "{p}"])
        .output()?;
    if !tree.status.success() {
        bail!("cargo tree: {}", String::from_utf8_lossy(&tree.stderr));
    }
    Ok(String::from_utf8_lossy(&tree.stdout).lines().filter_map(|l| l.split(" (").next()).map(|l| l.trim().to_string()).collect())
}

fn sha256_hex(file: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(file).output().context("sha256sum (coreutils)")?;
    if !out.status.success() {
        bail!("sha256sum {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string())
}

/// SHA256SUMS (the `sha256sum -c` format) of every other file in `dist`.
fn checksums(dist: &Path) -> Result<()> {
    let mut files: Vec<String> = std::fs::read_dir(dist)?.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n != "SHA256SUMS").collect();
    files.sort();
    let mut text = String::new();
    for f in &files {
        text.push_str(&format!("{}  {f}\n", sha256_hex(&dist.join(f))?));
    }
    std::fs::write(dist.join("SHA256SUMS"), &text)?;
    eprint!("SHA256SUMS:\n{text}");
    Ok(())
}
