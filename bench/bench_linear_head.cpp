// bench_linear_head — the chunked fused linear head (ulorl/logits/linear_head.hpp) with Qwen's
// vocabulary V = 151936, H = 1024, against a naive baseline in the same run: the full [N, V] logits
// materialised by a plain triple loop (hidden . weight^T), then the three-pass reference (max; sum of
// exp; log-prob and entropy with scalar std::exp), per row.
// Items are logits (N V per iteration), bytes the weight read once; counters: GFLOP/s of the GEMMs
// (2 N V H per GEMM: one forward, three forward + backward) and the speed-up over the baseline.
// Single-threaded, CPU time (the development machine is shared). ULORL_BENCH_HEAD_H overrides H.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ulorl/logits.hpp>

#include "bench_common.hpp"

namespace {

constexpr std::size_t vocab = 151936;

std::size_t hidden_size() { return bench::env_size("ULORL_BENCH_HEAD_H", 1024); }

struct data {
  std::size_t rows = 0, h = 0;
  std::vector<float> hidden, weight, grad_hidden, grad_weight;
  std::vector<std::int64_t> labels;
  std::vector<double> lp, ent, lse, glp, gent;
  std::vector<std::byte> workspace;
};

// Weights ~ N(0, 1/H)-ish from a cheap hash, hidden ~ U(-1.7, 1.7): logits of order 1.
data& shared(std::size_t rows) {
  static data d;
  const std::size_t h = hidden_size();
  if (d.rows >= rows && d.h == h) return d;
  d = data{};
  d.rows = rows;
  d.h = h;
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  const auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xffff) / 65535.0f * 2.0f - 1.0f;
  };
  d.hidden.resize(rows * h);
  for (auto& x : d.hidden) x = 1.7f * next();
  d.weight.resize(vocab * h);
  const float ws = 1.7f / std::sqrt(static_cast<float>(h));
  for (auto& x : d.weight) x = ws * next();
  d.grad_hidden.assign(rows * h, 0.0f);
  d.grad_weight.assign(vocab * h, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) d.labels.push_back(static_cast<std::int64_t>((r * 7919) % vocab));
  d.lp.assign(rows, 0);
  d.ent.assign(rows, 0);
  d.lse.assign(rows, 0);
  d.glp.assign(rows, -1.0 / static_cast<double>(rows));
  d.gent.assign(rows, 0.01 / static_cast<double>(rows));
  return d;
}

ulorl::linear_head_inputs<float> inputs(const data& d, std::size_t n) {
  return {ulorl::matrix_view<const float>(d.hidden.data(), n, d.h), ulorl::matrix_view<const float>(d.weight.data(), vocab, d.h)};
}

void set_counters(benchmark::State& st, std::size_t n, std::size_t h, double gemms, double seconds) {
  const auto it = static_cast<double>(st.iterations());
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(n * vocab));
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(vocab * h * sizeof(float)));
  if (seconds > 0)
    st.counters["GFLOP/s"] = gemms * 2.0 * static_cast<double>(n) * vocab * static_cast<double>(h) * it / seconds / 1e9;
}

// Baseline: [N, V] logits by the textbook triple loop, then max / sum exp / log-prob + entropy per row.
void BM_ref_linear_head_forward(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  data& d = shared(n);
  const std::size_t h = d.h;
  std::vector<float> logits(n * vocab);
  double secs = 0;
  for (auto _ : st) {
    const bench::stopwatch sw;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < vocab; ++j) {
        float s = 0;
        for (std::size_t k = 0; k < h; ++k) s += d.hidden[i * h + k] * d.weight[j * h + k];
        logits[i * vocab + j] = s;
      }
    for (std::size_t i = 0; i < n; ++i) {
      const float* x = &logits[i * vocab];
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < vocab; ++j) m = x[j] > m ? x[j] : m;
      double se = 0;
      for (std::size_t j = 0; j < vocab; ++j) se += std::exp(static_cast<double>(x[j] - m));
      const double lse = m + std::log(se);
      double e = 0;
      for (std::size_t j = 0; j < vocab; ++j) {
        const double lp = x[j] - lse;
        e -= std::exp(lp) * lp;
      }
      d.lp[i] = x[d.labels[i]] - lse;
      d.ent[i] = e;
    }
    benchmark::DoNotOptimize(d.lp.data());
    secs += sw.seconds();
  }
  set_counters(st, n, h, 1, secs);
  // Per logit: the baseline runs on fewer rows (its scalar triple loop is ~50x slower).
  if (st.iterations() > 0) bench::baseline_seconds()["fwd_per_logit"] = secs / static_cast<double>(st.iterations() * n * vocab);
}

void BM_linear_head_forward(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  data& d = shared(n);
  const ulorl::linear_head_config cfg{.chunk_rows = 64};
  d.workspace.resize(ulorl::linear_head_workspace_bytes<float>(n, vocab, cfg));
  double secs = 0;
  for (auto _ : st) {
    const bench::stopwatch sw;
    ulorl::linear_head_forward(inputs(d, n), std::span<const std::int64_t>(d.labels.data(), n),
                               ulorl::vector_view<double>(d.lp.data(), n), ulorl::vector_view<double>(d.ent.data(), n),
                               ulorl::vector_view<double>(d.lse.data(), n), cfg, std::span<std::byte>(d.workspace));
    benchmark::DoNotOptimize(d.lp.data());
    secs += sw.seconds();
  }
  set_counters(st, n, d.h, 1, secs);
  const auto it = bench::baseline_seconds().find("fwd_per_logit");
  if (it != bench::baseline_seconds().end() && secs > 0)
    st.counters["x_vs_ref"] = it->second / (secs / static_cast<double>(st.iterations() * n * vocab));
}

void BM_linear_head_forward_backward(benchmark::State& st) {
  const auto n = static_cast<std::size_t>(st.range(0));
  data& d = shared(n);
  const ulorl::linear_head_config cfg{.chunk_rows = 64};
  d.workspace.resize(ulorl::linear_head_workspace_bytes<float>(n, vocab, cfg));
  double secs = 0;
  for (auto _ : st) {
    const bench::stopwatch sw;
    ulorl::linear_head_backward(
        inputs(d, n), std::span<const std::int64_t>(d.labels.data(), n), ulorl::vector_view<const double>(d.glp.data(), n),
        ulorl::vector_view<const double>(d.gent.data(), n),
        ulorl::linear_head_grads<float>{ulorl::matrix_view<float>(d.grad_hidden.data(), n, d.h),
                                        ulorl::matrix_view<float>(d.grad_weight.data(), vocab, d.h)},
        cfg, std::span<std::byte>(d.workspace));
    benchmark::DoNotOptimize(d.grad_weight.data());
    secs += sw.seconds();
  }
  set_counters(st, n, d.h, 3, secs);
}

}  // namespace

// Rows: ULORL_BENCH_HEAD_ROWS (default 64; e.g. "64,1024": N = 1024 takes ~10 s per forward + backward
// iteration on one core). The baseline always runs 2 rows (its speed per logit does not depend on N).
int main(int argc, char** argv) {
  std::vector<std::int64_t> rows;
  const char* e = std::getenv("ULORL_BENCH_HEAD_ROWS");
  for (std::string list = e ? e : "64"; !list.empty();) {
    const auto comma = list.find(',');
    rows.push_back(std::strtoll(list.substr(0, comma).c_str(), nullptr, 10));
    list = comma == std::string::npos ? "" : list.substr(comma + 1);
  }
  benchmark::RegisterBenchmark("BM_ref_linear_head_forward", BM_ref_linear_head_forward)
      ->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(1);
  for (const auto n : rows) {
    benchmark::RegisterBenchmark("BM_linear_head_forward", BM_linear_head_forward)->Arg(n)->Unit(benchmark::kMillisecond)->MinTime(0.3);
    benchmark::RegisterBenchmark("BM_linear_head_forward_backward", BM_linear_head_forward_backward)
        ->Arg(n)->Unit(benchmark::kMillisecond)->MinTime(0.3);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
