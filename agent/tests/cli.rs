//! CLI polish through the built binary: shell completions (and bash actually completing with
//! them), `--version`, and `--json` on the commands that print reports.

mod common;
use common::agent_command;

use std::process::Command;

fn agent(args: &[&str]) -> (i32, String, String) {
    let out = agent_command().args(args).output().expect("run agent");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

const SUBCOMMANDS: [&str; 6] = ["run", "check", "model", "diagnose", "mark", "completions"];

#[test]
fn completions_for_every_shell_name_the_subcommands_and_flags() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (rc, out, err) = agent(&["completions", shell]);
        assert_eq!(rc, 0, "{shell}: {err}");
        assert!(out.len() > 1000, "{shell}: {} bytes", out.len());
        for sub in SUBCOMMANDS {
            assert!(out.contains(sub), "{shell} completion lacks {sub}");
        }
        assert!(out.contains("slowest") && out.contains("html") && out.contains("allreduce"), "{shell}: flags and nested subcommands");
    }
    let (rc, _, err) = agent(&["completions", "tcsh"]);
    assert_eq!(rc, 2, "unknown shell is a usage error");
    assert!(err.contains("possible values") && err.contains("powershell"), "{err}");
}

#[test]
fn bash_completes_with_the_script() {
    let (_, script, _) = agent(&["completions", "bash"]);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("agent.bash");
    std::fs::write(&path, script).expect("write");
    let complete = |words: &str| {
        let n = words.split(' ').count() - 1;
        let last = words.rsplit(' ').next().unwrap_or("");
        let prev = words.split(' ').rev().nth(1).unwrap_or("agent");
        let sh = format!("source {}; COMP_WORDS=({words}); COMP_CWORD={n}; COMP_LINE='{words}'; COMP_POINT=${{#COMP_LINE}}; _agent agent '{last}' '{prev}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"", path.display());
        let out = Command::new("bash").args(["-c", &sh]).output().expect("bash");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    assert_eq!(complete("agent di"), vec!["diagnose"]);
    let flags = complete("agent diagnose --sl");
    assert_eq!(flags, vec!["--slowest"]);
    assert!(complete("agent model ").contains(&"allreduce".to_string()));
    assert!(complete("agent completions ").contains(&"powershell".to_string()));
}

#[test]
fn version_names_the_release_and_the_ebpf_build() {
    let (rc, out, _) = agent(&["--version"]);
    assert_eq!(rc, 0);
    assert!(out.starts_with(&format!("agent {}", env!("CARGO_PKG_VERSION"))), "{out}");
    assert!(out.contains("eBPF programs: "), "{out}");
    let (rc, short, _) = agent(&["-V"]);
    assert_eq!(rc, 0);
    assert_eq!(short.lines().count(), 1, "{short}");
}

#[test]
fn json_output_is_json() {
    // model: every subcommand takes --json (a global flag of `model`).
    let (rc, out, err) = agent(&["model", "allreduce", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("model JSON");
    assert!(v.is_object(), "{v}");
    // diagnose: also when no step matches (exit 3), stdout stays JSON.
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("none.db");
    let (rc, out, _) = agent(&["diagnose", "--db", db.to_str().expect("utf8"), "--json"]);
    assert_eq!(rc, 3);
    let v: serde_json::Value = serde_json::from_str(&out).expect("diagnose JSON");
    assert!(v["steps"].as_array().is_some_and(|s| s.is_empty()) && v["notes"][0].as_str().is_some_and(|n| n.contains("no history store")), "{v}");
    // `agent check --json`: see check_json_is_structured_not_json_in_strings.
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    // `agent … | head`: the reader is gone before the agent writes.
    let dir = tempfile::tempdir().expect("tmp");
    let db = dir.path().join("none.db");
    let db = db.to_str().expect("utf8");
    let cases: [(&[&str], i32); 8] = [
        (&["model", "allreduce", "--json"], 0),
        (&["model", "allreduce"], 0),
        (&["model", "tail", "--help"], 0),
        (&["--help"], 0),
        (&["diagnose", "--db", db, "--json"], 3),
        (&["diagnose", "--db", db], 3),
        (&["run", "--print-default-config"], 0),
        (&["completions", "bash"], 0),
    ];
    for (args, code) in cases {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = agent_command().args(args).stdout(writer).output().expect("run agent");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "agent {args:?}: {err}");
        assert_eq!(out.status.code(), Some(code), "agent {args:?}: the command's own exit code; stderr {err}");
    }
}

/// `agent check` with only the netdev source (rtnetlink: no root needed to read it).
fn check(json: bool) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "[sources]\nrdma = false\nethtool = false\nqdisc = false\ntcp = false\n").expect("config");
    let mut args = vec!["check", "--config", cfg.to_str().expect("utf8")];
    if json {
        args.push("--json");
    }
    agent(&args)
}

#[test]
fn check_json_is_structured_not_json_in_strings() {
    let (rc, out, err) = check(true);
    assert!(rc == 0 || rc == 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("check JSON");
    assert_eq!(v["ok"], serde_json::Value::Bool(rc == 0), "{v}");
    let checks = v["checks"].as_array().expect("checks");
    for c in checks {
        let detail = c["detail"].as_str().expect("detail");
        assert!(!detail.contains('{') && !detail.contains("\":"), "JSON inside a string: {detail}");
        assert!(["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap_or("")), "{c}");
    }
    let netdev = checks.iter().find(|c| c["name"] == "source netdev").expect("the netdev source is checked");
    assert!(netdev["source"]["sweep"]["devices"].as_u64().is_some_and(|n| n >= 1), "{netdev}");
    assert!(netdev["source"]["status"]["netdevs"].as_array().is_some_and(|n| n.iter().all(|d| d["netdev"].is_string())), "{netdev}");
}

#[test]
fn check_text_is_a_readable_table() {
    let (rc, out, err) = check(false);
    assert!(rc == 0 || rc == 1, "{err}");
    assert!(!out.contains('{') && !out.contains("\":"), "raw JSON in the human output:\n{out}");
    let line = out.lines().find(|l| l.contains("source netdev")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("devices") && line.contains("values read"), "{line}");
    // The source's status follows as indented key=value lines, one per netdev.
    assert!(out.lines().any(|l| l.trim_start().starts_with("- ") && l.contains("netdev=") && l.contains("ifindex=")), "{out}");
    assert!(out.contains("\nthe agent can run on this host\n") || out.contains("\nthe agent cannot do its job here:\n"), "{out}");
}

#[test]
fn every_subcommand_documents_its_exit_codes() {
    // The codes each command really returns (see docs/cli.md and the tests that hit them).
    let codes: [(&[&str], &[&str]); 8] = [
        (&["--help"], &["0", "1", "2"]),
        (&["run", "--help"], &["0", "1", "2"]),
        (&["check", "--help"], &["0", "1", "2"]),
        (&["model", "--help"], &["0", "1", "2"]),
        (&["model", "tail", "--help"], &["0", "1", "2"]),
        (&["diagnose", "--help"], &["0", "1", "2", "3"]),
        (&["mark", "--help"], &["0", "1", "2"]),
        (&["completions", "--help"], &["0", "1", "2"]),
    ];
    for (args, want) in codes {
        let (rc, out, err) = agent(args);
        assert_eq!(rc, 0, "{args:?}: {err}");
        let exit = out.split("Exit status:").nth(1).unwrap_or_else(|| panic!("agent {args:?} documents no exit status:\n{out}"));
        for code in want {
            assert!(exit.contains(&format!("{code} ")), "agent {args:?}: exit status {code} not described in {exit:?}");
        }
    }
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).expect("docs/cli.md");
    for sub in SUBCOMMANDS {
        let section = doc.split(&format!("\n## `agent {sub}`")).nth(1).unwrap_or_else(|| panic!("docs/cli.md has no section for agent {sub}"));
        let section = section.split("\n## ").next().unwrap_or_default();
        assert!(section.contains("Exit status") && section.contains("| 0 |") && section.contains("| 2 |"), "agent {sub}:\n{section}");
    }
}
