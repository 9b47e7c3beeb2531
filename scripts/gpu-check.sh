#!/usr/bin/env bash
# scripts/gpu-check.sh — on a machine with an NVIDIA GPU, in one call: build every CUDA test, benchmark
# and example with nvcc for this GPU's architecture (in parallel), run the tests (GPU against the CPU
# kernels) and the example, then the benchmarks: achieved bandwidth against a device-to-device copy
# measured in the same run (logits forward/backward, the policy loss from log-probs, the fused loss
# from logits), the linear head against cuBLAS GEMM alone on the same shapes, and, when a CUDA build
# of torch is importable, torch eager on the same policy-loss cases (time and peak memory) and the
# torch operators on CUDA tensors (the package built with its CUDA kernel; test_torch_ops_cuda).
# Usage: scripts/gpu-check.sh   env: NVCC, ULORL_CUDA_ARCH (e.g. 90), OUT (log dir), CXX, JOBS
# Exit status: non-zero if a build, a test or the example fails. Logs go to $OUT (default build/gpu-check).
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
cudalib=$(dirname "$(dirname "$nvcc")")/lib64

flags=(-std=c++17 --expt-relaxed-constexpr -O3 -gencode "arch=compute_$arch,code=sm_$arch"
       -I "$root/include" -I "$root/kernels" -I "$root/tests/cuda")
t0=$(date +%s)
# The CPU references the tests compare with are C++20 (host compiler); the .cu files are C++17.
refs=()
for src in "$root"/tests/cuda/cpu_reference*.cpp; do
  obj="$bin/$(basename "$src" .cpp).o"
  "${CXX:-g++}" -std=c++20 -O2 -I "$root/include" -c "$src" -o "$obj" &
  refs+=("$obj")
done
wait
pids=()
build() {  # build NAME SOURCE [extra args...]
  local name=$1 src=$2
  shift 2
  "$nvcc" "${flags[@]}" "$src" "$@" -o "$bin/$name" > "$out/build-$name.txt" 2>&1 &
  pids+=($!)
}
for t in test_logits_cuda test_loss_token_cuda test_policy_loss_cuda bench_logits_cuda bench_policy_loss_cuda; do
  build "$t" "$root/tests/cuda/$t.cu" "${refs[@]}"
done
build cuda_policy_loss "$root/examples/cuda_policy_loss.cu"
if [ -f "$root/tests/cuda/test_linear_head_cuda.cu" ]; then
  build test_linear_head_cuda "$root/tests/cuda/test_linear_head_cuda.cu" "${refs[@]}" -L"$cudalib" -lcublas
  build bench_linear_head_cuda "$root/tests/cuda/bench_linear_head_cuda.cu" -L"$cudalib" -lcublas
fi
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
echo "built in $(( $(date +%s) - t0 )) s"
if [ "$status" != 0 ]; then
  tail -n 30 "$out"/build-*.txt
  exit 1
fi

fail=0
for t in test_logits_cuda test_loss_token_cuda test_policy_loss_cuda test_linear_head_cuda cuda_policy_loss; do
  [ -x "$bin/$t" ] || continue
  echo "== $t"
  rc=0
  "$bin/$t" > "$out/$t.txt" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    fail=1
    echo "FAILED (rc $rc): $out/$t.txt"
  fi
  tail -n 4 "$out/$t.txt"
done

echo "== bench_logits_cuda (bandwidth vs device-to-device copy, same run)"
"$bin/bench_logits_cuda" | tee "$out/bench_logits.txt"
echo "== bench_policy_loss_cuda (bandwidth vs device-to-device copy, same run)"
"$bin/bench_policy_loss_cuda" | tee "$out/bench_policy_loss.txt"
"$bin/bench_policy_loss_cuda" --json > "$out/bench_policy_loss.json"
if [ -x "$bin/bench_linear_head_cuda" ]; then
  echo "== bench_linear_head_cuda (against cuBLAS GEMM alone, same shapes)"
  "$bin/bench_linear_head_cuda" | tee "$out/bench_linear_head.txt"
fi
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  echo "== torch eager on the same cases (time and peak memory above the inputs)"
  python3 "$root/bench/torch_cuda_policy_loss.py" --ulorl "$out/bench_policy_loss.json" | tee "$out/torch.txt"
  # The torch operators on CUDA tensors: the package built as users build it (its CUDA kernel with
  # this torch and nvcc) into a virtual environment over this torch, then the operator tests (CUDA
  # against CPU, errors, torch.compile on the GPU), and the C++ adapter's test_torch_ops_cuda.
  echo "== torch operators on CUDA tensors (pip install ./python with CUDA; tests/python/test_ops*.py)"
  venv="$bin/venv"
  python3 -m venv --system-site-packages "$venv"
  if CUDA_HOME=$(dirname "$(dirname "$nvcc")") TORCH_CUDA_ARCH_LIST="${arch%?}.${arch: -1}" MAX_JOBS=${JOBS:-16} \
      "$venv/bin/pip" install --no-build-isolation --no-deps --no-index "$root/python" > "$out/build-python.txt" 2>&1; then
    (cd "$root/tests/python" && ULORL_GOLDEN_DIR="$root/tests/golden" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
      -rs test_ops_cuda.py test_presets_cuda.py test_ops.py) 2>&1 | tee "$out/test_ops_cuda.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    "$venv/bin/python" -c 'import ulorl, sys; sys.exit(0 if ulorl._ulorl.cuda_kernels else 1)' ||
      { echo "FAILED: the package was built without its CUDA kernel"; fail=1; }
  else
    fail=1
    echo "FAILED: pip install ./python: $out/build-python.txt"
    tail -n 30 "$out/build-python.txt"
  fi
  prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  if cmake -S "$root" -B "$bin/torch-ops" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DULORL_CUDA_ARCHITECTURES="$arch" -DULORL_BUILD_TESTS=ON \
      -DULORL_BUILD_EXAMPLES=OFF -DULORL_BUILD_BENCH=OFF -DULORL_BUILD_PYTHON=OFF > "$out/build-torch-ops.txt" 2>&1 &&
     cmake --build "$bin/torch-ops" -j "${JOBS:-16}" --target test_torch_ops_cuda >> "$out/build-torch-ops.txt" 2>&1; then
    echo "== test_torch_ops_cuda"
    "$bin/torch-ops/tests/torch/test_torch_ops_cuda" 2>&1 | tee "$out/test_torch_ops_cuda.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  else
    fail=1
    echo "FAILED: building test_torch_ops_cuda: $out/build-torch-ops.txt"
    tail -n 30 "$out/build-torch-ops.txt"
  fi
else
  echo "== torch eager and the torch operators: no CUDA build of torch importable, skipped"
fi
exit $fail
