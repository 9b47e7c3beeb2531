// Tests of ulorl/loss/ratio.hpp: loss_exp accuracy against libm and the clamped ratio's gradient
// rule.
#include <ulorl/loss/ratio.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"

namespace {
constexpr std::uint64_t seed = 71;
}  // namespace

TEST_CASE("loss_exp: a few ulp of std::exp over the whole finite range, finite everywhere") {
  std::printf("test_loss_ratio seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-700, 700), small(-30, 30);
  double worst_d = 0, worst_f = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? u(rng) : small(rng);
    const double e = std::exp(x);
    worst_d = std::max(worst_d, std::fabs(ulorl::loss_exp(x) - e) / e);
    const float xf = static_cast<float>(small(rng) * 2.8);
    const double ef = std::exp(static_cast<double>(xf));
    worst_f = std::max(worst_f, std::fabs(static_cast<double>(ulorl::loss_exp(xf)) - ef) / ef);
  }
  std::printf("  loss_exp worst relative error: double %.3g, float %.3g\n", worst_d, worst_f);
  REQUIRE(worst_d < 4 * std::numeric_limits<double>::epsilon());
  REQUIRE(worst_f < 4 * std::numeric_limits<float>::epsilon());
  REQUIRE(ulorl::loss_exp(0.0) == 1.0);
  REQUIRE(ulorl::loss_exp(0.0f) == 1.0f);
  // Saturation instead of inf / 0.
  for (double x : {-1e300, -1e4, -800.0, 710.0, 1e4, 1e300}) {
    REQUIRE(std::isfinite(ulorl::loss_exp(x)));
    REQUIRE(ulorl::loss_exp(x) > 0);
    REQUIRE(std::isfinite(ulorl::loss_exp(static_cast<float>(x))));
    REQUIRE(ulorl::loss_exp(static_cast<float>(x)) > 0);
  }
  REQUIRE(ulorl::loss_exp(-1e4) < 1e-300);
  REQUIRE(ulorl::loss_exp(1e4) > 1e307);
}

TEST_CASE("exp_minus_one_minus_x: accurate near 0 and on both sides of the series switch") {
  for (double u : {1e-12, -1e-9, 1e-5, -0.01, 0.2499, 0.25, -0.2501, 0.7, -3.0, 12.0}) {
    // Reference: long double expm1, or its Taylor series where even long double cancels.
    const long double ul = u;
    const long double ref = std::fabs(u) < 1e-3 ? ul * ul / 2 + ul * ul * ul / 6 + ul * ul * ul * ul / 24 : std::expm1(ul) - ul;
    INFO(u);
    REQUIRE(ulorl::exp_minus_one_minus_x(u) == Approx(static_cast<double>(ref)).epsilon(1e-14));
    REQUIRE(ulorl::exp_minus_one_minus_x(u) >= 0);
  }
}

TEST_CASE("clamped_ratio: value, derivative, closed-interval clamp rule") {
  const auto a = ulorl::clamped_ratio(-1.0, -1.5, 20.0);
  REQUIRE(a.ratio == Approx(std::exp(0.5)).epsilon(1e-15));
  REQUIRE(a.dratio == a.ratio);
  const auto b = ulorl::clamped_ratio(30.0, 0.0, 20.0);
  REQUIRE(b.log_ratio == 20.0);
  REQUIRE(b.dratio == 0.0);
  const auto c = ulorl::clamped_ratio(20.0, 0.0, 20.0);  // at the bound: gradient passes
  REQUIRE(c.dratio == c.ratio);
  const auto d = ulorl::clamped_ratio(-70.0, 0.0, std::numeric_limits<double>::infinity());
  REQUIRE(d.ratio == Approx(std::exp(-70.0)).epsilon(1e-14));
}
