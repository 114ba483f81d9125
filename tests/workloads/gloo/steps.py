#!/usr/bin/env python3
"""gloo training steps over real PyTorch (torch.distributed, backend "gloo", CPU).

Ranks come from the environment as torchrun sets it: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT (init_method "env://"), so the agent reads the same identity from the
process's allowlisted environment. Each step: a "begin" marker, compute (a sleep, so four
ranks on two cores keep their timing), one dist.all_reduce of --bytes bytes of float32, an
"end" marker. Markers are the agent's JSON datagrams on its Unix socket.

  --late-rank R --late-ms X [--late-every K]  rank R computes X ms longer on every K-th step
                                              ((k + 1) % K == 0)
  --stop-rank R --stop-step K [--stop-mode sleep|sigstop]
                                              rank R, just before step K's all_reduce,
                                              sleeps forever (default) or SIGSTOPs itself
  --desync-rank R --desync-step K [--desync-mode op|count|skip]
                                              every step adds a dist.broadcast of 16 floats
                                              from rank 0; at step K rank R's first call
                                              disagrees: op: a broadcast (src 0) in place of
                                              the all_reduce; count: an all_reduce of half
                                              the tensor; skip: no all_reduce. Every rank
                                              ends itself after 60 s (SIGALRM)

Output, one line each (the same fields as mpi_steps/nccl_steps):
  init rank=R nranks=N pid=P
  step rank=R step=K compute_us=.. allreduce_us=.. step_us=.. delayed=0|1 bad=0 arrive_us=..
  stopping rank=R step=K pid=P mode=sleep|sigstop
  desync rank=R step=K mode=op|count|skip pid=P
  summary tool=gloo_steps rank=R nranks=N steps=S bytes=B bad=E
arrive_us is CLOCK_MONOTONIC (the clock of the agent's probes) when the rank entered the
all_reduce.
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist


def now_us():
    return time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6


class Markers:
    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if path else None

    def send(self, rank, step, phase):
        if not self.sock:
            return
        msg = json.dumps({"rank": rank, "step": step, "phase": phase}).encode()
        try:
            self.sock.sendto(msg, socket.MSG_DONTWAIT, self.path)
        except OSError:
            pass  # never stall training for telemetry


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--compute-ms", type=float, default=20.0)
    # Per rank from the environment when ranks of one job report to different agents.
    p.add_argument("--marker-socket", default=os.environ.get("STEPS_MARKER_SOCKET"))
    p.add_argument("--late-rank", type=int, default=-1)
    p.add_argument("--late-ms", type=float, default=0.0)
    p.add_argument("--late-every", type=int, default=1)
    p.add_argument("--stop-rank", type=int, default=-1)
    p.add_argument("--stop-step", type=int, default=-1)
    p.add_argument("--stop-mode", choices=["sleep", "sigstop"], default="sleep")
    p.add_argument("--desync-rank", type=int, default=-1)
    p.add_argument("--desync-step", type=int, default=-1)
    p.add_argument("--desync-mode", choices=["op", "count", "skip"], default="op")
    return p.parse_args()


def stop_point(o, rank, k):
    if rank != o.stop_rank or k != o.stop_step:
        return
    print(f"stopping rank={rank} step={k} pid={os.getpid()} mode={o.stop_mode}", flush=True)
    if o.stop_mode == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        while True:
            time.sleep(3600)


def collectives(o, rank, k, t, small):
    """The step's all_reduce and, with --desync-rank, the broadcast; the desync rank's call
    at the desync step disagrees."""
    odd = rank == o.desync_rank and k == o.desync_step
    if odd:
        print(f"desync rank={rank} step={k} mode={o.desync_mode} pid={os.getpid()}", flush=True)
    if odd and o.desync_mode == "op":
        dist.broadcast(t, src=0)
    elif odd and o.desync_mode == "count":
        dist.all_reduce(t[: max(1, t.numel() // 2)])
    elif not (odd and o.desync_mode == "skip"):
        dist.all_reduce(t)
    if o.desync_rank >= 0:
        dist.broadcast(small, src=0)


def main():
    o = parse()
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    print(f"init rank={rank} nranks={n} pid={os.getpid()}", flush=True)
    t = torch.empty(max(1, o.bytes // 4), dtype=torch.float32)
    small = torch.zeros(16, dtype=torch.float32)
    if o.desync_rank >= 0:
        signal.alarm(60)
    markers = Markers(o.marker_socket)
    bad = 0
    for k in range(o.steps):
        late = o.late_ms if rank == o.late_rank and (k + 1) % o.late_every == 0 else 0.0
        t.fill_(rank + 1.0 + k)
        markers.send(rank, k, "begin")
        t0 = now_us()
        time.sleep((o.compute_ms + late) / 1e3)
        stop_point(o, rank, k)
        t1 = now_us()
        collectives(o, rank, k, t, small)
        t2 = now_us()
        markers.send(rank, k, "end")
        want = n * (n + 1) / 2 + n * k
        wrong = int(t[0].item() != want) + int(t[-1].item() != want)
        bad += wrong
        print(
            f"step rank={rank} step={k} compute_us={t1 - t0:.0f} allreduce_us={t2 - t1:.0f} step_us={t2 - t0:.0f} "
            f"delayed={int(late > 0)} bad={wrong} arrive_us={t1:.1f}",
            flush=True,
        )
    print(f"summary tool=gloo_steps rank={rank} nranks={n} steps={o.steps} bytes={t.numel() * 4} bad={bad}", flush=True)
    dist.destroy_process_group()
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
