//! Ideal communication (docs/models.md §1.1, §1.3): the cut bound of the collective's bytes
//! balanced over every rail at nominal rate, plus one round latency per round of its
//! algorithm — the path's measured round trip where the transport measured one
//! ([`super::transport::round_latency`]), else α.
//!
//! Inputs: bytes per rail, the rails' nominal rate, the collective's op and ranks. Evidence
//! (on the ideal cause): collectives, payload bytes, the rails, the round latency and whether
//! it was measured.

use super::transport;
use crate::{
    model::traffic,
    timeline::Collective,
    units::{Bytes, BytesPerSecond},
};

/// Seconds collective `c` needs with `per_rail` bytes on each rail at `rate` and `latency`
/// per round.
pub(super) fn seconds(c: &Collective, per_rail: f64, rate: f64, latency: f64) -> f64 {
    traffic::cut_time(Bytes(per_rail), BytesPerSecond(rate)).map(|x| x.0).unwrap_or(0.0) + transport::rounds(c) * latency
}
