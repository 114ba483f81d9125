#!/usr/bin/env python3
"""A gloo job with several process groups over real PyTorch (torch.distributed, CPU), as
hierarchical and tensor/pipeline-parallel jobs have.

Ranks come from the environment as torchrun sets it (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). With --per-node P (ranks kP..kP+P-1 on node k):
  local groups  new_group([kP .. kP+P-1])      one per node, the ranks of one node
  rail groups   new_group([i, P+i, 2P+i, ..])  one per local index, across the nodes
Every rank creates every group, in that order (torch.distributed requires it). Each step:
dist.all_reduce of --bytes on the rank's local group, then on its rail group, then
dist.barrier on the world.

Output, one line each:
  init rank=R nranks=N pid=P
  summary tool=gloo_groups rank=R steps=S bad=E
"""

import argparse
import os

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-node", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bytes", type=int, default=1 << 16)
    o = p.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank, n, per = dist.get_rank(), dist.get_world_size(), o.per_node
    if per <= 0 or n % per != 0:
        p.error(f"--per-node {per} must divide the world size {n}")
    nodes = n // per
    local = [dist.new_group(list(range(k * per, (k + 1) * per))) for k in range(nodes)]
    rails = [dist.new_group([k * per + i for k in range(nodes)]) for i in range(per)]
    mine_local, mine_rail = local[rank // per], rails[rank % per]
    print(f"init rank={rank} nranks={n} pid={os.getpid()}", flush=True)
    t = torch.empty(max(o.bytes // 4, 1), dtype=torch.float32)
    bad = 0
    for _ in range(o.steps):
        t.fill_(1.0)
        dist.all_reduce(t, group=mine_local)
        bad += int((t != per).sum())
        t.fill_(1.0)
        dist.all_reduce(t, group=mine_rail)
        bad += int((t != nodes).sum())
        dist.barrier()
    print(f"summary tool=gloo_groups rank={rank} steps={o.steps} bad={bad}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
