//! `cargo xtask <task>`: setup, demo, test tiers, benchmarks, fixtures.
fn main() -> anyhow::Result<()> {
    Ok(())
}
