// tests/support/random.hpp — seeded random inputs for the tests; the seed is printed by Catch2's
// INFO/CAPTURE at the call site so a failure can be replayed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace testing_support {

inline constexpr std::uint64_t default_seed = 20261129;

struct rng {
  std::mt19937_64 gen;
  explicit rng(std::uint64_t seed = default_seed) : gen(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  double normal(double mu = 0, double sd = 1) { return std::normal_distribution<double>(mu, sd)(gen); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(gen); }
};

//! Group ids for n responses in unequal, shuffled groups with singletons; ids are sparse.
inline std::vector<std::int64_t> random_group_ids(rng& r, std::size_t n) {
  std::vector<std::int64_t> ids(n);
  const std::int64_t groups = std::max<std::int64_t>(1, static_cast<std::int64_t>(n) / 3);
  for (auto& id : ids) id = 1000 + 7 * r.integer(0, groups - 1);
  return ids;
}

}  // namespace testing_support
