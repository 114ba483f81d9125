//! The scenario writer (being filled in).

pub fn run_cli(_args: &[String]) -> anyhow::Result<()> {
    Ok(())
}
