//! `agent`: wiring only; each subcommand lives in `stepwise::cli`.
fn main() -> std::process::ExitCode {
    stepwise::cli::main()
}
