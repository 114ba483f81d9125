//! `cargo xtask <task>`: the machine set-up (xtask/setup.sh: apt packages, nightly rust-src,
//! bpf-linker, tracefs/bpffs mounts), then the task itself in the `xtask-runner` crate.
//!
//! This crate depends on nothing so that it compiles and runs before the agent can be built:
//! the agent's eBPF object needs bpf-linker, which only the set-up installs. Only after set-up
//! does `cargo run -p xtask-runner` compile the agent.

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

const USAGE: &str = "usage: cargo xtask <task>

  setup              install apt packages, nightly rust-src, bpf-linker; mount tracefs/bpffs (idempotent)
  demo               build, start the agent, run a real 4-rank OpenMPI job with a straggler, show `agent diagnose`
  test [tier…]       every test tier (lint, fresh-build, unit, integration, ecosystem, fuzz, soak)
  bench <what>       benchmarks: counters, models, attribution, probes
  fuzz [--runs N] [--seconds N] [--fork J] [--sanitizer none] [target…]  cargo-fuzz targets (default 10 M inputs each; both limits: whichever comes first)
  soak [--minutes N] [--debug] [--no-attack]  agent under jobs, event storms, counter faults and attacks; RSS/CPU/fds/db bounds
  scenario …         write or evolve sysfs fixture scenarios (see `cargo xtask scenario help`)
  man [DIR]          man pages for agent and its subcommands (default target/man)
  release [--dry-run] [--tag vX.Y.Z] [--registry REG] [--dist DIR]  version check, chart package, SBOM, SHA256SUMS; image and chart push (printed with --dry-run; runs without setup)
  chart-readme       regenerate deploy/helm/stepwise/README.md from values.yaml

Every task except help and release runs `setup` first (about a second once the machine is set up).";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs `cmd`; its exit status, or a message when it could not start.
fn run(what: &str, cmd: &mut Command) -> Result<(), ExitCode> {
    match cmd.status() {
        Ok(st) if st.success() => Ok(()),
        Ok(st) => {
            eprintln!("xtask: {what} failed: {st}");
            Err(ExitCode::from(st.code().and_then(|c| u8::try_from(c).ok()).filter(|c| *c != 0).unwrap_or(1)))
        }
        Err(e) => {
            eprintln!("xtask: cannot run {what} ({cmd:?}): {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    if matches!(task, "help" | "-h" | "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    // `release` needs cargo, helm, docker and coreutils only: the release workflow runs it on a
    // stock runner, without the set-up's kernel and eBPF tooling.
    if task != "release" {
        if let Err(code) = run("setup (xtask/setup.sh)", Command::new("bash").arg(root().join("xtask/setup.sh"))) {
            return code;
        }
    }
    if task == "setup" {
        return ExitCode::SUCCESS;
    }
    match run(&format!("task {task:?}"), cargo().args(["run", "--quiet", "--package", "xtask-runner", "--"]).args(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}
