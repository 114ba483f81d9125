use super::*;
use crate::{
    report::{fixtures, StepReport},
    timeline::{Arrival, Collective},
};

/// The fixture step's collective: 8 ranks enter at +100 ms, rank 5 at +130 ms, all leave at
/// +150 ms; then a small one at +160..170 ms.
fn with_collectives() -> Report {
    let mut rep = fixtures::report();
    let a = rep.steps[0].attribution.clone();
    let c = |seq, enter: &dyn Fn(u32) -> f64, exit| Collective {
        comm: "8f3c".into(),
        seq,
        op: "all_reduce".into(),
        library: "nccl".into(),
        bytes: Some(64 << 20),
        nranks: Some(8),
        arrivals: (0..8)
            .map(|r| Arrival {
                rank: r,
                host: if r < 4 { "node-a" } else { "node-b" }.into(),
                pid: 100 + r,
                enter: a.begin + enter(r),
                exit: a.begin + exit,
                aborted: false,
                clock: Default::default(),
            })
            .collect(),
    };
    let colls = vec![c(1, &|r| if r == 5 { 0.130 } else { 0.100 }, 0.150), c(2, &|_| 0.160, 0.170)];
    rep.steps[0] = StepReport::from_attribution(a).with_collectives(colls);
    rep
}

#[test]
fn self_contained() {
    let mut rep = with_collectives();
    rep.peers.failed[0].error = "garbage <html> & \"quotes\"".into();
    let h = render(&rep);
    assert!(h.starts_with("<!DOCTYPE html>") && h.trim_end().ends_with("</html>"));
    for banned in ["http://", "https://", "<link", "@import", "url(", " src=", " href=", "<img", "<iframe"] {
        // The SVG namespace is an identifier, not a fetch.
        let n = h.matches(banned).count() - if banned == "http://" { h.matches("xmlns=\"http://www.w3.org/2000/svg\"").count() } else { 0 };
        assert_eq!(n, 0, "{banned} in a self-contained report");
    }
    assert_eq!(h.matches("<script>").count(), 2, "the error trap and the page script, both inline");
    assert!(h.contains("garbage &lt;html&gt; &amp; &quot;quotes&quot;"), "escaped");
    assert!(!h.contains("{}") && !h.contains("TODO"), "no placeholders");
    assert!(h.contains("<pre id=\"js-errors\" hidden></pre>"));
}

#[test]
fn timeline_has_one_row_per_rank_on_one_axis() {
    let h = render(&with_collectives());
    assert_eq!(h.matches("class=\"rank-row\"").count(), 8, "one row per rank");
    for r in 0..8 {
        assert!(h.contains(&format!("data-rank=\"{r}\"")), "rank {r}");
    }
    assert!(h.contains("rank 5 · node-b"));
    // One axis: 0..200 ms over 780 px from x=190; rank 0 waits 100→130 ms = 117 px.
    assert!(h.contains(r#"<rect class="seg wait" x="580.00" y="2" width="117.00""#), "{h}");
    assert!(h.contains("rank 0 wait in all_reduce #1 (64.0 MiB): 100.0 ms–130.0 ms (30.0 ms)"));
    // The late rank does not wait; it computes until it is ready at 130 ms.
    assert!(h.contains("rank 5 compute: 0.0 ms–130.0 ms (130.0 ms)"));
    assert!(h.contains("rank 5 update: 170.0 ms–200.0 ms (30.0 ms)"));
    assert_eq!(h.matches("class=\"ready\"").count(), 16, "two ready marks per rank");
    assert!(h.contains("rank 5: data ready at 130.0 ms (all_reduce #1)"));
    assert_eq!(h.matches("<svg class=\"timeline\"").count(), 1);
    for p in Phase::ALL {
        assert!(h.contains(p.label()), "legend {}", p.label());
    }
}

#[test]
fn breakdown_ranked_causes_and_nics() {
    let h = render(&with_collectives());
    assert!(h.contains("<svg class=\"breakdown\""));
    // Bar widths proportional to seconds: compute 150/200 of 800 px.
    assert!(h.contains(r##"width="600.00" height="28" fill="#9db4c0""##), "{h}");
    assert!(h.contains(r##"width="120.00" height="28" fill="#e07a5f""##), "{h}");
    let order: Vec<&str> = h.split("data-cause=\"").skip(1).filter_map(|s| s.split('"').next()).collect();
    assert_eq!(
        order,
        ["compute", "readiness_skew", "ideal_comm", "rail_imbalance", "unexplained", "congestion", "in_flight_limit", "intra_host"],
        "largest first"
    );
    assert!(h.contains("<td class=\"n\">30.0 ms</td><td class=\"n\">15.0 %</td>"));
    assert!(h.contains("Top cause: readiness_skew 30.0 ms (15.0 %)"));
    assert!(h.contains("<tr class=\"problem\" data-cause=\"readiness_skew\" data-phases=\"wait\">"));
    assert!(h.contains("<svg class=\"nics\""));
    assert_eq!(h.matches("class=\"nic-bar\"").count(), 2);
    assert!(h.contains("node-a/eth0: 286.1 MiB (75.0 %)"), "{h}");
}

#[test]
fn without_collectives_the_page_says_why_there_is_no_timeline() {
    let h = render(&fixtures::report());
    assert!(!h.contains("<svg class=\"timeline\""));
    assert!(h.contains("No per-rank timeline"));
    assert!(h.contains("<svg class=\"breakdown\"") && h.contains("table class=\"causes\""));
}
