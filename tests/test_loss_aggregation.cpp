// Tests of ulorl/loss/aggregation.hpp: every mode against a direct formula, the gradient by finite
// differences, the partition property of agg_loss over random splits, and zero normalisers.
#include <ulorl/loss/aggregation.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"

namespace {
constexpr std::uint64_t seed = 99;
ulorl::token_view<const double> cv(const std::vector<double>& v, std::size_t B, std::size_t T) {
  return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T));
}
ulorl::token_view<double> mv(std::vector<double>& v, std::size_t B, std::size_t T) {
  return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), B, T));
}
}  // namespace

TEST_CASE("agg_loss: every mode equals its formula; gradient equals finite differences") {
  std::printf("test_loss_aggregation seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t B = 1 + rng() % 6, T = 1 + rng() % 9;
    std::vector<double> L(B * T), m(B * T);
    for (std::size_t i = 0; i < B * T; ++i) L[i] = u(rng) * 4 - 2, m[i] = u(rng) < 0.7;
    m[0] = 1;  // at least one valid token
    const auto c = ulorl::count_batch(cv(m, B, T));
    for (auto mode : {ulorl::agg_mode::token_mean, ulorl::agg_mode::seq_mean_token_sum, ulorl::agg_mode::seq_mean_token_mean,
                      ulorl::agg_mode::seq_mean_token_sum_norm, ulorl::agg_mode::constant}) {
      const auto norm = ulorl::global_normalizer(mode, c, 17.0, 2.0);
      std::vector<double> g(B * T);
      const double loss = ulorl::agg_loss(cv(L, B, T), cv(m, B, T), mv(g, B, T), norm);
      double expect = 0;
      for (std::size_t b = 0; b < B; ++b) {
        double s = 0, n = 0;
        for (std::size_t t = 0; t < T; ++t) s += L[b * T + t] * m[b * T + t], n += m[b * T + t];
        switch (mode) {
          case ulorl::agg_mode::token_mean: expect += s / c.tokens; break;
          case ulorl::agg_mode::seq_mean_token_sum: expect += s / c.sequences; break;
          case ulorl::agg_mode::seq_mean_token_mean: expect += n > 0 ? s / n / c.sequences : 0.0; break;
          default: expect += s / 17.0; break;
        }
      }
      REQUIRE(loss == Approx(2 * expect).epsilon(1e-13));
      for (std::size_t i = 0; i < B * T; ++i) {
        std::vector<double> Lp = L, Lm = L;
        Lp[i] += 1e-6, Lm[i] -= 1e-6;
        const double fd = (ulorl::agg_loss(cv(Lp, B, T), cv(m, B, T), norm) - ulorl::agg_loss(cv(Lm, B, T), cv(m, B, T), norm)) / 2e-6;
        REQUIRE(g[i] == Approx(fd).epsilon(1e-6).margin(1e-9));
      }
    }
  }
}

TEST_CASE("agg_loss: partition-exact with the global normaliser (random splits, 1e-12)") {
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t B = 2 + rng() % 40, T = 1 + rng() % 33;
    std::vector<double> L(B * T), m(B * T);
    for (std::size_t i = 0; i < B * T; ++i) L[i] = (u(rng) - 0.5) * 10, m[i] = u(rng) < 0.6;
    m[0] = 1;
    const auto mode = static_cast<ulorl::agg_mode>(trial % 5);
    const auto norm = ulorl::global_normalizer(mode, ulorl::count_batch(cv(m, B, T)), 1234.0, 1.0);
    std::vector<double> g_full(B * T);
    const double full = ulorl::agg_loss(cv(L, B, T), cv(m, B, T), mv(g_full, B, T), norm);
    // Split rows at random cut points; each part is a micro-batch on some rank.
    std::vector<std::size_t> cuts{0, B};
    for (std::size_t k = 0; k < rng() % 6; ++k) cuts.push_back(rng() % B);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    double sum = 0;
    std::vector<double> g(B * T);
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      const std::size_t r0 = cuts[k], nb = cuts[k + 1] - cuts[k];
      sum += ulorl::agg_loss(cv(std::vector<double>(L.begin() + r0 * T, L.begin() + (r0 + nb) * T), nb, T),
                             ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(m.data() + r0 * T, nb, T)),
                             ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data() + r0 * T, nb, T)), norm);
    }
    REQUIRE(sum == Approx(full).epsilon(1e-12).margin(1e-14));
    REQUIRE(g == g_full);
  }
}

TEST_CASE("count_batch, global_normalizer and rejected normalisers") {
  const std::size_t B = 3, T = 2;
  std::vector<double> m{1, 1, 0, 0, 1, 0}, L{1, 2, 3, 4, 5, 6}, g(B * T, 8.0);
  const auto c = ulorl::count_batch(cv(m, B, T));
  REQUIRE(c.tokens == 3);
  REQUIRE(c.sequences == 2);
  REQUIRE(c.rows == 3);
  REQUIRE((c + c).tokens == 6);
  REQUIRE(ulorl::global_normalizer(ulorl::agg_mode::seq_mean_token_mean, c).denominator == 2);
  std::vector<double> zero(B * T, 0.0);
  const auto z = ulorl::global_normalizer(ulorl::agg_mode::token_mean, ulorl::count_batch(cv(zero, B, T)));
  REQUIRE_THROWS_AS(ulorl::agg_loss(cv(L, B, T), cv(zero, B, T), mv(g, B, T), z), ulorl::error);
  m[1] = 2;
  REQUIRE_THROWS_AS(ulorl::count_batch(cv(m, B, T)), ulorl::error);
  REQUIRE_THROWS_AS(ulorl::agg_loss(cv(L, B, T), cv(m, B, T), mv(g, B, T), {ulorl::agg_mode::token_mean, 3, 1}), ulorl::error);
  m[1] = 1;
  REQUIRE_THROWS_AS(ulorl::agg_loss(cv(L, B, T), cv(m, B, T), mv(g, B, T), {ulorl::agg_mode::token_mean, -1, 1}), ulorl::error);
  try {  // a value outside the enum
    (void)ulorl::agg_loss(cv(L, B, T), cv(m, B, T), mv(g, B, T), {static_cast<ulorl::agg_mode>(17), 3, 1});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    REQUIRE(e.argument() == "normalizer.mode");
  }
  L[2] = std::nan("");
  REQUIRE_THROWS_AS(ulorl::agg_loss(cv(L, B, T), cv(m, B, T), mv(g, B, T), {ulorl::agg_mode::token_mean, 3, 1}), ulorl::error);
  for (double v : g) REQUIRE(v == 8.0);
}

TEST_CASE("agg_loss and count_batch: an absent mask is an all-ones mask, bit for bit, in both layouts", "[mask]") {
  std::mt19937_64 rng(seed + 7);
  for (const auto& lay : absent_mask::layouts(rng, 5, 9)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto L = absent_mask::uniform(rng, lay.size(), -2, 2);
    const std::vector<double> ones(lay.size(), 1.0);
    const ulorl::token_view<const double> absent{};
    const auto c = ulorl::count_batch(lay.cview(ones));
    const auto ca = ulorl::count_batch(absent, lay.cview(L));
    REQUIRE(absent_mask::same_bits(ca, c));
    REQUIRE(ca.tokens == static_cast<double>(lay.size()));
    REQUIRE(ca.sequences == (lay.packed ? 4.0 : 5.0));  // the packed layout's row 1 is empty
    REQUIRE(absent_mask::same_bits(ulorl::count_batch(lay.cview(ones), lay.cview(L)), c));
    for (auto mode : {ulorl::agg_mode::token_mean, ulorl::agg_mode::seq_mean_token_sum, ulorl::agg_mode::seq_mean_token_mean,
                      ulorl::agg_mode::seq_mean_token_sum_norm, ulorl::agg_mode::constant}) {
      const auto norm = ulorl::global_normalizer(mode, c, 17.0, 2.0);
      std::vector<double> g(lay.size(), 9.0), ga(lay.size(), 9.0);
      const double loss = ulorl::agg_loss(lay.cview(L), lay.cview(ones), lay.mview(g), norm);
      const double la = ulorl::agg_loss(lay.cview(L), absent, lay.mview(ga), norm);
      REQUIRE(absent_mask::same_bits(la, loss));
      REQUIRE(absent_mask::same_bits(ga, g));
    }
    // A given mask must still have the shape; the absent one takes loss_mat's.
    const std::vector<double> short_mask(3, 1.0);
    const auto wrong = ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(short_mask.data(), 1, 3));
    REQUIRE_THROWS_WITH(ulorl::agg_loss(lay.cview(L), wrong, ulorl::global_normalizer(ulorl::agg_mode::token_mean, c)),
                        Catch::Contains("'mask'"));
    REQUIRE_THROWS_WITH(ulorl::count_batch(wrong, lay.cview(L)), Catch::Contains("'mask'"));
  }
  // Without the tokens, an empty view is an empty batch.
  REQUIRE(ulorl::count_batch(ulorl::token_view<const double>{}).rows == 0);
}

TEST_CASE("agg_loss and count_batch: a given zero-row mask is an error, not an absent mask", "[aggregation][absent]") {
  std::vector<double> loss(6, 1.0), grad(6, 0.0);
  const auto l = ulorl::padded(ulorl::matrix_view<const double>(loss.data(), 2, 3));
  const auto g = ulorl::padded(ulorl::matrix_view<double>(grad.data(), 2, 3));
  const auto zero_rows = ulorl::padded(ulorl::matrix_view<const std::uint8_t>(nullptr, 0, 3));
  const ulorl::agg_normalizer norm{ulorl::agg_mode::token_mean, 6.0, 1.0};
  try {
    (void)ulorl::agg_loss(l, zero_rows, g, norm);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "mask");
  }
  REQUIRE_THROWS_AS(ulorl::count_batch(zero_rows, l), ulorl::error);
  REQUIRE(ulorl::agg_loss(l, ulorl::token_view<const std::uint8_t>{}, g, norm) == 1.0);
}

TEST_CASE("agg_loss: a loss or a gradient beyond the value type's range is an error, a representable one is exact",
          "[aggregation][overflow]") {
  const std::vector<float> Lf(8, 3e38f), mf(8, 1.0f);
  const auto fv = [](const std::vector<float>& v) { return ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(v.data(), 1, 8)); };
  std::vector<float> gf(8, 42.0f);
  const auto gv = ulorl::token_view<float>::padded(ulorl::matrix_view<float>(gf.data(), 1, 8));
  // float: the sum 2.4e39 of one sequence overflows float32.
  try {
    (void)ulorl::agg_loss(fv(Lf), fv(mf), gv, {ulorl::agg_mode::seq_mean_token_sum, 1.0, 1.0});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    INFO(e.what());
    CHECK(e.argument() == "loss");
    CHECK(std::string(e.what()).find("overflows float32") != std::string::npos);
  }
  CHECK(std::all_of(gf.begin(), gf.end(), [](float x) { return x == 42.0f; }));
  // A row weight beyond float (scale 1e39) is an error naming the gradient; nothing written.
  const std::vector<float> small(8, 1e-30f);
  CHECK_THROWS_WITH(ulorl::agg_loss(fv(small), fv(mf), gv, {ulorl::agg_mode::token_mean, 1.0, 1e39}),
                    Catch::Contains("'grad'"));
  CHECK(std::all_of(gf.begin(), gf.end(), [](float x) { return x == 42.0f; }));
  // The token mean 3e38 is representable.
  CHECK(ulorl::agg_loss(fv(Lf), fv(mf), gv, {ulorl::agg_mode::token_mean, 8.0, 1.0}) == Approx(3e38).epsilon(1e-7));
  // double: 8 x 1e308 overflows a plain sum; the mean 1e308 is exact.
  const std::vector<double> Ld(8, 1e308), md(8, 1.0);
  std::vector<double> gd(8);
  CHECK(ulorl::agg_loss(cv(Ld, 1, 8), cv(md, 1, 8), mv(gd, 1, 8), {ulorl::agg_mode::token_mean, 8.0, 1.0}) == Approx(1e308).epsilon(1e-15));
  CHECK_THROWS_AS(ulorl::agg_loss(cv(Ld, 1, 8), cv(md, 1, 8), mv(gd, 1, 8), {ulorl::agg_mode::seq_mean_token_sum, 1.0, 1.0}),
                  ulorl::error);
  // A subnormal denominator has no finite reciprocal.
  CHECK_THROWS_WITH(ulorl::agg_loss(cv(Ld, 1, 8), cv(md, 1, 8), mv(gd, 1, 8), {ulorl::agg_mode::token_mean, 5e-324, 1e-300}),
                    Catch::Contains("reciprocal"));
}
