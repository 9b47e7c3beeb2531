#!/usr/bin/env bash
# Builds ulorl's torch component and Python package against torch 2.x and runs their tests (the
# libtorch adapter's test_torch_adapter and every tests/python file): Debian
# 13 (trixie) ships python3-torch / libtorch-dev 2.6, used here from a Debian 13 root made with
# `debootstrap --variant=minbase trixie` on first use and kept (cached) for later runs. The source
# tree is bind-mounted read-only; the build lives inside the root. Nothing outside Debian's archive
# is downloaded.
# Usage: scripts/check-torch2.sh            (as root: debootstrap, chroot and mount need it)
#   ULORL_TRIXIE_ROOT  where the Debian 13 root lives (default /var/cache/ulorl/trixie)
#   ULORL_TRIXIE_MIRROR  the Debian mirror (default http://deb.debian.org/debian)
#   JOBS               parallel build jobs (default: nproc)
set -euo pipefail

root=${ULORL_TRIXIE_ROOT:-/var/cache/ulorl/trixie}
mirror=${ULORL_TRIXIE_MIRROR:-http://deb.debian.org/debian}
jobs=${JOBS:-$(nproc)}
src=$(cd "$(dirname "$0")/.." && pwd)
packages=(g++ cmake make catch2 nlohmann-json3-dev libtorch-dev python3-torch pybind11-dev python3-pybind11
          python3-dev python3-numpy python3-pytest python3-pip python3-venv python3-setuptools)

if [ "$(id -u)" -ne 0 ]; then
  echo "check-torch2: run as root (debootstrap, chroot and mount need it)" >&2
  exit 1
fi
if [ ! -x "$root/usr/bin/apt-get" ]; then
  command -v debootstrap >/dev/null || apt-get install -y debootstrap
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase trixie "$root" "$mirror"
fi

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind <host path> <path in the root> [ro]
  mkdir -p "$root$2"
  if ! mountpoint -q "$root$2"; then
    mount --bind "$1" "$root$2"
    mounted+=("$root$2")
    if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$root$2"; fi
  fi
}
bind /proc /proc
bind /sys /sys
bind /dev /dev
bind "$src" /src ro

in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
missing=()
for p in "${packages[@]}"; do
  in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  in_root apt-get update
  in_root apt-get install -y --no-install-recommends "${missing[@]}"
fi
echo "check-torch2: torch $(in_root python3 -c 'import torch; print(torch.__version__)'), $(in_root g++ --version | head -1)"

# The torch adapter's test and the Python package; the rest of the suite is CI's (Debian 12, torch
# 1.13). Debian 13's Catch2 is v3: tests/catch.hpp takes either.
in_root cmake -S /src -B /build/torch2 -DCMAKE_BUILD_TYPE=Release -DULORL_BUILD_TESTS=ON -DULORL_BUILD_EXAMPLES=OFF \
  -DULORL_BUILD_BENCH=OFF -DULORL_INSTALL=OFF -DULORL_ENABLE_CUDA=OFF
in_root cmake --build /build/torch2 -j "$jobs" --target test_torch_adapter ulorl_python
in_root ctest --test-dir /build/torch2 --output-on-failure -j 2 -R '^(test_torch_adapter|torch_docs_snippet|python_)'

# As a user installs it: `pip install --no-build-isolation ./python` into a venv over the system's
# torch, from a copy of the tree (the bind mount is read-only; pip builds in the tree), then the
# Python tests against the installed package.
in_root rm -rf /build/pip-src /build/venv
in_root mkdir -p /build/pip-src
in_root cp -a /src/include /src/python /build/pip-src/
in_root python3 -m venv --system-site-packages /build/venv
in_root env MAX_JOBS="$jobs" /build/venv/bin/pip install --no-build-isolation --no-deps --no-index /build/pip-src/python
in_root sh -c 'cd /src/tests/python && OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 ULORL_GOLDEN_DIR=/src/tests/golden \
  /build/venv/bin/python -m pytest -q -p no:cacheprovider .'
echo "check-torch2: passed on torch $(in_root python3 -c 'import torch; print(torch.__version__)')"
