// bench_policy_loss_cuda — the CUDA policy loss (kernels/ulorl/kernels/policy_loss.cuh) against a
// device-to-device copy measured in the same run (the achievable DRAM bandwidth, counted as read +
// write). For each case it prints the time, the bytes the loss must move (every input read once,
// every gradient written once), the achieved GB/s and its fraction of the copy's:
//   loss        from log-probs, rows of 4096 tokens; "lean" (PPO clip-higher, mask; 20 B/token in
//               float) and "full" (+ k3 KL, rollout weights, entropy term: 36 B/token in float),
//               float and bf16 inputs, with the value scan off (the kernel alone) and on (default:
//               one more read of every input);
//   from logits bf16 logits [N, V = 151936]: forward + loss + backward in place (3 N V element
//               transfers; the token arrays are negligible beside them).
// One JSON object per line with --json. Usage: bench_policy_loss_cuda [--json]
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <ulorl/kernels/policy_loss.cuh>

#include "cuda_check.hpp"
#include "cuda_timing.hpp"

namespace {

namespace uc = ulorl::cuda;

//! Deterministic values in [lo, hi) (hash of the index).
template <class T>
__global__ void fill(T* x, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t h = (static_cast<std::uint64_t>(i) + seed) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    const float u = static_cast<float>(h & 0xffffff) / 16777216.0f;
    x[i] = uc::detail::from_float<T>(lo + (hi - lo) * u);
  }
}
//! 1 on the first 90% of each row of `cols`, 0 after (a response mask).
__global__ void fill_mask(float* m, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m[i] = (i % cols) < cols * 9 / 10 ? 1.0f : 0.0f;
}

using ulorl_cuda_test::time_ms;

double copy_gbs(bool json) {
  const std::size_t bytes = std::size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  CUDA_OK(cudaMalloc(&a, bytes));
  CUDA_OK(cudaMalloc(&b, bytes));
  CUDA_OK(cudaMemset(a, 1, bytes));
  const float ms = time_ms([&] { CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  const double gbs = 2.0 * static_cast<double>(bytes) / (ms * 1e6);
  if (json)
    std::printf("{\"case\": \"copy\", \"bytes\": %zu, \"ms\": %.4f, \"gbps\": %.1f}\n", bytes, ms, gbs);
  else
    std::printf("%-44s %10.3f ms %9.1f GB/s (read + write)\n", "device-to-device copy, 1 GiB", ms, gbs);
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  return gbs;
}

void report(bool json, const std::string& name, double ms, double bytes, double copy, std::size_t workspace) {
  const double gbs = bytes / (ms * 1e6);
  if (json)
    std::printf("{\"case\": \"%s\", \"ms\": %.4f, \"bytes\": %.0f, \"gbps\": %.1f, \"of_copy\": %.3f, \"workspace\": %zu}\n",
                name.c_str(), ms, bytes, gbs, gbs / copy, workspace);
  else
    std::printf("%-44s %10.3f ms %9.1f GB/s %6.1f%% of copy  workspace %zu B\n", name.c_str(), ms, gbs, 100.0 * gbs / copy,
                workspace);
}

template <class T>
void loss_case(std::int64_t tokens, bool full, bool check, bool json, double copy) {
  const std::int64_t cols = 4096, rows = tokens / cols, n = rows * cols;
  T *lp, *old, *adv, *ref, *w, *ent;
  float *mask, *g, *ge;
  for (T** p : {&lp, &old, &adv, &ref, &w, &ent}) CUDA_OK(cudaMalloc(p, n * sizeof(T)));
  for (float** p : {&mask, &g, &ge}) CUDA_OK(cudaMalloc(p, n * sizeof(float)));
  fill<<<1024, 256>>>(old, n, 1, -4.0f, 0.0f);
  fill<<<1024, 256>>>(lp, n, 2, -4.0f, 0.0f);
  fill<<<1024, 256>>>(adv, n, 3, -2.0f, 2.0f);
  fill<<<1024, 256>>>(ref, n, 4, -4.0f, 0.0f);
  fill<<<1024, 256>>>(w, n, 5, 0.5f, 1.5f);
  fill<<<1024, 256>>>(ent, n, 6, 0.0f, 3.0f);
  fill_mask<<<1024, 256>>>(mask, n, cols);
  ulorl::policy_loss_result* r;
  CUDA_OK(cudaMalloc(&r, sizeof(*r)));
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.check_values = check;
  if (full) cfg.kl_coef = 0.01, cfg.entropy_coef = 0.001;
  cfg.normalizer = {ulorl::agg_mode::token_mean, static_cast<double>(n) * 0.9, 1.0};
  const uc::policy_loss_inputs<T, float> in{lp, old, adv, mask, full ? ref : nullptr, full ? w : nullptr, full ? ent : nullptr};
  const uc::policy_loss_outputs out{g, full ? ge : nullptr, r, nullptr};
  const auto lay = uc::token_layout::padded(rows, cols);
  std::size_t bytes = 0;
  CUDA_OK(uc::policy_loss(nullptr, bytes, lay, in, out, cfg));
  void* ws;
  CUDA_OK(cudaMalloc(&ws, bytes));
  const float ms = time_ms([&] { CUDA_OK(uc::policy_loss(ws, bytes, lay, in, out, cfg)); }, 20);
  // Bytes the loss must move: the token inputs once, the mask once, the gradients once.
  const double per_token = (full ? 6.0 : 3.0) * sizeof(T) + sizeof(float) + (full ? 2.0 : 1.0) * sizeof(float);
  const std::string name = std::string("loss ") + (full ? "full " : "lean ") + (std::is_same_v<T, float> ? "f32 " : "bf16 ") +
                           std::to_string(n >> 20) + "M tokens" + (check ? " +scan" : "");
  report(json, name, ms, per_token * static_cast<double>(n), copy, bytes);
  for (void* p : {static_cast<void*>(lp), static_cast<void*>(old), static_cast<void*>(adv), static_cast<void*>(ref),
                  static_cast<void*>(w), static_cast<void*>(ent), static_cast<void*>(mask), static_cast<void*>(g),
                  static_cast<void*>(ge), static_cast<void*>(r), ws})
    CUDA_OK(cudaFree(p));
}

void logits_case(std::int64_t tokens, bool json, double copy) {
  const std::int64_t vocab = 151936, rows = tokens / 1024, cols = 1024;
  __nv_bfloat16* x;
  std::int64_t* y;
  float *old, *adv, *mask;
  CUDA_OK(cudaMalloc(&x, tokens * vocab * sizeof(__nv_bfloat16)));
  CUDA_OK(cudaMalloc(&y, tokens * sizeof(std::int64_t)));
  for (float** p : {&old, &adv, &mask}) CUDA_OK(cudaMalloc(p, tokens * sizeof(float)));
  fill<<<4096, 256>>>(x, tokens * vocab, 7, -6.0f, 6.0f);
  CUDA_OK(cudaMemset(y, 0, tokens * sizeof(std::int64_t)));
  fill<<<1024, 256>>>(old, tokens, 1, -14.0f, -10.0f);
  fill<<<1024, 256>>>(adv, tokens, 3, -2.0f, 2.0f);
  fill_mask<<<1024, 256>>>(mask, tokens, cols);
  ulorl::policy_loss_result* r;
  CUDA_OK(cudaMalloc(&r, sizeof(*r)));
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.normalizer = {ulorl::agg_mode::token_mean, static_cast<double>(tokens) * 0.9, 1.0};
  const uc::policy_loss_inputs<float, float, float> in{nullptr, old, adv, mask};
  const uc::logits_loss_outputs<__nv_bfloat16> out{x, vocab, r, nullptr};  // in place
  const auto lay = uc::token_layout::padded(rows, cols);
  std::size_t bytes = 0;
  CUDA_OK(uc::policy_loss_from_logits(nullptr, bytes, x, vocab, vocab, y, lay, in, out, cfg));
  void* ws;
  CUDA_OK(cudaMalloc(&ws, bytes));
  const float ms = time_ms([&] { CUDA_OK(uc::policy_loss_from_logits(ws, bytes, x, vocab, vocab, y, lay, in, out, cfg)); }, 10);
  report(json, "from logits bf16 " + std::to_string(tokens) + " x 151936 in place", ms,
         3.0 * static_cast<double>(tokens) * static_cast<double>(vocab) * sizeof(__nv_bfloat16), copy, bytes);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(old), static_cast<void*>(adv),
                  static_cast<void*>(mask), static_cast<void*>(r), ws})
    CUDA_OK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_policy_loss_cuda: no CUDA device\n");
    return 77;
  }
  const double copy = copy_gbs(json);
  for (std::int64_t tokens : {std::int64_t{1} << 20, std::int64_t{4} << 20, std::int64_t{16} << 20})
    for (bool full : {false, true})
      for (bool check : {false, true}) {
        loss_case<float>(tokens, full, check, json, copy);
        loss_case<__nv_bfloat16>(tokens, full, check, json, copy);
      }
  for (std::int64_t tokens : {std::int64_t{4096}, std::int64_t{16384}}) logits_case(tokens, json, copy);
  return 0;
}
