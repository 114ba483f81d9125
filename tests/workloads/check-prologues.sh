#!/usr/bin/env bash
# Checks the NCCL-ABI library the way the agent will use it (docs/platform-facts.md §3, §6):
#  - soname libnccl.so.2; .dynsym exports only nccl*, pnccl* and the three ncclIb* symbols;
#  - every API function exists as a strong pnccl* (T) and a weak nccl* (W) at one address;
#  - ncclIbIsend/ncclIbIrecv/ncclIbTest carry NCCL's mangled names and demangle to its
#    signatures, and are in .symtab;
#  - every probed symbol starts with push, nop, jmp, or endbr64 followed by push — any
#    other first instruction (lea, mov, test, sub ...) makes a uprobe single-step.
# Prints one line per probed symbol. Usage: check-prologues.sh [path/to/libnccl.so.2]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:-$here/build/libnccl.so.2}
for t in nm objdump readelf c++filt; do
  command -v "$t" >/dev/null || { echo "check-prologues: $t not found (binutils)" >&2; exit 2; }
done
[[ -f "$lib" ]] || { echo "check-prologues: $lib not found (run build.sh)" >&2; exit 2; }

fail=0
bad() { echo "FAIL: $*"; fail=1; }

api=(GetVersion GetUniqueId CommInitRank CommInitRankConfig CommSplit CommDestroy CommAbort
     CommCount CommUserRank CommGetAsyncError GetErrorString AllReduce ReduceScatter AllGather
     Broadcast Reduce Send Recv GroupStart GroupEnd
     AbiEnqueueCompute AbiStreamSynchronize AbiGpuTimer)
declare -A ib=(
  [_Z11ncclIbIsendPvS_miS_S_PS_]="ncclIbIsend(void*, void*, unsigned long, int, void*, void*, void**)"
  [_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_]="ncclIbIrecv(void*, int, void**, unsigned long*, int*, void**, void**, void**)"
  [_Z10ncclIbTestPvPiS0_]="ncclIbTest(void*, int*, int*)"
)

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" == libnccl.so.2 ]] || bad "soname is '$soname', want libnccl.so.2"

declare -A dyn_addr dyn_type
while read -r addr type name; do
  dyn_addr[$name]=$addr
  dyn_type[$name]=$type
  [[ "$name" == nccl* || "$name" == pnccl* || -n "${ib[$name]:-}" ]] ||
    bad "unexpected export $name"
done < <(nm -D --defined-only "$lib")

declare -A sym_addr
while read -r addr type name; do sym_addr[$name]=$addr; done < <(nm --defined-only "$lib")

# First two instructions at each function address (objdump labels an address with one
# of its names only, so aliases are matched by address).
declare -A first second
while IFS=$'\t' read -r addr i1 i2; do first[$addr]=$i1; second[$addr]=$i2; done < <(
  objdump -d --no-show-raw-insn "$lib" | awk '
    /^[0-9a-f]+ <[^>]+>:$/ { addr = $1; n = 0; next }
    addr != "" && /^ +[0-9a-f]+:\t/ {
      split($0, f, "\t"); ins[n++] = f[2]
      if (n == 2) { print addr "\t" ins[0] "\t" ins[1]; addr = "" }
    }')

prologue_ok() {
  case "$1" in
    push*|nop*|jmp*|xchg\ \ \ %ax,%ax) return 0 ;;
    endbr64) [[ "$2" == push* ]] ;;
    *) return 1 ;;
  esac
}

printf '%-36s %-8s %-5s %s\n' symbol address bind "first instruction"
check_fn() { # name, expected binding letters
  local name=$1 want=$2 addr=${sym_addr[$1]:-}
  if [[ -z "$addr" ]]; then bad "$name missing from .symtab"; return; fi
  local ins=${first[$addr]:-} ins2=${second[$addr]:-}
  local type=${dyn_type[$name]:--}
  [[ "$want" == *"$type"* ]] || bad "$name has binding '$type', want one of '$want'"
  printf '%-36s %-8s %-5s %s\n' "$name" "${addr#"${addr%%????????}"}" "$type" "$ins"
  prologue_ok "$ins" "$ins2" || bad "$name starts with '$ins'"
}

for f in "${api[@]}"; do
  check_fn "pnccl$f" T
  check_fn "nccl$f" W
  [[ "${dyn_addr[nccl$f]:-x}" == "${dyn_addr[pnccl$f]:-y}" ]] ||
    bad "nccl$f and pnccl$f are not at the same address"
done
for m in "${!ib[@]}"; do
  check_fn "$m" "Tt-"
  got=$(c++filt "$m")
  [[ "$got" == "${ib[$m]}" ]] || bad "$m demangles to '$got', want '${ib[$m]}'"
done

if [[ $fail -ne 0 ]]; then
  echo "check-prologues: FAILED"
  exit 1
fi
echo "check-prologues: ok (${#api[@]} API functions x2 aliases, ${#ib[@]} ncclIb* functions)"
