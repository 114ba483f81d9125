#!/usr/bin/env bash
# Builds every test workload into tests/workloads/build/ (gitignored):
#   libnccl.so.2 (+ libnccl.so), nccl_steps, nccl_abi_test, mpi_steps, mpi_groups.
# Idempotent and incremental (make). Fails loudly when a compiler is missing.
# Usage: build.sh [clean]   (CC / MPICC select the compilers)
set -euo pipefail
cd "$(dirname "$0")"
need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "build.sh: '$1' not found: $2" >&2
    exit 1
  }
}
need make "install make"
need "${CC:-gcc}" "install gcc"
need "${MPICC:-mpicc}" "install openmpi-bin and libopenmpi-dev (Debian) for mpi_steps"
[[ "${1:-}" == clean ]] && exec make clean
# -j2: the machine this runs on is small and shared.
make -j2 --no-print-directory CC="${CC:-gcc}" MPICC="${MPICC:-mpicc}"
echo "build.sh: built into $(pwd)/build"
