// ulorl/loss/detail/gspo_rows.hpp — the rows of GSPO: a pass for the sequence log-ratio mean, then
// the clipped surrogate of every token on the sequence ratio, its gradient to the token itself
// (verl) or through the mean to every valid token of the row (OpenRLHF, TRL). The row and token
// steps are sequence_tokens.hpp's (shared with the CUDA kernels).
#pragma once

#include <cstddef>

#include "ulorl/core/config.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/rows.hpp"
#include "ulorl/loss/detail/sequence_tokens.hpp"
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
    const gspo_row<T> ratio = gspo_row_ratio<T>(xs, nb > 0 ? nd : 0.0, op);
    double row_grad = 0;  // through_mean: d loss / d (sequence log-ratio), spread over the row
    bool row_low = false, row_high = false;
    for (std::size_t t = 0; t < n; ++t) {
      const bool valid = mk[t] != M(0);
      const T wt = has_w ? in.weights(b, t) : T(1);
      const T ref = has_ref ? in.ref_log_prob(b, t) : T(0);
      const sequence_token<T> k = gspo_token(lp[t], old[t], adv[t], wt, ref, valid, wd, ratio, p, has_ref);
      row_grad += k.to_row_pg;
      row_grad += k.to_row_kl;
      row_low = row_low || (valid && k.flags.low);
      row_high = row_high || (valid && k.flags.high);
      const T e = has_ent ? in.entropy(b, t) : T(0);
      g[t] = valid ? static_cast<T>(k.grad) : T(0);
      fold_token(out.s, valid, k.pg, k.kl, k.ratio, k.flags, lp[t], old[t], e);
    }
    if (through_mean && nb > 0) {
      const double spread = row_grad / nd;
      for (std::size_t t = 0; t < n; ++t)
        if (mk[t] != M(0)) g[t] = static_cast<T>(static_cast<double>(g[t]) + spread);
    }
    out.grad_nonfinite = !row_finite<T>(g);
    if (has_ent && !entropy_grad_row(gent.row(b), mk, wd, static_cast<double>(p.entropy_coef))) out.grad_nonfinite = true;
    out.gspo = true;
    out.seq_low = row_low, out.seq_high = row_high;
    out.w = wd, out.tokens = nb;
  };
  run_rows(in.log_prob.rows(), static_cast<double>(p.kl_coef), static_cast<double>(p.entropy_coef), exec, one_row, res);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
