// bench_loss: the fused policy loss (clip-higher 0.2/0.28 + k3 KL with verl's clamps + token-mean,
// forward and backward, metrics) on 1M..16M tokens, beside
//   BM_ref_policy_loss_multipass  the same math as a naive multi-pass program (one loop per torch
//                                 op, libm exp, intermediates in memory: what eager frameworks do)
//   BM_stream_same_bytes          a plain streaming pass over the same bytes (read logp, old, ref,
//                                 adv, mask; write grad): the memory-bandwidth ceiling
//   *_threads variants                the loss (checked and unchecked) with ulorl::thread_executor and the
//                                 streaming pass split the same way (ULORL_BENCH_THREADS, default every core)
// all in the same run. Bytes per token: 4 float inputs + 1-byte mask + 1 float output = 21 (float).
// The arrays start on 64-byte boundaries (bench::aligned_vector), as PyTorch's CPU tensors do; the
// loss and the stream read the same arrays.
// After the runs a summary on stderr prints fused/multipass and fused/stream ratios per size, the
// loss against the machine's memory bandwidth (the stream of the largest size, beyond the caches),
// and the bandwidth target's verdict per mode (stdout stays valid JSON with --benchmark_format=json).
#include <benchmark/benchmark.h>

#include <ulorl/loss/policy_loss.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t row_len = 8192;  // tokens per response

//! Bytes per token for elements of `elem` bytes: the inputs (log_prob, old, ref and advantages, one
//! byte of mask), and in all the inputs plus the gradient written back (21 B float, 41 B double).
constexpr double input_bytes_per_token(std::size_t elem) { return 4.0 * static_cast<double>(elem) + 1.0; }
constexpr double bytes_per_token(std::size_t elem) { return input_bytes_per_token(elem) + static_cast<double>(elem); }
//! sizeof of the element type named in a benchmark ("float" / "double").
std::size_t elem_size(const std::string& ty) { return ty == "float" ? sizeof(float) : sizeof(double); }

template <class T>
struct data {
  std::size_t B, N;
  bench::aligned_vector<T> lp, old, ref, adv, grad;  // 64-byte aligned, as a torch tensor
  bench::aligned_vector<std::uint8_t> mask;
  std::vector<std::int64_t> offsets;
  explicit data(std::size_t n) : B(n / row_len), N(n), lp(n), old(n), ref(n), adv(n), grad(n), mask(n), offsets(n / row_len + 1) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(0, 1);
    for (std::size_t i = 0; i < n; ++i) {
      old[i] = static_cast<T>(-4 * u(rng));
      lp[i] = static_cast<T>(old[i] + (u(rng) - 0.5) * 0.8);
      ref[i] = static_cast<T>(lp[i] + (u(rng) - 0.5) * 0.5);
      adv[i] = static_cast<T>((u(rng) - 0.5) * 2);
      mask[i] = (i % row_len) < row_len - (i / row_len) % 1000;  // ragged rows
    }
    for (std::size_t b = 0; b <= B; ++b) offsets[b] = static_cast<std::int64_t>(b * row_len);
  }
  [[nodiscard]] double bytes_per_token() const { return ::bytes_per_token(sizeof(T)); }
};

template <class T>
data<T>& cached(std::size_t n) {
  static std::map<std::size_t, data<T>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) it = cache.emplace(n, data<T>(n)).first;
  return it->second;
}

ulorl::policy_loss_config config(double tokens) {
  ulorl::policy_loss_config c;
  c.objective = {.eps_low = 0.2, .eps_high = 0.28, .log_ratio_clamp = 20.0};
  c.kl = {.estimator = ulorl::kl_estimator::k3, .input_clamp = 20.0, .output_clamp = 10.0};
  c.kl_coef = 0.04;
  c.normalizer = {ulorl::agg_mode::token_mean, tokens, 1.0};
  return c;
}

//! The thread count of the *_threads benchmarks: ULORL_BENCH_THREADS, else every core.
unsigned bench_threads() {
  const auto t = static_cast<unsigned>(bench::env_size("ULORL_BENCH_THREADS", 0));
  return t != 0 ? t : std::max(1u, std::thread::hardware_concurrency());
}

//! Check = false: policy_loss_config::check_values off (trusted inputs: no value scans).
//! Threaded: rows spread over bench_threads() threads by ulorl::thread_executor.
template <class T, bool Check = true, bool Threaded = false>
void BM_policy_loss(benchmark::State& st) {
  auto& d = cached<T>(static_cast<std::size_t>(st.range(0)));
  const bool packed = st.range(1) != 0;
  auto view = [&](const bench::aligned_vector<T>& v) {
    return packed ? ulorl::token_view<const T>::packed(ulorl::vector_view<const T>(v.data(), v.size()), std::span<const std::int64_t>(d.offsets))
                  : ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), d.B, row_len));
  };
  const auto mask = packed ? ulorl::token_view<const std::uint8_t>::packed(ulorl::vector_view<const std::uint8_t>(d.mask.data(), d.N),
                                                                          std::span<const std::int64_t>(d.offsets))
                           : ulorl::token_view<const std::uint8_t>::padded(ulorl::matrix_view<const std::uint8_t>(d.mask.data(), d.B, row_len));
  const auto grad = packed ? ulorl::token_view<T>::packed(ulorl::vector_view<T>(d.grad.data(), d.N), std::span<const std::int64_t>(d.offsets))
                           : ulorl::token_view<T>::padded(ulorl::matrix_view<T>(d.grad.data(), d.B, row_len));
  ulorl::policy_loss_inputs<T, std::uint8_t> in{view(d.lp), view(d.old), view(d.adv), mask, view(d.ref)};
  double tokens = 0;
  for (auto m : d.mask) tokens += m;
  auto cfg = config(tokens);
  cfg.check_values = Check;
  const ulorl::thread_executor exec{bench_threads()};
  for (auto _ : st) {
    ulorl::policy_loss_result r;
    if constexpr (Threaded) r = ulorl::policy_loss(in, grad, {}, cfg, exec);
    else r = ulorl::policy_loss(in, grad, cfg);
    benchmark::DoNotOptimize(r.loss);
    benchmark::ClobberMemory();
  }
  if constexpr (Threaded) st.counters["threads"] = exec.threads;
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * st.range(0));
  st.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(st.iterations()) * st.range(0) * d.bytes_per_token()));
}

//! The naive multi-pass reference: one loop per tensor op of the PyTorch formulation, libm exp.
template <class T>
void BM_ref_policy_loss_multipass(benchmark::State& st) {
  auto& d = cached<T>(static_cast<std::size_t>(st.range(0)));
  const std::size_t n = d.N;
  std::vector<T> x(n), r(n), rc(n), l1(n), l2(n), pg(n), u(n), kl(n), loss(n), g_pg(n), g_kl(n);
  std::vector<T> m(n);
  for (auto _ : st) {
    const T lo = T(0.8), hi = T(1.28), beta = T(0.04);
    for (std::size_t i = 0; i < n; ++i) m[i] = static_cast<T>(d.mask[i]);
    for (std::size_t i = 0; i < n; ++i) x[i] = std::clamp(d.lp[i] - d.old[i], T(-20), T(20));
    for (std::size_t i = 0; i < n; ++i) r[i] = std::exp(x[i]);
    for (std::size_t i = 0; i < n; ++i) rc[i] = std::clamp(r[i], lo, hi);
    for (std::size_t i = 0; i < n; ++i) l1[i] = -d.adv[i] * r[i];
    for (std::size_t i = 0; i < n; ++i) l2[i] = -d.adv[i] * rc[i];
    for (std::size_t i = 0; i < n; ++i) pg[i] = std::max(l1[i], l2[i]);
    for (std::size_t i = 0; i < n; ++i) u[i] = std::clamp(d.ref[i] - d.lp[i], T(-20), T(20));
    for (std::size_t i = 0; i < n; ++i) kl[i] = std::clamp(std::exp(u[i]) - u[i] - T(1), T(-10), T(10));
    for (std::size_t i = 0; i < n; ++i) loss[i] = pg[i] + beta * kl[i];
    double s = 0, cnt = 0;
    for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(loss[i] * m[i]);
    for (std::size_t i = 0; i < n; ++i) cnt += static_cast<double>(m[i]);
    const T w = static_cast<T>(1.0 / cnt);
    // Backward, op by op.
    for (std::size_t i = 0; i < n; ++i) g_pg[i] = w * m[i] * (l1[i] >= l2[i] ? -d.adv[i] * r[i] : (rc[i] == r[i] ? -d.adv[i] * r[i] : T(0)));
    for (std::size_t i = 0; i < n; ++i) g_kl[i] = w * m[i] * beta * (std::fabs(u[i]) <= T(20) ? -(std::exp(u[i]) - T(1)) : T(0));
    for (std::size_t i = 0; i < n; ++i) d.grad[i] = g_pg[i] + g_kl[i];
    double clip = 0;
    for (std::size_t i = 0; i < n; ++i) clip += static_cast<double>(m[i] * static_cast<T>(l2[i] > l1[i]));
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(clip);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * st.range(0));
  st.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(st.iterations()) * st.range(0) * d.bytes_per_token()));
}

//! Streaming pass over the same bytes: read the four inputs and the mask, write one output.
//! Threaded: the same rows split over the same threads by the same executor as the threaded loss.
template <class T>
void stream_rows(data<T>& d, std::size_t lo, std::size_t hi) {
  const T* ULORL_RESTRICT a = d.lp.data();
  const T* ULORL_RESTRICT b = d.old.data();
  const T* ULORL_RESTRICT c = d.ref.data();
  const T* ULORL_RESTRICT e = d.adv.data();
  const std::uint8_t* ULORL_RESTRICT m = d.mask.data();
  T* ULORL_RESTRICT g = d.grad.data();
  for (std::size_t i = lo * row_len; i < hi * row_len; ++i) g[i] = (a[i] + b[i] + c[i] + e[i]) * static_cast<T>(m[i]);
}
template <class T, bool Threaded = false>
void BM_stream_same_bytes(benchmark::State& st) {
  auto& d = cached<T>(static_cast<std::size_t>(st.range(0)));
  const ulorl::thread_executor exec{bench_threads()};
  for (auto _ : st) {
    if constexpr (Threaded) exec(d.B, [&d](std::size_t lo, std::size_t hi) { stream_rows(d, lo, hi); });
    else stream_rows(d, 0, d.B);
    benchmark::ClobberMemory();
  }
  if constexpr (Threaded) st.counters["threads"] = exec.threads;
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * st.range(0));
  st.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(st.iterations()) * st.range(0) * d.bytes_per_token()));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {1 << 20, 1 << 22, 1 << 24}) b->Args({n, 0});
}
void sizes_packed(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {1 << 20, 1 << 22, 1 << 24}) b->Args({n, 1});
}

BENCHMARK(BM_policy_loss<float>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_policy_loss<float>)->Apply(sizes_packed)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_policy_loss<float, false>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ref_policy_loss_multipass<float>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_stream_same_bytes<float>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_policy_loss<float, false, true>)->Apply(sizes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_policy_loss<float, true, true>)->Apply(sizes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_stream_same_bytes<float, true>)->Apply(sizes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_policy_loss<double>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_policy_loss<double>)->Apply(sizes_packed)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_policy_loss<double, false>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ref_policy_loss_multipass<double>)->Apply(sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_stream_same_bytes<double>)->Apply(sizes)->Unit(benchmark::kMillisecond);

//! Forwards every run to the display reporter and remembers throughput for the ratio summary.
class summary_reporter : public benchmark::BenchmarkReporter {
 public:
  explicit summary_reporter(benchmark::BenchmarkReporter* inner) : inner_(inner) {}
  bool ReportContext(const Context& c) override { return inner_->ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      const auto it = r.counters.find("items_per_second");
      // With --benchmark_repetitions, the best repetition (this VM's throughput is bimodal).
      std::string name = r.benchmark_name();
      if (const auto p = name.find("/real_time"); p != std::string::npos) name.erase(p);  // the threaded runs
      if (it != r.counters.end() && r.run_type == Run::RT_Iteration)
        rate_[name] = std::max(rate_[name], static_cast<double>(it->second.value));
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override {
    inner_->Finalize();
    std::fprintf(stderr, "\nsummary (tokens/s, best of the repetitions; ratios measured in this run):\n");
    // The machine's memory bandwidth: the one-thread stream over the largest working set (16M
    // tokens: 352 MB in float, 688 MB in double, beyond the last-level cache), the faster of the
    // two element types in this run (one machine, one bandwidth: on malloc's misaligned blocks the
    // double stream measured up to a third below the float one in the same process, 26.1 against
    // 39.0 GB/s; on the aligned arrays they have measured alike; bench/RESULTS.md, bench_loss).
    // At smaller sizes the same-size stream runs from the caches and measures their bandwidth
    // instead; both ratios are printed.
    const auto stream16 = [&](const std::string& ty) {
      return rate_["BM_stream_same_bytes<" + ty + ">/" + std::to_string(1L << 24) + "/0"] * bytes_per_token(elem_size(ty));
    };
    const double membw_bytes = std::max(stream16("float"), stream16("double"));
    for (const char* ty : {"float", "double"}) {
      const double membw = membw_bytes / bytes_per_token(elem_size(ty));  // tokens/s
      if (membw > 0)
        std::fprintf(stderr, "  %-6s memory bandwidth (the faster one-thread stream of 16M tokens): %.1f GB/s (this type's stream: %.1f GB/s)\n",
                     ty, membw_bytes / 1e9, stream16(ty) / 1e9);
      for (long n : {1L << 20, 1L << 22, 1L << 24}) {
        const std::string sfx = "<" + std::string(ty) + ">/" + std::to_string(n) + "/0";
        const double fused = rate_["BM_policy_loss" + sfx];
        const double trusted = rate_["BM_policy_loss<" + std::string(ty) + ", false>/" + std::to_string(n) + "/0"];
        const double naive = rate_["BM_ref_policy_loss_multipass" + sfx];
        const double stream = rate_["BM_stream_same_bytes" + sfx];
        if (fused <= 0) continue;
        const auto pct = [](double a, double b) { return b > 0 ? 100.0 * a / b : 0.0; };
        std::fprintf(stderr,
                     "  %-6s %9ld tokens: fused %.1f M tok/s | vs multipass %.2fx | vs streaming same bytes %.0f%% | vs memory "
                     "bandwidth %.0f%%\n",
                     ty, n, fused / 1e6, naive > 0 ? fused / naive : 0.0, pct(fused, stream), pct(fused, membw));
        if (trusted > 0)
          std::fprintf(stderr,
                       "  %-6s %9ld tokens: check_values=false %.1f M tok/s | vs multipass %.2fx | vs streaming same bytes %.0f%% | vs "
                       "memory bandwidth %.0f%%\n",
                       ty, n, trusted / 1e6, naive > 0 ? trusted / naive : 0.0, pct(trusted, stream), pct(trusted, membw));
        const std::string tsfx = "<" + std::string(ty) + ", true>/" + std::to_string(n) + "/0";
        const double threaded = rate_["BM_policy_loss<" + std::string(ty) + ", false, true>/" + std::to_string(n) + "/0"];
        const double tchecked = rate_["BM_policy_loss<" + std::string(ty) + ", true, true>/" + std::to_string(n) + "/0"];
        const double tstream = rate_["BM_stream_same_bytes" + tsfx];
        if (tchecked > 0)
          std::fprintf(stderr, "  %-6s %9ld tokens: fused (check_values on) on %u threads %.1f M tok/s | vs streaming same bytes on %u threads %.0f%%\n",
                       ty, n, bench_threads(), tchecked / 1e6, bench_threads(), tstream > 0 ? 100.0 * tchecked / tstream : 0.0);
        if (threaded > 0)
          std::fprintf(stderr,
                       "  %-6s %9ld tokens: check_values=false on %u threads %.1f M tok/s | vs streaming same bytes on %u threads %.0f%% "
                       "| vs one-thread streaming %.0f%%\n",
                       ty, n, bench_threads(), threaded / 1e6, bench_threads(), tstream > 0 ? 100.0 * threaded / tstream : 0.0,
                       stream > 0 ? 100.0 * threaded / stream : 0.0);
        const double packed = rate_["BM_policy_loss<" + std::string(ty) + ">/" + std::to_string(n) + "/1"];
        if (packed > 0)
          std::fprintf(stderr, "  %-6s %9ld tokens: packed layout (check_values on) %.1f M tok/s | vs memory bandwidth %.0f%%\n", ty, n,
                       packed / 1e6, pct(packed, membw));
      }
      targets(ty, membw);
    }
  }

  //! The bandwidth target (>= 50% of the streaming read bandwidth) for one element type.
  //! Its subject is the fused pass (one read of every input: check_values = false), judged against
  //! the machine's memory bandwidth at every size. The default validated call reads every input
  //! twice (the scan must finish before anything is written: outputs untouched on bad input), so
  //! it is printed beside its own bound: this run's fused pass plus one stream of the inputs.
  void targets(const char* ty, double membw) {
    if (membw <= 0) return;
    const std::string t(ty);
    const double in_share = input_bytes_per_token(elem_size(t)) / bytes_per_token(elem_size(t));  // 17 of 21 B, 33 of 41 B
    std::string fused_cells, checked_cells;
    bool met = true, any = false;
    for (long n : {1L << 20, 1L << 22, 1L << 24}) {
      const std::string sfx = std::to_string(n) + "/0";
      const double fused = rate_["BM_policy_loss<" + t + ", false>/" + sfx];
      const double checked = rate_["BM_policy_loss<" + t + ">/" + sfx];
      const double stream = rate_["BM_stream_same_bytes<" + t + ">/" + sfx];
      char buf[96];
      if (fused > 0) {
        any = true;
        met = met && fused >= 0.5 * membw;
        std::snprintf(buf, sizeof buf, "  %ldM %.0f%%", n >> 20, 100.0 * fused / membw);
        fused_cells += buf;
      }
      if (checked > 0 && fused > 0 && stream > 0) {
        const double bound = 1.0 / (1.0 / fused + in_share / stream);
        std::snprintf(buf, sizeof buf, "  %ldM %.0f%% (bound %.0f%%)", n >> 20, 100.0 * checked / membw, 100.0 * bound / membw);
        checked_cells += buf;
      }
    }
    if (!any) return;
    std::fprintf(stderr, "  %-6s target >= 50%% of the streaming read bandwidth, fused pass (check_values=false), vs memory bandwidth:%s -> %s\n",
                 ty, fused_cells.c_str(), met ? "met" : "NOT met");
    if (!checked_cells.empty())
      std::fprintf(stderr, "  %-6s validated default (check_values=true, reads the inputs twice), vs memory bandwidth:%s\n", ty,
                   checked_cells.c_str());
  }

 private:
  benchmark::BenchmarkReporter* inner_;
  std::map<std::string, double> rate_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::BenchmarkReporter* display = benchmark::CreateDefaultDisplayReporter();
  summary_reporter rep(display);
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();
  return 0;
}
