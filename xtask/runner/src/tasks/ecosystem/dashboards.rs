//! The committed dashboards are what the generator writes, they type-check against
//! `@grafana/schema` (with negative controls proving the check can fail), their schemaVersion
//! is the package's, and the provisioning files have the shape Grafana reads.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{run_ok, stdout, tools::Tools, write};
use crate::tasks::root;

const FILES: &[&str] = &["agent-health.json", "congestion.json", "nics-rails.json", "ranks-skew.json", "step-time.json"];

pub fn check(t: &Tools, work: &Path) -> Result<()> {
    let dir = root().join("dashboards");
    // 1. Committed JSON == generator output.
    let regen = work.join("dashboards-regenerated");
    run_ok(Command::new("node").arg(dir.join("gen/generate.mjs")).arg(&regen))?;
    for f in FILES {
        let (a, b) = (std::fs::read_to_string(dir.join(f)).with_context(|| format!("dashboards/{f}"))?, std::fs::read_to_string(regen.join(f))?);
        if a != b {
            bail!("dashboards/{f} differs from what dashboards/gen/generate.mjs writes: run `node dashboards/gen/generate.mjs` and commit");
        }
    }
    let extra: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") && !FILES.contains(&n.as_str()))
        .collect();
    if !extra.is_empty() {
        bail!("dashboards/ has JSON the generator does not write: {extra:?}");
    }
    // The Helm chart's copy (its Grafana sidecar ConfigMap; Helm reads only files inside the
    // chart), which the generator writes too.
    let chart = root().join("deploy/helm/stepwise/files/dashboards");
    let mut copies: Vec<String> = std::fs::read_dir(&chart)?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    copies.sort();
    if copies != FILES {
        bail!("deploy/helm/stepwise/files/dashboards has {copies:?}, expected {FILES:?}: run `node dashboards/gen/generate.mjs`");
    }
    for f in FILES {
        if std::fs::read_to_string(chart.join(f))? != std::fs::read_to_string(dir.join(f))? {
            bail!("deploy/helm/stepwise/files/dashboards/{f} differs from dashboards/{f}: run `node dashboards/gen/generate.mjs` and commit");
        }
    }
    eprintln!("{} dashboards identical to the generator's output, in dashboards/ and the chart", FILES.len());

    // 2. schemaVersion is the one @grafana/schema defines (defaultDashboard).
    let esm = std::fs::read_to_string(t.npm.join("node_modules/@grafana/schema/dist/esm/raw/dashboard/x/types.gen.mjs"))
        .context("@grafana/schema dashboard types")?;
    let want: u64 = esm
        .split("defaultDashboard =")
        .nth(1)
        .and_then(|s| s.split("schemaVersion:").nth(1))
        .and_then(|s| s.trim_start().split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .context("no schemaVersion in @grafana/schema's defaultDashboard")?;
    for f in FILES {
        let d: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(f))?)?;
        if d["schemaVersion"].as_u64() != Some(want) {
            bail!("dashboards/{f}: schemaVersion {} but @grafana/schema defines {want}", d["schemaVersion"]);
        }
    }
    eprintln!("schemaVersion {want} = @grafana/schema's defaultDashboard");

    // 3. Type check: each dashboard as a literal of StepwiseDashboard (dashboards/gen/schema.ts).
    //    The files live under the npm prefix so `@grafana/schema` resolves from node_modules.
    let ts = t.npm.join(format!("tscheck-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ts);
    std::fs::create_dir_all(&ts)?;
    std::fs::copy(dir.join("gen/schema.ts"), ts.join("schema.ts"))?;
    write(
        &ts,
        "tsconfig.json",
        r#"{"compilerOptions": {"strict": true, "noEmit": true, "target": "es2022", "module": "esnext", "moduleResolution": "bundler", "skipLibCheck": true, "types": []}, "include": ["*.ts"]}"#,
    )?;
    let as_ts = |json: &str| format!("import type {{ StepwiseDashboard }} from './schema';\nexport const dashboard: StepwiseDashboard = {json};\n");
    for f in FILES {
        write(&ts, &f.replace(".json", ".ts"), &as_ts(&std::fs::read_to_string(dir.join(f))?))?;
    }
    let tsc = |dir: &Path| Command::new(&t.tsc).arg("-p").arg(dir).output();
    let out = tsc(&ts)?;
    if !out.status.success() {
        bail!("dashboards do not type-check against @grafana/schema:\n{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    }
    eprintln!("tsc --strict: {} dashboards satisfy @grafana/schema's Dashboard (timeseries/table panel options and field config included)", FILES.len());

    // 4. Negative controls: the same check must reject a wrong field type, an unknown enum
    //    value and a misspelt field.
    let base: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("step-time.json"))?)?;
    type Mutation = fn(&mut Value);
    let controls: [(&str, Mutation); 4] = [
        ("gridPos.h as a string", |d| d["panels"][0]["gridPos"]["h"] = "8".into()),
        ("legend displayMode \"tabel\"", |d| d["panels"][0]["options"]["legend"]["displayMode"] = "tabel".into()),
        ("variable field \"refrsh\"", |d| d["templating"]["list"][1]["refrsh"] = 2.into()),
        ("target field \"exprr\"", |d| d["panels"][0]["targets"][0]["exprr"] = "up".into()),
    ];
    for (what, mutate) in controls {
        let bad = t.npm.join(format!("tscheck-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&bad);
        std::fs::create_dir_all(&bad)?;
        std::fs::copy(ts.join("schema.ts"), bad.join("schema.ts"))?;
        std::fs::copy(ts.join("tsconfig.json"), bad.join("tsconfig.json"))?;
        let mut d = base.clone();
        mutate(&mut d);
        write(&bad, "bad.ts", &as_ts(&serde_json::to_string_pretty(&d)?))?;
        let out = tsc(&bad)?;
        let _ = std::fs::remove_dir_all(&bad);
        if out.status.success() {
            bail!("the type check accepted a dashboard with {what}: it cannot catch such mistakes");
        }
        eprintln!("negative control ({what}) rejected: {}", stdout(&out).lines().next().unwrap_or("").split(": ").skip(1).collect::<Vec<_>>().join(": "));
    }
    let _ = std::fs::remove_dir_all(&ts);

    // 5. Provisioning files: the keys Grafana's provisioning reads.
    let ds = t.yaml_docs(&std::fs::read_to_string(dir.join("provisioning/datasources/stepwise.yaml"))?)?;
    let ok = ds.first().is_some_and(|d| {
        d["apiVersion"] == 1 && d["datasources"].as_array().is_some_and(|v| v.iter().any(|s| s["type"] == "prometheus" && s["url"].is_string()))
    });
    if !ok {
        bail!("provisioning/datasources/stepwise.yaml: expected apiVersion 1 and a prometheus data source with a url: {ds:?}");
    }
    let pv = t.yaml_docs(&std::fs::read_to_string(dir.join("provisioning/dashboards/stepwise.yaml"))?)?;
    let ok = pv.first().is_some_and(|d| {
        d["apiVersion"] == 1 && d["providers"].as_array().is_some_and(|v| v.iter().any(|p| p["type"] == "file" && p["options"]["path"].is_string()))
    });
    if !ok {
        bail!("provisioning/dashboards/stepwise.yaml: expected apiVersion 1 and a file provider with options.path: {pv:?}");
    }
    eprintln!("provisioning: prometheus data source and file dashboard provider");
    Ok(())
}
