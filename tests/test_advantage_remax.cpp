// Tests for ulorl/advantage/remax.hpp against the oracle: returns of the masked rewards at every
// position, the baseline on the valid tokens only, both layouts, an absent mask, float32 outputs and
// the rejections (nothing written).
#include <ulorl/advantage/remax.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

TEST_CASE("ReMax returns and advantages match the oracle", "[remax]") {
  testing_support::rng r(13);
  INFO("seed 13");
  for (auto [B, T] : {std::pair<std::size_t, std::size_t>{1, 1}, {3, 7}, {8, 47}}) {
    oracle::rows R(B, std::vector<double>(T));
    std::vector<std::vector<int>> m(B, std::vector<int>(T));
    std::vector<double> base(B), fr, fm;
    for (std::size_t b = 0; b < B; ++b) {
      base[b] = r.normal();
      const auto len = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(T)));
      for (std::size_t t = 0; t < T; ++t) {
        m[b][t] = t < len && !(t > 0 && r.coin(0.15)) ? 1 : 0;  // holes inside, padding after
        R[b][t] = r.coin(0.4) ? r.normal() : 0.0;
        fr.push_back(R[b][t]);
        fm.push_back(m[b][t]);
      }
    }
    oracle::rows ret_o, adv_o;
    oracle::remax(R, base, m, ret_o, adv_o);
    std::vector<double> ret(B * T), adv(B * T);
    ulorl::remax_advantages(padded_of<const double>(fr.data(), B, T), std::span<const double>(base),
                            padded_of<const double>(fm.data(), B, T), padded_of(ret.data(), B, T),
                            padded_of(adv.data(), B, T));
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) {
        REQUIRE(ret[b * T + t] == Approx(ret_o[b][t]).epsilon(1e-13).margin(1e-13));
        REQUIRE(adv[b * T + t] == Approx(adv_o[b][t]).epsilon(1e-13).margin(1e-13));
      }
    std::vector<float> fr32(fr.begin(), fr.end()), fm32(fm.begin(), fm.end()), base32(base.begin(), base.end());
    std::vector<float> ret32(B * T), adv32(B * T);
    ulorl::remax_advantages(ulorl::padded(ulorl::matrix_view<const float>(fr32.data(), B, T)),
                            std::span<const float>(base32),
                            ulorl::padded(ulorl::matrix_view<const float>(fm32.data(), B, T)),
                            padded_of(ret32.data(), B, T), padded_of(adv32.data(), B, T));
    for (std::size_t i = 0; i < B * T; ++i) {
      REQUIRE(ret32[i] == Approx(ret[i]).epsilon(1e-5).margin(1e-5));
      REQUIRE(adv32[i] == Approx(adv[i]).epsilon(1e-5).margin(1e-5));
    }
  }
}

TEST_CASE("ReMax: packed equals padded, an absent mask is an all-ones mask", "[remax][mask]") {
  std::mt19937_64 rng(29);
  for (const auto& lay : absent_mask::layouts(rng, 4, 6)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto r = absent_mask::uniform(rng, lay.size(), -1, 1);
    const auto base = absent_mask::uniform(rng, lay.B, -1, 1);
    const std::vector<double> ones(lay.size(), 1.0);
    std::vector<double> ret(lay.size()), adv(lay.size()), reta(lay.size()), adva(lay.size());
    ulorl::remax_advantages(lay.cview(r), std::span<const double>(base), lay.cview(ones), lay.mview(ret),
                            lay.mview(adv));
    ulorl::remax_advantages(lay.cview(r), std::span<const double>(base), ulorl::token_view<const double>{},
                            lay.mview(reta), lay.mview(adva));
    REQUIRE(absent_mask::same_bits(reta, ret));
    REQUIRE(absent_mask::same_bits(adva, adv));
    for (std::size_t b = 0; b < lay.B; ++b)
      for (std::size_t t = 0; t < lay.mview(adv).row_size(b); ++t)
        REQUIRE(lay.cview(adv)(b, t) == lay.cview(ret)(b, t) - base[b]);
  }
}

TEST_CASE("ReMax rejects bad inputs before writing", "[remax][errors]") {
  const std::vector<double> r{1, 0, 0, 1}, m{1, 1, 1, 0}, base{0.5, 0.25};
  std::vector<double> ret(4, 9), adv(4, 9);
  const auto call = [&](const std::vector<double>& rr, const std::vector<double>& bb, const std::vector<double>& mm) {
    return outcome_of([&] {
      ulorl::remax_advantages(padded_of(rr.data(), 2, 2), std::span<const double>(bb), padded_of(mm.data(), 2, 2),
                              padded_of(ret.data(), 2, 2), padded_of(adv.data(), 2, 2));
    });
  };
  require_rejected(call(r, {0.5}, m), "remax_advantages", "baselines", -1);
  require_rejected(call(r, {0.5, NAN}, m), "remax_advantages", "baselines", 1);
  require_rejected(call({1, 0, INFINITY, 1}, base, m), "remax_advantages", "token_rewards", 2);
  require_rejected(call(r, base, {1, 2, 1, 0}), "remax_advantages", "mask", 1);
  std::vector<double> small(2);
  require_rejected(outcome_of([&] {
                     ulorl::remax_advantages(padded_of(r.data(), 2, 2), std::span<const double>(base),
                                             padded_of(m.data(), 2, 2), padded_of(ret.data(), 2, 2),
                                             padded_of(small.data(), 1, 2));
                   }),
                   "remax_advantages", "advantages", -1);
  for (double x : adv) REQUIRE(x == 9);
  for (double x : ret) REQUIRE(x == 9);
  const std::vector<float> fr{3e38f, 3e38f}, fm{1, 1}, fb{0};
  std::vector<float> fret(2, 9), fadv(2, 9);
  require_rejected(outcome_of([&] {
                     ulorl::remax_advantages(ulorl::padded(ulorl::matrix_view<const float>(fr.data(), 1, 2)),
                                             std::span<const float>(fb),
                                             ulorl::padded(ulorl::matrix_view<const float>(fm.data(), 1, 2)),
                                             padded_of(fret.data(), 1, 2), padded_of(fadv.data(), 1, 2));
                   }),
                   "remax_advantages", "returns", 0);
  for (float x : fadv) REQUIRE(x == 9);
  for (float x : fret) REQUIRE(x == 9);
}
