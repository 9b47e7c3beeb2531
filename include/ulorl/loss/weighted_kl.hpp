// ulorl/loss/weighted_kl.hpp — a reference-KL loss term whose per-token importance weight multiplies
// the estimate before the output clamp, and whose derivative enters the gradient:
//
//   λ = clamp(ref − logp, ±input_clamp),  κ = the estimator of kl.hpp at λ
//   ω = exp(logp − sg(logp))  (value 1, derivative 1)   or   exp(logp − rollout_log_prob)  (derivative ω)
//   K = clamp(ω κ, ±output_clamp),  d K / d logp = ω' κ + ω dκ/dlogp,  0 where either clamp is active
//   kl = coef Σ_b w_b Σ_t K m        (w_b the row weight of the step's normaliser)
//
// policy_loss's KL term (kl_config) does not express it: there the output clamp acts on κ and an
// importance weight is a constant. NeMo-RL's ClippedPGLossFn computes its reference KL this way
// (calculate_kl with importance_sampling_weights; ulorl/presets/nemo_rl.hpp maps its options).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"

ULORL_NAMESPACE_BEGIN

//! The importance weight ω of each token's KL estimate.
enum class kl_importance_weight : std::uint8_t {
  current_policy,  //!< ω = exp(logp − sg(logp)): value 1, derivative 1
  rollout_policy,  //!< ω = exp(logp − rollout_log_prob): value and derivative ω
};

struct weighted_kl_config {
  double coef = 0.0;                                                //!< β, finite; 0: no term
  kl_estimator estimator = kl_estimator::k3;
  double input_clamp = std::numeric_limits<double>::infinity();     //!< > 0: |ref − logp| clamp; infinity: none
  double output_clamp = std::numeric_limits<double>::infinity();    //!< > 0: |ω κ| clamp; infinity: none
  kl_importance_weight weight = kl_importance_weight::current_policy;
};

//! The weighted KL term above: returns kl = β Σ_b w_b Σ_t K m and adds its gradient β w_b dK to
//! grad_log_prob on the valid tokens. `rollout_log_prob` is read only with the rollout_policy
//! weight, which rejects an overflowing exp(logp − rollout_log_prob) (the gradient there would be
//! 0 · inf = NaN). An absent mask (empty view): every token valid. Validates before writing; a
//! penalty or a gradient beyond T's range is an error naming it, nothing written.
template <class T, class M>
double weighted_kl_loss(token_view<const T> log_prob, token_view<const T> ref_log_prob, token_view<const T> rollout_log_prob,
                        token_view<const M> mask, token_view<T> grad_log_prob, const weighted_kl_config& c,
                        const agg_normalizer& norm) {
  constexpr std::string_view fn = "weighted_kl_loss";
  require_finite(fn, "coef", c.coef);
  require_known(fn, "estimator", c.estimator, kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3);
  if (!(c.input_clamp > 0.0)) detail::fail_value(fn, "input_clamp", c.input_clamp, "must be > 0 (infinity: no clamp)");
  if (!(c.output_clamp > 0.0)) detail::fail_value(fn, "output_clamp", c.output_clamp, "must be > 0 (infinity: no clamp)");
  require_known(fn, "weight", c.weight, kl_importance_weight::current_policy, kl_importance_weight::rollout_policy);
  validate_layout(fn, "log_prob", log_prob);
  mask = mask_or_all_valid(mask, log_prob);
  require_same_shape(fn, "ref_log_prob", ref_log_prob, "log_prob", log_prob);
  require_same_shape(fn, "mask", mask, "log_prob", log_prob);
  require_same_shape(fn, "grad_log_prob", grad_log_prob, "log_prob", log_prob);
  const bool on_policy = c.weight == kl_importance_weight::rollout_policy;
  if (on_policy || !rollout_log_prob.empty()) require_same_shape(fn, "rollout_log_prob", rollout_log_prob, "log_prob", log_prob);
  validate_normalizer(fn, norm);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "log_prob", log_prob);
  require_all_finite(fn, "ref_log_prob", ref_log_prob);
  if (on_policy) {
    require_all_finite(fn, "rollout_log_prob", rollout_log_prob);
    for (std::size_t b = 0; b < log_prob.rows(); ++b)
      for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
        if (!std::isfinite(std::exp(static_cast<double>(log_prob(b, t)) - static_cast<double>(rollout_log_prob(b, t)))))
          detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(rollout_log_prob.flat_index(b, t)), rollout_log_prob(b, t),
                          "exp(log_prob - rollout_log_prob) overflows (weight rollout_policy)");
  }
  const double beta = c.coef;
  if (beta == 0.0) return 0.0;
  const double in = c.input_clamp, out = c.output_clamp;
  const kl_params<double> kp = make_kl_params<double>({.estimator = c.estimator, .input_clamp = in});
  // Two passes over the same terms: the first checks every new gradient value and the penalty
  // against T's range (an error names the first beyond it, nothing written), the second writes.
  const auto each = [&](auto&& emit) {
    double total = 0;
    for (std::size_t b = 0; b < log_prob.rows(); ++b) {
      const double wb = row_weight(norm, row_tokens(mask, b));
      double row = 0;
      for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
        if (mask(b, t) == M(0)) continue;
        const double lp = static_cast<double>(log_prob(b, t)), ref = static_cast<double>(ref_log_prob(b, t));
        const kl_value<double> k = kl_term(lp, ref, kp);  // κ at the clamped λ, dκ/dlogp (0 where clamped)
        const bool in_clamped = std::fabs(ref - lp) > in;
        const double omega = on_policy ? std::exp(lp - static_cast<double>(rollout_log_prob(b, t))) : 1.0;
        const double domega = in_clamped ? 0.0 : omega;
        const double raw = omega * k.value;
        const double kv = std::clamp(raw, -out, out);
        const double dk = (-out <= raw && raw <= out) ? domega * k.value + omega * k.grad : 0.0;
        row += kv;
        emit(b, t, static_cast<double>(grad_log_prob(b, t)) + beta * wb * dk);
      }
      total += row == 0.0 ? 0.0 : wb * row;
    }
    return beta * total;
  };
  const double kl = each([&](std::size_t b, std::size_t t, double g) {
    require_result_in_range<T>(fn, "grad_log_prob", static_cast<std::int64_t>(grad_log_prob.flat_index(b, t)), g);
  });
  require_result_in_range<T>(fn, "kl_penalty", -1, kl);
  (void)each([&](std::size_t b, std::size_t t, double g) { grad_log_prob(b, t) = static_cast<T>(g); });
  return kl;
}

ULORL_NAMESPACE_END
