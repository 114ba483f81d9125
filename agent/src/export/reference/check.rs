//! A running agent's `/metrics` against the reference: every family it exposes has a row in
//! `docs/metrics.md`, of the same type, and every series has exactly the row's label names.

use super::{parse_exposition, render};

/// The problems found, one line each (empty: the exposition matches the document).
pub fn against_exposition(doc: &str, exposition: &str) -> Vec<String> {
    let rows = render::entries(doc);
    let mut problems = Vec::new();
    for (name, exposed) in parse_exposition(exposition) {
        let Some((_, kind, labels)) = rows.iter().find(|(n, _, _)| *n == name) else {
            problems.push(format!("{name}: on /metrics but has no entry in docs/metrics.md"));
            continue;
        };
        if *kind != exposed.kind {
            problems.push(format!("{name}: type {} on /metrics, {kind} in docs/metrics.md", exposed.kind));
        }
        for got in &exposed.labels {
            if got != labels {
                problems.push(format!("{name}: labels {got:?} on /metrics, {labels:?} in docs/metrics.md"));
            }
        }
    }
    problems
}
