//! End to end, as a user would run it: the agent (real eBPF uprobes on real OpenMPI) watches
//! a 4-rank `mpi_steps` job whose rank 2 computes 30 ms longer every 5th step, and
//! attributes each step. The straggler must come out as readiness skew of ≈ 30 ms on exactly
//! those steps, rank 2 named, and nothing else above the noise. The scenario and its
//! assertions live in `support/straggler.rs`, shared with the reduced-privilege runs of
//! `capabilities.rs`, so every way of starting the agent is held to the same bar.

mod support;

use stepwise_tests::{harness::Agent, netns::Netns};
use support::straggler;

#[test]
fn straggler_is_readiness_skew_on_exactly_the_delayed_steps() {
    let dir = tempfile::Builder::new().prefix("stepwise-straggler-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let sock = dir.path().join("markers.sock");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, straggler::config(&ns, &sock, "")).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");
    let job = straggler::run_job(&ns, &sock);
    straggler::settle();
    straggler::check(&agent, &job);
}
