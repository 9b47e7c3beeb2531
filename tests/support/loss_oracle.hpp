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
#include <string>
#include <vector>

namespace oracle {

inline constexpr double inf = std::numeric_limits<double>::infinity();

struct spec {
  std::string objective = "ppo";  // ppo | gspo_own | gspo_mean | cispo | gmpo | sapo | pg
  double eps_low = 0.2, eps_high = 0.28;
  double dual_c = 0;   // 0: off
  double delta = 0;    // 0: off
  double bound = 20;   // token log-ratio clamp
  double seq_max = 10; // gspo
  double tau_pos = 1.0, tau_neg = 1.05;
  std::string kl = "none";  // none | k1 | abs | k2 | k3
  bool kl_straight_through = false;
  double kl_in = inf, kl_out = inf;
  bool kl_importance_weighted = false;
  double beta = 0;
  double ent_coef = 0;
  std::string agg = "token_mean";  // token_mean | seq_sum | seq_mean | constant
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
inline double loss(const spec& s, const batch& in, const std::vector<double>& lp_det, const std::vector<double>& lp,
                   long only_row = -1, long only_token = -1) {
  double total = 0;
  for (std::size_t b = 0; b < in.B; ++b) {
    if (only_row >= 0 && static_cast<long>(b) != only_row) continue;
    double n = 0;
    for (std::size_t t = 0; t < in.T; ++t) n += in.mask[b * in.T + t];
    double wrow = s.scale / s.denom;
    if (s.agg == "seq_mean") wrow = n > 0 ? s.scale / (s.denom * n) : 0.0;
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
        total += s.scale / s.denom * (-(as / n) * std::exp(ys / n) * (in.w.empty() ? 1.0 : std::exp(lws / n)));
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
      double term = s.objective == "gmpo" ? 0.0 : w * pg;
      if (s.beta != 0 && s.kl != "none") {
        const double ref = in.ref[i];
        double k = kl_value(s, lp[i], ref);
        if (s.kl_straight_through) {
          const double d = lp[i] - ref, d0 = lp_det[i] - ref;
          k = kl_value(s, lp_det[i], ref) + 0.5 * d * d - 0.5 * d0 * d0;
        }
        if (s.kl_importance_weighted) k *= ratio_for_kl;
        term += s.beta * k;
      }
      if (s.ent_coef != 0) term += -s.ent_coef * in.ent[i];
      total += wrow * term;
    }
  }
  return total;
}

//! Central finite-difference gradient of `loss` with respect to lp (detached parts held at lp0).
inline std::vector<double> fd_gradient(const spec& s, const batch& in, const std::vector<double>& lp0, double h = 1e-6) {
  std::vector<double> g(lp0.size());
  std::vector<double> lp = lp0;
  // gspo_mean couples every token of a row; gmpo's row term is always included for the row, its
  // per-token (KL, entropy) terms only for the token; the others need only the token itself.
  const bool row_coupled = s.objective == "gspo_mean";
  for (std::size_t i = 0; i < lp0.size(); ++i) {
    const long row = static_cast<long>(i / in.T), tok = row_coupled ? -1L : static_cast<long>(i % in.T);
    lp[i] = lp0[i] + h;
    const double up = loss(s, in, lp0, lp, row, tok);
    lp[i] = lp0[i] - h;
    const double dn = loss(s, in, lp0, lp, row, tok);
    lp[i] = lp0[i];
    g[i] = (up - dn) / (2 * h);
  }
  return g;
}

}  // namespace oracle
