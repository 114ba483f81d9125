#!/usr/bin/env bash
# Smoke test of the workloads (about 10 s): builds, then
#  a) 4 ranks of nccl_steps on loopback, 5 steps of 8 MiB: all finish, results verified,
#     identical checksums; the ABI test on 4 ranks (ring) and 6 ranks (hierarchical);
#  b) mpi_steps on 4 ranks under mpirun: all finish, verified, identical checksums;
#  c) check-prologues.sh;
#  d) a rank SIGKILLed / SIGSTOPped mid-run: every other rank fails with an NCCL error
#     (at once / after NCCL_ABI_TIMEOUT_MS), none hangs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=$here/build
"$here/build.sh" >/dev/null
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
pass() { echo "PASS: $*"; }
failed() { echo "FAIL: $*"; fail=1; }

# Summary lines of N ranks: all present, errors=0, one checksum.
check_summaries() { # label file n
  local label=$1 f=$2 n=$3
  local got sums
  got=$(grep -c 'summary .* errors=0$' "$f" || true)
  sums=$(grep -o 'checksum=[0-9a-f]*' "$f" | sort -u | wc -l)
  if [[ "$got" -eq "$n" && "$sums" -eq 1 ]]; then
    pass "$label: $n ranks finished, results verified, checksums agree ($(grep -o 'checksum=[0-9a-f]*' "$f" | head -1))"
    grep summary "$f" | sed 's/^/    /'
  else
    failed "$label: $got of $n clean summaries, $sums distinct checksums"
    sed 's/^/    /' "$f"
  fi
}

export NCCL_ABI_IFACE_ADDR=127.0.0.1
# a) nccl_steps
if timeout 120 "$here/nccl-abi/run-local.sh" 4 --steps 5 --bytes 8388608 --compute-us 2000 \
    >"$tmp/nccl.out" 2>&1; then
  check_summaries "nccl_steps 4x8MiB loopback" "$tmp/nccl.out" 4
else
  failed "nccl_steps exited with an error"
  sed 's/^/    /' "$tmp/nccl.out"
fi
for cfg in "4:ring:" "6:hierarchical:3"; do
  IFS=: read -r n algo ls <<<"$cfg"
  if NCCL_ABI_ALGO=$algo NCCL_ABI_LOCAL_SIZE=$ls timeout 120 \
      "$here/nccl-abi/run-local.sh" --bin nccl_abi_test "$n" >"$tmp/abi.out" 2>&1 &&
      [[ $(grep -c ' ok$' "$tmp/abi.out") -eq $n ]]; then
    pass "nccl_abi_test $n ranks $algo: every collective exact"
  else
    failed "nccl_abi_test $n ranks $algo"
    sed 's/^/    /' "$tmp/abi.out"
  fi
done

# b) OpenMPI
if timeout 120 mpirun --oversubscribe --allow-run-as-root -np 4 "$B/mpi_steps" --steps 5 \
    --bytes 1048576 --compute-us 2000 >"$tmp/mpi.out" 2>&1; then
  check_summaries "mpi_steps 4x1MiB" "$tmp/mpi.out" 4
else
  failed "mpirun mpi_steps exited with an error"
  sed 's/^/    /' "$tmp/mpi.out"
fi

# c) prologues
if "$here/check-prologues.sh" >"$tmp/pro.out" 2>&1; then
  pass "$(tail -1 "$tmp/pro.out")"
else
  failed "check-prologues.sh"
  sed 's/^/    /' "$tmp/pro.out"
fi

# d) a dead rank (SIGKILL: its sockets close) and a hung one (SIGSTOP: nothing closes,
#    the others must give up after NCCL_ABI_TIMEOUT_MS) in the middle of the run.
export NCCL_ABI_TIMEOUT_MS=3000
peer_failure() { # signal
  local sig=$1 r ok=1 t0 ms
  rm -f "$tmp/id" "$tmp"/fail.*
  pids=()
  for r in 0 1 2 3; do
    "$B/nccl_steps" --rank $r --nranks 4 --id-file "$tmp/id" --steps 100000 --bytes 4194304 \
      --compute-us 1000 --no-verify >"$tmp/fail.$r" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 200); do # until every rank is stepping
    [[ $(cat "$tmp"/fail.* | grep -c '^step .*step=3 ') -eq 4 ]] && break
    sleep 0.1
  done
  exec 3>&2 2>/dev/null # no "Killed" job notice from bash
  kill -"$sig" "${pids[2]}"
  t0=$(date +%s%N)
  for r in 0 1 3; do
    if timeout 30 tail -s 0.05 --pid="${pids[$r]}" -f /dev/null; then :; else ok=0; fi
    if wait "${pids[$r]}"; then ok=0; echo "    rank $r exited 0"; fi
    grep -q 'ncclAllReduce failed: .*([26])$' "$tmp/fail.$r" || {
      ok=0
      echo "    rank $r: no ncclRemoteError/ncclSystemError:"
      tail -3 "$tmp/fail.$r" | sed 's/^/      /'
    }
  done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  kill -9 "${pids[2]}" 2>/dev/null || true
  wait "${pids[2]}" || true
  exec 2>&3 3>&-
  pids=()
  if [[ $ok -eq 1 ]]; then
    pass "SIG$sig of rank 2 mid-run: ranks 0,1,3 failed with an NCCL error within ${ms} ms"
    grep -h 'failed\|WARN' "$tmp"/fail.[013] | sed 's/^/    /'
  else
    failed "SIG$sig of rank 2"
  fi
}
peer_failure KILL
peer_failure STOP

[[ $fail -eq 0 ]] && echo "smoke: all passed" || { echo "smoke: FAILED"; exit 1; }
