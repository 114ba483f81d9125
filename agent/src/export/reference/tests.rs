use super::{check, families, parse_exposition, render};

const DOC: &str = "docs/metrics.md";

fn doc_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DOC)
}

#[test]
fn docs_metrics_md_is_generated_from_the_registry() {
    let want = render::markdown(&families());
    if std::env::var_os("STEPWISE_BLESS").is_some() {
        std::fs::write(doc_path(), &want).expect("write docs/metrics.md");
    }
    let have = std::fs::read_to_string(doc_path()).unwrap_or_default();
    assert!(have == want, "{DOC} is not up to date: regenerate with STEPWISE_BLESS=1 cargo test -p agent --lib export::reference");
}

#[test]
fn every_family_has_a_type_help_and_source_and_appears_once() {
    let fams = families();
    assert!(fams.len() > 60, "{} families", fams.len());
    for f in &fams {
        assert!(!f.kind.is_empty() && !f.help.is_empty(), "{f:?}");
        assert_eq!(fams.iter().filter(|g| g.name == f.name).count(), 1, "{} registered twice", f.name);
    }
    // Sampling is only on while the reference is built: a registry built afterwards on this
    // thread encodes nothing for an empty family.
    let mut r = prometheus_client::registry::Registry::default();
    crate::sources::Errors::register(&mut r);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
    assert!(!text.contains("stepwise_errors"), "{text}");
}

#[test]
fn the_label_names_are_the_ones_the_code_encodes() {
    let fams = families();
    let get = |n: &str| fams.iter().find(|f| f.name == n).unwrap_or_else(|| panic!("{n} missing"));
    assert_eq!(get("stepwise_errors_total").labels, ["source", "kind"]);
    assert_eq!(get("stepwise_nic_transmit_bytes_total").labels, ["device", "port", "netdev", "rail"]);
    assert_eq!(get("stepwise_source_sweep_duration_seconds").kind, "histogram");
    assert_eq!(get("stepwise_steps_total").source, "engine");
    assert_eq!(get("stepwise_rdma_hw_stat_total").source, "rdma");
}

#[test]
fn the_document_reads_back_as_its_families() {
    let fams = families();
    let rows = render::entries(&render::markdown(&fams));
    assert_eq!(rows.len(), fams.len());
    for (f, (name, kind, labels)) in fams.iter().zip(&rows) {
        assert_eq!((&f.name, &f.kind, &f.labels), (name, kind, labels));
    }
}

const DOC_SAMPLE: &str = "| `a_total` | counter | events | `x` (1, 2), `y` | A. |\n| `b` | gauge | count | — | B. |\n";

#[test]
fn a_family_without_an_entry_fails_with_its_name() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\"} 1\n# HELP b B.\n# TYPE b gauge\nb 2\n";
    assert_eq!(check::against_exposition(DOC_SAMPLE, ok), Vec::<String>::new());
    let extra = format!("{ok}# HELP c_seconds C.\n# TYPE c_seconds histogram\nc_seconds_bucket{{le=\"1\"}} 0\nc_seconds_sum 0\nc_seconds_count 0\n");
    assert_eq!(check::against_exposition(DOC_SAMPLE, &extra), ["c_seconds: on /metrics but has no entry in docs/metrics.md"]);
}

#[test]
fn another_type_or_other_labels_fail() {
    let wrong = "# TYPE a_total counter\na_total{x=\"1\"} 1\n# TYPE b untyped\nb{z=\"a \\\"q\\\" b\"} 2\n";
    let p = check::against_exposition(DOC_SAMPLE, wrong);
    assert_eq!(
        p,
        [
            r#"a_total: labels ["x"] on /metrics, ["x", "y"] in docs/metrics.md"#,
            "b: type untyped on /metrics, gauge in docs/metrics.md",
            r#"b: labels ["z"] on /metrics, [] in docs/metrics.md"#,
        ]
    );
}

#[test]
fn exposition_parsing_finds_histograms_counters_and_escaped_values() {
    let t = "# HELP h H.\n# TYPE h histogram\nh_bucket{s=\"a\",le=\"+Inf\"} 1\nh_sum{s=\"a\"} 1\nh_count{s=\"a\"} 1\n# TYPE c counter\nc_total{v=\"x,y=\\\"z\\\"\",w=\"1\"} 3\nc_created{v=\"q\",w=\"1\"} 3\n";
    let e = parse_exposition(t);
    assert_eq!(e["h"].labels, [vec!["s".to_string()]]);
    assert_eq!(e["h"].kind, "histogram");
    assert_eq!(e["c_total"].labels, [vec!["v".to_string(), "w".to_string()]]);
}

/// The agent's sources outside their test modules.
fn sources(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if p.is_dir() {
            sources(&p, out);
        } else if name.ends_with(".rs") && !name.ends_with("tests.rs") && !name.contains("_tests") {
            let text = std::fs::read_to_string(&p).expect("read");
            let code = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default().to_string();
            out.push((p, code));
        }
    }
}

/// The registrations of a family in `code` that bypass `register_sampled`.
fn plain_registrations(code: &str) -> Vec<String> {
    let mut plain = Vec::new();
    for (i, _) in code.match_indices(".register") {
        let rest = &code[i + ".register".len()..];
        let call = rest.trim_start_matches(['(', '_', 'w', 'i', 't', 'h', 'u', 'n']).trim_start();
        let takes_name = rest.starts_with('(') || rest.starts_with("_with_unit(");
        if takes_name && (call.starts_with('"') || call.starts_with("name")) {
            plain.push(rest.lines().next().unwrap_or_default().to_string());
        }
    }
    plain
}

#[test]
fn a_plain_registration_is_found() {
    let code = "r.register_sampled(\"a\", \"A\", c.clone());\nself.decoder.register(id, info);\nr.register(\n    \"stepwise_b\", \"B\", g);\nr.register_with_unit(\"c\", \"C\", Unit::Seconds, h);\n";
    assert_eq!(plain_registrations(code), ["(", "_with_unit(\"c\", \"C\", Unit::Seconds, h);"]);
}

/// A family registered with plain `Registry::register` has no sample series while the reference
/// is built, so it would be missing from docs/metrics.md: every registration goes through
/// `register_sampled`.
#[test]
fn every_registration_in_the_agent_goes_through_register_sampled() {
    let mut files = Vec::new();
    sources(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.len() > 100, "{} files", files.len());
    let plain: Vec<String> =
        files.iter().flat_map(|(path, code)| plain_registrations(code).into_iter().map(move |l| format!("{}: {l}", path.display()))).collect();
    assert!(plain.is_empty(), "families registered without register_sampled (missing from docs/metrics.md):\n{}", plain.join("\n"));
}
