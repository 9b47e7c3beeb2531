#!/usr/bin/env bash
# Installs what ulorl's build, tests, examples and benchmarks need on Debian 12 / Ubuntu 22.04+,
# through apt. Idempotent: installs only missing packages and runs `apt-get update` only then.
# Usage: scripts/install-deps.sh [--bench] [--cuda]   (as root, or with sudo available)
#   --bench  also installs Debian's PyTorch (python3-torch) for bench/compare_torch.py
#   --cuda   also installs a CUDA compiler, so that CTest compiles the CUDA kernels' tests (running
#            them needs a GPU; without one they are skipped): nothing if an nvcc is already on the
#            PATH or in /usr/local/cuda/bin; otherwise Debian's nvidia-cuda-toolkit (CUDA 11.8, in
#            non-free; its dependencies need contrib too; both are enabled for it: about 1.6 GB to
#            download).
set -euo pipefail

packages=(
  g++ cmake make            # compiler and build
  catch2                    # tests (Catch2 v2 on Debian 12)
  nlohmann-json3-dev        # the golden conformance runner reads JSON
  libbenchmark-dev          # microbenchmarks (Google Benchmark)
  libeigen3-dev             # the end-to-end demo's model (optional adapter)
  libxtensor-dev            # the optional xtensor adapter (ulorl::xtensor; xtensor 0.24 on Debian 12)
  clang-14 libfuzzer-14-dev libclang-rt-14-dev  # the sanitised tests (ULORL_SANITIZE_CXX) and fuzz targets
  libopenmpi-dev openmpi-bin  # exactness across processes (tests/mpi)
  libtorch-dev libopenblas0-pthread  # ulorl::torch (tests/torch); OpenBLAS so torch's GEMMs are fair
  python3-torch python3-pybind11 pybind11-dev python3-dev python3-numpy python3-pytest  # python/ (import ulorl)
)
want_cuda=0
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(python3 python3-torch) ;;
    --cuda) want_cuda=1 ;;
    *) echo "install-deps: unknown option '$arg' (expected --bench, --cuda)" >&2; exit 2 ;;
  esac
done

# Runs a command as root (directly, or through sudo).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else echo "install-deps: need root or sudo for: $*" >&2; exit 1; fi
}

# CUDA: an existing toolkit wins; else Debian's (non-free) nvidia-cuda-toolkit.
need_update=0
if [ "$want_cuda" = 1 ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "install-deps: nvcc present ($(command -v nvcc || echo /usr/local/cuda/bin/nvcc))"
  else
    packages+=(nvidia-cuda-toolkit)
    . /etc/os-release
    candidate() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]'; }
    # nvidia-cuda-toolkit is in non-free, nvidia-support (a dependency) in contrib.
    if [ "${ID:-}" = debian ] && ! { candidate nvidia-cuda-toolkit && candidate nvidia-support; }; then
      # Enable contrib + non-free for the main archive (the entry whose URI ends in /debian; not
      # security or third-party ones), with the same signing options as that entry: apt refuses
      # two entries for one source whose Signed-By differ.
      list=/etc/apt/sources.list.d/ulorl-non-free
      as_root rm -f "$list.list" "$list.sources"
      line=$(set +o pipefail; cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
             | grep -E '^deb +(\[[^]]*\] +)?https?://[^ ]*/debian/? ' | head -1) || true
      stanza=$(set +o pipefail; cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v RS= '
               /(^|\n)URIs:[^\n]*\/debian\/?(\n| |$)/ { print; exit }') || true
      if [ -n "$line" ]; then
        opts=$(echo "$line" | grep -oE '\[[^]]*\]' || true)
        uri=$(echo "$line" | grep -oE 'https?://[^ ]+' | head -1)
        entry="deb ${opts:+$opts }$uri $VERSION_CODENAME contrib non-free"
        echo "$entry" | as_root tee "$list.list" >/dev/null
      else
        uri=$(echo "$stanza" | sed -n 's/^URIs:.*\(https\?:\/\/[^ ]*\/debian\/\?\)\( .*\)\?$/\1/p' | head -1)
        uri=${uri:-http://deb.debian.org/debian}
        signed=$(echo "$stanza" | sed -n 's/^Signed-By: *//p' | head -1)
        entry="Types: deb
URIs: $uri
Suites: $VERSION_CODENAME
Components: contrib non-free${signed:+
Signed-By: $signed}"
        echo "$entry" | as_root tee "$list.sources" >/dev/null
      fi
      echo "install-deps: enabled Debian contrib + non-free ($uri $VERSION_CODENAME) for nvidia-cuda-toolkit"
      need_update=1
    fi
  fi
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ] && [ "$need_update" = 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
as_root apt-get update -q
as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
