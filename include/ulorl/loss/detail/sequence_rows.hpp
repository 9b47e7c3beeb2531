// ulorl/loss/detail/sequence_rows.hpp — the rows of a sequence-level objective (GSPO, GMPO, or any
// descriptor with the sequence steps of loss/objectives.hpp): a pass summing the row's statistics
// over its valid tokens, the descriptor's row terms, then every token's step; where the row says so
// (through_mean), a last pass spreads the row's gradient sum over its valid tokens. The CUDA rows
// (kernels/.../policy_loss.cuh) run the same steps.
#pragma once

#include <cstddef>

#include "ulorl/core/config.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/row_sums.hpp"
#include "ulorl/loss/detail/rows.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {
inline namespace ULORL_ISA {

//! The rows of descriptor `obj` (its parameters in T; the KL estimator of cfg.kl, evaluated at run
//! time) into `res`.
template <class D, class T, class M, class Exec>
void sequence_rows(const D& obj, const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg, token_view<T> grad,
                   token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  static_assert(D::level == objective_level::sequence, "sequence_rows: a sequence-level objective descriptor");
  const token_loss_params<T, decltype(obj.template params<T>())> p{obj.template params<T>(), make_kl_params<T>(cfg.kl),
                                                                  static_cast<T>(cfg.kl_coef), static_cast<T>(cfg.entropy_coef)};
  const agg_normalizer& norm = cfg.normalizer;
  const bool has_ref = p.kl_coef != T(0), has_w = !in.weights.empty(), has_ent = p.entropy_coef != T(0);
  auto one_row = [&](std::size_t b, row_out& out) {
    const sequence_row<T, M> row(in, grad, norm, b);
    const auto &lp = row.lp, &old = row.old, &adv = row.adv;
    const auto& mk = row.mk;
    const auto& g = row.g;
    const std::size_t n = row.n, nb = row.nb;
    const double nd = row.nd, wd = row.wd;
    sequence_sums sums;
    for (std::size_t t = 0; t < n; ++t)
      if (mk[t] != M(0)) sums.add(D::row_token(lp[t], old[t], adv[t], has_w ? in.weights(b, t) : T(1), has_w, p.objective));
    const sequence_row_terms<T> terms = D::row(sums, nb > 0 ? nd : 0.0, has_w, norm, p.objective);
    double row_grad = 0;  // through_mean: d loss / d (row statistic), spread over the row
    bool row_low = false, row_high = false;
    for (std::size_t t = 0; t < n; ++t) {
      const bool valid = mk[t] != M(0);
      const T wt = has_w ? in.weights(b, t) : T(1);
      const T ref = has_ref ? in.ref_log_prob(b, t) : T(0);
      const sequence_token<T> k = D::token(lp[t], old[t], adv[t], wt, ref, valid, wd, terms, p, has_ref);
      row_grad += k.to_row_pg;
      row_grad += k.to_row_kl;
      row_low = row_low || (valid && k.flags.low);
      row_high = row_high || (valid && k.flags.high);
      const T e = has_ent ? in.entropy(b, t) : T(0);
      g[t] = valid ? static_cast<T>(k.grad) : T(0);
      fold_token(out.s, valid, k.pg, k.kl, k.ratio, k.flags, lp[t], old[t], e);
    }
    if (terms.through_mean && nb > 0) {
      const double spread = row_grad / nd;
      for (std::size_t t = 0; t < n; ++t)
        if (mk[t] != M(0)) g[t] = static_cast<T>(static_cast<double>(g[t]) + spread);
    }
    out.grad_nonfinite = !row_finite<T>(g);
    if (has_ent && !entropy_grad_row(gent.row(b), mk, wd, static_cast<double>(p.entropy_coef))) out.grad_nonfinite = true;
    out.has_direct = terms.has_direct;
    out.pg_direct = terms.pg_direct;
    out.sequence_clip = terms.sequence_clip;
    out.seq_low = row_low, out.seq_high = row_high;
    out.w = wd, out.tokens = nb;
  };
  run_rows(in.log_prob.rows(), static_cast<double>(p.kl_coef), static_cast<double>(p.entropy_coef), exec, one_row, res);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
