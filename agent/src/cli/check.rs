//! `agent check`: preflight (being filled in).
use std::process::ExitCode;

use clap::Args;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn main(_a: CheckArgs) -> ExitCode {
    match crate::ebpf::self_test(100) {
        Ok(t) => println!("{t:?}"),
        Err(e) => println!("{e}"),
    }
    ExitCode::SUCCESS
}
