// ulorl/core/parallel.hpp — how the row-parallel CPU kernels (logits, policy loss) run on the host's threads.
// An *executor* is any callable `exec(n, body)` that calls `body(begin, end)` on disjoint ranges
// covering [0, n) — possibly concurrently — and returns when all calls have returned. A host pool
// (TBB's parallel_for, OpenMP, a trainer's worker pool) plugs in as a lambda; ulorl provides the
// sequential default and a simple std::thread fallback. Bodies never throw: inputs are validated
// before any work is handed out.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <thread>
#include <type_traits>
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

//! A non-owning reference to an executor, itself an executor. The kernels' dispatch takes one, so
//! that it is compiled once per value and mask type, not once per executor type (and can be
//! instantiated once for a whole program: ULORL_EXTERN_KERNELS in ulorl/loss/policy_loss.hpp). One indirect call per
//! block of rows. A reference to sequential_executor stays sequential (`sequential()` is true: the
//! kernels then fold rows as they go, allocating nothing). The referenced executor must outlive it.
class executor_ref {
 public:
  executor_ref(const sequential_executor&) noexcept {}  // NOLINT: implicit, as the executor itself
  template <class Exec>
    requires(!std::is_same_v<Exec, sequential_executor> && !std::is_same_v<Exec, executor_ref>)
  executor_ref(const Exec& exec) noexcept  // NOLINT: implicit, as the executor itself
      : exec_(&exec), run_(&run<Exec>) {}

  [[nodiscard]] bool sequential() const noexcept { return run_ == nullptr; }

  template <class Body>
  void operator()(std::size_t n, Body&& body) const {
    if (run_ == nullptr) {
      if (n > 0) body(std::size_t{0}, n);
      return;
    }
    using B = std::remove_reference_t<Body>;
    run_(exec_, n, const_cast<void*>(static_cast<const void*>(std::addressof(body))),
         [](void* b, std::size_t lo, std::size_t hi) { (*static_cast<B*>(b))(lo, hi); });
  }

 private:
  using body_fn = void (*)(void*, std::size_t, std::size_t);
  template <class Exec>
  static void run(const void* exec, std::size_t n, void* body, body_fn call) {
    (*static_cast<const Exec*>(exec))(n, [body, call](std::size_t lo, std::size_t hi) { call(body, lo, hi); });
  }
  const void* exec_ = nullptr;
  void (*run_)(const void*, std::size_t, void*, body_fn) = nullptr;
};

namespace detail {
//! Whether `exec` runs everything on the calling thread in one block (known at compile time for
//! sequential_executor, at run time for an executor_ref).
template <class Exec>
[[nodiscard]] constexpr bool is_sequential(const Exec& exec) noexcept {
  if constexpr (std::is_same_v<Exec, sequential_executor>) return ((void)exec, true);
  else if constexpr (std::is_same_v<Exec, executor_ref>) return exec.sequential();
  else return ((void)exec, false);
}
}  // namespace detail

ULORL_NAMESPACE_END
