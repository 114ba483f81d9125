//! Data hygiene (issue 7): secrets in a traced job's environment appear nowhere the agent
//! writes. A real 4-rank OpenMPI job runs with credential-looking variables (some under
//! allowlisted prefixes: `NCCL_API_TOKEN`, `OMPI_COMM_WORLD_SECRET`) while the agent (eBPF
//! probes, debug log, history store, a token-protected TCP API) attributes its steps; then
//! every output is searched for every secret: `/metrics`, every `/api/v1/*` endpoint, the
//! SQLite file with its WAL, the agent's log and `agent diagnose --json`/`--html`.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use stepwise_tests::{
    harness::{agent_bin, workspace_root, Agent},
    netns::Netns,
    workloads,
};

/// Every `/proc/<pid>` whose command line runs the `mpi_steps` workload binary.
fn workload_pids() -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmd.split(|b| *b == 0).next().is_some_and(|argv0| argv0.ends_with(b"build/mpi_steps"))
        })
        .collect()
}

#[test]
fn secrets_in_a_traced_jobs_environment_appear_nowhere() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-secrets-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let nonce = format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff_ffff);
    let secrets: Vec<(String, String)> = [
        ("NCCL_API_TOKEN", "nccl"),
        ("AWS_SECRET_ACCESS_KEY", "aws"),
        ("MY_PASSWORD", "pw"),
        ("OMPI_COMM_WORLD_SECRET", "ompi"),
        ("UCX_PRIVATE_KEY", "ucx"),
        ("HF_TOKEN", "hf"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), format!("s3cr3t-{v}-{nonce}")))
    .collect();
    let api_token = format!("api-token-{nonce}-0123456789");

    let sock = dir.path().join("markers.sock");
    let db = dir.path().join("agent.db");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives.select]\nnetns = \"/run/netns/{}\"\n[steps]\nmarker_socket = \"{}\"\n[api]\nmarkers_over_tcp = true\ntoken = \"{api_token}\"\n",
            ns.name(),
            sock.display()
        ),
    )
    .expect("config");
    let agent =
        Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8"), "--db", db.to_str().expect("utf8"), "--log", "debug"]).expect("agent starts");

    // The job, as `workloads::mpi_steps` runs it, plus the secrets (exported to every rank).
    let bin = workspace_root().join("tests/workloads/build/mpi_steps");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name(), "env", "STEPS_COMPUTE=sleep"]);
    for (k, v) in &secrets {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.args(["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "mpi_yield_when_idle", "1", "-x", "STEPS_COMPUTE"]);
    for (k, _) in &secrets {
        cmd.args(["-x", k]);
    }
    cmd.args(["-np", "4"]).arg(&bin);
    cmd.args([
        "--steps",
        "25",
        "--bytes",
        "1048576",
        "--compute-us",
        "20000",
        "--delay-rank",
        "2",
        "--delay-us",
        "30000",
        "--delay-every",
        "5",
        "--marker-socket",
        sock.to_str().expect("utf8"),
    ]);
    let mut job = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("mpirun");
    // Planting check: while the job runs, every secret is in the traced ranks' environment.
    let mut planted = 0;
    let end = Instant::now() + Duration::from_secs(60);
    while planted == 0 && Instant::now() < end && job.try_wait().expect("wait").is_none() {
        for pid in workload_pids() {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let has = |s: &str| env.windows(s.len()).any(|w| w == s.as_bytes());
            if secrets.iter().all(|(k, v)| has(&format!("{k}={v}"))) {
                planted += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = job.wait_with_output().expect("job");
    assert!(out.status.success(), "job failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(planted > 0, "no traced rank had the secrets in its environment: the test would prove nothing");
    std::thread::sleep(Duration::from_millis(2500));

    // The agent did its work on this job: calls probed, steps attributed and stored, and it
    // read the ranks' environment (the allowlisted part: rank, size, job).
    let calls = agent.get("/api/v1/collectives?limit=100000").expect("collectives").body;
    assert!(calls.contains("all_reduce"), "the job's calls were probed: {}", &calls[..calls.len().min(300)]);
    let steps = agent.get("/api/v1/steps?limit=1000").expect("steps").body;
    assert!(steps.contains("readiness_skew"), "steps attributed: {}", &steps[..steps.len().min(300)]);
    let log = agent.proc.log_text();
    assert!(
        log.lines().any(|l| l.contains("process facts") && !l.contains("env=0")),
        "the agent read the ranks' environment (debug log):\n{}",
        &log[log.len().saturating_sub(3000)..]
    );

    let mut haystacks: Vec<(String, Vec<u8>)> = Vec::new();
    for path in [
        "/metrics",
        "/healthz",
        "/readyz",
        "/api/v1/status",
        "/api/v1/topology",
        "/api/v1/collectives?limit=100000",
        "/api/v1/steps?limit=1000",
        "/api/v1/markers",
        "/api/v1/windows",
    ] {
        let r = agent.get(path).expect(path);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        haystacks.push((format!("GET {path}"), format!("{}\n{}", r.headers, r.body).into_bytes()));
    }
    let om =
        stepwise_tests::harness::http_request_with(&agent.addr, "GET", "/metrics", &[("Accept", "application/openmetrics-text")], None).expect("openmetrics");
    haystacks.push(("GET /metrics (OpenMetrics)".into(), om.body.into_bytes()));
    let diag = |args: &[&str]| {
        let o = Command::new(agent_bin()).arg("diagnose").args(args).output().expect("diagnose");
        assert!(o.status.success(), "diagnose {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        [o.stdout, o.stderr].concat()
    };
    let dj = diag(&["--json", "--db", db.to_str().expect("utf8"), "--since", "1h"]);
    assert!(String::from_utf8_lossy(&dj).contains("readiness_skew"), "diagnose --json found the steps");
    haystacks.push(("agent diagnose --json --db".into(), dj));
    haystacks.push(("agent diagnose --json --agent".into(), diag(&["--json", "--agent", &agent.addr])));
    let html = dir.path().join("report.html");
    diag(&["--html", html.to_str().expect("utf8"), "--db", db.to_str().expect("utf8"), "--since", "1h"]);
    haystacks.push(("agent diagnose --html".into(), std::fs::read(&html).expect("html report")));
    drop(agent); // SIGKILL: the WAL stays as a crash leaves it
    for suffix in ["", "-wal", "-shm"] {
        let p = dir.path().join(format!("agent.db{suffix}"));
        if let Ok(b) = std::fs::read(&p) {
            haystacks.push((p.display().to_string(), b));
        }
    }
    assert!(haystacks.iter().any(|(n, b)| n.ends_with("agent.db") && b.len() > 4096), "the store was written");
    let log = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| std::fs::read(e.path()).expect("log"))
        .collect::<Vec<_>>()
        .concat();
    assert!(!log.is_empty());
    haystacks.push(("agent log (debug)".into(), log));

    let mut needles: Vec<String> = secrets.iter().flat_map(|(k, v)| [v.clone(), k.clone()]).collect();
    needles.push(api_token);
    needles.push(nonce.clone());
    for (what, hay) in &haystacks {
        for n in &needles {
            assert!(!hay.windows(n.len()).any(|w| w == n.as_bytes()), "{n:?} leaked into {what}");
        }
    }
    eprintln!(
        "searched {} outputs ({} bytes) for {} needles: none found",
        haystacks.len(),
        haystacks.iter().map(|(_, b)| b.len()).sum::<usize>(),
        needles.len()
    );
}
