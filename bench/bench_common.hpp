// bench/bench_common.hpp — helpers shared by the microbenchmarks: remembering a baseline's time
// per item so the optimised benchmark, registered after it, reports the speed-up in the same run.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace bench {

//! Allocates on 64-byte (cache-line) boundaries, as PyTorch's CPU allocator does: the benchmarks
//! read the memory a trainer hands over, not malloc's 16-byte-aligned blocks (whose 64-byte vector
//! loads straddle two cache lines).
template <class T>
struct cache_aligned {
  using value_type = T;
  static constexpr std::align_val_t align{64};
  cache_aligned() = default;
  template <class U>
  constexpr cache_aligned(const cache_aligned<U>&) noexcept {}
  [[nodiscard]] T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), align)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, align); }
  friend bool operator==(const cache_aligned&, const cache_aligned&) { return true; }
};
template <class T>
using aligned_vector = std::vector<T, cache_aligned<T>>;

//! A size from the environment (e.g. ULORL_BENCH_MAX_ROWS), or `fallback` when unset.
inline std::size_t env_size(const char* name, std::size_t fallback) {
  const char* e = std::getenv(name);
  return e ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) : fallback;
}

//! Seconds per iteration of baseline benchmarks, keyed by "<name>/<size>".
inline std::map<std::string, double>& baseline_seconds() {
  static std::map<std::string, double> m;
  return m;
}

//! Wall-clock timer for manual timing inside a benchmark loop.
struct stopwatch {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  [[nodiscard]] double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

//! Records a baseline's seconds per iteration (call after the loop).
inline void record_baseline(benchmark::State& state, const std::string& key, double seconds) {
  if (state.iterations() > 0) baseline_seconds()[key] = seconds / static_cast<double>(state.iterations());
}

//! Sets counter `name` = baseline time / our time, when the baseline ran earlier in this process.
inline void report_speedup(benchmark::State& state, const std::string& key, double seconds, const char* name = "x_vs_ref") {
  const auto it = baseline_seconds().find(key);
  if (it != baseline_seconds().end() && seconds > 0 && state.iterations() > 0)
    state.counters[name] = it->second / (seconds / static_cast<double>(state.iterations()));
}

}  // namespace bench
