//! deploy/Dockerfile: built when an image builder is available. Without one (this machine has
//! the docker CLI but no daemon, and no podman/buildah) the image's contents are tested
//! instead: the recipe's shape, the binary's shared libraries against what the runtime base
//! provides, and the binary run the way the image runs it in the DaemonSet — ENTRYPOINT + CMD
//! with the ConfigMap's agent.toml, an empty environment, uid 0 with exactly the DaemonSet's
//! capabilities, a read-only root filesystem and writable state, marker and /tmp directories.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{bail, Context, Result};

use super::{deploy::CAPS, run_ok, stdout, tools::Tools, write};
use crate::tasks::{cargo, root, sh};

/// What `gcr.io/distroless/cc-debian12` provides besides the dynamic loader: glibc and libgcc.
const RUNTIME_LIBS: &[&str] = &["libc.so.6", "libm.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2"];

fn builder_status() -> (Option<String>, Vec<String>) {
    let mut why = Vec::new();
    for (tool, probe) in [("docker", &["info"][..]), ("podman", &["info"][..]), ("buildah", &["version"][..])] {
        match Command::new(tool).args(probe).output() {
            Ok(o) if o.status.success() => return (Some(tool.to_string()), why),
            Ok(o) => why.push(format!("{tool}: {}", String::from_utf8_lossy(&o.stderr).lines().rfind(|l| !l.trim().is_empty()).unwrap_or("fails").trim())),
            Err(_) => why.push(format!("{tool}: not installed")),
        }
    }
    (None, why)
}

pub fn check(t: &Tools, work: &Path, agent: &Path) -> Result<()> {
    let recipe = std::fs::read_to_string(root().join("deploy/Dockerfile"))?;
    shape(&recipe)?;
    match builder_status() {
        (Some(tool), _) => {
            eprintln!("image builder found ({tool}): building deploy/Dockerfile");
            run_ok(Command::new(&tool).args(["build", "-f", "deploy/Dockerfile", "-t", "stepwise-agent:ecosystem-test", "."]).current_dir(root()))?;
            let out = run_ok(Command::new(&tool).args(["run", "--rm", "stepwise-agent:ecosystem-test", "run", "--print-default-config"]))?;
            if !stdout(&out).contains("[collectives]") {
                bail!("the image's agent did not print its default config");
            }
        }
        (None, why) => {
            eprintln!("no image builder here ({}): deploy/Dockerfile is not built; testing the image's contents with the same binary instead", why.join("; "))
        }
    }
    libraries(agent)?;
    run_like_the_pod(t, work, agent)
}

/// The recipe: multi-stage, the project's toolchain, the binary and the NCCL profiler plugin
/// into a glibc base, uid 0.
fn shape(recipe: &str) -> Result<()> {
    let froms: Vec<&str> = recipe.lines().filter(|l| l.starts_with("FROM ")).collect();
    let rust = stdout(&run_ok(Command::new("rustc").arg("--version"))?);
    let minor = rust.split_whitespace().nth(1).and_then(|v| v.rsplit_once('.')).map(|(mm, _)| mm.to_string()).unwrap_or_default();
    let setup = std::fs::read_to_string(root().join("xtask/setup.sh"))?;
    let linker = setup.split("bpf-linker@").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or("?").to_string();
    let copies: Vec<&str> = recipe.lines().filter(|l| l.starts_with("COPY --from=")).collect();
    let mut errs = Vec::new();
    if froms.len() != 2 || !froms[0].contains(" AS build") {
        errs.push(format!("two stages, the first `AS build`: {froms:?}"));
    }
    if !recipe.contains(&format!("ARG RUST_VERSION={minor}")) {
        errs.push(format!("the build stage's Rust must be this project's stable {minor}"));
    }
    if !recipe.contains(&format!("bpf-linker@{linker}")) || !recipe.contains("rust-src") {
        errs.push(format!("the build stage needs nightly rust-src and bpf-linker@{linker}, as xtask/setup.sh installs"));
    }
    // Multi-arch: the build stage runs natively and cross-compiles with the toolchain the
    // aarch64 tier tests (xtask/runner/src/cross.rs).
    let cross = crate::cross::TARGET;
    if !froms.first().is_some_and(|f| f.contains("--platform=$BUILDPLATFORM")) || !recipe.contains(cross) || !recipe.contains("gcc-aarch64-linux-gnu") {
        errs.push(format!("the build stage runs on $BUILDPLATFORM and cross-builds {cross} with gcc-aarch64-linux-gnu"));
    }
    if froms.get(1).is_none_or(|f| !f.contains("distroless/cc")) {
        errs.push("the runtime stage is a glibc-only base (distroless/cc)".into());
    }
    // The binary, and the NCCL profiler plugin where the agent looks for the one it ships
    // (`<binary's prefix>/lib/stepwise/`, `sources::collectives::profiler::bundled_plugin`).
    let wanted = [" /usr/local/bin/agent", " /usr/local/lib/stepwise/libnccl-profiler-stepwise.so"];
    if copies.len() != wanted.len() || !wanted.iter().all(|w| copies.iter().any(|c| c.ends_with(w))) {
        errs.push(format!(
            "the runtime stage copies exactly the binary to /usr/local/bin/agent and the profiler plugin to /usr/local/lib/stepwise/: {copies:?}"
        ));
    }
    for l in ["ENTRYPOINT [\"/usr/local/bin/agent\"]", "CMD [\"run\", \"--config\", \"/etc/stepwise/agent.toml\"]", "USER 0:0", "EXPOSE 9477"] {
        if !recipe.lines().any(|x| x.trim() == l) {
            errs.push(format!("`{l}`"));
        }
    }
    if !errs.is_empty() {
        bail!("deploy/Dockerfile:\n  {}", errs.join("\n  "));
    }
    eprintln!("Dockerfile: 2 stages (rust {minor} + nightly rust-src + bpf-linker@{linker}, cross-building amd64/arm64 → distroless/cc), the binary and the profiler plugin, ENTRYPOINT/CMD as the DaemonSet runs it, uid 0");
    Ok(())
}

/// Every NEEDED library of the binary is in the runtime base.
fn libraries(agent: &Path) -> Result<()> {
    let dynamic = stdout(&run_ok(Command::new("readelf").arg("-d").arg(agent))?);
    let needed: Vec<String> =
        dynamic.lines().filter(|l| l.contains("(NEEDED)")).filter_map(|l| l.split('[').nth(1).map(|s| s.trim_end_matches(']').to_string())).collect();
    let foreign: Vec<&String> = needed.iter().filter(|n| !RUNTIME_LIBS.contains(&n.as_str())).collect();
    if needed.is_empty() || !foreign.is_empty() {
        bail!("the agent needs libraries the runtime image lacks: {foreign:?} (needed: {needed:?})");
    }
    eprintln!("the binary needs only {needed:?}: all in distroless/cc");
    Ok(())
}

/// The binary as the pod runs it: see the module comment.
/// The image's `/usr/local` under `work/image`: the binary in `bin/`, the NCCL profiler plugin
/// (built here, as the image's build stage builds it) in `lib/stepwise/`, where the agent looks
/// for the plugin it ships.
fn image_layout(work: &Path, agent: &Path) -> Result<std::path::PathBuf> {
    sh(cargo().args(["build", "-p", "nccl-profiler", "--lib"]))?;
    let prefix = work.join("image/usr/local");
    std::fs::create_dir_all(prefix.join("bin"))?;
    std::fs::create_dir_all(prefix.join("lib/stepwise"))?;
    std::fs::copy(agent, prefix.join("bin/agent"))?;
    std::fs::copy(root().join("target/debug/libnccl_profiler.so"), prefix.join("lib/stepwise/libnccl-profiler-stepwise.so"))?;
    Ok(prefix.join("bin/agent"))
}

fn run_like_the_pod(t: &Tools, work: &Path, agent: &Path) -> Result<()> {
    let agent = &image_layout(work, agent)?;
    let base = stdout(&run_ok(Command::new(&t.kubectl).arg("kustomize").arg(root().join("deploy/kubernetes")))?);
    let docs = t.yaml_docs(&base)?;
    let toml = docs.iter().find(|d| d["kind"] == "ConfigMap").and_then(|d| d["data"]["agent.toml"].as_str()).context("ConfigMap agent.toml")?;
    let port = stepwise_tests::harness::free_port();
    // Host paths as this machine has them (the pod mounts the host's at /host/...).
    let cfg = toml.replace("\"/host/sys\"", "\"/sys\"").replace("/host/proc", "/proc").replace("0.0.0.0:9477", &format!("127.0.0.1:{port}"));
    // The pod's writable volumes (state, markers, the /tmp emptyDir) as one tmpfs mounted at
    // `rw` inside the private mount namespace. Not over /tmp itself: the checkout — and so the
    // binary and its config — may live under /tmp (CI clones there).
    let rw = work.join("pod-rw");
    std::fs::create_dir_all(&rw)?;
    let rw_s = rw.to_str().context("work dir is not UTF-8")?;
    // The hostPath /run/stepwise: markers, the profiler socket, the plugin's install target.
    let cfg = cfg.replace("/var/lib/stepwise/agent.db", &format!("{rw_s}/state/agent.db")).replace("/run/stepwise/", &format!("{rw_s}/run/"));
    let cfg_file = write(work, "pod-agent.toml", &cfg)?;
    let caps = std::iter::once("-all".to_string()).chain(CAPS.iter().map(|c| format!("+{}", c.to_ascii_lowercase()))).collect::<Vec<_>>().join(",");
    let script = format!(
        "set -e; mount -t tmpfs -o size=64m tmpfs \"$2\"; mkdir -p \"$2/state\" \"$2/run\" \"$2/tmp\"; mount -o remount,bind,ro /; \
         exec env -i TMPDIR=\"$2/tmp\" /usr/bin/setpriv --inh-caps={caps} --ambient-caps={caps} --bounding-set={caps} -- \"$0\" run --config \"$1\""
    );
    let log = work.join("pod-agent.log");
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c", &script])
        .arg(agent)
        .arg(&cfg_file)
        .arg(&rw)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(work.join("pod-agent.stderr"))?)
        .spawn()?;
    let addr = format!("127.0.0.1:{port}");
    let result = (|| -> Result<()> {
        stepwise_tests::harness::wait_for(Duration::from_secs(30), "the pod-like agent's /readyz", || {
            stepwise_tests::harness::http_get(&addr, "/readyz").ok().filter(|r| r.status == 200)
        })?;
        let m = stepwise_tests::harness::http_get(&addr, "/metrics")?.body;
        for want in ["stepwise_build_info{version=", "ebpf=\"embedded\"", "stepwise_source_up{source=\"collectives\"} 1"] {
            if !m.contains(want) {
                bail!("the pod-like agent's /metrics lacks {want}");
            }
        }
        let st: serde_json::Value = serde_json::from_str(&stepwise_tests::harness::http_get(&addr, "/api/v1/status")?.body)?;
        if st["collectives"]["up"] != true {
            bail!("collective probes are not up in the pod-like run: {}", st["collectives"]);
        }
        Ok(())
    })();
    // SAFETY: kill(2) on our own child (the agent, after the shell's and setpriv's exec).
    unsafe { libc_kill(child.id() as i32, 15) };
    let status = stepwise_tests::harness::wait_for(Duration::from_secs(10), "the agent to stop", || child.try_wait().ok().flatten());
    let stderr = std::fs::read_to_string(work.join("pod-agent.stderr")).unwrap_or_default();
    if let Err(e) = result {
        let _ = child.kill();
        bail!("{e:#}\nagent output:\n{stderr}");
    }
    match status {
        Ok(st) if st.success() => {}
        other => bail!("the pod-like agent did not stop cleanly on SIGTERM: {other:?}\n{stderr}"),
    }
    if !stderr.contains("installed the NCCL profiler plugin") {
        bail!("the pod-like agent did not install the NCCL profiler plugin it ships into the hostPath:\n{stderr}");
    }
    if stderr.contains("WARN") && stderr.lines().filter(|l| l.contains("WARN")).any(|l| !l.contains("no NIC") && !l.contains("not available on this host")) {
        eprintln!("(warnings from the pod-like run:\n{})", stderr.lines().filter(|l| l.contains("WARN")).collect::<Vec<_>>().join("\n"));
    }
    eprintln!("the binary ran as the pod runs it (ConfigMap agent.toml, env -i, uid 0 with {CAPS:?}, read-only /): ready, eBPF embedded, probes up, the profiler plugin installed, clean exit on SIGTERM");
    Ok(())
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
