//! Least privilege (issue 7): the agent refuses to run set-user-ID or set-group-ID, and its TCP
//! API is read-only unless markers over TCP are enabled explicitly, and then only with the
//! bearer token; the Unix marker socket (mode 0660) stays the default way in.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::Command,
    time::Duration,
};

use stepwise_tests::harness::{agent_bin, http_request_with, sample, Agent};

const NOBODY: &str = "65534";

/// Runs `bin args` as uid/gid 65534 with no supplementary groups (util-linux `setpriv`).
fn as_nobody(bin: &Path, args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(bin)
        .args(args)
        .output()
        .expect("setpriv (util-linux) runs; the test needs root")
}

/// A copy of `src` in a directory `nobody` can reach, with `mode` (s-bits included).
fn copy_with_mode(dir: &Path, src: &Path, name: &str, mode: u32) -> std::path::PathBuf {
    let dst = dir.join(name);
    std::fs::copy(src, &dst).expect("copy binary");
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode)).expect("chmod");
    dst
}

#[test]
fn a_setuid_or_setgid_agent_refuses_to_start() {
    // Under target/ (not /tmp, which may be mounted nosuid).
    let base = agent_bin().parent().expect("bin dir").to_path_buf();
    let dir = tempfile::Builder::new().prefix("stepwise-setid-").tempdir_in(&base).expect("tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    for d in dir.path().ancestors().skip(1) {
        // Every parent must be searchable by nobody for the exec to reach the file.
        let m = std::fs::metadata(d).expect("stat parent").mode();
        assert!(m & 0o001 != 0, "{} is not searchable by others (mode {m:o}): nobody cannot reach the copy", d.display());
    }

    // The s-bit must really take effect here, or the test proves nothing: `id` made setuid
    // root must report effective uid 0 when run as nobody.
    let id = copy_with_mode(dir.path(), Path::new("/usr/bin/id"), "id", 0o4755);
    let out = as_nobody(&id, &["-u"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "setuid is not honoured on {} (nosuid mount?): {out:?}", dir.path().display());
    let out = as_nobody(&id, &["-ru"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), NOBODY);

    // Control: the same copy without s-bits runs as nobody (clap answers --version).
    let plain = copy_with_mode(dir.path(), &agent_bin(), "agent-plain", 0o755);
    let out = as_nobody(&plain, &["--version"]);
    assert!(out.status.success(), "the agent runs as nobody without s-bits: {out:?}");

    let setuid = copy_with_mode(dir.path(), &agent_bin(), "agent-setuid", 0o4755);
    for args in [&["--version"][..], &["check", "--json"], &["run", "--print-default-config"]] {
        let out = as_nobody(&setuid, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "setuid agent {args:?} must refuse: {out:?}");
        assert!(err.contains("refusing to run set-user-ID") && err.contains("real uid 65534, effective uid 0") && err.contains("chmod u-s"), "{err}");
        assert!(out.stdout.is_empty(), "nothing else ran: {}", String::from_utf8_lossy(&out.stdout));
    }

    let setgid = copy_with_mode(dir.path(), &agent_bin(), "agent-setgid", 0o2755);
    assert_eq!(std::fs::metadata(&setgid).expect("stat").gid(), 0, "the copy's group is root's");
    let out = as_nobody(&setgid, &["--version"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(err.contains("refusing to run set-group-ID") && err.contains("real gid 65534, effective gid 0"), "{err}");
}

fn config(dir: &Path, api: &str) -> String {
    let p = dir.join(format!("agent-{}.toml", api.len()));
    std::fs::write(&p, format!("[sources]\nrdma = false\nethtool = false\n[collectives]\nenabled = false\n{api}")).expect("config");
    p.display().to_string()
}

const MARKER: &str = r#"{"rank":0,"step":1,"phase":"begin"}"#;

#[test]
fn the_tcp_api_is_read_only_by_default_and_token_protected_when_enabled() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("m.sock");
    let cfg = config(dir.path(), "");
    let agent = Agent::start(dir.path(), &["--config", &cfg, "--marker-socket", sock.to_str().expect("utf8")]).expect("agent");

    // The Unix socket is there, 0660, and works.
    let mode = std::fs::metadata(&sock).expect("marker socket exists").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "marker socket mode {mode:o}");
    std::os::unix::net::UnixDatagram::unbound().expect("socket").send_to(MARKER.as_bytes(), &sock).expect("send");

    // Default: every write over TCP is 403 with a message that says where markers go,
    // whatever the headers, and before the body is read (an oversized one too).
    for auth in [&[][..], &[("Authorization", "Bearer anything-at-all-0123")][..]] {
        let r = http_request_with(&agent.addr, "POST", "/api/v1/markers", auth, Some(MARKER)).expect("post");
        assert_eq!(r.status, 403, "{r:?}");
        assert!(r.body.contains("Unix socket") && r.body.contains("markers_over_tcp"), "{}", r.body);
    }
    let big = "x".repeat(1 << 20);
    assert_eq!(http_request_with(&agent.addr, "POST", "/api/v1/markers", &[], Some(&big)).expect("post big").status, 403);
    let out = Command::new(agent_bin()).args(["mark", "--rank", "0", "--step", "1", "--phase", "end", "--agent", &agent.addr]).output().expect("mark");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("403"), "{out:?}");
    // Reads still work, and only the socket's marker arrived.
    std::thread::sleep(Duration::from_millis(300));
    let m: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/markers").expect("markers").body).expect("json");
    assert_eq!(m["markers"].as_array().map(Vec::len), Some(1), "{m}");
    assert_eq!(sample(&agent.metrics().expect("metrics"), "stepwise_markers_total", &[]), Some(1.0));
    drop(agent);

    // Enabled with a token from a file (mode 0600): 401 without it or with a wrong one.
    let token = "lp-test-token-0123456789abcdef";
    let tf = dir.path().join("token");
    std::fs::write(&tf, format!("{token}\n")).expect("token file");
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o600)).expect("chmod token");
    let cfg = config(dir.path(), &format!("[api]\nmarkers_over_tcp = true\ntoken_file = \"{}\"\n", tf.display()));
    let agent = Agent::start(dir.path(), &["--config", &cfg, "--marker-socket", sock.to_str().expect("utf8")]).expect("agent with token");
    let bearer = format!("Bearer {token}");
    for (auth, want) in [
        (vec![], 401),
        (vec![("Authorization", "Bearer lp-test-token-0123456789abcdeX")], 401),
        (vec![("Authorization", "Basic bHA6dGVzdA==")], 401),
        (vec![("Authorization", token)], 401),
        (vec![("Authorization", bearer.as_str())], 200),
        (vec![("Authorization", "bearer lp-test-token-0123456789abcdef")], 200),
    ] {
        let r = http_request_with(&agent.addr, "POST", "/api/v1/markers", &auth, Some(MARKER)).expect("post");
        assert_eq!(r.status, want, "{auth:?}: {r:?}");
        if want == 401 {
            assert!(r.headers.to_ascii_lowercase().contains("www-authenticate: bearer") && r.body.contains("bearer token"), "{r:?}");
            assert!(!r.body.contains(token), "the token is never echoed");
        }
    }
    // agent mark: --token, then STEPWISE_TOKEN; a wrong token fails with the agent's message.
    let mark = |env: Option<&str>, flag: Option<&str>| {
        let mut c = Command::new(agent_bin());
        c.args(["mark", "--rank", "1", "--step", "2", "--phase", "end", "--agent", &agent.addr]).env_remove("STEPWISE_TOKEN");
        if let Some(t) = flag {
            c.args(["--token", t]);
        }
        if let Some(t) = env {
            c.env("STEPWISE_TOKEN", t);
        }
        c.output().expect("agent mark")
    };
    assert!(mark(None, Some(token)).status.success());
    assert!(mark(Some(token), None).status.success());
    let bad = mark(Some("not-the-token-0123456789"), None);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("401"), "{bad:?}");
    assert!(!mark(None, None).status.success());
    // Nothing shows the token: status, metrics, the log.
    let status = agent.get("/api/v1/status").expect("status").body;
    assert!(!status.contains(token) && !agent.metrics().expect("metrics").contains(token));
    assert!(!agent.proc.log_text().contains(token), "the token is not logged");
    // --help never prints an exported STEPWISE_TOKEN.
    let help = Command::new(agent_bin()).args(["mark", "--help"]).env("STEPWISE_TOKEN", token).output().expect("help");
    assert!(String::from_utf8_lossy(&help.stdout).contains("STEPWISE_TOKEN") && !String::from_utf8_lossy(&help.stdout).contains(token));

    // Misconfigurations are refused at start, naming the key, without echoing the token.
    for (api, key) in [("[api]\nmarkers_over_tcp = true\n", "api.markers_over_tcp"), ("[api]\nmarkers_over_tcp = true\ntoken = \"short-tok\"\n", "api.token")] {
        let cfg = config(dir.path(), api);
        let out = Command::new(agent_bin()).args(["run", "--config", &cfg, "--listen", "127.0.0.1:0"]).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(key) && !err.contains("short-tok"), "{err}");
    }
}
