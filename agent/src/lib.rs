//! Stepwise: a per-host daemon that attributes distributed-training step time to causes.
//!
//! Data flows one way (docs/architecture.md): `sources` → `timeline` → `attribution` → sinks
//! (`export`, `store`, `report`). `model` is pure and used by attribution and `agent model`.

pub mod attribution;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod ebpf;
pub mod engine;
pub mod export;
#[doc(hidden)]
pub mod fuzzing;
pub mod hang;
pub mod labels;
pub mod model;
pub mod pipeline;
pub mod report;
pub mod sources;
pub mod store;
pub mod testclock;
pub mod timeline;
pub mod topology;
pub mod units;
