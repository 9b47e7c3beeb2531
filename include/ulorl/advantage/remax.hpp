// ulorl/advantage/remax.hpp — ReMax (Li et al. 2023, arXiv 2310.10505): the reward of the greedy
// response is the baseline of the sampled one,
//   returns    G[i,t] = Σ_{u >= t} R[i,u] · m[i,u]   (every position, masked ones included),
//   advantages A[i,t] = G[i,t] - b_i · m[i,t]           (b_i the greedy response's reward),
// matching verl's `compute_remax_outcome_advantage` (verl-project/verl 1dda039b). Sums in double.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! ReMax returns and advantages of per-token rewards and per-response baselines [B]; the outputs
//! must not alias each other. An absent mask (empty view): every token of token_rewards valid.
//! Nothing is written on error.
template <class T, class B, class M, class U>
void remax_advantages(token_view<const T> token_rewards, std::span<const B> baselines, token_view<const M> mask,
                      token_view<U> returns, token_view<U> advantages) {
  constexpr std::string_view fn = "remax_advantages";
  if (mask.empty()) validate_layout(fn, "token_rewards", token_rewards);
  mask = mask_or_all_valid(mask, token_rewards);
  validate_layout(fn, "mask", mask);
  require_same_shape(fn, "token_rewards", token_rewards, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "token_rewards", token_rewards);
  require_same_size(fn, "baselines", baselines.size(), "mask rows", mask.rows());
  require_all_finite(fn, "baselines", vector_view<const B>(baselines));
  require_same_shape(fn, "returns", returns, "mask", mask);
  require_same_shape(fn, "advantages", advantages, "mask", mask);
  const auto each = [&](auto&& emit) {
    for (std::size_t b = 0; b < mask.rows(); ++b) {
      const double base = static_cast<double>(baselines[b]);
      double g = 0.0;
      for (std::size_t t = mask.row_size(b); t-- > 0;) {
        const bool valid = mask(b, t) != M(0);
        if (valid) g += static_cast<double>(token_rewards(b, t));
        emit(b, t, g, valid ? g - base : g);
      }
    }
  };
  // A return or advantage beyond U's range is an error, found before anything is written.
  each([&](std::size_t b, std::size_t t, double g, double a) {
    require_result_in_range<U>(fn, "returns", static_cast<std::int64_t>(returns.flat_index(b, t)), g);
    require_result_in_range<U>(fn, "advantages", static_cast<std::int64_t>(advantages.flat_index(b, t)), a);
  });
  each([&](std::size_t b, std::size_t t, double g, double a) {
    returns(b, t) = static_cast<U>(g);
    advantages(b, t) = static_cast<U>(a);
  });
}

ULORL_NAMESPACE_END
