// Tests for ulorl/advantage/overlong.hpp: DAPO soft punishment, TRL's variant, UloRL's rule.
#include <ulorl/advantage/overlong.hpp>

#include <vector>

#include "catch.hpp"

TEST_CASE("DAPO soft overlong penalty", "[overlong]") {
  const ulorl::dapo_overlong_config c{.max_length = 100, .buffer_length = 20, .penalty_factor = 1.0};
  const std::vector<double> len{10, 80, 90, 100, 120};
  std::vector<double> p(5);
  ulorl::dapo_overlong_penalties(std::span<const double>(len), std::span<double>(p), c);
  REQUIRE(p == std::vector<double>{0, 0, -0.5, -1.0, -2.0});  // no lower bound past L_max
  std::vector<double> untouched(5, 9);
  REQUIRE_THROWS_WITH(ulorl::dapo_overlong_penalties(std::span<const double>(len), std::span<double>(untouched),
                                                     {.max_length = 100, .buffer_length = 0}),
                      Catch::Contains("config.buffer_length"));
  REQUIRE_THROWS_WITH(ulorl::dapo_overlong_penalties(std::span<const double>(len), std::span<double>(untouched),
                                                     {.max_length = 10, .buffer_length = 20}),
                      Catch::Contains("config.max_length"));
  const std::vector<double> neg{1, -3};
  REQUIRE_THROWS_WITH(ulorl::dapo_overlong_penalties(std::span<const double>(neg), std::span<double>(untouched.data(), 2), c),
                      Catch::Contains("'lengths'[1] = -3"));
  for (double x : untouched) REQUIRE(x == 9);
}

TEST_CASE("TRL soft overlong punishment", "[overlong]") {
  const std::vector<int> len{50, 90, 95, 100, 101};
  std::vector<double> p(5);
  ulorl::soft_overlong_penalties(std::span<const int>(len), std::span<double>(p), {.max_length = 100, .cache_length = 10});
  REQUIRE(p[0] == 0.0);
  REQUIRE(p[1] == 0.0);
  REQUIRE(p[2] == Approx(-0.5));
  REQUIRE(p[3] == Approx(-1.0));
  REQUIRE(p[4] == -1.0);
  ulorl::soft_overlong_penalties(std::span<const int>(len), std::span<double>(p), {.max_length = 100, .cache_length = 0});
  REQUIRE(p == std::vector<double>{0, 0, 0, 0, -1});
}

TEST_CASE("UloRL: truncated responses are incorrect", "[overlong]") {
  std::vector<float> s{1, 1, 0, 1};
  const std::vector<bool> trunc_v{false, true, true, false};
  const std::vector<std::uint8_t> trunc{0, 1, 1, 0};
  REQUIRE(ulorl::truncated_as_incorrect(std::span<float>(s), std::span<const std::uint8_t>(trunc), -1.0) == 2);
  REQUIRE(s == std::vector<float>{1, -1, -1, 1});
  REQUIRE_THROWS_WITH(ulorl::truncated_as_incorrect(std::span<float>(s), std::span<const std::uint8_t>(trunc.data(), 3)),
                      Catch::Contains("'truncated'"));
}

TEST_CASE("DAPO overlong: a penalty beyond the output type's range is an error; a subnormal window is not a divisor",
          "[overlong][overflow]") {
  const std::vector<double> len{10, 120};
  std::vector<float> p(2, 9.0f);
  CHECK_THROWS_WITH(ulorl::dapo_overlong_penalties(std::span<const double>(len), std::span<float>(p),
                                                   {.max_length = 100, .buffer_length = 20, .penalty_factor = 1e39}),
                    Catch::Contains("'penalties'[1]") && Catch::Contains("overflows float32"));
  CHECK(p == std::vector<float>{9.0f, 9.0f});
  std::vector<double> pd(2, 9.0);
  CHECK_THROWS_WITH(ulorl::dapo_overlong_penalties(std::span<const double>(len), std::span<double>(pd),
                                                   {.max_length = 100, .buffer_length = 1e-310}),
                    Catch::Contains("config.buffer_length") && Catch::Contains("reciprocal"));
  CHECK_THROWS_WITH(ulorl::soft_overlong_penalties(std::span<const double>(len), std::span<double>(pd),
                                                   {.max_length = 100, .cache_length = 5e-324}),
                    Catch::Contains("config.cache_length"));
  CHECK(pd == std::vector<double>{9.0, 9.0});
}
