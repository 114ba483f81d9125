#!/usr/bin/env bash
# Two "servers" as network namespaces, each with 4 veth "NICs" wired rail to rail and
# shaped by TBF, 8 ranks of nccl_steps (4 per namespace, rank r on NIC r%4): runs the flat
# ring and the hierarchical algorithm and prints step times and bytes sent per NIC.
# A reference for the rail-imbalance scenario and a manual check of the address knobs.
# Needs root. Everything it creates is named sw<pid>* and removed on exit.
#
#   rails-demo.sh [--rate 400mbit] [--bytes 8388608] [--steps 5] [--algos "ring hierarchical"]
#
# Addresses (RFC 2544 benchmarking range): rail i is 198.18.i.1 (server A) <-> 198.18.i.2
# (server B). Traffic between ranks on one server stays inside its namespace (loopback,
# like NVLink); cross-server traffic leaves through the NIC that routes to the peer.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=$here/../build
rate=400mbit bytes=8388608 steps=5 algos="ring hierarchical"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --algos) algos=$2; shift 2 ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "rails-demo.sh: needs root (network namespaces)" >&2; exit 2; }
[[ -x $B/nccl_steps ]] || { echo "rails-demo.sh: run build.sh first" >&2; exit 2; }

p=sw$$
A=${p}a BNS=${p}b
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$BNS" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$A"
ip netns add "$BNS"
for ns in "$A" "$BNS"; do ip -n "$ns" link set lo up; done
for i in 0 1 2 3; do
  ip link add "${p}a$i" netns "$A" type veth peer name "${p}b$i" netns "$BNS"
  ip -n "$A" addr add "198.18.$i.1/24" dev "${p}a$i"
  ip -n "$BNS" addr add "198.18.$i.2/24" dev "${p}b$i"
  for side in "$A:${p}a$i" "$BNS:${p}b$i"; do
    ip -n "${side%%:*}" link set "${side#*:}" up
    tc -n "${side%%:*}" qdisc add dev "${side#*:}" root tbf rate "$rate" burst 64kb latency 200ms
  done
done
addrs=198.18.0.1,198.18.1.1,198.18.2.1,198.18.3.1,198.18.0.2,198.18.1.2,198.18.2.2,198.18.3.2
IFS=, read -r -a addr <<<"$addrs"

tx() { ip -n "$1" -s -j link show "$2" | sed -n 's/.*"tx":{"bytes":\([0-9]*\).*/\1/p'; }

for algo in $algos; do
  declare -A before=()
  for i in 0 1 2 3; do before[a$i]=$(tx "$A" "${p}a$i"); before[b$i]=$(tx "$BNS" "${p}b$i"); done
  rm -f "$tmp/id"
  pids=()
  for r in 0 1 2 3 4 5 6 7; do
    ns=$A host=A
    [[ $r -ge 4 ]] && ns=$BNS host=B
    ip netns exec "$ns" env NCCL_ABI_ALGO="$algo" NCCL_ABI_HOST=$host NCCL_ABI_LOCAL_SIZE=4 \
      NCCL_ABI_IFACE_ADDR="${addr[$r]}" NCCL_ABI_PEER_ADDRS="$addrs" \
      "$B/nccl_steps" --rank $r --nranks 8 --id-file "$tmp/id" --steps "$steps" \
      --bytes "$bytes" --compute-us 1000 >"$tmp/out.$r" 2>&1 &
    pids+=($!)
  done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if [[ $rc -ne 0 ]]; then
    echo "$algo: a rank failed"; cat "$tmp"/out.*; exit 1
  fi
  echo "== NCCL_ABI_ALGO=$algo, 8 ranks, $bytes bytes, TBF $rate per NIC and direction"
  grep -h summary "$tmp"/out.* | sed 's/.*rank=\([0-9]*\) .*comm_us_median=\([0-9.]*\).*checksum=\([0-9a-f]*\).*errors=\([0-9]*\)/  rank \1: allreduce median \2 us, checksum \3, errors \4/' | sort -k2n
  for i in 0 1 2 3; do
    printf '  rail %d: A->B %9d bytes, B->A %9d bytes\n' $i \
      $(( $(tx "$A" "${p}a$i") - ${before[a$i]} )) $(( $(tx "$BNS" "${p}b$i") - ${before[b$i]} ))
  done
done
