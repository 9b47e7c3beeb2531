// Tests of ulorl/logits/parallel.hpp: every executor covers [0, n) exactly once with disjoint ranges.
#include <atomic>
#include <cstddef>
#include <vector>

#include <ulorl/logits/parallel.hpp>

#include "catch.hpp"

namespace {
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
}  // namespace

TEST_CASE("executors cover every index exactly once") {
  for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 1000u}) {
    covers_once(ulorl::sequential_executor{}, n);
    for (unsigned t : {0u, 1u, 2u, 3u, 16u}) covers_once(ulorl::thread_executor{t}, n);
  }
}
