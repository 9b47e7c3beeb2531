// ulorl/loss/ratio.hpp — the importance ratio of the policy losses.
//
//   log r = clamp(logp - old_logp, -B, B),  r = exp(log r)         (verl / OpenRLHF: B = 20; TRL: none)
//   d r / d logp = r * [|logp - old_logp| <= B]                     (torch's closed-interval clamp rule)
//
// The rollout-correction weights (rho = pi_old / pi_rollout, truncated, masked, rejection
// sampling) are ulorl/loss/rollout_correction.hpp.
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

ULORL_NAMESPACE_END
