//! The `aarch64` tier (issue 36): the agent cross-built for `aarch64-unknown-linux-gnu` with
//! Debian's cross gcc — its eBPF object built by aya-build for aarch64's registers
//! (`bpf_target_arch = "aarch64"`) — and the unit tests of `agent` and `agent-common`
//! (probe decoders, cookies and record layouts included) run under `qemu-user`.
//!
//! qemu-user emulates the CPU, not the kernel interfaces a few tests read; those run in the
//! `unit` tier on x86-64 and are skipped here by name ([`QEMU_CANNOT`]), each with the reason.

use std::process::Command;

use anyhow::{bail, Result};

use crate::tasks::{root, sh};

pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// Where Debian's `libc6-arm64-cross` puts the aarch64 loader and libc (qemu's `-L`).
const SYSROOT: &str = "/usr/aarch64-linux-gnu";
const APT: [&str; 3] = ["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user"];

/// Tests that need what qemu-user does not emulate, or native speed (measured: each failed
/// under qemu-aarch64 7.2 and passes natively).
const QEMU_CANNOT: [(&str, &str); 13] = [
    // socket(AF_NETLINK, …, NETLINK_SOCK_DIAG) fails with EPROTONOSUPPORT under qemu-user.
    ("sources::collectives::links::tests::a_gpu_reported_after_the_first_call_completes_the_link_at_once", "sock_diag"),
    ("sources::collectives::links::tests::a_link_seen_before_the_first_call_returned_is_not_complete", "sock_diag"),
    ("sources::collectives::links::tests::a_real_connection_links_this_process_to_its_interface", "sock_diag"),
    ("sources::tcp::budget_tests::a_new_traced_process_is_dumped_by_the_fast_lane_within_the_dumps_budget", "sock_diag"),
    ("sources::tcp::diag::tests::a_closed_connection_reports_its_last_bytes_when_the_kernel_frees_it", "sock_diag"),
    ("sources::tcp::diag::tests::a_real_loopback_connection_is_dumped_with_its_acked_bytes", "sock_diag"),
    ("sources::tcp::diag::tests::one_connection_is_asked_for_by_itself_and_a_closed_one_is_left_out", "sock_diag"),
    ("sources::tcp::own::tests::a_traced_connection_that_closed_leaves_its_interface_unmeasured_at_that_read", "sock_diag"),
    ("sources::tcp::own::tests::a_traced_connections_last_bytes_come_from_its_destroy_event", "sock_diag"),
    ("sources::tcp::own::tests::only_the_traced_process_connections_count_as_its_own_from_their_birth", "sock_diag"),
    // qemu answers /proc/<own pid>/stat itself, with state "0".
    ("sources::collectives::exits::tests::own_state_and_threads_are_read_and_a_zombie_status_parsed", "/proc/self/stat"),
    ("export::open::tests::open_validates_its_query_pages_and_reads_live_states", "/proc/self/stat"),
    // Bounds the whole command to its 2 s peer timeout + 1 s, a slack for native speed: under
    // the emulator it took 3.26 s once (its answers and failures were right).
    ("cluster_json_names_rank_5_lists_failed_peers_and_returns_within_the_timeout", "wall-clock bound"),
];

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]).output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// The cross gcc, the aarch64 libc and qemu-user (apt), and the Rust standard library for the
/// target (rustup).
fn ensure_tools() -> Result<()> {
    let missing: Vec<&str> = APT.into_iter().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        eprintln!("aarch64: installing {}", missing.join(" "));
        sh(Command::new("apt-get").args(["update", "-qq"]))?;
        sh(Command::new("apt-get").args(["install", "-y", "-qq", "--no-install-recommends"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let have = Command::new("rustup").args(["target", "list", "--installed"]).current_dir(root()).output()?;
    if !String::from_utf8_lossy(&have.stdout).lines().any(|l| l.trim() == TARGET) {
        sh(Command::new("rustup").args(["target", "add", TARGET]).current_dir(root()))?;
    }
    Ok(())
}

/// Runs the tier.
pub fn check() -> Result<()> {
    ensure_tools()?;
    let runner = format!("qemu-aarch64 -L {SYSROOT}");
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root())
        .args(["test", "--target", TARGET, "-p", "agent", "-p", "agent-common", "--no-fail-fast", "--"])
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", "aarch64-linux-gnu-gcc")
        .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar")
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", &runner)
        // The CLI tests run the built binary through the same emulator (agent/tests/common).
        .env("STEPWISE_TEST_RUNNER", &runner);
    for (name, why) in QEMU_CANNOT {
        eprintln!("aarch64: skipped under qemu-user ({why}; runs in the unit tier): {name}");
        c.args(["--skip", name]);
    }
    sh(&mut c)?;
    let object = std::fs::read_dir(root().join("target").join(TARGET).join("debug/build"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("agent-ebpf-object-"))
        .filter_map(|e| std::fs::metadata(e.path().join("out/agent-ebpf")).ok())
        .any(|m| m.len() > 0);
    if !object {
        bail!("the aarch64 build left no eBPF object (target/{TARGET}/debug/build/agent-ebpf-object-*/out/agent-ebpf)");
    }
    Ok(())
}
