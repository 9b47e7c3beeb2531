// bench_logits — the fused logits kernels (ulorl/logits.hpp) on Qwen-sized rows (V = 151936) against,
// in the same run: a naive three-pass reference (max; sum of exp; entropy and log-prob — scalar
// std::exp, what an unfused C++ port of log_softmax + gather + entropy does without materialising
// [N, V]) and a streaming read of the same bytes (the memory-bandwidth ceiling of one core).
// Reports bytes/s and logits/s (items) per benchmark and, at the end, the ratios
//   fused / reference (speed-up) and forward bytes/s / streaming-read bytes/s (bandwidth fraction).
// Single-threaded benchmarks are timed in CPU time (this 2-core machine is shared: wall time would
// count other processes' time slices); the 2-thread ones in wall time.
// Rows: --benchmark_filter selects; ULORL_BENCH_MAX_ROWS (default 4096) caps N (4096 rows of float
// logits are 2.5 GB, plus 2.5 GB of gradient for the backward).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ulorl/logits.hpp>

#include "bench_common.hpp"

namespace {

constexpr std::size_t vocab = 151936;

std::size_t max_rows() { return bench::env_size("ULORL_BENCH_MAX_ROWS", 4096); }

// Buffers are allocated once, for the largest N, and filled with a cheap hash (not a slow RNG).
struct data {
  std::size_t rows = 0;
  std::unique_ptr<float[]> x, grad;
  std::unique_ptr<ulorl::bf16[]> xb, gradb;
  std::vector<std::int64_t> labels;
  std::vector<double> lp, h, lse, glp, gent;
};
data& shared(std::size_t rows) {
  static data d;
  if (d.rows >= rows) return d;
  d = data{};
  d.rows = rows;
  const std::size_t n = rows * vocab;
  d.x.reset(new float[n]);
  d.grad.reset(new float[n]);
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    // Roughly N(0, 3): sum of four uniforms in [-3, 3].
    const auto u = [&](int k) { return static_cast<float>((s >> (16 * k)) & 0xffff) / 65535.0f * 6.0f - 3.0f; };
    d.x[i] = u(0) + u(1) + u(2) + u(3);
    d.grad[i] = 0.0f;
  }
  for (std::size_t r = 0; r < rows; ++r) d.labels.push_back(static_cast<std::int64_t>((r * 7919) % vocab));
  d.lp.assign(rows, 0);
  d.h.assign(rows, 0);
  d.lse.assign(rows, 0);
  d.glp.assign(rows, -1.0 / static_cast<double>(rows));
  d.gent.assign(rows, 0.01);
  return d;
}

// bf16 copies only when a bf16 benchmark runs (N = 4096 would add 2.5 GB).
void need_bf16(data& d) {
  if (d.xb) return;
  const std::size_t n = d.rows * vocab;
  d.xb.reset(new ulorl::bf16[n]);
  d.gradb.reset(new ulorl::bf16[n]);
  ulorl::float_to_bf16(d.x.get(), d.xb.get(), n);
  std::fill(d.gradb.get(), d.gradb.get() + n, ulorl::bf16{});
}

std::size_t rows_arg(benchmark::State& st) { return static_cast<std::size_t>(st.range(0)); }
void set_counters(benchmark::State& st, std::size_t bytes_per_logit) {
  const auto logits = static_cast<std::int64_t>(rows_arg(st) * vocab);
  st.SetItemsProcessed(st.iterations() * logits);
  st.SetBytesProcessed(st.iterations() * logits * static_cast<std::int64_t>(bytes_per_logit));
}

template <class Exec>
void forward(data& d, std::size_t rows, const Exec& exec) {
  ulorl::logits_forward(ulorl::matrix_view<const float>(d.x.get(), rows, vocab),
                        std::span<const std::int64_t>(d.labels.data(), rows), ulorl::vector_view<double>(d.lp.data(), rows),
                        ulorl::vector_view<double>(d.h.data(), rows), ulorl::vector_view<double>(d.lse.data(), rows), {},
                        exec);
}
template <class Exec>
void backward(data& d, std::size_t rows, const Exec& exec, bool fast = false) {
  ulorl::logits_backward(ulorl::matrix_view<const float>(d.x.get(), rows, vocab),
                         std::span<const std::int64_t>(d.labels.data(), rows),
                         ulorl::vector_view<const double>(d.lse.data(), rows),
                         ulorl::vector_view<const double>(d.h.data(), rows),
                         ulorl::vector_view<const double>(d.glp.data(), rows),
                         ulorl::vector_view<const double>(d.gent.data(), rows),
                         ulorl::matrix_view<float>(d.grad.get(), rows, vocab), {.fast_backward = fast}, exec);
}

// ---- the streaming-read ceiling: sum every float once (vectorised by the compiler) -----------------
void BM_stream_read(benchmark::State& st) {
  auto& d = shared(rows_arg(st));
  const std::size_t n = rows_arg(st) * vocab;
  for (auto _ : st) {
    float acc[16] = {};
    const float* p = d.x.get();
    for (std::size_t i = 0; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += p[i + static_cast<std::size_t>(l)];
    benchmark::DoNotOptimize(acc);
  }
  set_counters(st, sizeof(float));
}

// ---- naive three-pass reference (per row: max, sum of exp, then entropy and log-prob) --------------
void ref_forward_row(const float* x, std::size_t v, std::size_t y, double& lp, double& h, double& lse) {
  float m = -INFINITY;
  for (std::size_t j = 0; j < v; ++j) m = std::max(m, x[j]);
  float s = 0;
  for (std::size_t j = 0; j < v; ++j) s += std::exp(x[j] - m);
  const float l = m + std::log(s);
  float e = 0;
  for (std::size_t j = 0; j < v; ++j) {
    const float ls = x[j] - l;
    e -= std::exp(ls) * ls;
  }
  lp = x[y] - l;
  h = e;
  lse = l;
}
void BM_ref_forward(benchmark::State& st) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  for (auto _ : st)
    for (std::size_t r = 0; r < rows; ++r)
      ref_forward_row(d.x.get() + r * vocab, vocab, static_cast<std::size_t>(d.labels[r]), d.lp[r], d.h[r], d.lse[r]);
  set_counters(st, sizeof(float));
}
void ref_backward_rows(data& d, std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = d.x.get() + r * vocab;
    float* g = d.grad.get() + r * vocab;
    const auto l = static_cast<float>(d.lse[r]), h = static_cast<float>(d.h[r]);
    const auto glp = static_cast<float>(d.glp[r]), gent = static_cast<float>(d.gent[r]);
    for (std::size_t j = 0; j < vocab; ++j) {
      const float ls = x[j] - l, p = std::exp(ls);
      g[j] = -glp * p - gent * p * (ls + h);
    }
    g[d.labels[r]] += glp;
  }
}
void BM_ref_backward(benchmark::State& st) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  forward(d, rows, ulorl::sequential_executor{});
  for (auto _ : st) ref_backward_rows(d, rows);
  set_counters(st, 2 * sizeof(float));
}
void BM_ref_fwd_bwd(benchmark::State& st) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  for (auto _ : st) {
    for (std::size_t r = 0; r < rows; ++r)
      ref_forward_row(d.x.get() + r * vocab, vocab, static_cast<std::size_t>(d.labels[r]), d.lp[r], d.h[r], d.lse[r]);
    ref_backward_rows(d, rows);
  }
  set_counters(st, 3 * sizeof(float));
}

// ---- ulorl ------------------------------------------------------------------------------------------
template <class Exec>
void BM_forward(benchmark::State& st, Exec exec) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  for (auto _ : st) forward(d, rows, exec);
  set_counters(st, sizeof(float));
}
void BM_forward_bf16(benchmark::State& st) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  need_bf16(d);
  for (auto _ : st)
    ulorl::logits_forward(ulorl::matrix_view<const ulorl::bf16>(d.xb.get(), rows, vocab),
                          std::span<const std::int64_t>(d.labels.data(), rows),
                          ulorl::vector_view<double>(d.lp.data(), rows), ulorl::vector_view<double>(d.h.data(), rows),
                          ulorl::vector_view<double>(d.lse.data(), rows));
  set_counters(st, sizeof(ulorl::bf16));
}
template <class Exec>
void BM_backward(benchmark::State& st, Exec exec, bool fast = false) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  forward(d, rows, exec);
  for (auto _ : st) backward(d, rows, exec, fast);
  set_counters(st, 2 * sizeof(float));
}
void BM_backward_bf16(benchmark::State& st) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  need_bf16(d);
  forward(d, rows, ulorl::sequential_executor{});
  for (auto _ : st)
    ulorl::logits_backward(ulorl::matrix_view<const ulorl::bf16>(d.xb.get(), rows, vocab),
                           std::span<const std::int64_t>(d.labels.data(), rows),
                           ulorl::vector_view<const double>(d.lse.data(), rows),
                           ulorl::vector_view<const double>(d.h.data(), rows),
                           ulorl::vector_view<const double>(d.glp.data(), rows),
                           ulorl::vector_view<const double>(d.gent.data(), rows),
                           ulorl::matrix_view<ulorl::bf16>(d.gradb.get(), rows, vocab));
  set_counters(st, 2 * sizeof(ulorl::bf16));
}
template <class Exec>
void BM_fwd_bwd(benchmark::State& st, Exec exec, bool fast = false) {
  const std::size_t rows = rows_arg(st);
  auto& d = shared(rows);
  for (auto _ : st) {
    forward(d, rows, exec);
    backward(d, rows, exec, fast);
  }
  set_counters(st, 3 * sizeof(float));  // read, read, write
}

void rows(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {64, 1024, 4096})
    if (static_cast<std::size_t>(n) <= max_rows()) b->Arg(n);
  b->Unit(benchmark::kMillisecond);
}
void timed(benchmark::internal::Benchmark* b) { rows(b); b->MinTime(0.3); }
// The naive reference is slow: one iteration (seconds at N = 4096) is measurement enough.
void once(benchmark::internal::Benchmark* b) { rows(b); b->Iterations(1); }
BENCHMARK(BM_stream_read)->Apply(timed);
BENCHMARK(BM_ref_forward)->Apply(once);
BENCHMARK_CAPTURE(BM_forward, seq, ulorl::sequential_executor{})->Apply(timed);
BENCHMARK_CAPTURE(BM_forward, threads2, ulorl::thread_executor{2})->Apply(timed)->UseRealTime();
BENCHMARK(BM_forward_bf16)->Apply(timed);
BENCHMARK(BM_ref_backward)->Apply(once);
BENCHMARK_CAPTURE(BM_backward, seq, ulorl::sequential_executor{})->Apply(timed);
BENCHMARK_CAPTURE(BM_backward, fast, ulorl::sequential_executor{}, true)->Apply(timed);
BENCHMARK(BM_backward_bf16)->Apply(timed);
BENCHMARK(BM_ref_fwd_bwd)->Apply(once);
BENCHMARK_CAPTURE(BM_fwd_bwd, seq, ulorl::sequential_executor{})->Apply(timed);
BENCHMARK_CAPTURE(BM_fwd_bwd, fast, ulorl::sequential_executor{}, true)->Apply(timed);
BENCHMARK_CAPTURE(BM_fwd_bwd, threads2, ulorl::thread_executor{2})->Apply(timed)->UseRealTime();

// Console output plus a ratio summary computed from the same run.
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      const auto it = r.counters.find("items_per_second");
      const auto bt = r.counters.find("bytes_per_second");
      const std::string key = r.run_name.function_name + "/" + r.run_name.args;
      // With --benchmark_repetitions, the best repetition of each benchmark (this VM's throughput
      // is bimodal from run to run; best-of on both sides of a ratio compares like with like).
      if (it != r.counters.end()) items_[key] = std::max(items_[key], static_cast<double>(it->second.value));
      if (bt != r.counters.end()) bytes_[key] = std::max(bytes_[key], static_cast<double>(bt->second.value));
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n== ratios (same run, best of the repetitions; V = %zu) ==\n", vocab);
    for (const char* n : {"64", "1024", "4096"}) {
      const auto suffix = std::string("/") + n;
      const auto get = [&](const std::map<std::string, double>& m, const std::string& k) {
        const auto f = m.find(k + suffix);
        return f == m.end() ? 0.0 : f->second;
      };
      const double stream = get(bytes_, "BM_stream_read");
      if (stream == 0) continue;
      std::printf("N=%-5s stream read %.2f GB/s\n", n, stream / 1e9);
      const auto line = [&](const char* what, const std::string& fast, const std::string& ref, bool bw) {
        const double f = get(items_, fast), r = get(items_, ref);
        if (f == 0) return;
        std::printf("  %-28s %7.3f G logits/s", what, f / 1e9);
        if (r > 0) std::printf("  %6.1fx the naive reference", f / r);
        if (bw) std::printf("  %5.1f%% of stream-read bandwidth", 100.0 * get(bytes_, fast) / stream);
        std::printf("\n");
      };
      line("forward (1 thread)", "BM_forward/seq", "BM_ref_forward", true);
      line("forward (2 threads)", "BM_forward/threads2", "BM_ref_forward", true);
      line("forward bf16 (1 thread)", "BM_forward_bf16", "BM_ref_forward", true);
      line("backward (1 thread)", "BM_backward/seq", "BM_ref_backward", true);
      line("backward fast (1 thread)", "BM_backward/fast", "BM_ref_backward", true);
      line("backward bf16 (1 thread)", "BM_backward_bf16", "BM_ref_backward", true);
      line("forward+backward (1 thread)", "BM_fwd_bwd/seq", "BM_ref_fwd_bwd", false);
      line("forward+backward fast (1 thr)", "BM_fwd_bwd/fast", "BM_ref_fwd_bwd", false);
      line("forward+backward (2 threads)", "BM_fwd_bwd/threads2", "BM_ref_fwd_bwd", false);
    }
  }

 private:
  std::map<std::string, double> items_, bytes_;
};

}  // namespace

int main(int argc, char** argv) {
  // The ratio summary decorates the console format only; --benchmark_format=json (used by
  // bench/compare_torch.py) gets Google Benchmark's own reporter and clean JSON on stdout.
  bool console = true;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--benchmark_format=", 0) == 0 && std::string(argv[i]) != "--benchmark_format=console")
      console = false;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!console) {
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
