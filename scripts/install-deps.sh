#!/usr/bin/env bash
# Installs what ulorl's build, tests, examples and benchmarks need on Debian 12 / Ubuntu 22.04+,
# through apt. Idempotent: installs only missing packages and runs `apt-get update` only then.
# Usage: scripts/install-deps.sh [--bench]   (as root, or with sudo available)
#   --bench  also installs Debian's PyTorch (python3-torch) for bench/compare_torch.py
set -euo pipefail

packages=(
  g++ cmake make            # compiler and build
  catch2                    # tests (Catch2 v2 on Debian 12)
  nlohmann-json3-dev        # the golden conformance runner reads JSON
  libbenchmark-dev          # microbenchmarks (Google Benchmark)
  libeigen3-dev             # the end-to-end demo's model (optional adapter)
)
if [ "${1:-}" = "--bench" ]; then packages+=(python3 python3-torch); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo_cmd=(sudo); else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; fi
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
