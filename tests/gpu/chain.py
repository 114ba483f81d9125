"""Job 4 of the GPU check: the plugin job's steps again, with a second profiler plugin chained
behind Stepwise's (STEPWISE_PROFILER_CHAIN), as NCCL Inspector would sit there. The second
plugin is the test library's counting plugin (tests/workloads/nccl-abi/chain_plugin.c, built
by `make -C tests/workloads`): it asks for Coll | KernelCh and writes, per communicator at
finalize, what it was given and every contract breach it saw (foreign context, a parent that
is not its own handle, a double stop, an event it did not ask for beyond the parents NCCL
starts). Real NCCL then decides what reaches it.

Checks: both ranks finish; the chained plugin wrote one line per communicator of each rank,
counted the job's Coll events (at least the steps' all-reduces) and KernelCh events, and saw
no breach; Stepwise recorded every 16 MiB all-reduce of the job, each GPU-timed, as alone.
"""
import os

MASK = "0x42"  # Coll | KernelCh
BREACHES = ("unasked", "bad_parent", "double_stop", "foreign_ctx", "bad_handle")


def out_file(tmp):
    return os.path.join(tmp, "chaintest.out")


def env(a, tmp):
    """The ranks' environment for the chained job."""
    return {"STEPWISE_PROFILER_CHAIN": os.path.abspath(a.chain), "CHAINTEST_OUT": out_file(tmp), "CHAINTEST_MASK": MASK}


def parse(tmp):
    lines = []
    try:
        with open(out_file(tmp)) as f:
            for line in f:
                if line.startswith("chaintest "):
                    lines.append(dict(t.split("=", 1) for t in line.split()[1:] if "=" in t))
    except OSError:
        pass
    return lines


def checks(job, tmp, steps, bytes_, allreduce, flag_started):
    """(checks, summary) of the chained job; `steps`: all-reduces each rank's steps made."""
    lines = parse(tmp)
    ranks = {int(l.get("rank", -1)) for l in lines}
    colls = [int(l.get("t2", 0)) for l in lines]
    kernels = [int(l.get("t64", 0)) for l in lines]
    recs = job["recs"]
    per_pid = {}
    for r in recs:
        if r["func"] == allreduce and r["bytes"] == bytes_ and r["flags"] & flag_started == 0:
            per_pid.setdefault(r["pid"], []).append(r)
    c = {
        "chain_ranks_finished": job["rc"] == [0, 0],
        "chain_plugin_wrote_each_rank": ranks == {0, 1},
        "chain_plugin_counted_the_steps_colls": bool(colls) and sum(colls) >= 2 * steps,
        "chain_plugin_counted_kernel_channels": bool(kernels) and sum(kernels) >= 2 * steps,
        "chain_plugin_saw_no_breach": bool(lines) and all(int(l.get(b, 1)) == 0 for l in lines for b in BREACHES),
        "chain_stepwise_recorded_every_allreduce": len(per_pid) == 2 and all(len(v) >= steps for v in per_pid.values()),
        "chain_stepwise_gpu_timed_them": len(per_pid) == 2 and all(r["gpu_start"] and r["gpu_end"] for v in per_pid.values() for r in v),
    }
    return c, {"chain_lines": lines, "stepwise_allreduces_per_pid": {str(k): len(v) for k, v in per_pid.items()}}
