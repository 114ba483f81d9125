//! `agent model spray|multipath|inflight|completions` (docs/models.md §1.13, §2).

use clap::Args;
use serde::Serialize;

use super::table::{kv, title, Table};
use super::Output;
use crate::model::concurrency::{self, completions_needed, Bound, CompletionReport, Completions};
use crate::model::multipath::{compare_paths, spray_with_loss, PathChoice, Repair, Spray, SprayReport};
use crate::model::ModelError;
use crate::units::{parse_bytes_pos, parse_rate_pos, parse_seconds, parse_seconds_list, parse_seconds_pos, Bytes, BytesPerSecond, List, Seconds};

#[derive(Debug, Args)]
pub struct SprayArgs {
    #[arg(long, default_value = "32KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub bytes: Bytes,
    #[arg(long, default_value = "4KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub packet: Bytes,
    /// Rate of every path.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub rate: BytesPerSecond,
    /// One delay per path.
    #[arg(long, default_value = "1us,1us", value_parser = parse_seconds_list, allow_hyphen_values = true)]
    pub delays: List<Seconds>,
}

impl SprayArgs {
    fn spray(&self) -> Spray {
        Spray { bytes: self.bytes, packet: self.packet, rate: self.rate, delays: self.delays.0.clone() }
    }
}

fn packets_table(r: &SprayReport) -> String {
    let mut t = Table::new(&["packet", "path", "sent", "arrived", "delivered", "waited"]);
    for p in &r.packets {
        t.row(vec![
            p.index.to_string(),
            p.path.to_string(),
            p.sent.to_string(),
            p.arrived.to_string(),
            p.delivered.to_string(),
            (p.delivered - p.arrived).to_string(),
        ]);
    }
    t.render()
}

fn summary(r: &SprayReport) -> Vec<(&'static str, String)> {
    vec![
        ("completion (last arrival)", r.completion.to_string()),
        ("in-order delivery", r.in_order.to_string()),
        ("peak reorder buffer", format!("{} packets, {}", r.peak_reorder_packets, r.peak_reorder_bytes)),
    ]
}

fn choice_pairs(c: &PathChoice) -> Vec<(&'static str, String)> {
    vec![
        ("fastest single path", c.one_path.to_string()),
        ("all paths", c.all_paths.to_string()),
        (
            "multipath wins?",
            format!(
                "{} (delay difference {} vs serialisation saved {})",
                if c.multipath_wins { "yes" } else { "no" },
                c.delay_difference,
                c.serialisation_saved
            ),
        ),
    ]
}

#[derive(Serialize)]
struct SprayOut {
    #[serde(flatten)]
    report: SprayReport,
    choice: PathChoice,
}

pub fn spray(a: SprayArgs) -> Result<Output, ModelError> {
    let s = a.spray();
    let r = crate::model::multipath::spray(&s)?;
    let choice = compare_paths(&s)?;
    let mut pairs = summary(&r);
    pairs.extend(choice_pairs(&choice));
    let text = format!(
        "{}{}\n{}",
        title(&format!("Spraying {} in {} packets round-robin over {} path(s) at {}", a.bytes, a.packet, s.delays.len(), a.rate)),
        packets_table(&r),
        kv(&pairs)
    );
    Ok(Output::new(&SprayOut { report: r, choice }, text))
}

#[derive(Debug, Args)]
pub struct MultipathArgs {
    #[command(flatten)]
    pub spray: SprayArgs,
    /// Index of the packet lost once.
    #[arg(long, default_value_t = 0, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub lost: usize,
    /// Retransmission after the first send of the lost packet.
    #[arg(long, default_value = "20us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub rto: Seconds,
}

#[derive(Serialize)]
struct MultipathOut {
    no_loss: SprayReport,
    selective: SprayReport,
    go_back_n: SprayReport,
    choice: PathChoice,
}

pub fn multipath(a: MultipathArgs) -> Result<Output, ModelError> {
    let s = a.spray.spray();
    let no_loss = crate::model::multipath::spray(&s)?;
    let selective = spray_with_loss(&s, a.lost, a.rto, Repair::Selective)?;
    let go_back_n = spray_with_loss(&s, a.lost, a.rto, Repair::GoBackN)?;
    let choice = compare_paths(&s)?;
    let mut t = Table::new(&["case", "in-order delivery", "resent", "peak reorder buffer"]);
    for (name, r) in [("no loss", &no_loss), ("selective retransmit", &selective), ("go-back-N", &go_back_n)] {
        t.row(vec![name.into(), r.in_order.to_string(), r.resent_bytes.to_string(), format!("{} packets, {}", r.peak_reorder_packets, r.peak_reorder_bytes)]);
    }
    let text = format!(
        "{}{}\n{}",
        title(&format!("{} over {} path(s) at {}; packet {} lost, resent {} after its first send", a.spray.bytes, s.delays.len(), a.spray.rate, a.lost, a.rto)),
        t.render(),
        kv(&choice_pairs(&choice))
    );
    Ok(Output::new(&MultipathOut { no_loss, selective, go_back_n, choice }, text))
}

#[derive(Debug, Args)]
pub struct InflightArgs {
    /// Payload per request m.
    #[arg(long, default_value = "256B", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub payload: Bytes,
    /// Slot occupancy T: post until completion processed.
    #[arg(long, default_value = "2us", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub occupancy: Seconds,
    /// Path bandwidth.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub bandwidth: BytesPerSecond,
    /// Slots available N.
    #[arg(long, value_parser = super::count::<u64>, allow_hyphen_values = true)]
    pub slots: Option<u64>,
    /// Minimum issue interval δ.
    #[arg(long, value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub issue_interval: Option<Seconds>,
}

pub fn inflight(a: InflightArgs) -> Result<Output, ModelError> {
    let r = concurrency::inflight(a.payload, a.occupancy, a.bandwidth, a.slots, a.issue_interval)?;
    let mut pairs = vec![
        ("bytes in flight B·T", format!("{} ({} B)", r.bytes_in_flight.dec(), r.bytes_in_flight.0)),
        ("required slots ⌈B·T/m⌉", r.required_slots.to_string()),
        ("issue interval for full rate m/B", r.max_issue_interval.to_string()),
    ];
    if let (Some(w), Some(n)) = (r.window_bound, a.slots) {
        pairs.push(("window bound N·m/T", format!("{w} with {n} slots")));
    }
    if let (Some(i), Some(d)) = (r.issue_bound, a.issue_interval) {
        pairs.push(("issue-rate bound m/δ", format!("{i} at δ = {d} ({:.1} M req/s)", 1.0 / d.0 / 1e6)));
    }
    if let Some(x) = r.crossover_payload {
        pairs.push(("issue/bandwidth crossover B·δ", x.dec().to_string()));
    }
    let binding = match r.binding {
        Bound::Path => "path bandwidth",
        Bound::Window => "slots in flight (N·m/T)",
        Bound::IssueRate => "issue rate (m/δ)",
    };
    pairs.push(("effective bandwidth", format!("{} — bound: {binding}", r.effective)));
    let text = format!("{}{}", title(&format!("In flight: m = {}, T = {}, B = {}", a.payload, a.occupancy, a.bandwidth)), kv(&pairs));
    Ok(Output::new(&r, text))
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    #[arg(long, default_value_t = 16, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub ops: usize,
    /// Bytes per operation.
    #[arg(long, default_value = "8KiB", value_parser = parse_bytes_pos, allow_hyphen_values = true)]
    pub size: Bytes,
    #[arg(long, default_value_t = 16, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub slots: usize,
    /// At most one post per interval.
    #[arg(long, default_value = "1us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub post_interval: Seconds,
    /// Completion this long after the post.
    #[arg(long, default_value = "5us", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub completion_delay: Seconds,
    /// Completions reaped per batch.
    #[arg(long, default_value_t = 4, value_parser = super::count::<usize>, allow_hyphen_values = true)]
    pub reap_batch: usize,
    /// Time between reaps (first reap after one period).
    #[arg(long, default_value = "20us", value_parser = parse_seconds_pos, allow_hyphen_values = true)]
    pub reap_period: Seconds,
    /// Bandwidth to sustain, for the completions/s it needs.
    #[arg(long, default_value = "50GB/s", value_parser = parse_rate_pos, allow_hyphen_values = true)]
    pub bandwidth: BytesPerSecond,
}

#[derive(Serialize)]
struct CompletionsOut {
    #[serde(flatten)]
    report: CompletionReport,
    completions_needed_per_s: f64,
}

pub fn completions(a: CompletionsArgs) -> Result<Output, ModelError> {
    let c = Completions {
        ops: a.ops,
        size: a.size,
        slots: a.slots,
        post_interval: a.post_interval,
        completion_delay: a.completion_delay,
        reap_batch: a.reap_batch,
        reap_period: a.reap_period,
    };
    let r = concurrency::completions(&c)?;
    let need = completions_needed(a.bandwidth, a.size)?;
    let mut t = Table::new(&["op", "posted", "completed", "reaped (slot free)"]);
    for o in &r.timeline {
        t.row(vec![o.op.to_string(), o.posted.to_string(), o.completed.to_string(), o.reaped.to_string()]);
    }
    let text = format!(
        "{}{}\n{}",
        title(&format!(
            "{} ops of {}, {} slots, a post per {}, done {} after post, {} reaped every {}",
            a.ops, a.size, a.slots, a.post_interval, a.completion_delay, a.reap_batch, a.reap_period
        )),
        t.render(),
        kv(&[
            ("transfers end", r.transfers_end.to_string()),
            ("all slots free", r.slots_free.to_string()),
            ("sustained c/P", format!("{:.0} items/s = {}", r.sustained_items_per_s, r.sustained_rate)),
            ("needed for bandwidth", format!("{:.2} M completions/s for {} at {}", need / 1e6, a.bandwidth, a.size)),
        ])
    );
    Ok(Output::new(&CompletionsOut { report: r, completions_needed_per_s: need }, text))
}
