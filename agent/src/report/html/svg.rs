//! The report's inline SVG figures: the per-rank timeline, the stacked breakdown and the
//! per-NIC bytes. Plain strings, no external resources.

use std::fmt::Write as _;

use super::{colour, escape};
use crate::{
    attribution::CauseKind,
    report::{
        bytes, duration, pct,
        timeline::{self, Phase, Row},
        StepReport,
    },
};

/// Width of the bar figures.
pub const BAR_W: f64 = 800.0;
/// Timeline geometry: rank labels on the left, the plot to their right.
const LABEL_W: f64 = 190.0;
const PLOT_W: f64 = 780.0;
const ROW_H: f64 = 22.0;
const AXIS_H: f64 = 30.0;
/// Most rank rows drawn (the ranks table lists them all).
pub const MAX_ROWS: usize = 512;

/// Fill of a timeline phase: the colour of the cause it feeds.
pub fn phase_colour(p: Phase) -> &'static str {
    match p {
        Phase::Compute => colour(CauseKind::Compute),
        Phase::Wait => colour(CauseKind::ReadinessSkew),
        Phase::Comm => colour(CauseKind::IdealComm),
        Phase::Update => "#cfe0c3",
    }
}

fn rank_name(r: &Row) -> String {
    match r.rank {
        Some(k) => format!("rank {k}"),
        None => "rank ?".into(),
    }
}

/// Per-rank timeline: one row per rank on one time axis (ms from the step's begin).
/// `None` when the step's collectives are not known.
pub fn timeline(r: &StepReport) -> Option<String> {
    let a = &r.attribution;
    let rows = timeline::rows(a, &r.collectives);
    if rows.is_empty() {
        return None;
    }
    let span = (a.end - a.begin).max(f64::MIN_POSITIVE);
    let shown = rows.len().min(MAX_ROWS);
    let w = LABEL_W + PLOT_W + 20.0;
    let h = AXIS_H + shown as f64 * ROW_H + 8.0;
    let x = |t: f64| LABEL_W + t / span * PLOT_W;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="timeline" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="per-rank timeline of step {}" data-x0="{LABEL_W}" data-w="{PLOT_W}" data-ms="{:.3}">"#,
        a.step,
        span * 1e3
    );
    s.push_str(r#"<g class="axis">"#);
    for t in timeline::ticks(span) {
        let _ = write!(
            s,
            r#"<line class="grid" x1="{0:.2}" x2="{0:.2}" y1="{1}" y2="{h}"/><text x="{0:.2}" y="{2}" text-anchor="middle">{3}</text>"#,
            x(t),
            AXIS_H - 6.0,
            AXIS_H - 10.0,
            format_args!("{:.0}", t * 1e3)
        );
    }
    let _ = write!(s, r#"<text x="0" y="{}" class="axis-title">ms from step begin</text></g>"#, AXIS_H - 10.0);
    for (i, row) in rows.iter().take(shown).enumerate() {
        let y = AXIS_H + i as f64 * ROW_H;
        let who = rank_name(row);
        let rank_attr = row.rank.map(|k| k.to_string()).unwrap_or_else(|| "?".into());
        let _ = write!(
            s,
            r#"<g class="rank-row" data-rank="{rank_attr}" transform="translate(0,{y})"><text class="rank-label" x="0" y="15">{} · {}</text>"#,
            escape(&who),
            escape(&row.host)
        );
        for seg in &row.segments {
            let what = match seg.collective.and_then(|i| r.collectives.get(i)) {
                Some(c) => format!(" in {} #{}{}", c.op, c.seq, c.bytes.map(|b| format!(" ({})", bytes(b as f64))).unwrap_or_default()),
                None => String::new(),
            };
            let _ = write!(
                s,
                r#"<rect class="seg {}" x="{:.2}" y="2" width="{:.2}" height="{}" fill="{}"><title>{} {}{}: {}–{} ({})</title></rect>"#,
                seg.phase.as_str(),
                x(seg.start),
                ((seg.end - seg.start) / span * PLOT_W).max(0.5),
                ROW_H - 4.0,
                phase_colour(seg.phase),
                escape(&who),
                seg.phase.as_str(),
                escape(&what),
                duration(seg.start),
                duration(seg.end),
                duration(seg.end - seg.start)
            );
        }
        for &(t, i) in &row.ready {
            let op = r.collectives.get(i).map(|c| format!("{} #{}", c.op, c.seq)).unwrap_or_default();
            let _ = write!(
                s,
                r#"<path class="ready" d="M{0:.2},0 h8 l-4,6 z M{1:.2},6 v{2}"><title>{3}: data ready at {4} ({5})</title></path>"#,
                x(t) - 4.0,
                x(t),
                ROW_H - 6.0,
                escape(&who),
                duration(t),
                escape(&op)
            );
        }
        s.push_str("</g>");
    }
    let _ = write!(
        s,
        r#"<line class="cursor" x1="{LABEL_W}" x2="{LABEL_W}" y1="{}" y2="{h}" visibility="hidden"/><text class="cursor-label" x="{LABEL_W}" y="{}" visibility="hidden"></text></svg>"#,
        AXIS_H - 6.0,
        AXIS_H + 12.0
    );
    Some(s)
}

/// The step's causes as one stacked horizontal bar, widths proportional to seconds.
pub fn stacked(r: &StepReport) -> String {
    let a = &r.attribution;
    let total: f64 = a.causes.iter().map(|c| c.seconds.max(0.0)).sum();
    let mut s = format!(
        r#"<svg class="breakdown" xmlns="http://www.w3.org/2000/svg" width="{BAR_W}" height="64" viewBox="0 0 {BAR_W} 64" role="img" aria-label="step {} breakdown">"#,
        a.step
    );
    let mut x = 0.0;
    for c in CauseKind::ALL {
        let secs = a.cause(c).max(0.0);
        if secs <= 0.0 || total <= 0.0 {
            continue;
        }
        let w = secs / total * BAR_W;
        let _ = write!(
            s,
            r#"<rect class="part {}" x="{x:.2}" y="0" width="{w:.2}" height="28" fill="{}"><title>{} {} ({})</title></rect>"#,
            c.as_str(),
            colour(c),
            c.as_str(),
            duration(secs),
            pct(secs / a.seconds.max(f64::MIN_POSITIVE))
        );
        if w > 60.0 {
            let _ = write!(s, r##"<text x="{:.2}" y="19" font-size="12" fill="#000">{}</text>"##, x + 4.0, escape(c.as_str()));
        }
        x += w;
    }
    let _ = write!(
        s,
        r#"<text x="0" y="48" font-size="12">0</text><text x="{BAR_W}" y="48" font-size="12" text-anchor="end">{}</text></svg>"#,
        duration(a.seconds)
    );
    s
}

/// Bytes each NIC sent during the step's collectives, as bars scaled to the busiest NIC.
pub fn nics(r: &StepReport) -> Option<String> {
    if r.nics.is_empty() {
        return None;
    }
    let max = r.nics.iter().map(|n| n.tx_bytes).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    let (lw, pw, rh) = (220.0, 460.0, 20.0);
    let h = r.nics.len() as f64 * rh + 4.0;
    let w = lw + pw + 160.0;
    let mut s = format!(r#"<svg class="nics" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="bytes per NIC">"#);
    for (i, n) in r.nics.iter().enumerate() {
        let y = i as f64 * rh;
        let bw = (n.tx_bytes / max * pw).max(0.5);
        let _ = write!(
            s,
            r##"<g class="nic-bar"><text x="0" y="{:.1}">{}</text><rect x="{lw}" y="{:.1}" width="{bw:.2}" height="{}" fill="#5c6b73"><title>{}: {} ({})</title></rect><text x="{:.1}" y="{:.1}">{} · {}</text></g>"##,
            y + 14.0,
            escape(&n.nic),
            y + 3.0,
            rh - 6.0,
            escape(&n.nic),
            bytes(n.tx_bytes),
            pct(n.share),
            lw + bw + 6.0,
            y + 14.0,
            bytes(n.tx_bytes),
            pct(n.share)
        );
    }
    s.push_str("</svg>");
    Some(s)
}
