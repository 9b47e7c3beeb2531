// Tests for ulorl/advantage/reinforce_plus_plus.hpp against the oracle: returns with reset after EOS,
// unbiased masked whitening, the baseline variant (verl's and NeMo-RL's), the variance floor and
// unmasked output, both layouts.
#include <ulorl/advantage/reinforce_plus_plus.hpp>
#include <ulorl/presets/nemo_rl.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

TEST_CASE("REINFORCE++ returns and advantages match the oracle", "[reinforce_plus_plus]") {
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
      oracle::reinforce_plus_plus(rew, m, gamma, ret_o, adv_o);
      std::vector<double> ret(B * T), adv(B * T);
      ulorl::reinforce_plus_plus_advantages(ulorl::padded(ulorl::matrix_view<const double>(flat_r.data(), B, T)),
                                            ulorl::padded(ulorl::matrix_view<const double>(flat_m.data(), B, T)),
                                            ulorl::padded(ulorl::matrix_view<double>(ret.data(), B, T)),
                                            ulorl::padded(ulorl::matrix_view<double>(adv.data(), B, T)), gamma);
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t) {
          REQUIRE(ret[b * T + t] == Approx(ret_o[b][t]).epsilon(1e-12).margin(1e-12));
          REQUIRE(adv[b * T + t] == Approx(adv_o[b][t]).epsilon(1e-10).margin(1e-10));
        }
    }
  }
}

TEST_CASE("packed REINFORCE++ equals padded on the same responses", "[reinforce_plus_plus]") {
  // padded [2, 4] with lengths 3 and 2 vs packed offsets {0, 3, 5}
  const std::vector<double> pr{0, 0, 1, 0, 0, 0.5, 0, 0}, pm{1, 1, 1, 0, 1, 1, 0, 0};
  const std::vector<double> kr{0, 0, 1, 0, 0.5}, km{1, 1, 1, 1, 1};
  const std::vector<std::int64_t> off{0, 3, 5};
  std::vector<double> pret(8), padv(8), kret(5), kadv(5);
  ulorl::reinforce_plus_plus_advantages(ulorl::padded(ulorl::matrix_view<const double>(pr.data(), 2, 4)),
                                        ulorl::padded(ulorl::matrix_view<const double>(pm.data(), 2, 4)),
                                        ulorl::padded(ulorl::matrix_view<double>(pret.data(), 2, 4)),
                                        ulorl::padded(ulorl::matrix_view<double>(padv.data(), 2, 4)), 0.9);
  ulorl::reinforce_plus_plus_advantages(ulorl::packed(std::span<const double>(kr), std::span<const std::int64_t>(off)),
                                        ulorl::packed(std::span<const double>(km), std::span<const std::int64_t>(off)),
                                        ulorl::packed(std::span<double>(kret), std::span<const std::int64_t>(off)),
                                        ulorl::packed(std::span<double>(kadv), std::span<const std::int64_t>(off)),
                                        0.9);
  const std::size_t map[5] = {0, 1, 2, 4, 5};
  for (std::size_t k = 0; k < 5; ++k) REQUIRE(kadv[k] == Approx(padv[map[k]]).epsilon(1e-14));
  // whitened valid tokens have mean 0
  double s = 0;
  for (double x : kadv) s += x;
  REQUIRE(std::fabs(s) < 1e-12);
}

TEST_CASE("REINFORCE++-baseline: group-centred scores, whitened", "[reinforce_plus_plus]") {
  const std::vector<double> scores{1, 0, 1, 1};
  const std::vector<std::int64_t> ids{0, 0, 1, 1};
  const std::vector<int> mask{1, 1, 0, 1, 1, 1, 1, 0};  // [4, 2]
  std::vector<double> adv(8);
  ulorl::reinforce_plus_plus_baseline_advantages(std::span<const double>(scores),
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

TEST_CASE("REINFORCE++ rejects a single valid token, bad gamma, bad eps", "[reinforce_plus_plus][errors]") {
  const std::vector<double> r{1, 0}, m{1, 0};
  std::vector<double> ret(2, 9), adv(2, 9);
  const auto call = [&](double gamma, ulorl::whiten_config cfg = {}) {
    ulorl::reinforce_plus_plus_advantages(ulorl::padded(ulorl::matrix_view<const double>(r.data(), 1, 2)),
                                          ulorl::padded(ulorl::matrix_view<const double>(m.data(), 1, 2)),
                                          ulorl::padded(ulorl::matrix_view<double>(ret.data(), 1, 2)),
                                          ulorl::padded(ulorl::matrix_view<double>(adv.data(), 1, 2)), gamma, cfg);
  };
  REQUIRE_THROWS_WITH(call(1.0), Catch::Contains("at least 2 valid tokens"));
  const std::vector<double> m2{1, 1};
  const auto call2 = [&](double gamma, ulorl::whiten_config cfg = {}) {
    ulorl::reinforce_plus_plus_advantages(ulorl::padded(ulorl::matrix_view<const double>(r.data(), 1, 2)),
                                          ulorl::padded(ulorl::matrix_view<const double>(m2.data(), 1, 2)),
                                          ulorl::padded(ulorl::matrix_view<double>(ret.data(), 1, 2)),
                                          ulorl::padded(ulorl::matrix_view<double>(adv.data(), 1, 2)), gamma, cfg);
  };
  REQUIRE_THROWS_WITH(call2(1.5), Catch::Contains("'gamma' = 1.5"));
  REQUIRE_THROWS_WITH(call2(1.0, {.eps = 0.0}), Catch::Contains("config.eps"));
  for (double x : adv) REQUIRE(x == 9);
  for (double x : ret) REQUIRE(x == 9);
}

TEST_CASE("REINFORCE++-baseline with a group-advantage config: NeMo-RL's estimator against the oracle",
          "[reinforce_plus_plus]") {
  // NeMo-RL: a_i = s_i - mu_g (0 for a singleton) or s_i, at every position; biased variance over
  // the valid tokens floored at 1e-8; every position written. Both layouts.
  testing_support::rng r(5301);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const auto B = static_cast<std::size_t>(r.integer(1, 19));
    const bool packed = trial % 2 == 1;
    shape sh{B, static_cast<std::size_t>(r.integer(1, 11)), {}};
    if (packed) {
      sh = {0, 0, {0}};
      for (std::size_t b = 0; b < B; ++b) sh.offsets.push_back(sh.offsets.back() + r.integer(0, 9));
    }
    std::vector<double> scores(B), mask(sh.size());
    std::vector<std::vector<int>> m(B);
    for (auto& s : scores) s = r.coin(0.3) ? 1.0 : r.normal();
    for (std::size_t b = 0; b < B; ++b) {
      const std::size_t valid = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(sh.row_size(b))));
      for (std::size_t t = 0; t < sh.row_size(b); ++t) {
        mask[sh.row_begin(b) + t] = t < valid;
        m[b].push_back(t < valid);
      }
    }
    if (std::count(mask.begin(), mask.end(), 1.0) == 0) continue;
    const auto ids = testing_support::random_group_ids(r, B);
    for (bool minus_baseline : {true, false}) {
      CAPTURE(trial, B, packed, minus_baseline);
      std::vector<double> a(B);
      for (std::size_t i = 0; i < B; ++i) {
        std::vector<long double> g;
        for (auto j : oracle::group_members(ids, i)) g.push_back(scores[j]);
        a[i] = minus_baseline ? static_cast<double>(scores[i] - oracle::mean_of(g)) : scores[i];
      }
      oracle::rows x(B);
      for (std::size_t b = 0; b < B; ++b) x[b].assign(sh.row_size(b), a[b]);
      const auto want = oracle::whiten(x, m, false, true, false);
      std::vector<double> out(sh.size(), 7.0);
      ulorl::reinforce_plus_plus_baseline_advantages(
          std::span<const double>(scores), ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)),
          view_of<const double>(mask.data(), sh), view_of(out.data(), sh),
          ulorl::presets::nemo_rl::reinforce_plus_plus_advantage({.minus_baseline = minus_baseline}));
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < sh.row_size(b); ++t)
          REQUIRE(out[sh.row_begin(b) + t] == Approx(want[b][t]).epsilon(1e-9).margin(1e-9));
      ++checked;
    }
  }
  REQUIRE(checked > 80);
}

TEST_CASE("masked_whiten: the variance floor and unmasked output", "[reinforce_plus_plus]") {
  const std::vector<double> x{1, 2, 3, 40}, m{1, 1, 1, 0};
  std::vector<double> out(4);
  const auto run = [&](const ulorl::whiten_config& cfg) {
    ulorl::masked_whiten(ulorl::padded(ulorl::matrix_view<const double>(x.data(), 1, 4)),
                         ulorl::padded(ulorl::matrix_view<const double>(m.data(), 1, 4)),
                         ulorl::padded(ulorl::matrix_view<double>(out.data(), 1, 4)), cfg);
  };
  // biased variance 2/3: floored at eps it stays 2/3; with eps added it is 2/3 + eps
  run({.eps = 1e-3, .unbiased = false, .eps_at = ulorl::whiten_eps::floor_variance, .mask_output = false});
  REQUIRE(out[0] == Approx(-1.0 / std::sqrt(2.0 / 3.0)).epsilon(1e-15));
  REQUIRE(out[3] == Approx(38.0 / std::sqrt(2.0 / 3.0)).epsilon(1e-15));  // masked position written
  run({.eps = 1e-3, .unbiased = false});
  REQUIRE(out[0] == Approx(-1.0 / std::sqrt(2.0 / 3.0 + 1e-3)).epsilon(1e-15));
  REQUIRE(out[3] == 0.0);
  // the floor takes over for a constant batch
  const std::vector<double> c{5, 5, 5, 5};
  ulorl::masked_whiten(
      ulorl::padded(ulorl::matrix_view<const double>(c.data(), 1, 4)),
      ulorl::padded(ulorl::matrix_view<const double>(m.data(), 1, 4)),
      ulorl::padded(ulorl::matrix_view<double>(out.data(), 1, 4)),
      {.eps = 1e-8, .unbiased = false, .eps_at = ulorl::whiten_eps::floor_variance, .mask_output = false});
  for (double v : out) REQUIRE(v == 0.0);
}

TEST_CASE("REINFORCE++: unknown whitening rules and an empty batch are rejected, outputs untouched",
          "[reinforce_plus_plus][errors][enum]") {
  const std::vector<double> r{1, 0, 0, 1}, m{1, 1, 1, 1}, zeros(4, 0.0);
  std::vector<double> ret(4, 9), adv(4, 9);
  const auto tv = [](const std::vector<double>& v) {
    return ulorl::padded(ulorl::matrix_view<const double>(v.data(), 2, 2));
  };
  const auto ov = [](std::vector<double>& v) { return ulorl::padded(ulorl::matrix_view<double>(v.data(), 2, 2)); };
  const auto bad = static_cast<ulorl::whiten_eps>(3);
  require_unknown_enum([&] { ulorl::masked_whiten(tv(r), tv(m), ov(adv), {.eps_at = bad}); }, "masked_whiten",
                       "config.eps_at", 3);
  require_unknown_enum(
      [&] { ulorl::reinforce_plus_plus_advantages(tv(r), tv(m), ov(ret), ov(adv), 1.0, {.eps_at = bad}); },
      "reinforce_plus_plus_advantages", "config.eps_at", 3);
  const std::vector<double> s{1, 0};
  const std::vector<std::int64_t> ids{0, 0};
  const auto groups = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
  require_unknown_enum(
      [&] {
        ulorl::reinforce_plus_plus_baseline_advantages(
            std::span<const double>(s), groups, tv(m), ov(adv),
            ulorl::reinforce_plus_plus_baseline_config{.whiten = {.eps_at = bad}});
      },
      "reinforce_plus_plus_baseline_advantages", "config.whiten.eps_at", 3);
  require_unknown_enum(
      [&] {
        ulorl::reinforce_plus_plus_baseline_advantages(
            std::span<const double>(s), groups, tv(m), ov(adv),
            ulorl::reinforce_plus_plus_baseline_config{.group = {.baseline = static_cast<ulorl::baseline_kind>(7)}});
      },
      "group_advantages", "config.baseline", 7);
  // NeMo-RL's biased whitening needs one valid token
  require_rejected(outcome_of([&] {
                     ulorl::reinforce_plus_plus_baseline_advantages(
                         std::span<const double>(s), groups, tv(zeros), ov(adv),
                         ulorl::presets::nemo_rl::reinforce_plus_plus_advantage());
                   }),
                   "reinforce_plus_plus_baseline_advantages", "mask", -1);
  require_rejected(outcome_of([&] {
                     ulorl::reinforce_plus_plus_baseline_advantages(
                         std::span<const double>(s), groups, tv(m), ov(adv),
                         ulorl::reinforce_plus_plus_baseline_config{.whiten = {.eps = -1.0}});
                   }),
                   "reinforce_plus_plus_baseline_advantages", "config.whiten.eps", -1);
  for (double x : adv) REQUIRE(x == 9);
  for (double x : ret) REQUIRE(x == 9);
}

TEST_CASE("REINFORCE++: an absent mask is an all-ones mask, bit for bit, in both layouts", "[mask]") {
  std::mt19937_64 rng(17);
  for (const auto& lay : absent_mask::layouts(rng, 4, 7)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto r = absent_mask::uniform(rng, lay.size(), -1, 1);
    const std::vector<double> ones(lay.size(), 1.0);
    const ulorl::token_view<const double> absent{};
    std::vector<double> w(lay.size()), wa(lay.size());
    ulorl::masked_whiten(lay.cview(r), lay.cview(ones), lay.mview(w));
    ulorl::masked_whiten(lay.cview(r), absent, lay.mview(wa));
    REQUIRE(absent_mask::same_bits(wa, w));
    std::vector<double> ret(lay.size()), reta(lay.size()), adv(lay.size()), adva(lay.size());
    ulorl::discounted_returns(lay.cview(r), lay.cview(ones), lay.mview(ret), 0.9);
    ulorl::discounted_returns(lay.cview(r), absent, lay.mview(reta), 0.9);
    REQUIRE(absent_mask::same_bits(reta, ret));
    ulorl::reinforce_plus_plus_advantages(lay.cview(r), lay.cview(ones), lay.mview(ret), lay.mview(adv), 0.95);
    ulorl::reinforce_plus_plus_advantages(lay.cview(r), absent, lay.mview(reta), lay.mview(adva), 0.95);
    REQUIRE(absent_mask::same_bits(reta, ret));
    REQUIRE(absent_mask::same_bits(adva, adv));
    const auto scores = absent_mask::uniform(rng, lay.B, 0, 1);
    const ulorl::group_layout groups = ulorl::group_layout::fixed(lay.B, 2);
    ulorl::reinforce_plus_plus_baseline_advantages(std::span<const double>(scores), groups, lay.cview(ones),
                                                   lay.mview(adv));
    ulorl::reinforce_plus_plus_baseline_advantages(std::span<const double>(scores), groups, absent, lay.mview(adva));
    REQUIRE(absent_mask::same_bits(adva, adv));
  }
}

TEST_CASE("masked_whiten and discounted_returns: values near the double maximum neither overflow nor vanish",
          "[reinforce_plus_plus][overflow]") {
  const auto cv = [](const std::vector<double>& v) {
    return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), 1, v.size()));
  };
  const auto mv = [](std::vector<double>& v) {
    return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), 1, v.size()));
  };
  // {max, -max, max, -max}: the squares overflow a plain variance (which gave 0 / NaN); unbiased
  // std = max sqrt(4/3), so the whitened values are +-sqrt(3)/2.
  const std::vector<double> x{1.7e308, -1.7e308, 1.7e308, -1.7e308};
  std::vector<double> out(4);
  ulorl::masked_whiten(cv(x), ulorl::token_view<const double>{}, mv(out));
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(out[i] == Approx((i % 2 == 0 ? 1 : -1) * std::sqrt(3.0) / 2).epsilon(1e-12));
  // {1.7e308, 1.7e308, 1e308}: the sum overflows a plain mean.
  const std::vector<double> y{1.7e308, 1.7e308, 1e308};
  ulorl::masked_whiten(cv(y), ulorl::token_view<const double>{}, mv(out = std::vector<double>(3)));
  CHECK(out[0] == Approx(1 / std::sqrt(3.0)).epsilon(1e-12));
  CHECK(out[2] == Approx(-2 / std::sqrt(3.0)).epsilon(1e-12));
  // Returns 1e308 + 1e308 are beyond the double range: an error naming the return, nothing written.
  const std::vector<double> r{1e308, 1e308};
  std::vector<double> ret(2, 5.0);
  CHECK_THROWS_WITH(ulorl::discounted_returns(cv(r), ulorl::token_view<const double>{}, mv(ret), 1.0),
                    Catch::Contains("'returns'[0]") && Catch::Contains("overflows float64"));
  CHECK(ret == std::vector<double>{5.0, 5.0});
}

TEST_CASE("REINFORCE++: a whitened value beyond float leaves returns and advantages as they were",
          "[reinforce_plus_plus][errors][range]") {
  // Equal returns of 3e38 without the mean's shift: x / sqrt(0 + 1e-8) = 3e42 overflows float. The
  // returns are written before that check can run; on the error they get their old values back.
  const std::vector<double> r{3e38, 3e38, 3e38, 3e38}, m{1, 1, 1, 1};
  std::vector<float> ret(4, 7.0f), adv(4, 9.0f);
  const auto tv = [](const std::vector<double>& v) {
    return ulorl::padded(ulorl::matrix_view<const double>(v.data(), 2, 2));
  };
  const auto ov = [](std::vector<float>& v) { return ulorl::padded(ulorl::matrix_view<float>(v.data(), 2, 2)); };
  const ulorl::whiten_config no_shift{.shift_mean = false};
  require_rejected(
      outcome_of([&] { ulorl::reinforce_plus_plus_advantages(tv(r), tv(m), ov(ret), ov(adv), 0.0, no_shift); }),
      "masked_whiten", "out", 0);
  for (float x : ret) CHECK(x == 7.0f);
  for (float x : adv) CHECK(x == 9.0f);
  // advantages aliasing returns' storage: also untouched.
  require_rejected(
      outcome_of([&] { ulorl::reinforce_plus_plus_advantages(tv(r), tv(m), ov(ret), ov(ret), 0.0, no_shift); }),
      "masked_whiten", "out", 0);
  for (float x : ret) CHECK(x == 7.0f);
  // The baseline form whitens in place: two singleton groups of 3e38 (a_i = s_i), no shift.
  const std::vector<double> s{3e38, 3e38};
  const std::vector<std::int64_t> ids{0, 1};
  const auto groups = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
  require_rejected(outcome_of([&] {
                     ulorl::reinforce_plus_plus_baseline_advantages(
                         std::span<const double>(s), groups, tv(m), ov(adv),
                         ulorl::reinforce_plus_plus_baseline_config{.whiten = no_shift});
                   }),
                   "masked_whiten", "out", 0);
  for (float x : adv) CHECK(x == 9.0f);
}

TEST_CASE("discounted_returns skip_masked: masked spans carry the return through and get 0", "[reinforce_plus_plus]") {
  const auto cv = [](const std::vector<double>& v, std::size_t B, std::size_t T) {
    return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T));
  };
  const auto mv = [](std::vector<double>& v, std::size_t B, std::size_t T) {
    return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), B, T));
  };
  // An observation span (mask 0) between two assistant turns, reward at the end; a masked reward
  // (row 1, t = 1) is dropped; gamma 0.5 discounts valid steps only.
  const std::vector<double> r{0, 0, 7, 0, 0, 2, /**/ 0, 5, 0, 3, 0, 0};
  const std::vector<double> m{1, 1, 0, 0, 1, 1, /**/ 1, 0, 1, 1, 0, 0};
  std::vector<double> ret(12, -9.0);
  ulorl::discounted_returns(cv(r, 2, 6), cv(m, 2, 6), mv(ret, 2, 6), 0.5, ulorl::return_scan::skip_masked);
  const std::vector<double> want{0.25, 0.5, 0, 0, 1, 2, /**/ 0.75, 0, 1.5, 3, 0, 0};
  for (std::size_t i = 0; i < 12; ++i) REQUIRE(ret[i] == want[i]);
  // reset_after_eos on the same input: the span's reward enters and the return restarts after it.
  ulorl::discounted_returns(cv(r, 2, 6), cv(m, 2, 6), mv(ret, 2, 6), 1.0, ulorl::return_scan::reset_after_eos);
  const std::vector<double> reset{0, 0, 7, 2, 2, 2, /**/ 0, 8, 3, 3, 0, 0};
  for (std::size_t i = 0; i < 12; ++i) REQUIRE(ret[i] == reset[i]);
  std::vector<double> adv(12);
  REQUIRE_THROWS_AS(ulorl::reinforce_plus_plus_advantages(cv(r, 2, 6), cv(m, 2, 6), mv(ret, 2, 6), mv(adv, 2, 6), 1.0,
                                                          {}, static_cast<ulorl::return_scan>(5)),
                    ulorl::error);
}
