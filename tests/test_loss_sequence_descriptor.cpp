// The sequence-level extension point of ulorl/loss/objectives.hpp: a sequence-level objective with
// parameters of its own, defined here in one descriptor (its row sums, row terms and token step),
// runs through policy_loss_with and the same row driver as GSPO and GMPO. The objective is TRL's
// sequence-level CISPO (GRPOTrainer, importance_sampling_level="sequence", loss_type="cispo"): the
// row's ratio r_b = exp(sum_t m x / max(sum_t m, 1)), x = logp - old, and every token's loss
// -sg(min(r_b, cap)) A logp. Checked against a float64 oracle written from that definition, and
// against the built-in token-level cispo fed the row's mean log-ratio as every token's log-ratio
// (the form a caller without this descriptor would use).
#include <ulorl/loss/policy_loss.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "catch.hpp"

namespace {

template <class T>
struct sequence_cispo_params {
  T cap;    //!< TRL's epsilon_high for cispo: the ratio's upper cap
  T bound;  //!< the token log-ratio clamp of the ratio metrics
};

//! TRL's sequence-level CISPO as one descriptor.
struct sequence_cispo_objective {
  [[maybe_unused]] static constexpr std::string_view name = "sequence_cispo";
  static constexpr ulorl::objective_level level = ulorl::objective_level::sequence;
  double cap = 5.0;
  void validate(std::string_view fn) const {
    if (!(cap > 0.0 && std::isfinite(cap))) ulorl::detail::fail_value(fn, "cap", cap, "must be finite and > 0");
  }
  template <class T>
  [[nodiscard]] sequence_cispo_params<T> params() const noexcept {
    return {static_cast<T>(cap), T(20)};
  }
  //! a: the token's log-ratio.
  template <class T>
  [[nodiscard]] static ulorl::sequence_sums row_token(T lp, T old, T, T, bool, const sequence_cispo_params<T>&) noexcept {
    return {static_cast<double>(lp) - static_cast<double>(old), 0.0, 0.0};
  }
  template <class T>
  [[nodiscard]] static ulorl::sequence_row_terms<T> row(const ulorl::sequence_sums& s, double nd, bool, const ulorl::agg_normalizer&,
                                                        const sequence_cispo_params<T>&) noexcept {
    ulorl::sequence_row_terms<T> t{static_cast<T>(std::exp(s.a / std::max(nd, 1.0))), T(0)};
    t.sequence_clip = true;
    return t;
  }
  template <class T, class LP>
  [[nodiscard]] static ulorl::sequence_token<T> token(T lp, T old, T adv, T wt, T ref, bool, double wd,
                                                      const ulorl::sequence_row_terms<T>& row, const LP& p, bool has_ref) noexcept {
    const T c = std::min(row.ratio, p.objective.cap);
    ulorl::sequence_token<T> s{};
    T own = wt * (-c * adv);
    if (has_ref) {
      const auto k = ulorl::detail::sequence_token_kl(lp, ref, T(1), T(0), p);
      s.kl = k.value;
      own += p.kl_coef * (k.grad + k.via_w);
    }
    const T x = lp - old, xc = ulorl::clamp(x, -p.objective.bound, p.objective.bound);
    s.ratio = {x, xc, row.ratio, T(0), ulorl::exp_minus_one_minus_x(xc)};
    s.flags.clipped = row.ratio > p.objective.cap;
    s.flags.high = s.flags.clipped && adv > T(0);
    s.pg = wt * (-c * adv * lp);
    s.grad = wd * static_cast<double>(own);
    return s;
  }
};

struct problem {
  std::size_t B, T;
  std::vector<double> lp, old, adv;
  std::vector<std::uint8_t> mask;
};

problem random_problem(std::mt19937_64& rng, std::size_t B, std::size_t T) {
  std::uniform_real_distribution<double> u(0, 1);
  problem p{B, T, {}, {}, {}, {}};
  for (std::size_t b = 0; b < B; ++b) {
    const double a = (u(rng) - 0.5) * 3;  // one advantage per row, as GRPO gives
    const double shift = (u(rng) - 0.5) * 1.5;
    for (std::size_t t = 0; t < T; ++t) {
      p.old.push_back(-3 * u(rng) - 0.05);
      p.lp.push_back(p.old.back() + shift + (u(rng) - 0.5) * 0.6);
      p.adv.push_back(a);
      p.mask.push_back(b == 1 ? 0 : (u(rng) < 0.85 ? 1 : 0));  // row 1 has no valid token
    }
  }
  return p;
}

//! TRL's formula in float64: the token-mean loss over `denominator` and d loss / d logp.
double oracle(const problem& p, double cap, double denominator, std::vector<double>& grad) {
  double loss = 0;
  grad.assign(p.B * p.T, 0.0);
  for (std::size_t b = 0; b < p.B; ++b) {
    double xs = 0, n = 0;
    for (std::size_t t = 0; t < p.T; ++t) {
      const std::size_t i = b * p.T + t;
      if (p.mask[i] != 0) xs += p.lp[i] - p.old[i], n += 1;
    }
    const double c = std::min(std::exp(xs / std::max(n, 1.0)), cap);
    for (std::size_t t = 0; t < p.T; ++t) {
      const std::size_t i = b * p.T + t;
      if (p.mask[i] == 0) continue;
      loss += -c * p.adv[i] * p.lp[i];
      grad[i] = -c * p.adv[i] / denominator;  // the ratio is detached: the gradient reaches logp only
    }
  }
  return loss / denominator;
}

template <class T>
ulorl::token_view<const T> view_of(const std::vector<T>& v, const problem& p) {
  return ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), p.B, p.T));
}

}  // namespace

TEST_CASE("sequence descriptor: a sequence-level objective defined outside the library runs through the row driver") {
  std::mt19937_64 rng(20261206);
  for (const std::size_t T : {std::size_t{1}, std::size_t{9}, std::size_t{70}})
    for (const double cap : {5.0, 1.05}) {
      INFO("T = " << T << " cap = " << cap);
      const problem p = random_problem(rng, 4, T);
      double tokens = 0;
      for (const auto m : p.mask) tokens += m;
      const double denominator = std::max(tokens, 1.0);
      ulorl::policy_loss_config cfg;
      cfg.normalizer = {ulorl::agg_mode::token_mean, denominator, 1.0};
      std::vector<double> g(p.B * T, -99.0), expect;
      const ulorl::policy_loss_inputs<double, std::uint8_t> in{view_of(p.lp, p), view_of(p.old, p), view_of(p.adv, p),
                                                               view_of(p.mask, p)};
      const auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), p.B, T));
      const auto res = ulorl::policy_loss_with(sequence_cispo_objective{cap}, in, gv, cfg);
      const double want = oracle(p, cap, denominator, expect);
      REQUIRE(res.loss == Approx(want).epsilon(1e-12).margin(1e-14));
      for (std::size_t i = 0; i < p.B * T; ++i) REQUIRE(g[i] == Approx(expect[i]).epsilon(1e-12).margin(1e-300));
      REQUIRE(res.metrics.tokens == tokens);

      // The built-in cispo (lo = 0: eps_low = 1; hi = cap: eps_high = cap - 1), fed every valid
      // token's log-ratio as its row's mean, gives the same loss and gradient.
      std::vector<double> old_mean = p.old;
      for (std::size_t b = 0; b < p.B; ++b) {
        double xs = 0, n = 0;
        for (std::size_t t = 0; t < T; ++t)
          if (p.mask[b * T + t] != 0) xs += p.lp[b * T + t] - p.old[b * T + t], n += 1;
        for (std::size_t t = 0; t < T; ++t) old_mean[b * T + t] = p.lp[b * T + t] - xs / std::max(n, 1.0);
      }
      ulorl::policy_loss_config builtin = cfg;
      builtin.objective.kind = ulorl::objective_kind::cispo;
      builtin.objective.eps_low = 1.0;
      builtin.objective.eps_high = cap - 1.0;
      builtin.objective.log_ratio_clamp = ulorl::no_limit;
      std::vector<double> g2(p.B * T, -99.0);
      const ulorl::policy_loss_inputs<double, std::uint8_t> in2{view_of(p.lp, p), view_of(old_mean, p), view_of(p.adv, p),
                                                                view_of(p.mask, p)};
      const auto res2 =
          ulorl::policy_loss(in2, ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g2.data(), p.B, T)), builtin);
      REQUIRE(res2.loss == Approx(res.loss).epsilon(1e-12).margin(1e-14));
      for (std::size_t i = 0; i < p.B * T; ++i) REQUIRE(g2[i] == Approx(g[i]).epsilon(1e-12).margin(1e-300));
      // Rows flagged clipped: the row's ratio above the cap (and a valid token with A > 0).
      double high = 0;
      for (std::size_t b = 0; b < p.B; ++b) {
        double xs = 0, n = 0;
        for (std::size_t t = 0; t < T; ++t)
          if (p.mask[b * T + t] != 0) xs += p.lp[b * T + t] - p.old[b * T + t], n += 1;
        if (n > 0 && std::exp(xs / n) > cap && p.adv[b * T] > 0) high += 1;
      }
      REQUIRE(res.metrics.seq_clipped_high == high);
    }
}

TEST_CASE("sequence descriptor: its validation runs before anything is written") {
  const problem p{1, 2, {-1.0, -2.0}, {-1.1, -2.1}, {1.0, 1.0}, {1, 1}};
  std::vector<double> g(2, -99.0);
  const ulorl::policy_loss_inputs<double, std::uint8_t> in{view_of(p.lp, p), view_of(p.old, p), view_of(p.adv, p),
                                                           view_of(p.mask, p)};
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 2.0, 1.0};
  REQUIRE_THROWS_WITH(ulorl::policy_loss_with(sequence_cispo_objective{-1.0}, in,
                                              ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), 1, 2)), cfg),
                      Catch::Contains("cap"));
  REQUIRE(g == std::vector<double>(2, -99.0));
}
