"""PyTorch with Stepwise's NCCL profiler plugin (docs/profiler-plugin.md).

NCCL reads NCCL_PROFILER_PLUGIN when the first communicator is created, so set it before
torch.distributed creates one (or export it in the job's environment, as
deploy/examples/job-nccl-profiler.yaml does). Run under torchrun:

    torchrun --nproc-per-node=2 deploy/examples/torch_nccl_profiler.py

The node's agent then times every all_reduce below by the GPU (its records arrive on
/run/stepwise/profiler.sock): `agent diagnose` reports `timing: gpu` for these steps, and a
rank whose GPU reaches a collective late is named even when every CPU enqueued on time.
"""

import os

os.environ.setdefault("NCCL_PROFILER_PLUGIN", "/run/stepwise/libnccl-profiler-stepwise.so")
os.environ.setdefault("STEPWISE_PROFILER_SOCKET", "/run/stepwise/profiler.sock")
# NCCL loads one profiler plugin; to keep NCCL Inspector's output too, Stepwise's loads it:
# os.environ.setdefault("STEPWISE_PROFILER_CHAIN", "/opt/nccl/libnccl-profiler-inspector.so")
# os.environ.setdefault("NCCL_INSPECTOR_ENABLE", "1")

import torch  # noqa: E402  (after the environment is set)
import torch.distributed as dist  # noqa: E402


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    grad = torch.ones(16 << 20, device="cuda")
    a = torch.randn(2048, 2048, device="cuda")
    for step in range(100):
        # Uneven GPU work: every 10th step rank 1's GPU computes 20 times longer. Its CPU
        # enqueues the all_reduce at once (the calls are asynchronous); only GPU timing shows
        # that rank 1's GPU reaches the collective late.
        for _ in range(20 if rank == 1 and step % 10 == 0 else 1):
            a = a @ a
            a = a / a.norm()
        dist.all_reduce(grad)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
