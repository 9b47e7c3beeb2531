// ulorl/loss/detail/sequence_tokens.hpp — the per-row and per-token steps of the sequence-level
// objectives (GSPO, GMPO), written once for the CPU rows (gspo_rows.hpp, gmpo_rows.hpp) and the CUDA
// kernels (C++17, host and device). A row first sums its statistics over its valid tokens (in
// double); the row step turns them into the row's ratio; the token step gives each token's loss
// terms, gradient parts, metrics inputs and flags.
#pragma once

#include <cmath>

#include "ulorl/core/config.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {

//! The KL term of one token of a sequence-level row: the estimate, d kl / d logp through the
//! estimate, and, importance-weighted by `iw` (derivative `diw`), the part through the weight, which
//! the caller routes (to the token itself or spread over the row).
template <class T>
struct sequence_kl {
  T value;  //!< kl (times iw when importance-weighted)
  T grad;   //!< d kl / d logp through the estimate
  T via_w;  //!< kl * d iw / d logp (0 without importance weighting)
};
template <class T, class P>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr sequence_kl<T> sequence_token_kl(T lp, T ref, T iw, T diw,
                                                                                      const token_loss_params<T, P>& p) noexcept {
  const auto k = kl_term(lp, ref, p.kl);
  if (!p.kl.importance_weighted) return {k.value, k.grad, T(0)};
  return {k.value * iw, k.grad * iw, k.value * diw};
}

//! One token's contribution to its row (both objectives): the objective and KL terms for the row
//! sums, the ratio and flags for the metrics, and the token's gradient parts.
template <class T>
struct sequence_token {
  T pg;                                        //!< weight * objective (0 for gmpo: the row carries it)
  T kl;                                        //!< KL estimate (weighted when importance-weighted)
  ratio_lanes<simd::scalar_lanes<T>> ratio;    //!< for fold_token's metrics
  clip_flags<simd::scalar_lanes<T>> flags;     //!< for fold_token's metrics
  double grad;                                 //!< d loss / d logp of the token itself (agg weight included)
  //! gspo through_mean: this token's parts of d loss / d (sequence log-ratio) (objective, KL weight),
  //! which the row sums in this order
  double to_row_pg, to_row_kl;
};

// ---- GSPO ------------------------------------------------------------------------------------------

//! The row's sequence ratio exp(min(mean x, seq_max)) and its derivative, from xs = sum of the valid
//! tokens' log-ratios over nd valid tokens (nd 0: a row without valid tokens).
template <class T>
struct gspo_row {
  T ratio, dratio;
};
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr gspo_row<T> gspo_row_ratio(double xs, double nd,
                                                                                const objective_params<T>& op) noexcept {
  const T st = static_cast<T>(xs / (nd > 0 ? nd : 1.0));
  const T rho = st > op.seq_max ? op.seq_max : st;
  const T r = loss_exp(rho);
  return {r, st <= op.seq_max ? r : T(0)};
}

//! GSPO's token step: the clipped surrogate on the row's ratio, its gradient to the token itself
//! (verl) or, through_mean, through the mean log-ratio to every valid token (OpenRLHF, TRL: summed
//! from `to_row_pg`, `to_row_kl`, spread by the caller); KL importance-weighted by the sequence ratio (TRL).
template <class T, class P>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr sequence_token<T> gspo_token(T lp, T old, T adv, T wt, T ref, bool valid,
                                                                                  double wd, const gspo_row<T>& row,
                                                                                  const token_loss_params<T, P>& p,
                                                                                  bool has_ref) noexcept {
  const auto& op = p.objective;
  const bool through_mean = op.seq_gradient == sequence_gradient::through_mean;
  const T x = lp - old;
  const auto o = clipped_surrogate(row.ratio, row.dratio, adv, op);
  sequence_token<T> s{};
  T own = T(0);  // d loss / d logp_t through this token's own terms (before the agg weight)
  if (!through_mean) own += wt * o.dloss;
  else s.to_row_pg = valid ? wd * static_cast<double>(wt * o.dloss) : 0.0;
  if (has_ref) {
    const auto k = sequence_token_kl(lp, ref, row.ratio, row.dratio, p);
    s.kl = k.value;
    if (through_mean) {
      s.to_row_kl = valid ? wd * static_cast<double>(p.kl_coef * k.via_w) : 0.0;
      own += p.kl_coef * k.grad;
    } else {
      own += p.kl_coef * (k.grad + k.via_w);
    }
  }
  const T xc = clamp(x, -op.bound, op.bound);
  s.ratio = {x, xc, row.ratio, row.dratio, exp_minus_one_minus_x(xc)};
  s.flags = {(o.flags & flag_clipped) != 0, (o.flags & flag_clipped_low) != 0, (o.flags & flag_clipped_high) != 0,
             (o.flags & flag_dual_clipped) != 0};
  s.pg = wt * o.loss;
  s.grad = wd * static_cast<double>(own);
  return s;
}

// ---- GMPO ------------------------------------------------------------------------------------------

//! GMPO's row step from the valid tokens' sums (ys: clipped log-ratios y, as: advantages, lws: log
//! rollout weights): the row loss L_b = -mean(A) exp(mean y) w_b over the normaliser (`pg_direct`),
//! d loss / d y_t (`coef`, for every valid token) and the row ratio for the metrics.
template <class T>
struct gmpo_row {
  bool has_direct;
  double pg_direct, coef;
  T ratio;
};
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE gmpo_row<T> gmpo_row_terms(double ys, double as, double lws, double nd, bool has_w,
                                                                      const agg_normalizer& norm) noexcept {
  if (!(nd > 0)) return {false, 0.0, 0.0, T(1)};
  const double ratio_b = loss_exp(ys / nd), adv_b = as / nd, wb = has_w ? loss_exp(lws / nd) : 1.0;
  const double lb = -adv_b * ratio_b * wb;
  return {true, norm.scale / norm.denominator * lb, norm.scale / norm.denominator * lb / nd, static_cast<T>(ratio_b)};
}
//! A rollout weight's term of lws (the geometric mean's log).
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE double gmpo_log_weight(double w) noexcept { return std::log(w + 1e-10); }

//! GMPO's token step: the gradient through mean y (row.coef) and the KL term (importance-weighted by
//! the token's own clamped ratio: the row ratio is a statistic of clipped log-ratios). The objective
//! is the row's (pg 0 here).
template <class T, class P>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr sequence_token<T> gmpo_token(T lp, T old, T adv, T ref, double wd,
                                                                                  const gmpo_row<T>& row,
                                                                                  const token_loss_params<T, P>& p,
                                                                                  bool has_ref) noexcept {
  const auto& op = p.objective;
  const T x = lp - old;
  const auto gt = gmpo_log_ratio<T>(x, adv, op);
  sequence_token<T> s{};
  T own = T(0);  // d loss / d logp_t through the KL term (before the agg weight)
  if (has_ref) {
    const auto tr = p.kl.importance_weighted ? clamped_ratio(lp, old, op.bound) : ratio_value<T>{T(0), T(1), T(0)};
    const auto k = sequence_token_kl(lp, ref, tr.ratio, tr.dratio, p);
    s.kl = k.value;
    own += p.kl_coef * (k.grad + k.via_w);
  }
  const T xc = clamp(x, -op.bound, op.bound);
  s.ratio = {x, xc, row.ratio, T(0), exp_minus_one_minus_x(xc)};
  s.flags = {(gt.flags & flag_clipped) != 0, (gt.flags & flag_clipped_low) != 0, (gt.flags & flag_clipped_high) != 0, false};
  s.pg = T(0);
  s.grad = wd * static_cast<double>(own) + row.coef * static_cast<double>(gt.dy);
  return s;
}

}  // namespace detail
ULORL_NAMESPACE_END
