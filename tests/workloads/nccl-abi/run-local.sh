#!/usr/bin/env bash
# Starts N ranks of nccl_steps (or nccl_abi_test) on this host and waits for all of them.
#
#   run-local.sh [--bin nccl_steps|nccl_abi_test] [--build DIR] N [nccl_steps options...]
#
# Each rank gets --rank R --nranks N --id-file F (a fresh temporary file); NCCL_ABI_*
# variables in the environment apply to every rank. Output lines are prefixed "[rR] ".
# Exits with the first non-zero rank status; kills the remaining ranks on Ctrl-C.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=nccl_steps
build="$here/../build"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ && "$1" -ge 1 ]] || { sed -n '2,9p' "$0" >&2; exit 2; }
n=$1; shift
exe="$build/$bin"
[[ -x "$exe" ]] || { echo "run-local.sh: $exe not built (run tests/workloads/build.sh)" >&2; exit 2; }

tmp=$(mktemp -d)
idf="$tmp/nccl-id"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

for ((r = 0; r < n; r++)); do
  if [[ "$bin" == nccl_abi_test || "$bin" == nccl_prof_test ]]; then
    args=("$r" "$n" "$idf")
  else
    args=(--rank "$r" --nranks "$n" --id-file "$idf" "$@")
  fi
  ( "$exe" "${args[@]}" 2>&1 | sed -u "s/^/[r$r] /" ; exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  if ! wait "$p"; then
    st=$?
    [[ $rc -ne 0 ]] || rc=$st
  fi
done
pids=()
exit "$rc"
