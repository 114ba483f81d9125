//! Command line: one file per subcommand. Everything a command prints on stdout goes through
//! [`print_stdout`] (the lint below keeps it so).
#![deny(clippy::print_stdout)]

pub mod check;
pub mod completions;
pub mod diagnose;
pub mod mark;
pub mod model;
pub mod run;

use std::{process::ExitCode, sync::OnceLock};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Exit code for usage errors (bad flags, bad config, bad quantities).
pub const EXIT_USAGE: u8 = 2;

/// `0.1.0`, or `0.1.0 (abc1234)` when the build set `STEPWISE_GIT_COMMIT` (image and release
/// builds do; a plain `cargo build` does not, so a commit never forces the agent to rebuild).
pub fn version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| match option_env!("STEPWISE_GIT_COMMIT").filter(|c| !c.is_empty()) {
        Some(c) => format!("{} ({c})", env!("CARGO_PKG_VERSION")),
        None => env!("CARGO_PKG_VERSION").to_string(),
    })
}

/// `--version`: the version and whether the eBPF programs are built in.
fn long_version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| format!("{}\neBPF programs: {}", version(), if crate::ebpf::embedded() { "embedded" } else { "missing (built with AYA_BUILD_SKIP=1)" }))
}

#[derive(Debug, Parser)]
#[command(
    name = "agent",
    version = version(),
    long_version = long_version(),
    about = "Stepwise: where did the training step's time go?",
    after_help = "Exit status: 0 success; 1 failure (also: refusing to run set-user-ID or set-group-ID, \
or stdout cannot be written); 2 usage error (unknown flag, bad value). Each command's --help \
lists its own codes; docs/cli.md describes when each happens."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: sample counters, probe collectives, serve /metrics and the API.
    Run(run::RunArgs),
    /// Preflight: kernel, BTF, capabilities, tracefs/bpffs, uprobes, NICs and readable counters.
    Check(check::CheckArgs),
    /// What-if models of the chapter: collectives, paths, in-flight limits, congestion, scale
    Model(model::ModelArgs),
    /// Where did the step's time go? Causes in seconds per step, locally or across peers.
    Diagnose(diagnose::DiagnoseArgs),
    /// Send one step marker to the agent (Unix socket or HTTP).
    Mark(mark::MarkArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
}

/// The parser: the derived one, with `agent model`'s exit status in each model's own
/// `--help` too (a derived `after_help` is not inherited by subcommands).
pub fn command() -> clap::Command {
    Cli::command().mut_subcommand("model", |m| {
        m.mut_subcommands(|s| {
            let help = match s.get_after_help() {
                Some(h) => format!("{h}\n\n{}", model::EXIT_HELP),
                None => model::EXIT_HELP.to_string(),
            };
            s.after_help(help)
        })
    })
}

pub fn main() -> ExitCode {
    if let Err(msg) = refuse_set_id() {
        eprintln!("agent: {msg}");
        return ExitCode::FAILURE;
    }
    let cli = match command().try_get_matches().and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Run(a) => run::main(a),
        Command::Check(a) => check::main(a),
        Command::Model(a) => model::main(a),
        Command::Diagnose(a) => diagnose::main(a),
        Command::Mark(a) => mark::main(a),
        Command::Completions(a) => completions::main(a),
    }
}

/// Writes a command's output to stdout and returns `code`. A reader that went away (`agent …
/// | head`, a closed pipe: EPIPE) ends the command quietly with its own code, as other CLI
/// tools end; any other write error (a full disk) is reported, exit 1.
///
/// Chosen over restoring SIGPIPE's default action: the agent also writes to sockets (the
/// daemon's HTTP answers, `diagnose`'s peers, `agent mark`), where a peer that closes must be
/// an error the code sees, not a signal that kills the process without a word. clap's own
/// `--help` and `--version` output already ignores a closed stdout ([`main`]).
pub fn print_stdout(text: impl AsRef<[u8]>, code: ExitCode) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_ref()).and_then(|()| out.flush()) {
        Ok(()) => code,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => code,
        Err(e) => {
            eprintln!("agent: cannot write the output: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The agent never runs set-user-ID or set-group-ID: the s-bit would hand whoever can execute
/// it the owner's privileges (eBPF, every process's maps, the store). Capabilities go to the
/// service (systemd unit, DaemonSet) or the file (setcap), which leave real and effective ids
/// equal (docs/security.md).
fn refuse_set_id() -> Result<(), String> {
    // SAFETY: getuid(2) and friends take no arguments and always succeed.
    let (ruid, euid, rgid, egid) = unsafe { (libc::getuid(), libc::geteuid(), libc::getgid(), libc::getegid()) };
    let fix = "remove the bit (chmod u-s,g-s) and grant the capabilities to the service instead (docs/security.md)";
    if ruid != euid {
        return Err(format!("refusing to run set-user-ID (real uid {ruid}, effective uid {euid}): {fix}"));
    }
    if rgid != egid {
        return Err(format!("refusing to run set-group-ID (real gid {rgid}, effective gid {egid}): {fix}"));
    }
    Ok(())
}
