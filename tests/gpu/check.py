#!/usr/bin/env python3
"""GPU check of the Stepwise NCCL profiler plugin and agent, for a lent GPU machine (never CI).

Two ranks of PyTorch's real NCCL on one GPU: NCCL refuses two ranks on one device of one host
("Duplicate GPU detected"), so each rank gets its own NCCL_HOSTID; NCCL then sees two hosts
and connects them over its socket transport on loopback (real proxy thread, real network
steps, real kernels). Both ranks' kernels read the same GPU global timer, so their GPU start
times compare without any clock offset. The two processes time-slice the GPU.

Job 1, with the plugin. Each step: 20 ms of GPU "compute" (torch.cuda._sleep) on both ranks,
then one all-reduce of 16 MiB bracketed by CUDA events, step markers sent to the agent:
  healthy   both on time;
  gpu_late  rank 1's GPU runs 30 ms more compute while its CPU enqueues on time;
  cpu_late  rank 1's CPU sleeps 10 ms before the all-reduce, its GPU still busy (not late);
then a hang: rank 1 stays away for 8 s from one more all-reduce that rank 0 entered.
Job 2, without the plugin: gpu_late steps only (step ids from 100).
Job 3, with the plugin: an all-reduce captured into a CUDA graph and replayed each step, rank
1's GPU late (step ids from 200; tests/gpu/graph.py).
Job 4 (with --chain): job 1's steps without the hang, a second plugin chained behind the
plugin (STEPWISE_PROFILER_CHAIN; tests/gpu/chain.py).

The truth that does not come from the plugin: rank 0's CUDA events around its all-reduce
(it waits inside for rank 1's data), and the host's own enqueue times. The script receives
the plugin's datagrams itself and forwards each one to the agent, then asks the agent
(diagnose, diagnose --hang, /api/v1/status). Prints one JSON summary (also
OUT/gpu-check.json); exit 1 on a failed check.

Usage: python3 tests/gpu/check.py --plugin libnccl_profiler.so [--agent BIN] [--chain SO] [--out DIR]
"""
import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import chain
import graph
import ras

HEADER = struct.Struct("<IHHHHIIIQQQ16s")  # 64 bytes (docs/profiler-plugin.md)
RECORD = struct.Struct("<QQiiQQQQQqQ6Q")  # the first 128 bytes of a record
MAGIC, FLAG_STARTED, ALLREDUCE = 0x46505753, 8, 1
PHASES = ("healthy", "gpu_late", "cpu_late")
COMPUTE_MS, GPU_LATE_MS, CPU_LATE_MS, HANG_S = 20.0, 30.0, 10.0, 8.0
NOPLUGIN_BASE = 100
API = "127.0.0.1:19477"
BYTES = 16 << 20


def decode(b):
    magic, version, hbytes, rbytes, n, pid, nccl, mask, full, unsent, _sent, gpu = HEADER.unpack_from(b)
    if magic != MAGIC or version != 1 or hbytes + n * rbytes != len(b):
        raise ValueError(f"bad datagram: magic {magic:#x} version {version} sizes {hbytes}+{n}x{rbytes} != {len(b)}")
    gpu = gpu.split(b"\0")[0].decode() if hbytes >= 64 else ""
    recs = []
    for i in range(n):
        at = hbytes + i * rbytes
        f = RECORD.unpack_from(b, at)
        recs.append({"pid": pid, "comm": f[0], "seq": f[1], "rank": f[2], "nranks": f[3], "bytes": f[4], "enqueue_ns": f[6],
                     "gpu_start": f[7], "gpu_end": f[8], "offset": f[9], "offset_error": f[10], "proxy_wait_ns": list(f[11:17]),
                     "func": b[at + 128], "flags": b[at + 134]})
    return {"pid": pid, "nccl_version": nccl, "mask": mask, "gpu": gpu, "drops": full + unsent}, recs


def receive(sock, into, stop, forward):
    sock.settimeout(0.2)
    fwd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if forward else None
    while not stop.is_set():
        try:
            b = sock.recv(65536)
        except socket.timeout:
            continue
        into.append(decode(b))
        if fwd:
            try:
                fwd.sendto(b, forward)
            except OSError:
                pass


def mark(sock, path, rank, step, phase):
    if path:
        try:
            sock.sendto(json.dumps({"rank": rank, "step": step, "phase": phase}).encode(), path)
        except OSError:
            pass


def per_ms_of(torch):
    """Calibrates torch.cuda._sleep: cycles per ms."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(100_000_000)
    e1.record()
    torch.cuda.synchronize()
    return 100_000_000 / e0.elapsed_time(e1)


def rank_main(a):
    """One rank: runs the steps, writes its CUDA-event and host timings to a.result."""
    if a.job == "graph":
        return graph.rank_main(a, per_ms_of, mark, BYTES, COMPUTE_MS, GPU_LATE_MS)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=a.rank, world_size=2, device_id=torch.device("cuda", 0))
    x = torch.ones(BYTES // 4, device="cuda")
    per_ms = per_ms_of(torch)
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    msock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    plan = [("gpu_late", NOPLUGIN_BASE + i) for i in range(a.steps)] if a.job == "noplugin" else [(PHASES[i // a.steps], i) for i in range(a.steps * len(PHASES))]
    events, host = [], []
    for phase, step in plan:
        mark(msock, a.markers, a.rank, step, "begin")
        torch.cuda._sleep(int(COMPUTE_MS * per_ms))
        if phase == "gpu_late" and a.rank == 1:
            torch.cuda._sleep(int(GPU_LATE_MS * per_ms))
        if phase == "cpu_late" and a.rank == 1:
            time.sleep(CPU_LATE_MS / 1e3)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        t = time.time_ns()
        dist.all_reduce(x)
        r = time.time_ns()
        e.record()
        torch.cuda.synchronize()
        mark(msock, a.markers, a.rank, step, "end")
        events.append((s, e))
        host.append({"step": step, "phase": phase, "enqueue_ns": t, "return_ns": r})
    for h, (s, e) in zip(host, events):
        h["cuda_event_ms"] = s.elapsed_time(e)
    if a.hang_flag:
        # Rank 0 enters one more all-reduce; rank 1 stays away for HANG_S.
        if a.rank == 0:
            open(a.hang_flag, "w").close()
        else:
            time.sleep(HANG_S)
        dist.all_reduce(x)
        torch.cuda.synchronize()
    dist.destroy_process_group()
    with open(a.result, "w") as f:
        json.dump({"rank": a.rank, "pid": os.getpid(), "sleep_cycles_per_ms": per_ms, "steps": host,
                   "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}, f)


def device_bus():
    out = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"], capture_output=True, text=True).stdout
    dom, bus, rest = out.strip().lower().split(":")
    return f"{int(dom, 16):04x}:{bus}:{rest}"


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def start_agent(a, tmp):
    paths = {k: os.path.join(tmp, k) for k in ("agent.sock", "markers.sock", "agent.db", "agent.log", "agent.toml")}
    with open(paths["agent.toml"], "w") as f:
        f.write('[steps]\ngrace = "500ms"\n\n[hang]\nfloor = "2s"\nk = 3.0\n\n[collectives]\nras_every = "1s"\n')
    check = subprocess.run([a.agent, "check"], capture_output=True, text=True, timeout=60)
    with open(os.path.join(a.out, "agent-check.txt"), "w") as f:
        f.write(check.stdout + check.stderr)
    log = open(paths["agent.log"], "w")
    p = subprocess.Popen([a.agent, "run", "--config", paths["agent.toml"], "--listen", API, "--db", paths["agent.db"],
                          "--marker-socket", paths["markers.sock"], "--profiler-socket", paths["agent.sock"], "--interval", "100ms"],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        if os.path.exists(paths["markers.sock"]) or p.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    return p, paths


def run_ranks(a, tmp, job, prof_sock, markers, hang=None):
    """Both ranks of one job; with `hang`, calls it (in this thread) once rank 0 entered the hung call."""
    env = dict(os.environ, STEPWISE_PROFILER_SOCKET=prof_sock, MASTER_ADDR="127.0.0.1", MASTER_PORT=str({"plugin": 29517, "noplugin": 29518, "chain": 29520}.get(job, 29519)),
               NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo", NCCL_DEBUG="INFO",
               NCCL_DEBUG_SUBSYS="INIT,ENV,NET,PROFILE", PYTHONUNBUFFERED="1", STEPWISE_PROFILER_EVENTS="coll,kernel,proxy")
    if job == "chain":
        env.update(chain.env(a, tmp))
    if job != "noplugin":
        env["NCCL_PROFILER_PLUGIN"] = os.path.abspath(a.plugin)
    else:
        env.pop("NCCL_PROFILER_PLUGIN", None)
    flag = os.path.join(tmp, f"{job}-hang") if hang else None
    procs = []
    for r in range(2):
        e = dict(env, NCCL_HOSTID=f"stepwise-gpu-check-{r}", NCCL_DEBUG_FILE=os.path.join(tmp, f"nccl-{job}-{r}.log"))
        cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--job", job, "--steps", str(a.steps), "--result",
               os.path.join(tmp, f"{job}-rank{r}.json"), "--plugin", a.plugin] + (["--markers", markers] if markers else []) + (["--hang-flag", flag] if flag else [])
        procs.append(subprocess.Popen(cmd, env=e, stdout=open(os.path.join(tmp, f"{job}-rank{r}.out"), "w"), stderr=subprocess.STDOUT))
    deadline = time.time() + a.timeout
    hung = None
    if flag:
        while time.time() < deadline and not os.path.exists(flag) and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        if os.path.exists(flag):
            time.sleep(HANG_S / 2)
            hung = hang()
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
    ranks = []
    for r in range(2):
        try:
            with open(os.path.join(tmp, f"{job}-rank{r}.json")) as f:
                ranks.append(json.load(f))
        except (OSError, ValueError):
            pass
    return [p.returncode for p in procs], ranks, hung


def phase_median(rk, ph, f):
    return median([f(h) for h in rk["steps"] if h["phase"] == ph])


def compare(ranks, recs):
    """Per rank: its steps' all-reduce records against the CUDA events; per phase: rank 1 - rank 0 GPU starts."""
    out, by_rank = {}, {}
    for rk in ranks:
        big = sorted((r for r in recs if r["pid"] == rk["pid"] and r["func"] == ALLREDUCE and r["flags"] & FLAG_STARTED == 0 and r["bytes"] == BYTES), key=lambda r: r["seq"])
        # The warm-up's 5 all-reduces come first (the barrier's is 4 bytes); the hang's last
        # one comes after the steps.
        mine = big[5:5 + len(rk["steps"])]
        by_rank[rk["rank"]] = mine
        ratios = [((r["gpu_end"] - r["gpu_start"]) / 1e6) / h["cuda_event_ms"] for r, h in zip(mine, rk["steps"]) if r["gpu_start"] and r["gpu_end"] and h["cuda_event_ms"] > 0]
        out[f"rank{rk['rank']}"] = {
            "records": len(mine),
            "gpu_timed": sum(1 for r in mine if r["gpu_start"] and r["gpu_end"]),
            "allreduces_of_16MiB": len(big),
            "gpu_over_cuda_event_median": median(ratios),
            "gpu_vs_cuda_event_abs_err_median": median([abs(x - 1) for x in ratios]),
            "cuda_event_ms_median": {ph: phase_median(rk, ph, lambda h: h["cuda_event_ms"]) for ph in PHASES},
            "offset_error_ms_median": median([r["offset_error"] / 1e6 for r in mine if r["offset_error"] < 1 << 62]),
            "proxy_send_wait_ms_median": median([r["proxy_wait_ns"][2] / 1e6 for r in mine]),
            "enqueue_to_return_us_median": median([(h["return_ns"] - h["enqueue_ns"]) / 1e3 for h in rk["steps"]]),
            "sleep_cycles_per_ms": rk.get("sleep_cycles_per_ms"),
        }
    skew = {}
    if len(by_rank.get(0, [])) == len(by_rank.get(1, [])) and by_rank.get(0):
        for ph in PHASES:
            idx = [i for i, h in enumerate(ranks[0]["steps"]) if h["phase"] == ph]
            # Rank 1's GPU start minus rank 0's, per step (both read the same GPU's timer).
            gpu = {ranks[0]["steps"][i]["step"]: (by_rank[1][i]["gpu_start"] - by_rank[0][i]["gpu_start"]) / 1e6 for i in idx if by_rank[1][i]["gpu_start"] and by_rank[0][i]["gpu_start"]}
            host = [(ranks[1]["steps"][i]["enqueue_ns"] - ranks[0]["steps"][i]["enqueue_ns"]) / 1e6 for i in idx]
            skew[ph] = {"gpu_start_skew_ms_median": median(gpu.values()), "gpu_start_abs_skew_ms_median": median([abs(v) for v in gpu.values()]),
                        "host_enqueue_skew_ms_median": median(host), "gpu_start_skew_ms_per_step": {k: round(v, 3) for k, v in gpu.items()}}
    return out, skew


def agent_get(path):
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{API}{path}", timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def diagnose(a):
    r = subprocess.run([a.agent, "diagnose", "--agent", API, "--since", "30m", "--json"], capture_output=True, text=True, timeout=60)
    with open(os.path.join(a.out, "diagnose.json"), "w") as f:
        f.write(r.stdout + r.stderr)
    t = subprocess.run([a.agent, "diagnose", "--agent", API, "--since", "30m", "--slowest", "4"], capture_output=True, text=True, timeout=60)
    with open(os.path.join(a.out, "diagnose.txt"), "w") as f:
        f.write(t.stdout + t.stderr)
    try:
        steps = json.loads(r.stdout)["steps"]
    except (ValueError, KeyError):
        return {"error": (r.stderr or r.stdout)[-2000:]}
    res = {"steps": len(steps)}
    groups = {ph: (lambda s, i=i: s < NOPLUGIN_BASE and s // a.steps == i) for i, ph in enumerate(PHASES)}
    groups["noplugin_gpu_late"] = lambda s: s >= NOPLUGIN_BASE
    res["per_step"] = {s["step"]: {"wall_ms": s.get("skew", {}).get("wall_seconds", 0.0) * 1e3,
                                   "late_rank": next((c.get("evidence", {}).get("late_rank") for c in s["causes"] if c["kind"] == "readiness_skew"), None)}
                       for s in steps if isinstance(s.get("step"), int)}
    for name, sel in groups.items():
        ss = [s for s in steps if isinstance(s.get("step"), int) and sel(s["step"])]
        rs = [next((c for c in s["causes"] if c["kind"] == "readiness_skew"), {}) for s in ss]
        res[name] = {"steps": len(ss), "readiness_skew_ms_median": median([c.get("seconds", 0.0) * 1e3 for c in rs]),
                     "late_rank": sorted({str(c.get("evidence", {}).get("late_rank")) for c in rs}),
                     "host_enqueue_skew_ms_median": median([c.get("evidence", {}).get("host_enqueue_skew_seconds", 0.0) * 1e3 for c in rs]),
                     "timing": sorted({s.get("timing", "") for s in ss}), "top_cause": sorted({str(s.get("top_cause")) for s in ss}),
                     "notes": sorted({n for s in ss for n in s.get("notes", [])})[:4]}
    return res


def probe_hits(a):
    """Per rank process, its ncclAllReduce calls as the host probes saw them: paired (entry and
    return: made before the agent had read the process) or left alone at the entry by the
    session program (one probe hit: the call only enqueued). Also the agent's own check."""
    try:
        check = open(os.path.join(a.out, "agent-check.txt")).read()
    except OSError:
        check = ""
    session = next((l.strip() for l in check.splitlines() if "ebpf session" in l), "")
    calls = agent_get("/api/v1/collectives?limit=1000000").get("calls", [])
    per = {}
    # Host-timed calls only: a plugin process's calls are replaced by its GPU-timed records.
    host = (c for c in calls if c.get("op") == "all_reduce" and c.get("library") == "nccl" and c.get("timing") == "host_enqueue")
    for c in sorted(host, key=lambda c: c.get("enter_ns", 0)):
        per.setdefault(str(c.get("pid")), []).append(c.get("enter_ns") == c.get("exit_ns") and c.get("ret") is None)
    out = {"session_check": session[:160], "per_pid": {}, "probe_events_per_nccl_call": events_per_call()}
    for pid, alone in per.items():
        first = next((i for i, x in enumerate(alone) if x), len(alone))
        out["per_pid"][pid] = {"calls": len(alone), "paired_first": first, "alone": sum(alone), "paired_after_alone": sum(1 for x in alone[first:] if not x)}
    return out


def events_per_call():
    """The agent's probe program runs over the NCCL calls it decoded, both jobs (every probed
    NCCL function: collectives alone or paired, group and communicator calls paired)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{API}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    val = lambda l: float(l.rsplit(" ", 1)[1])
    events = sum(val(l) for l in text.splitlines() if l.startswith("stepwise_probe_events_total"))
    calls = sum(val(l) for l in text.splitlines() if l.startswith("stepwise_collective_calls_total{") and 'library="nccl"' in l)
    return {"events": events, "nccl_calls": calls, "per_call": round(events / calls, 3) if calls else None}


def hang_report(a):
    seen = ras.query()
    r = subprocess.run([a.agent, "diagnose", "--hang", "--agent", API, "--json"], capture_output=True, text=True, timeout=30)
    t = subprocess.run([a.agent, "diagnose", "--hang", "--agent", API], capture_output=True, text=True, timeout=30)
    text = f"\n== diagnose --hang, {HANG_S / 2:.0f} s into the hang (exit {t.returncode})\n" + t.stdout + t.stderr
    try:
        rep = json.loads(r.stdout)
        hangs = rep.get("hangs", [])
    except ValueError:
        return {"exit": r.returncode, "error": (r.stderr or r.stdout)[-1000:], "text": text, "ras": seen}
    sus = [h for h in hangs if h.get("suspected")]
    return {"exit": r.returncode, "suspected": len(sus), "op": [h.get("op") for h in sus], "ras": seen, "ras_checks": ras.checks(seen, rep),
            "agent_ras": rep.get("ras"), "agent_ras_findings": rep.get("ras_findings"),
            "inside": sorted({i.get("rank") for h in sus for i in h.get("inside", [])}, key=str),
            "missing": sorted({m.get("rank") for h in sus for m in h.get("missing", [])}, key=str),
            "open_seconds": [h.get("open_seconds") for h in sus], "text": text}


def checks_of(a, jobs, per_rank, skew, agent):
    rcs = jobs["plugin"]["rc"] + jobs["noplugin"]["rc"]
    headers = jobs["plugin"]["headers"]
    ev = {k: v["cuda_event_ms_median"] for k, v in per_rank.items()}
    # Rank 0 waits inside its all-reduce for rank 1's data: its CUDA-event time beyond the
    # healthy steps' is how much longer it waited for rank 1 than in those steps (where it
    # waited max(healthy skew, 0)).
    wait = (ev["rank0"]["gpu_late"] - ev["rank0"]["healthy"]) if "rank0" in ev else None
    g = {ph: (skew.get(ph, {}).get("gpu_start_skew_ms_median") or 0.0) for ph in PHASES}
    base = max(g["healthy"], 0.0)
    c = {
        "ranks_finished": rcs == [0, 0, 0, 0],
        "datagrams_received": bool(headers),
        "nccl_version_reported": bool(headers) and all(h["nccl_version"] > 0 for h in headers),
        "gpu_is_the_device": bool(headers) and all(h["gpu"] == jobs["device"] for h in headers),
        "no_datagram_without_the_plugin": not jobs["noplugin"]["headers"],
        "every_allreduce_recorded": bool(per_rank) and all(v["records"] == a.steps * len(PHASES) for v in per_rank.values()),
        "every_allreduce_gpu_timed": bool(per_rank) and all(v["gpu_timed"] == v["records"] for v in per_rank.values()),
        "every_16MiB_allreduce_once_warmup_steps_hang": bool(per_rank) and all(v["allreduces_of_16MiB"] == 5 + a.steps * len(PHASES) + 1 for v in per_rank.values()),
        "gpu_durations_within_5pct_of_cuda_events": bool(per_rank) and all((v["gpu_vs_cuda_event_abs_err_median"] or 1) <= 0.05 for v in per_rank.values()),
        "gpu_late_knob_made_rank_1_late": g["gpu_late"] - g["healthy"] >= 10.0,
        "gpu_start_skew_matches_rank_0_cuda_wait_15pct": wait is not None and abs((g["gpu_late"] - base) - wait) <= 0.15 * abs(wait),
        "cpu_late_knob_made_rank_1_enqueue_late": (skew.get("cpu_late", {}).get("host_enqueue_skew_ms_median") or 0) >= 0.8 * CPU_LATE_MS,
        "cpu_late_gpu_skew_below_half_the_host_enqueue_skew": (skew.get("cpu_late", {}).get("gpu_start_abs_skew_ms_median") or 99) < 0.5 * (skew.get("cpu_late", {}).get("host_enqueue_skew_ms_median") or 0),
    }
    if agent is not None:
        d = agent["diagnose"]
        ag = {ph: (d.get(ph, {}).get("readiness_skew_ms_median") or 0.0) for ph in PHASES}
        npg = d.get("noplugin_gpu_late", {})
        # Per step: the agent's wall-clock skew is the GPU timer's |rank 1 - rank 0| (the
        # processes' own GPU-to-host offsets converted it) and names the later rank.
        per = {ph: skew.get(ph, {}).get("gpu_start_skew_ms_per_step", {}) for ph in PHASES}
        got = d.get("per_step", {})
        off = [(k, v, got.get(k)) for ph in PHASES for k, v in per[ph].items()]
        c["agent_skew_is_the_gpu_timer_skew_per_step_5pct_or_0.25ms"] = bool(off) and all(
            g2 is not None and abs(g2["wall_ms"] - abs(v)) <= max(0.05 * abs(v), 0.25) and (abs(v) < 0.25 or g2["late_rank"] == (1 if v > 0 else 0)) for _, v, g2 in off)
        c["agent_gpu_late_skew_matches_rank_0_cuda_wait_15pct"] = wait is not None and abs((ag["gpu_late"] - base) - wait) <= 0.15 * abs(wait)
        c["agent_gpu_late_names_rank_1"] = d.get("gpu_late", {}).get("late_rank") == ["1"]
        hs = skew.get("cpu_late", {}).get("host_enqueue_skew_ms_median") or 0.0
        c["agent_cpu_late_skew_below_half_the_host_enqueue_skew"] = d.get("cpu_late", {}).get("steps", 0) > 0 and ag["cpu_late"] < 0.5 * hs
        c["agent_plugin_steps_timed_by_gpu"] = all(d.get(ph, {}).get("timing") == ["gpu"] for ph in PHASES)
        c["agent_noplugin_steps_host_enqueue_no_skew"] = npg.get("steps", 0) > 0 and npg.get("timing") == ["host_enqueue"] and (npg.get("readiness_skew_ms_median") or 0) < 1.0
        ph = agent.get("probe_hits") or {}
        pp = list((ph.get("per_pid") or {}).values())
        c["agent_session_program_loaded"] = ph.get("session_check", "").startswith("ok")
        c["agent_async_allreduces_one_probe_hit_once_seen"] = len(pp) >= 2 and all(
            v["paired_after_alone"] == 0 and v["alone"] >= 0.9 * v["calls"] for v in pp)
        h = agent["hang"] or {}
        c["agent_hang_suspected_rank_1_missing"] = h.get("exit") == 4 and h.get("missing") == [1] and 0 in h.get("inside", [])
        c.update(h.get("ras_checks") or {"agent_ras_state_matches_the_scripts_query": False})
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--agent")
    ap.add_argument("--chain", help="a second profiler plugin to chain behind Stepwise's (job 4)")
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    ap.add_argument("--steps", type=int, default=10, help="steps per phase")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--job", default="plugin")
    ap.add_argument("--result")
    ap.add_argument("--markers")
    ap.add_argument("--hang-flag")
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a)
    tmp = tempfile.mkdtemp(prefix="stepwise-gpu-")
    agent, paths = (start_agent(a, tmp) if a.agent else (None, {}))
    try:
        dev = device_bus()
    except (OSError, ValueError):
        dev = None
    jobs = {"device": dev}
    for job in ("plugin", "noplugin", "graph") + (("chain",) if a.chain else ()):
        prof = os.path.join(tmp, f"{job}-profiler.sock")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(prof)
        got, stop = [], threading.Event()
        t = threading.Thread(target=receive, args=(rx, got, stop, paths.get("agent.sock")), daemon=True)
        t.start()
        t0 = time.time()
        hang = (lambda: hang_report(a)) if agent and job == "plugin" else None
        rcs, ranks, hung = run_ranks(a, tmp, job, prof, paths.get("markers.sock"), hang)
        time.sleep(2.0)
        stop.set()
        t.join()
        jobs[job] = {"rc": rcs, "ranks": ranks, "wall_s": time.time() - t0, "headers": [h for h, _ in got], "recs": [r for _, rs in got for r in rs], "hang": hung}
    gchecks, gsum = graph.checks(a, jobs["graph"], BYTES, ALLREDUCE, FLAG_STARTED, GPU_LATE_MS, agent_get, median)
    cchecks, csum = chain.checks(jobs["chain"], tmp, a.steps * len(PHASES), BYTES, ALLREDUCE, FLAG_STARTED) if a.chain else ({}, None)
    ranks, recs = jobs["plugin"]["ranks"], jobs["plugin"]["recs"]
    per_rank, skew = compare(ranks, recs) if len(ranks) == 2 else ({}, {})
    agent_info = None
    if agent:
        time.sleep(2.0)  # the last steps' grace
        agent_info = {"diagnose": diagnose(a), "hang": jobs["plugin"]["hang"] or {}, "profiler_status": agent_get("/api/v1/status").get("collectives_detail", {}).get("profiler"),
                      "probe_hits": probe_hits(a)}
        agent.terminate()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
        agent_info["exit"] = agent.returncode
        with open(os.path.join(a.out, "diagnose.txt"), "a") as f:
            f.write(agent_info["hang"].pop("text", "\n== no hang report\n"))
        shutil.copy(paths["agent.log"], os.path.join(a.out, "agent.log"))
    if os.path.exists(os.path.join(tmp, "nccl-plugin-0.log")):
        shutil.copy(os.path.join(tmp, "nccl-plugin-0.log"), os.path.join(a.out, "nccl-0.log"))
    with open(os.path.join(a.out, "ranks.out"), "w") as f:
        for job in ("plugin", "noplugin", "graph", "chain"):
            for r in range(2):
                if os.path.exists(os.path.join(tmp, f"{job}-rank{r}.out")):
                    f.write(f"== {job} rank {r}\n" + open(os.path.join(tmp, f"{job}-rank{r}.out")).read())
    checks = checks_of(a, jobs, per_rank, skew, agent_info)
    checks.update(gchecks)
    checks.update(cchecks)
    headers = jobs["plugin"]["headers"]
    summary = {
        "checks": checks,
        "device_bus_id": dev,
        "headers_gpu": sorted({h["gpu"] for h in headers}),
        "nccl_version": sorted({h["nccl_version"] for h in headers}),
        "event_mask": sorted({h["mask"] for h in headers}),
        "plugin_drops": max([h["drops"] for h in headers] or [0]),
        "records": len(recs),
        "jobs": {j: {"rc": jobs[j]["rc"], "wall_s": jobs[j]["wall_s"], "datagrams": len(jobs[j]["headers"])} for j in ("plugin", "noplugin")},
        "per_rank": per_rank,
        # The same gpu_late steps without the plugin: rank 1 arrives last, so its all-reduce is
        # the transfer alone; the call's enqueue-to-return is the calling thread's cost.
        "noplugin_per_rank": {f"rank{rk['rank']}": {"gpu_late_cuda_event_ms_median": phase_median(rk, "gpu_late", lambda h: h["cuda_event_ms"]),
                                                   "enqueue_to_return_us_median": median([(h["return_ns"] - h["enqueue_ns"]) / 1e3 for h in rk["steps"]])}
                              for rk in jobs["noplugin"]["ranks"]},
        "gpu_start_skew": skew,
        "agent": agent_info,
        "graph": gsum,
        "chain": csum,
        "torch": ranks[0].get("torch") if ranks else None,
        "torch_nccl": ranks[0].get("nccl") if ranks else None,
    }
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
        f.write(text + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
