// Tests of ulorl/logits/online_softmax.hpp: push/merge in any order and grouping agree with the
// long-double oracle; rescaling of -inf/empty states; finalize edge cases; backward coefficients
// against the oracle gradient; label_gradient keeps digits at p -> 1.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/online_softmax.hpp>

#include "catch.hpp"
#include "support/logits_oracle.hpp"

using namespace ulorl;

TEST_CASE("online softmax: push and merge in any grouping match the oracle") {
  const std::uint64_t seed = 4242;
  std::printf("test_logits_online_softmax seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  for (std::size_t v : {1u, 2u, 3u, 47u, 1023u})
    for (double tau : {1.0, 0.7}) {
      std::vector<double> x(v);
      for (auto& e : x) e = 5 * nd(rng) + 40;
      if (v > 2) x[1] = -std::numeric_limits<double>::infinity();
      const std::size_t y = rng() % v == 1 && v > 2 ? 0 : rng() % v;
      const double it = 1.0 / tau;
      softmax_partial<double> seq;
      for (double e : x) seq = push(seq, e, it);
      // Random split into pieces merged in reverse order.
      std::vector<softmax_partial<double>> parts(1);
      for (double e : x) {
        if (rng() % 4 == 0) parts.emplace_back();
        parts.back() = push(parts.back(), e, it);
      }
      softmax_partial<double> merged;
      for (auto p = parts.rbegin(); p != parts.rend(); ++p) merged = merge(merged, *p, it);
      const auto o = oracle::logits_row(x, y, tau);
      for (const auto& st : {seq, merged}) {
        const auto r = finalize(st, x[y], it);
        if (std::isinf(x[y])) continue;
        CHECK(std::fabs(r.lse - static_cast<double>(o.lse)) <= 1e-13 * std::fabs(static_cast<double>(o.lse)));
        CHECK(std::fabs(r.log_prob - static_cast<double>(o.log_prob)) <= 1e-12 * std::max(1.0L, std::fabs(o.log_prob)));
        CHECK(std::fabs(r.entropy - static_cast<double>(o.entropy)) <= 1e-12 * std::max(1.0L, o.entropy));
      }
    }
}

TEST_CASE("online softmax edge states") {
  const double inf = std::numeric_limits<double>::infinity();
  softmax_partial<double> e;
  CHECK(merge(e, e, 1.0).sum == 0.0);
  auto a = push(e, -inf, 1.0);
  CHECK(a.max == -inf);
  CHECK(a.sum == 0.0);
  const auto r = finalize(a, -inf, 1.0);
  CHECK(r.lse == -inf);
  CHECK(std::isnan(r.log_prob));
  CHECK(std::isnan(r.entropy));
  a = push(a, 2.0, 1.0);
  CHECK(a.max == 2.0);
  CHECK(a.sum == 1.0);
  const auto one = finalize(a, 2.0, 1.0);
  CHECK(one.lse == 2.0);
  CHECK(one.log_prob == 0.0);
  CHECK(one.entropy == 0.0);
  CHECK(std::isnan(finalize(push(a, std::nan(""), 1.0), 2.0, 1.0).lse));
  CHECK(std::isnan(finalize(push(a, inf, 1.0), 2.0, 1.0).entropy));
  // float accumulation type (what the CUDA kernels use)
  softmax_partial<float> f;
  for (float x : {1.0f, 2.0f, 3.0f}) f = push(f, x, 1.0f);
  const auto fr = finalize(f, 3.0f, 1.0f);
  CHECK(std::fabs(fr.lse - 3.40760596f) < 1e-6f);
}

TEST_CASE("backward coefficients and label_gradient reproduce the oracle gradient") {
  std::mt19937_64 rng(99);
  std::normal_distribution<double> nd;
  for (double tau : {1.0, 0.6}) {
    std::vector<double> x(31);
    for (auto& v : x) v = 3 * nd(rng);
    const std::size_t y = 7;
    x[y] = 14.0;  // 1 - p_y ~ 1e-5 (tau 1) .. 1e-9 (tau 0.6): g (1 - p) must not cancel
    const double glp = 0.7, gent = -0.3, it = 1.0 / tau;
    const auto o = oracle::logits_row(x, y, tau);
    const auto g = oracle::logits_row_grad(x, y, tau, glp, gent);
    const double lse = static_cast<double>(o.lse), h = static_cast<double>(o.entropy);
    const auto k = backward_coeffs(glp, gent, h, it);
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double lp = x[j] * it - lse;
      const double got = j == y ? label_gradient(lp, glp, gent, h, it) : std::exp(lp) * (k.a + k.b * lp);
      INFO("j=" << j << " tau=" << tau);
      CHECK(std::fabs(got - static_cast<double>(g[j])) <= 1e-8 * std::fabs(static_cast<double>(g[j])) + 1e-300);
    }
    CHECK(k.label_term == glp * it);
  }
  CHECK(label_gradient(-std::numeric_limits<double>::infinity(), 2.0, 5.0, 1.0, 0.5) == 1.0);  // masked label: g_lp / tau
}
