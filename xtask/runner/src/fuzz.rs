//! `cargo xtask fuzz [--seconds N] [--runs N] [--fork J] [--sanitizer none] [target…]`: builds
//! the cargo-fuzz targets of `fuzz/` (nightly, AddressSanitizer, debug assertions and overflow
//! checks; the `dev` profile at opt-level 1, which compiles ~20 % faster than release and runs
//! the targets as fast: ASan and coverage dominate) and
//! runs each on its committed corpus (`fuzz/corpus/<target>/`, read only; what the run finds
//! goes to `fuzz/target/corpus/<target>/`). A crash, a timeout (one input over 10 s: a hang)
//! or an allocation over 2 GiB fails the task; libFuzzer leaves the input in
//! `fuzz/artifacts/<target>/` — turn it into a regression test next to the parser, then fix.
//!
//! `--sanitizer none` builds the release profile with debug assertions and overflow checks but
//! without ASan (into `fuzz/target/nosan/`), for long campaigns: ASan finds memory errors only
//! in `unsafe` Rust (a few record reads, rusqlite's FFI; the bundled SQLite's C is not
//! instrumented either way), and costs most of an input's time — `store_rows` 770 → 3 693
//! inputs/s, measured side by side for 60 s on one core each from the same corpus. The `test`
//! tier keeps ASan.
//!
//! Without a limit each target runs 10 M inputs, the bar of issue 7; with both `--runs` and
//! `--seconds` each stops at whichever comes first; `cargo xtask test fuzz` runs each for
//! [`BRIEF_SECONDS`].

use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{bail, Context, Result};

use crate::tasks::{root, sh};

/// One target per parser family of outside input (docs/security.md, "Fuzzing").
pub const TARGETS: [&str; 8] = ["sysfs", "ethtool_strings", "proc_maps_environ", "probe_events", "config_toml", "api_query_marker", "store_rows", "units"];

/// Seconds per target in the `fuzz` test tier (8 targets: about 100 s after the build).
pub const BRIEF_SECONDS: u64 = 12;

/// Inputs per target when no limit is given.
pub const LONG_RUNS: u64 = 10_000_000;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    Seconds(u64),
    Runs(u64),
    /// Whichever comes first.
    RunsWithin {
        runs: u64,
        seconds: u64,
    },
}

/// What one target's run did (libFuzzer's final stats).
#[derive(Debug, Default)]
pub struct Outcome {
    pub execs: u64,
    pub seconds: f64,
    pub corpus: u64,
    pub coverage: u64,
}

pub fn fuzz(args: &[String]) -> Result<()> {
    match parse(args)? {
        Some(plan) => run(&plan),
        None => Ok(()),
    }
}

/// What `cargo xtask fuzz …` was asked to do.
#[derive(Debug, PartialEq)]
pub struct Plan {
    targets: Vec<String>,
    limit: Limit,
    fork: u32,
    build: Build,
}

/// `None` for `--help` (printed here).
fn parse(args: &[String]) -> Result<Option<Plan>> {
    let (mut runs, mut seconds) = (None, None);
    let mut fork = 0u32;
    let mut build = Build::Asan;
    let mut targets = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = |what: &str| -> Result<u64> {
            let v = it.next().with_context(|| format!("{what} needs a number"))?;
            v.parse().with_context(|| format!("{what} {v:?}: not a whole number"))
        };
        match a.as_str() {
            "--seconds" => seconds = Some(num("--seconds")?),
            "--runs" => runs = Some(num("--runs")?),
            "--fork" => fork = u32::try_from(num("--fork")?).context("--fork: too many")?,
            "--sanitizer" => {
                build = match it.next().map(String::as_str) {
                    Some("none") => Build::NoSanitizer,
                    Some("address") => Build::Asan,
                    v => bail!("--sanitizer {v:?}: expected `address` (the default) or `none`"),
                }
            }
            "-h" | "--help" => {
                eprintln!("usage: cargo xtask fuzz [--seconds N] [--runs N] [--fork J] [--sanitizer address|none] [target…]\n\ntargets: {}\ndefault: --runs {LONG_RUNS} for every target; with both, whichever comes first", TARGETS.join(", "));
                return Ok(None);
            }
            t if TARGETS.contains(&t) => targets.push(t.to_string()),
            other => bail!("unknown fuzz target or flag {other:?} (targets: {})", TARGETS.join(", ")),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    let limit = match (runs, seconds) {
        (Some(runs), Some(seconds)) => Limit::RunsWithin { runs, seconds },
        (None, Some(s)) => Limit::Seconds(s),
        (runs, None) => Limit::Runs(runs.unwrap_or(LONG_RUNS)),
    };
    Ok(Some(Plan { targets, limit, fork, build }))
}

/// Cargo's target directory for the no-sanitizer build, under `fuzz/` (its own, so the two
/// builds do not invalidate each other).
const NOSAN_TARGET_DIR: &str = "target/nosan";

/// How the targets are built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Build {
    /// `cargo fuzz build --dev`: AddressSanitizer, debug assertions, opt-level 1.
    Asan,
    /// `cargo fuzz build -O -a -s none`: release, debug assertions, no sanitizer.
    NoSanitizer,
}

impl Build {
    fn args(self) -> &'static [&'static str] {
        match self {
            Build::Asan => &["--dev"],
            Build::NoSanitizer => &["-O", "-a", "-s", "none", "--target-dir", NOSAN_TARGET_DIR],
        }
    }
    /// Where cargo-fuzz leaves the binaries, under `fuzz/`.
    fn bin_dir(self) -> PathBuf {
        match self {
            Build::Asan => PathBuf::from("target/x86_64-unknown-linux-gnu/debug"),
            Build::NoSanitizer => PathBuf::from(NOSAN_TARGET_DIR).join("x86_64-unknown-linux-gnu/release"),
        }
    }
}

/// The `fuzz` test tier: every target for [`BRIEF_SECONDS`].
pub fn brief() -> Result<()> {
    let targets = TARGETS.iter().map(|t| t.to_string()).collect();
    run(&Plan { targets, limit: Limit::Seconds(BRIEF_SECONDS), fork: 0, build: Build::Asan })
}

fn fuzz_dir() -> PathBuf {
    root().join("fuzz")
}

/// `cargo +nightly …` in `fuzz/`, without the variables of the `cargo xtask` that runs it.
fn nightly_cargo() -> Command {
    let mut c = Command::new("cargo");
    c.arg("+nightly").current_dir(fuzz_dir());
    for v in ["RUSTUP_TOOLCHAIN", "CARGO", "CARGO_TARGET_DIR", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC", "RUSTC_WRAPPER"] {
        c.env_remove(v);
    }
    // The targets never load eBPF: skip building the object (agent-ebpf/object/build.rs writes a stub).
    c.env("AYA_BUILD_SKIP", "1");
    c
}

fn ensure_cargo_fuzz() -> Result<()> {
    let have = nightly_cargo().args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("cargo-fuzz is missing: installing it");
        sh(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

fn max_len(target: &str) -> u32 {
    match target {
        // 224-byte records: room for a few dozen.
        "probe_events" => 16384,
        _ => 4096,
    }
}

pub fn run(plan: &Plan) -> Result<()> {
    let Plan { targets, limit, fork, build: how } = plan;
    let (limit, fork, how) = (*limit, *fork, *how);
    ensure_cargo_fuzz()?;
    let started = Instant::now();
    eprintln!("=== building {} fuzz target(s) (nightly, {:?}, debug assertions) ===", targets.len(), how);
    // `cargo fuzz build` takes one target or none (all of them).
    let builds: Vec<Option<&String>> = if targets.len() == TARGETS.len() { vec![None] } else { targets.iter().map(Some).collect() };
    for t in builds {
        let mut build = nightly_cargo();
        build.args(["fuzz", "build", "--target", "x86_64-unknown-linux-gnu"]).args(how.args()).args(t);
        sh(&mut build)?;
    }
    let built = started.elapsed();
    let logs = fuzz_dir().join("target/logs");
    std::fs::create_dir_all(&logs)?;
    let mut rows = Vec::new();
    for t in targets {
        let work = fuzz_dir().join("target/corpus").join(t);
        std::fs::create_dir_all(&work)?;
        let seeds = fuzz_dir().join("corpus").join(t);
        let log = logs.join(format!("{t}.log"));
        let artifacts = fuzz_dir().join("artifacts").join(t);
        std::fs::create_dir_all(&artifacts)?;
        // The binary cargo-fuzz built above: `cargo fuzz run` would rebuild first whenever
        // the agent's sources changed since, and every target must test the same build.
        let mut c = Command::new(fuzz_dir().join(how.bin_dir()).join(t));
        c.current_dir(fuzz_dir()).arg(&work).arg(&seeds).arg(format!("-artifact_prefix={}/", artifacts.display()));
        match limit {
            Limit::Seconds(s) => c.arg(format!("-max_total_time={s}")),
            Limit::Runs(n) => c.arg(format!("-runs={n}")),
            Limit::RunsWithin { runs, seconds } => c.args([format!("-runs={runs}"), format!("-max_total_time={seconds}")]),
        };
        c.args([format!("-max_len={}", max_len(t)), "-timeout=10".into(), "-rss_limit_mb=2048".into(), "-print_final_stats=1".into()]);
        if fork > 0 {
            c.arg(format!("-fork={fork}"));
        }
        eprintln!("--- {t} ({limit:?}; log {})", log.display());
        let t0 = Instant::now();
        let out = c.output().with_context(|| format!("cannot run fuzz target {t} (built by `cargo fuzz build`)"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        std::fs::write(&log, &text)?;
        if !out.status.success() {
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "fuzz target {t} failed ({}): a crash, hang or out-of-memory; the input is in {}\n{}",
                out.status,
                fuzz_dir().join("artifacts").join(t).display(),
                tail.join("\n")
            );
        }
        let mut o = outcome(&text);
        if o.seconds <= 0.0 {
            o.seconds = t0.elapsed().as_secs_f64();
        }
        eprintln!(
            "    {t}: {} executions in {:.0} s ({:.0}/s), corpus {}, coverage {}",
            o.execs,
            o.seconds,
            o.execs as f64 / o.seconds.max(1.0),
            o.corpus,
            o.coverage
        );
        rows.push((t.clone(), o, t0.elapsed()));
    }
    eprintln!("\nfuzz: build {:.0?}; per target (0 crashes, 0 hangs):", built);
    for (t, o, wall) in &rows {
        eprintln!("  {t:<18} {:>12} execs  {:>6.0} s  {:>9.0} execs/s  (wall {:.0?})", o.execs, o.seconds, o.execs as f64 / o.seconds.max(1.0), wall);
    }
    eprintln!("fuzz: total {:.0?}", started.elapsed());
    Ok(())
}

/// Parses libFuzzer's `-print_final_stats=1` lines and its last status line.
pub fn outcome(log: &str) -> Outcome {
    let stat = |key: &str| log.lines().rev().find_map(|l| l.trim().strip_prefix(key)?.trim().parse::<u64>().ok());
    let mut o = Outcome { execs: stat("stat::number_of_executed_units:").unwrap_or(0), ..Default::default() };
    // "Done 123 runs in 20 second(s)" (or the final stats' exec rate) gives the time.
    if let Some(secs) = log.lines().rev().find_map(|l| l.strip_prefix("Done ")?.split(" runs in ").nth(1)?.split_whitespace().next()?.parse::<f64>().ok()) {
        o.seconds = secs;
    } else if let Some(rate) = stat("stat::average_exec_per_sec:").filter(|r| *r > 0) {
        o.seconds = o.execs as f64 / rate as f64;
    }
    // "#123 DONE cov: 456 ft: 789 corp: 12/3456b …"
    let last = log.lines().rev().find(|l| l.starts_with('#') && l.contains(" cov: ")).unwrap_or("");
    let field = |name: &str| last.split_whitespace().skip_while(|w| *w != name).nth(1).and_then(|v| v.split('/').next()?.parse().ok());
    o.coverage = field("cov:").unwrap_or(0);
    o.corpus = field("corp:").unwrap_or(0);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_stats_are_read() {
        let log = "#2\tINITED cov: 10 ft: 11 corp: 2/30b exec/s: 0 rss: 30Mb\n#4096\tpulse  cov: 12 ft: 20 corp: 3/40b lim: 4096 exec/s: 2048 rss: 31Mb\n#81920\tDONE   cov: 14 ft: 25 corp: 5/60b lim: 4096 exec/s: 4096 rss: 40Mb\nDone 81920 runs in 20 second(s)\nstat::number_of_executed_units: 81920\nstat::average_exec_per_sec:     4096\n";
        let o = outcome(log);
        assert_eq!((o.execs, o.seconds, o.coverage, o.corpus), (81920, 20.0, 14, 5));
    }

    #[test]
    fn flags_choose_the_build_and_limits() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let p = parse(&args("--sanitizer none --runs 5 --seconds 9 store_rows")).unwrap().unwrap();
        assert_eq!(p, Plan { targets: vec!["store_rows".into()], limit: Limit::RunsWithin { runs: 5, seconds: 9 }, fork: 0, build: Build::NoSanitizer });
        let p = parse(&[]).unwrap().unwrap();
        assert_eq!((p.targets.len(), p.limit, p.build), (TARGETS.len(), Limit::Runs(LONG_RUNS), Build::Asan));
        assert!(Build::NoSanitizer.bin_dir().starts_with(NOSAN_TARGET_DIR) && Build::NoSanitizer.args().contains(&"-a"));
        for bad in ["--sanitizer", "--sanitizer memory", "--runs x", "nosuch"] {
            assert!(parse(&args(bad)).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn every_target_has_a_committed_seed_corpus_and_a_source() {
        let root = root();
        for t in TARGETS {
            let n = std::fs::read_dir(root.join("fuzz/corpus").join(t)).map(|d| d.count()).unwrap_or(0);
            assert!(n > 0, "fuzz/corpus/{t} has no seeds");
            assert!(root.join(format!("fuzz/fuzz_targets/{t}.rs")).is_file(), "no fuzz/fuzz_targets/{t}.rs");
        }
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
        for t in TARGETS {
            assert!(manifest.contains(&format!("name = \"{t}\"")), "{t} is not a [[bin]] of fuzz/Cargo.toml");
        }
    }
}
