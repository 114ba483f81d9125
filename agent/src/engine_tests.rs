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
