// Tests for ulorl/advantage/gae.hpp against the oracle's sum form of GAE: random rewards and values,
// masks with observation spans inside a response and padding after it, both layouts, an absent
// mask, float32 outputs, and the rejections (nothing written).
#include <ulorl/advantage/gae.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

namespace {
//! Row lengths in [1, T]; inside the response, spans of masked (observation) tokens.
std::vector<std::vector<int>> multi_turn_mask(testing_support::rng& r, std::size_t B, std::size_t T) {
  std::vector<std::vector<int>> m(B, std::vector<int>(T, 0));
  for (std::size_t b = 0; b < B; ++b) {
    const auto len = static_cast<std::size_t>(r.integer(1, static_cast<std::int64_t>(T)));
    for (std::size_t t = 0; t < len; ++t) m[b][t] = 1;
    if (len > 3 && r.coin(0.7)) {
      const auto at = static_cast<std::size_t>(r.integer(1, static_cast<std::int64_t>(len) - 2));
      const auto span = static_cast<std::size_t>(r.integer(1, static_cast<std::int64_t>(len - at) - 1));
      for (std::size_t t = at; t < at + span; ++t) m[b][t] = 0;
    }
  }
  return m;
}
std::vector<double> flat(const oracle::rows& x) {
  std::vector<double> v;
  for (const auto& row : x) v.insert(v.end(), row.begin(), row.end());
  return v;
}
}  // namespace

TEST_CASE("GAE advantages and returns match the oracle, observation spans included", "[gae]") {
  testing_support::rng r(11);
  INFO("seed 11");
  for (auto [B, T] : {std::pair<std::size_t, std::size_t>{1, 3}, {3, 7}, {8, 47}, {5, 1}}) {
    for (auto [gamma, lambda] : {std::pair{1.0, 1.0}, {0.99, 0.95}, {0.5, 0.0}, {0.0, 0.7}}) {
      const auto m = multi_turn_mask(r, B, T);
      oracle::rows R(B, std::vector<double>(T)), V(B, std::vector<double>(T));
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t) {
          R[b][t] = r.coin(0.3) ? r.normal() : 0.0;  // also at masked positions: they must not count
          V[b][t] = r.normal();
        }
      std::size_t valid = 0;
      std::vector<double> fm;
      for (const auto& row : m)
        for (int x : row) valid += x != 0, fm.push_back(x);
      if (valid < 2) continue;
      oracle::rows ret_o, adv_o;
      oracle::gae(R, V, m, gamma, lambda, ret_o, adv_o);
      const auto fr = flat(R), fv = flat(V);
      std::vector<double> ret(B * T), adv(B * T);
      ulorl::gae_advantages(padded_of(fr.data(), B, T), padded_of(fv.data(), B, T),
                            padded_of(std::as_const(fm).data(), B, T), padded_of(ret.data(), B, T),
                            padded_of(adv.data(), B, T), {.gamma = gamma, .lambda = lambda});
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t) {
          INFO("B=" << B << " T=" << T << " gamma=" << gamma << " lambda=" << lambda << " at " << b << "," << t);
          REQUIRE(ret[b * T + t] == Approx(ret_o[b][t]).epsilon(1e-12).margin(1e-12));
          REQUIRE(adv[b * T + t] == Approx(adv_o[b][t]).epsilon(1e-10).margin(1e-10));
        }
      // float32 outputs: the same values to float precision
      std::vector<float> fr32(fr.begin(), fr.end()), fv32(fv.begin(), fv.end()), fm32(fm.begin(), fm.end());
      std::vector<float> ret32(B * T), adv32(B * T);
      const auto c32 = [&, rows = B, cols = T](const std::vector<float>& v) {
        return ulorl::padded(ulorl::matrix_view<const float>(v.data(), rows, cols));
      };
      ulorl::gae_advantages(c32(fr32), c32(fv32), c32(fm32), padded_of(ret32.data(), B, T),
                            padded_of(adv32.data(), B, T), {.gamma = gamma, .lambda = lambda});
      for (std::size_t i = 0; i < B * T; ++i) {
        REQUIRE(ret32[i] == Approx(ret[i]).epsilon(1e-5).margin(1e-5));
        REQUIRE(adv32[i] == Approx(adv[i]).epsilon(1e-4).margin(1e-4));
      }
    }
  }
}

TEST_CASE("GAE: a masked span carries the value and the running advantage through", "[gae]") {
  // one row, valid 0, 1, 4; 2 and 3 an observation span, 5 padding; gamma = lambda = 1
  const std::vector<double> R{0, 0, 5, 5, 1, 9}, V{0.5, 0.25, 7, 7, 0.125, 3}, m{1, 1, 0, 0, 1, 0};
  std::vector<double> ret(6), adv(6);
  ulorl::gae_advantages(padded_of(R.data(), 1, 6), padded_of(V.data(), 1, 6), padded_of(m.data(), 1, 6),
                        padded_of(ret.data(), 1, 6), padded_of(adv.data(), 1, 6),
                        {.whiten = {.eps = 1e300, .shift_mean = false, .mask_output = false}});
  // raw A: t=4: 1 - 0.125 = 0.875; t=1: 0 + 0.125 - 0.25 + 0.875 = 0.75; t=0: 0 + 0.25 - 0.5 + 0.75 = 0.5;
  // masked 2, 3 carry 0.875, padding 5 gets 0. The returns add V everywhere.
  const std::vector<double> raw{0.5, 0.75, 0.875, 0.875, 0.875, 0.0};
  for (std::size_t t = 0; t < 6; ++t) REQUIRE(ret[t] == raw[t] + V[t]);
  // with a huge eps and no shift the whitening is a common positive scale: the ratios stay
  for (std::size_t t = 0; t < 6; ++t) REQUIRE(adv[t] == Approx(raw[t] * (adv[0] / raw[0])).epsilon(1e-12));
}

TEST_CASE("GAE: packed equals padded, an absent mask is an all-ones mask", "[gae][mask]") {
  std::mt19937_64 rng(23);
  for (const auto& lay : absent_mask::layouts(rng, 4, 7)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto r = absent_mask::uniform(rng, lay.size(), -1, 1), v = absent_mask::uniform(rng, lay.size(), -1, 1);
    const std::vector<double> ones(lay.size(), 1.0);
    std::vector<double> ret(lay.size()), adv(lay.size()), reta(lay.size()), adva(lay.size());
    ulorl::gae_advantages(lay.cview(r), lay.cview(v), lay.cview(ones), lay.mview(ret), lay.mview(adv),
                          {.gamma = 0.9, .lambda = 0.8});
    ulorl::gae_advantages(lay.cview(r), lay.cview(v), ulorl::token_view<const double>{}, lay.mview(reta),
                          lay.mview(adva), {.gamma = 0.9, .lambda = 0.8});
    REQUIRE(absent_mask::same_bits(reta, ret));
    REQUIRE(absent_mask::same_bits(adva, adv));
  }
  // packed rows {0, 3, 5} against the padded [2, 3] with the second row's last token masked
  const std::vector<double> pr{1, 0, 2, 0.5, 1, 7}, pv{0.1, 0.2, 0.3, 0.4, 0.5, 9}, pm{1, 1, 1, 1, 1, 0};
  const std::vector<double> kr{1, 0, 2, 0.5, 1}, kv{0.1, 0.2, 0.3, 0.4, 0.5}, km(5, 1.0);
  const std::vector<std::int64_t> off{0, 3, 5};
  const auto kview = [&](const std::vector<double>& x) {
    return ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(x.data(), 5),
                                                   std::span<const std::int64_t>(off));
  };
  std::vector<double> pret(6), padv(6), kret(5), kadv(5);
  ulorl::gae_advantages(padded_of(pr.data(), 2, 3), padded_of(pv.data(), 2, 3), padded_of(pm.data(), 2, 3),
                        padded_of(pret.data(), 2, 3), padded_of(padv.data(), 2, 3), {.gamma = 0.9, .lambda = 0.5});
  ulorl::gae_advantages(
      kview(kr), kview(kv), kview(km),
      ulorl::token_view<double>::packed(ulorl::vector_view<double>(kret.data(), 5), std::span<const std::int64_t>(off)),
      ulorl::token_view<double>::packed(ulorl::vector_view<double>(kadv.data(), 5), std::span<const std::int64_t>(off)),
      {.gamma = 0.9, .lambda = 0.5});
  for (std::size_t i = 0; i < 5; ++i) {
    REQUIRE(kret[i] == Approx(pret[i]).epsilon(1e-14));
    REQUIRE(kadv[i] == Approx(padv[i]).epsilon(1e-12));
  }
}

TEST_CASE("GAE rejects bad inputs before writing", "[gae][errors]") {
  const std::vector<double> r{1, 0, 0, 1}, v{0.5, 0.5, 0.5, 0.5}, m{1, 1, 1, 0}, one{1, 0, 0, 0};
  std::vector<double> ret(4, 9), adv(4, 9);
  const auto call = [&](const std::vector<double>& rr, const std::vector<double>& vv, const std::vector<double>& mm,
                        ulorl::gae_config cfg = {}) {
    return outcome_of([&] {
      ulorl::gae_advantages(padded_of(rr.data(), 2, 2), padded_of(vv.data(), 2, 2), padded_of(mm.data(), 2, 2),
                            padded_of(ret.data(), 2, 2), padded_of(adv.data(), 2, 2), cfg);
    });
  };
  require_rejected(call(r, v, one), "gae_advantages", "mask", -1);  // one valid token: no unbiased variance
  require_rejected(call(r, v, m, {.gamma = 1.5}), "gae_advantages", "config.gamma", -1);
  require_rejected(call(r, v, m, {.lambda = -0.1}), "gae_advantages", "config.lambda", -1);
  require_rejected(call(r, v, m, {.whiten = {.eps = 0.0}}), "gae_advantages", "config.whiten.eps", -1);
  require_unknown_enum(
      [&] {
        ulorl::gae_advantages(padded_of(r.data(), 2, 2), padded_of(v.data(), 2, 2), padded_of(m.data(), 2, 2),
                              padded_of(ret.data(), 2, 2), padded_of(adv.data(), 2, 2),
                              {.whiten = {.eps_at = static_cast<ulorl::whiten_eps>(5)}});
      },
      "gae_advantages", "config.whiten.eps_at", 5);
  std::vector<double> vnan = v;
  vnan[3] = std::nan("");
  require_rejected(call(r, vnan, m), "gae_advantages", "values", 3);
  std::vector<double> rinf = r;
  rinf[1] = INFINITY;
  require_rejected(call(rinf, v, m), "gae_advantages", "token_rewards", 1);
  std::vector<double> mbad = m;
  mbad[2] = 0.5;
  require_rejected(call(r, v, mbad), "gae_advantages", "mask", 2);
  const std::vector<double> v3{0.5, 0.5, 0.5};
  require_rejected(outcome_of([&] {
                     ulorl::gae_advantages(padded_of(r.data(), 2, 2), padded_of(v3.data(), 1, 3),
                                           padded_of(m.data(), 2, 2), padded_of(ret.data(), 2, 2),
                                           padded_of(adv.data(), 2, 2));
                   }),
                   "gae_advantages", "values", -1);
  for (double x : adv) REQUIRE(x == 9);
  for (double x : ret) REQUIRE(x == 9);
  // a return beyond float32: an error naming it, both outputs untouched
  const std::vector<float> fr{3e38f, 3e38f, 0, 1}, fv{3e38f, 0.5f, 0.5f, 0.5f}, fm{1, 1, 1, 1};
  std::vector<float> fret(4, 9), fadv(4, 9);
  const auto c32 = [](const std::vector<float>& x) {
    return ulorl::padded(ulorl::matrix_view<const float>(x.data(), 2, 2));
  };
  require_rejected(outcome_of([&] {
                     ulorl::gae_advantages(c32(fr), c32(fv), c32(fm), padded_of(fret.data(), 2, 2),
                                           padded_of(fadv.data(), 2, 2));
                   }),
                   "gae_advantages", "returns", 0);
  for (float x : fadv) REQUIRE(x == 9);
  for (float x : fret) REQUIRE(x == 9);
}
