"""The CUDA-graph job of the GPU check (issue 34), run by check.py after its two jobs.

Each rank captures one all-reduce of 16 MiB into a CUDA graph (torch.cuda.graph, after a
warm-up on a side stream as PyTorch requires) and replays it every step: no NCCL call runs on
the host in the loop. Rank 1's GPU runs GPU_LATE_MS more compute before each replay.

What NCCL 2.28-2.30 does under replay (src/enqueue.cc hostStreamPlanTask, src/plugin/
profiler.cc ncclProfilerStartTaskEvents; docs/profiler-plugin.md "CUDA graphs"): a Coll event
per replay from the graph's host node, with KernelCh events, and seqNumber advancing only
because the plugin returns a CollApi handle and asks for KernelCh. Checked here on real NCCL:
one record per replay and rank with the plugin's graph flag, distinct sequence numbers, GPU
times; rank 1's GPU start later by about GPU_LATE_MS; and, with an agent, the steps timed
`gpu` with a `graph_replay` field.
"""
import json
import os
import time

FLAG_GRAPH = 16
GRAPH_BASE = 200


def rank_main(a, per_ms_of, mark, bytes_, compute_ms, late_ms):
    """One rank of the graph job: writes its host times to a.result."""
    import socket

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=a.rank, world_size=2, device_id=torch.device("cuda", 0))
    per_ms = per_ms_of(torch)
    x = torch.ones(bytes_ // 4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    msock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    host = []
    for i in range(a.steps):
        step = GRAPH_BASE + i
        mark(msock, a.markers, a.rank, step, "begin")
        torch.cuda._sleep(int(compute_ms * per_ms))
        if a.rank == 1:
            torch.cuda._sleep(int(late_ms * per_ms))
        t = time.time_ns()
        g.replay()
        torch.cuda.synchronize()
        mark(msock, a.markers, a.rank, step, "end")
        host.append({"step": step, "replay_ns": t})
    dist.destroy_process_group()
    with open(a.result, "w") as f:
        json.dump({"rank": a.rank, "pid": os.getpid(), "steps": host}, f)


def checks(a, job, bytes_, allreduce, flag_started, late_ms, agent_get, median):
    """The graph job's checks and figures: (checks, summary)."""
    ranks, recs = job["ranks"], job["recs"]
    per = {}
    for rk in ranks:
        mine = sorted((r for r in recs if r["pid"] == rk["pid"] and r["func"] == allreduce and r["flags"] & flag_started == 0
                       and r["bytes"] == bytes_ and r["flags"] & FLAG_GRAPH), key=lambda r: r["seq"])
        per[rk["rank"]] = mine
    n = {r: len(v) for r, v in per.items()}
    seqs = {r: len({x["seq"] for x in v}) for r, v in per.items()}
    skew = []
    if len(per) == 2 and n.get(0) == n.get(1):
        # The last a.steps replays: the capture's warm-up is not flagged, the replays are.
        skew = [(b["gpu_start"] - a0["gpu_start"]) / 1e6 for a0, b in zip(per[0][-a.steps:], per[1][-a.steps:]) if a0["gpu_start"] and b["gpu_start"]]
    c = {
        "graph_ranks_finished": job["rc"] == [0, 0],
        "graph_one_flagged_record_per_replay": len(per) == 2 and all(v >= a.steps for v in n.values()),
        "graph_replays_have_distinct_seq": len(per) == 2 and all(seqs[r] == n[r] for r in per),
        "graph_replays_gpu_timed": len(per) == 2 and all(all(x["gpu_start"] and x["gpu_end"] for x in v) for v in per.values()),
        "graph_rank_1_gpu_late_15pct": bool(skew) and abs(median(skew) - late_ms) <= 0.15 * late_ms,
    }
    steps = []
    if a.agent:
        v = agent_get("/api/v1/steps?limit=1000")
        steps = [s for s in v.get("steps", []) if s.get("step", 0) >= GRAPH_BASE]
        c["agent_graph_steps_gpu_timed_and_marked"] = len(steps) >= a.steps - 1 and all(
            s.get("timing") == "gpu" and (s.get("graph_replay") or {}).get("arrivals") == 2 for s in steps)
    summary = {"records_per_rank": n, "distinct_seq_per_rank": seqs, "gpu_start_skew_ms_median": median(skew), "agent_steps": len(steps),
               "agent_graph_replay": [s.get("graph_replay") for s in steps[:1]]}
    return c, summary
