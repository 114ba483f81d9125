//! The chart's README.md, generated from values.yaml in the helm-docs convention (a `# --`
//! comment above a key documents it; its default is the parsed value, as JSON) into
//! README.md.tmpl's `{{VALUES}}`. helm-docs itself ships on GitHub releases only, which this
//! project's machines cannot reach; this is the few lines of it the chart needs.
//! `cargo xtask chart-readme` writes it; the ecosystem tier fails when it is stale.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::tools::Tools;
use crate::tasks::root;

const CHART: &str = "deploy/helm/stepwise";
/// Defaults longer than this are left to values.yaml (the agent.toml `config` block).
const LONGEST_DEFAULT: usize = 160;

/// One documented value: dotted path, type, default (JSON), description.
#[derive(Debug, PartialEq)]
pub struct Row {
    pub path: String,
    pub kind: &'static str,
    pub default: String,
    pub description: String,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
        Value::Null => "string",
    }
}

fn lookup<'a>(values: &'a Value, path: &[String]) -> &'a Value {
    path.iter().fold(values, |v, k| &v[k.as_str()])
}

/// The rows of values.yaml: every key with a `# --` comment, and every leaf (scalar, empty
/// list or map) no documented key holds. `values` is the same file parsed.
pub fn rows(text: &str, values: &Value) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut stack: Vec<(usize, String, bool)> = Vec::new(); // indent, key, documented
    let mut pending: Option<String> = None;
    let mut block: Option<usize> = None; // inside a `key: |` scalar indented deeper than this
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if let Some(b) = block {
            if body.is_empty() || indent > b {
                continue;
            }
            block = None;
        }
        if body.is_empty() {
            pending = None;
            continue;
        }
        if let Some(c) = body.strip_prefix('#') {
            match (c.strip_prefix(" --"), pending.as_mut()) {
                (Some(d), _) => pending = Some(d.trim().to_string()),
                (None, Some(p)) => {
                    p.push(' ');
                    p.push_str(c.trim());
                }
                (None, None) => {}
            }
            continue;
        }
        let Some((key, rest)) = body.split_once(':').filter(|(k, _)| !k.starts_with('-') && !k.contains(' ')) else {
            pending = None;
            continue;
        };
        stack.retain(|(i, _, _)| *i < indent);
        let documented_above = stack.iter().any(|(_, _, d)| *d);
        let path: Vec<String> = stack.iter().map(|(_, k, _)| k.clone()).chain([key.to_string()]).collect();
        let v = lookup(values, &path);
        if v.is_null() && !rest.trim().is_empty() && rest.trim() != "~" {
            bail!("values.yaml: {} is not in the parsed values", path.join("."));
        }
        let leaf = !matches!(v, Value::Object(m) if !m.is_empty()) && !matches!(v, Value::Array(a) if !a.is_empty());
        let description = pending.take();
        let documented = description.is_some();
        if documented || (leaf && !documented_above) {
            let json = serde_json::to_string(v)?;
            let default = if json.len() > LONGEST_DEFAULT { "(see values.yaml)".to_string() } else { format!("`{json}`") };
            rows.push(Row { path: path.join("."), kind: kind(v), default, description: description.unwrap_or_default() });
        }
        if matches!(rest.trim(), "|" | "|-" | ">" | ">-") {
            block = Some(indent);
        }
        stack.push((indent, key.to_string(), documented));
    }
    Ok(rows)
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The README: README.md.tmpl with the chart's version and the values table filled in.
pub fn render(t: &Tools) -> Result<String> {
    let dir = root().join(CHART);
    let text = std::fs::read_to_string(dir.join("values.yaml"))?;
    let values = t.yaml_docs(&text)?.into_iter().next().context("values.yaml is empty")?;
    let chart = t.yaml_docs(&std::fs::read_to_string(dir.join("Chart.yaml"))?)?.into_iter().next().context("Chart.yaml")?;
    let tmpl = std::fs::read_to_string(dir.join("README.md.tmpl"))?;
    let rows = rows(&text, &values)?;
    let top: Vec<&String> = values.as_object().context("values")?.keys().collect();
    for k in top {
        if !rows.iter().any(|r| r.path == *k || r.path.starts_with(&format!("{k}."))) {
            bail!("values.yaml: {k} has no row in the generated table");
        }
    }
    let mut table = String::from("| Key | Type | Default | Description |\n|-----|------|---------|-------------|\n");
    for r in &rows {
        table.push_str(&format!("| `{}` | {} | {} | {} |\n", r.path, r.kind, cell(&r.default), cell(&r.description)));
    }
    Ok(tmpl
        .replace("{{VERSION}}", chart["version"].as_str().unwrap_or("?"))
        .replace("{{APP_VERSION}}", chart["appVersion"].as_str().unwrap_or("?"))
        .replace("{{VALUES}}", table.trim_end()))
}

/// `cargo xtask chart-readme`: writes the README.
pub fn write(t: &Tools) -> Result<()> {
    let p = root().join(CHART).join("README.md");
    std::fs::write(&p, render(t)?)?;
    eprintln!("wrote {}", p.display());
    Ok(())
}

/// The checked-in README is what the generator makes now; and the generator reads a `# --`
/// comment, a nested key and an undocumented leaf as it should (a small fixture).
pub fn check(t: &Tools) -> Result<()> {
    let fixture = "# header, not a value\n\n# -- The port.\n# Second line.\n#   --flag in an example\nport: 1\nimage:\n  # -- Registry.\n  registry: r\n  tag: \"\"\nconfig: |\n  listen = 1\n  x: 2\n# -- A map, documented whole.\nm:\n  a: 1\n";
    let values = t.yaml_docs(fixture)?.into_iter().next().context("fixture")?;
    let got: Vec<(String, String, String)> = rows(fixture, &values)?.into_iter().map(|r| (r.path, r.default, r.description)).collect();
    let want: Vec<(String, String, String)> = [
        ("port", "`1`", "The port. Second line. --flag in an example"),
        ("image.registry", "`\"r\"`", "Registry."),
        ("image.tag", "`\"\"`", ""),
        ("config", "`\"listen = 1\\nx: 2\\n\"`", ""),
        ("m", "`{\"a\":1}`", "A map, documented whole."),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    if got != want {
        bail!("the README generator read the fixture as\n{got:#?}\nexpected\n{want:#?}");
    }
    let want = render(t)?;
    let have = std::fs::read_to_string(root().join(CHART).join("README.md")).unwrap_or_default();
    if have != want {
        bail!("{CHART}/README.md is not what values.yaml generates: run `cargo xtask chart-readme` and commit it");
    }
    eprintln!(
        "{CHART}/README.md: up to date with values.yaml ({} rows); the generator reads its fixture right",
        want.lines().filter(|l| l.starts_with("| `")).count()
    );
    Ok(())
}
