//! The chapter's models (docs/models.md) as pure functions: no I/O, typed units, one file per
//! model family. `agent model` prints them; the attribution engine calls them with measured
//! inputs ("What the live agent uses", docs/models.md).
//!
//! - [`traffic`]: cut bound, paths, message cost, pipeline, expert-parallel traffic (§1.1–1.2,
//!   §1.7–1.9, strong scaling of §4 item 5).
//! - [`collective`]: the round model and the AllReduce placements (§1.3–1.6).
//! - [`fabric`]: rails and Clos fabrics (§1.10–1.11).
//! - [`ecmp`]: exact distribution of hash collisions (§1.12).
//! - [`multipath`]: packet spraying, reordering and retransmission (§1.13).
//! - [`concurrency`]: requests in flight and completion processing (§2).
//! - [`dependency`]: step DAG, readiness skew, overlap, tail, small messages, checkpoints (§3).
//! - [`congestion`]: fluid queue, feedback delay, incast (§4).
//! - [`scale`]: the 1024-accelerator planning exercise (§5).
//! - [`access`]: access path latency and connection state (§6).

pub mod access;
pub mod collective;
pub mod concurrency;
pub mod congestion;
pub mod dependency;
pub mod ecmp;
pub mod fabric;
pub mod multipath;
pub mod scale;
pub mod traffic;

use thiserror::Error;

/// Inputs a model cannot work with. The CLI maps every variant to exit code 2.
#[derive(Debug, Error, PartialEq)]
pub enum ModelError {
    #[error("{what} must be greater than zero (got {value})")]
    NotPositive { what: &'static str, value: f64 },
    #[error("{what} cannot be negative (got {value})")]
    Negative { what: &'static str, value: f64 },
    #[error("{what} must be at least {min} (got {got})")]
    TooFew { what: &'static str, min: u64, got: u64 },
    #[error("{what} must be at most {max} (got {got})")]
    TooMany { what: &'static str, max: u64, got: u64 },
    #[error("{what} must be between {lo} and {hi} (got {value})")]
    OutOfRange { what: &'static str, lo: f64, hi: f64, value: f64 },
    #[error("{what}: {detail}")]
    Inconsistent { what: &'static str, detail: String },
    #[error("the dependency graph has a cycle through node '{node}'")]
    Cycle { node: String },
}

/// `x > 0` and finite, or a [`ModelError::NotPositive`] naming the input.
pub(crate) fn positive(what: &'static str, x: f64) -> Result<f64, ModelError> {
    if x > 0.0 && x.is_finite() {
        Ok(x)
    } else {
        Err(ModelError::NotPositive { what, value: x })
    }
}

/// `x ≥ 0` and finite.
pub(crate) fn non_negative(what: &'static str, x: f64) -> Result<f64, ModelError> {
    if x >= 0.0 && x.is_finite() {
        Ok(x)
    } else {
        Err(ModelError::Negative { what, value: x })
    }
}

/// A count of at least `min`.
pub(crate) fn at_least(what: &'static str, n: usize, min: usize) -> Result<usize, ModelError> {
    if n >= min {
        Ok(n)
    } else {
        Err(ModelError::TooFew { what, min: min as u64, got: n as u64 })
    }
}

/// A count of at most `max`: a model's memory and time grow with it.
pub(crate) fn at_most(what: &'static str, n: usize, max: usize) -> Result<usize, ModelError> {
    if n <= max {
        Ok(n)
    } else {
        Err(ModelError::TooMany { what, max: max as u64, got: n as u64 })
    }
}

/// `⌈x⌉` that forgives the last-bit noise of f64 (0.9·3/0.1 = 27.000000000000004 → 27).
pub fn ceil_robust(x: f64) -> f64 {
    (x - 1e-9 * x.abs().max(1.0)).ceil()
}

#[cfg(test)]
pub(crate) mod testutil {
    /// `|got − want| ≤ tol · |want|` (relative), with a readable failure.
    #[track_caller]
    pub fn close(got: f64, want: f64, tol: f64, what: &str) {
        let err = if want == 0.0 { got.abs() } else { ((got - want) / want).abs() };
        assert!(err <= tol, "{what}: got {got}, want {want} (±{:.2} %)", tol * 100.0);
    }
    /// Within ±1 in the last printed digit: `|got − want| ≤ ulp` (absolute).
    #[track_caller]
    pub fn digit(got: f64, want: f64, ulp: f64, what: &str) {
        assert!((got - want).abs() <= ulp * 1.000_001, "{what}: got {got}, book prints {want} (±{ulp})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_robust_forgives_noise() {
        assert_eq!(ceil_robust(0.9 * 3.0 / 0.1), 27.0);
        assert_eq!(ceil_robust(390.625), 391.0);
        assert_eq!(ceil_robust(24.0), 24.0);
    }

    #[test]
    fn validators_name_the_input() {
        let e = positive("NIC bandwidth", 0.0).unwrap_err();
        assert_eq!(e.to_string(), "NIC bandwidth must be greater than zero (got 0)");
        assert!(non_negative("bytes", -1.0).is_err());
        assert!(at_least("flows", 0, 1).is_err());
    }
}
