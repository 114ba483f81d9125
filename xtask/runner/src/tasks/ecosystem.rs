//! `cargo xtask test ecosystem`: what users meet outside the agent itself, checked by the real
//! tools they run — Grafana's schema types (`@grafana/schema`, tsc), kustomize (kubectl), helm,
//! `kubernetes-validate`, the Prometheus Operator CRD schemas, systemd-analyze — plus the
//! dashboards' queries on a real Prometheus and the least-privilege run
//! (tests/tests/dashboards.rs, tests/tests/capabilities.rs).
//!
//! Tools are installed into a cache (`$STEPWISE_CACHE_DIR`, else `~/.cache/stepwise`) at
//! pinned versions the first time, and reused after: a second run installs nothing.

mod chart;
mod dashboards;
mod deploy;
mod image;
mod readme;
mod release;
mod tools;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{bail, Context, Result};

use super::{cargo, root, sh};

/// Runs every check of the tier. `rust_tests`: also run the two integration tests (the
/// `integration` tier runs them when it is selected too).
pub fn run(agent: &Path, rust_tests: bool) -> Result<()> {
    let t = tools::ensure()?;
    let work = root().join("target/ecosystem");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    step("dashboards: regenerate and compare, type-check against @grafana/schema", || dashboards::check(&t, &work))?;
    step("deploy: kustomize + helm render, lint, kubernetes-validate, same objects, security context", || deploy::check(&t, &work, agent))?;
    step("chart: two releases side by side, overrides, kube-rbac-proxy, README from values.yaml", || chart::check(&t, &work))?;
    step("release: actionlint .github/workflows/release.yml, cargo xtask release --dry-run", || release::check(&t, &work))?;
    step("deploy: systemd unit", || deploy::systemd(agent, &work))?;
    step("deploy: container image", || image::check(&t, &work, agent))?;
    if rust_tests {
        step("dashboards on a real Prometheus; least privilege (cargo test --test dashboards --test capabilities)", || {
            sh(cargo()
                .args(["test", "-p", "stepwise-tests", "--test", "dashboards", "--test", "capabilities", "--", "--nocapture", "--test-threads=1"])
                .env("STEPWISE_AGENT_BIN", agent))
        })?;
    } else {
        eprintln!("(tests/tests/dashboards.rs and capabilities.rs run in the integration tier)");
    }
    Ok(())
}

/// The pinned helm, for `cargo xtask release`.
pub fn helm() -> Result<PathBuf> {
    Ok(tools::ensure()?.helm)
}

/// The pinned helm and the python3 with PyYAML, for the integration tier's test of the chart's
/// monitors under the Prometheus Operator (tests/tests/operator_labels.rs): `STEPWISE_HELM`,
/// `STEPWISE_PYTHON`.
pub fn test_env() -> Result<[(&'static str, PathBuf); 2]> {
    let t = tools::ensure()?;
    Ok([("STEPWISE_HELM", t.helm), ("STEPWISE_PYTHON", t.python)])
}

/// `cargo xtask chart-readme`.
pub fn chart_readme() -> Result<()> {
    readme::write(&tools::ensure()?)
}

fn step(what: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("\n--- {what}");
    let t = std::time::Instant::now();
    f().with_context(|| format!("ecosystem check failed: {what}"))?;
    eprintln!("--- ok ({:.1?})", t.elapsed());
    Ok(())
}

/// Runs a command and returns its output, failing with both streams when it exits non-zero.
pub fn run_ok(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    Ok(p)
}
