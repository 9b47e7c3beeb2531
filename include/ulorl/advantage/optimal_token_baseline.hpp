// ulorl/advantage/optimal_token_baseline.hpp — the Optimal Token Baseline (OTB, arXiv 2602.07078):
// a per-token baseline for each prompt group, weighted by the "realized energy" of each response up
// to that token. With m the 0/1 mask, π the rollout policy's distribution at a
// token (p = exp(old_log_prob) the chosen token's probability, Σπ² = sum_pi_squared) and ρ̄ optional
// rollout importance weights (absent: 1):
//
//   G[i,t] = Σ_{s≥t} R[i,s] m[i,s]                     reward-to-go of the masked rewards (`returns`)
//   w[i,t] = (1 - 2 p[i,t] + Σπ²[i,t]) · ρ̄[i,t]²        = ||e_chosen - π||² · ρ̄², the logit-gradient proxy
//   W[i,t] = Σ_{s≤t} w[i,s] m[i,s]                     cumulative path variance
//   B_j    = Σ_{i∈g} G W / (Σ_{i∈g} W + eps)           over the members present at slot j
//   adv    = (G - B) · m
//
// The slot j of a token is its position t (token_alignment::position: verl `optimal_token_baseline`)
// or its rank among the row's valid tokens (token_alignment::valid_token: verl
// `tir_optimal_token_baseline`, for multi-turn rows whose valid tokens are interleaved with tool
// output; rows without valid tokens belong to no group there). A group of one response has B = 0.
// With handle_zero_tail, when one member alone has the most valid tokens L₁ > L₂ (the second most),
// its baseline is 0 at slots j ≥ L₂: no other response informs it there. Matches verl-project/verl
// 1dda039b `compute_optimal_token_baseline_advantage` and `compute_multi_turn_..._advantage` in
// float64. Only valid tokens are read from the per-token inputs; the statistic Σπ² comes from the
// logits (exp(logsumexp(2z) - 2 logsumexp(z))) and is the caller's input here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! Which tokens of a group's responses share a baseline: those at the same position, or the j-th
//! valid token of each response.
enum class token_alignment { position, valid_token };

struct optimal_token_baseline_config {
  token_alignment align = token_alignment::position;
  bool handle_zero_tail = true;  //!< baseline 0 where only the group's single longest response has tokens
  double eps = 1e-8;             //!< added to Σ W; finite, >= 0
};

//! The per-token inputs; every view has token_rewards' layout and shape.
template <class T, class M = T>
struct optimal_token_baseline_inputs {
  token_view<const T> token_rewards;
  token_view<const M> mask{};              //!< 0/1 response mask; absent (empty): every token valid
  token_view<const T> old_log_prob;        //!< log π_old of the chosen token (required)
  token_view<const T> sum_pi_squared;      //!< Σ_v π_old(v)² of the token's distribution, >= 0 (required)
  token_view<const T> rollout_is_weights{};  //!< ρ̄ (detached, >= 0); absent: 1
};

namespace detail {

template <class T, class M>
void require_where_valid(std::string_view fn, std::string_view arg, const token_view<const T>& v,
                         const token_view<const M>& mask, bool non_negative) {
  for (std::size_t b = 0; b < v.rows(); ++b)
    for (std::size_t t = 0; t < v.row_size(b); ++t) {
      if (mask(b, t) == M(0)) continue;
      const double x = static_cast<double>(v(b, t));
      if (!std::isfinite(x) || (non_negative && x < 0.0))
        fail_at(fn, arg, static_cast<std::int64_t>(v.flat_index(b, t)), v(b, t),
                std::string(non_negative ? "must be finite and >= 0" : "must be finite") + " at valid tokens (row " +
                    std::to_string(b) + ", token " + std::to_string(t) + ")");
    }
}

}  // namespace detail

//! Writes `returns` (G at every position, masked ones included: the masked rewards still to come)
//! and `advantages` ((G - B) · m). An absent mask: every token of token_rewards' layout valid.
//! Throws ulorl::error before writing on: a missing old_log_prob or sum_pi_squared; views of different shapes or a bad packed layout; a mask value
//! other than 0/1; a non-finite reward, log-prob, Σπ² or weight at a valid token, a negative Σπ² or
//! weight; `groups` not covering the B rows; eps negative or not finite; an unknown alignment; and a
//! result that is not finite (a reward-to-go that overflows, or Σ W + eps = 0 from inconsistent
//! inputs). Allocates three doubles per token.
template <class T, class M, class U>
void optimal_token_baseline_advantages(const optimal_token_baseline_inputs<T, M>& in, const group_layout& groups,
                                       token_view<U> returns, token_view<U> advantages,
                                       const optimal_token_baseline_config& cfg = {}) {
  constexpr std::string_view fn = "optimal_token_baseline_advantages";
  require_known(fn, "config.align", cfg.align, token_alignment::position, token_alignment::valid_token);
  if (!(cfg.eps >= 0.0) || !std::isfinite(cfg.eps)) detail::fail_value(fn, "config.eps", cfg.eps, "must be finite and >= 0");
  if (cfg.eps != 0.0) require_divisor(fn, "config.eps", cfg.eps);
  const auto& rewards = in.token_rewards;
  validate_layout(fn, "token_rewards", rewards);
  const token_view<const M> mask = mask_or_all_valid(in.mask, rewards);
  if (in.old_log_prob.empty()) detail::fail(fn, "old_log_prob", "required");
  if (in.sum_pi_squared.empty()) detail::fail(fn, "sum_pi_squared", "required");
  validate_layout(fn, "mask", mask);
  validate_layout(fn, "old_log_prob", in.old_log_prob);
  validate_layout(fn, "sum_pi_squared", in.sum_pi_squared);
  validate_layout(fn, "returns", returns);
  validate_layout(fn, "advantages", advantages);
  require_same_shape(fn, "mask", mask, "token_rewards", rewards);
  require_same_shape(fn, "old_log_prob", in.old_log_prob, "token_rewards", rewards);
  require_same_shape(fn, "sum_pi_squared", in.sum_pi_squared, "token_rewards", rewards);
  const bool weighted = !in.rollout_is_weights.empty();
  if (weighted) {
    validate_layout(fn, "rollout_is_weights", in.rollout_is_weights);
    require_same_shape(fn, "rollout_is_weights", in.rollout_is_weights, "token_rewards", rewards);
  }
  require_same_shape(fn, "returns", returns, "token_rewards", rewards);
  require_same_shape(fn, "advantages", advantages, "token_rewards", rewards);
  if (rewards.rows() == 0) detail::fail(fn, "token_rewards", "empty batch: at least one response is required");
  require_same_size(fn, "groups", groups.responses(), "token_rewards rows", rewards.rows());
  require_binary_mask(fn, "mask", mask);
  detail::require_where_valid(fn, "token_rewards", rewards, mask, false);
  detail::require_where_valid(fn, "old_log_prob", in.old_log_prob, mask, false);
  detail::require_where_valid(fn, "sum_pi_squared", in.sum_pi_squared, mask, true);
  if (weighted) detail::require_where_valid(fn, "rollout_is_weights", in.rollout_is_weights, mask, true);

  const std::size_t B = rewards.rows();
  const auto valid = [&](std::size_t b, std::size_t t) { return mask(b, t) != M(0); };
  // G, W and the advantage of every token, at its flat index (b*T + t or offsets[b] + t).
  std::vector<double> G(rewards.size()), W(rewards.size()), adv(rewards.size(), 0.0);
  std::vector<std::size_t> count(B, 0);  // valid tokens per row
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t n = rewards.row_size(b), base = rewards.row_begin(b);
    double g = 0.0;
    for (std::size_t t = n; t-- > 0;) {
      if (valid(b, t)) g += static_cast<double>(rewards(b, t));
      G[base + t] = g;
    }
    double w = 0.0;
    for (std::size_t t = 0; t < n; ++t) {
      if (valid(b, t)) {
        const double p = std::exp(static_cast<double>(in.old_log_prob(b, t)));
        const double rho = weighted ? static_cast<double>(in.rollout_is_weights(b, t)) : 1.0;
        w += (1.0 - 2.0 * p + static_cast<double>(in.sum_pi_squared(b, t))) * (rho * rho);
        ++count[b];
      }
      W[base + t] = w;
    }
  }

  const bool by_position = cfg.align == token_alignment::position;
  std::vector<std::uint32_t> members;
  std::vector<double> num, den;
  for (std::size_t g = 0; g < groups.count(); ++g) {
    members.clear();
    for (const auto i : groups.members(g))
      if (by_position || count[i] > 0) members.push_back(i);  // valid_token: empty rows are in no group
    std::size_t slots = 0, top = 0, longest = 0, second = 0, at_top = 0;
    for (const auto i : members) slots = std::max(slots, by_position ? rewards.row_size(i) : count[i]);
    num.assign(slots, 0.0);
    den.assign(slots, 0.0);
    if (members.size() >= 2) {
      for (const auto i : members) {
        const std::size_t base = rewards.row_begin(i);
        for (std::size_t t = 0, j = 0; t < rewards.row_size(i); ++t) {
          if (!valid(i, t)) continue;
          const std::size_t slot = by_position ? t : j++;
          num[slot] += G[base + t] * W[base + t];
          den[slot] += W[base + t];
        }
      }
      for (std::size_t j = 0; j < slots; ++j) num[j] /= den[j] + cfg.eps;
      // The zero tail: the single longest member (by valid tokens) past the second longest.
      for (const auto i : members) longest = std::max(longest, count[i]);
      for (const auto i : members)
        if (count[i] == longest && at_top++ == 0) top = i;
      second = longest;
      if (at_top == 1) {
        second = 0;
        for (const auto i : members)
          if (i != top) second = std::max(second, count[i]);
      }
    }
    const bool zero_tail = cfg.handle_zero_tail && members.size() >= 2 && at_top == 1 && longest > second;
    for (const auto i : members) {
      const std::size_t base = rewards.row_begin(i);
      for (std::size_t t = 0, j = 0; t < rewards.row_size(i); ++t) {
        if (!valid(i, t)) continue;
        const std::size_t slot = by_position ? t : j++;
        const bool no_baseline = members.size() < 2 || (zero_tail && i == top && slot >= second);
        adv[base + t] = G[base + t] - (no_baseline ? 0.0 : num[slot]);
      }
    }
  }

  constexpr double limit = static_cast<double>(std::numeric_limits<U>::max());
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < rewards.row_size(b); ++t) {
      const std::size_t k = rewards.flat_index(b, t);
      if (!(std::fabs(G[k]) <= limit))
        detail::fail_at(fn, "token_rewards", static_cast<std::int64_t>(k), rewards(b, t),
                        "the reward-to-go from this token is not representable in the output type");
      if (!(std::fabs(adv[k]) <= limit))
        detail::fail_at(fn, "sum_pi_squared", static_cast<std::int64_t>(k), in.sum_pi_squared(b, t),
                        "the advantage at this token is not finite or not representable (Σ W + eps is 0 or the "
                        "baseline overflows: inconsistent log-probs and Σπ², or eps = 0)");
    }
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < rewards.row_size(b); ++t) {
      const std::size_t k = rewards.flat_index(b, t);
      returns(b, t) = static_cast<U>(G[k]);
      advantages(b, t) = static_cast<U>(adv[k]);
    }
}

ULORL_NAMESPACE_END
