// Benchmarks of the UloRL segment scheduler: one rollout step (plan + one report per active
// response + end_step + release + refill) with 1e4, 1e5 and 1e6 active responses, against a naive
// map-based scheduler with the same protocol (BM_ref_*). Reports items (response-steps) per second,
// ns per response per step, and a summary table with the ratio and the scaling from 1e4 to 1e6.
#include <benchmark/benchmark.h>

#include <ctime>
#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

#include "ulorl/rollout/segment_scheduler.hpp"

namespace {

constexpr std::int32_t group = 8;

// About 1 in 16 responses ends each step, so groups complete, are released and refilled steadily.
bool ends_now(std::int64_t id, std::int64_t step) {
  auto x = static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(step) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (x & 15u) == 0;
}

class fast_driver {
 public:
  explicit fast_driver(std::int64_t active)
      : s_({.group_size = group, .max_response_tokens = std::int64_t{1} << 30, .num_segments = 1 << 20,
            .max_active_responses = active}) {
    s_.offer_prompts(std::int64_t{1} << 40);
    for (int i = 0; i < 64; ++i) step();  // reach steady state: slots, spans and buffers sized
  }
  std::int64_t step() {
    const auto p = s_.plan();
    for (const auto& it : p.items) {
      if (ends_now(it.response_id, step_)) s_.report(it.response_id, 1, ulorl::decode_outcome::eos);
      else s_.report(it.response_id, it.max_new_tokens, ulorl::decode_outcome::segment_end);
    }
    (void)s_.end_step();
    (void)s_.take_experience();
    if (++step_ % 4 == 0) s_.update_policy(s_.policy_version() + 1);
    return static_cast<std::int64_t>(p.items.size());
  }

 private:
  ulorl::segment_scheduler s_;
  std::int64_t step_ = 0;
};

// The textbook version: every response in a std::map, the plan by scanning it, one heap node per
// admitted response, group completion through a second map.
class naive_driver {
 public:
  explicit naive_driver(std::int64_t active) : cap_(active) {
    for (int i = 0; i < 16; ++i) step();
  }
  std::int64_t step() {
    plan_.clear();
    for (auto& [id, r] : live_)
      if (r.state == 0) {
        r.state = 1;
        plan_.push_back({id, r.tokens, seg});
      }
    while (active_ + group <= cap_) {
      for (std::int32_t k = 0; k < group; ++k) {
        live_[next_group_ * group + k] = resp{1, 0, {}};
        plan_.push_back({next_group_ * group + k, 0, seg});
      }
      done_[next_group_] = 0;
      ++next_group_;
      active_ += group;
    }
    for (const auto& it : plan_) {
      auto& r = live_.at(it.id);
      const bool eos = ends_now(it.id, step_);
      const std::int64_t n = eos ? 1 : it.quota;
      if (!r.spans.empty() && r.spans.back().version == version_) r.spans.back().end += n;
      else r.spans.push_back({r.tokens, r.tokens + n, version_});
      r.tokens += n;
      if (eos) {
        r.state = 2;
        --active_;
        if (++done_.at(it.id / group) == group) ready_.push_back(it.id / group);
      } else {
        r.state = 0;
      }
    }
    for (const auto g : ready_) {
      for (std::int32_t k = 0; k < group; ++k) live_.erase(g * group + k);
      done_.erase(g);
    }
    ready_.clear();
    if (++step_ % 4 == 0) ++version_;
    return static_cast<std::int64_t>(plan_.size());
  }

 private:
  static constexpr std::int64_t seg = 1024;
  struct resp {
    int state;  // 0 paused, 1 decoding, 2 finished
    std::int64_t tokens;
    std::vector<ulorl::version_span> spans;
  };
  struct item {
    std::int64_t id, start, quota;
  };
  std::int64_t cap_, active_ = 0, next_group_ = 0, step_ = 0, version_ = 0;
  std::map<std::int64_t, resp> live_;
  std::map<std::int64_t, std::int32_t> done_;
  std::vector<item> plan_;
  std::vector<std::int64_t> ready_;
};

std::map<std::pair<int, std::int64_t>, double> g_ns_per_response;  // (0 fast | 1 naive, N) -> ns

template <class Driver>
void run(benchmark::State& state, int kind) {
  const std::int64_t n = state.range(0);
  Driver d(n);
  std::int64_t items = 0;
  // Thread CPU time: on a shared machine wall time also counts other processes' time slices.
  const auto cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  };
  const double t0 = cpu_ns();
  for (auto _ : state) items += d.step();
  const double ns = cpu_ns() - t0;
  state.SetItemsProcessed(items);
  state.SetBytesProcessed(items * static_cast<std::int64_t>(sizeof(ulorl::plan_item)));
  state.counters["active"] = static_cast<double>(n);
  if (items > 0) {
    state.counters["cpu_ns_per_response"] = ns / static_cast<double>(items);  // per response per step
    g_ns_per_response[{kind, n}] = ns / static_cast<double>(items);
  }
}

void BM_segment_scheduler_step(benchmark::State& state) { run<fast_driver>(state, 0); }
void BM_ref_naive_scheduler_step(benchmark::State& state) { run<naive_driver>(state, 1); }

BENCHMARK(BM_segment_scheduler_step)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ref_naive_scheduler_step)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\nsegment_scheduler step cost (plan + report + end_step + release), CPU ns per active response per step:\n");
  std::printf("%10s %12s %12s %8s\n", "active", "ulorl", "naive map", "ratio");
  for (const std::int64_t n : {10'000, 100'000, 1'000'000}) {
    const auto f = g_ns_per_response.find({0, n});
    const auto r = g_ns_per_response.find({1, n});
    if (f == g_ns_per_response.end()) continue;
    if (r != g_ns_per_response.end())
      std::printf("%10lld %12.1f %12.1f %7.1fx\n", static_cast<long long>(n), f->second, r->second, r->second / f->second);
    else
      std::printf("%10lld %12.1f %12s\n", static_cast<long long>(n), f->second, "-");
  }
  const auto a = g_ns_per_response.find({0, 10'000});
  const auto b = g_ns_per_response.find({0, 1'000'000});
  if (a != g_ns_per_response.end() && b != g_ns_per_response.end())
    std::printf("scaling 1e4 -> 1e6 (per-response cost ratio, 1.0 = linear): %.2f; target < 1000 ns per response: %s\n",
                b->second / a->second, b->second < 1000.0 ? "met" : "NOT met");
  return 0;
}
