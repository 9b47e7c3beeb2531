// bench_logits_cuda — the CUDA logits kernels at V = 151936 against a device-to-device copy measured
// in the same run (the achievable DRAM bandwidth). For each shape it prints achieved GB/s and the
// fraction of copy bandwidth for forward (reads N V), backward (reads + writes N V) and
// forward + backward (3 N V element transfers), one JSON object per line with --json.
// Usage: bench_logits_cuda [--json] [rows...]   (default rows: 64 1024 4096 16384)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ulorl/kernels/logits.cuh>

#include "cuda_check.hpp"
#include "cuda_timing.hpp"

namespace {

constexpr std::int64_t vocab = 151936;

template <class T>
__global__ void fill(T* x, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t h = (static_cast<std::uint64_t>(i) + seed) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    const float u = static_cast<float>(h & 0xffffff) / 16777216.0f;
    const float v = 12.0f * u - 6.0f;
    if constexpr (std::is_same_v<T, float>)
      x[i] = v;
    else if constexpr (std::is_same_v<T, __half>)
      x[i] = __float2half_rn(v);
    else
      x[i] = __float2bfloat16_rn(v);
  }
}

using ulorl_cuda_test::time_ms;

template <class T>
void run(std::int64_t rows, bool json, const char* tname) {
  const std::int64_t n = rows * vocab;
  const double bytes = static_cast<double>(n) * sizeof(T);
  T *x = nullptr, *g = nullptr;
  std::int64_t* y = nullptr;
  float* stats = nullptr;
  CUDA_OK(cudaMalloc(&x, n * sizeof(T)));
  CUDA_OK(cudaMalloc(&g, n * sizeof(T)));
  CUDA_OK(cudaMalloc(&y, rows * sizeof(std::int64_t)));
  CUDA_OK(cudaMalloc(&stats, 5 * rows * sizeof(float)));
  fill<<<1024, 256>>>(x, n, 1);
  std::vector<std::int64_t> hy(rows);
  for (std::int64_t r = 0; r < rows; ++r) hy[r] = (r * 7919) % vocab;
  CUDA_OK(cudaMemcpy(y, hy.data(), rows * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  std::vector<float> ones(2 * rows, 0.01f);
  float *lp = stats, *ent = stats + rows, *lse = stats + 2 * rows, *glp = stats + 3 * rows, *gent = stats + 4 * rows;
  CUDA_OK(cudaMemcpy(glp, ones.data(), 2 * rows * sizeof(float), cudaMemcpyHostToDevice));
  std::size_t ws_bytes = 0;
  const ulorl::cuda::logits_config cfg{};
  CUDA_OK(ulorl::cuda::logits_forward(nullptr, ws_bytes, x, rows, vocab, vocab, y, lp, ent, lse, cfg));
  void* ws = nullptr;
  CUDA_OK(cudaMalloc(&ws, ws_bytes ? ws_bytes : 16));
  const int reps = rows >= 4096 ? 5 : 20;
  const float copy = time_ms([&] { CUDA_OK(cudaMemcpyAsync(g, x, n * sizeof(T), cudaMemcpyDeviceToDevice)); }, reps);
  const float fwd = time_ms(
      [&] { CUDA_OK(ulorl::cuda::logits_forward(ws, ws_bytes, x, rows, vocab, vocab, y, lp, ent, lse, cfg)); }, reps);
  const float bwd = time_ms(
      [&] { CUDA_OK(ulorl::cuda::logits_backward(x, rows, vocab, vocab, y, lse, ent, glp, gent, g, vocab, cfg)); }, reps);
  const float both = time_ms(
      [&] {
        CUDA_OK(ulorl::cuda::logits_forward(ws, ws_bytes, x, rows, vocab, vocab, y, lp, ent, lse, cfg));
        CUDA_OK(ulorl::cuda::logits_backward(x, rows, vocab, vocab, y, lse, ent, glp, gent, g, vocab, cfg));
      },
      reps);
  const double copy_bw = 2 * bytes / (copy * 1e-3);  // a copy reads and writes every byte
  const auto line = [&](const char* what, float ms, double moved) {
    const double bw = moved / (ms * 1e-3);
    if (json)
      std::printf("{\"case\": \"cuda_%s_%s_N%lld\", \"ms\": %.4f, \"GBps\": %.1f, \"copy_GBps\": %.1f, "
                  "\"fraction_of_copy\": %.3f, \"G_logits_per_s\": %.2f}\n",
                  what, tname, static_cast<long long>(rows), ms, bw / 1e9, copy_bw / 1e9, bw / copy_bw,
                  static_cast<double>(n) / (ms * 1e-3) / 1e9);
    else
      std::printf("  %-18s %9.3f ms  %7.1f GB/s  %5.1f%% of copy  %7.2f G logits/s\n", what, ms, bw / 1e9,
                  100 * bw / copy_bw, static_cast<double>(n) / (ms * 1e-3) / 1e9);
  };
  if (!json)
    std::printf("%s N=%lld V=%lld (%.2f GB of logits): device-to-device copy %.1f GB/s\n", tname,
                static_cast<long long>(rows), static_cast<long long>(vocab), bytes / 1e9, copy_bw / 1e9);
  line("forward", fwd, bytes);
  line("backward", bwd, 2 * bytes);
  line("forward+backward", both, 3 * bytes);
  CUDA_OK(cudaFree(ws));
  CUDA_OK(cudaFree(stats));
  CUDA_OK(cudaFree(y));
  CUDA_OK(cudaFree(g));
  CUDA_OK(cudaFree(x));
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<std::int64_t> rows;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0)
      json = true;
    else
      rows.push_back(std::atoll(argv[i]));
  }
  if (rows.empty()) rows = {64, 1024, 4096, 16384};
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP bench_logits_cuda: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  if (!json) std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  for (const auto r : rows) {
    run<__nv_bfloat16>(r, json, "bf16");
    if (r <= 4096) run<float>(r, json, "fp32");
  }
  return 0;
}
