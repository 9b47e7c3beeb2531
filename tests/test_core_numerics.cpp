// Tests for ulorl/core/numerics.hpp: robust moments, log-sum-exp, clamp's gradient convention.
#include <ulorl/core/numerics.hpp>

#include <cmath>
#include <vector>

#include "catch.hpp"
#include "support/random.hpp"

TEST_CASE("two-pass moments survive a large offset", "[numerics]") {
  std::vector<double> x;
  for (int i = 0; i < 1000; ++i) x.push_back(1e9 + (i % 2) * 1e-3);
  const auto m = ulorl::two_pass_moments(x.size(), [&](std::size_t i) { return x[i]; });
  // exact: values 1e9 and 1e9+1e-3 (as represented), half each
  const double d = (1e9 + 1e-3) - 1e9;
  REQUIRE(m.variance(false) == Approx(d * d / 4).epsilon(1e-6));
  REQUIRE(m.variance(true) == Approx(d * d / 4 * 1000.0 / 999.0).epsilon(1e-6));
  const auto one = ulorl::two_pass_moments(1, [](std::size_t) { return 5.0; });
  REQUIRE(one.variance(true) == 0.0);
  REQUIRE(one.mean == 5.0);
}

TEST_CASE("lse_accumulator equals log(sum(exp)) with -inf entries", "[numerics]") {
  testing_support::rng r(1);
  for (int trial = 0; trial < 100; ++trial) {
    ulorl::lse_accumulator<double> acc;
    long double s = 0;
    const double shift = r.uniform(-500, 500);
    for (int i = 0; i < 50; ++i) {
      const double v = r.coin(0.1) ? -std::numeric_limits<double>::infinity() : shift + r.normal(0, 5);
      acc.add(v);
      s += std::exp(static_cast<long double>(v - shift));
    }
    REQUIRE(acc.value() == Approx(shift + static_cast<double>(std::log(s))).epsilon(1e-13));
  }
}

TEST_CASE("clamp passes the gradient on the closed interval", "[numerics]") {
  REQUIRE(ulorl::clamp(3.0, -1.0, 2.0) == 2.0);
  REQUIRE(ulorl::clamp_passes_gradient(2.0, -1.0, 2.0));
  REQUIRE_FALSE(ulorl::clamp_passes_gradient(2.0000001, -1.0, 2.0));
  static_assert(ulorl::clamp(0.5, 0.0, 1.0) == 0.5);
}
