//! Step markers reach the agent three ways (Unix socket, `agent mark`, HTTP POST — enabled
//! explicitly, with a token); malformed markers are refused with a clear error and counted.

use std::{path::Path, process::Command, time::Duration};

use stepwise_tests::harness::{agent_bin, http_request_with, sample, Agent};

/// The `[api] token` of this test's agent.
const TOKEN: &str = "markers-test-token-0123456789";
const AUTH: [(&str, &str); 1] = [("Authorization", "Bearer markers-test-token-0123456789")];

fn http_request(addr: &str, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<stepwise_tests::harness::HttpResponse> {
    http_request_with(addr, method, path, &AUTH, body)
}

fn markers(agent: &Agent) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/markers").expect("markers").body).expect("json");
    v["markers"].as_array().cloned().expect("markers array")
}

fn config(dir: &Path) -> String {
    let p = dir.join("agent.toml");
    std::fs::write(
        &p,
        format!("[sources]\nrdma = false\nethtool = false\n[collectives]\nenabled = false\n[api]\nmarkers_over_tcp = true\ntoken = \"{TOKEN}\"\n"),
    )
    .expect("config");
    p.display().to_string()
}

#[test]
fn markers_arrive_by_socket_by_agent_mark_and_by_http() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("m.sock");
    let cfg = config(dir.path());
    let agent = Agent::start(dir.path(), &["--config", &cfg, "--marker-socket", sock.to_str().expect("utf8")]).expect("agent");

    // 1. Raw one-line JSON datagram, as a training script sends it.
    let s = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    s.send_to(br#"{"rank":0,"step":1,"phase":"begin"}"#, &sock).expect("send");
    // 2. agent mark over the socket and over HTTP.
    let st = Command::new(agent_bin())
        .args(["mark", "--rank", "1", "--step", "1", "--phase", "begin", "--socket", sock.to_str().expect("utf8")])
        .status()
        .expect("mark");
    assert!(st.success());
    let st = Command::new(agent_bin())
        .args(["mark", "--rank", "0", "--step", "1", "--phase", "end", "--agent", &agent.addr])
        .env("STEPWISE_TOKEN", TOKEN)
        .status()
        .expect("mark http");
    assert!(st.success());
    // 3. HTTP POST of an array.
    let r = http_request(&agent.addr, "POST", "/api/v1/markers", Some(r#"[{"rank":1,"step":1,"phase":"end","time":1764500000.5}]"#)).expect("post");
    assert_eq!(r.status, 200, "{r:?}");
    std::thread::sleep(Duration::from_millis(300));
    let ms = markers(&agent);
    assert_eq!(ms.len(), 4, "{ms:?}");
    assert!(ms.iter().any(|m| m["rank"] == 1 && m["phase"] == "end" && m["time"] == 1764500000.5));
    assert!(ms.iter().all(|m| m["host"].is_string() && m["time"].as_f64().is_some_and(|t| t > 1.7e9)));

    // Malformed input: clear 400, counted, nothing stored, agent healthy.
    for bad in [r#"{"rank":0,"step":1,"phase":"middle"}"#, "not json", r#"{"rank":0}"#, "[1,2]"] {
        let r = http_request(&agent.addr, "POST", "/api/v1/markers", Some(bad)).expect("post");
        assert_eq!(r.status, 400, "{bad}: {r:?}");
        assert!(!r.body.is_empty());
    }
    s.send_to(b"garbage", &sock).expect("send garbage");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(markers(&agent).len(), 4);
    let m = agent.metrics().expect("metrics");
    assert!(sample(&m, "stepwise_marker_errors_total", &[]).unwrap_or(0.0) >= 5.0, "{m}");
    assert_eq!(sample(&m, "stepwise_markers_total", &[]), Some(4.0));
    // An oversized body is refused without being read whole.
    let big = format!("[{}]", vec![r#"{"rank":0,"step":1,"phase":"begin"}"#; 4000].join(","));
    let r = http_request(&agent.addr, "POST", "/api/v1/markers", Some(&big)).expect("post big");
    assert_eq!(r.status, 413, "{}", r.status);
    assert_eq!(agent.get("/healthz").expect("healthz").status, 200);
    // agent mark to a socket nobody listens on: a clear error, non-zero exit.
    let out =
        Command::new(agent_bin()).args(["mark", "--rank", "0", "--step", "1", "--phase", "begin", "--socket", "/nonexistent/m.sock"]).output().expect("mark");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/m.sock"));
}

/// A marker's time is when the training process sent it (the kernel stamps the datagram), not
/// when the agent got round to reading it: an agent stopped for half a second — a stand-in for
/// one starved of CPU or busy attributing — still places the marker where it was sent.
#[test]
fn socket_markers_keep_their_send_time_when_the_agent_reads_them_late() {
    let dir = tempfile::tempdir().expect("tmp");
    let sock = dir.path().join("m.sock");
    let cfg = config(dir.path());
    let agent = Agent::start(dir.path(), &["--config", &cfg, "--marker-socket", sock.to_str().expect("utf8")]).expect("agent");
    let wall = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let pid = agent.proc.pid() as libc::pid_t;
    let s = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    // SAFETY: signals to the test's own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let sent = wall();
    s.send_to(br#"{"rank":0,"step":5,"phase":"begin"}"#, &sock).expect("send");
    std::thread::sleep(Duration::from_millis(500));
    let resumed = wall();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    std::thread::sleep(Duration::from_millis(300));
    let ms = markers(&agent);
    assert_eq!(ms.len(), 1, "{ms:?}");
    let t = ms[0]["time"].as_f64().expect("time");
    assert!(t >= sent - 0.01 && t < sent + 0.1 && t < resumed - 0.3, "stamped {t:.3}: sent {sent:.3}, read after {resumed:.3}");
}
