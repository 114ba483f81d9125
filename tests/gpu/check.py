#!/usr/bin/env python3
"""GPU check of the Stepwise NCCL profiler plugin and agent, for a lent GPU machine (never CI).

Two ranks of PyTorch's real NCCL on one GPU: NCCL refuses two ranks on one device of one host
("Duplicate GPU detected"), so each rank gets its own NCCL_HOSTID; NCCL then sees two hosts
and connects them over its socket transport on loopback (real proxy thread, real network
steps, real kernels). Both ranks' kernels read the same GPU global timer, so their GPU start
times compare without any clock offset.

Each step: 20 ms of GPU "compute" (torch.cuda._sleep) on both ranks, then one all-reduce of
16 MiB bracketed by CUDA events, step markers sent to the agent. Three phases:
  healthy   both on time;
  gpu_late  rank 1's GPU runs 30 ms more compute while its CPU enqueues on time;
  cpu_late  rank 1's CPU sleeps 10 ms before the all-reduce, its GPU still busy (not late).

The script receives the plugin's datagrams itself (and forwards each one to the agent when
--agent is given) and checks: the plugin loads and reports NCCL's version, the header's GPU is
the device, every all-reduce arrives with its bytes and GPU times, GPU durations agree with
the CUDA events within 5 % (median of |ratio − 1|), rank 1's GPU start is ~30 ms after rank
0's in gpu_late steps and ~0 in cpu_late steps. With --agent, the agent (started here) times
the steps: readiness skew ≈ 30 ms naming rank 1 in gpu_late steps, none in cpu_late steps,
steps timed by the GPU. Prints one JSON summary (also OUT/gpu-check.json); exit 1 on a failed
check.

Usage: python3 tests/gpu/check.py --plugin libnccl_profiler.so [--agent BIN] [--out DIR]
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

HEADER = struct.Struct("<IHHHHIIIQQQ16s")  # 64 bytes (docs/profiler-plugin.md)
RECORD = struct.Struct("<QQiiQQQQQqQ6Q")  # the first 128 bytes of a record
MAGIC, FLAG_STARTED, ALLREDUCE = 0x46505753, 8, 1
PHASES = ("healthy", "gpu_late", "cpu_late")
COMPUTE_MS, GPU_LATE_MS, CPU_LATE_MS = 20.0, 30.0, 10.0
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


def rank_main(a):
    """One rank: runs the steps, writes its CUDA-event and host timings to a.result."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=a.rank, world_size=2, device_id=torch.device("cuda", 0))
    x = torch.ones(BYTES // 4, device="cuda")
    # Calibrate _sleep: cycles per ms.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(100_000_000)
    e1.record()
    torch.cuda.synchronize()
    per_ms = 100_000_000 / e0.elapsed_time(e1)
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    msock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    events, host = [], []
    for step in range(a.steps * len(PHASES)):
        phase = PHASES[step // a.steps]
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
        f.write('[steps]\ngrace = "500ms"\n')
    check = subprocess.run([a.agent, "check"], capture_output=True, text=True, timeout=60)
    with open(os.path.join(a.out, "agent-check.txt"), "w") as f:
        f.write(check.stdout + check.stderr)
    log = open(paths["agent.log"], "w")
    p = subprocess.Popen([a.agent, "run", "--config", paths["agent.toml"], "--listen", "127.0.0.1:19477", "--db", paths["agent.db"],
                          "--marker-socket", paths["markers.sock"], "--profiler-socket", paths["agent.sock"], "--interval", "100ms"],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        if os.path.exists(paths["markers.sock"]) or p.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    return p, paths


def run_ranks(a, tmp, prof_sock, markers):
    env = dict(os.environ, NCCL_PROFILER_PLUGIN=os.path.abspath(a.plugin), STEPWISE_PROFILER_SOCKET=prof_sock, MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29517", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo",
               NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,NET,PROFILE", PYTHONUNBUFFERED="1",
               STEPWISE_PROFILER_EVENTS="coll,kernel,proxy")
    procs = []
    for r in range(2):
        e = dict(env, NCCL_HOSTID=f"stepwise-gpu-check-{r}", NCCL_DEBUG_FILE=os.path.join(tmp, f"nccl-{r}.log"))
        cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--steps", str(a.steps), "--result",
               os.path.join(tmp, f"rank{r}.json"), "--plugin", a.plugin] + (["--markers", markers] if markers else [])
        procs.append(subprocess.Popen(cmd, env=e, stdout=open(os.path.join(tmp, f"rank{r}.out"), "w"), stderr=subprocess.STDOUT))
    deadline = time.time() + a.timeout
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
    return [p.returncode for p in procs]


def compare(ranks, recs):
    """Per rank: the last steps' all-reduce records against the CUDA events, and rank 1 - rank 0 GPU starts."""
    out, by_rank = {}, {}
    for rk in ranks:
        mine = sorted((r for r in recs if r["pid"] == rk["pid"] and r["func"] == ALLREDUCE and r["flags"] & FLAG_STARTED == 0), key=lambda r: r["seq"])
        mine = mine[-len(rk["steps"]):]
        by_rank[rk["rank"]] = mine
        ratios = [((r["gpu_end"] - r["gpu_start"]) / 1e6) / h["cuda_event_ms"] for r, h in zip(mine, rk["steps"]) if r["gpu_start"] and r["gpu_end"] and h["cuda_event_ms"] > 0]
        out[f"rank{rk['rank']}"] = {
            "records": len(mine),
            "gpu_timed": sum(1 for r in mine if r["gpu_start"] and r["gpu_end"]),
            "bytes_right": all(r["bytes"] == BYTES for r in mine),
            "gpu_over_cuda_event_median": median(ratios),
            "gpu_vs_cuda_event_abs_err_median": median([abs(x - 1) for x in ratios]),
            "cuda_event_ms_median": median([h["cuda_event_ms"] for h in rk["steps"]]),
            "offset_error_ms_median": median([r["offset_error"] / 1e6 for r in mine if r["offset_error"] < 1 << 62]),
            "proxy_send_wait_ms_median": median([r["proxy_wait_ns"][2] / 1e6 for r in mine]),
            "enqueue_to_return_us_median": median([(h["return_ns"] - h["enqueue_ns"]) / 1e3 for h in rk["steps"]]),
        }
    skew = {}
    if len(by_rank.get(0, [])) == len(by_rank.get(1, [])) and by_rank.get(0):
        for ph in PHASES:
            idx = [i for i, h in enumerate(ranks[0]["steps"]) if h["phase"] == ph]
            gpu = [(by_rank[1][i]["gpu_start"] - by_rank[0][i]["gpu_start"]) / 1e6 for i in idx if by_rank[1][i]["gpu_start"] and by_rank[0][i]["gpu_start"]]
            host = [(ranks[1]["steps"][i]["enqueue_ns"] - ranks[0]["steps"][i]["enqueue_ns"]) / 1e6 for i in idx]
            skew[ph] = {"gpu_start_skew_ms_median": median(gpu), "host_enqueue_skew_ms_median": median(host)}
    return out, skew


def diagnose(a, tmp):
    r = subprocess.run([a.agent, "diagnose", "--agent", "127.0.0.1:19477", "--since", "30m", "--json"], capture_output=True, text=True, timeout=60)
    with open(os.path.join(a.out, "diagnose.json"), "w") as f:
        f.write(r.stdout + r.stderr)
    t = subprocess.run([a.agent, "diagnose", "--agent", "127.0.0.1:19477", "--since", "30m", "--slowest", "6"], capture_output=True, text=True, timeout=60)
    with open(os.path.join(a.out, "diagnose.txt"), "w") as f:
        f.write(t.stdout + t.stderr)
    try:
        steps = json.loads(r.stdout)["steps"]
    except (ValueError, KeyError):
        return {"error": (r.stderr or r.stdout)[-2000:]}, {}
    res = {}
    for ph in PHASES:
        ss = [s for s in steps if isinstance(s.get("step"), int) and s["step"] // a.steps == PHASES.index(ph)]
        skew = [next((c["seconds"] for c in s["causes"] if c["kind"] == "readiness_skew"), 0.0) * 1e3 for s in ss]
        late = [next((c.get("evidence", {}).get("late_rank") for c in s["causes"] if c["kind"] == "readiness_skew"), None) for s in ss]
        res[ph] = {"steps": len(ss), "readiness_skew_ms_median": median(skew), "late_rank": sorted({str(x) for x in late}),
                   "timing": sorted({s.get("timing", "") for s in ss}), "top_cause": sorted({str(s.get("top_cause")) for s in ss})}
    return {"steps": len(steps)}, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--agent")
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    ap.add_argument("--steps", type=int, default=10, help="steps per phase")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--result")
    ap.add_argument("--markers")
    ap.add_argument("--iters", type=int, help=argparse.SUPPRESS)  # the one-rank check's knob, ignored
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a)
    tmp = tempfile.mkdtemp(prefix="stepwise-gpu-")
    agent, paths = (start_agent(a, tmp) if a.agent else (None, {}))
    prof = os.path.join(tmp, "profiler.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(prof)
    got, stop = [], threading.Event()
    t = threading.Thread(target=receive, args=(rx, got, stop, paths.get("agent.sock")), daemon=True)
    t.start()
    t0 = time.time()
    rcs = run_ranks(a, tmp, prof, paths.get("markers.sock"))
    wall = time.time() - t0
    time.sleep(2.0)
    stop.set()
    t.join()
    ranks = []
    for r in range(2):
        try:
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        except (OSError, ValueError):
            pass
    headers = [h for h, _ in got]
    recs = [r for _, rs in got for r in rs]
    per_rank, skew = compare(ranks, recs) if len(ranks) == 2 else ({}, {})
    agent_info, agent_phases = {}, {}
    if agent:
        time.sleep(3.0)  # the last steps' grace
        agent_info, agent_phases = diagnose(a, tmp)
        agent.terminate()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
        agent_info["exit"] = agent.returncode
        shutil.copy(paths["agent.log"], os.path.join(a.out, "agent.log"))
    if os.path.exists(os.path.join(tmp, "nccl-0.log")):
        shutil.copy(os.path.join(tmp, "nccl-0.log"), os.path.join(a.out, "nccl-0.log"))
    with open(os.path.join(a.out, "ranks.out"), "w") as f:
        for r in range(2):
            if os.path.exists(os.path.join(tmp, f"rank{r}.out")):
                f.write(f"== rank {r}\n" + open(os.path.join(tmp, f"rank{r}.out")).read())
    try:
        dev = device_bus()
    except (OSError, ValueError):
        dev = None
    checks = {
        "ranks_finished": rcs == [0, 0],
        "datagrams_received": len(got) > 0,
        "nccl_version_reported": bool(headers) and all(h["nccl_version"] > 0 for h in headers),
        "gpu_is_the_device": bool(headers) and all(h["gpu"] == dev for h in headers),
        "every_allreduce_recorded": bool(per_rank) and all(v["records"] == a.steps * len(PHASES) for v in per_rank.values()),
        "every_allreduce_gpu_timed": bool(per_rank) and all(v["gpu_timed"] == v["records"] for v in per_rank.values()),
        "bytes_right": bool(per_rank) and all(v["bytes_right"] for v in per_rank.values()),
        "gpu_durations_within_5pct_of_cuda_events": bool(per_rank) and all((v["gpu_vs_cuda_event_abs_err_median"] or 1) <= 0.05 for v in per_rank.values()),
        "gpu_late_skew_30ms_15pct": abs((skew.get("gpu_late", {}).get("gpu_start_skew_ms_median") or 0) - GPU_LATE_MS) <= 0.15 * GPU_LATE_MS,
        "cpu_late_no_gpu_skew": abs(skew.get("cpu_late", {}).get("gpu_start_skew_ms_median") or 99) <= 3.0,
    }
    if agent:
        g, c = agent_phases.get("gpu_late", {}), agent_phases.get("cpu_late", {})
        checks["agent_gpu_late_readiness_skew_30ms_15pct"] = abs((g.get("readiness_skew_ms_median") or 0) - GPU_LATE_MS) <= 0.15 * GPU_LATE_MS
        checks["agent_gpu_late_names_rank_1"] = g.get("late_rank") == ["1"]
        checks["agent_cpu_late_no_readiness_skew"] = (c.get("readiness_skew_ms_median") if c.get("steps") else 99) <= 3.0
        checks["agent_steps_timed_by_gpu"] = bool(agent_phases) and all(v.get("timing") == ["gpu"] for v in agent_phases.values())
    summary = {
        "checks": checks,
        "device_bus_id": dev,
        "headers_gpu": sorted({h["gpu"] for h in headers}),
        "nccl_version": sorted({h["nccl_version"] for h in headers}),
        "event_mask": sorted({h["mask"] for h in headers}),
        "plugin_drops": max([h["drops"] for h in headers] or [0]),
        "records": len(recs),
        "rank_exit_codes": rcs,
        "ranks_wall_s": wall,
        "per_rank": per_rank,
        "gpu_start_skew": skew,
        "agent": agent_info,
        "agent_phases": agent_phases,
        "torch": ranks[0].get("torch") if ranks else None,
        "torch_nccl": ranks[0].get("nccl") if ranks else None,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
        f.write(text + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
