//! Calls → collectives → steps; counter samples → windows.
//!
//! - [`join`]: calls of every rank joined on `(CommId, seq)` into [`Collective`]s with one
//!   [`Arrival`] per rank (locally, or across hosts in `agent diagnose --peers`, where
//!   [`align`] renumbers a host whose agent started counting elsewhere);
//! - [`markers`]: explicit step markers (Unix socket, `POST /api/v1/markers`, `agent mark`);
//! - [`steps`]: step windows from markers, or from the period of a communicator's
//!   `(op, bytes)` sequence when there are none;
//! - [`windows`]: per-NIC counter deltas over a time window;
//! - [`open`]: each communicator's progress on one host (open calls, last completed call,
//!   exited ranks), judged by [`crate::hang`].

pub mod activity;
pub mod admission;
pub mod align;
pub mod clocks;
pub mod desync;
pub mod join;
pub mod links;
pub mod markers;
pub mod open;
pub mod steps;
pub mod windows;

pub use activity::Activity;
pub use join::{join_calls, Arrival, Collective};
pub use markers::{Marker, MarkerError, Phase};
pub use steps::{steps_from_markers, steps_from_period, Step, StepSource};
pub use windows::{CounterLog, NicInfo, NicSample, NicWindow};
