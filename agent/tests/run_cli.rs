//! `agent run` start-up through the built binary: a failure to start exits non-zero at once
//! (never waits on a background thread), and the log on a non-terminal stderr carries no
//! colour codes, or is one JSON object per line with `--log-format json`.
//!
//! Each run fails to start on purpose (its port is taken), so it needs no root and serves
//! nothing. Where the test has CAP_BPF or CAP_SYS_ADMIN (root) the collective probes are on,
//! as in production: their thread is what kept the agent from exiting.

mod common;
use common::agent_command;

use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

/// Whether this process may load eBPF programs (CapEff holds CAP_SYS_ADMIN or CAP_BPF).
fn can_load_ebpf() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).unwrap_or(0);
    caps & (1 << 21 | 1 << 39) != 0
}

/// A config that needs no root: no counter sources, no store; probes only where allowed.
fn config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("agent.toml");
    let text = format!(
        "[sources]\nrdma = false\nethtool = false\nnetdev = false\nqdisc = false\ntcp = false\n[store]\nenabled = false\n[collectives]\nenabled = {}\nprofiler_socket = \"{}\"\n",
        can_load_ebpf(),
        // Its own profiler socket: agents of tests running in parallel never share one.
        dir.join("profiler.sock").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Held by each test whose agent starts serving (and so attaches and later detaches probes):
/// one such agent at a time, as on a real host. Detaching perf-event uprobes is serialised in
/// the kernel across processes (about 0.1 s per link), so agents stopping together wait for
/// each other; a test's stop deadline is about its own agent.
fn one_serving_agent_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `agent run` with `args`, stdin and stdout closed, stderr to `err_path`.
fn spawn(args: &[&str], err_path: &Path) -> Child {
    agent_command()
        .arg("run")
        .args(args)
        .env_remove("STEPWISE_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err_path).expect("stderr file"))
        .spawn()
        .expect("spawn agent")
}

/// The exit code within `limit`; fails the test (after killing the agent) if it is still
/// running then.
fn exit_within(child: &mut Child, limit: Duration, what: &str, err_path: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s.code().unwrap_or(-1);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("agent run still running {limit:?} after {what} (killed); stderr:\n{}", std::fs::read_to_string(err_path).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls (every `poll`) until `err_path` holds `needle`, the child exits, or 20 s pass.
fn wait_for_line(child: &mut Child, err_path: &Path, needle: &str, poll: Duration) {
    let start = Instant::now();
    while !std::fs::read_to_string(err_path).unwrap_or_default().contains(needle)
        && start.elapsed() < Duration::from_secs(20)
        && child.try_wait().expect("wait").is_none()
    {
        std::thread::sleep(poll);
    }
}

/// Sends `sig` with kill(2) directly: a `kill` process takes milliseconds to start.
fn send(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child, which has not been waited for, so its pid is not reused.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "{}", std::io::Error::last_os_error());
}

/// Runs `agent run` on a port that is already taken, with `extra` flags; returns the exit
/// code and stderr. Fails the test if the agent is still running after `limit`.
fn run_on_taken_port(extra: &[&str], limit: Duration) -> (i32, String) {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = config(dir.path());
    let sock = dir.path().join("markers.sock");
    let err_path = dir.path().join("stderr");
    let mut args = vec!["--config", cfg.to_str().expect("utf8"), "--listen", &addr, "--marker-socket", sock.to_str().expect("utf8")];
    args.extend(extra);
    let mut child = spawn(&args, &err_path);
    let rc = exit_within(&mut child, limit, "start-up on a taken port", &err_path);
    drop(taken);
    (rc, std::fs::read_to_string(&err_path).expect("read stderr"))
}

/// Runs `agent run --listen 127.0.0.1:0` with `args` until it serves, then sends SIGTERM;
/// returns the exit code and stderr. Fails the test if it does not exit 15 s after.
fn serve_then_terminate(args: &[&str], err_path: &Path) -> (i32, String) {
    let mut all = vec!["--listen", "127.0.0.1:0"];
    all.extend(args);
    let mut child = spawn(&all, err_path);
    wait_for_line(&mut child, err_path, "serving /metrics", Duration::from_millis(50));
    send(&child, libc::SIGTERM);
    let rc = exit_within(&mut child, Duration::from_secs(15), "SIGTERM", err_path);
    (rc, std::fs::read_to_string(err_path).unwrap_or_default())
}

#[test]
fn a_taken_listen_port_exits_non_zero_at_once() {
    let (rc, err) = run_on_taken_port(&[], Duration::from_secs(10));
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("cannot listen on 127.0.0.1:") && err.contains("Address already in use"), "{err}");
}

#[test]
fn a_log_to_a_file_has_no_colour_codes() {
    let (rc, err) = run_on_taken_port(&[], Duration::from_secs(10));
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("ERROR") && err.contains("cannot listen"), "the log line is there: {err}");
    assert!(!err.contains("\x1b["), "ANSI escapes in a log that is not a terminal: {err:?}");
}

#[test]
fn json_log_format_is_one_object_per_line() {
    for how in [&["--log-format", "json"][..], &["--log-format=json"][..]] {
        let (rc, err) = run_on_taken_port(how, Duration::from_secs(10));
        assert_eq!(rc, 1, "{err}");
        let lines: Vec<serde_json::Value> =
            err.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON object ({e}): {l:?}\nin:\n{err}"))).collect();
        assert!(!lines.is_empty() && lines.iter().all(|v| v.is_object() && v["timestamp"].is_string()), "{err}");
        let fail = lines.iter().find(|v| v["level"] == "ERROR").unwrap_or_else(|| panic!("no ERROR line: {err}"));
        assert!(fail["message"].as_str().is_some_and(|m| m.contains("cannot listen")), "{fail}");
    }
}

#[test]
fn a_running_agent_logs_plain_or_json_lines_and_stops_on_sigterm() {
    let _serial = one_serving_agent_at_a_time();
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().expect("tmp");
        let cfg = config(dir.path());
        let sock = dir.path().join("markers.sock");
        let args = ["--config", cfg.to_str().expect("utf8"), "--marker-socket", sock.to_str().expect("utf8"), "--log-format", format];
        let (rc, err) = serve_then_terminate(&args, &dir.path().join("stderr"));
        assert_eq!(rc, 0, "{err}");
        assert!(err.contains("serving /metrics") && err.contains("shutting down"), "{err}");
        assert!(!err.contains('\x1b'), "escape codes in a log to a file: {err:?}");
        for line in err.lines() {
            let parsed = serde_json::from_str::<serde_json::Value>(line);
            assert_eq!(parsed.is_ok_and(|v| v.is_object()), format == "json", "{format}: {line:?}");
        }
    }
}

#[test]
fn an_unusable_marker_socket_or_store_is_logged_and_the_agent_still_serves_and_stops() {
    let _serial = one_serving_agent_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("file");
    // Both paths lie under a regular file: neither the socket nor the database can exist.
    let cfg = dir.path().join("agent.toml");
    let text = std::fs::read_to_string(config(dir.path())).expect("config").replace("[store]\nenabled = false\n", "");
    std::fs::write(&cfg, format!("{text}[store]\npath = \"{}\"\n", file.join("agent.db").display())).expect("config");
    let sock = file.join("markers.sock");
    let (rc, err) =
        serve_then_terminate(&["--config", cfg.to_str().expect("utf8"), "--marker-socket", sock.to_str().expect("utf8")], &dir.path().join("stderr"));
    assert_eq!(rc, 0, "{err}");
    assert!(err.contains("cannot bind the marker socket") && err.contains("running without history"), "both logged: {err}");
    assert!(err.contains("serving /metrics"), "{err}");
}

/// Starts `agent run` in `dir` and sends `sig` as soon as the first line is logged (the
/// profiler socket, bound before the probes, topology and store are set up).
fn signal_at_first_line(dir: &Path, sig: libc::c_int) -> (Child, std::path::PathBuf) {
    let cfg = config(dir);
    let sock = dir.join("markers.sock");
    let err_path = dir.join("stderr");
    let mut child = spawn(&["--config", cfg.to_str().expect("utf8"), "--listen", "127.0.0.1:0", "--marker-socket", sock.to_str().expect("utf8")], &err_path);
    wait_for_line(&mut child, &err_path, "listening for NCCL profiler plugin records", Duration::from_micros(100));
    send(&child, sig);
    (child, err_path)
}

#[test]
fn a_sigterm_during_start_up_is_a_clean_stop() {
    let _serial = one_serving_agent_at_a_time();
    // The start finishes and the agent stops cleanly, exit 0, rather than dying of the
    // signal's default action (which CI once caught: SIGTERM sent after "serving" arrived
    // before the handler was installed).
    let dir = tempfile::tempdir().expect("tmp");
    let (mut child, err_path) = signal_at_first_line(dir.path(), libc::SIGTERM);
    let rc = exit_within(&mut child, Duration::from_secs(15), "SIGTERM during start-up", &err_path);
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert_eq!(rc, 0, "killed by the signal instead of stopping: {err}");
    assert!(err.contains("shutting down"), "{err}");
}

#[test]
fn a_sighup_during_start_up_reloads_instead_of_killing() {
    let _serial = one_serving_agent_at_a_time();
    // SIGHUP's default action is to terminate: before its handler existed it killed a
    // starting agent. Now it is kept and reloads the config once the reload task runs.
    let dir = tempfile::tempdir().expect("tmp");
    let (mut child, err_path) = signal_at_first_line(dir.path(), libc::SIGHUP);
    let log = || std::fs::read_to_string(&err_path).unwrap_or_default();
    wait_for_line(&mut child, &err_path, "configuration reloaded", Duration::from_millis(20));
    assert!(child.try_wait().expect("wait").is_none(), "the agent died of SIGHUP: {}", log());
    assert!(log().contains("configuration reloaded"), "{}", log());
    send(&child, libc::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(15), "SIGTERM", &err_path), 0, "{}", log());
}

#[test]
fn a_config_refused_with_a_json_log_is_a_json_line_too() {
    let out = agent_command().args(["run", "--log-format", "json", "--config", "/nonexistent/stepwise.toml"]).output().expect("run agent");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = err.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"))).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert_eq!(lines[0]["level"], "ERROR");
    assert!(lines[0]["message"].as_str().is_some_and(|m| m.contains("cannot read config file /nonexistent/stepwise.toml")), "{err}");
    // Text (the default): the plain line, as before.
    let out = agent_command().args(["run", "--config", "/nonexistent/stepwise.toml"]).env_remove("STEPWISE_LOG_FORMAT").output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("agent: cannot read config file"), "{out:?}");
}

#[test]
fn an_unknown_log_format_is_a_usage_error() {
    let out = agent_command().args(["run", "--log-format", "xml"]).output().expect("run agent");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xml") && err.contains("json") && err.contains("text"), "{err}");
}
