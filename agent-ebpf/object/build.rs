//! Builds the eBPF object (the `agent-ebpf` crate, for bpfel-unknown-none) with aya-build and
//! leaves it in OUT_DIR for `src/lib.rs` to embed.
//!
//! Without bpf-linker the build **fails** with the fix, instead of writing a stub: a stub once
//! written is never rebuilt (cargo reruns a build script only when what it watches changes, and
//! a tool appearing on PATH is not one of those), so an agent built before `cargo xtask setup`
//! would run without probes for ever. An empty stub is written only when asked for explicitly
//! with `AYA_BUILD_SKIP=1` (`cargo check`/`clippy` on a machine that is not set up); unsetting
//! it reruns this script, because the variable is watched.
use std::{env, fs, path::PathBuf, process::Command};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("..");
    let object = out_dir.join("agent-ebpf");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");

    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:warning=AYA_BUILD_SKIP is set: building without the eBPF object (the agent will refuse to load probes)");
        fs::write(&object, b"")?;
        return Ok(());
    }
    let linker = Command::new("bpf-linker").arg("--version").output();
    if !linker.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match linker {
            Ok(o) => format!("`bpf-linker --version` failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => format!("bpf-linker not found on PATH ({e})"),
        };
        anyhow::bail!(
            "cannot build the agent's eBPF programs: {why}.\n  fix: run `cargo xtask setup` (installs bpf-linker 0.10.4 and the nightly rust-src), then build again;\n  or set AYA_BUILD_SKIP=1 to build an agent without eBPF programs (for cargo check/clippy only)"
        );
    }
    // The nested cargo's progress lines would each become a cargo:warning; keep it quiet
    // (compiler diagnostics still come through).
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    let root = ebpf_dir.to_str().ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf([aya_build::Package { name: "agent-ebpf", root_dir: root, ..Default::default() }], aya_build::Toolchain::default())
}
