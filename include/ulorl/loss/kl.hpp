// ulorl/loss/kl.hpp — KL estimators between the policy and the reference, value and gradient.
//
// With d = logp - ref and u = clamp(ref - logp, -in, in) (Schulman's "Approximating KL divergence"):
//   k1 = -u            (= d)             d k1 / d logp = 1
//   abs = |u|                            sign(d) (0 at 0)
//   k2 = u^2 / 2                         -u
//   k3 = exp(u) - u - 1  (>= 0)          -(exp(u) - 1)
// then kl = clamp(value, -out, out). Both clamps stop the gradient where active (torch's rule).
// verl: k3 with in = 20, out = 10, others unclamped; OpenRLHF: out = 10 on every estimator; NeMo-RL:
// both configurable. `straight_through` (verl's "k3+", "low_var_kl+" ...): the value of the chosen
// estimator and the unbiased k2 gradient d, never clamped.
// `importance_weighted` (TRL use_bias_correction_kl): kl * r with r the unclamped policy/old ratio.
// Used as a loss term (+ beta * kl, in policy_loss) or to penalise rewards (r - beta * kl, below).
// Each estimator is one descriptor over a lane type (core/simd.hpp), shared by the scalar loops, the
// SIMD row kernels and device code; docs/losses.md says how to add one.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/dispatch.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN

enum class kl_estimator { k1, abs, k2, k3 };

struct kl_config {
  kl_estimator estimator = kl_estimator::k3;
  bool straight_through = false;                                    //!< value of `estimator`, gradient of k2
  double input_clamp = std::numeric_limits<double>::infinity();     //!< |ref - logp| clamp (verl k3: 20)
  double output_clamp = std::numeric_limits<double>::infinity();    //!< |kl| clamp (verl k3 / OpenRLHF: 10)
  bool importance_weighted = false;                                 //!< TRL bias correction: kl * ratio
};

template <class T>
struct kl_params {
  kl_estimator estimator;
  bool straight_through;
  bool importance_weighted;
  T input_clamp;
  T output_clamp;
};
template <class T>
[[nodiscard]] constexpr kl_params<T> make_kl_params(const kl_config& c) noexcept {
  return {c.estimator, c.straight_through, c.importance_weighted, static_cast<T>(c.input_clamp),
          static_cast<T>(c.output_clamp)};
}

// ---- estimators -----------------------------------------------------------------------------------
//
// An estimator descriptor has a `name` and
//   template <class L> static void raw(V u, V u0, const kl_params<T>& p, V& value, V& dvalue);
// the estimate of u = clamp(u0, -input_clamp, input_clamp), u0 = ref - logp, and its derivative with
// respect to logp before the clamps (u0 is passed for exp's range: see k3). kl_lanes() applies the
// clamps, their gradient rule and straight-through around it: an estimator is its formula only.
// The built-in ones have a `kind` and are listed in `kl_registry`, the only list run-time dispatch
// consults; one defined outside the library runs through policy_loss_with().

namespace detail {
template <kl_estimator K>
struct builtin_estimator {
  static constexpr kl_estimator kind = K;
  kl_config config{};
};
}  // namespace detail

//! k1 = -u (= logp - ref), d/d logp = 1.
struct k1_estimator : detail::builtin_estimator<kl_estimator::k1> {
  static constexpr std::string_view name = "k1";
  template <class L>
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr void raw(typename L::V u, typename L::V, const kl_params<typename L::value_type>&,
                                                         typename L::V& v, typename L::V& dv) noexcept {
    v = -u, dv = L::splat(typename L::value_type(1));
  }
};
//! |u|, d/d logp = sign(logp - ref) (0 at 0).
struct abs_estimator : detail::builtin_estimator<kl_estimator::abs> {
  static constexpr std::string_view name = "abs";
  template <class L>
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr void raw(typename L::V u, typename L::V, const kl_params<typename L::value_type>&,
                                                         typename L::V& v, typename L::V& dv) noexcept {
    using T = typename L::value_type;
    v = L::select(u < T(0), -u, u);
    dv = L::select(u < T(0), L::splat(T(1)), L::select(u > T(0), L::splat(T(-1)), L::splat(T(0))));
  }
};
//! k2 = u^2 / 2, d/d logp = -u.
struct k2_estimator : detail::builtin_estimator<kl_estimator::k2> {
  static constexpr std::string_view name = "k2";
  template <class L>
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr void raw(typename L::V u, typename L::V, const kl_params<typename L::value_type>&,
                                                         typename L::V& v, typename L::V& dv) noexcept {
    v = typename L::value_type(0.5) * u * u, dv = -u;
  }
};
//! k3 = exp(u) - u - 1 (>= 0), d/d logp = -(exp(u) - 1); exp(u) - 1 - u without cancellation near 0.
struct k3_estimator : detail::builtin_estimator<kl_estimator::k3> {
  static constexpr std::string_view name = "k3";
  template <class L>
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr void raw(typename L::V u, typename L::V u0, const kl_params<typename L::value_type>& p,
                                                         typename L::V& v, typename L::V& dv) noexcept {
    using T = typename L::value_type;
    using C = detail::exp_constants<T>;
    // exp clamps to its own range: one clamp of u0 to both ranges, off the critical path of u.
    const T b = p.input_clamp;
    const T lo = -b > C::lo ? -b : C::lo, hi = b < C::hi ? b : C::hi;
    typename L::V e{};
    (void)L::exp_in_range(L::clamp(u0, L::splat(lo), L::splat(hi)), e);
    v = e, dv = -(e + u);
  }
};

//! Every built-in estimator: the only list run-time dispatch consults.
using kl_registry = descriptor_list<k1_estimator, abs_estimator, k2_estimator, k3_estimator>;
//! The estimators' names ({name, kind}, from the registry's descriptors).
inline constexpr auto kl_estimator_names = name_table(kl_registry{});

//! Calls f(descriptor) with the built-in estimator of c.estimator; an unknown one throws
//! ulorl::error naming `fn` and the argument "estimator".
template <class F>
decltype(auto) visit_kl_estimator(std::string_view fn, const kl_config& c, F&& f) {
  return detail::visit_kind(fn, "estimator", c.estimator, c, f, kl_registry{});
}

namespace detail {
//! The checks of kl_config that do not depend on the estimator.
inline void validate_kl_clamps(std::string_view fn, const kl_config& c) {
  if (!(c.input_clamp > 0.0)) detail::fail_value(fn, "input_clamp", c.input_clamp, "must be > 0 (infinity: none)");
  if (!(c.output_clamp > 0.0)) detail::fail_value(fn, "output_clamp", c.output_clamp, "must be > 0 (infinity: none)");
}
}  // namespace detail

//! Throws ulorl::error for an invalid KL configuration (an unknown estimator included).
inline void validate_kl(std::string_view fn, const kl_config& c) {
  visit_kl_estimator(fn, c, [](const auto&) {});
  detail::validate_kl_clamps(fn, c);
}

template <class L>
struct kl_lanes_value {
  typename L::V value;
  typename L::V grad;  //!< d value / d logp
};

//! One token's KL estimate and its derivative with respect to logp, lane-wise, for estimator E:
//! both clamps stop the gradient where active (torch's rule); straight-through takes the value of
//! E and the unclamped k2 gradient logp - ref.
template <class E, class L>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr kl_lanes_value<L> kl_lanes(typename L::V logp, typename L::V ref,
                                                                                const kl_params<typename L::value_type>& p) noexcept {
  using T = typename L::value_type;
  using V = typename L::V;
  const V u0 = ref - logp;
  const V ic = L::splat(p.input_clamp), oc = L::splat(p.output_clamp);
  const V u = L::clamp(u0, -ic, ic);
  V v{}, dv{};
  E::template raw<L>(u, u0, p, v, dv);
  const V value = L::clamp(v, -oc, oc);
  const typename L::M pass = (u0 == u) & (v == value);  // both clamps pass (NaN included: no)
  const V g = L::select(pass, dv, L::splat(T(0)));
  return {value, L::select(L::mask_of(p.straight_through), logp - ref, g)};
}

template <class T>
struct kl_value {
  T value;
  T grad;  //!< d value / d logp
};

namespace detail {
template <class T, class E0, class... E>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr kl_value<T> kl_term_in(T logp, T ref, const kl_params<T>& p,
                                                                  descriptor_list<E0, E...>) noexcept {
  if (p.estimator == E0::kind) {
    const auto k = kl_lanes<E0, simd::scalar_lanes<T>>(logp, ref, p);
    return {k.value, k.grad};
  }
  if constexpr (sizeof...(E) == 0) {
    // Only reachable with a configuration that validate_kl rejects: NaN, never a plausible value.
    return {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::quiet_NaN()};
  } else {
    return kl_term_in(logp, ref, p, descriptor_list<E...>{});
  }
}
}  // namespace detail

//! One token's KL estimate and its derivative with respect to logp (a validated configuration).
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr kl_value<T> kl_term(T logp, T ref, const kl_params<T>& p) noexcept {
  return detail::kl_term_in(logp, ref, p, kl_registry{});
}

// The batch functions are compiled with the including translation unit's ISA: tagged (core/simd.hpp).
inline namespace ULORL_ISA {

//! Element-wise KL estimate and gradient: kl[b,t], grad[b,t] = d kl[b,t] / d logp[b,t] (= gradient of
//! sum kl). Every element is computed (no mask), as the frameworks do. Validates before writing: a
//! KL value or a gradient beyond T's range is an error naming it (kl_term runs twice per token).
template <class T>
void kl_penalty(token_view<const T> log_prob, token_view<const T> ref_log_prob, token_view<T> kl, token_view<T> grad,
                const kl_config& cfg) {
  constexpr std::string_view fn = "kl_penalty";
  validate_layout(fn, "log_prob", log_prob);
  require_same_shape(fn, "ref_log_prob", ref_log_prob, "log_prob", log_prob);
  require_same_shape(fn, "kl", kl, "log_prob", log_prob);
  if (!grad.empty()) require_same_shape(fn, "grad", grad, "log_prob", log_prob);
  validate_kl(fn, cfg);
  if (cfg.importance_weighted) detail::fail(fn, "importance_weighted", "needs the policy ratio: use policy_loss");
  require_all_finite(fn, "log_prob", log_prob);
  require_all_finite(fn, "ref_log_prob", ref_log_prob);
  const auto p = make_kl_params<T>(cfg);
  for (std::size_t b = 0; b < log_prob.rows(); ++b) {
    const auto lp = log_prob.row(b), rf = ref_log_prob.row(b);
    for (std::size_t t = 0; t < lp.size(); ++t) {
      const auto v = kl_term(lp[t], rf[t], p);
      if (std::isfinite(v.value) && (grad.empty() || std::isfinite(v.grad))) continue;
      const std::int64_t at = static_cast<std::int64_t>(log_prob.flat_index(b, t));
      const std::string where = "row " + std::to_string(b) + ", token " + std::to_string(t);
      require_result_in_range<T>(fn, "kl", at, static_cast<double>(v.value), where);
      require_result_in_range<T>(fn, "grad", at, static_cast<double>(v.grad), where);
    }
  }
  for (std::size_t b = 0; b < log_prob.rows(); ++b) {
    const auto lp = log_prob.row(b), rf = ref_log_prob.row(b);
    const auto k = kl.row(b);
    for (std::size_t t = 0; t < lp.size(); ++t) {
      const auto v = kl_term(lp[t], rf[t], p);
      k[t] = v.value;
      if (!grad.empty()) grad(b, t) = v.grad;
    }
  }
}

//! KL-penalised token rewards: out[b,t] = (reward[b,t] - beta * kl[b,t]) * m[b,t] (verl
//! `apply_kl_penalty`, OpenRLHF `compute_reward`). The penalty is a reward: no gradient flows.
//! An absent mask (empty view): every token valid. Returns the masked mean KL (0 without valid tokens).
template <class T, class M>
double kl_penalized_rewards(token_view<const T> rewards, token_view<const T> log_prob, token_view<const T> ref_log_prob,
                            token_view<const M> mask, token_view<T> out, double beta, const kl_config& cfg) {
  constexpr std::string_view fn = "kl_penalized_rewards";
  validate_layout(fn, "rewards", rewards);
  require_same_shape(fn, "log_prob", log_prob, "rewards", rewards);
  require_same_shape(fn, "ref_log_prob", ref_log_prob, "rewards", rewards);
  require_same_shape(fn, "out", out, "rewards", rewards);
  mask = mask_or_all_valid(mask, rewards);
  require_same_shape(fn, "mask", mask, "rewards", rewards);
  require_binary_mask(fn, "mask", mask);
  require_finite(fn, "beta", beta);
  validate_kl(fn, cfg);
  if (cfg.importance_weighted) detail::fail(fn, "importance_weighted", "not meaningful for a reward penalty");
  require_all_finite(fn, "rewards", rewards);
  require_all_finite(fn, "log_prob", log_prob);
  require_all_finite(fn, "ref_log_prob", ref_log_prob);
  const auto p = make_kl_params<T>(cfg);
  const auto kl_at = [&](std::size_t b, std::size_t t) { return kl_term(log_prob(b, t), ref_log_prob(b, t), p).value; };
  const auto penalised = [&](std::size_t b, std::size_t t, T k) {
    return static_cast<T>(static_cast<double>(rewards(b, t)) - beta * static_cast<double>(k));
  };
  // An unclamped KL (k3 of a log-ratio of ~90 in float) can push the penalised reward past T's
  // range: rejected before anything is written, instead of writing +-inf.
  for (std::size_t b = 0; b < rewards.rows(); ++b)
    for (std::size_t t = 0; t < rewards.row_size(b); ++t)
      if (mask(b, t) != M(0) && !std::isfinite(penalised(b, t, kl_at(b, t))))
        detail::fail_at(fn, "log_prob", static_cast<std::int64_t>(log_prob.flat_index(b, t)), log_prob(b, t),
                        "reward - beta * kl overflows the element type (clamp the KL: input_clamp / output_clamp)");
  // The masked mean KL, before anything is written: a sum that overflows double is taken again as
  // the sum of k / n; a mean beyond the range is an error.
  double sum = 0, n = 0;
  for (std::size_t b = 0; b < rewards.rows(); ++b)
    for (std::size_t t = 0; t < rewards.row_size(b); ++t)
      if (mask(b, t) != M(0)) sum += static_cast<double>(kl_at(b, t)), n += 1;
  double mean = n > 0 ? sum / n : 0.0;
  if (!std::isfinite(mean)) {
    mean = 0;
    for (std::size_t b = 0; b < rewards.rows(); ++b)
      for (std::size_t t = 0; t < rewards.row_size(b); ++t)
        if (mask(b, t) != M(0)) mean += static_cast<double>(kl_at(b, t)) / n;
    require_result_in_range<double>(fn, "mean kl", -1, mean);
  }
  for (std::size_t b = 0; b < rewards.rows(); ++b)
    for (std::size_t t = 0; t < rewards.row_size(b); ++t)
      out(b, t) = mask(b, t) != M(0) ? penalised(b, t, kl_at(b, t)) : T(0);
  return mean;
}

}  // namespace ULORL_ISA

ULORL_NAMESPACE_END
