//! `agent`: wiring only; each subcommand lives in `stepwise::cli`.
fn main() -> std::process::ExitCode {
    limit_malloc_arenas();
    stepwise::cli::main()
}

/// glibc gives each thread that contends for malloc an arena of its own (up to 8 per CPU),
/// and memory freed in one arena is not reused by the others: the daemon's resident size then
/// creeps as its threads (RingBuf drain, probes, sampling, HTTP workers) take turns allocating.
/// Two arenas bound that. Measured: one pair of 4-minute `cargo xtask soak` runs peaked at
/// 46.9 MiB with MALLOC_ARENA_MAX=2 and 52.1 MiB without; the 10-minute soaks of two CI runs
/// (without / with) peaked at 59.9 / 60.8 MiB, so the gain is within run-to-run noise there.
/// A user's MALLOC_ARENA_MAX wins.
/// One libc call: no crate wraps `mallopt`.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes allocator tuning; called before any thread exists.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
}
