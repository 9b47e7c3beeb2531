// Tests for ulorl/advantage/baselines.hpp (GPG, OPO) against hand-derived formulas.
#include <ulorl/advantage/baselines.hpp>

#include <vector>

#include "catch.hpp"

TEST_CASE("GPG scales centred scores by B / #nonzero", "[gpg]") {
  const std::vector<double> s{1, 0, 0, 1, 2};
  const std::vector<std::int64_t> ids{0, 0, 1, 1, 7};  // response 4 is a singleton: mu = 0
  std::vector<double> a(5);
  const auto g = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
  ulorl::gpg_advantages(std::span<const double>(s), g, std::span<double>(a), {.f_norm = 2.0});
  const double alpha = 5.0 / 3.0;
  REQUIRE(a[0] == Approx(alpha * 0.5 / 2));
  REQUIRE(a[1] == Approx(-alpha * 0.5 / 2));
  REQUIRE(a[3] == Approx(alpha * 0.5 / 2));
  REQUIRE(a[4] == Approx(alpha * 2 / 2));
  const std::vector<double> zeros{0, 0, 0, 0, 0};
  ulorl::gpg_advantages(std::span<const double>(zeros), g, std::span<double>(a));  // alpha = B / max(0, 1)
  for (double x : a) REQUIRE(x == 0.0);
  REQUIRE_THROWS_WITH(ulorl::gpg_advantages(std::span<const double>(s), g, std::span<double>(a), {.f_norm = 0.0}),
                      Catch::Contains("config.f_norm"));
}

TEST_CASE("OPO subtracts the length-weighted group mean", "[opo]") {
  const std::vector<double> s{1, 0, 1, 5};
  const std::vector<double> len{10, 30, 20, 4};
  const std::vector<std::int64_t> ids{3, 3, 3, 9};
  std::vector<double> a(4);
  const auto g = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
  ulorl::opo_advantages(std::span<const double>(s), std::span<const double>(len), g, std::span<double>(a));
  const double b = (10 * 1 + 30 * 0 + 20 * 1) / 60.0;
  REQUIRE(a[0] == Approx(1 - b));
  REQUIRE(a[1] == Approx(-b));
  REQUIRE(a[3] == 5.0);  // singleton: baseline 0
  const std::vector<double> zero_len{0, 0, 0, 4};
  std::vector<double> out(4, 9);
  REQUIRE_THROWS_WITH(ulorl::opo_advantages(std::span<const double>(s), std::span<const double>(zero_len), g, std::span<double>(out)),
                      Catch::Contains("'lengths'[0]") && Catch::Contains("length 0"));
  const std::vector<double> neg_len{1, -1, 1, 1};
  REQUIRE_THROWS_WITH(ulorl::opo_advantages(std::span<const double>(s), std::span<const double>(neg_len), g, std::span<double>(out)),
                      Catch::Contains("'lengths'[1] = -1"));
  for (double x : out) REQUIRE(x == 9);
}

TEST_CASE("GPG and OPO: no overflow for finite scores near the double maximum; a value beyond T is an error",
          "[gpg][opo][overflow]") {
  // {max, -max}: s - mu = +-max overflows nothing with the scaled deviation: a = alpha (s - mu) / f_norm.
  const double big = 1.7e308;
  const std::vector<double> s{big, -big};
  std::vector<double> a(2, 7.0);
  const auto g = ulorl::group_layout::fixed(2, 2);
  ulorl::gpg_advantages(std::span<const double>(s), g, std::span<double>(a), {.f_norm = 2.0});
  CHECK(a[0] == big / 2);
  CHECK(a[1] == -big / 2);
  // f_norm 0.5 doubles it beyond the double range: an error, nothing written.
  std::vector<double> keep(2, 7.0);
  CHECK_THROWS_WITH(ulorl::gpg_advantages(std::span<const double>(s), g, std::span<double>(keep), {.f_norm = 0.5}),
                    Catch::Contains("'out'[0]") && Catch::Contains("overflows float64"));
  CHECK(keep == std::vector<double>{7.0, 7.0});
  // A subnormal f_norm has no finite reciprocal.
  CHECK_THROWS_WITH(ulorl::gpg_advantages(std::span<const double>(s), g, std::span<double>(keep), {.f_norm = -5e-324}),
                    Catch::Contains("config.f_norm") && Catch::Contains("reciprocal"));
  // float: 3e38 - (-3e38) / ... in float: GPG's (s - mu) = 3e38 fits, x 5/... does not.
  const std::vector<float> sf{3e38f, -3e38f};
  std::vector<float> af(2, 7.0f);
  CHECK_THROWS_WITH(ulorl::gpg_advantages(std::span<const float>(sf), g, std::span<float>(af), {.f_norm = 0.5}),
                    Catch::Contains("overflows float32"));
  CHECK(af == std::vector<float>{7.0f, 7.0f});
  // OPO: Σ l s = 2 x 1e308 overflows; the length-weighted mean 1e308 does not.
  const std::vector<double> s2{1e308, 1e308, 0.5e308};
  const std::vector<double> len{1, 1, 2};
  std::vector<double> b(3);
  ulorl::opo_advantages(std::span<const double>(s2), std::span<const double>(len), ulorl::group_layout::fixed(3, 3), std::span<double>(b));
  CHECK(b[0] == Approx(0.25e308));
  CHECK(b[2] == Approx(-0.25e308));
}
