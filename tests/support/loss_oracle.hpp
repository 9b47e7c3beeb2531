// tests/support/loss_oracle.hpp — an independent float64 textbook implementation of the policy
// losses, written from the formulas of docs/losses.md / the golden README, NEVER calling ulorl.
//
// Stop-gradients are modelled the way autograd sees them: `loss(spec, in, lp_detached, lp)` reads
// the detached parts (CISPO's clipped weight, GSPO's sequence mean in the own-token variant) from
// `lp_detached` and everything differentiable from `lp`. A central finite difference of
// loss(spec, in, lp0, lp0 +- h e_i) is then the gradient autograd would compute.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace oracle {

inline constexpr double inf = std::numeric_limits<double>::infinity();

struct spec {
  std::string objective = "ppo";  // ppo | gspo_own | gspo_mean | cispo | gmpo | sapo | pg (others: throw)
  double eps_low = 0.2, eps_high = 0.28;
  double dual_c = 0;   // 0: off
  double delta = 0;    // 0: off
  double bound = 20;   // token log-ratio clamp
  double seq_max = 10; // gspo
  double tau_pos = 1.0, tau_neg = 1.05;
  std::string kl = "none";  // none | k1 | abs | k2 | k3 (others: throw)
  //! Value of the (clamped) estimator, gradient of the k2 term (lp - ref)^2 / 2, never clamped:
  //! verl's "k1+" / "abs+" / "mse+" / "low_var_kl+" (kl_estimate_grad - sg(kl_estimate_grad) + sg(kl)).
  bool kl_straight_through = false;
  double kl_in = inf, kl_out = inf;
  bool kl_importance_weighted = false;
  double beta = 0;
  double ent_coef = 0;
  //! token_mean:   sum_b sum_t L m / N
  //! seq_sum:      sum_b (sum_t L m) / S             (verl seq-mean-token-sum)
  //! seq_mean:     sum_b (sum_t L m / n_b) / S        (verl seq-mean-token-mean; empty rows add 0)
  //! seq_sum_norm: sum_b (sum_t L m) / C             (verl seq-mean-token-sum-norm, loss_scale_factor C)
  //! constant:     sum_b (sum_t L m) / C             (Dr. GRPO: C = B * max length)
  //! each times `scale`; any other name throws.
  std::string agg = "token_mean";
  double denom = 1;                // N, S or C of the global batch
  double scale = 1;
};

struct batch {
  std::size_t B = 0, T = 0;
  std::vector<double> old, adv, mask, ref, w, ent;  // row-major [B*T]; w/ref/ent may be empty
  double at(const std::vector<double>& v, std::size_t b, std::size_t t, double dflt) const {
    return v.empty() ? dflt : v[b * T + t];
  }
};

inline double clampd(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }

//! d loss / d L[b,t] of a valid token of a row with n valid tokens (the formulas above).
inline double row_weight(const spec& s, double n) {
  if (s.agg == "token_mean" || s.agg == "seq_sum" || s.agg == "seq_sum_norm" || s.agg == "constant") return s.scale / s.denom;
  if (s.agg == "seq_mean") return n > 0 ? s.scale / (s.denom * n) : 0.0;
  throw std::invalid_argument("oracle: unknown aggregation '" + s.agg + "'");
}

inline bool known_objective(const std::string& o) {
  return o == "ppo" || o == "gspo_own" || o == "gspo_mean" || o == "cispo" || o == "gmpo" || o == "sapo" || o == "pg";
}

//! KL estimate between policy and reference, value only (its gradient is what FD measures; the
//! straight-through variant is modelled as value(det) + (d^2/2)(lp) - (d^2/2)(det)).
inline double kl_value(const spec& s, double lp, double ref) {
  double u = ref - lp;
  u = clampd(u, -s.kl_in, s.kl_in);
  double v = 0;
  if (s.kl == "k1") v = -u;
  else if (s.kl == "abs") v = std::fabs(u);
  else if (s.kl == "k2") v = 0.5 * u * u;
  else if (s.kl == "k3") v = std::expm1(u) - u;
  else throw std::invalid_argument("oracle: unknown KL estimator '" + s.kl + "'");
  return clampd(v, -s.kl_out, s.kl_out);
}

inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

//! Per-token PPO-family objective for ratio r (a function of lp), textbook form.
inline double ppo_token(const spec& s, double r, double a) {
  const double r1 = s.delta > 0 ? std::min(r, s.delta) : r;
  const double l1 = -a * r1;
  const double l2 = -a * clampd(r, 1 - s.eps_low, 1 + s.eps_high);
  double l = std::max(l1, l2);
  if (a < 0 && s.dual_c > 0) l = std::min(l, -a * s.dual_c);
  return l;
}

//! The total loss of the batch; with `only_row` (and `only_token`) >= 0 just that row's (token's)
//! contribution, so that a finite difference is not drowned by the rounding of unrelated terms.
//! `parts` (optional) receives the summands one by one (objective, KL, entropy of every token,
//! gmpo's row term) in a fixed order.
inline double loss(const spec& s, const batch& in, const std::vector<double>& lp_det, const std::vector<double>& lp,
                   long only_row = -1, long only_token = -1, std::vector<double>* parts = nullptr) {
  if (!known_objective(s.objective)) throw std::invalid_argument("oracle: unknown objective '" + s.objective + "'");
  double total = 0;
  const auto add = [&](double v) {
    total += v;
    if (parts) parts->push_back(v);
  };
  for (std::size_t b = 0; b < in.B; ++b) {
    if (only_row >= 0 && static_cast<long>(b) != only_row) continue;
    double n = 0;
    for (std::size_t t = 0; t < in.T; ++t) n += in.mask[b * in.T + t];
    const double wrow = row_weight(s, n);
    // Sequence quantities.
    double xs = 0, xs_det = 0;
    for (std::size_t t = 0; t < in.T; ++t) {
      const std::size_t i = b * in.T + t;
      if (in.mask[i] == 0) continue;
      xs += lp[i] - in.old[i];
      xs_det += lp_det[i] - in.old[i];
    }
    const double nn = std::max(n, 1.0);
    if (s.objective == "gmpo") {
      if (n > 0) {
        double ys = 0, as = 0, lws = 0;
        for (std::size_t t = 0; t < in.T; ++t) {
          const std::size_t i = b * in.T + t;
          if (in.mask[i] == 0) continue;
          const double x = lp[i] - in.old[i], a = in.adv[i];
          const double sg = a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0);
          const double xc = clampd(x, -s.eps_low, s.eps_high);
          ys += sg * std::min(sg * x, sg * xc);
          as += a;
          if (!in.w.empty()) lws += std::log(in.w[i] + 1e-10);
        }
        add(s.scale / s.denom * (-(as / n) * std::exp(ys / n) * (in.w.empty() ? 1.0 : std::exp(lws / n))));
      }
    }
    for (std::size_t t = 0; t < in.T; ++t) {
      const std::size_t i = b * in.T + t;
      if (in.mask[i] == 0) continue;
      if (only_token >= 0 && static_cast<long>(t) != only_token) continue;
      const double a = in.adv[i], w = in.at(in.w, b, t, 1.0);
      const double x = lp[i] - in.old[i];
      const double r_tok = std::exp(clampd(x, -s.bound, s.bound));
      double pg = 0;
      double ratio_for_kl = r_tok;
      if (s.objective == "ppo") pg = ppo_token(s, r_tok, a);
      else if (s.objective == "cispo") {
        const double rdet = std::exp(clampd(lp_det[i] - in.old[i], -s.bound, s.bound));
        pg = -clampd(rdet, 1 - s.eps_low, 1 + s.eps_high) * a * lp[i];
      } else if (s.objective == "sapo") {
        const double tau = a > 0 ? s.tau_pos : s.tau_neg;
        pg = -sigmoid(tau * (r_tok - 1)) * (4 / tau) * a;
      } else if (s.objective == "pg") {
        pg = -a * lp[i];
      } else if (s.objective == "gspo_own" || s.objective == "gspo_mean") {
        const double rho = s.objective == "gspo_own" ? (lp[i] - lp_det[i]) + xs_det / nn : xs / nn;
        const double rs = std::exp(std::min(rho, s.seq_max));
        pg = ppo_token(s, rs, a);
        ratio_for_kl = rs;
      }
      if (s.objective != "gmpo") add(wrow * (w * pg));
      if (s.beta != 0 && s.kl != "none") {
        const double ref = in.ref[i];
        if (s.kl_straight_through) {
          const double d = lp[i] - ref, d0 = lp_det[i] - ref;
          if (s.kl_importance_weighted) {
            add(wrow * (s.beta * (kl_value(s, lp_det[i], ref) + 0.5 * d * d - 0.5 * d0 * d0) * ratio_for_kl));
          } else {
            add(wrow * (s.beta * kl_value(s, lp_det[i], ref)));  // detached: the same bits in every evaluation
            add(wrow * (s.beta * (0.5 * d * d - 0.5 * d0 * d0)));
          }
        } else {
          double k = kl_value(s, lp[i], ref);
          if (s.kl_importance_weighted) k *= ratio_for_kl;
          add(wrow * (s.beta * k));
        }
      }
      if (s.ent_coef != 0) add(wrow * (-s.ent_coef * in.ent[i]));
    }
  }
  return total;
}

//! Central finite-difference gradient of `loss` with respect to lp (detached parts held at lp0).
//! The two evaluations are differenced summand by summand: a large summand that does not depend on
//! lp (an objective clamped at a ratio of e^10 or e^20) then cancels exactly instead of drowning
//! the difference in its rounding error.
inline std::vector<double> fd_gradient(const spec& s, const batch& in, const std::vector<double>& lp0, double h = 1e-6) {
  std::vector<double> g(lp0.size());
  std::vector<double> lp = lp0, up, dn;
  // gspo_mean couples every token of a row; gmpo's row term is always included for the row, its
  // per-token (KL, entropy) terms only for the token; the others need only the token itself.
  const bool row_coupled = s.objective == "gspo_mean";
  for (std::size_t i = 0; i < lp0.size(); ++i) {
    const long row = static_cast<long>(i / in.T), tok = row_coupled ? -1L : static_cast<long>(i % in.T);
    up.clear(), dn.clear();
    lp[i] = lp0[i] + h;
    (void)loss(s, in, lp0, lp, row, tok, &up);
    lp[i] = lp0[i] - h;
    (void)loss(s, in, lp0, lp, row, tok, &dn);
    lp[i] = lp0[i];
    double diff = 0;
    for (std::size_t k = 0; k < up.size() && k < dn.size(); ++k) diff += up[k] - dn[k];
    if (up.size() != dn.size()) throw std::logic_error("oracle: summands differ between evaluations");
    g[i] = diff / (2 * h);
  }
  return g;
}

// ---- TRL GRPOTrainer._compute_loss, written from TRL's code / docs (TRL f2cd57710ae3) ------------
//   log_ratio = logp - old;  w = log_ratio (token) or sum_t(log_ratio m) / max(n_b, 1) (sequence)
//   coef_1 = exp(w) (no clamp);  coef_2 = clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
//   kl = exp(ref - logp) - (ref - logp) - 1, times coef_1 (before the delta cap) with
//        use_bias_correction_kl
//   coef_1 = min(coef_1, delta) when delta is set;  L = -min(coef_1 A, coef_2 A) + beta kl
//   grpo    mean_b (sum_t L m / max(n_b, 1)) / GA
//   bnpo    sum L m / max(N, 1) / GA
//   dr_grpo sum L m / (B max_completion_length) / GA
//   dapo    sum L m / (max(num_items_in_batch, 1) / num_processes)
// Advantages are per sequence in TRL: column 0 of each row of `in.adv` is used.
struct trl_spec {
  std::string loss_type = "grpo";  // grpo | bnpo | dr_grpo | dapo
  std::string level = "token";     // token | sequence
  double epsilon = 0.2, epsilon_high = 0.2;
  double delta = 0;                // 0: None
  double beta = 0;
  bool bias_correction_kl = false;
  double ga = 1, max_completion_length = 1, num_items_in_batch = 1, num_processes = 1;
};

//! TRL's loss of the batch; with `only_row` >= 0 only that row's contribution (its share of the
//! normaliser unchanged), so that a finite difference sees only the terms that depend on the row.
inline double trl_loss(const trl_spec& s, const batch& in, const std::vector<double>& lp, long only_row = -1) {
  double N = 0;
  for (double m : in.mask) N += m;
  const double B = static_cast<double>(in.B);
  double total = 0;
  for (std::size_t b = 0; b < in.B; ++b) {
    if (only_row >= 0 && static_cast<long>(b) != only_row) continue;
    double n = 0, xs = 0;
    for (std::size_t t = 0; t < in.T; ++t) {
      const std::size_t i = b * in.T + t;
      n += in.mask[i];
      xs += (lp[i] - in.old[i]) * in.mask[i];
    }
    const double a = in.adv[b * in.T];
    double row = 0;  // sum_t L m
    for (std::size_t t = 0; t < in.T; ++t) {
      const std::size_t i = b * in.T + t;
      if (in.mask[i] == 0) continue;
      double w;
      if (s.level == "token") w = lp[i] - in.old[i];
      else if (s.level == "sequence") w = xs / std::max(n, 1.0);
      else throw std::invalid_argument("oracle: unknown importance_sampling_level '" + s.level + "'");
      double coef_1 = std::exp(w);
      const double coef_2 = clampd(coef_1, 1 - s.epsilon, 1 + s.epsilon_high);
      double kl = 0;
      if (s.beta != 0) {
        const double d = in.ref[i] - lp[i];
        kl = std::exp(d) - d - 1;
        if (s.bias_correction_kl) kl *= coef_1;
      }
      if (s.delta != 0) coef_1 = std::min(coef_1, s.delta);
      double L = -std::min(coef_1 * a, coef_2 * a);
      if (s.beta != 0) L += s.beta * kl;
      row += L;
    }
    if (s.loss_type == "grpo") total += row / std::max(n, 1.0) / B / s.ga;
    else if (s.loss_type == "bnpo") total += row / std::max(N, 1.0) / s.ga;
    else if (s.loss_type == "dr_grpo") total += row / (B * s.max_completion_length) / s.ga;
    else if (s.loss_type == "dapo") total += row / (std::max(s.num_items_in_batch, 1.0) / s.num_processes);
    else throw std::invalid_argument("oracle: unknown loss_type '" + s.loss_type + "'");
  }
  return total;
}

//! Central finite-difference gradient of trl_loss (row-restricted: the sequence level couples a row).
inline std::vector<double> trl_fd_gradient(const trl_spec& s, const batch& in, const std::vector<double>& lp0, double h = 1e-6) {
  std::vector<double> g(lp0.size());
  std::vector<double> lp = lp0;
  for (std::size_t i = 0; i < lp0.size(); ++i) {
    const long row = static_cast<long>(i / in.T);
    lp[i] = lp0[i] + h;
    const double up = trl_loss(s, in, lp, row);
    lp[i] = lp0[i] - h;
    const double dn = trl_loss(s, in, lp, row);
    lp[i] = lp0[i];
    g[i] = (up - dn) / (2 * h);
  }
  return g;
}

}  // namespace oracle
