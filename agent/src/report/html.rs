//! The self-contained HTML report (`agent diagnose --html FILE`): inline CSS, inline SVG
//! figures ([`svg`]) and a small inline script; no fonts, images, stylesheets or scripts
//! from anywhere else, so it opens from a file or an incident attachment on any machine.
//!
//! Per step: the top cause and its fix, the per-rank timeline (compute, waiting for the
//! others, communication, update, with a mark where each rank's data became ready; one time
//! axis for all rows), the stacked breakdown, the ranked causes with evidence, bytes per NIC
//! and the per-rank table. The script adds a time cursor over the timeline and highlights
//! the timeline phases of a cause when its row is clicked (or named in the address:
//! `report.html#focus=wait`); without it the page loses nothing but those (every figure
//! has native `<title>` tooltips).

mod svg;

use std::fmt::Write as _;

pub use svg::{nics as nics_svg, stacked as stacked_svg, timeline as timeline_svg, BAR_W};

use super::{bytes, duration, evidence_pairs, pct, timeline::Phase, Report, StepReport};
use crate::attribution::CauseKind;

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// One colour per cause (problems warm, expected parts cool).
pub fn colour(k: CauseKind) -> &'static str {
    match k {
        CauseKind::Compute => "#9db4c0",
        CauseKind::IdealComm => "#5c6b73",
        CauseKind::IntraHost => "#7d8fa3",
        CauseKind::ReadinessSkew => "#e07a5f",
        CauseKind::RailImbalance => "#f2cc8f",
        CauseKind::InFlightLimit => "#81b29a",
        CauseKind::Congestion => "#c0392b",
        CauseKind::Unexplained => "#b8b8b8",
    }
}

/// The timeline phases a cause's seconds come from (for highlighting).
fn phases_of(k: CauseKind) -> &'static str {
    match k {
        CauseKind::Compute => "compute update",
        CauseKind::ReadinessSkew => "wait",
        _ => "comm",
    }
}

const CSS: &str = "\
body{font:14px system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}\
h2{border-top:2px solid #ddd;padding-top:.6em}h3{margin:1.2em 0 .3em;font-size:15px}\
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
td.n{text-align:right;white-space:nowrap}table.causes td:nth-child(2){white-space:nowrap}tr.problem td:first-child{font-weight:bold}table.causes tr[data-phases]{cursor:pointer}\
.sw{display:inline-block;width:10px;height:10px;margin-right:6px}.warn{color:#c0392b}.note{color:#666}\
.top{background:#fdf3ef;border-left:4px solid #e07a5f;padding:.5em .8em}\
.legend span{margin-right:1.2em;white-space:nowrap}svg text{font:11px system-ui,sans-serif;fill:#222}\
svg.timeline .grid{stroke:#e4e4e4}svg.timeline .axis-title{fill:#666}svg.timeline .ready{fill:#111;stroke:#111;stroke-width:1}\
svg.timeline .rank-row:hover .rank-label{font-weight:bold}svg.timeline .cursor{stroke:#111;stroke-dasharray:3 2}\
svg.timeline[data-focus] .seg{opacity:.2}svg.timeline[data-focus~=compute] .seg.compute,svg.timeline[data-focus~=wait] .seg.wait,\
svg.timeline[data-focus~=comm] .seg.comm,svg.timeline[data-focus~=update] .seg.update{opacity:1}\
#js-errors{color:#c0392b}";

/// Records script errors in the page (the browser test reads `#js-errors` and `data-js`).
const ERROR_TRAP: &str = "window.stepwiseErrors=[];window.addEventListener('error',function(e){\
window.stepwiseErrors.push(String(e.message||e));var p=document.getElementById('js-errors');\
if(p){p.hidden=false;p.textContent=window.stepwiseErrors.join('\\n');}});";

const SCRIPT: &str = r#"(function(){
'use strict';
document.querySelectorAll('svg.timeline').forEach(function(svg){
  var cur=svg.querySelector('.cursor'),lab=svg.querySelector('.cursor-label');
  var x0=Number(svg.dataset.x0),w=Number(svg.dataset.w),span=Number(svg.dataset.ms);
  function hide(){cur.setAttribute('visibility','hidden');lab.setAttribute('visibility','hidden');}
  svg.addEventListener('mousemove',function(ev){
    var m=svg.getScreenCTM();if(!m){return;}
    var p=new DOMPoint(ev.clientX,ev.clientY).matrixTransform(m.inverse());
    if(p.x<x0||p.x>x0+w){hide();return;}
    cur.setAttribute('x1',p.x);cur.setAttribute('x2',p.x);
    lab.setAttribute('x',p.x+4);lab.textContent=((p.x-x0)/w*span).toFixed(1)+' ms';
    cur.setAttribute('visibility','visible');lab.setAttribute('visibility','visible');
  });
  svg.addEventListener('mouseleave',hide);
});
document.querySelectorAll('section.step').forEach(function(sec){
  var svg=sec.querySelector('svg.timeline');
  sec.querySelectorAll('table.causes tr[data-phases]').forEach(function(tr){
    tr.addEventListener('click',function(){
      if(!svg){return;}
      var f=tr.getAttribute('data-phases');
      if(svg.getAttribute('data-focus')===f){svg.removeAttribute('data-focus');}else{svg.setAttribute('data-focus',f);}
    });
  });
});
// #focus=wait (or compute, comm, update) in the address highlights that phase everywhere.
var m=/focus=([a-z ]+)/.exec(decodeURIComponent(location.hash||''));
if(m){document.querySelectorAll('svg.timeline').forEach(function(svg){svg.setAttribute('data-focus',m[1]);});}
document.body.setAttribute('data-js','ok');
})();"#;

fn legend() -> String {
    let mut s = String::from("<p class=\"legend\">");
    for p in Phase::ALL {
        let _ = write!(s, "<span><span class=\"sw\" style=\"background:{}\"></span>{}</span>", svg::phase_colour(p), p.label());
    }
    s.push_str("<span>▼ data ready (the rank entered the collective)</span></p>");
    s
}

fn causes_table(out: &mut String, r: &StepReport, threshold: f64) {
    let mut causes: Vec<_> = r.attribution.causes.iter().collect();
    causes.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    out.push_str("<table class=\"causes\"><tr><th>#</th><th>cause</th><th>seconds</th><th>share</th><th>evidence</th><th>fix</th></tr>");
    for (i, c) in causes.iter().enumerate() {
        let problem = c.kind.is_problem() && c.seconds > threshold;
        let ev: Vec<String> = evidence_pairs(&c.evidence).into_iter().map(|(k, v)| format!("{}={}", escape(&k), escape(&v))).collect();
        let _ = write!(
            out,
            "<tr class=\"{}\" data-cause=\"{}\" data-phases=\"{}\"><td class=\"n\">{}</td><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            if problem { "problem" } else { "" },
            c.kind.as_str(),
            phases_of(c.kind),
            i + 1,
            colour(c.kind),
            c.kind.as_str(),
            duration(c.seconds),
            pct(c.share),
            ev.join(", "),
            if problem { escape(&c.fix) } else { String::new() }
        );
    }
    out.push_str("</table>");
}

fn step(out: &mut String, r: &StepReport, rep: &Report) {
    let a = &r.attribution;
    let _ = write!(out, "<section class=\"step\" id=\"step-{0}\" data-step=\"{0}\"><h2>Step {0} — {1}</h2>", a.step, duration(a.seconds));
    if a.incomplete {
        out.push_str("<p class=\"warn\">Incomplete: ranks or events missing; numbers are a lower bound.</p>");
    }
    if let Some(c) = r.ranked(rep.threshold_seconds).first() {
        let _ = write!(out, "<p class=\"top\"><b>Top cause: {} {} ({})</b><br>Fix: {}</p>", c.kind.as_str(), duration(c.seconds), pct(c.share), escape(&c.fix));
    } else {
        let _ = write!(out, "<p class=\"top\">No cause above {}.</p>", duration(rep.threshold_seconds));
    }
    out.push_str("<h3>Timeline per rank</h3>");
    match svg::timeline(r) {
        Some(t) => {
            out.push_str(&t);
            out.push_str(&legend());
            let n = super::timeline::rows(a, &r.collectives).len();
            if n > svg::MAX_ROWS {
                let _ = write!(out, "<p class=\"note\">First {} of {n} ranks drawn; the table below lists all.</p>", svg::MAX_ROWS);
            }
            if rep.clock_error_seconds.is_some() {
                out.push_str("<p class=\"note\">Arrivals on different hosts are placed by each host's clock.</p>");
            }
        }
        None => out.push_str(
            "<p class=\"note\">No per-rank timeline: this source does not carry the step's collectives (use the history store with --db, or --peers).</p>",
        ),
    }
    out.push_str("<h3>Breakdown</h3>");
    out.push_str(&svg::stacked(r));
    out.push_str("<h3>Causes, largest first</h3>");
    causes_table(out, r, rep.threshold_seconds);
    let clock = rep.clock_error_seconds.map(|e| format!(" (clock error ≤ {})", duration(e))).unwrap_or_default();
    let free = r.skew.clock_free_seconds.map(duration).unwrap_or_else(|| "n/a".into());
    let late = r.skew.clock_free_late_rank.map(|k| format!(", late rank {k}")).unwrap_or_default();
    let _ = write!(out, "<p>Readiness skew: wall clock {}{clock}; clock-free {free}{late}.</p>", duration(r.skew.wall_seconds));
    if let Some(n) = svg::nics(r) {
        out.push_str("<h3>Bytes per NIC</h3>");
        out.push_str(&n);
        out.push_str("<table class=\"nics\"><tr><th>nic</th><th>tx</th><th>share</th><th>rate</th></tr>");
        for n in &r.nics {
            let rate = n.rate_bytes_per_second.map(|b| format!("{:.2} GB/s", b / 1e9)).unwrap_or_default();
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{rate}</td></tr>",
                escape(&n.nic),
                bytes(n.tx_bytes),
                pct(n.share)
            );
        }
        out.push_str("</table>");
    }
    if !a.ranks.is_empty() {
        out.push_str("<h3>Ranks</h3><table class=\"ranks\"><tr><th>rank</th><th>host</th><th>arrival</th><th>wait</th><th>inside</th></tr>");
        for k in &a.ranks {
            let _ = write!(
                out,
                "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                k.rank,
                escape(&k.host),
                duration(k.late_seconds),
                duration(k.wait_seconds),
                duration(k.inside_seconds)
            );
        }
        out.push_str("</table>");
    }
    for d in &a.desyncs {
        let _ = write!(
            out,
            "<p class=\"note\">desync on communicator {} ({}): the ranks disagree at {}</p>",
            escape(&d.comm),
            escape(&d.library),
            escape(&d.summary())
        );
    }
    for n in &a.notes {
        let _ = write!(out, "<p class=\"note\">{}</p>", escape(n));
    }
    out.push_str("</section>");
}

/// The whole report as one HTML document.
pub fn render(rep: &Report) -> String {
    let mut out = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>Stepwise diagnose</title><style>{CSS}</style><script>{ERROR_TRAP}</script></head><body><pre id=\"js-errors\" hidden></pre><h1>Where did the step's time go?</h1>"
    );
    let _ = write!(out, "<p>Source: {}", escape(&rep.source));
    if let Some(e) = rep.clock_error_seconds {
        let _ = write!(out, " · clock error ≤ {}", duration(e));
    }
    out.push_str("</p>");
    if !rep.peers.answered.is_empty() || !rep.peers.failed.is_empty() {
        let _ = write!(out, "<p>Peers answered: {}</p>", escape(&rep.peers.answered.join(", ")));
    }
    if !rep.peers.failed.is_empty() {
        out.push_str("<table class=\"failed\"><tr><th>peer that did not answer</th><th>error</th></tr>");
        for f in &rep.peers.failed {
            let _ = write!(out, "<tr><td>{}</td><td>{}</td></tr>", escape(&f.peer), escape(&f.error));
        }
        out.push_str("</table>");
    }
    for n in &rep.notes {
        let _ = write!(out, "<p class=\"note\">{}</p>", escape(n));
    }
    for r in &rep.steps {
        step(&mut out, r, rep);
    }
    let _ = writeln!(out, "<script>{SCRIPT}</script></body></html>");
    out
}

#[cfg(test)]
mod tests;
