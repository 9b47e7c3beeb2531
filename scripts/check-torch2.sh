#!/usr/bin/env bash
# Builds ulorl's torch component and Python package against torch 2.x and runs their tests (the
# libtorch adapter's test_torch_adapter and every tests/python file): Debian
# 13 (trixie) ships python3-torch / libtorch-dev 2.6, used here from a Debian 13 root made with
# `debootstrap --variant=minbase trixie` on first use and kept (cached) for later runs. The source
# tree is bind-mounted read-only; the build lives inside the root. Nothing outside Debian's archive
# is downloaded. Then, in a second root with Debian 13's libtorch-cuda-dev 2.6 and its CUDA 12.4
# toolkit (contrib / non-free; they conflict with the CPU libtorch), the operators' CUDA kernels are
# compiled and linked, not run (no GPU is needed): test_torch_ops_cuda and the Python extension with
# its CUDA kernels. CI runs the torch 2.6 CPU part (ULORL_CHECK_TORCH2_CUDA=0; README's test command).
# Usage: scripts/check-torch2.sh            (as root, or through sudo: debootstrap, chroot and mount
#                                            need it)
#   ULORL_TRIXIE_ROOT  where the Debian 13 root lives (default /var/cache/ulorl/trixie)
#   ULORL_TRIXIE_CUDA_ROOT  the root with libtorch-cuda (default: ULORL_TRIXIE_ROOT-cuda)
#   ULORL_CHECK_TORCH2_CUDA=0  skips the CUDA step (its root takes about 2.5 GB of downloads once)
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
  if command -v sudo >/dev/null 2>&1; then
    exec sudo --preserve-env=ULORL_TRIXIE_ROOT,ULORL_TRIXIE_CUDA_ROOT,ULORL_CHECK_TORCH2_CUDA,ULORL_TRIXIE_MIRROR,JOBS \
      bash "$0" "$@"
  fi
  echo "check-torch2: run as root or with sudo available (debootstrap, chroot and mount need it)" >&2
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
bind() {  # bind <root> <host path> <path in the root> [ro]
  mkdir -p "$1$3"
  if ! mountpoint -q "$1$3"; then
    mount --bind "$2" "$1$3"
    mounted+=("$1$3")
    if [ "${4:-}" = ro ]; then mount -o remount,bind,ro "$1$3"; fi
  fi
}
bind_all() {  # bind_all <root>: /proc, /sys, /dev and the source tree (read-only, at /src)
  bind "$1" /proc /proc
  bind "$1" /sys /sys
  bind "$1" /dev /dev
  bind "$1" "$src" /src ro
}
bind_all "$root"

in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
# install_missing <root> <package>...: apt-get install of those not installed in that root.
install_missing() {
  local r=$1 p
  shift
  local missing=()
  for p in "$@"; do
    chroot "$r" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  chroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get update
  chroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}
install_missing "$root" "${packages[@]}"
echo "check-torch2: torch $(in_root python3 -c 'import torch; print(torch.__version__)'), $(in_root g++ --version | head -1)"

# The torch adapter's test and the Python package; the rest of the suite is CI's (Debian 12, torch
# 1.13). Debian 13's Catch2 is v3: tests/catch.hpp takes either.
in_root cmake -S /src -B /build/torch2 -DCMAKE_BUILD_TYPE=Release -DULORL_BUILD_TESTS=ON -DULORL_BUILD_EXAMPLES=OFF \
  -DULORL_BUILD_BENCH=OFF -DULORL_INSTALL=OFF -DULORL_ENABLE_CUDA=OFF
in_root cmake --build /build/torch2 -j "$jobs" --target test_torch_adapter torch_ops_bits ulorl_python
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

# The policy-loss operator's CUDA kernel against libtorch-cuda 2.6 and CUDA 12.4, built without a
# GPU: test_torch_ops_cuda (which checks the kernel is set and exits 77 without a device) and the
# Python extension with ULORL_PY_CUDA, whose CPU tests then run. nvidia-cudnn's installer downloads
# cuDNN from NVIDIA, which this offline root cannot: its configuration step is skipped, and a
# stand-in libcudnn.so.9 (each cuDNN function libtorch imports, returning an error status) lets the
# programs load; nothing calls cuDNN without a GPU.
if [ "${ULORL_CHECK_TORCH2_CUDA:-1}" != 0 ]; then
  croot=${ULORL_TRIXIE_CUDA_ROOT:-$root-cuda}
  if [ ! -x "$croot/usr/bin/apt-get" ]; then
    mkdir -p "$(dirname "$croot")"
    debootstrap --variant=minbase trixie "$croot" "$mirror"
  fi
  echo "deb $mirror trixie main contrib non-free non-free-firmware" > "$croot/etc/apt/sources.list"
  bind_all "$croot"
  in_croot() { chroot "$croot" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
  if ! install_missing "$croot" g++ cmake make catch2 nlohmann-json3-dev libtorch-cuda-dev python3-torch-cuda \
      nvidia-cuda-toolkit pybind11-dev python3-pybind11 python3-dev python3-numpy python3-pytest python3-setuptools; then
    printf '#!/bin/sh\nexit 0\n' > "$croot/var/lib/dpkg/info/nvidia-cudnn.postinst"
    in_croot dpkg --configure -a
  fi
  if [ ! -e "$croot/usr/local/lib/libcudnn.so.9" ]; then
    in_croot sh -c 'set -e; d=$(mktemp -d); lib=/usr/lib/x86_64-linux-gnu
      nm -D --undefined-only $lib/libtorch_cuda.so $lib/libtorch_python.so | awk "/@libcudnn.so.9/ {split(\$2, a, \"@\"); print a[1]}" |
        sort -u | awk "{print \"int \" \$1 \"(void) { return 1; }\"}" > $d/stub.c
      echo "libcudnn.so.9 { global: *; };" > $d/v.map
      gcc -shared -fPIC -o /usr/local/lib/libcudnn.so.9 $d/stub.c -Wl,--version-script=$d/v.map -Wl,-soname,libcudnn.so.9
      ldconfig; rm -rf $d'
  fi
  # nvcc 12.4 compiles with g++-13 and CMake then adds g++-13's library folder to the links, whose
  # libstdc++.so is older than the g++-14 one Debian 13's libraries need: g++-14's comes first.
  gcc14=-L/usr/lib/gcc/x86_64-linux-gnu/14
  in_croot cmake -S /src -B /build/cuda -DCMAKE_BUILD_TYPE=Release -DULORL_BUILD_TESTS=ON -DULORL_BUILD_EXAMPLES=OFF \
    -DULORL_BUILD_BENCH=OFF -DULORL_INSTALL=OFF -DULORL_BUILD_PYTHON=ON -DULORL_CUDA_ARCHITECTURES=90 \
    -DCMAKE_EXE_LINKER_FLAGS=$gcc14 -DCMAKE_MODULE_LINKER_FLAGS=$gcc14
  in_croot cmake --build /build/cuda -j "$jobs" --target test_torch_ops_cuda ulorl_python
  rc=0
  in_croot /build/cuda/tests/torch/test_torch_ops_cuda || rc=$?
  [ "$rc" = 77 ] || { echo "check-torch2: test_torch_ops_cuda exited $rc (77: no GPU, the kernel is set)" >&2; exit 1; }
  in_croot sh -c 'cd /src/tests/python && OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 ULORL_GOLDEN_DIR=/src/tests/golden \
    PYTHONPATH=/src/python:/build/cuda/python python3 -c "import ulorl, sys; sys.exit(0 if ulorl._ulorl.cuda_kernels else 1)" &&
    PYTHONPATH=/src/python:/build/cuda/python python3 -m pytest -q -p no:cacheprovider .'
  echo "check-torch2: the CUDA kernel built against libtorch-cuda $(in_croot dpkg-query -W -f='${Version}' \
    libtorch-cuda-dev) and $(in_croot nvcc --version | tail -1); Python tests passed with it (no GPU)"
fi
