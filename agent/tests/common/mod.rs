//! What every CLI test file shares: the built binary as a command.

use std::process::Command;

/// `agent`, the binary under test. Cross-built tests (`cargo xtask test aarch64`) run it through
/// the emulator named by `STEPWISE_TEST_RUNNER` (a command and its arguments, space-separated),
/// as cargo runs the test binaries themselves through `CARGO_TARGET_<TRIPLE>_RUNNER`.
pub fn agent_command() -> Command {
    let bin = env!("CARGO_BIN_EXE_agent");
    let runner = std::env::var("STEPWISE_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let Some(first) = words.next() else { return Command::new(bin) };
    let mut c = Command::new(first);
    c.args(words).arg(bin);
    c
}
