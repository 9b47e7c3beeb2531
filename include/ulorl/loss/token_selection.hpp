// ulorl/loss/token_selection.hpp — the batch passes that pick or weigh tokens before the policy
// loss: they write what policy_loss reads (a per-token weight, a 0/1 selection), so the objectives
// stay those of objectives.hpp.
//
//   dppo_weights      DPPO's trust region (Binary-TV / Binary-KL): w min(r, c) v, the detached factor
//                     of ℓ = -A min(r, c) logp v w (objective policy_gradient)
//   kl_cov_selection  KL-Cov: the top fraction of tokens by cov = (A - mean A)(logp - mean logp)
//                     take the |log r| penalty (objective penalized_pg)
//   clip_cov_weights  Clip-Cov: a draw among the unclipped tokens of moderate cov has its loss and
//                     gradient dropped (objective ppo_clip)
//
// (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
// for KL-Cov and Clip-Cov; verl's dppo_tv / dppo_kl, kl_cov and clip_cov loss modes use them:
// ulorl/presets/verl.hpp.) Each validates every input before writing; `rollout_is_weights` may be
// empty (1), and so may `mask` (every token of log_prob valid). Each returns the fractions it counts
// over the valid tokens (token_selection_stats), which policy_loss's metrics cannot see.
// docs/presets/verl.md gives the formulas.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/objectives.hpp"

ULORL_NAMESPACE_BEGIN

//! What a token-selection pass counts over the valid tokens.
struct token_selection_stats {
  double dropped_fraction = 0;    //!< dppo_weights: mean (1 - v); clip_cov_weights: mean selection
  double capped_fraction = 0;     //!< dppo_weights: mean [r > c] v
  double mean_abs_log_ratio = 0;  //!< kl_cov_selection: mean |logp - old|
};

namespace detail::token_selection {
//! Validates the batch; returns the mask, an absent one as log_prob's all-valid mask.
template <class T, class M>
[[nodiscard]] token_view<const M> require_batch(std::string_view fn, token_view<const T> old_log_prob, token_view<const T> log_prob,
                                                token_view<const T> advantages, token_view<const M> mask,
                                                token_view<const T> rollout_is_weights) {
  validate_layout(fn, "log_prob", log_prob);
  mask = mask_or_all_valid(mask, log_prob);
  require_same_shape(fn, "old_log_prob", old_log_prob, "log_prob", log_prob);
  require_same_shape(fn, "advantages", advantages, "log_prob", log_prob);
  require_same_shape(fn, "mask", mask, "log_prob", log_prob);
  if (!rollout_is_weights.empty()) require_same_shape(fn, "rollout_is_weights", rollout_is_weights, "log_prob", log_prob);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "log_prob", log_prob);
  require_all_finite(fn, "old_log_prob", old_log_prob);
  require_all_finite(fn, "advantages", advantages);
  if (!rollout_is_weights.empty()) require_all_finite(fn, "rollout_is_weights", rollout_is_weights);
  return mask;
}
template <class T>
[[nodiscard]] double weight_at(token_view<const T> w, std::size_t b, std::size_t t) {
  return w.empty() ? 1.0 : static_cast<double>(w(b, t));
}
[[nodiscard]] inline double mean_of(double sum, double n) noexcept { return n > 0 ? sum / n : 0.0; }
}  // namespace detail::token_selection

// ---- DPPO -------------------------------------------------------------------------------------------

//! The divergence DPPO bounds: the probability difference or the binary KL of the sampled token.
enum class dppo_divergence : std::uint8_t { total_variation, binary_kl };

//! DPPO's trust region and ratio cap.
struct dppo_config {
  dppo_divergence divergence = dppo_divergence::total_variation;
  double delta_low = 0.0;       //!< δl >= 0, finite: the bound for A <= 0
  double delta_high = 0.0;      //!< δh >= 0, finite: the bound for A > 0
  double ratio_cap = no_limit;  //!< c > 0: the cap of the detached ratio; no_limit: none
};

//! DPPO Binary-TV / Binary-KL: writes weights = w min(r, c) v, the detached factor of
//! ℓ = -A min(r, c) logp v w (objective policy_gradient). r = exp(clamp(x, -20, 20)), p = exp(logp),
//! p0 = exp(old); v = [A > 0 ? v+ : v-] with, for total_variation, v+ = [p - p0 <= δh],
//! v- = [p - p0 >= -δl]; for binary_kl, D = p0 (old - logp) + (1 - p0) log((1 - p0 + 1e-8) / (1 - p + 1e-8)),
//! v+ = [D <= δh or p <= p0], v- = [D <= δl or p >= p0]. Writes every position (masked ones too).
//! Returns dropped_fraction = mean (1 - v) and capped_fraction = mean [r > c] v over the valid tokens.
template <class T, class M>
token_selection_stats dppo_weights(token_view<const T> old_log_prob, token_view<const T> log_prob, token_view<const T> advantages,
                                   token_view<const M> mask, token_view<const T> rollout_is_weights, token_view<T> weights,
                                   const dppo_config& c) {
  constexpr std::string_view fn = "dppo_weights";
  require_known(fn, "divergence", c.divergence, dppo_divergence::total_variation, dppo_divergence::binary_kl);
  if (!(c.delta_low >= 0.0 && std::isfinite(c.delta_low)))
    detail::fail_value(fn, "delta_low", c.delta_low, "must be finite and >= 0 (a divergence threshold)");
  if (!(c.delta_high >= 0.0 && std::isfinite(c.delta_high)))
    detail::fail_value(fn, "delta_high", c.delta_high, "must be finite and >= 0 (a divergence threshold)");
  if (!(c.ratio_cap > 0.0)) detail::fail_value(fn, "ratio_cap", c.ratio_cap, "must be > 0 (the cap of the detached ratio)");
  mask = detail::token_selection::require_batch(fn, old_log_prob, log_prob, advantages, mask, rollout_is_weights);
  require_same_shape(fn, "weights", weights, "log_prob", log_prob);
  const bool tv = c.divergence == dppo_divergence::total_variation;
  const double cap = c.ratio_cap, dl = c.delta_low, dh = c.delta_high;
  double n = 0, outside = 0, capped = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
      const double lp = static_cast<double>(log_prob(b, t)), old = static_cast<double>(old_log_prob(b, t));
      const double r = std::exp(std::clamp(lp - old, -20.0, 20.0));
      const double p = std::exp(lp), p0 = std::exp(old);
      bool keep_pos, keep_neg;
      if (tv) {
        keep_pos = p - p0 <= dh, keep_neg = p - p0 >= -dl;
      } else {
        const double d = p0 * (old - lp) + (1.0 - p0) * std::log((1.0 - p0 + 1e-8) / (1.0 - p + 1e-8));
        keep_pos = d <= dh || p <= p0, keep_neg = d <= dl || p >= p0;
      }
      const bool v = advantages(b, t) > T(0) ? keep_pos : keep_neg;
      const double wt = detail::token_selection::weight_at(rollout_is_weights, b, t) * std::min(r, cap) * (v ? 1.0 : 0.0);
      weights(b, t) = static_cast<T>(wt);
      if (mask(b, t) != M(0)) n += 1, outside += v ? 0.0 : 1.0, capped += (r > cap && v) ? 1.0 : 0.0;
    }
  return {detail::token_selection::mean_of(outside, n), detail::token_selection::mean_of(capped, n), 0.0};
}

// ---- KL-Cov -----------------------------------------------------------------------------------------

//! KL-Cov's share of the valid tokens that take the penalty.
struct kl_cov_config {
  double fraction = 0.0002;  //!< > 0, finite
};

//! KL-Cov's token selection: over the n valid tokens, cov = (A - mean A)(logp - mean logp); the
//! k = max(1, floor(n fraction)) tokens of largest cov (at most n; none when n = 0; ties by
//! position) get selected = 1, every other position 0. Those tokens take the penalized_pg objective
//! with its |x| penalty, the others the same objective with abs_penalty = 0 (policy_loss with weights
//! w selected and w (1 - selected), one normaliser). The selection depends on the whole batch passed
//! in. Returns mean_abs_log_ratio = mean |x| over the valid tokens.
template <class T, class M>
token_selection_stats kl_cov_selection(token_view<const T> old_log_prob, token_view<const T> log_prob, token_view<const T> advantages,
                                       token_view<const M> mask, token_view<T> selected, const kl_cov_config& c) {
  constexpr std::string_view fn = "kl_cov_selection";
  if (!(c.fraction > 0.0 && std::isfinite(c.fraction))) detail::fail_value(fn, "fraction", c.fraction, "must be finite and > 0");
  mask = detail::token_selection::require_batch(fn, old_log_prob, log_prob, advantages, mask, token_view<const T>{});
  require_same_shape(fn, "selected", selected, "log_prob", log_prob);
  struct token {
    std::size_t b, t;
    double cov;
  };
  std::vector<token> valid;
  double sa = 0, sl = 0, sx = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
      if (mask(b, t) != M(0)) {
        valid.push_back({b, t, 0.0});
        sa += static_cast<double>(advantages(b, t)), sl += static_cast<double>(log_prob(b, t));
        sx += std::fabs(static_cast<double>(log_prob(b, t)) - static_cast<double>(old_log_prob(b, t)));
      }
  const double n = static_cast<double>(valid.size());
  const double ma = detail::token_selection::mean_of(sa, n), ml = detail::token_selection::mean_of(sl, n);
  for (auto& v : valid)
    v.cov = (static_cast<double>(advantages(v.b, v.t)) - ma) * (static_cast<double>(log_prob(v.b, v.t)) - ml);
  std::size_t k = 0;
  if (!valid.empty()) {
    const double want = std::floor(n * c.fraction);
    k = want < 1.0 ? 1 : (want >= n ? valid.size() : static_cast<std::size_t>(want));
  }
  std::stable_sort(valid.begin(), valid.end(), [](const token& a, const token& b) { return a.cov > b.cov; });
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) selected(b, t) = T(0);
  for (std::size_t i = 0; i < k; ++i) selected(valid[i].b, valid[i].t) = T(1);
  return {0.0, 0.0, detail::token_selection::mean_of(sx, n)};
}

// ---- Clip-Cov ---------------------------------------------------------------------------------------

//! Clip-Cov's candidates and their share.
struct clip_cov_config {
  double eps_low = 0.2;       //!< the clip band [1 - eps_low, 1 + eps_high] of the "not clipped" test
  double eps_high = 0.2;
  double fraction = 0.0002;   //!< > 0, finite: the share of the valid tokens dropped
  double cov_lower = 1.0;     //!< candidates have cov_lower < cov < cov_upper (finite)
  double cov_upper = 5.0;
};

//! Clip-Cov: checks the caller's draw `clip_cov_selection` (a random choice among the candidates,
//! which the caller makes with its own generator) and writes weights = w (1 - selection), so that
//! the ppo_clip objective (unclamped ratio) drops the selected tokens' loss and gradient. Candidates:
//! valid, not clipped (not -A clamp(r, 1-εl, 1+εh) > -A r, r = exp(x)), and cov_lower < cov < cov_upper
//! with cov = (A - mean A)(logp - mean logp) over the N valid tokens. The selection must be 0/1, mark
//! only candidates, and exactly min(max(floor(fraction N), 1), #candidates) of them. Returns
//! dropped_fraction = mean selection over the valid tokens.
template <class T, class M, class S>
token_selection_stats clip_cov_weights(token_view<const T> old_log_prob, token_view<const T> log_prob, token_view<const T> advantages,
                                       token_view<const M> mask, token_view<const S> clip_cov_selection,
                                       token_view<const T> rollout_is_weights, token_view<T> weights, const clip_cov_config& c) {
  constexpr std::string_view fn = "clip_cov_weights";
  validate_objective(fn, {.kind = objective_kind::ppo_clip, .eps_low = c.eps_low, .eps_high = c.eps_high, .log_ratio_clamp = no_limit});
  if (!(c.fraction > 0.0 && std::isfinite(c.fraction))) detail::fail_value(fn, "fraction", c.fraction, "must be finite and > 0");
  if (!std::isfinite(c.cov_lower)) detail::fail_value(fn, "cov_lower", c.cov_lower, "must be finite");
  if (!std::isfinite(c.cov_upper)) detail::fail_value(fn, "cov_upper", c.cov_upper, "must be finite");
  mask = detail::token_selection::require_batch(fn, old_log_prob, log_prob, advantages, mask, rollout_is_weights);
  require_same_shape(fn, "clip_cov_selection", clip_cov_selection, "log_prob", log_prob);
  require_same_shape(fn, "weights", weights, "log_prob", log_prob);
  require_binary_mask(fn, "clip_cov_selection", clip_cov_selection);
  double n = 0, sa = 0, sl = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
      if (mask(b, t) != M(0)) n += 1, sa += static_cast<double>(advantages(b, t)), sl += static_cast<double>(log_prob(b, t));
  const double ma = detail::token_selection::mean_of(sa, n), ml = detail::token_selection::mean_of(sl, n);
  const double lo = 1.0 - c.eps_low, hi = 1.0 + c.eps_high;
  double candidates = 0, marked = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
      const double lp = static_cast<double>(log_prob(b, t)), a = static_cast<double>(advantages(b, t));
      const double r = std::exp(lp - static_cast<double>(old_log_prob(b, t)));
      const bool clipped = -a * std::clamp(r, lo, hi) > -a * r;
      const double cov = (a - ma) * (lp - ml);
      const bool candidate = mask(b, t) != M(0) && !clipped && c.cov_lower < cov && cov < c.cov_upper;
      const bool sel = clip_cov_selection(b, t) != S(0);
      if (sel && !candidate)
        detail::fail_at(fn, "clip_cov_selection", static_cast<std::int64_t>(clip_cov_selection.flat_index(b, t)), 1,
                        "marks a token that is not a candidate (valid, not clipped, cov_lower < cov < cov_upper)");
      candidates += candidate ? 1.0 : 0.0, marked += sel ? 1.0 : 0.0;
    }
  const double clip_num = std::max(std::floor(c.fraction * n), 1.0);
  const double want = std::min(clip_num, candidates);
  if (marked != want)
    detail::fail_value(fn, "clip_cov_selection", marked,
                       "must mark exactly min(max(floor(fraction N), 1), #candidates) = " + std::to_string(static_cast<long long>(want)) +
                           " tokens");
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
      weights(b, t) = static_cast<T>(clip_cov_selection(b, t) != S(0) ? 0.0 : detail::token_selection::weight_at(rollout_is_weights, b, t));
  return {detail::token_selection::mean_of(marked, n), 0.0, 0.0};
}

ULORL_NAMESPACE_END
