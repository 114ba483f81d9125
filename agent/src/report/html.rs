//! A minimal self-contained HTML report (`agent diagnose --html FILE`): inline CSS, the
//! stacked breakdown of each step as inline SVG, and the causes table. No scripts, fonts or
//! other network resources, so it opens from a file or an attachment anywhere.

use std::fmt::Write as _;

use super::{bytes, evidence_pairs, ms, pct, Report, StepReport};
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
        CauseKind::ReadinessSkew => "#e07a5f",
        CauseKind::RailImbalance => "#f2cc8f",
        CauseKind::InFlightLimit => "#81b29a",
        CauseKind::Congestion => "#c0392b",
        CauseKind::Unexplained => "#b8b8b8",
    }
}

const BAR_W: f64 = 800.0;

/// The step's causes as one stacked horizontal bar, widths proportional to seconds.
pub fn stacked_svg(r: &StepReport) -> String {
    let a = &r.attribution;
    let total: f64 = a.causes.iter().map(|c| c.seconds.max(0.0)).sum();
    let mut s = format!(r#"<svg xmlns="http://www.w3.org/2000/svg" width="{BAR_W}" height="64" viewBox="0 0 {BAR_W} 64" role="img" aria-label="step {} breakdown">"#, a.step);
    let mut x = 0.0;
    for c in CauseKind::ALL {
        let secs = a.cause(c).max(0.0);
        if secs <= 0.0 || total <= 0.0 {
            continue;
        }
        let w = secs / total * BAR_W;
        let _ = write!(
            s,
            r#"<rect x="{x:.2}" y="0" width="{w:.2}" height="28" fill="{}"><title>{} {} ({})</title></rect>"#,
            colour(c),
            c.as_str(),
            ms(secs),
            pct(secs / a.seconds.max(f64::MIN_POSITIVE))
        );
        if w > 60.0 {
            let _ = write!(s, r##"<text x="{:.2}" y="19" font-size="12" fill="#000">{}</text>"##, x + 4.0, escape(c.as_str()));
        }
        x += w;
    }
    let _ = write!(s, r#"<text x="0" y="48" font-size="12">0</text><text x="{BAR_W}" y="48" font-size="12" text-anchor="end">{}</text></svg>"#, ms(a.seconds));
    s
}

fn step(out: &mut String, r: &StepReport, rep: &Report) {
    let a = &r.attribution;
    let _ = write!(out, "<section><h2>Step {} — {}</h2>", a.step, ms(a.seconds));
    if a.incomplete {
        out.push_str("<p class=\"warn\">Incomplete: ranks or events missing; numbers are a lower bound.</p>");
    }
    if let Some(c) = r.ranked(rep.threshold_seconds).first() {
        let _ = write!(out, "<p><b>Top cause: {} {} ({})</b><br>Fix: {}</p>", c.kind.as_str(), ms(c.seconds), pct(c.share), escape(&c.fix));
    } else {
        let _ = write!(out, "<p>No cause above {}.</p>", ms(rep.threshold_seconds));
    }
    out.push_str(&stacked_svg(r));
    out.push_str("<table><tr><th>cause</th><th>seconds</th><th>share</th><th>evidence</th><th>fix</th></tr>");
    for c in &a.causes {
        let ev: Vec<String> = evidence_pairs(&c.evidence).into_iter().map(|(k, v)| format!("{}={}", escape(&k), escape(&v))).collect();
        let _ = write!(
            out,
            "<tr><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            colour(c.kind),
            c.kind.as_str(),
            ms(c.seconds),
            pct(c.share),
            ev.join(", "),
            if c.kind.is_problem() && c.seconds > rep.threshold_seconds { escape(&c.fix) } else { String::new() }
        );
    }
    out.push_str("</table>");
    let clock = rep.clock_error_seconds.map(|e| format!(" (clock error ≤ {})", ms(e))).unwrap_or_default();
    let free = r.skew.clock_free_seconds.map(ms).unwrap_or_else(|| "n/a".into());
    let late = r.skew.clock_free_late_rank.map(|k| format!(", late rank {k}")).unwrap_or_default();
    let _ = write!(out, "<p>Readiness skew: wall clock {}{clock}; clock-free {free}{late}.</p>", ms(r.skew.wall_seconds));
    if !a.ranks.is_empty() {
        out.push_str("<table><tr><th>rank</th><th>host</th><th>arrival</th><th>wait</th><th>inside</th></tr>");
        for k in &a.ranks {
            let _ = write!(
                out,
                "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                k.rank,
                escape(&k.host),
                ms(k.late_seconds),
                ms(k.wait_seconds),
                ms(k.inside_seconds)
            );
        }
        out.push_str("</table>");
    }
    if !r.nics.is_empty() {
        out.push_str("<table><tr><th>nic</th><th>tx</th><th>share</th></tr>");
        for n in &r.nics {
            let _ = write!(out, "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>", escape(&n.nic), bytes(n.tx_bytes), pct(n.share));
        }
        out.push_str("</table>");
    }
    for n in &a.notes {
        let _ = write!(out, "<p class=\"note\">{}</p>", escape(n));
    }
    out.push_str("</section>");
}

/// The whole report as one HTML document.
pub fn render(rep: &Report) -> String {
    let mut out = String::from(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Stepwise diagnose</title><style>\
body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.8em 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}td.n{text-align:right;white-space:nowrap}\
.sw{display:inline-block;width:10px;height:10px;margin-right:6px}.warn{color:#c0392b}.note{color:#666}\
</style></head><body><h1>Where did the step's time go?</h1>",
    );
    let _ = write!(out, "<p>Source: {}", escape(&rep.source));
    if let Some(e) = rep.clock_error_seconds {
        let _ = write!(out, " · clock error ≤ {}", ms(e));
    }
    out.push_str("</p>");
    if !rep.peers.answered.is_empty() || !rep.peers.failed.is_empty() {
        let _ = write!(out, "<p>Peers answered: {}</p>", escape(&rep.peers.answered.join(", ")));
    }
    if !rep.peers.failed.is_empty() {
        out.push_str("<table><tr><th>peer that did not answer</th><th>error</th></tr>");
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
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;

    #[test]
    fn self_contained_with_svg_bar_and_causes_table() {
        let mut rep = fixtures::report();
        rep.peers.failed[0].error = "garbage <html> & \"quotes\"".into();
        let h = render(&rep);
        assert!(h.starts_with("<!DOCTYPE html>") && h.trim_end().ends_with("</html>"));
        for banned in ["<script", "http://", "https://", "<link", "@import", "url("] {
            // The SVG namespace is an identifier, not a fetch.
            let n = h.matches(banned).count() - if banned == "http://" { h.matches("xmlns=\"http://www.w3.org/2000/svg\"").count() } else { 0 };
            assert_eq!(n, 0, "{banned} in a self-contained report");
        }
        assert!(h.contains("<svg"), "stacked bar");
        // Bar widths proportional to seconds: compute 150/200 of 800 px.
        assert!(h.contains(r##"width="600.00" height="28" fill="#9db4c0""##), "{h}");
        assert!(h.contains(r##"width="120.00" height="28" fill="#e07a5f""##), "{h}");
        // Every cause has a row with ms and %.
        for k in CauseKind::ALL {
            assert!(h.contains(&format!("</span>{}</td>", k.as_str())), "{}", k.as_str());
        }
        assert!(h.contains("<td class=\"n\">30.0 ms</td><td class=\"n\">15.0 %</td>"));
        assert!(h.contains("Top cause: readiness_skew 30.0 ms (15.0 %)"));
        assert!(h.contains("garbage &lt;html&gt; &amp; &quot;quotes&quot;"), "escaped");
        assert!(!h.contains("{}") && !h.contains("TODO"), "no placeholders");
    }
}
