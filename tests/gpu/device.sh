#!/usr/bin/env bash
# The one call on a lent GPU machine (never CI): tests/gpu/check.py with release builds made
# here and carried in DIR (default .gpu): DIR/agent (stripped), DIR/libnccl_profiler.so and,
# for the chained-plugin job, DIR/libnccl-profiler-chaintest.so (tests/workloads' build).
# Its output goes to $OUT (the device tool's folder) or /tmp. See tests/gpu/README.md.
set -u
dir=${1:-.gpu}
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader
uname -r
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
python3 -m pip list 2>/dev/null | grep -i nccl
chain=()
[ -f "$dir/libnccl-profiler-chaintest.so" ] && chain=(--chain "$dir/libnccl-profiler-chaintest.so")
exec python3 tests/gpu/check.py --plugin "$dir/libnccl_profiler.so" --agent "$dir/agent" "${chain[@]}" --out "$out"
