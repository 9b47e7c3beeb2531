// Tests for ulorl/core/parallel.hpp: the executors and executor_ref.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "ulorl/core/parallel.hpp"

namespace {

//! Records every block it hands out and runs them in reverse order.
struct recording_executor {
  std::vector<std::pair<std::size_t, std::size_t>>* blocks;
  std::size_t pieces = 3;
  template <class Body>
  void operator()(std::size_t n, Body&& body) const {
    std::vector<std::pair<std::size_t, std::size_t>> mine;
    for (std::size_t i = 0; i < pieces; ++i) mine.emplace_back(n * i / pieces, n * (i + 1) / pieces);
    for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
      blocks->push_back(*it);
      body(it->first, it->second);
    }
  }
};

//! Every index in [0, n) covered exactly once by the body's calls, each of them a non-empty range;
//! no call at all for n = 0.
template <class Exec>
void covers_once(const Exec& exec, std::size_t n) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> calls{0};
  exec(n, [&](std::size_t b, std::size_t e) {
    REQUIRE(b < e);
    ++calls;
    for (std::size_t i = b; i < e; ++i) ++hits[i];
  });
  for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
  if (n == 0) CHECK(calls == 0);
}

//! Every index in [0, n) covered exactly once by the body's calls.
template <class Exec>
std::vector<int> coverage(const Exec& exec, std::size_t n) {
  std::vector<int> hits(n, 0);
  std::mutex m;
  exec(n, [&](std::size_t lo, std::size_t hi) {
    std::lock_guard<std::mutex> lock(m);
    for (std::size_t i = lo; i < hi; ++i) ++hits[i];
  });
  return hits;
}

}  // namespace

TEST_CASE("executors cover every index exactly once with disjoint, non-empty ranges") {
  for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 1000u}) {
    covers_once(ulorl::sequential_executor{}, n);
    for (unsigned t : {0u, 1u, 2u, 3u, 16u}) covers_once(ulorl::thread_executor{t}, n);
  }
}

TEST_CASE("executor_ref: a sequential_executor stays sequential, one block on the calling thread") {
  const ulorl::sequential_executor seq;
  const ulorl::executor_ref ref(seq);
  CHECK(ref.sequential());
  CHECK(ulorl::detail::is_sequential(seq));
  CHECK(ulorl::detail::is_sequential(ref));
  int calls = 0;
  ref(10, [&](std::size_t lo, std::size_t hi) {
    ++calls;
    CHECK(lo == 0);
    CHECK(hi == 10);
  });
  CHECK(calls == 1);
  ref(0, [&](std::size_t, std::size_t) { ++calls; });
  CHECK(calls == 1);  // no rows, no call
}

TEST_CASE("executor_ref: forwards every block of the referenced executor, in its order") {
  std::vector<std::pair<std::size_t, std::size_t>> blocks;
  const recording_executor rec{&blocks, 3};
  const ulorl::executor_ref ref(rec);
  CHECK_FALSE(ref.sequential());
  CHECK_FALSE(ulorl::detail::is_sequential(rec));
  CHECK_FALSE(ulorl::detail::is_sequential(ref));
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  ref(9, [&](std::size_t lo, std::size_t hi) { seen.emplace_back(lo, hi); });
  const std::vector<std::pair<std::size_t, std::size_t>> expected{{6, 9}, {3, 6}, {0, 3}};
  CHECK(seen == expected);
  CHECK(blocks == expected);
  // A copy refers to the same executor.
  const ulorl::executor_ref copy = ref;
  seen.clear();
  copy(3, [&](std::size_t lo, std::size_t hi) { seen.emplace_back(lo, hi); });
  CHECK(seen == (std::vector<std::pair<std::size_t, std::size_t>>{{2, 3}, {1, 2}, {0, 1}}));
}

TEST_CASE("executor_ref: a thread_executor through the reference covers every index once") {
  for (unsigned threads : {1u, 2u, 3u, 7u})
    for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{100}}) {
      const ulorl::thread_executor te{threads};
      const auto direct = coverage(te, n);
      const auto through = coverage(ulorl::executor_ref(te), n);
      CHECK(direct == std::vector<int>(n, 1));
      CHECK(through == std::vector<int>(n, 1));
    }
  // A lambda executor (a host pool's shape) works too.
  std::atomic<int> calls{0};
  const auto pool = [&](std::size_t n, const auto& body) {
    ++calls;
    body(std::size_t{0}, n / 2);
    body(n / 2, n);
  };
  CHECK(coverage(ulorl::executor_ref(pool), 11) == std::vector<int>(11, 1));
  CHECK(calls == 1);
}
