// ulorl/loss/detail/gmpo_rows.hpp — the rows of GMPO: L_b = -mean_t(A) exp(mean_t y) w_b per row,
// y the sign-aware clipped log-ratio of each valid token and w_b the geometric mean of the row's
// rollout weights; a pass for the row statistics, then every token's gradient through mean_t y.
// The loss is a mean over rows: its denominator is the normaliser's.
#pragma once

#include <cmath>
#include <cstddef>

#include "ulorl/core/config.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/rows.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {
inline namespace ULORL_ISA {

template <class T, class M, class Exec>
void gmpo_rows(const policy_loss_inputs<T, M>& in, const agg_normalizer& norm, const token_loss_params<T>& p,
               token_view<T> grad, token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  const bool has_ref = p.kl_coef != T(0), has_w = !in.weights.empty(), has_ent = p.entropy_coef != T(0);
  const auto& op = p.objective;
  auto one_row = [&](std::size_t b, row_out& out) {
    const sequence_row<T, M> row(in, grad, norm, b);
    const auto &lp = row.lp, &old = row.old, &adv = row.adv;
    const auto& mk = row.mk;
    const auto& g = row.g;
    const std::size_t n = row.n, nb = row.nb;
    const double nd = row.nd, wd = row.wd;
    // Row pass: the clipped log-ratios, advantages and log-weights.
    double ys = 0, as = 0, lws = 0;
    for (std::size_t t = 0; t < n; ++t) {
      if (mk[t] == M(0)) continue;
      ys += static_cast<double>(gmpo_log_ratio<T>(lp[t] - old[t], adv[t], op).y);
      as += static_cast<double>(adv[t]);
      if (has_w) lws += std::log(static_cast<double>(in.weights(b, t)) + 1e-10);
    }
    double gm_coef = 0;  // d loss_b / d y_t (times 1/n_b)
    T seq_ratio = T(1);
    if (nb > 0) {
      const double ratio_b = loss_exp(ys / nd), adv_b = as / nd, wb = has_w ? loss_exp(lws / nd) : 1.0;
      const double lb = -adv_b * ratio_b * wb;
      out.has_direct = true;
      out.pg_direct = norm.scale / norm.denominator * lb;
      gm_coef = norm.scale / norm.denominator * lb / nd;
      seq_ratio = static_cast<T>(ratio_b);
    }
    for (std::size_t t = 0; t < n; ++t) {
      const bool valid = mk[t] != M(0);
      const T x = lp[t] - old[t];
      const auto gt = gmpo_log_ratio<T>(x, adv[t], op);
      T own = T(0);  // d loss / d logp_t through the KL term (before the agg weight)
      T kl = T(0);
      if (has_ref) {
        // Importance-weighted: by the token's own clamped ratio (the row ratio is a statistic of
        // clipped log-ratios).
        const auto tr = p.kl.importance_weighted ? clamped_ratio(lp[t], old[t], op.bound) : ratio_value<T>{T(0), T(1), T(0)};
        const auto k = sequence_token_kl(lp[t], in.ref_log_prob(b, t), tr.ratio, tr.dratio, p);
        kl = k.value;
        own += p.kl_coef * (k.grad + k.via_w);
      }
      const T e = has_ent ? in.entropy(b, t) : T(0);
      const T xc = clamp(x, -op.bound, op.bound);
      const ratio_lanes<simd::scalar_lanes<T>> r{x, xc, seq_ratio, T(0), exp_minus_one_minus_x(xc)};
      const clip_flags<simd::scalar_lanes<T>> f{(gt.flags & flag_clipped) != 0, (gt.flags & flag_clipped_low) != 0,
                                                 (gt.flags & flag_clipped_high) != 0, false};
      g[t] = valid ? static_cast<T>(wd * static_cast<double>(own) + gm_coef * static_cast<double>(gt.dy)) : T(0);
      // The objective is already in pg_loss (gm_coef carries its normaliser): the token adds 0.
      fold_token(out.s, valid, T(0), kl, r, f, lp[t], old[t], e);
    }
    if (has_ent) entropy_grad_row(gent.row(b), mk, wd, static_cast<double>(p.entropy_coef));
    out.w = wd, out.tokens = nb;
  };
  run_rows(in.log_prob.rows(), static_cast<double>(p.kl_coef), static_cast<double>(p.entropy_coef), exec, one_row, res);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
