// ulorl/loss/ratio.hpp — the importance ratio of the policy losses and the rollout-correction weights.
//
//   log r = clamp(logp - old_logp, -B, B),  r = exp(log r)         (verl / OpenRLHF: B = 20; TRL: none)
//   d r / d logp = r * [|logp - old_logp| <= B]                     (torch's closed-interval clamp rule)
//
// Rollout correction (truncated importance sampling, Yao et al. 2025 "Your efficient RL framework
// secretly brings you off-policy RL"; verl `rollout_is`): the trainer's old policy and the inference
// engine disagree, so each token (or sequence) is reweighted by rho = exp(old_logp - rollout_logp),
// truncated (`min(rho, C)`) or masked (`rho > C -> 0`). The weight is detached: a separate
// multiplicative factor on the per-token loss, never differentiated.
//
// `exp` here is ulorl's own branch-free exponential (`loss_exp`): the same bits on every CPU path
// and the CUDA kernels, and vectorisable by the compiler without -ffast-math (libm's exp is not).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"

ULORL_NAMESPACE_BEGIN

//! exp(x) for float/double, accurate to a few ulp, branch-free (vectorises), finite for every finite
//! x: arguments are clamped to [-87, 88.3] (float) / [-708, 709] (double), so an overflowing ratio
//! saturates at ~2e38 / ~8e307 instead of inf and an underflow returns a tiny normal number.
//! `em1` receives exp(x) - 1 - x (of the clamped x), accurate near 0 (no cancellation: the series
//! below ln2/2, the direct difference above, where it is >= 0.06).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr T loss_exp(T x, T& em1) noexcept {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  using C = detail::exp_constants<T>;
  return detail::exp_in_range<T>(x < C::lo ? C::lo : (x > C::hi ? C::hi : x), em1);
}

//! exp(x) (see the two-argument form).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr T loss_exp(T x) noexcept {
  T em1{};
  return loss_exp(x, em1);
}

//! exp(u) - 1 - u without cancellation near 0 (the k3 KL estimator and its derivative need it).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr T exp_minus_one_minus_x(T u) noexcept {
  T em1{};
  (void)loss_exp(u, em1);
  return em1;
}

//! Branch-free form of core's clamp_passes_gradient (closed interval): `&` instead of `&&` keeps
//! the token loops free of control flow, so that they vectorise.
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr bool passes(T x, T lo, T hi) noexcept {
  return (lo <= x) & (x <= hi);
}

//! One token's importance ratio, lane-wise (`L`: core/simd.hpp's lane types): the raw log-ratio
//! x = logp - old, its clamp to [-bound, bound] (bound = infinity: none), the ratio, its derivative
//! with respect to logp (0 where the clamp is active; NaN included) and exp(log r) - 1 - log r, the
//! k3 estimate of KL(old || new) the metrics report.
template <class L>
struct ratio_lanes {
  using V = typename L::V;
  V x;          //!< logp - old_logp
  V log_ratio;  //!< clamp(x, -bound, bound)
  V ratio;      //!< exp(log_ratio)
  V dratio;     //!< d ratio / d logp
  V k3;         //!< (ratio - 1) - log_ratio, without cancellation near 0
};

template <class L>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr ratio_lanes<L> importance_ratio(typename L::V logp, typename L::V old_logp,
                                                                                     typename L::value_type bound) noexcept {
  using T = typename L::value_type;
  using V = typename L::V;
  using C = detail::exp_constants<T>;
  const V x = logp - old_logp;
  const V xc = L::clamp(x, L::splat(-bound), L::splat(bound));
  // exp clamps its argument to its own range: one clamp of x to both ranges gives the same value,
  // off the critical path of xc.
  const T lo = -bound > C::lo ? -bound : C::lo, hi = bound < C::hi ? bound : C::hi;
  V k3{};
  const V r = L::exp_in_range(L::clamp(x, L::splat(lo), L::splat(hi)), k3);
  return {x, xc, r, L::select(x == xc, r, L::splat(T(0))), k3};
}

//! One token's importance ratio (scalar form of importance_ratio).
template <class T>
struct ratio_value {
  T log_ratio;  //!< clamped log-ratio
  T ratio;      //!< exp(clamped log-ratio)
  T dratio;     //!< d ratio / d logp (0 where the clamp is active)
};

template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr ratio_value<T> clamped_ratio(T logp, T old_logp, T bound) noexcept {
  const auto r = importance_ratio<simd::scalar_lanes<T>>(logp, old_logp, bound);
  return {r.log_ratio, r.ratio, r.dratio};
}

// ---- rollout correction weights (batch) ---------------------------------------------------------

//! Granularity of the rollout-correction ratio rho = pi_old / pi_rollout.
enum class rollout_is_level {
  token,      //!< rho_t = exp(old_t - rollout_t)
  sequence,   //!< rho_b = exp(sum_t (old - rollout) m): the product of the token ratios
  geometric,  //!< rho_b = exp(mean_t (old - rollout) m): their geometric mean
};
//! What happens above the threshold.
enum class rollout_is_mode {
  truncate,  //!< TIS: w = min(rho, threshold)
  mask,      //!< MIS: w = rho if lower <= rho <= threshold else 0 (the token/sequence is dropped)
};

struct rollout_correction_config {
  rollout_is_level level = rollout_is_level::token;
  rollout_is_mode mode = rollout_is_mode::truncate;
  double threshold = 2.0;          //!< upper bound C (> 0)
  double lower_threshold = 0.0;    //!< mask mode only: rho below it is masked too
  double log_ratio_clamp = 20.0;   //!< log rho clamped before exp (sequence sums can be large)
};

//! Counts of what the correction did, mergeable over micro-batches.
struct rollout_correction_stats {
  double tokens = 0;       //!< valid tokens seen
  double truncated = 0;    //!< valid tokens whose weight was truncated or masked
  double weight_sum = 0;   //!< sum of weights over valid tokens
};

//! Writes detached rollout-correction weights (0 on masked tokens). `mask` may be empty (every
//! token valid). Validates every input before writing.
template <class T, class M>
rollout_correction_stats rollout_correction_weights(token_view<const T> old_log_prob, token_view<const T> rollout_log_prob,
                                                    token_view<const M> mask, const rollout_correction_config& cfg,
                                                    token_view<T> weights) {
  constexpr std::string_view fn = "rollout_correction_weights";
  validate_layout(fn, "old_log_prob", old_log_prob);
  require_same_shape(fn, "rollout_log_prob", rollout_log_prob, "old_log_prob", old_log_prob);
  require_same_shape(fn, "weights", weights, "old_log_prob", old_log_prob);
  if (!mask.empty()) {
    require_same_shape(fn, "mask", mask, "old_log_prob", old_log_prob);
    require_binary_mask(fn, "mask", mask);
  }
  require_positive(fn, "threshold", cfg.threshold);
  require_non_negative(fn, "lower_threshold", cfg.lower_threshold);
  if (!(cfg.lower_threshold <= cfg.threshold)) detail::fail_value(fn, "lower_threshold", cfg.lower_threshold, "must be <= threshold");
  if (!(cfg.log_ratio_clamp > 0)) detail::fail_value(fn, "log_ratio_clamp", cfg.log_ratio_clamp, "must be > 0");
  require_all_finite(fn, "old_log_prob", old_log_prob);
  require_all_finite(fn, "rollout_log_prob", rollout_log_prob);
  // Each token's log-ratio must be finite too: finite inputs near the double range overflow, and a
  // sequence sum holding both +inf and -inf would be NaN.
  for (std::size_t b = 0; b < old_log_prob.rows(); ++b) {
    const auto o = old_log_prob.row(b), r = rollout_log_prob.row(b);
    for (std::size_t t = 0; t < o.size(); ++t)
      if (!std::isfinite(static_cast<double>(o[t]) - static_cast<double>(r[t])))
        detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(rollout_log_prob.flat_index(b, t)), r[t],
                        "old_log_prob - rollout_log_prob overflows");
  }

  const double bound = cfg.log_ratio_clamp;
  auto bounded = [&](double rho) {
    if (cfg.mode == rollout_is_mode::truncate) return rho > cfg.threshold ? cfg.threshold : rho;
    return (rho > cfg.threshold || rho < cfg.lower_threshold) ? 0.0 : rho;
  };
  rollout_correction_stats st;
  for (std::size_t b = 0; b < old_log_prob.rows(); ++b) {
    const auto o = old_log_prob.row(b), r = rollout_log_prob.row(b);
    const auto w = weights.row(b);
    auto valid = [&](std::size_t t) { return mask.empty() || mask(b, t) != M(0); };
    double seq = 0, n = 0;
    if (cfg.level != rollout_is_level::token) {
      for (std::size_t t = 0; t < o.size(); ++t)
        if (valid(t)) seq += static_cast<double>(o[t]) - static_cast<double>(r[t]), n += 1;
      if (cfg.level == rollout_is_level::geometric && n > 0) seq /= n;
    }
    const double seq_rho = loss_exp(clamp(seq, -bound, bound));
    for (std::size_t t = 0; t < o.size(); ++t) {
      double wt = 0;
      if (valid(t)) {
        const double rho = cfg.level == rollout_is_level::token
                               ? loss_exp(clamp(static_cast<double>(o[t]) - static_cast<double>(r[t]), -bound, bound))
                               : seq_rho;
        wt = bounded(rho);
        st.truncated += wt != rho;
        st.tokens += 1;
        st.weight_sum += wt;
      }
      w[t] = static_cast<T>(wt);
    }
  }
  return st;
}

ULORL_NAMESPACE_END
