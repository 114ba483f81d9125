//! Sinks that publish what the agent knows: Prometheus text (`/metrics`) and the read-only
//! JSON API, both served by [`api::router`], and OpenTelemetry export ([`otlp`]).

pub mod api;
pub mod conns;
pub mod metrics;
pub mod open;
pub mod otlp;
pub mod pages;
pub mod reference;
pub mod replay;
pub mod stream;
pub mod synthetic;
pub mod watchdog;
