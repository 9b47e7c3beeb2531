// Tests of ulorl/loss/kl.hpp: each estimator against its textbook formula, gradients against finite
// differences, clamps and straight-through, k3 >= 0, the batch function and the reward penalty.
#include <ulorl/loss/kl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "catch.hpp"

namespace {
constexpr std::uint64_t seed = 313;
constexpr double inf = std::numeric_limits<double>::infinity();
double ref_value(ulorl::kl_estimator e, double lp, double ref, double in, double out) {
  const double u = std::clamp(ref - lp, -in, in);
  double v = 0;
  switch (e) {
    case ulorl::kl_estimator::k1: v = -u; break;
    case ulorl::kl_estimator::abs: v = std::fabs(u); break;
    case ulorl::kl_estimator::k2: v = u * u / 2; break;
    case ulorl::kl_estimator::k3: v = std::exp(u) - u - 1; break;
  }
  return std::clamp(v, -out, out);
}
}  // namespace

TEST_CASE("kl_term: values and finite-difference gradients for every estimator and clamp setting") {
  std::printf("test_loss_kl seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-4, 4);
  for (auto e : {ulorl::kl_estimator::k1, ulorl::kl_estimator::abs, ulorl::kl_estimator::k2, ulorl::kl_estimator::k3})
    for (double in : {inf, 2.0})
      for (double out : {inf, 1.5}) {
        const auto p = ulorl::make_kl_params<double>({.estimator = e, .input_clamp = in, .output_clamp = out});
        for (int i = 0; i < 3000; ++i) {
          const double lp = -2 + u(rng), ref = lp + u(rng);
          const auto k = ulorl::kl_term(lp, ref, p);
          REQUIRE(k.value == Approx(ref_value(e, lp, ref, in, out)).epsilon(1e-13).margin(1e-15));
          auto f = [&](double h) { return ref_value(e, lp + h, ref, in, out); };
          const double fd = (f(1e-6) - f(-1e-6)) / 2e-6, fdb = (f(1e-4) - f(-1e-4)) / 2e-4;
          if (std::fabs(fd - fdb) > 1e-5 * (1 + std::fabs(fd))) continue;  // next to a clamp bound
          REQUIRE(k.grad == Approx(fd).epsilon(1e-6).margin(1e-8));
          if (e == ulorl::kl_estimator::k3) REQUIRE(k.value >= 0);
        }
      }
}

TEST_CASE("kl_term: k3 >= 0 everywhere, straight-through gradient, extreme inputs finite") {
  const auto k3 = ulorl::make_kl_params<double>({.estimator = ulorl::kl_estimator::k3});
  for (double d : {-1e4, -50.0, -1e-9, 0.0, 1e-12, 3.0, 50.0, 700.0, 1e4}) {
    const auto k = ulorl::kl_term(-1e4 + d, -1e4, k3);
    REQUIRE(k.value >= 0);
    REQUIRE(std::isfinite(k.value));
    REQUIRE(std::isfinite(k.grad));
  }
  const auto st = ulorl::make_kl_params<double>({.estimator = ulorl::kl_estimator::k3, .straight_through = true,
                                                 .input_clamp = 20, .output_clamp = 10});
  const auto k = ulorl::kl_term(-1.0, -30.0, st);  // both clamps active
  REQUIRE(k.value == 10.0);
  REQUIRE(k.grad == 29.0);  // d = logp - ref, never clamped
  const auto plain = ulorl::make_kl_params<double>({.estimator = ulorl::kl_estimator::k3, .input_clamp = 20, .output_clamp = 10});
  REQUIRE(ulorl::kl_term(-1.0, -30.0, plain).grad == 0.0);
  REQUIRE(ulorl::make_kl_params<float>({}).estimator == ulorl::kl_estimator::k3);
  const auto kf = ulorl::kl_term(-1e4f, -1e4f + 50.0f, ulorl::make_kl_params<float>({}));
  REQUIRE(std::isfinite(kf.value));
  REQUIRE(std::isfinite(kf.grad));
}

TEST_CASE("kl_penalty (batch) and kl_penalized_rewards; bad input leaves outputs untouched") {
  const std::size_t B = 2, T = 3;
  std::vector<double> lp{-1, -2, -3, -0.5, -0.1, -4}, ref{-1.5, -2, -2, -0.4, -3, -4.2}, kl(B * T, 7.0), g(B * T, 7.0);
  auto cv = [&](const std::vector<double>& v) { return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T)); };
  auto mv = [&](std::vector<double>& v) { return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), B, T)); };
  ulorl::kl_penalty(cv(lp), cv(ref), {.estimator = ulorl::kl_estimator::k2}, mv(kl), mv(g));
  for (std::size_t i = 0; i < B * T; ++i) {
    REQUIRE(kl[i] == Approx(0.5 * (lp[i] - ref[i]) * (lp[i] - ref[i])));
    REQUIRE(g[i] == Approx(lp[i] - ref[i]));
  }
  std::vector<double> rewards{0, 0, 1, 0, 0, 2}, mask{1, 1, 1, 1, 1, 0}, out(B * T, 7.0);
  const double mean = ulorl::kl_penalized_rewards<double, double>(cv(rewards), cv(lp), cv(ref), cv(mask), 0.1,
                                                                  {.estimator = ulorl::kl_estimator::k1}, mv(out));
  double s = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    REQUIRE(out[i] == Approx(rewards[i] - 0.1 * (lp[i] - ref[i])));
    s += lp[i] - ref[i];
  }
  REQUIRE(out[5] == 0.0);
  REQUIRE(mean == Approx(s / 5));
  // Bad input.
  std::vector<double> sentinel(B * T, 3.0), sentinel2(B * T, 3.0);
  lp[4] = std::nan("");
  try {
    ulorl::kl_penalty(cv(lp), cv(ref), {}, mv(sentinel), mv(sentinel2));
    FAIL("no error");
  } catch (const ulorl::error& e) {
    REQUIRE(e.argument() == "log_prob");
    REQUIRE(e.index() == 4);
  }
  lp[4] = -0.1;
  std::vector<double> short_ref(B * 2, 0.0);
  REQUIRE_THROWS_AS((ulorl::kl_penalty(cv(lp), ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(short_ref.data(), B, 2)),
                                      {}, mv(sentinel), mv(sentinel2))),
                    ulorl::error);
  REQUIRE_THROWS_AS(ulorl::kl_penalty(cv(lp), cv(ref), {.output_clamp = 0.0}, mv(sentinel), mv(sentinel2)), ulorl::error);
  for (double v : sentinel) REQUIRE(v == 3.0);
  for (double v : sentinel2) REQUIRE(v == 3.0);
}
