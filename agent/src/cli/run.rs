//! `agent run`: the command line of the daemon — flags, the configuration, the privilege
//! check and the runtime — then [`crate::daemon::run`] (the daemon itself, SIGHUP reloads
//! included: [`crate::daemon::reload`]).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::Args;
use tracing::{error, warn};

use crate::{
    config::{parse_duration, Config, Overrides},
    daemon::{logging, run, Reload},
};

#[derive(Debug, Args)]
#[command(after_help = "Exit status: 0 after SIGINT or SIGTERM (a clean shutdown) and for --print-default-config; \
1 the daemon cannot start (listen address in use or not allowed, missing capabilities for the collective probes, \
invalid [steps]) — the log and stderr say why; 2 usage error or a config that does not load or validate. \
A marker socket or history store that cannot be opened is logged and the agent runs without it.")]
pub struct RunArgs {
    /// Config file (TOML). A missing file at the default path means built-in defaults.
    #[arg(long, env = "STEPWISE_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP listen address [default: 0.0.0.0:9477].
    #[arg(long, env = "STEPWISE_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// Root of sysfs; every sysfs read goes through it [default: /sys].
    #[arg(long, env = "STEPWISE_SYSFS_ROOT")]
    pub sysfs_root: Option<PathBuf>,
    /// Counter sampling interval, e.g. 1s, 250ms [default: 1s; at least 10ms].
    #[arg(long, env = "STEPWISE_INTERVAL", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Log filter (RUST_LOG syntax) [default: info].
    #[arg(long, env = "STEPWISE_LOG")]
    pub log: Option<String>,
    /// Log line format: text (coloured only on a terminal) or json (one object per line)
    /// [default: text].
    #[arg(long, env = "STEPWISE_LOG_FORMAT", value_enum)]
    pub log_format: Option<crate::config::LogFormat>,
    /// Unix socket for step markers [default: /run/stepwise/markers.sock].
    #[arg(long, env = "STEPWISE_MARKER_SOCKET")]
    pub marker_socket: Option<PathBuf>,
    /// Unix socket for the NCCL profiler plugin's records (the variable the plugin reads too)
    /// [default: /run/stepwise/profiler.sock].
    #[arg(long, env = "STEPWISE_PROFILER_SOCKET")]
    pub profiler_socket: Option<PathBuf>,
    /// History store file [default: /var/lib/stepwise/agent.db].
    #[arg(long, env = "STEPWISE_DB")]
    pub db: Option<PathBuf>,
    /// Print the default configuration (every value documented in config.rs) and exit.
    #[arg(long)]
    pub print_default_config: bool,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            sysfs_root: self.sysfs_root.clone(),
            interval: self.interval,
            log: self.log.clone(),
            log_format: self.log_format,
            db: self.db.clone(),
            marker_socket: self.marker_socket.clone(),
            profiler_socket: self.profiler_socket.clone(),
        }
    }
}

pub fn main(args: RunArgs) -> ExitCode {
    if args.print_default_config {
        return super::print_stdout(Config::default_toml(), ExitCode::SUCCESS);
    }
    let cfg = match Config::load(args.config.as_deref(), &args.overrides()) {
        Ok(c) => c,
        Err(e) => {
            // A JSON log asked for by flag or variable gets the refusal as JSON too.
            if args.log_format == Some(crate::config::LogFormat::Json) {
                logging::init("info", crate::config::LogFormat::Json);
            }
            let _ = fail(&e.to_string());
            return ExitCode::from(super::EXIT_USAGE);
        }
    };
    logging::init(&cfg.log, cfg.log_format);
    if let Err(msg) = crate::testclock::check() {
        let _ = fail(&msg);
        return ExitCode::from(super::EXIT_USAGE);
    }
    if crate::testclock::offset_seconds() != 0.0 {
        tracing::warn!("{} is set: this agent's clock reads {} s off (for tests only)", crate::testclock::VAR, crate::testclock::offset_seconds());
    }
    limit_malloc_arenas();
    if let Err(msg) = probe_privileges(&cfg) {
        return fail(&msg);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let reload = Reload { path: args.config.clone(), overrides: args.overrides() };
    let result = rt.block_on(run(cfg, reload));
    // Blocking threads that missed the stop (a sweep stuck in a read) do not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("{e:#}")),
    }
}

/// Refuses to start the collective probes without the capabilities they need, naming the one
/// that is missing: CAP_BPF (load the programs), CAP_PERFMON (attach the uprobes and the
/// tracepoint), and CAP_SYS_ADMIN where the kernel keeps the uprobe PMU to it — Linux 6.16
/// and the stable kernels with the CVE-2025-38466 fix (5.10.240, 5.15.189, 6.1.146, 6.6.99,
/// 6.12.39, 6.15.7) — which only attaching a probe tells, so the self-test probe is attached
/// once. CAP_SYS_ADMIN implies the other two (capabilities(7)). Without CAP_SYS_PTRACE the
/// agent still starts: it then sees only processes of its own uid that hold no capability it
/// lacks (`/proc/<pid>/maps`, `environ`, `root`, `ns/net` are ptrace-checked).
fn probe_privileges(cfg: &Config) -> Result<(), String> {
    use super::check::{effective_caps, has_cap, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE};
    if !cfg.collectives.enabled {
        return Ok(());
    }
    let Some(mask) = effective_caps() else { return Ok(()) };
    let admin = has_cap(mask, CAP_SYS_ADMIN);
    let fix = "grant it (setcap, systemd AmbientCapabilities, the DaemonSet securityContext) or set [collectives] enabled = false";
    let need = [
        (CAP_BPF, "CAP_BPF", "needed to load the eBPF programs"),
        (CAP_PERFMON, "CAP_PERFMON", "needed to attach uprobes to the collective libraries and read their events"),
    ];
    if let Some((_, name, why)) = need.iter().find(|(c, ..)| !admin && !has_cap(mask, *c)) {
        return Err(format!("missing {name}: {why}; {fix}"));
    }
    if !admin {
        if let Err(e @ crate::ebpf::EbpfError::Attach { .. }) = crate::ebpf::self_test(1) {
            let denied = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                .filter_map(|e| e.downcast_ref::<std::io::Error>()?.raw_os_error())
                .any(|c| c == libc::EACCES || c == libc::EPERM);
            if denied {
                return Err(format!("missing CAP_SYS_ADMIN: this kernel lets only CAP_SYS_ADMIN attach uprobes (Linux 6.16+ and stable kernels with the CVE-2025-38466 fix), CAP_BPF and CAP_PERFMON are not enough; {fix}"));
            }
        }
    }
    if !has_cap(mask, CAP_SYS_PTRACE) {
        warn!("no CAP_SYS_PTRACE: collective probes see only processes of this uid that hold no capability the agent lacks");
    }
    Ok(())
}

/// glibc gives each thread that allocates its own malloc arena (up to 8 × cores) and keeps
/// freed memory in it: the runtime workers, the sampler and the probe thread then hold several
/// times the live heap (measured in the soak: 77 MiB anonymous after 1000 steps, 46 MiB with
/// one arena). Two arenas, and free pages handed back every 10 s ([`trim_heap`]), keep the
/// resident size near the live data.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// A start-up failure: an error log line (where the log is installed), and in text format
/// also the plain `agent: …` line (a JSON log stays JSON lines only).
fn fail(msg: &str) -> ExitCode {
    error!("{msg}");
    if !logging::is_json() {
        eprintln!("agent: {msg}");
    }
    ExitCode::FAILURE
}
