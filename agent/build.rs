//! Builds the eBPF object (agent-ebpf) with aya-build and leaves it in OUT_DIR for
//! `include_bytes_aligned!`. Without bpf-linker (or with AYA_BUILD_SKIP=1, e.g. for
//! `cargo check`/`clippy` on a machine not set up yet) an empty stub is written instead and
//! the agent reports at run time that it was built without eBPF programs.
use std::{env, fs, path::PathBuf, process::Command};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("..").join("agent-ebpf");
    let object = out_dir.join("agent-ebpf");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-changed={}", ebpf_dir.join("common").display());

    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let have_linker = Command::new("bpf-linker").arg("--version").output().is_ok_and(|o| o.status.success());
    if skip || !have_linker {
        println!(
            "cargo:warning=building the agent without its eBPF object ({}); run `cargo xtask setup`",
            if skip { "AYA_BUILD_SKIP is set" } else { "bpf-linker not found" }
        );
        fs::write(&object, b"")?;
        return Ok(());
    }
    // The nested cargo's progress lines would each become a cargo:warning; keep it quiet
    // (compiler diagnostics still come through).
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { env::set_var("CARGO_TERM_QUIET", "true") };
    let root = ebpf_dir.to_str().ok_or_else(|| anyhow::anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf([aya_build::Package { name: "agent-ebpf", root_dir: root, ..Default::default() }], aya_build::Toolchain::default())
}
