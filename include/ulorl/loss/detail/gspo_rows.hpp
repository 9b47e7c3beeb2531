// ulorl/loss/detail/gspo_rows.hpp — the rows of GSPO: a pass for the sequence log-ratio mean, then
// the clipped surrogate of every token on the sequence ratio, its gradient to the token itself
// (verl) or through the mean to every valid token of the row (OpenRLHF, TRL).
#pragma once

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
void gspo_rows(const policy_loss_inputs<T, M>& in, const agg_normalizer& norm, const token_loss_params<T>& p,
               token_view<T> grad, token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  const bool has_ref = p.kl_coef != T(0), has_w = !in.weights.empty(), has_ent = p.entropy_coef != T(0);
  const auto& op = p.objective;
  const bool through_mean = op.seq_gradient == sequence_gradient::through_mean;
  auto one_row = [&](std::size_t b, row_out& out) {
    const sequence_row<T, M> row(in, grad, norm, b);
    const auto &lp = row.lp, &old = row.old, &adv = row.adv;
    const auto& mk = row.mk;
    const auto& g = row.g;
    const std::size_t n = row.n, nb = row.nb;
    const double nd = row.nd, wd = row.wd;
    double xs = 0;
    for (std::size_t t = 0; t < n; ++t)
      if (mk[t] != M(0)) xs += static_cast<double>(lp[t]) - static_cast<double>(old[t]);
    const T st = static_cast<T>(xs / (nb > 0 ? nd : 1.0));
    const T rho = st > op.seq_max ? op.seq_max : st;
    const T seq_ratio = loss_exp(rho);
    const T seq_dratio = st <= op.seq_max ? seq_ratio : T(0);
    double row_grad = 0;  // through_mean: d loss / d (sequence log-ratio), spread over the row
    bool row_low = false, row_high = false;
    for (std::size_t t = 0; t < n; ++t) {
      const bool valid = mk[t] != M(0);
      const T x = lp[t] - old[t];
      const T wt = has_w ? in.weights(b, t) : T(1);
      const auto o = clipped_surrogate(seq_ratio, seq_dratio, adv[t], op);
      T own = T(0);  // d loss / d logp_t through this token's own terms (before the agg weight)
      if (!through_mean) own += wt * o.dloss;
      else row_grad += valid ? wd * static_cast<double>(wt * o.dloss) : 0.0;
      row_low = row_low || (valid && (o.flags & flag_clipped_low));
      row_high = row_high || (valid && (o.flags & flag_clipped_high));
      T kl = T(0);
      if (has_ref) {
        // Importance-weighted (TRL): by the sequence ratio.
        const auto k = sequence_token_kl(lp[t], in.ref_log_prob(b, t), seq_ratio, seq_dratio, p);
        kl = k.value;
        if (through_mean) {
          row_grad += valid ? wd * static_cast<double>(p.kl_coef * k.via_w) : 0.0;
          own += p.kl_coef * k.grad;
        } else {
          own += p.kl_coef * (k.grad + k.via_w);
        }
      }
      const T e = has_ent ? in.entropy(b, t) : T(0);
      const T xc = clamp(x, -op.bound, op.bound);
      const ratio_lanes<simd::scalar_lanes<T>> r{x, xc, seq_ratio, seq_dratio, exp_minus_one_minus_x(xc)};
      const clip_flags<simd::scalar_lanes<T>> f{(o.flags & flag_clipped) != 0, (o.flags & flag_clipped_low) != 0,
                                                 (o.flags & flag_clipped_high) != 0, (o.flags & flag_dual_clipped) != 0};
      g[t] = valid ? static_cast<T>(wd * static_cast<double>(own)) : T(0);
      fold_token(out.s, valid, wt * o.loss, kl, r, f, lp[t], old[t], e);
    }
    if (through_mean && nb > 0) {
      const double spread = row_grad / nd;
      for (std::size_t t = 0; t < n; ++t)
        if (mk[t] != M(0)) g[t] = static_cast<T>(static_cast<double>(g[t]) + spread);
    }
    if (has_ent) entropy_grad_row(gent.row(b), mk, wd, static_cast<double>(p.entropy_coef));
    out.gspo = true;
    out.seq_low = row_low, out.seq_high = row_high;
    out.w = wd, out.tokens = nb;
  };
  run_rows(in.log_prob.rows(), static_cast<double>(p.kl_coef), static_cast<double>(p.entropy_coef), exec, one_row, res);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
