//! Sinks that publish what the agent knows: Prometheus text (`/metrics`) and the read-only
//! JSON API, both served by [`api::router`].

pub mod api;
pub mod metrics;
