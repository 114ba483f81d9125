//! The xtask tasks (being filled in).
use std::process::Command;

use anyhow::{bail, Context, Result};

pub fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn sh(cmd: &mut Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(())
}

pub fn setup() -> Result<()> {
    sh(Command::new("bash").arg(root().join("xtask/setup.sh")))
}

pub fn demo(_args: &[String]) -> Result<()> {
    setup()
}

pub fn test(_args: &[String]) -> Result<()> {
    setup()
}

pub fn bench(_args: &[String]) -> Result<()> {
    Ok(())
}
