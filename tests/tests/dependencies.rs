//! Supply chain (issue 7): every direct dependency of every crate of the project (workspace
//! members and `fuzz/`) is in the reviewed table of `docs/dependencies.md`. A new one fails
//! here until the review is extended (purpose, maintainers, unsafe/FFI, license, advisories).

use std::collections::BTreeSet;

use stepwise_tests::harness::workspace_root;

/// The project's own crates (path dependencies, possibly through `workspace = true`).
const OWN: [&str; 8] = ["agent", "agent-common", "agent-ebpf", "agent-ebpf-object", "xtask", "xtask-runner", "stepwise-tests", "nccl-profiler"];

const MANIFESTS: [&str; 10] = [
    "Cargo.toml",
    "agent/Cargo.toml",
    "agent-ebpf/Cargo.toml",
    "agent-ebpf/common/Cargo.toml",
    "agent-ebpf/object/Cargo.toml",
    "xtask/Cargo.toml",
    "xtask/runner/Cargo.toml",
    "tests/Cargo.toml",
    "fuzz/Cargo.toml",
    "nccl-profiler/Cargo.toml",
];

/// The crates.io dependencies a manifest declares (`[dependencies]`, `[dev-dependencies]`,
/// `[build-dependencies]`, target-specific ones and `[workspace.dependencies]`), by package
/// name (`x = { package = "y" }` is `y`); path dependencies are the project's own.
fn declared(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            let section = line.trim_matches(|c| c == '[' || c == ']');
            in_deps = section.ends_with("dependencies");
            continue;
        }
        if !in_deps || line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        if value.contains("path =") || value.contains("path=") {
            continue;
        }
        let key = key.trim().trim_end_matches(".workspace").trim_matches('"');
        let package = value.split("package").nth(1).and_then(|r| r.split('"').nth(1)).unwrap_or(key);
        if !OWN.contains(&package) {
            out.push(package.to_string());
        }
    }
    out
}

/// First-column crate names of the "Direct dependencies" table, and the crates the text
/// after it names as the fuzz crate's own.
fn reviewed(doc: &str) -> BTreeSet<String> {
    let table = doc.split("## Direct dependencies").nth(1).and_then(|r| r.split("\n## ").next()).expect("a `## Direct dependencies` section");
    let mut names: BTreeSet<String> = table.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(str::to_string)).collect();
    // The fuzz crate's additions are reviewed in the paragraph under the table.
    for extra in ["libfuzzer-sys", "tower"] {
        if table.contains(&format!("`{extra}`")) {
            names.insert(extra.to_string());
        }
    }
    names
}

#[test]
fn every_direct_dependency_is_in_the_reviewed_list() {
    let root = workspace_root();
    let doc = std::fs::read_to_string(root.join("docs/dependencies.md")).expect("docs/dependencies.md");
    let ok = reviewed(&doc);
    assert!(ok.len() >= 30, "the review table was not parsed: {ok:?}");
    let mut missing = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for m in MANIFESTS {
        let text = std::fs::read_to_string(root.join(m)).unwrap_or_else(|e| panic!("{m}: {e}"));
        for dep in declared(&text) {
            if !ok.contains(&dep) {
                missing.insert(format!("{dep} (in {m})"));
            }
            seen.insert(dep);
        }
    }
    assert!(missing.is_empty(), "direct dependencies not reviewed in docs/dependencies.md: {missing:?}\nadd a row (purpose, maintainers, unsafe/FFI, license) and look up its advisories");
    assert!(seen.contains("tokio") && seen.contains("libfuzzer-sys") && seen.contains("tempfile"), "the manifests were not parsed: {seen:?}");
    // Rows for crates nothing uses any more are stale review.
    let stale: Vec<&String> = ok.iter().filter(|c| !seen.contains(*c)).collect();
    assert!(stale.is_empty(), "reviewed crates no manifest declares (remove their rows): {stale:?}");
}

#[test]
fn the_manifest_parser_reads_every_form() {
    let m = "[package]\nname = \"x\"\n[dependencies]\nanyhow = { workspace = true }\naya.workspace = true\nstepwise = { package = \"agent\", path = \"../agent\" }\nfoo = { package = \"bar\", version = \"1\" }\nagent-common = { workspace = true }\n# comment = 1\n[target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n[lints]\nworkspace = true\n";
    assert_eq!(declared(m), ["anyhow", "aya", "bar", "libc"]);
}
