// ulorl/loss/vespo.hpp — VESPO's detached per-sequence weight phi_b (TRL `loss_type="vespo"`,
// GRPOTrainer._compute_loss, TRL f2cd57710ae3). The loss is the policy gradient -phi_b A_b logp
// (objective_kind::policy_gradient with phi_b in policy_loss's `weights`).
//   lc     = log(1e-8)
//   S_b    = Σ_t clamp(logp - old, -20, 20) m[b,t]  +  Σ_t clamp(log q[b,t], lc, 20)   (q: the vLLM IS
//            ratio, summed over every position of the row, padding included; log 0 = -inf -> lc)
//   lw     = clamp(S_b, lc, 20)
//   k, lam = (k_pos, lambda_pos) if A_b >= 0 else (k_neg, lambda_neg);  lam <- max(lam, 1e-4)
//   phi_b  = exp(lam + k lw - lam exp(lw))          (a non-finite value -> 0)
// Both layouts; every statistic is per row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! TRL's `vespo_k_pos`, `vespo_lambda_pos`, `vespo_k_neg`, `vespo_lambda_neg` (defaults: TRL's).
struct vespo_config {
  double k_pos = 2.0;
  double lambda_pos = 3.0;
  double k_neg = 3.0;
  double lambda_neg = 2.0;
};

//! One batch: log_prob, old_log_prob, mask and (optional) the importance-sampling ratio q share
//! one shape; `advantages` holds B values. An absent mask (empty): every token valid.
template <class T, class M = T>
struct vespo_inputs {
  token_view<const T> log_prob{};
  token_view<const T> old_log_prob{};
  token_view<const M> mask{};
  std::span<const T> advantages{};
  token_view<const T> is_ratio{};  //!< q >= 0 per token; empty: none
};

//! phi_b of one row from its log-ratio sum S_b and advantage (the formula above).
[[nodiscard]] inline double vespo_phi(double log_weight_sum, double advantage, const vespo_config& c) noexcept {
  constexpr double lc = -18.420680743952367;  // log(1e-8)
  const double lw = std::clamp(log_weight_sum, lc, 20.0);
  const bool pos = advantage >= 0.0;
  const double k = pos ? c.k_pos : c.k_neg;
  const double lam = std::max(pos ? c.lambda_pos : c.lambda_neg, 1e-4);
  const double phi = std::exp(lam + k * lw - lam * std::exp(lw));
  return std::isfinite(phi) ? phi : 0.0;
}

//! Writes phi_b into `phi` [B]. Validates first: finite parameters, equal shapes and layouts, a 0/1
//! mask, B advantages, finite log-probs and advantages, q finite and >= 0.
template <class T, class M>
void vespo_weights(const vespo_inputs<T, M>& in, std::span<double> phi, const vespo_config& cfg) {
  static_assert(std::is_floating_point_v<T>, "log-probabilities must be float or double");
  constexpr std::string_view fn = "vespo_weights";
  require_finite(fn, "k_pos", cfg.k_pos);
  require_finite(fn, "lambda_pos", cfg.lambda_pos);
  require_finite(fn, "k_neg", cfg.k_neg);
  require_finite(fn, "lambda_neg", cfg.lambda_neg);
  const auto& lp = in.log_prob;
  validate_layout(fn, "log_prob", lp);
  const token_view<const M> mask = mask_or_all_valid(in.mask, lp);
  require_same_shape(fn, "old_log_prob", in.old_log_prob, "log_prob", lp);
  require_same_shape(fn, "mask", mask, "log_prob", lp);
  require_same_size(fn, "advantages", in.advantages.size(), "log_prob rows", lp.rows());
  require_same_size(fn, "phi", phi.size(), "log_prob rows", lp.rows());
  const bool has_q = !in.is_ratio.empty();
  if (has_q) require_same_shape(fn, "is_ratio", in.is_ratio, "log_prob", lp);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "log_prob", lp);
  require_all_finite(fn, "old_log_prob", in.old_log_prob);
  for (std::size_t b = 0; b < in.advantages.size(); ++b)
    if (!std::isfinite(static_cast<double>(in.advantages[b])))
      detail::fail_at(fn, "advantages", static_cast<std::int64_t>(b), in.advantages[b], "must be finite");
  if (has_q) {
    require_all_finite(fn, "is_ratio", in.is_ratio);
    for (std::size_t b = 0; b < lp.rows(); ++b)
      for (std::size_t t = 0; t < lp.row_size(b); ++t)
        if (in.is_ratio(b, t) < T(0))
          detail::fail_at(fn, "is_ratio", static_cast<std::int64_t>(in.is_ratio.flat_index(b, t)), in.is_ratio(b, t),
                          "must be >= 0 (an importance ratio)");
  }
  constexpr double lc = -18.420680743952367;
  for (std::size_t b = 0; b < lp.rows(); ++b) {
    double s = 0.0;
    for (std::size_t t = 0; t < lp.row_size(b); ++t) {
      if (mask(b, t) != M(0))
        s += std::clamp(static_cast<double>(lp(b, t)) - static_cast<double>(in.old_log_prob(b, t)), -20.0, 20.0);
      if (has_q) {
        const double q = static_cast<double>(in.is_ratio(b, t));
        s += q > 0.0 ? std::clamp(std::log(q), lc, 20.0) : lc;
      }
    }
    phi[b] = vespo_phi(s, static_cast<double>(in.advantages[b]), cfg);
  }
}

ULORL_NAMESPACE_END
