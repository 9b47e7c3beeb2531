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

//! Forces inlining of the per-token scalar math into the token loops: a call left in a loop body
//! (GCC's inliner gives up on the larger objectives) stops vectorisation.
#if defined(__GNUC__) || defined(__clang__)
#define ULORL_LOSS_INLINE __attribute__((always_inline))
#else
#define ULORL_LOSS_INLINE
#endif

ULORL_NAMESPACE_BEGIN

namespace detail {
template <class T>
struct exp_constants;
template <>
struct exp_constants<float> {
  // Arguments are clamped so that the exponent 2^n stays normal: results are finite and > 0.
  static constexpr float lo = -87.0f, hi = 88.3f;
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;  // Cephes split, n*ln2_hi exact
  static constexpr float round_magic = 12582912.0f;                      // 1.5 * 2^23
};
template <>
struct exp_constants<double> {
  static constexpr double lo = -708.0, hi = 709.0;
  static constexpr double log2e = 1.4426950408889634074;
  static constexpr double ln2_hi = 6.93145751953125e-1, ln2_lo = 1.42860682030941723212e-6;
  static constexpr double round_magic = 6755399441055744.0;  // 1.5 * 2^52
};
}  // namespace detail

namespace detail {
//! The body of loss_exp shared by the scalar functions and the SIMD loss kernel (`V` is T or a
//! GCC/Clang vector of T): for an already clamped x, rounds x*log2(e) to n with the magic-number
//! trick (exact, no libm call; `t` receives the biased n) and reduces r = x - n ln2 (|r| <= ln2/2).
//! exp(r) = 1 + (r + s) with s = r^2 q(r), q the Taylor series of (exp(r) - 1 - r) / r^2; the caller
//! multiplies by 2^n built from `t`. `s` is exp(x) - 1 - x itself whenever n = 0 (|x| < ln2/2: r = x
//! exactly), so the k3 estimators get that difference without cancellation and without a second
//! series. Truncation of q relative to 1/2: <= 9e-8 (float, to r^5/7!: about float's ulp at
//! |r| <= ln2/2), ~7e-17 (double, to r^11/13!).
template <class V, class T = V>
ULORL_HD ULORL_LOSS_INLINE constexpr void exp_poly(V x, V& t, V& r, V& s) noexcept {
  using C = exp_constants<T>;
  t = x * C::log2e + C::round_magic;
  const V n = t - C::round_magic;
  r = (x - n * C::ln2_hi) - n * C::ln2_lo;
  // q by Estrin's scheme (pairs in r, then in r^2 and r^4): a few dependent steps instead of a
  // Horner chain of 6 (float) / 11 (double) FMAs, which the loss kernel's latency is made of.
  const V r2 = r * r;
  V q;
  if constexpr (std::is_same_v<T, float>) {
    const V a01 = r * T(1.0 / 6) + T(0.5), a23 = r * T(1.0 / 120) + T(1.0 / 24), a45 = r * T(1.0 / 5040) + T(1.0 / 720);
    q = r2 * (r2 * a45 + a23) + a01;
  } else {
    const V p0 = r * (1.0 / 6.0) + 0.5, p1 = r * (1.0 / 120.0) + 1.0 / 24.0, p2 = r * (1.0 / 5040.0) + 1.0 / 720.0;
    const V p3 = r * (1.0 / 362880.0) + 1.0 / 40320.0, p4 = r * (1.0 / 39916800.0) + 1.0 / 3628800.0;
    const V p5 = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
    const V r4 = r2 * r2;
    const V q0 = r2 * p1 + p0, q1 = r2 * p3 + p2, q2 = r2 * p5 + p4;
    q = r4 * (r4 * q2 + q1) + q0;
  }
  s = q * r2;
}

//! exp(x) and exp(x) - 1 - x (`em1`) for x already clamped to exp's range: the one implementation
//! behind loss_exp and the SIMD loss kernel's lanes (`V` is T or a GCC/Clang vector of T, `IV` the
//! integer type or vector of the same width).
//! exp(x) = 2^n (1 + (r + s)) = 2^n (r + s) + 2^n, 2^n built in the exponent field directly.
template <class V, class T = V, class IV = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>>
ULORL_HD ULORL_LOSS_INLINE constexpr V exp_in_range(V x, V& em1) noexcept {
  using C = exp_constants<T>;
  using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  constexpr int mant = sizeof(T) == 4 ? 23 : 52;
  constexpr I bias = sizeof(T) == 4 ? 127 : 1023;
  V t, r, s;
  exp_poly<V, T>(x, t, r, s);
  const IV ni = std::bit_cast<IV>(t) - std::bit_cast<I>(C::round_magic);
  const V scale = std::bit_cast<V>(static_cast<IV>((ni + bias) << mant));
  const V e = (r + s) * scale + scale;
  em1 = t == C::round_magic ? s : (e - T(1)) - x;
  return e;
}
}  // namespace detail

//! exp(x) for float/double, accurate to a few ulp, branch-free (vectorises), finite for every finite
//! x: arguments are clamped to [-87, 88.3] (float) / [-708, 709] (double), so an overflowing ratio
//! saturates at ~2e38 / ~8e307 instead of inf and an underflow returns a tiny normal number.
//! `em1` receives exp(x) - 1 - x (of the clamped x), accurate near 0 (no cancellation: the series
//! below ln2/2, the direct difference above, where it is >= 0.06).
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr T loss_exp(T x, T& em1) noexcept {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  using C = detail::exp_constants<T>;
  return detail::exp_in_range<T>(x < C::lo ? C::lo : (x > C::hi ? C::hi : x), em1);
}

//! exp(x) (see the two-argument form).
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr T loss_exp(T x) noexcept {
  T em1{};
  return loss_exp(x, em1);
}

//! exp(u) - 1 - u without cancellation near 0 (the k3 KL estimator and its derivative need it).
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr T exp_minus_one_minus_x(T u) noexcept {
  T em1{};
  (void)loss_exp(u, em1);
  return em1;
}

//! Branch-free form of core's clamp_passes_gradient (closed interval): `&` instead of `&&` keeps
//! the token loops free of control flow, so that they vectorise.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr bool passes(T x, T lo, T hi) noexcept {
  return (lo <= x) & (x <= hi);
}

//! One token's importance ratio: value, derivative with respect to logp, and whether the clamp was
//! active. `bound` is the symmetric log-ratio clamp (infinity: none).
template <class T>
struct ratio_value {
  T log_ratio;  //!< clamped log-ratio
  T ratio;      //!< exp(clamped log-ratio)
  T dratio;     //!< d ratio / d logp (0 where the clamp is active)
};

template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr ratio_value<T> clamped_ratio(T logp, T old_logp, T bound) noexcept {
  const T x = logp - old_logp;
  const T xc = clamp(x, -bound, bound);
  const T r = loss_exp(xc);
  return {xc, r, passes(x, -bound, bound) ? r : T(0)};
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
