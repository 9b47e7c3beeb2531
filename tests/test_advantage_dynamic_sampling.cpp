// Tests for ulorl/advantage/dynamic_sampling.hpp (DAPO dynamic sampling).
#include <ulorl/advantage/dynamic_sampling.hpp>

#include <vector>

#include "catch.hpp"

TEST_CASE("groups with all-equal rewards are dropped; the window filters the rest", "[dynamic_sampling]") {
  // groups: 0 all correct, 1 all wrong, 2 mixed 3/4, 3 mixed 1/4
  const std::vector<double> acc{1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0};
  const auto g = ulorl::group_layout::fixed(16, 4);
  std::vector<std::uint8_t> keep(16);
  auto r = ulorl::dynamic_sampling_filter(std::span<const double>(acc), g, std::span<std::uint8_t>(keep));
  REQUIRE(r.groups == 4);
  REQUIRE(r.kept_groups == 2);
  REQUIRE(r.zero_variance_groups == 2);
  REQUIRE(r.kept_responses == 8);
  for (std::size_t i = 0; i < 16; ++i) REQUIRE(keep[i] == (i >= 8 ? 1 : 0));
  r = ulorl::dynamic_sampling_filter(std::span<const double>(acc), g, std::span<std::uint8_t>(keep),
                                     {.min_accuracy = 0.0, .max_accuracy = 0.5, .use_window = true});
  REQUIRE(r.kept_groups == 1);
  REQUIRE(r.outside_window_groups == 1);
  REQUIRE(keep[12] == 1);
  REQUIRE(keep[8] == 0);
  r = ulorl::dynamic_sampling_filter(std::span<const double>(acc), g, std::span<std::uint8_t>(keep), {.drop_zero_variance = false});
  REQUIRE(r.kept_groups == 4);
}

TEST_CASE("dynamic sampling rejects bad input", "[dynamic_sampling][errors]") {
  const std::vector<double> acc{1, std::nan(""), 0, 1};
  std::vector<int> keep(4, 7);
  const auto g = ulorl::group_layout::fixed(4, 2);
  REQUIRE_THROWS_WITH((void)ulorl::dynamic_sampling_filter(std::span<const double>(acc), g, std::span<int>(keep)),
                      Catch::Contains("'metric'[1]"));
  const std::vector<double> ok{1, 0, 0, 1};
  REQUIRE_THROWS_WITH((void)ulorl::dynamic_sampling_filter(std::span<const double>(ok), g, std::span<int>(keep),
                                                            {.min_accuracy = 0.8, .max_accuracy = 0.2, .use_window = true}),
                      Catch::Contains("config.max_accuracy"));
  REQUIRE_THROWS_WITH((void)ulorl::dynamic_sampling_filter(std::span<const double>(ok), g, std::span<int>(keep.data(), 3)),
                      Catch::Contains("'keep'"));
  for (int k : keep) REQUIRE(k == 7);
}

TEST_CASE("dynamic sampling: a group mean of values near the double maximum does not overflow", "[dynamic_sampling][overflow]") {
  // 1.7e308 + 1.7e308 overflows a plain sum; the mean 1.7e308 lies inside [0, 1.79e308].
  const std::vector<double> big{1.7e308, 1.7e308, 1.7e308, 1.6e308};
  std::vector<std::uint8_t> keep(4, 7);
  const auto r = ulorl::dynamic_sampling_filter(std::span<const double>(big), ulorl::group_layout::fixed(4, 2),
                                                std::span<std::uint8_t>(keep),
                                                {.drop_zero_variance = false, .min_accuracy = 0.0, .max_accuracy = 1.79e308, .use_window = true});
  CHECK(r.kept_groups == 2);
  CHECK(r.outside_window_groups == 0);
  CHECK(keep == std::vector<std::uint8_t>{1, 1, 1, 1});
  // A window ending at 1.66e308 keeps the second group (mean 1.65e308), not the first (1.7e308).
  const auto r2 = ulorl::dynamic_sampling_filter(std::span<const double>(big), ulorl::group_layout::fixed(4, 2),
                                                 std::span<std::uint8_t>(keep),
                                                 {.drop_zero_variance = false, .min_accuracy = 0.0, .max_accuracy = 1.66e308, .use_window = true});
  CHECK(r2.kept_groups == 1);
  CHECK(r2.outside_window_groups == 1);
  CHECK(keep == std::vector<std::uint8_t>{0, 0, 1, 1});
}
