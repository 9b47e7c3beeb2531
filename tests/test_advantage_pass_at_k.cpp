// Tests for ulorl/advantage/pass_at_k.hpp against the oracle (sorted scores per group): random
// unsorted group ids with ties, the bare gap, scores near the double maximum, and the rejections
// (groups of one, bad eps, nothing written).
#include <ulorl/advantage/pass_at_k.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

TEST_CASE("Pass@k advantages match the oracle, ties included", "[pass_at_k]") {
  testing_support::rng r(17);
  INFO("seed 17");
  for (std::size_t groups : {1u, 3u, 16u}) {
    for (std::size_t k : {2u, 3u, 8u}) {
      for (bool scale : {true, false}) {
        for (bool discrete : {true, false}) {
          const std::size_t B = groups * k;
          std::vector<std::int64_t> ids(B);
          for (std::size_t i = 0; i < B; ++i) ids[i] = static_cast<std::int64_t>((i * 7 + 3) % groups) * 5;
          std::vector<double> s(B), out(B, 9);
          for (auto& x : s) x = discrete ? static_cast<double>(r.integer(0, 2)) : r.normal();  // 0/1/2: many ties
          const auto layout = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
          ulorl::pass_at_k_advantages(std::span<const double>(s), layout, std::span<double>(out),
                                      {.eps = 1e-6, .scale_by_std = scale});
          const auto want = oracle::pass_at_k(s, ids, 1e-6, scale);
          std::size_t nonzero = 0;
          for (std::size_t i = 0; i < B; ++i) {
            REQUIRE(out[i] == Approx(want[i]).epsilon(1e-13).margin(1e-15));
            nonzero += out[i] != 0;
            REQUIRE(out[i] >= 0);
          }
          REQUIRE(nonzero <= groups);
          std::vector<float> s32(s.begin(), s.end()), out32(B);
          ulorl::pass_at_k_advantages(std::span<const float>(s32), layout, std::span<float>(out32),
                                      {.eps = 1e-6, .scale_by_std = scale});
          for (std::size_t i = 0; i < B; ++i) REQUIRE(out32[i] == Approx(out[i]).epsilon(1e-5).margin(1e-6));
        }
      }
    }
  }
}

TEST_CASE("Pass@k: a tie for the maximum gives 0, the first best is the one written", "[pass_at_k]") {
  const std::vector<double> s{1, 3, 3, 0, 2, 5, 5, 5};
  const std::vector<std::int64_t> ids{0, 0, 0, 0, 1, 1, 2, 2};
  std::vector<double> out(8, 9);
  ulorl::pass_at_k_advantages(std::span<const double>(s),
                              ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)), std::span<double>(out),
                              {.scale_by_std = false});
  REQUIRE(out == std::vector<double>{0, 0, 0, 0, 0, 3, 0, 0});
}

TEST_CASE("Pass@k: scores near the double maximum neither overflow the gap nor the std", "[pass_at_k][overflow]") {
  const double big = std::numeric_limits<double>::max();
  const std::vector<double> s{big, -big, 0.5 * big};
  std::vector<double> out(3);
  const auto g = ulorl::group_layout::fixed(3, 3);
  ulorl::pass_at_k_advantages(std::span<const double>(s), g, std::span<double>(out));
  // gap 0.5 big, std of {1, -1, 0.5} big
  const long double u[] = {1.0L, -1.0L, 0.5L}, mu = (u[0] + u[1] + u[2]) / 3;
  const long double sd =
      std::sqrt(((u[0] - mu) * (u[0] - mu) + (u[1] - mu) * (u[1] - mu) + (u[2] - mu) * (u[2] - mu)) / 2);
  REQUIRE(out[0] == Approx(static_cast<double>(0.5L / sd)).epsilon(1e-14));
  REQUIRE(out[1] == 0);
  REQUIRE(out[2] == 0);
  std::vector<double> keep(3, 9);
  require_rejected(outcome_of([&] {
                     ulorl::pass_at_k_advantages(std::span<const double>(std::vector<double>{big, -big, -big}.data(), 3),
                                                 g, std::span<double>(keep), {.scale_by_std = false});
                   }),
                   "pass_at_k_advantages", "out", 0);
  for (double x : keep) REQUIRE(x == 9);
}

TEST_CASE("Pass@k rejects groups of one and bad inputs before writing", "[pass_at_k][errors]") {
  const std::vector<double> s{1, 0, 2, 3, 4};
  const std::vector<std::int64_t> ids{4, 4, 7, 4, 9};
  std::vector<double> out(5, 9);
  const auto g = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
  require_rejected(
      outcome_of([&] { ulorl::pass_at_k_advantages(std::span<const double>(s), g, std::span<double>(out)); }),
      "pass_at_k_advantages", "groups", 2);
  const auto g2 = ulorl::group_layout::fixed(4, 2);
  const std::vector<double> s4{1, 0, NAN, 3};
  std::vector<double> out4(4, 9);
  require_rejected(
      outcome_of([&] { ulorl::pass_at_k_advantages(std::span<const double>(s4), g2, std::span<double>(out4)); }),
      "pass_at_k_advantages", "scores", 2);
  const std::vector<double> ok{1, 0, 2, 3};
  require_rejected(outcome_of([&] {
                     ulorl::pass_at_k_advantages(std::span<const double>(ok), g2, std::span<double>(out4), {.eps = -1});
                   }),
                   "pass_at_k_advantages", "config.eps", -1);
  require_rejected(outcome_of([&] {
                     ulorl::pass_at_k_advantages(std::span<const double>(ok), g2, std::span<double>(out4.data(), 3));
                   }),
                   "pass_at_k_advantages", "out", -1);
  for (double x : out) REQUIRE(x == 9);
  for (double x : out4) REQUIRE(x == 9);
}
