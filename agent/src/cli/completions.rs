//! `agent completions <shell>`: shell completion script on stdout (clap_complete), e.g.
//! `agent completions bash > /etc/bash_completion.d/agent` or
//! `agent completions zsh > "${fpath[1]}/_agent"`.

use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Debug, Args)]
#[command(after_help = "Exit status: 0 the script was written (or stdout was closed early); 1 it cannot be written; \
2 usage error (an unknown shell).")]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn main(a: CompletionsArgs) -> ExitCode {
    // clap_complete panics on a failed write; render to memory, then write (a closed pipe,
    // as in `agent completions bash | head`, is not an error).
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut super::Cli::command(), "agent", &mut script);
    super::print_stdout(script, ExitCode::SUCCESS)
}
