// ulorl/advantage/gae.hpp — generalised advantage estimation (Schulman et al. 2016, arXiv
// 1506.02438) with a learned value baseline, scanned from t = T-1 down per row:
//   delta[i,t] = R[i,t] + gamma · v' - V[i,t],   l' = delta + gamma · lambda · l,
//   valid t (m = 1): v' <- V[i,t], l <- l';  masked t (m = 0): v' and l carry through unchanged,
//   A[i,t] = l after step t (v' = l = 0 before the row's last position),
//   returns G[i,t] = A[i,t] + V[i,t] at every position,
//   advantages = masked_whiten(A) over the batch's valid tokens (unbiased, eps 1e-8 in the sqrt, the
//   output not masked: a masked position gets (A - mu) / sqrt(v + eps) too).
// The masked-position rule lets multi-turn rollouts skip tool-observation spans inside a response:
// the TD error and value of an observation token never enter the scan. Matches verl's
// `compute_gae_advantage_return` (verl-project/verl 1dda039b, `masked_whiten` of
// verl.utils.torch_functional, whose mean divides by N + 1e-8: a relative difference below 1e-8 / N).
#pragma once

#include <cstddef>
#include <string_view>

#include "ulorl/advantage/reinforce_plus_plus.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

struct gae_config {
  double gamma = 1.0;   //!< discount, in [0, 1]
  double lambda = 1.0;  //!< GAE's lambda, in [0, 1]
  //! verl's whitening of the advantages: unbiased, eps added to the variance, every position written.
  whiten_config whiten{.mask_output = false};
};

//! GAE advantages and returns (see the header comment) of per-token rewards and values; the
//! outputs must not alias each other. An absent mask (empty view): every token of token_rewards
//! valid. Needs 2 valid tokens (1 with a biased whitening). Nothing is written on error.
template <class T, class M, class U>
void gae_advantages(token_view<const T> token_rewards, token_view<const T> values, token_view<const M> mask,
                    token_view<U> returns, token_view<U> advantages, const gae_config& cfg = {}) {
  constexpr std::string_view fn = "gae_advantages";
  mask = detail::require_token_pair(fn, "token_rewards", token_rewards, mask);
  validate_layout(fn, "values", values);
  require_same_shape(fn, "values", values, "mask", mask);
  require_all_finite(fn, "values", values);
  require_same_shape(fn, "returns", returns, "mask", mask);
  require_same_shape(fn, "advantages", advantages, "mask", mask);
  if (!(cfg.gamma >= 0.0 && cfg.gamma <= 1.0)) detail::fail_value(fn, "config.gamma", cfg.gamma, "must be in [0, 1]");
  if (!(cfg.lambda >= 0.0 && cfg.lambda <= 1.0))
    detail::fail_value(fn, "config.lambda", cfg.lambda, "must be in [0, 1]");
  require_known(fn, "config.whiten.eps_at", cfg.whiten.eps_at, whiten_eps::add_to_variance, whiten_eps::floor_variance);
  require_divisor(fn, "config.whiten.eps", cfg.whiten.eps);
  detail::require_whiten_tokens(fn, mask, cfg.whiten);
  // The scan in double; emit(b, t, A, G). Every A and G is range-checked before anything is written.
  const auto each = [&](auto&& emit) {
    for (std::size_t b = 0; b < mask.rows(); ++b) {
      double next_value = 0.0, gae = 0.0;
      for (std::size_t t = mask.row_size(b); t-- > 0;) {
        const double v = static_cast<double>(values(b, t));
        if (mask(b, t) != M(0)) {
          const double delta = static_cast<double>(token_rewards(b, t)) + cfg.gamma * next_value - v;
          gae = delta + cfg.gamma * cfg.lambda * gae;
          next_value = v;
        }
        emit(b, t, gae, gae + v);
      }
    }
  };
  each([&](std::size_t b, std::size_t t, double a, double g) {
    require_result_in_range<U>(fn, "advantages", static_cast<std::int64_t>(advantages.flat_index(b, t)), a);
    require_result_in_range<U>(fn, "returns", static_cast<std::int64_t>(returns.flat_index(b, t)), g);
  });
  // The raw advantages are whitened in place: on a range error of the whitened values both outputs
  // get their previous values back.
  const std::vector<U> before_adv = detail::saved_tokens(advantages), before_ret = detail::saved_tokens(returns);
  each([&](std::size_t b, std::size_t t, double a, double g) {
    advantages(b, t) = static_cast<U>(a);
    returns(b, t) = static_cast<U>(g);
  });
  try {
    masked_whiten(token_view<const U>(advantages), mask, advantages, cfg.whiten);
  } catch (...) {
    detail::restore_tokens(advantages, before_adv);
    detail::restore_tokens(returns, before_ret);
    throw;
  }
}

ULORL_NAMESPACE_END
