//! `agent model`: the chapter's models (docs/models.md) for what-if questions — "what would
//! hierarchical reduction, another NIC, a bigger supernode or 3:1 oversubscription do to my
//! step?". Every subcommand prints a table by default and `--json` with every number in base
//! units (bytes, seconds, bytes/s, ratios as fractions). Defaults are the chapter's running
//! configuration (docs/models.md §0), so a bare subcommand prints the chapter's example.
//!
//! Bad input (a negative size, zero bandwidth, an unknown unit, zero flows) is an error on
//! stderr and exit status 2.

mod collective;
mod congestion;
mod fabric;
mod plan;
mod step;
mod table;
mod traffic;
mod transport;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::EXIT_USAGE;
use crate::model::ModelError;

/// `agent model`'s exit status, in its help and in each model's (see [`super::command`]).
pub const EXIT_HELP: &str = "Exit status: 0 printed; 2 usage error, a bad quantity or input the model refuses \
(the message says which); 1 the output cannot be written.";

#[derive(Debug, Args)]
#[command(after_help = "Quantities take units: 192MiB, 8KiB, 50GB/s, 400Gbit/s, 0.833us, 20ms, 30m; \
a bare number is a size in bytes (--mtu 1500); lists as 1us,2us (x*N repeats x). GB/s is decimal, MiB binary (docs/models.md).\n\n\
Exit status: 0 printed; 2 usage error, a bad quantity or input the model refuses (the message says which); \
1 the output cannot be written.")]
pub struct ModelArgs {
    /// Machine-readable output: every number in base units (B, s, B/s, fractions).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ModelCommand,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// AllReduce under the round model: ring, interleaved, hierarchical, in-network (§1.3–1.6).
    Allreduce(collective::AllreduceArgs),
    /// Path bandwidth: serial = min, parallel = sum, relay = min(hop, Σ neighbours) (§1.2).
    Path(traffic::PathArgs),
    /// Cut lower bound V/B and strong scaling against a fixed cut (§1.1, §4 item 5).
    Cut(traffic::CutArgs),
    /// Message cost α + M/B and the latency/bandwidth crossover (§1.7).
    Msg(traffic::MsgArgs),
    /// Pipeline time (m + p − 1)τ and utilisation (§1.8).
    Pipeline(traffic::PipelineArgs),
    /// Expert-parallel traffic 2nkfd and its traffic matrix (§1.9).
    Ep(traffic::EpArgs),
    /// Rail pairing → spine bytes, NIC failure redistribution (§1.10).
    Rails(fabric::RailsArgs),
    /// Clos fabric size, switches and bisection (§1.11).
    Clos(fabric::ClosArgs),
    /// ECMP hash collisions: exact distribution of the busiest uplink (§1.12).
    Ecmp(fabric::EcmpArgs),
    /// Packet spraying over paths: completion, in-order delivery, reorder buffer (§1.13).
    Spray(transport::SprayArgs),
    /// Two-path split with a loss: selective vs go-back-N retransmission (§1.13).
    Multipath(transport::MultipathArgs),
    /// Requests in flight: required slots, effective bandwidth, which bound binds (§2.1–2.2).
    Inflight(transport::InflightArgs),
    /// Slot release by batched completion reaping, per-request timeline (§2.3).
    Completions(transport::CompletionsArgs),
    /// Step timelines: serial, overlap, in-flight limited, one NIC left (§3.3).
    Step(step::StepArgs),
    /// Readiness skew: a collective starts when its last rank is ready (§3.2).
    Skew(step::SkewArgs),
    /// Mean, p50 and p99 of a sample list (§3.4).
    Tail(step::TailArgs),
    /// Small vs large messages in a ring AllReduce (§3.5).
    Smallmsg(step::SmallmsgArgs),
    /// Fluid queue with periodic sources and phases (§4.1).
    Queue(congestion::QueueArgs),
    /// Buffer, feedback delay, drops and drain (§4.2).
    Feedback(congestion::FeedbackArgs),
    /// Incast: allowed feedback delay, PFC headroom, largest lossless N (§4.3).
    Incast(congestion::IncastArgs),
    /// The 1024-accelerator planning exercise (§5).
    Scale(plan::ScaleArgs),
    /// Stage latencies of one 64 B remote read per access path; stage-in vs remote (§6).
    Access(plan::AccessArgs),
    /// Connection state: private, shared, K groups, RC vs shared endpoints, cache overflow (§6).
    State(plan::StateArgs),
}

/// Largest count any flag takes (2^20): far beyond the chapter's 1024-host scale, small
/// enough that no model's memory or time runs away. Models bound some counts further (ranks,
/// flows × uplinks) and say so.
pub(crate) const MAX_COUNT: u64 = 1 << 20;

/// A whole-number count (`--flows 8`) of at most [`MAX_COUNT`], with a message that says
/// what went wrong.
pub(crate) fn count<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("'{s}': a count cannot be negative"));
    }
    let too_large = || format!("'{s}': a count must be at most {MAX_COUNT}");
    match t.parse::<u64>() {
        Ok(n) if n > MAX_COUNT => return Err(too_large()),
        Ok(_) => {}
        Err(_) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => return Err(too_large()),
        Err(_) => return Err(format!("'{s}' is not a whole number")),
    }
    t.parse().map_err(|_| too_large())
}

/// Largest plain number (a speed-up, a ratio, a fraction) any flag takes.
pub(crate) const MAX_FACTOR: f64 = 1e6;

/// A plain finite number from 0 to [`MAX_FACTOR`] (`--speedup 3`, `--fill 0.5`); models check
/// their own narrower ranges (a fraction in 0…1).
pub(crate) fn factor(s: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("'{s}': must be a finite number ≥ 0"));
    }
    if x > MAX_FACTOR {
        return Err(format!("'{s}': must be at most {MAX_FACTOR:e}"));
    }
    Ok(x)
}

/// What a subcommand produced: the same numbers as a table and as JSON.
pub(crate) struct Output {
    json: serde_json::Value,
    text: String,
}

impl Output {
    pub(crate) fn new<T: Serialize>(report: &T, text: String) -> Output {
        // Non-finite numbers (an infinite drain time) become JSON null.
        Output { json: serde_json::to_value(report).unwrap_or(serde_json::Value::Null), text }
    }
}

fn run(cmd: ModelCommand) -> Result<Output, ModelError> {
    match cmd {
        ModelCommand::Allreduce(a) => collective::allreduce(a),
        ModelCommand::Path(a) => traffic::path(a),
        ModelCommand::Cut(a) => traffic::cut(a),
        ModelCommand::Msg(a) => traffic::msg(a),
        ModelCommand::Pipeline(a) => traffic::pipeline(a),
        ModelCommand::Ep(a) => traffic::ep(a),
        ModelCommand::Rails(a) => fabric::rails(a),
        ModelCommand::Clos(a) => fabric::clos(a),
        ModelCommand::Ecmp(a) => fabric::ecmp(a),
        ModelCommand::Spray(a) => transport::spray(a),
        ModelCommand::Multipath(a) => transport::multipath(a),
        ModelCommand::Inflight(a) => transport::inflight(a),
        ModelCommand::Completions(a) => transport::completions(a),
        ModelCommand::Step(a) => step::step(a),
        ModelCommand::Skew(a) => step::skew(a),
        ModelCommand::Tail(a) => step::tail(a),
        ModelCommand::Smallmsg(a) => step::smallmsg(a),
        ModelCommand::Queue(a) => congestion::queue(a),
        ModelCommand::Feedback(a) => congestion::feedback(a),
        ModelCommand::Incast(a) => congestion::incast(a),
        ModelCommand::Scale(a) => plan::scale(a),
        ModelCommand::Access(a) => plan::access(a),
        ModelCommand::State(a) => plan::state(a),
    }
}

pub fn main(args: ModelArgs) -> ExitCode {
    match run(args.command) {
        Ok(out) if args.json => match serde_json::to_string_pretty(&out.json) {
            Ok(s) => super::print_stdout(s + "\n", ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("error: cannot render JSON: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(out) => super::print_stdout(out.text, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}
