// ulorl/loss/detail/gmpo_rows.hpp — the rows of GMPO: L_b = -mean_t(A) exp(mean_t y) w_b per row,
// y the sign-aware clipped log-ratio of each valid token and w_b the geometric mean of the row's
// rollout weights; a pass for the row statistics, then every token's gradient through mean_t y.
// The loss is a mean over rows: its denominator is the normaliser's. The row and token steps are
// sequence_tokens.hpp's (shared with the CUDA kernels).
#pragma once

#include <cmath>
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
      if (has_w) lws += gmpo_log_weight(static_cast<double>(in.weights(b, t)));
    }
    const gmpo_row<T> row_terms = gmpo_row_terms<T>(ys, as, lws, nb > 0 ? nd : 0.0, has_w, norm);
    out.has_direct = row_terms.has_direct;
    out.pg_direct = row_terms.pg_direct;
    for (std::size_t t = 0; t < n; ++t) {
      const bool valid = mk[t] != M(0);
      const T ref = has_ref ? in.ref_log_prob(b, t) : T(0);
      const sequence_token<T> k = gmpo_token(lp[t], old[t], adv[t], ref, wd, row_terms, p, has_ref);
      const T e = has_ent ? in.entropy(b, t) : T(0);
      g[t] = valid ? static_cast<T>(k.grad) : T(0);
      // The objective is already in pg_loss (row_terms.coef carries its normaliser): the token adds 0.
      fold_token(out.s, valid, k.pg, k.kl, k.ratio, k.flags, lp[t], old[t], e);
    }
    out.grad_nonfinite = !row_finite<T>(g);
    if (has_ent && !entropy_grad_row(gent.row(b), mk, wd, static_cast<double>(p.entropy_coef))) out.grad_nonfinite = true;
    out.w = wd, out.tokens = nb;
  };
  run_rows(in.log_prob.rows(), static_cast<double>(p.kl_coef), static_cast<double>(p.entropy_coef), exec, one_row, res);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
