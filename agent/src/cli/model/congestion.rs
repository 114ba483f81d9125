//! `agent model queue|feedback|incast` (docs/models.md §4).

use clap::Args;

use super::table::{kv, pct, title};
use super::Output;
use crate::model::congestion::{self, IncastInput, PeriodicSource};
use crate::model::ModelError;
use crate::units::{
    parse_bytes_pos, parse_metres, parse_rate, parse_rate_pos, parse_seconds, parse_seconds_list, parse_seconds_pos, Bytes, BytesPerSecond, List, Metres,
    Seconds,
};

#[derive(Debug, Args)]
pub struct QueueArgs {
    /// Rate of each source while on.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate, allow_hyphen_values = true)]
    pub rate: BytesPerSecond,
    /// On-time per period.
    #[arg(long, default_value = "20ms", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub on: Seconds,
    #[arg(long, default_value = "100ms", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub period: Seconds,
    /// One phase per source (so also the number of sources).
    #[arg(long, default_value = "0ms,0ms", value_parser = parse_seconds_list, allow_hyphen_values = true)]
    pub phases: List<Seconds>,
    /// The uplink they share.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub link: BytesPerSecond,
    /// Switch buffer for the drop and tolerated-overlap questions.
    #[arg(long, default_value = "512KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub buffer: Bytes,
    /// Simulated time [default: one period].
    #[arg(long, value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub horizon: Option<Seconds>,
}

pub fn queue(a: QueueArgs) -> Result<Output, ModelError> {
    let sources: Vec<PeriodicSource> = a.phases.0.iter().map(|&phase| PeriodicSource { rate: a.rate, on: a.on, period: a.period, phase }).collect();
    let r = congestion::queue(&sources, a.link, a.buffer, a.horizon.unwrap_or(a.period))?;
    let phases: Vec<String> = a.phases.0.iter().map(ToString::to_string).collect();
    let opt = |s: Option<Seconds>| s.map_or_else(|| "never".to_string(), |s| s.to_string());
    let text = format!(
        "{}{}",
        title(&format!("{} sources of {} for {} every {} (phases {}) into a {} link", sources.len(), a.rate, a.on, a.period, phases.join(", "), a.link)),
        kv(&[
            ("mean load", format!("{} ({} of the link)", r.mean_load, pct(r.utilisation))),
            ("time with λ > B", r.overlap.to_string()),
            ("peak queue (no limit)", format!("{} = {} at {}", r.unbounded.peak.dec(), r.unbounded.peak, r.unbounded.peak_at)),
            ("drains after the peak in", opt(r.drain_after_peak)),
            ("dropped with the buffer", format!("{} with {}", r.bounded.dropped.dec(), r.buffer)),
            ("buffer tolerates overlap", opt(r.tolerated_overlap)),
            (
                "bytes in = out + queued + dropped",
                format!("{} = {} + {} + {}", r.bounded.bytes_in.dec(), r.bounded.bytes_out.dec(), r.bounded.queued.dec(), r.bounded.dropped.dec())
            ),
        ])
    );
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct FeedbackArgs {
    /// Arrival rate λ.
    #[arg(long, default_value = "100GB/s", value_parser = parse_rate, allow_hyphen_values = true)]
    pub arrival: BytesPerSecond,
    /// Drain rate B.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub link: BytesPerSecond,
    #[arg(long, default_value = "512KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub buffer: Bytes,
    /// Fraction of the buffer already full.
    #[arg(long, default_value_t = 0.5, value_parser = super::factor, allow_hyphen_values = true)]
    pub fill: f64,
    /// Feedback delay T_f.
    #[arg(long, default_value = "20us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub delay: Seconds,
    /// Sender rate after the feedback.
    #[arg(long, default_value = "40GB/s", value_parser = parse_rate, allow_hyphen_values = true)]
    pub reduced: BytesPerSecond,
}

pub fn feedback(a: FeedbackArgs) -> Result<Output, ModelError> {
    if !(0.0..=1.0).contains(&a.fill) {
        return Err(ModelError::OutOfRange { what: "buffer fill", lo: 0.0, hi: 1.0, value: a.fill });
    }
    let r = congestion::feedback(a.arrival, a.link, a.buffer, a.buffer * a.fill, a.delay, a.reduced)?;
    let never = |s: Seconds| if s.0.is_finite() { s.to_string() } else { "never".to_string() };
    let text = format!(
        "{}{}",
        title(&format!(
            "λ = {} into B = {}, buffer {} {} full, feedback after {}, sender then at {}",
            a.arrival,
            a.link,
            a.buffer,
            pct(a.fill),
            a.delay,
            a.reduced
        )),
        kv(&[
            ("free buffer", r.free.to_string()),
            ("full after Q_free/(λ−B)", never(r.time_to_full)),
            ("excess (λ−B)·T_f", r.excess.dec().to_string()),
            ("dropped", format!("{} ({:.0} B)", r.dropped.dec(), r.dropped.0)),
            ("queue at feedback", r.queue_at_feedback.to_string()),
            ("drain at B − λ'", format!("{} → {}", r.drain_rate, never(r.drain_time))),
            ("empty again at", never(r.empty_at)),
        ])
    );
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct IncastArgs {
    /// N: λ = (N−1)·rate (docs/models.md §4.3).
    #[arg(long, default_value_t = 8, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub senders: usize,
    /// Rate of each sender.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub rate: BytesPerSecond,
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub egress: BytesPerSecond,
    /// Free buffer at the egress.
    #[arg(long, default_value = "512KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub buffer: Bytes,
    /// Cable length of the PFC hop (metres).
    #[arg(long, default_value = "30m", value_parser = parse_metres, allow_hyphen_values = true)]
    pub cable: Metres,
    #[arg(long, default_value = "1500B", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub mtu: Bytes,
    /// End-to-end (ECN/DCQCN) feedback round trip.
    #[arg(long, default_value = "20us", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub rtt: Seconds,
}

pub fn incast(a: IncastArgs) -> Result<Output, ModelError> {
    let r = congestion::incast(&IncastInput { senders: a.senders, rate: a.rate, egress: a.egress, buffer: a.buffer, cable: a.cable, mtu: a.mtu, rtt: a.rtt })?;
    let allowed = if r.allowed_feedback_delay.0.is_finite() { r.allowed_feedback_delay.to_string() } else { "unbounded (no excess)".into() };
    let text = format!(
        "{}{}",
        title(&format!("Incast: N = {} at {} into a {} egress, buffer {}", a.senders, a.rate, a.egress, a.buffer)),
        kv(&[
            ("arrival λ = (N−1)·B", r.arrival.to_string()),
            ("excess λ − B", r.excess.to_string()),
            ("allowed feedback delay", allowed),
            ("PFC hop 2·cable·5 ns/m + MTU/B", format!("{} ({} cable, {} MTU)", r.hop_delay, a.cable, a.mtu)),
            ("PFC headroom (λ−B)·t_hop", format!("{} = {}", r.pfc_headroom.dec(), r.pfc_headroom)),
            ("excess in one RTT", format!("{} in {}", r.rtt_excess.dec(), a.rtt)),
            ("lossless end-to-end?", if r.lossless_end_to_end { "yes".into() } else { "no".to_string() }),
            ("largest N lossless end-to-end only", r.max_senders_end_to_end.to_string()),
        ])
    );
    Ok(Output::new(&r, text))
}
