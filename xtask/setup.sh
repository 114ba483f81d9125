#!/usr/bin/env bash
# One-time host set-up for Stepwise: apt packages, nightly rust-src, bpf-linker.
# Idempotent and quick when everything is already present. Called by `cargo xtask setup`
# (and by `demo`/`test`), never needs a prompt.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

APT_PKGS=(gcc make iproute2 ethtool prometheus prometheus-node-exporter openmpi-bin libopenmpi-dev bpftool libcap2-bin procps chromium time openssl ca-certificates)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing apt packages: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# aya-build compiles the eBPF crate with the nightly toolchain (-Z build-std=core).
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "setup: installing the nightly toolchain (minimal, with rust-src)"
  rustup toolchain install nightly --profile minimal --component rust-src
elif ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  echo "setup: adding rust-src to the nightly toolchain"
  rustup component add rust-src --toolchain nightly
fi

if ! bpf-linker --version 2>/dev/null | grep -q '0\.10\.4'; then
  echo "setup: installing bpf-linker 0.10.4 (about a minute)"
  cargo install bpf-linker@0.10.4 --locked
fi

# tracefs and bpffs are not mounted by default on this kind of machine.
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
echo "setup: ok"
