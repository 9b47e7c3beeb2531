// Tests of ulorl/loss/entropy.hpp: the entropy bonus value, its gradient and aggregation weights.
#include <ulorl/loss/entropy.hpp>

#include <cmath>
#include <vector>

#include "catch.hpp"

TEST_CASE("entropy_term and entropy_loss") {
  const auto e = ulorl::entropy_term(2.5, 0.01);
  REQUIRE(e.value == Approx(-0.025));
  REQUIRE(e.grad == -0.01);
  const std::size_t B = 2, T = 3;
  std::vector<double> h{1, 2, 3, 4, 5, 6}, mask{1, 1, 0, 1, 0, 0}, g(B * T, 9.0);
  auto cv = [&](const std::vector<double>& v) { return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T)); };
  auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), B, T));
  // seq-mean-token-mean over S = 2 sequences: ((1 + 2) / 2 + 4 / 1) / 2 times -coef.
  const double l = ulorl::entropy_loss<double, double>(cv(h), cv(mask), 0.1, {ulorl::agg_mode::seq_mean_token_mean, 2.0, 1.0}, gv);
  REQUIRE(l == Approx(-0.1 * (1.5 + 4.0) / 2));
  const std::vector<double> expect{-0.1 / 4, -0.1 / 4, 0, -0.1 / 2, 0, 0};
  for (std::size_t i = 0; i < B * T; ++i) REQUIRE(g[i] == Approx(expect[i]).margin(1e-17));
  // Finite-difference check of d loss / d H.
  for (std::size_t i = 0; i < B * T; ++i) {
    std::vector<double> hp = h, hm = h, tmp(B * T);
    hp[i] += 1e-6, hm[i] -= 1e-6;
    auto tv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(tmp.data(), B, T));
    const double fd = (ulorl::entropy_loss<double, double>(cv(hp), cv(mask), 0.1, {ulorl::agg_mode::seq_mean_token_mean, 2.0, 1.0}, tv) -
                       ulorl::entropy_loss<double, double>(cv(hm), cv(mask), 0.1, {ulorl::agg_mode::seq_mean_token_mean, 2.0, 1.0}, tv)) /
                      2e-6;
    REQUIRE(g[i] == Approx(fd).margin(1e-9));
  }
  std::vector<double> sentinel(B * T, 9.0);
  h[1] = INFINITY;
  REQUIRE_THROWS_AS((ulorl::entropy_loss<double, double>(cv(h), cv(mask), 0.1, {ulorl::agg_mode::token_mean, 3.0, 1.0},
                                                        ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sentinel.data(), B, T)))),
                    ulorl::error);
  h[1] = 2;
  REQUIRE_THROWS_AS((ulorl::entropy_loss<double, double>(cv(h), cv(mask), 0.1, {ulorl::agg_mode::token_mean, 0.0, 1.0},
                                                        ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sentinel.data(), B, T)))),
                    ulorl::error);
  for (double v : sentinel) REQUIRE(v == 9.0);
}
