//! Kubernetes identity of traced processes on real cgroups: a 2-rank OpenMPI job is started
//! inside a cgroup named as the kubelet's cgroupfs driver names a container's
//! (`/kubepods/besteffort/pod<uid>/<container id>`, in the `pids` hierarchy), and the pod's
//! log directory (`<namespace>_<name>_<uid>`) exists where `[collectives] pod_logs` points.
//! `stepwise_rank_info` must name each rank with its local rank, pod, namespace and
//! container, and lose the series once the job's processes are gone; the per-rank series
//! carry the local rank, pod and namespace too, and keep them.

use std::time::Duration;

use stepwise_tests::{
    harness::{samples, wait_for, Agent},
    kubepods::PodCgroup,
    netns::Netns,
    workloads,
};

fn rank_info(agent: &Agent) -> Vec<String> {
    samples(&agent.metrics().unwrap_or_default(), "stepwise_rank_info").into_iter().filter(|(_, v)| *v == 1.0).map(|(l, _)| l).collect()
}

#[test]
fn traced_ranks_carry_their_pod_namespace_and_container_and_vanish_with_the_job() {
    workloads::build().expect("workloads build");
    let dir = tempfile::Builder::new().prefix("stepwise-k8s-").tempdir().expect("tmp");
    let ns = Netns::new().expect("netns (needs root and iproute2)");
    let cg = PodCgroup::new(dir.path(), "training", "llama-worker-0").expect("the pod's cgroup");
    let pods = &cg.pod_logs;

    let cfg = dir.path().join("agent.toml");
    let text = format!(
        "interval = \"100ms\"\n[sources]\nrdma = false\nethtool = false\n[collectives]\nrescan = \"200ms\"\npod_logs = \"{}\"\n[collectives.select]\nnetns = \"/run/netns/{}\"\n",
        pods.display(),
        ns.name()
    );
    std::fs::write(&cfg, text).expect("config");
    let agent = Agent::start(dir.path(), &["--config", cfg.to_str().expect("utf8")]).expect("agent starts");

    // mpirun and its ranks are born inside the container's cgroup.
    let mut cmd = workloads::mpi_steps(ns.name(), 2, &["--steps", "60", "--compute-us", "50000"]);
    let procs = cg.enter(&mut cmd).expect("join the cgroup");
    let child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().expect("mpirun");
    drop(procs);

    let container = &cg.container;
    let ours = |l: &String| l.contains(&format!("container_id=\"{container}\""));
    let seen = wait_for(Duration::from_secs(30), "both ranks in stepwise_rank_info", || {
        let v: Vec<String> = rank_info(&agent).into_iter().filter(ours).collect();
        (v.iter().filter(|l| l.contains("rank=\"0\"") || l.contains("rank=\"1\"")).count() >= 2).then_some(v)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", rank_info(&agent), agent.proc.log_text()));
    for r in ["0", "1"] {
        let l = seen
            .iter()
            .find(|l| l.contains(&format!(",rank=\"{r}\"")) || l.starts_with(&format!("rank=\"{r}\"")))
            .unwrap_or_else(|| panic!("rank {r}: {seen:?}"));
        assert!(l.contains(&format!("local_rank=\"{r}\"")), "local rank from OMPI_COMM_WORLD_LOCAL_RANK: {l}");
        assert!(
            l.contains("k8s_pod_name=\"llama-worker-0\"") && l.contains("k8s_namespace_name=\"training\""),
            "pod and namespace from the log directory: {l}"
        );
    }
    assert!(seen.iter().all(|l| !l.contains("coredns")), "another pod's name never leaks in: {seen:?}");
    // What `diagnose --hang` names a missing rank by: its pod, in /api/v1/open.
    let pods_open = || -> Option<Vec<String>> {
        let v: serde_json::Value = serde_json::from_str(&agent.get("/api/v1/open").ok()?.body).ok()?;
        let ranks = v["comms"].as_array()?.iter().flat_map(|c| c["ranks"].as_array().cloned().unwrap_or_default());
        Some(ranks.filter_map(|r| r["state"]["pod"].as_str().map(String::from)).collect())
    };
    wait_for(Duration::from_secs(20), "both ranks' pod in /api/v1/open", || {
        pods_open().filter(|p| p.iter().filter(|x| *x == "training/llama-worker-0").count() >= 2)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", pods_open()));

    let out = child.wait_with_output().expect("job");
    assert!(out.status.success(), "job: {}", String::from_utf8_lossy(&out.stderr));
    // The per-rank series carry the same identity (the dashboards' namespace, pod and local
    // rank filters), and keep it after the processes are gone.
    let per_rank = || samples(&agent.metrics().unwrap_or_default(), "stepwise_rank_wait_seconds_total").into_iter().map(|(l, _)| l).collect::<Vec<_>>();
    let labelled = wait_for(Duration::from_secs(30), "per-rank series with the pod's identity", || {
        let v: Vec<String> = per_rank().into_iter().filter(|l| l.contains("k8s_pod_name=\"llama-worker-0\"")).collect();
        (v.len() >= 2).then_some(v)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", per_rank(), agent.proc.log_text()));
    for r in ["0", "1"] {
        let l = labelled.iter().find(|l| l.starts_with(&format!("rank=\"{r}\","))).unwrap_or_else(|| panic!("rank {r}: {labelled:?}"));
        assert!(l.contains(&format!("local_rank=\"{r}\"")) && l.contains("k8s_namespace_name=\"training\""), "rank {r}: {l}");
    }
    // Exited processes are forgotten once the probe consumer's watermark passes (30 s at most).
    wait_for(Duration::from_secs(45), "the job's series removed", || rank_info(&agent).iter().all(|l| !ours(l)).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {:?}", rank_info(&agent)));
}
