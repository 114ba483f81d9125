//! `cargo xtask test fresh-build`: the path a fresh machine takes, on purpose (issue 12).
//!
//! The eBPF object crate is built into an empty target directory three times:
//! 1. without bpf-linker on PATH: the build must fail and say how to fix it (a silent stub
//!    would be reused for ever once bpf-linker appears);
//! 2. still without it, but with `AYA_BUILD_SKIP=1`: the build succeeds with an empty object
//!    (clippy/check on a machine that is not set up);
//! 3. with bpf-linker and without the skip: the build script must run again and the test
//!    `the_object_is_a_bpf_elf_with_the_agent_programs` passes on the object it embedded.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::tasks::root;

/// A PATH on which everything of the current one is found except bpf-linker: the directory
/// that holds it is replaced by a directory of links to its other programs (cargo, rustup…).
fn path_without_bpf_linker(scratch: &Path) -> Result<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let shadow = scratch.join("bin-without-bpf-linker");
    let _ = std::fs::remove_dir_all(&shadow);
    std::fs::create_dir_all(&shadow)?;
    let mut dirs = Vec::new();
    for dir in std::env::split_paths(&path) {
        if !dir.join("bpf-linker").exists() {
            dirs.push(dir);
            continue;
        }
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let name = entry.file_name();
            if name != "bpf-linker" && !shadow.join(&name).exists() {
                std::os::unix::fs::symlink(entry.path(), shadow.join(&name))?;
            }
        }
        if !dirs.contains(&shadow) {
            dirs.push(shadow.clone());
        }
    }
    let joined = std::env::join_paths(dirs)?.into_string().map_err(|_| anyhow::anyhow!("non-UTF-8 PATH"))?;
    let found = Command::new("sh").args(["-c", "command -v bpf-linker"]).env("PATH", &joined).output()?;
    if found.status.success() {
        bail!("bpf-linker is still found on the reduced PATH: {}", String::from_utf8_lossy(&found.stdout).trim());
    }
    Ok(joined)
}

fn cargo_in(target: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root()).args(args).args(["-p", "agent-ebpf-object", "--target-dir"]).arg(target);
    // The outer cargo's view of the build must not leak into the fresh one.
    c.env_remove("AYA_BUILD_SKIP").env_remove("CARGO_TARGET_DIR").env_remove("RUSTC_WRAPPER");
    c
}

fn output(what: &str, c: &mut Command) -> Result<Output> {
    eprintln!("+ {what}");
    c.output().with_context(|| format!("cannot run {c:?}"))
}

fn stub(target: &Path) -> Result<Option<u64>> {
    let build = target.join("debug/build");
    for entry in std::fs::read_dir(&build).with_context(|| format!("no {}", build.display()))?.flatten() {
        let object = entry.path().join("out/agent-ebpf");
        if entry.file_name().to_string_lossy().starts_with("agent-ebpf-object-") && object.is_file() {
            return Ok(Some(std::fs::metadata(&object)?.len()));
        }
    }
    Ok(None)
}

pub fn check() -> Result<()> {
    let started = Instant::now();
    let scratch = root().join("target/fresh-build");
    let target: PathBuf = scratch.join("target");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let reduced = path_without_bpf_linker(&scratch)?;

    let out = output("1. build without bpf-linker on PATH (must fail)", cargo_in(&target, &["build"]).env("PATH", &reduced))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        bail!("the eBPF object crate built without bpf-linker: a stub would stay in place after set-up\n{err}");
    }
    if !(err.contains("bpf-linker") && err.contains("cargo xtask setup") && err.contains("AYA_BUILD_SKIP=1")) {
        bail!("the build without bpf-linker failed, but without saying how to fix it:\n{err}");
    }
    if stub(&target)?.is_some() {
        bail!("the failed build left an object file behind");
    }

    let out = output("2. build without bpf-linker, AYA_BUILD_SKIP=1 (stub)", cargo_in(&target, &["build"]).env("PATH", &reduced).env("AYA_BUILD_SKIP", "1"))?;
    if !out.status.success() {
        bail!("AYA_BUILD_SKIP=1 did not build the stub: {}", String::from_utf8_lossy(&out.stderr));
    }
    if stub(&target)? != Some(0) {
        bail!("AYA_BUILD_SKIP=1 should leave an empty object, found {:?} bytes", stub(&target)?);
    }

    let out = output("3. test with bpf-linker on PATH (the object must be rebuilt)", &mut cargo_in(&target, &["test"]))?;
    if !out.status.success() {
        bail!(
            "after bpf-linker became available the object was not a real BPF ELF:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains("the_object_is_a_bpf_elf_with_the_agent_programs ... ok") {
        bail!("the object test did not run:\n{stdout}");
    }
    let size = stub(&target)?.unwrap_or(0);
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("fresh-build: ok in {:.0?} (fails without bpf-linker, stub only with AYA_BUILD_SKIP=1, {size}-byte BPF object after set-up)", started.elapsed());
    Ok(())
}
