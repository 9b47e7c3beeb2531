// bench_advantage — GRPO advantages for 1e4, 1e5, 1e6 responses in groups of 16 (ids unsorted, as
// after a shuffle, and sorted), items/s, against a naive reference (std::map of ids to vectors,
// one-pass E[x^2]-E[x]^2 std) run in the same process; `x_vs_ref` is the speed-up, and the
// BigO fit shows the scaling.
#include <ulorl/advantage.hpp>
#include <ulorl/presets/verl.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "bench_common.hpp"

namespace {

constexpr std::size_t group = 16;

struct batch {
  std::vector<float> rewards;
  std::vector<std::int64_t> ids;
  std::vector<float> out;
};

batch make_batch(std::size_t n, bool shuffled) {
  std::mt19937_64 gen(42);
  batch b;
  b.rewards.resize(n);
  b.ids.resize(n);
  b.out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    b.rewards[i] = static_cast<float>(gen() % 2);
    b.ids[i] = static_cast<std::int64_t>(i / group) * 13 + 5;
  }
  if (shuffled) std::shuffle(b.ids.begin(), b.ids.end(), gen);
  return b;
}

// The kind of code trainers write by hand: a map from prompt id to its rewards, one-pass variance.
void naive_grpo(const batch& b, std::vector<float>& out) {
  std::map<std::int64_t, std::vector<float>> groups;
  for (std::size_t i = 0; i < b.ids.size(); ++i) groups[b.ids[i]].push_back(b.rewards[i]);
  std::map<std::int64_t, std::pair<float, float>> stats;
  for (auto& [id, v] : groups) {
    float s = 0, s2 = 0;
    for (float x : v) s += x, s2 += x * x;
    const float n = static_cast<float>(v.size());
    const float mean = s / n;
    const float var = n > 1 ? (s2 / n - mean * mean) * n / (n - 1) : 0.f;
    stats[id] = {mean, std::sqrt(std::max(var, 0.f))};
  }
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    const auto [mean, sd] = stats[b.ids[i]];
    out[i] = (b.rewards[i] - mean) / (sd + 1e-6f);
  }
}

void BM_ref_grpo_advantages(benchmark::State& state) {
  auto b = make_batch(static_cast<std::size_t>(state.range(0)), state.range(1) != 0);
  bench::stopwatch t;
  for (auto _ : state) {
    naive_grpo(b, b.out);
    benchmark::DoNotOptimize(b.out.data());
  }
  bench::record_baseline(state, std::to_string(state.range(0)) + "/" + std::to_string(state.range(1)), t.seconds());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) * 16);
  state.SetComplexityN(state.range(0));
}

void BM_grpo_advantages(benchmark::State& state) {
  auto b = make_batch(static_cast<std::size_t>(state.range(0)), state.range(1) != 0);
  const auto cfg = ulorl::presets::verl::grpo_advantage().group;
  ulorl::group_layout groups;  // kept across steps, as a trainer would keep it
  bench::stopwatch t;
  for (auto _ : state) {
    // Includes grouping the (shuffled) ids, as a trainer does every step.
    groups.assign_ids(std::span<const std::int64_t>(b.ids));
    ulorl::group_advantages(std::span<const float>(b.rewards), groups, std::span<float>(b.out), cfg);
    benchmark::DoNotOptimize(b.out.data());
  }
  bench::report_speedup(state, std::to_string(state.range(0)) + "/" + std::to_string(state.range(1)), t.seconds());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) * 16);
  state.SetComplexityN(state.range(0));
}

void BM_grpo_advantages_fixed_groups(benchmark::State& state) {
  auto b = make_batch(static_cast<std::size_t>(state.range(0)), false);
  const auto groups = ulorl::group_layout::fixed(b.rewards.size(), group);
  const auto cfg = ulorl::presets::verl::grpo_advantage().group;
  for (auto _ : state) {
    ulorl::group_advantages(std::span<const float>(b.rewards), groups, std::span<float>(b.out), cfg);
    benchmark::DoNotOptimize(b.out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) * 8);
  state.SetComplexityN(state.range(0));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int shuffled : {1, 0})
    for (std::int64_t n : {10'000, 100'000, 1'000'000}) b->Args({n, shuffled});
}

}  // namespace

BENCHMARK(BM_ref_grpo_advantages)->Apply(sizes)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_grpo_advantages)->Apply(sizes)->Unit(benchmark::kMicrosecond)->Complexity(benchmark::oN);
BENCHMARK(BM_grpo_advantages_fixed_groups)
    ->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMicrosecond)->Complexity(benchmark::oN);
BENCHMARK_MAIN();
