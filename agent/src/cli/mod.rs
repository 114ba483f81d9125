//! Command line: one file per subcommand.

pub mod check;
pub mod diagnose;
pub mod mark;
pub mod model;
pub mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for usage errors (bad flags, bad config, bad quantities).
pub const EXIT_USAGE: u8 = 2;

#[derive(Debug, Parser)]
#[command(name = "agent", version, about = "Stepwise: where did the training step's time go?")]
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
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
    }
}
