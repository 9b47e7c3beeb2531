// ulorl/advantage/multi_reward.hpp — advantages from several reward functions per response, the
// components r[i, k] of a [B, K] matrix with weights w_k (absent: all 1):
//
//   sum_then_normalize   s_i = Σ_k w_k r_ik, then one group advantage a_i of s (TRL's default);
//   normalize_then_sum   a_i = Σ_k w_k a_ik, a_ik the group advantage of component k alone
//                        (GDPO, group reward-decoupled normalisation: verl `gdpo`, TRL
//                        `multi_objective_aggregation="normalize_then_sum"`, NeMo-RL `gdpo`);
//
// then an optional final normalisation over the whole batch: of the per-response values as one group
// (TRL: (a - mean)/(std + 1e-4); NeMo-RL: (a - mean)/std when std > 0), or of the tokens (verl:
// REINFORCE++'s masked whitening). Every step is an existing piece: `group_advantages` for each
// component, the weighted sum and the batch, `broadcast_to_tokens`, `masked_whiten`. The frameworks'
// parameter sets are in ulorl/presets/<framework>.hpp; docs/advantages.md has the formulas side by
// side.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/groups.hpp"
#include "ulorl/advantage/reinforce_plus_plus.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/views.hpp"

ULORL_NAMESPACE_BEGIN

//! Whether the components are combined before or after the group normalisation.
enum class reward_aggregation { sum_then_normalize, normalize_then_sum };
//! The last step over the whole batch: none, the per-response values normalised as one group
//! (`responses`, with config.batch), or masked whitening of the tokens (`tokens`, config.whiten).
enum class final_normalization { none, responses, tokens };

struct multi_reward_config {
  reward_aggregation aggregation = reward_aggregation::normalize_then_sum;
  //! The group advantage of each component (normalize_then_sum) or of the weighted sum
  //! (sum_then_normalize).
  group_advantage_config group{};
  final_normalization final_norm = final_normalization::none;
  //! final_norm == responses: the per-response values are normalised as one group of all B responses.
  group_advantage_config batch{};
  //! final_norm == tokens: the broadcast values are whitened over the batch's valid tokens.
  whiten_config whiten{};
  broadcast_config broadcast{.placement = token_placement::masked, .allow_empty_rows = true};
  //! Fewer components are rejected (NeMo-RL's GDPO needs 2); at least 1 in any case.
  std::size_t min_components = 1;
};

namespace detail {

inline void validate_multi_reward_config(std::string_view fn, const multi_reward_config& cfg) {
  require_known(fn, "config.aggregation", cfg.aggregation, reward_aggregation::sum_then_normalize,
                reward_aggregation::normalize_then_sum);
  require_known(fn, "config.final_norm", cfg.final_norm, final_normalization::none, final_normalization::responses,
                final_normalization::tokens);
  validate_group_advantage_config(fn, cfg.group);
  if (cfg.final_norm == final_normalization::responses) validate_group_advantage_config(fn, cfg.batch);
  if (cfg.final_norm == final_normalization::tokens) {
    require_known(fn, "config.whiten.eps_at", cfg.whiten.eps_at, whiten_eps::add_to_variance,
                  whiten_eps::floor_variance);
    require_divisor(fn, "config.whiten.eps", cfg.whiten.eps);
  }
  require_known(fn, "config.broadcast.placement", cfg.broadcast.placement, token_placement::masked,
                token_placement::through_last, token_placement::every_position);
}

template <class T>
void validate_components(std::string_view fn, matrix_view<const T> components, std::span<const double> weights,
                         std::size_t min_components) {
  const std::size_t need = min_components > 1 ? min_components : 1;
  if (components.cols() < need)
    fail_value(fn, "components", components.cols(),
               "needs at least " + std::to_string(need) + " reward component(s) per response (count shown)");
  if (!weights.empty()) require_same_size(fn, "weights", weights.size(), "components columns", components.cols());
  for (std::size_t k = 0; k < weights.size(); ++k)
    if (!std::isfinite(weights[k])) fail_at(fn, "weights", static_cast<std::int64_t>(k), weights[k], "must be finite");
  for (std::size_t i = 0; i < components.rows(); ++i)
    for (std::size_t k = 0; k < components.cols(); ++k)
      if (!std::isfinite(static_cast<double>(components(i, k))))
        fail_at(fn, "components", static_cast<std::int64_t>(i * components.cols() + k), components(i, k),
                "must be finite (response " + std::to_string(i) + ", component " + std::to_string(k) + ")");
}

//! Σ_k w_k x(i, k) per row in double; an overflowing sum names the row.
template <class T>
std::vector<double> weighted_sum(std::string_view fn, matrix_view<const T> x, std::span<const double> weights) {
  std::vector<double> s(x.rows(), 0.0);
  for (std::size_t i = 0; i < x.rows(); ++i)
    for (std::size_t k = 0; k < x.cols(); ++k)
      s[i] += (weights.empty() ? 1.0 : weights[k]) * static_cast<double>(x(i, k));
  for (std::size_t i = 0; i < s.size(); ++i)
    if (!std::isfinite(s[i]))
      fail_at(fn, "components", static_cast<std::int64_t>(i * x.cols()), x(i, 0),
              "the weighted sum of this response's components overflows");
  return s;
}

//! The per-response values before the final step (validated inputs), in double.
template <class T>
std::vector<double> aggregate_components(std::string_view fn, matrix_view<const T> components,
                                         std::span<const double> weights, const group_layout& groups,
                                         const multi_reward_config& cfg) {
  const std::size_t n = components.rows(), K = components.cols();
  std::vector<double> a;
  if (cfg.aggregation == reward_aggregation::sum_then_normalize) {
    a = weighted_sum(fn, components, weights);
    group_advantages(std::span<const double>(a), groups, std::span<double>(a), cfg.group);
  } else {
    // The K group advantages as columns of a [B, K] matrix, then their weighted sum.
    std::vector<double> per(n * K), column(n);
    for (std::size_t k = 0; k < K; ++k) {
      for (std::size_t i = 0; i < n; ++i) column[i] = static_cast<double>(components(i, k));
      group_advantages(std::span<const double>(column), groups, std::span<double>(column), cfg.group);
      for (std::size_t i = 0; i < n; ++i) per[i * K + k] = column[i];
    }
    a = weighted_sum(fn, matrix_view<const double>(per.data(), n, K), weights);
  }
  if (cfg.final_norm == final_normalization::responses)
    group_advantages(std::span<const double>(a), group_layout::fixed(n, n, fn, "components"), std::span<double>(a),
                     cfg.batch);
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(a[i]))
      fail_at(fn, "components", static_cast<std::int64_t>(i * K), components(i, 0),
              "this response's advantage is not finite (the weighted sum overflows)");
  return a;
}

template <class U, class T>
void require_representable(std::string_view fn, matrix_view<const T> components, const std::vector<double>& a) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i]) <= static_cast<double>(std::numeric_limits<U>::max())))
      fail_at(fn, "components", static_cast<std::int64_t>(i * components.cols()), components(i, 0),
              "this response's value is not representable in the output type");
}

}  // namespace detail

//! s_i = Σ_k w_k components(i, k) in double (`weights` empty: all 1). Throws before writing on a
//! size mismatch, non-finite values, no component.
template <class T, class U>
void weighted_reward_sum(matrix_view<const T> components, std::span<const double> weights, std::span<U> out) {
  constexpr std::string_view fn = "weighted_reward_sum";
  if (components.rows() == 0) detail::fail(fn, "components", "empty batch: at least one response is required");
  detail::validate_components(fn, components, weights, 1);
  require_same_size(fn, "out", out.size(), "components rows", components.rows());
  const std::vector<double> s = detail::weighted_sum(fn, components, weights);
  detail::require_representable<U>(fn, components, s);
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<U>(s[i]);
}

//! Per-response multi-reward advantages (final normalisation none or responses). `components` is
//! [B, K] (any strides), `weights` K numbers or empty (all 1), `groups` the B responses' groups.
//! Throws ulorl::error before writing `out` on: no component / fewer than cfg.min_components, a
//! weight count other than K, non-finite components or weights, size mismatches, an unknown enum,
//! final_norm == tokens (use the token overload), or any rejection of `group_advantages`.
template <class T, class U>
void multi_reward_advantages(matrix_view<const T> components, std::span<const double> weights,
                             const group_layout& groups, std::span<U> out, const multi_reward_config& cfg) {
  constexpr std::string_view fn = "multi_reward_advantages";
  detail::validate_multi_reward_config(fn, cfg);
  if (cfg.final_norm == final_normalization::tokens)
    detail::fail(fn, "config.final_norm",
                 "final_normalization::tokens needs the token overload (a mask and a token output)");
  if (components.rows() == 0) detail::fail(fn, "components", "empty batch: at least one response is required");
  detail::validate_components(fn, components, weights, cfg.min_components);
  require_same_size(fn, "groups", groups.responses(), "components rows", components.rows());
  require_same_size(fn, "out", out.size(), "components rows", components.rows());
  const std::vector<double> a = detail::aggregate_components(fn, components, weights, groups, cfg);
  detail::require_representable<U>(fn, components, a);
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = static_cast<U>(a[i]);
}

//! Token advantages: the per-response values placed by cfg.broadcast, then (final_norm == tokens)
//! whitened by cfg.whiten. `mask` and `out` share a layout (padded or packed) with B rows. Throws
//! before writing on everything the per-response overload rejects, a mask that is not 0/1 or of
//! another shape, an empty mask row unless cfg.broadcast.allow_empty_rows, and for final_norm == tokens
//! fewer valid tokens than the whitening needs (2 unbiased, 1 biased). An absent mask (empty view):
//! every token of out's layout valid.
template <class T, class M, class U>
void multi_reward_advantages(matrix_view<const T> components, std::span<const double> weights,
                             const group_layout& groups, token_view<const M> mask, token_view<U> out,
                             const multi_reward_config& cfg) {
  constexpr std::string_view fn = "multi_reward_advantages";
  detail::validate_multi_reward_config(fn, cfg);
  if (components.rows() == 0) detail::fail(fn, "components", "empty batch: at least one response is required");
  detail::validate_components(fn, components, weights, cfg.min_components);
  require_same_size(fn, "groups", groups.responses(), "components rows", components.rows());
  if (mask.empty()) validate_layout(fn, "out", out);
  mask = mask_or_all_valid(mask, out);
  validate_layout(fn, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  require_same_size(fn, "mask", mask.rows(), "components rows", components.rows());
  validate_layout(fn, "out", out);
  require_same_shape(fn, "out", out, "mask", mask);
  if (!cfg.broadcast.allow_empty_rows)
    for (std::size_t b = 0; b < mask.rows(); ++b)
      if (row_tokens(mask, b) == 0)
        detail::fail_at(fn, "mask", static_cast<std::int64_t>(b), 0, "row has no valid token (a mask row of zeros)");
  if (cfg.final_norm == final_normalization::tokens) detail::require_whiten_tokens(fn, mask, cfg.whiten);
  const std::vector<double> a = detail::aggregate_components(fn, components, weights, groups, cfg);
  detail::require_representable<U>(fn, components, a);
  broadcast_to_tokens(std::span<const double>(a), mask, out, cfg.broadcast);
  if (cfg.final_norm == final_normalization::tokens) masked_whiten(token_view<const U>(out), mask, out, cfg.whiten);
}

ULORL_NAMESPACE_END
