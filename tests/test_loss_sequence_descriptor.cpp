// The sequence-level extension point of ulorl/loss/objectives.hpp: a sequence-level objective with
// parameters of its own, defined here in one descriptor (its row sums, row terms and token step),
// runs through policy_loss_with and the same row driver as GSPO and GMPO. The objective is TRL's
// sequence-level CISPO (GRPOTrainer, importance_sampling_level="sequence", loss_type="cispo"): the
// row's ratio r_b = exp(sum_t m x / max(sum_t m, 1)), x = logp - old, and every token's loss
// -sg(min(r_b, cap)) A logp. Checked against a float64 oracle written from that definition, and
// against the built-in token-level cispo fed the row's mean log-ratio as every token's log-ratio
// (the form a caller without this descriptor would use) and the built-in sequence_cispo. The
// built-in sequence forms (sequence_cispo, sequence_sapo) are checked against a float64 oracle of
// TRL's sequence level with rollout weights and the importance-weighted KL term: the loss, and the
// gradient by central finite differences of the oracle (cispo's detached cap held fixed).
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
struct outside_sequence_cispo {
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
  [[nodiscard]] static ulorl::sequence_sums row_token(T lp, T old, T, T, bool,
                                                      const sequence_cispo_params<T>&) noexcept {
    return {static_cast<double>(lp) - static_cast<double>(old), 0.0, 0.0};
  }
  template <class T>
  [[nodiscard]] static ulorl::sequence_row_terms<T> row(const ulorl::sequence_sums& s, double nd, bool,
                                                        const ulorl::agg_normalizer&,
                                                        const sequence_cispo_params<T>&) noexcept {
    ulorl::sequence_row_terms<T> t{static_cast<T>(std::exp(s.a / std::max(nd, 1.0))), T(0)};
    t.sequence_clip = true;
    return t;
  }
  template <class T, class LP>
  [[nodiscard]] static ulorl::sequence_token<T> token(T lp, T old, T adv, T wt, T ref, bool, double wd,
                                                      const ulorl::sequence_row_terms<T>& row, const LP& p,
                                                      bool has_ref) noexcept {
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
      const auto res = ulorl::policy_loss_with(outside_sequence_cispo{cap}, in, gv, cfg);
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
      const ulorl::policy_loss_inputs<double, std::uint8_t> in2{view_of(p.lp, p), view_of(old_mean, p),
                                                                view_of(p.adv, p), view_of(p.mask, p)};
      const auto res2 = ulorl::policy_loss(
          in2, ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g2.data(), p.B, T)), builtin);
      REQUIRE(res2.loss == Approx(res.loss).epsilon(1e-12).margin(1e-14));
      for (std::size_t i = 0; i < p.B * T; ++i) REQUIRE(g2[i] == Approx(g[i]).epsilon(1e-12).margin(1e-300));
      // The built-in sequence_cispo gives the same loss, gradient and row flags.
      builtin.objective.kind = ulorl::objective_kind::sequence_cispo;
      std::vector<double> g3(p.B * T, -99.0);
      const auto res3 = ulorl::policy_loss(
          in, ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g3.data(), p.B, T)), builtin);
      REQUIRE(res3.loss == Approx(res.loss).epsilon(1e-12).margin(1e-14));
      for (std::size_t i = 0; i < p.B * T; ++i) REQUIRE(g3[i] == Approx(g[i]).epsilon(1e-12).margin(1e-300));
      REQUIRE(res3.metrics.seq_clipped_high == res.metrics.seq_clipped_high);
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
  REQUIRE_THROWS_WITH(
      ulorl::policy_loss_with(outside_sequence_cispo{-1.0}, in,
                              ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), 1, 2)), cfg),
      Catch::Contains("cap"));
  REQUIRE(g == std::vector<double>(2, -99.0));
}

namespace {

//! TRL's sequence level in float64 over a padded [B, T] problem: r_b = exp(mean of the valid x),
//! each valid token's term w_t l(r_b, A, logp_t) + beta r_b k3 (k3 = exp(ref - logp) - (ref - logp)
//! - 1) over `denominator`. cispo: l = -min(max(r_b, lo), hi) A logp with the clamp of `frozen`
//! (the detached cap, held fixed for the finite differences); sapo: l = -sigmoid(tau (r_b - 1))
//! (4 / tau) A, tau = tau_pos for A > 0, tau_neg otherwise.
struct sequence_problem {
  problem p;
  std::vector<double> w, ref;
};
double sequence_oracle(const sequence_problem& q, const std::vector<double>& lp, bool cispo, double lo, double hi,
                       double tau_pos, double tau_neg, double beta, double denominator,
                       const std::vector<double>* frozen, std::vector<double>* caps) {
  const problem& p = q.p;
  double loss = 0;
  if (caps) caps->assign(p.B, 0.0);
  for (std::size_t b = 0; b < p.B; ++b) {
    double xs = 0, n = 0;
    for (std::size_t t = 0; t < p.T; ++t)
      if (p.mask[b * p.T + t] != 0) xs += lp[b * p.T + t] - p.old[b * p.T + t], n += 1;
    const double r = std::exp(xs / std::max(n, 1.0));
    const double c = frozen ? (*frozen)[b] : std::min(std::max(r, lo), hi);
    if (caps) (*caps)[b] = c;
    for (std::size_t t = 0; t < p.T; ++t) {
      const std::size_t i = b * p.T + t;
      if (p.mask[i] == 0) continue;
      const double a = p.adv[i];
      double l;
      if (cispo) {
        l = -c * a * lp[i];
      } else {
        const double tau = a > 0 ? tau_pos : tau_neg;
        l = -(1.0 / (1.0 + std::exp(-tau * (r - 1.0)))) * (4.0 / tau) * a;
      }
      const double u = q.ref[i] - lp[i];
      loss += q.w[i] * l + beta * r * (std::exp(u) - u - 1.0);
    }
  }
  return loss / denominator;
}

}  // namespace

TEST_CASE("sequence forms: sequence_cispo and sequence_sapo against TRL's sequence level in float64") {
  std::mt19937_64 rng(1206);
  std::uniform_real_distribution<double> u(0, 1);
  for (const bool cispo : {true, false})
    for (const std::size_t T : {std::size_t{1}, std::size_t{7}, std::size_t{40}})
      for (const double beta : {0.0, 0.04}) {
        INFO((cispo ? "sequence_cispo" : "sequence_sapo") << " T = " << T << " beta = " << beta);
        sequence_problem q{random_problem(rng, 5, T), {}, {}};
        const problem& p = q.p;
        for (std::size_t i = 0; i < p.B * T; ++i) {
          q.w.push_back(0.5 + u(rng));
          q.ref.push_back(p.lp[i] + (u(rng) - 0.5) * 0.8);
        }
        double tokens = 0;
        for (const auto m : p.mask) tokens += m;
        const double denominator = std::max(tokens, 1.0);
        const double lo = 0.0, hi = 1.1, tau_pos = 1.0, tau_neg = 1.05;
        ulorl::policy_loss_config cfg;
        cfg.normalizer = {ulorl::agg_mode::token_mean, denominator, 1.0};
        cfg.objective.kind = cispo ? ulorl::objective_kind::sequence_cispo : ulorl::objective_kind::sequence_sapo;
        if (cispo) cfg.objective.eps_low = 1.0 - lo, cfg.objective.eps_high = hi - 1.0;  // sapo: unused
        cfg.objective.log_ratio_clamp = ulorl::no_limit;
        cfg.kl.importance_weighted = true;
        cfg.kl_coef = beta;
        ulorl::policy_loss_inputs<double, std::uint8_t> in{view_of(p.lp, p), view_of(p.old, p), view_of(p.adv, p),
                                                           view_of(p.mask, p)};
        in.weights = view_of(q.w, p);
        if (beta != 0.0) in.ref_log_prob = view_of(q.ref, p);
        std::vector<double> g(p.B * T, -99.0);
        const auto res = ulorl::policy_loss(
            in, ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), p.B, T)), cfg);
        std::vector<double> caps;
        const double want =
            sequence_oracle(q, p.lp, cispo, lo, hi, tau_pos, tau_neg, beta, denominator, nullptr, &caps);
        REQUIRE(res.loss == Approx(want).epsilon(1e-12).margin(1e-14));
        for (std::size_t i = 0; i < p.B * T; ++i) {
          INFO("token " << i);
          if (p.mask[i] == 0) {
            REQUIRE(g[i] == 0.0);
            continue;
          }
          const double h = 1e-6;
          std::vector<double> up = p.lp, down = p.lp;
          up[i] += h, down[i] -= h;
          const double fd =
              (sequence_oracle(q, up, cispo, lo, hi, tau_pos, tau_neg, beta, denominator, &caps, nullptr) -
               sequence_oracle(q, down, cispo, lo, hi, tau_pos, tau_neg, beta, denominator, &caps, nullptr)) /
              (2 * h);
          REQUIRE(g[i] == Approx(fd).epsilon(1e-6).margin(1e-9));
        }
      }
}
