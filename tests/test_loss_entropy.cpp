// Tests of ulorl/loss/entropy.hpp: the entropy bonus value, its gradient and aggregation weights.
#include <ulorl/loss/entropy.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"
#include "support/rejection.hpp"

TEST_CASE("entropy_term and entropy_loss") {
  const auto e = ulorl::entropy_term(2.5, 0.01);
  REQUIRE(e.value == Approx(-0.025));
  REQUIRE(e.grad == -0.01);
  const std::size_t B = 2, T = 3;
  std::vector<double> h{1, 2, 3, 4, 5, 6}, mask{1, 1, 0, 1, 0, 0}, g(B * T, 9.0);
  auto cv = [&](const std::vector<double>& v) { return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T)); };
  auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), B, T));
  // seq-mean-token-mean over S = 2 sequences: ((1 + 2) / 2 + 4 / 1) / 2 times -coef.
  const double l = ulorl::entropy_loss<double, double>(cv(h), cv(mask), gv, 0.1, {ulorl::agg_mode::seq_mean_token_mean, 2.0, 1.0});
  REQUIRE(l == Approx(-0.1 * (1.5 + 4.0) / 2));
  const std::vector<double> expect{-0.1 / 4, -0.1 / 4, 0, -0.1 / 2, 0, 0};
  for (std::size_t i = 0; i < B * T; ++i) REQUIRE(g[i] == Approx(expect[i]).margin(1e-17));
  // Finite-difference check of d loss / d H.
  for (std::size_t i = 0; i < B * T; ++i) {
    std::vector<double> hp = h, hm = h, tmp(B * T);
    hp[i] += 1e-6, hm[i] -= 1e-6;
    auto tv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(tmp.data(), B, T));
    const double fd = (ulorl::entropy_loss<double, double>(cv(hp), cv(mask), tv, 0.1, {ulorl::agg_mode::seq_mean_token_mean, 2.0, 1.0}) -
                       ulorl::entropy_loss<double, double>(cv(hm), cv(mask), tv, 0.1, {ulorl::agg_mode::seq_mean_token_mean, 2.0, 1.0})) /
                      2e-6;
    REQUIRE(g[i] == Approx(fd).margin(1e-9));
  }
  std::vector<double> sentinel(B * T, 9.0);
  h[1] = INFINITY;
  REQUIRE_THROWS_AS((ulorl::entropy_loss<double, double>(
      cv(h), cv(mask), ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sentinel.data(), B, T)), 0.1,
      {ulorl::agg_mode::token_mean, 3.0, 1.0})),
                    ulorl::error);
  h[1] = 2;
  REQUIRE_THROWS_AS((ulorl::entropy_loss<double, double>(
      cv(h), cv(mask), ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sentinel.data(), B, T)), 0.1,
      {ulorl::agg_mode::token_mean, 0.0, 1.0})),
                    ulorl::error);
  for (double v : sentinel) REQUIRE(v == 9.0);
}

// ---- entropy_loss: every aggregation mode against a float64 reference, and every rejected input ----

namespace {

const ulorl::agg_mode modes[] = {ulorl::agg_mode::token_mean, ulorl::agg_mode::seq_mean_token_sum, ulorl::agg_mode::seq_mean_token_mean,
                                 ulorl::agg_mode::seq_mean_token_sum_norm, ulorl::agg_mode::constant};

//! The documented aggregation, written out: loss = scale * sum_b sum_t (-coef H) m / D_b with
//! D_b = D, or D * n_b (n_b the row's valid tokens) for seq_mean_token_mean; grad = d loss / d H.
double entropy_reference(const shape& s, const std::vector<double>& h, const std::vector<double>& m, double coef, ulorl::agg_mode mode,
                         double D, double scale, std::vector<double>& grad) {
  double loss = 0;
  grad.assign(s.size(), 0.0);
  for (std::size_t b = 0; b < s.rows(); ++b) {
    double nb = 0;
    for (std::size_t t = 0; t < s.row_size(b); ++t) nb += m[s.row_begin(b) + t];
    const double Db = mode == ulorl::agg_mode::seq_mean_token_mean ? D * nb : D;
    for (std::size_t t = 0; t < s.row_size(b); ++t) {
      const std::size_t i = s.row_begin(b) + t;
      if (m[i] == 0) continue;
      loss += scale * (-coef * h[i]) / Db;
      grad[i] = scale * -coef / Db;
    }
  }
  return loss;
}

//! The inputs of entropy_loss, each with its own shape.
template <class M>
struct entropy_case {
  shape s_h, s_mask, s_g;
  std::vector<double> h, g;
  std::vector<M> mask;
  bool with_mask = true, with_grad = true;
  double coef = 0.01;
  ulorl::agg_normalizer norm{ulorl::agg_mode::token_mean, 5.0, 1.0};
  explicit entropy_case(const shape& s) : s_h(s), s_mask(s), s_g(s) {
    for (std::size_t i = 0; i < s.size(); ++i) h.push_back(0.1 * static_cast<double>(i + 1));
    mask.assign(s.size(), M(1));
    if (s.size() > 2) mask[1] = M(0);
    g.assign(s.size(), 9.0);
  }
  void reshape(const std::string& arg, const shape& s) {
    if (arg == "entropy") s_h = s, h.assign(s.size(), 0.5);
    if (arg == "mask") s_mask = s, mask.assign(s.size(), M(1));
    if (arg == "grad_entropy") s_g = s, g.assign(s.size(), 9.0);
  }
  double run() {
    return ulorl::entropy_loss<double, M>(view_of<const double>(h.data(), s_h),
                                          with_mask ? view_of<const M>(mask.data(), s_mask) : ulorl::token_view<const M>{},
                                          with_grad ? view_of<double>(g.data(), s_g) : ulorl::token_view<double>{}, coef, norm);
  }
};
}  // namespace

TEST_CASE("entropy_loss: every aggregation mode on ragged padded and packed batches against a float64 reference") {
  std::mt19937_64 rng(515);
  std::uniform_real_distribution<double> u(0, 1);
  int configs = 0;
  for (const shape& s : {shape{4, 6, {}}, shape{0, 0, {0, 5, 5, 7, 13, 14}}}) {
    const std::size_t n = s.size();
    std::vector<double> h(n);
    for (auto& x : h) x = 3 * u(rng);  // entropies are >= 0; any finite value is accepted
    std::vector<std::vector<double>> masks(2, std::vector<double>(n, 1.0));
    for (std::size_t b = 0; b < s.rows(); ++b)
      for (std::size_t t = 0; t < s.row_size(b); ++t) masks[0][s.row_begin(b) + t] = (b == 2 || (t + b) % 3 == 2) ? 0.0 : 1.0;
    std::fill(masks[1].begin(), masks[1].end(), 0.0);  // no valid token in this micro-batch
    std::vector<float> hf(h.begin(), h.end());
    const std::vector<double> hf_d(hf.begin(), hf.end());
    for (const auto& m : masks) {
      const std::vector<std::uint8_t> m8(m.begin(), m.end());
      for (auto mode : modes)
        for (double coef : {0.01, -0.5, 0.0})
          for (double D : {3.0, 17.5})
            for (double scale : {1.0, 4.0}) {
              INFO("layout " << (s.offsets.empty() ? "padded" : "packed") << " mode " << static_cast<int>(mode) << " coef " << coef << " D " << D
                             << " scale " << scale << " valid tokens " << std::count(m.begin(), m.end(), 1.0));
              const ulorl::agg_normalizer norm{mode, D, scale};
              std::vector<double> eg;
              const double el = entropy_reference(s, h, m, coef, mode, D, scale, eg);
              std::vector<double> g(n, 9.0), g8(n, 9.0);
              const double l = ulorl::entropy_loss<double, double>(view_of<const double>(h.data(), s),
                                                                   view_of<const double>(m.data(), s),
                                                                   view_of<double>(g.data(), s), coef, norm);
              const double l8 = ulorl::entropy_loss<double, std::uint8_t>(
                  view_of<const double>(h.data(), s), view_of<const std::uint8_t>(m8.data(), s), view_of<double>(g8.data(), s),
                  coef, norm);
              REQUIRE(l == Approx(el).epsilon(1e-13).margin(1e-16));
              REQUIRE(l8 == l);
              for (std::size_t i = 0; i < n; ++i) {
                INFO("flat index " << i);
                if (m[i] == 0) REQUIRE(g[i] == 0.0);
                REQUIRE(g[i] == Approx(eg[i]).epsilon(1e-13).margin(1e-300));
                REQUIRE(g8[i] == g[i]);
              }
              // The loss is linear in H: a central difference matches the gradient to rounding.
              for (std::size_t i = 0; i < n; i += 3) {
                std::vector<double> hp = h, hm = h, tmp(n);
                hp[i] += 1e-3, hm[i] -= 1e-3;
                auto f = [&](const std::vector<double>& x) {
                  return ulorl::entropy_loss<double, double>(view_of<const double>(x.data(), s),
                                                             view_of<const double>(m.data(), s), view_of<double>(tmp.data(), s),
                                                             coef, norm);
                };
                REQUIRE(g[i] == Approx((f(hp) - f(hm)) / 2e-3).epsilon(1e-9).margin(1e-12));
              }
              std::vector<float> gf(n, 9.0f);
              const std::vector<float> mf(m.begin(), m.end());
              std::vector<double> egf;
              const double lf = ulorl::entropy_loss<float, float>(view_of<const float>(hf.data(), s),
                                                                  view_of<const float>(mf.data(), s),
                                                                  view_of<float>(gf.data(), s), coef, norm);
              REQUIRE(lf == Approx(entropy_reference(s, hf_d, m, coef, mode, D, scale, egf)).epsilon(1e-13).margin(1e-16));
              for (std::size_t i = 0; i < n; ++i) REQUIRE(static_cast<double>(gf[i]) == Approx(egf[i]).epsilon(1e-7).margin(1e-300));
              ++configs;
            }
    }
  }
  REQUIRE(configs == 2 * 2 * 5 * 3 * 2 * 2);
}

TEST_CASE("entropy_loss: bad input names the argument and the flat index; grad_entropy untouched") {
  const std::string fn = "entropy_loss";
  const double inf = std::numeric_limits<double>::infinity();
  int rejected = 0;
  for (const shape& base : {padded_shape, packed_shape}) {
    INFO("base layout " << (base.offsets.empty() ? "padded" : "packed"));
    {
      entropy_case<double> ok(base);
      REQUIRE_NOTHROW(ok.run());
    }
    // Shapes: each argument in turn the odd one out ('entropy' odd: named on the first compared).
    for (const char* odd : {"entropy", "mask", "grad_entropy"})
      for (const shape& w : wrong_shapes(base)) {
        entropy_case<double> c(base);
        c.reshape(odd, w);
        INFO("odd argument " << odd << ", " << w.rows() << " rows, " << w.size() << " elements");
        require_rejected(outcome_of([&] { (void)c.run(); }), fn, std::string(odd) == "entropy" ? "mask" : odd, -1);
        REQUIRE(all_equal(c.g, 9.0));
        ++rejected;
      }
    // The gradient output is required; an absent mask means every token valid.
    {
      entropy_case<double> c(base);
      c.with_grad = false;
      require_rejected(outcome_of([&] { (void)c.run(); }), fn, "grad_entropy", -1);
      REQUIRE(all_equal(c.g, 9.0));
      ++rejected;
    }
    {
      entropy_case<double> c(base);
      c.with_mask = false;
      REQUIRE_NOTHROW(c.run());
    }
    // Non-finite entropy at the first, a masked and the last token.
    for (double bad : {std::nan(""), inf, -inf})
      for (std::size_t i : {std::size_t{0}, std::size_t{1}, base.size() - 1}) {
        entropy_case<double> c(base);
        c.h[i] = bad;
        INFO("entropy[" << i << "] = " << bad);
        require_rejected(outcome_of([&] { (void)c.run(); }), fn, "entropy", static_cast<std::int64_t>(i));
        REQUIRE(all_equal(c.g, 9.0));
        ++rejected;
      }
    // Masks that are not 0/1.
    rejected += require_bad_masks_rejected<entropy_case>(base, fn, [](auto& c) -> auto& { return c.g; }, 9.0);
    // Scalars: coef, and the normaliser (a zero denominator is what a zero-token batch gives).
    auto scalar = [&](const char* arg, auto set) {
      entropy_case<double> c(base);
      set(c);
      require_rejected(outcome_of([&] { (void)c.run(); }), fn, arg, -1);
      REQUIRE(all_equal(c.g, 9.0));
      ++rejected;
    };
    for (double bad : {std::nan(""), inf, -inf}) scalar("coef", [&](auto& c) { c.coef = bad; });
    for (double bad : {0.0, -1.0, std::nan(""), inf}) scalar("normalizer.denominator", [&](auto& c) { c.norm.denominator = bad; });
    for (double bad : {std::nan(""), inf, -inf}) scalar("normalizer.scale", [&](auto& c) { c.norm.scale = bad; });
    for (auto mode : modes) {
      entropy_case<double> c(base);
      std::fill(c.mask.begin(), c.mask.end(), 0.0);  // a zero-token batch: its normaliser is 0
      c.norm = ulorl::global_normalizer(mode, ulorl::count_batch(view_of<const double>(c.mask.data(), c.s_mask)), 0.0);
      require_rejected(outcome_of([&] { (void)c.run(); }), fn, "normalizer.denominator", -1);
      REQUIRE(all_equal(c.g, 9.0));
      ++rejected;
    }
  }
  REQUIRE(rejected == 2 * (3 * 5 + 1 + 3 * 3 + 2 * (1 + 4 * 2) + 3 + 4 + 3 + 5));
}

TEST_CASE("entropy_loss: an absent mask is an all-ones mask, bit for bit, in both layouts", "[mask]") {
  std::mt19937_64 rng(31);
  for (const auto& lay : absent_mask::layouts(rng, 4, 11)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto H = absent_mask::uniform(rng, lay.size(), 0, 3);
    const std::vector<float> ones(lay.size(), 1.0f);
    for (auto mode : {ulorl::agg_mode::token_mean, ulorl::agg_mode::seq_mean_token_mean}) {
      const ulorl::agg_normalizer norm{mode, 13.0, 1.5};
      std::vector<double> g(lay.size(), 5.0), ga(lay.size(), 5.0);
      const double loss = ulorl::entropy_loss(lay.cview(H), lay.cview(ones), lay.mview(g), 0.01, norm);
      const double la = ulorl::entropy_loss(lay.cview(H), ulorl::token_view<const float>{}, lay.mview(ga), 0.01, norm);
      REQUIRE(absent_mask::same_bits(la, loss));
      REQUIRE(absent_mask::same_bits(ga, g));
    }
  }
}
