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
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
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

inline void validate_kl(std::string_view fn, const kl_config& c) {
  require_known(fn, "estimator", c.estimator, kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3);
  if (!(c.input_clamp > 0.0)) detail::fail_value(fn, "input_clamp", c.input_clamp, "must be > 0 (infinity: none)");
  if (!(c.output_clamp > 0.0)) detail::fail_value(fn, "output_clamp", c.output_clamp, "must be > 0 (infinity: none)");
}

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

template <class T>
struct kl_value {
  T value;
  T grad;  //!< d value / d logp
};

//! One token's KL estimate and its derivative with respect to logp, the estimator fixed at compile
//! time (the vectorised loops use this form).
template <kl_estimator E, class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr kl_value<T> kl_term_t(T logp, T ref, const kl_params<T>& p) noexcept {
  const T u0 = ref - logp;
  const T u = clamp(u0, -p.input_clamp, p.input_clamp);
  const bool pass_in = u == u0;  // passes(u0, -c, c), NaN included
  T v, dv;  // dv: d value / d logp before the clamps
  if constexpr (E == kl_estimator::k1) {
    v = -u, dv = T(1);
  } else if constexpr (E == kl_estimator::abs) {
    v = u < T(0) ? -u : u, dv = u < T(0) ? T(1) : (u > T(0) ? T(-1) : T(0));
  } else if constexpr (E == kl_estimator::k2) {
    v = T(0.5) * u * u, dv = -u;
  } else {
    const T e = exp_minus_one_minus_x(u);  // exp(u) - 1 - u, accurate near 0
    v = e, dv = -(e + u);
  }
  const T value = clamp(v, -p.output_clamp, p.output_clamp);
  const bool pass_out = value == v;
  // straight_through ? d : g, written as arithmetic (both finite) so that a loop-invariant flag
  // does not become control flow inside vectorised loops.
  const T st = p.straight_through ? T(1) : T(0);
  const T g = (pass_in & pass_out) ? dv : T(0);
  const T grad = (logp - ref) * st + g * (T(1) - st);
  return {value, grad};
}

//! One token's KL estimate and its derivative with respect to logp.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr kl_value<T> kl_term(T logp, T ref, const kl_params<T>& p) noexcept {
  switch (p.estimator) {
    case kl_estimator::k1: return kl_term_t<kl_estimator::k1>(logp, ref, p);
    case kl_estimator::abs: return kl_term_t<kl_estimator::abs>(logp, ref, p);
    case kl_estimator::k2: return kl_term_t<kl_estimator::k2>(logp, ref, p);
    default: return kl_term_t<kl_estimator::k3>(logp, ref, p);
  }
}

//! Element-wise KL estimate and gradient: kl[b,t], grad[b,t] = d kl[b,t] / d logp[b,t] (= gradient of
//! sum kl). Every element is computed (no mask), as the frameworks do. Validates before writing.
template <class T>
void kl_penalty(token_view<const T> log_prob, token_view<const T> ref_log_prob, const kl_config& cfg, token_view<T> kl,
                token_view<T> grad) {
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
//! `mask` may be empty. Returns the masked mean KL (0 without valid tokens).
template <class T, class M>
double kl_penalized_rewards(token_view<const T> rewards, token_view<const T> log_prob, token_view<const T> ref_log_prob,
                            token_view<const M> mask, double beta, const kl_config& cfg, token_view<T> out) {
  constexpr std::string_view fn = "kl_penalized_rewards";
  validate_layout(fn, "rewards", rewards);
  require_same_shape(fn, "log_prob", log_prob, "rewards", rewards);
  require_same_shape(fn, "ref_log_prob", ref_log_prob, "rewards", rewards);
  require_same_shape(fn, "out", out, "rewards", rewards);
  if (!mask.empty()) {
    require_same_shape(fn, "mask", mask, "rewards", rewards);
    require_binary_mask(fn, "mask", mask);
  }
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
      if ((mask.empty() || mask(b, t) != M(0)) && !std::isfinite(penalised(b, t, kl_at(b, t))))
        detail::fail_at(fn, "log_prob", static_cast<std::int64_t>(log_prob.flat_index(b, t)), log_prob(b, t),
                        "reward - beta * kl overflows the element type (clamp the KL: input_clamp / output_clamp)");
  double sum = 0, n = 0;
  for (std::size_t b = 0; b < rewards.rows(); ++b) {
    for (std::size_t t = 0; t < rewards.row_size(b); ++t) {
      const bool valid = mask.empty() || mask(b, t) != M(0);
      const auto k = kl_at(b, t);
      out(b, t) = valid ? penalised(b, t, k) : T(0);
      if (valid) sum += static_cast<double>(k), n += 1;
    }
  }
  return n > 0 ? sum / n : 0.0;
}

ULORL_NAMESPACE_END
