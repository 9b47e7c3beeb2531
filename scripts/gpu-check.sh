#!/usr/bin/env bash
# scripts/gpu-check.sh — on a machine with an NVIDIA GPU, in one call: build the CUDA logits test
# and benchmark with nvcc for this GPU's architecture, run the test (GPU vs CPU kernels), then the
# benchmark (achieved bandwidth vs a device-to-device copy measured in the same run).
# Usage: scripts/gpu-check.sh [--json] [rows...]   env: NVCC, ULORL_CUDA_ARCH (e.g. 90), OUT (log dir)
# Exit status: non-zero if the build or the test fails. Logs go to $OUT (default build/gpu-check).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=${OUT:-$root/build/gpu-check}
mkdir -p "$out"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv,noheader | tee "$out/device.txt"
arch=${ULORL_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.[:space:]')}
echo "nvcc: $("$nvcc" --version | tail -1); arch sm_$arch"

flags=(-std=c++17 --expt-relaxed-constexpr -O3 -gencode "arch=compute_$arch,code=sm_$arch"
       -I "$root/include" -I "$root/kernels")
t0=$(date +%s)
# The CPU reference the test compares with is C++20 (host compiler); the .cu files are C++17.
"${CXX:-g++}" -std=c++20 -O2 -I "$root/include" -c "$root/tests/cuda/cpu_reference.cpp" -o "$bin/cpu_reference.o"
"$nvcc" "${flags[@]}" "$root/tests/cuda/test_logits_cuda.cu" "$bin/cpu_reference.o" -o "$bin/test_logits_cuda" &
p1=$!
"$nvcc" "${flags[@]}" "$root/tests/cuda/bench_logits_cuda.cu" -o "$bin/bench_logits_cuda" &
p2=$!
wait $p1
wait $p2
echo "built in $(( $(date +%s) - t0 )) s"

echo "== test_logits_cuda"
"$bin/test_logits_cuda" | tee "$out/test.txt"
echo "== bench_logits_cuda (bandwidth vs device-to-device copy, same run)"
"$bin/bench_logits_cuda" "$@" | tee "$out/bench.txt"
