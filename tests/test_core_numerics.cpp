// Tests for ulorl/core/numerics.hpp: robust moments, log-sum-exp, clamp's gradient convention.
#include <ulorl/core/numerics.hpp>

#include <cmath>
#include <limits>
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

TEST_CASE("two-pass moments cannot overflow for finite values", "[numerics]") {
  const double dmax = std::numeric_limits<double>::max();
  const std::vector<double> a{1e200, 0.0};
  const auto m = ulorl::two_pass_moments(a.size(), [&](std::size_t i) { return a[i]; });
  // By hand: mean 5e199, deviations +-5e199, M2 = 5e399 (not representable), std 1e200 / sqrt(2).
  CHECK(m.mean == 5e199);
  CHECK(m.stddev(true) == Approx(1e200 / std::sqrt(2.0)).epsilon(1e-15));
  CHECK(m.stddev(false) == Approx(5e199).epsilon(1e-15));
  CHECK(m.scaled_stddev(true) * std::ldexp(1.0, m.exponent) == Approx(1e200 / std::sqrt(2.0)).epsilon(1e-15));
  CHECK(m.m2 == std::numeric_limits<double>::infinity());
  const std::vector<double> b{dmax, dmax};
  const auto mb = ulorl::two_pass_moments(b.size(), [&](std::size_t i) { return b[i]; });
  CHECK(mb.mean == dmax);
  CHECK(mb.stddev(true) == 0.0);
  // The mean of {max, max, -max} is max / 3 (the plain sum overflows).
  const std::vector<double> c{dmax, dmax, -dmax};
  const auto mc = ulorl::two_pass_moments(c.size(), [&](std::size_t i) { return c[i]; });
  CHECK(mc.mean == Approx(dmax / 3).epsilon(1e-15));
  // std of {max, -max}: sqrt(2) max is not representable (inf); its scaled form is.
  const std::vector<double> d{dmax, -dmax};
  const auto md = ulorl::two_pass_moments(d.size(), [&](std::size_t i) { return d[i]; });
  CHECK(md.mean == 0.0);
  CHECK(md.stddev(true) == std::numeric_limits<double>::infinity());
  CHECK(std::ldexp(md.scaled_stddev(true), md.exponent - 1) == Approx(std::sqrt(2.0) * (dmax / 2)).epsilon(1e-15));
  // Subnormal values: {3e-320, 1e-320} has mean 2e-320 and biased std 1e-320 (to the spacing 5e-324).
  const std::vector<double> e{3e-320, 1e-320};
  const auto me = ulorl::two_pass_moments(e.size(), [&](std::size_t i) { return e[i]; });
  CHECK(std::fabs(me.mean - 2e-320) <= 5e-324);
  CHECK(std::fabs(me.stddev(false) - 1e-320) <= 5e-324);
}
