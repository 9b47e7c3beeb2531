// Tests of ulorl/loss/objectives.hpp: each per-token objective against a textbook float64 formula
// and a central finite difference; torch's tie and clamp conventions at the exact kinks.
#include <ulorl/loss/objectives.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "catch.hpp"

namespace {
constexpr std::uint64_t seed = 5;
double ppo_ref(double r, double a, double lo, double hi, double c, double delta) {
  const double r1 = delta > 0 ? std::min(r, delta) : r;
  double l = std::max(-a * r1, -a * std::min(std::max(r, lo), hi));
  if (a < 0 && c > 0) l = std::min(l, -a * c);
  return l;
}
}  // namespace

TEST_CASE("clipped_surrogate: value and derivative match the textbook objective (FD away from kinks)") {
  std::printf("test_loss_objectives seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (double c : {0.0, 3.0})
    for (double delta : {0.0, 1.5}) {
      const ulorl::objective_config cfg{.eps_low = 0.2, .eps_high = 0.28, .dual_clip = c, .delta = delta};
      const auto p = ulorl::make_objective_params<double>(cfg);
      for (int i = 0; i < 5000; ++i) {
        const double x = (u(rng) - 0.5) * 3, a = (u(rng) - 0.5) * 4;
        const double r = std::exp(x);
        const auto o = ulorl::clipped_surrogate(r, r, a, p);  // d/dx
        REQUIRE(o.loss == Approx(ppo_ref(r, a, 0.8, 1.28, c, delta)).epsilon(1e-14));
        const double h = 1e-6;
        const double f1 = ppo_ref(std::exp(x + h), a, 0.8, 1.28, c, delta),
                     f0 = ppo_ref(std::exp(x - h), a, 0.8, 1.28, c, delta);
        const double f1b = ppo_ref(std::exp(x + 1e-4), a, 0.8, 1.28, c, delta),
                     f0b = ppo_ref(std::exp(x - 1e-4), a, 0.8, 1.28, c, delta);
        const double fd = (f1 - f0) / (2 * h), fdb = (f1b - f0b) / 2e-4;
        if (std::fabs(fd - fdb) > 1e-5 * (1 + std::fabs(fd))) continue;  // next to a kink
        REQUIRE(o.dloss == Approx(fd).epsilon(1e-6).margin(1e-9));
      }
    }
}

TEST_CASE("clipped_surrogate without delta and dual clip (the plain form): torch's conventions at the kinks") {
  const auto p = ulorl::make_objective_params<double>({.eps_low = 0.25, .eps_high = 0.5});
  // At the upper bound with A > 0: L1 == L2, clamp passes (closed interval): full gradient -A r.
  auto o = ulorl::clipped_surrogate(1.5, 1.5, 2.0, p);
  REQUIRE(o.loss == -3.0);
  REQUIRE(o.dloss == -3.0);
  REQUIRE(o.flags == 0u);
  // At the lower bound with A < 0: the same.
  o = ulorl::clipped_surrogate(0.75, 0.75, -2.0, p);
  REQUIRE(o.loss == 1.5);
  REQUIRE(o.dloss == 1.5);
  REQUIRE(o.flags == 0u);
  // Beyond the bound on the clipped side: the bound's loss, zero gradient, flagged.
  o = ulorl::clipped_surrogate(1.75, 1.75, 2.0, p);
  REQUIRE(o.loss == -3.0);
  REQUIRE(o.dloss == 0.0);
  REQUIRE(o.flags == (ulorl::flag_clipped | ulorl::flag_clipped_high));
  o = ulorl::clipped_surrogate(0.5, 0.5, -2.0, p);
  REQUIRE(o.loss == 1.5);
  REQUIRE(o.dloss == 0.0);
  REQUIRE(o.flags == (ulorl::flag_clipped | ulorl::flag_clipped_low));
  // Beyond the bound on the other side: unclipped (L1 > L2), full gradient, not flagged.
  o = ulorl::clipped_surrogate(1.75, 1.75, -2.0, p);
  REQUIRE(o.loss == 3.5);
  REQUIRE(o.dloss == 3.5);
  REQUIRE(o.flags == 0u);
  // A = 0: zero loss and gradient anywhere, never flagged.
  for (double r : {0.1, 1.0, 7.0}) {
    o = ulorl::clipped_surrogate(r, r, 0.0, p);
    REQUIRE(o.loss == 0.0);
    REQUIRE(o.dloss == 0.0);
    REQUIRE(o.flags == 0u);
  }
  // The plain form gives the general form's values on a grid of kinks (the general form reached
  // with a delta and a dual clip too large to bind).
  const auto g =
      ulorl::make_objective_params<double>({.eps_low = 0.25, .eps_high = 0.5, .dual_clip = 1e300, .delta = 1e300});
  for (double r : {0.5, 0.75, 0.75000000001, 1.0, 1.4999999999, 1.5, 1.75})
    for (double a : {-2.0, -1e-300, 0.0, 1e-300, 3.0}) {
      const auto x = ulorl::clipped_surrogate(r, r, a, g), y = ulorl::clipped_surrogate(r, r, a, p);
      REQUIRE(x.loss == y.loss);
      REQUIRE(x.dloss == y.dloss);
      REQUIRE(x.flags == y.flags);
    }
}

TEST_CASE("clipped_surrogate: torch's conventions at exact kinks") {
  const auto p =
      ulorl::make_objective_params<double>({.eps_low = 0.25, .eps_high = 0.5, .dual_clip = 3.0, .delta = 2.0});
  // r at the upper clip bound, A > 0: clamp passes (closed interval), L1 == L2: full gradient.
  auto o = ulorl::clipped_surrogate(1.5, 1.5, 1.0, p);
  REQUIRE(o.dloss == -1.5);
  REQUIRE((o.flags & ulorl::flag_clipped) == 0);
  // Above the bound with A > 0: clipped, zero gradient, flagged high.
  o = ulorl::clipped_surrogate(1.75, 1.75, 1.0, p);
  REQUIRE(o.loss == -1.5);
  REQUIRE(o.dloss == 0.0);
  REQUIRE((o.flags & ulorl::flag_clipped_high) != 0);
  // delta tie: r == delta, A < 0: L1 = -A*min(r, delta) half gradient; L1 > L2 selects L1.
  o = ulorl::clipped_surrogate(2.0, 2.0, -1.0, p);
  REQUIRE(o.loss == 2.0);
  REQUIRE(o.dloss == 0.5 * 2.0);
  // Dual clip tie: C1 == -A c (r = 3 without delta): half of dC1.
  const auto q = ulorl::make_objective_params<double>({.eps_low = 0.25, .eps_high = 0.5, .dual_clip = 3.0});
  o = ulorl::clipped_surrogate(3.0, 3.0, -2.0, q);
  REQUIRE(o.loss == 6.0);
  REQUIRE(o.dloss == Approx(0.5 * 2.0 * 3.0));
  REQUIRE((o.flags & ulorl::flag_dual_clipped) == 0);
  o = ulorl::clipped_surrogate(4.0, 4.0, -2.0, q);
  REQUIRE(o.loss == 6.0);
  REQUIRE(o.dloss == 0.0);
  REQUIRE((o.flags & ulorl::flag_dual_clipped) != 0);
  // Ratio 1: never clipped, gradient -A.
  for (double a : {-3.0, -0.1, 0.0, 0.7}) {
    o = ulorl::clipped_surrogate(1.0, 1.0, a, q);
    REQUIRE(o.flags == 0u);
    REQUIRE(o.dloss == -a);
  }
}

TEST_CASE("cispo, sapo, policy_gradient, gmpo_log_ratio") {
  const auto p = ulorl::make_objective_params<double>(
      {.eps_low = 0.2, .eps_high = 0.28, .sapo = {.tau_pos = 1.0, .tau_neg = 1.05}});
  auto c = ulorl::cispo(-2.0, 1.5, 0.7, p);
  REQUIRE(c.loss == Approx(-1.28 * 0.7 * -2.0));
  REQUIRE(c.dloss == Approx(-1.28 * 0.7));
  REQUIRE((c.flags & ulorl::flag_clipped) != 0);
  c = ulorl::cispo(-2.0, 1.1, 0.7, p);
  REQUIRE(c.flags == 0u);
  for (double x : {-0.4, 0.0, 0.3})
    for (double a : {-1.2, 0.9}) {
      const double r = std::exp(x), tau = a > 0 ? 1.0 : 1.05;
      auto f = [&](double xx) { return -1.0 / (1.0 + std::exp(-tau * (std::exp(xx) - 1))) * (4 / tau) * a; };
      const auto s = ulorl::sapo(r, r, a, p);
      REQUIRE(s.loss == Approx(f(x)).epsilon(1e-13));
      REQUIRE(s.dloss == Approx((f(x + 1e-6) - f(x - 1e-6)) / 2e-6).epsilon(1e-6));
    }
  const auto g = ulorl::policy_gradient(-3.0, 0.5);
  REQUIRE(g.loss == 1.5);
  REQUIRE(g.dloss == -0.5);
  // gmpo: A > 0 clips above eps_high, A < 0 below -eps_low; in range derivative 1 (tie split).
  REQUIRE(ulorl::gmpo_log_ratio(0.1, 1.0, p).dy == 1.0);
  REQUIRE(ulorl::gmpo_log_ratio(0.1, -1.0, p).dy == 1.0);
  REQUIRE(ulorl::gmpo_log_ratio(0.5, 1.0, p).y == Approx(0.28));
  REQUIRE(ulorl::gmpo_log_ratio(0.5, 1.0, p).dy == 0.0);
  REQUIRE(ulorl::gmpo_log_ratio(0.5, -1.0, p).y == 0.5);
  REQUIRE(ulorl::gmpo_log_ratio(0.5, -1.0, p).dy == 1.0);
  REQUIRE(ulorl::gmpo_log_ratio(-0.5, -1.0, p).y == Approx(-0.2));
  REQUIRE(ulorl::gmpo_log_ratio(-0.5, -1.0, p).dy == 0.0);
  REQUIRE(ulorl::gmpo_log_ratio(-0.5, 1.0, p).dy == 1.0);
  REQUIRE(ulorl::gmpo_log_ratio(0.5, 0.0, p).y == 0.0);
}

TEST_CASE("validate_objective rejects bad parameters") {
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.eps_low = -0.01}), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.eps_low = 1.0}), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.eps_high = -1}), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.dual_clip = 1.0}), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.delta = 1.0}), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.log_ratio_clamp = 0}), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::validate_objective("f", {.kind = ulorl::objective_kind::sapo, .sapo = {.tau_pos = 0}}),
                    ulorl::error);
  REQUIRE_NOTHROW(ulorl::validate_objective("f", {.eps_low = 0.2, .eps_high = 0.28, .dual_clip = 3}));
}
