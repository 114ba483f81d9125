//! The engine without its inputs: markers alone make steps.

use prometheus_client::registry::Registry;

use super::*;
use crate::timeline::Phase;

#[test]
fn markers_make_steps_without_collective_probes() {
    let mut registry = Registry::default();
    let mut e = Engine::new(StepsConfig::default(), "h".into(), &mut registry).expect("engine");
    let t0 = wall_now() - 30.0;
    for step in 0..4u64 {
        for (phase, dt) in [(Phase::Begin, 0.0), (Phase::End, 0.5)] {
            e.add_marker(Marker { rank: 0, step, phase, time: Some(t0 + step as f64 + dt), host: None });
        }
    }
    // `[collectives] enabled = false`: no call history is ever set.
    e.tick(wall_now(), 0);
    let ids: Vec<u64> = e.steps().map(|a| a.step).collect();
    assert_eq!(ids, [0, 1, 2, 3], "every marked step is attributed");
}

/// The text exposition of a fresh engine's registry.
fn exposition(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
    out
}

#[test]
fn every_cause_is_exported_at_zero_before_the_first_step() {
    let mut registry = Registry::default();
    let _e = Engine::new(StepsConfig::default(), "h".into(), &mut registry).expect("engine");
    let text = exposition(&registry);
    for c in CauseKind::ALL {
        let line = format!("stepwise_step_attributed_seconds_total{{cause=\"{}\"}} 0.0", c.as_str());
        assert!(text.lines().any(|l| l == line), "{line} missing from a fresh engine's metrics:\n{text}");
    }
}
