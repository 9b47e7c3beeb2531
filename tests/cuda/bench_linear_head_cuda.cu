// bench_linear_head_cuda — the CUDA chunked fused linear head (policy_loss_from_hidden, forward and
// backward, bf16 operands) against cuBLAS alone running the same GEMMs on the same shapes: per
// chunk the logits GEMM of pass 1, the recomputation of pass 2 (every chunk but the last), the
// grad_hidden GEMM and the grad_weight GEMM, with the launcher's own shapes, types and chunk size.
// The difference is the price of the statistics, the loss, the backward kernel and the bf16
// conversion of dZ. One line per shape: median milliseconds of the fused call and of the GEMMs
// alone, their ratio, the GEMMs' TFLOP/s, the chunk rows and the workspace bytes.
// Usage: bench_linear_head_cuda [--chunk C] [N H V]...   (default: 8192 4096 131072 and 2048 2048 32768)
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <ulorl/kernels/linear_head.cuh>

#include "cuda_check.hpp"

namespace {

namespace uc = ulorl::cuda;
using bf16 = __nv_bfloat16;

//! x[i] = scale * (uniform in [-1, 1)) from a hash of i and the seed.
template <class T>
__global__ void fill(T* x, std::int64_t n, std::uint64_t seed, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t h = (static_cast<std::uint64_t>(i) + seed) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    const float v = scale * (static_cast<float>(h & 0xffffff) / 8388608.0f - 1.0f);
    x[i] = uc::detail::from_float<T>(v);
  }
}

__global__ void fill_labels(std::int64_t* y, std::int64_t n, std::int64_t vocab) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = (i * 7919) % vocab;
}

//! Median milliseconds of `reps` timed runs after one warm-up run.
template <class F>
float median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  f();
  std::vector<float> ms(static_cast<std::size_t>(reps));
  for (auto& m : ms) {
    CUDA_OK(cudaEventRecord(a));
    f();
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&m, a, b));
  }
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run(cublasHandle_t handle, std::int64_t n, std::int64_t h, std::int64_t v, std::int64_t chunk) {
  bf16 *hidden = nullptr, *weight = nullptr, *grad_hidden = nullptr;
  float *grad_weight = nullptr, *old = nullptr, *adv = nullptr;
  std::int64_t *labels = nullptr, *status = nullptr;
  ulorl::policy_loss_result* result = nullptr;
  CUDA_OK(cudaMalloc(&hidden, n * h * sizeof(bf16)));
  CUDA_OK(cudaMalloc(&weight, v * h * sizeof(bf16)));
  CUDA_OK(cudaMalloc(&grad_hidden, n * h * sizeof(bf16)));
  CUDA_OK(cudaMalloc(&grad_weight, v * h * sizeof(float)));
  CUDA_OK(cudaMalloc(&old, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&adv, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&labels, n * sizeof(std::int64_t)));
  CUDA_OK(cudaMalloc(&status, sizeof(std::int64_t)));
  CUDA_OK(cudaMalloc(&result, sizeof(ulorl::policy_loss_result)));
  fill<<<1024, 256>>>(hidden, n * h, 1, 1.0f);
  fill<<<1024, 256>>>(weight, v * h, 2, 0.02f);  // logits of standard deviation ~0.4
  fill<<<1024, 256>>>(old, n, 3, 1.0f);          // shifted to ln(1/V) +- 0.1 below: ratios near 1
  fill<<<1024, 256>>>(adv, n, 4, 1.0f);
  fill_labels<<<1024, 256>>>(labels, n, v);
  CUDA_OK(cudaGetLastError());
  {
    std::vector<float> o(static_cast<std::size_t>(n));
    CUDA_OK(cudaMemcpy(o.data(), old, n * sizeof(float), cudaMemcpyDeviceToHost));
    const float lnv = -std::log(static_cast<float>(v));
    for (auto& x : o) x = lnv + 0.1f * x;
    CUDA_OK(cudaMemcpy(old, o.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  // Rows of 512 tokens where N allows, one row otherwise.
  const std::int64_t cols = n % 512 == 0 ? 512 : n;
  const uc::token_layout lay = uc::token_layout::padded(n / cols, cols);
  const uc::policy_loss_inputs<float, float, float> in{nullptr, old, adv};
  const uc::linear_head_outputs<bf16> out{grad_hidden, grad_weight, result, status};
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.normalizer = {ulorl::agg_mode::token_mean, static_cast<double>(n), 1.0};
  const uc::logits_config lcfg{};
  uc::linear_head_launch_config opt;
  opt.chunk_rows = chunk;
  std::size_t bytes = 0;
  std::int64_t c = 0;
  CUDA_OK(uc::linear_head_workspace_bytes<bf16>(n, v, lay.rows, bytes, c, lcfg, opt));
  void* ws = nullptr;
  CUDA_OK(cudaMalloc(&ws, bytes));
  const auto fused = [&] {
    std::size_t b = bytes;
    CUDA_OK(uc::policy_loss_from_hidden(ws, b, handle, hidden, n, h, weight, v, labels, lay, in, out, cfg, lcfg, opt));
  };
  // The launcher's GEMMs alone, in its order, on its workspace layout (fp32 logits, then bf16 dZ).
  auto* z = static_cast<float*>(ws);
  auto* dz = reinterpret_cast<bf16*>(static_cast<char*>(ws) +
                                     uc::detail::align_up(static_cast<std::size_t>(c * v) * sizeof(float)));
  const std::int64_t chunks = (n + c - 1) / c;
  const auto gemms = [&] {
    for (std::int64_t k = 0; k < chunks; ++k) {
      const std::int64_t r0 = k * c, rows = std::min(c, n - r0);
      CUDA_OK(uc::detail::head_logits(handle, hidden + r0 * h, rows, h, weight, v, z));
    }
    for (std::int64_t k = chunks - 1; k >= 0; --k) {
      const std::int64_t r0 = k * c, rows = std::min(c, n - r0);
      if (k != chunks - 1) CUDA_OK(uc::detail::head_logits(handle, hidden + r0 * h, rows, h, weight, v, z));
      CUDA_OK(uc::detail::head_grad_hidden(handle, dz, rows, h, weight, v, grad_hidden + r0 * h));
      CUDA_OK(uc::detail::head_grad_weight(handle, dz, rows, h, hidden + r0 * h, v, grad_weight, k != chunks - 1));
    }
  };
  const int reps = n * v >= (std::int64_t{1} << 29) ? 5 : 11;
  const float t_fused = median_ms(fused, reps);
  const float t_gemm = median_ms(gemms, reps);
  std::int64_t st = 0;
  CUDA_OK(cudaMemcpy(&st, status, sizeof(st), cudaMemcpyDeviceToHost));
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(v) * static_cast<double>(h) *
                       (3.0 + static_cast<double>(chunks - 1) / static_cast<double>(chunks));
  std::printf(
      "bf16 N=%-6lld H=%-5lld V=%-7lld chunk=%-5lld (%lld chunks)  fused %9.3f ms  GEMM only %9.3f ms  ratio %5.3f  "
      "GEMM %6.1f TFLOP/s  workspace %.3f GB%s\n",
      static_cast<long long>(n), static_cast<long long>(h), static_cast<long long>(v), static_cast<long long>(c),
      static_cast<long long>(chunks), t_fused, t_gemm, t_fused / t_gemm, flops / (t_gemm * 1e-3) / 1e12,
      static_cast<double>(bytes) / 1e9, st == 0 ? "" : "  (loss status != 0)");
  CUDA_OK(cudaFree(ws));
  CUDA_OK(cudaFree(result));
  CUDA_OK(cudaFree(status));
  CUDA_OK(cudaFree(labels));
  CUDA_OK(cudaFree(adv));
  CUDA_OK(cudaFree(old));
  CUDA_OK(cudaFree(grad_weight));
  CUDA_OK(cudaFree(grad_hidden));
  CUDA_OK(cudaFree(weight));
  CUDA_OK(cudaFree(hidden));
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t chunk = 0;
  std::vector<std::int64_t> dims;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--chunk") == 0 && i + 1 < argc)
      chunk = std::atoll(argv[++i]);
    else
      dims.push_back(std::atoll(argv[i]));
  }
  if (dims.empty()) dims = {8192, 4096, 131072, 2048, 2048, 32768};
  if (dims.size() % 3 != 0) {
    std::printf("usage: bench_linear_head_cuda [--chunk C] [N H V]...\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP bench_linear_head_cuda: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL cublasCreate\n");
    return 1;
  }
  for (std::size_t i = 0; i < dims.size(); i += 3) run(handle, dims[i], dims[i + 1], dims[i + 2], chunk);
  cublasDestroy(handle);
  return 0;
}
