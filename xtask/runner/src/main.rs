//! The tasks behind `cargo xtask` (see xtask/src/main.rs, which runs the machine set-up first
//! and then this binary with the same arguments).

mod cross;
mod fresh;
mod fuzz;
mod man;
mod release;
mod soak;
mod tasks;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((t, r)) => (t.as_str(), r),
        None => ("help", &[][..]),
    };
    match task {
        "demo" => tasks::demo(rest),
        "test" => tasks::test(rest),
        "bench" => tasks::bench(rest),
        "gpu-check" => tasks::gpu_check(rest),
        "fuzz" => fuzz::fuzz(rest),
        "soak" => soak::soak(rest),
        "scenario" => stepwise_tests::scenario::run_cli(rest),
        "man" => man::man(rest),
        "release" => release::release(rest),
        "chart-readme" => tasks::chart_readme(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n  setup              install apt packages, nightly rust-src, bpf-linker (idempotent)\n  demo               build, start the agent, run a scenario, show the result\n  test [tier…]       every test tier (unit, kernel, prometheus, …)\n  bench <what>       benchmarks: counters, fast, models, attribution, probes, tcp, cluster, plugin\n  gpu-check [--steps N]  the profiler plugin and the agent beside PyTorch's real NCCL on this host's GPU (tests/gpu; never in CI)\n  fuzz [--runs N] [--seconds N] [--fork J] [--sanitizer none] [target…]  cargo-fuzz targets (default 10 M inputs each; both limits: whichever comes first)\n  soak [--minutes N] [--debug]  agent under jobs, event storms and counter faults; RSS/CPU/fds/db bounds\n  scenario …         write or evolve sysfs fixture scenarios (see `cargo xtask scenario help`)\n  man [DIR]          man pages for agent and its subcommands (default target/man)\n  release [--dry-run] [--tag vX.Y.Z] [--registry REG] [--dist DIR]  version check, chart package, SBOM, SHA256SUMS; image and chart push (printed with --dry-run)\n  chart-readme       regenerate deploy/helm/stepwise/README.md from values.yaml"
            );
            if task == "help" {
                Ok(())
            } else {
                anyhow::bail!("unknown task {task:?}")
            }
        }
    }
}
