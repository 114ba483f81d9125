#!/usr/bin/env python3
"""GPU check of the Stepwise NCCL profiler plugin, for a lent GPU machine (never run by CI).

Loads the plugin into PyTorch's real NCCL on a real GPU, runs all-reduces on a one-rank
communicator (one GPU: NCCL refuses two ranks on one device), receives the plugin's datagrams
on a Unix socket as the agent would, and checks what only real NCCL and a real driver can show:
the plugin loads and reports NCCL's version; the header's GPU address is the device's own
(nvidia-smi / torch); collectives arrive in order with their byte counts; GPU timestamps, when
NCCL emits KernelCh events for this communicator, are ordered and take about as long as the
host saw. Prints one JSON summary (also to OUT/gpu-check.json) and exits 1 on a failed check.

Usage: python3 tests/gpu/check.py --plugin target/release/libnccl_profiler.so [--out DIR]
"""
import argparse
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time

HEADER = struct.Struct("<IHHHHIIIQQQ16s")  # 64 bytes (docs/profiler-plugin.md)
RECORD = struct.Struct("<QQiiQQQQQqQ")  # the first 80 bytes of a record
MAGIC, FLAG_STARTED = 0x46505753, 8


def decode(b):
    magic, version, hbytes, rbytes, n, pid, nccl, mask, _full, _unsent, _sent, gpu = HEADER.unpack_from(b)
    if magic != MAGIC or version != 1 or hbytes + n * rbytes != len(b):
        raise ValueError(f"bad datagram: magic {magic:#x} version {version} sizes {hbytes}+{n}x{rbytes} != {len(b)}")
    gpu = gpu.split(b"\0")[0].decode() if hbytes >= 64 else ""
    recs = []
    for i in range(n):
        at = hbytes + i * rbytes
        f = RECORD.unpack_from(b, at)
        flags = b[at + 134]
        recs.append({"comm": f[0], "seq": f[1], "rank": f[2], "nranks": f[3], "bytes": f[4], "enqueue_ns": f[6],
                     "gpu_start": f[7], "gpu_end": f[8], "flags": flags, "func": b[at + 128]})
    return {"pid": pid, "nccl_version": nccl, "mask": mask, "gpu": gpu}, recs


def receive(sock, into, stop):
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            into.append(decode(sock.recv(65536)))
        except socket.timeout:
            continue


def sysfs_spelling(bus_id):
    """'00000000:1A:00.0' (nvidia-smi) or '0000:1a:00.0' -> '0000:1a:00.0'."""
    dom, bus, rest = bus_id.strip().lower().split(":")
    return f"{int(dom, 16):04x}:{bus}:{rest}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    sock_path = os.path.join(tempfile.mkdtemp(prefix="stepwise-gpu-"), "profiler.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(sock_path)
    got, stop = [], threading.Event()
    t = threading.Thread(target=receive, args=(rx, got, stop), daemon=True)
    t.start()
    os.environ.update({"NCCL_PROFILER_PLUGIN": os.path.abspath(a.plugin), "STEPWISE_PROFILER_SOCKET": sock_path,
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "NCCL_DEBUG": "WARN"})
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    p = torch.cuda.get_device_properties(0)
    if all(hasattr(p, k) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        dev_bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    else:
        dev_bus = sysfs_spelling(os.popen("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0").read())
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    x = torch.ones(16 << 20, device="cuda")  # 64 MiB of float32
    dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(a.iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    host_per_call = (time.time() - t0) / a.iters
    dist.destroy_process_group()
    time.sleep(1.5)
    stop.set()
    t.join()

    headers = [h for h, _ in got]
    recs = [r for _, rs in got for r in rs if r["flags"] & FLAG_STARTED == 0]
    timed = [r for r in recs if r["gpu_start"] and r["gpu_end"]]
    gpu_ms = sorted((r["gpu_end"] - r["gpu_start"]) / 1e6 for r in timed)
    checks = {
        "datagrams_received": len(got) > 0,
        "nccl_version_reported": bool(headers) and all(h["nccl_version"] > 0 for h in headers),
        "gpu_is_the_device": bool(headers) and all(h["gpu"] == dev_bus for h in headers),
        "every_collective_recorded": len(recs) >= a.iters,
        "seq_in_order": [r["seq"] for r in recs] == sorted(r["seq"] for r in recs),
        "bytes_right": all(r["bytes"] == 64 << 20 for r in recs[-a.iters:]),
        "gpu_times_ordered": all(r["gpu_end"] >= r["gpu_start"] for r in timed),
    }
    summary = {
        "checks": checks,
        "device_bus_id": dev_bus,
        "headers_gpu": sorted({h["gpu"] for h in headers}),
        "nccl_version": sorted({h["nccl_version"] for h in headers}),
        "event_mask": sorted({h["mask"] for h in headers}),
        "records": len(recs),
        "gpu_timed_records": len(timed),
        "gpu_ms_median": gpu_ms[len(gpu_ms) // 2] if gpu_ms else None,
        "host_ms_per_call": host_per_call * 1e3,
        "torch": torch.__version__,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
        f.write(text + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
