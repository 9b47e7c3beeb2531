// Tests for ulorl/advantage/reinforce_pp.hpp against the oracle: returns with reset after EOS,
// unbiased masked whitening, the baseline variant, both layouts.
#include <ulorl/advantage/reinforce_pp.hpp>

#include <cmath>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"

TEST_CASE("REINFORCE++ returns and advantages match the oracle", "[reinforce_pp]") {
  testing_support::rng r(5);
  for (auto [B, T] : {std::pair<std::size_t, std::size_t>{1, 3}, {3, 7}, {8, 47}}) {
    for (double gamma : {1.0, 0.99, 0.5}) {
      std::vector<std::vector<double>> rew(B, std::vector<double>(T));
      std::vector<std::vector<int>> m(B, std::vector<int>(T));
      std::vector<double> flat_r, flat_m;
      for (std::size_t b = 0; b < B; ++b) {
        const std::size_t len = static_cast<std::size_t>(r.integer(1, static_cast<std::int64_t>(T)));
        for (std::size_t t = 0; t < T; ++t) {
          m[b][t] = t < len ? 1 : 0;
          rew[b][t] = r.coin(0.3) ? r.normal() : 0.0;  // dense rewards, also at masked positions
          flat_r.push_back(rew[b][t]);
          flat_m.push_back(m[b][t]);
        }
      }
      std::size_t valid = 0;
      for (double x : flat_m) valid += x != 0;
      if (valid < 2) continue;
      std::vector<std::vector<double>> ret_o, adv_o;
      oracle::reinforce_pp(rew, m, gamma, ret_o, adv_o);
      std::vector<double> ret(B * T), adv(B * T);
      ulorl::reinforce_pp_advantages(ulorl::padded(ulorl::matrix_view<const double>(flat_r.data(), B, T)),
                                     ulorl::padded(ulorl::matrix_view<const double>(flat_m.data(), B, T)), gamma,
                                     ulorl::padded(ulorl::matrix_view<double>(ret.data(), B, T)),
                                     ulorl::padded(ulorl::matrix_view<double>(adv.data(), B, T)));
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t) {
          REQUIRE(ret[b * T + t] == Approx(ret_o[b][t]).epsilon(1e-12).margin(1e-12));
          REQUIRE(adv[b * T + t] == Approx(adv_o[b][t]).epsilon(1e-10).margin(1e-10));
        }
    }
  }
}

TEST_CASE("packed REINFORCE++ equals padded on the same responses", "[reinforce_pp]") {
  // padded [2, 4] with lengths 3 and 2 vs packed offsets {0, 3, 5}
  const std::vector<double> pr{0, 0, 1, 0, 0, 0.5, 0, 0}, pm{1, 1, 1, 0, 1, 1, 0, 0};
  const std::vector<double> kr{0, 0, 1, 0, 0.5}, km{1, 1, 1, 1, 1};
  const std::vector<std::int64_t> off{0, 3, 5};
  std::vector<double> pret(8), padv(8), kret(5), kadv(5);
  ulorl::reinforce_pp_advantages(ulorl::padded(ulorl::matrix_view<const double>(pr.data(), 2, 4)),
                                 ulorl::padded(ulorl::matrix_view<const double>(pm.data(), 2, 4)), 0.9,
                                 ulorl::padded(ulorl::matrix_view<double>(pret.data(), 2, 4)),
                                 ulorl::padded(ulorl::matrix_view<double>(padv.data(), 2, 4)));
  ulorl::reinforce_pp_advantages(ulorl::packed(std::span<const double>(kr), std::span<const std::int64_t>(off)),
                                 ulorl::packed(std::span<const double>(km), std::span<const std::int64_t>(off)), 0.9,
                                 ulorl::packed(std::span<double>(kret), std::span<const std::int64_t>(off)),
                                 ulorl::packed(std::span<double>(kadv), std::span<const std::int64_t>(off)));
  const std::size_t map[5] = {0, 1, 2, 4, 5};
  for (std::size_t k = 0; k < 5; ++k) REQUIRE(kadv[k] == Approx(padv[map[k]]).epsilon(1e-14));
  // whitened valid tokens have mean 0
  double s = 0;
  for (double x : kadv) s += x;
  REQUIRE(std::fabs(s) < 1e-12);
}

TEST_CASE("REINFORCE++-baseline: group-centred scores, whitened", "[reinforce_pp]") {
  const std::vector<double> scores{1, 0, 1, 1};
  const std::vector<std::int64_t> ids{0, 0, 1, 1};
  const std::vector<int> mask{1, 1, 0, 1, 1, 1, 1, 0};  // [4, 2]
  std::vector<double> adv(8);
  ulorl::reinforce_pp_baseline_advantages(std::span<const double>(scores),
                                          ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)),
                                          ulorl::padded(ulorl::matrix_view<const int>(mask.data(), 4, 2)),
                                          ulorl::padded(ulorl::matrix_view<double>(adv.data(), 4, 2)));
  // X over valid tokens: 0.5, 0.5, -0.5, 0, 0, 0  -> mean 1/12
  std::vector<long double> x{0.5L, 0.5L, -0.5L, 0, 0, 0};
  const long double mu = oracle::mean_of(x), sd = oracle::std_of(x, true);
  REQUIRE(adv[0] == Approx(static_cast<double>((0.5L - mu) / std::sqrt(sd * sd + 1e-8L))).epsilon(1e-12));
  REQUIRE(adv[3] == Approx(static_cast<double>((-0.5L - mu) / std::sqrt(sd * sd + 1e-8L))).epsilon(1e-12));
  REQUIRE(adv[2] == 0.0);
  REQUIRE(adv[7] == 0.0);
}

TEST_CASE("REINFORCE++ rejects a single valid token, bad gamma, bad eps", "[reinforce_pp][errors]") {
  const std::vector<double> r{1, 0}, m{1, 0};
  std::vector<double> ret(2, 9), adv(2, 9);
  const auto call = [&](double gamma, ulorl::whiten_config cfg = {}) {
    ulorl::reinforce_pp_advantages(ulorl::padded(ulorl::matrix_view<const double>(r.data(), 1, 2)),
                                   ulorl::padded(ulorl::matrix_view<const double>(m.data(), 1, 2)), gamma,
                                   ulorl::padded(ulorl::matrix_view<double>(ret.data(), 1, 2)),
                                   ulorl::padded(ulorl::matrix_view<double>(adv.data(), 1, 2)), cfg);
  };
  REQUIRE_THROWS_WITH(call(1.0), Catch::Contains("at least 2 valid tokens"));
  const std::vector<double> m2{1, 1};
  const auto call2 = [&](double gamma, ulorl::whiten_config cfg = {}) {
    ulorl::reinforce_pp_advantages(ulorl::padded(ulorl::matrix_view<const double>(r.data(), 1, 2)),
                                   ulorl::padded(ulorl::matrix_view<const double>(m2.data(), 1, 2)), gamma,
                                   ulorl::padded(ulorl::matrix_view<double>(ret.data(), 1, 2)),
                                   ulorl::padded(ulorl::matrix_view<double>(adv.data(), 1, 2)), cfg);
  };
  REQUIRE_THROWS_WITH(call2(1.5), Catch::Contains("'gamma' = 1.5"));
  REQUIRE_THROWS_WITH(call2(1.0, {.eps = 0.0}), Catch::Contains("config.eps"));
  for (double x : adv) REQUIRE(x == 9);
  for (double x : ret) REQUIRE(x == 9);
}
