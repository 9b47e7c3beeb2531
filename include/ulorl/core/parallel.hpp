// ulorl/core/parallel.hpp — how the row-parallel CPU kernels (logits, policy loss) run on the host's threads.
// An *executor* is any callable `exec(n, body)` that calls `body(begin, end)` on disjoint ranges
// covering [0, n) — possibly concurrently — and returns when all calls have returned. A host pool
// (TBB's parallel_for, OpenMP, a trainer's worker pool) plugs in as a lambda; ulorl provides the
// sequential default and a simple std::thread fallback. Bodies never throw: inputs are validated
// before any work is handed out.
#pragma once

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

//! Runs everything on the calling thread (the default; allocates nothing).
struct sequential_executor {
  template <class Body>
  void operator()(std::size_t n, Body&& body) const {
    if (n > 0) body(std::size_t{0}, n);
  }
};

//! Splits [0, n) into `threads` contiguous blocks, runs all but the first on fresh std::threads and
//! the first on the caller, then joins. `threads = 0` uses std::thread::hardware_concurrency().
//! Starting threads costs tens of microseconds: use it for batches of long rows, or pass a pool.
struct thread_executor {
  unsigned threads = 0;

  template <class Body>
  void operator()(std::size_t n, Body&& body) const {
    if (n == 0) return;
    std::size_t k = threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
    k = std::min(k, n);
    if (k == 1) {
      body(std::size_t{0}, n);
      return;
    }
    std::vector<std::thread> workers;
    workers.reserve(k - 1);
    const auto bound = [&](std::size_t i) { return n * i / k; };
    for (std::size_t i = 1; i < k; ++i) workers.emplace_back([&body, lo = bound(i), hi = bound(i + 1)] { body(lo, hi); });
    body(std::size_t{0}, bound(1));
    for (auto& w : workers) w.join();
  }
};

ULORL_NAMESPACE_END
