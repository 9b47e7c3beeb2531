// ulorl/advantage/reinforce_pp.hpp — REINFORCE++ (Hu 2025) token advantages:
//   returns   G[i,t] = R[i,t] + gamma · c_i, scanned from t = T-1 down with c_i = G[i,t] · m[i,t]
//             (the running return resets after EOS: masked positions do not carry it);
//   whitening over the whole batch's valid tokens, N = Σ m:
//             mu = Σ G m / N,  v = Σ (G - mu)^2 m / (N - 1),  adv = (G - mu) / sqrt(v + eps) · m;
//   REINFORCE++-baseline: X[i,t] = (s_i - mu_g) · m[i,t] (mu = 0 for a singleton), then whitened.
// Matches verl's `compute_reinforce_plus_plus_outcome_advantage` and `..._baseline_...`; statistics
// are two-pass in double.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

struct whiten_config {
  double eps = 1e-8;     //!< added to the variance
  bool unbiased = true;  //!< N-1 (verl) or N
  bool shift_mean = true;
};

namespace detail {
template <class T, class M>
void check_token_pair(std::string_view fn, std::string_view arg, token_view<const T> x, token_view<const M> mask) {
  validate_layout(fn, "mask", mask);
  require_same_shape(fn, arg, x, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, arg, x);
}
}  // namespace detail

//! out = (x - mu) / sqrt(v + eps) · m over the valid tokens of the whole batch (out may alias x).
//! Needs N >= 2 valid tokens (N >= 1 when biased).
template <class T, class M, class U>
void masked_whiten(token_view<const T> x, token_view<const M> mask, token_view<U> out, const whiten_config& cfg = {}) {
  constexpr std::string_view fn = "masked_whiten";
  detail::check_token_pair(fn, "x", x, mask);
  require_same_shape(fn, "out", out, "mask", mask);
  // eps > 0: a batch of constant values would otherwise divide by zero.
  if (!(cfg.eps > 0) || !std::isfinite(cfg.eps)) detail::fail_value(fn, "config.eps", cfg.eps, "must be finite and > 0");
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b) n += row_tokens(mask, b);
  if (n < (cfg.unbiased ? 2u : 1u))
    detail::fail_value(fn, "mask", n, "whitening needs at least 2 valid tokens in the batch (count shown)");
  double sum = 0.0;
  for (std::size_t b = 0; b < x.rows(); ++b)
    for (std::size_t t = 0; t < x.row_size(b); ++t)
      if (mask(b, t) != M(0)) sum += static_cast<double>(x(b, t));
  const double mu = sum / static_cast<double>(n);
  double m2 = 0.0;
  for (std::size_t b = 0; b < x.rows(); ++b)
    for (std::size_t t = 0; t < x.row_size(b); ++t)
      if (mask(b, t) != M(0)) {
        const double d = static_cast<double>(x(b, t)) - mu;
        m2 += d * d;
      }
  const double var = m2 / static_cast<double>(cfg.unbiased ? n - 1 : n);
  const double inv = 1.0 / std::sqrt(var + cfg.eps);
  const double shift = cfg.shift_mean ? mu : 0.0;
  for (std::size_t b = 0; b < x.rows(); ++b)
    for (std::size_t t = 0; t < x.row_size(b); ++t)
      out(b, t) = mask(b, t) != M(0) ? static_cast<U>((static_cast<double>(x(b, t)) - shift) * inv) : U(0);
}

//! Discounted returns with reset after EOS (see the header comment). `returns` is not masked.
template <class T, class M, class U>
void discounted_returns(token_view<const T> token_rewards, token_view<const M> mask, double gamma,
                        token_view<U> returns) {
  constexpr std::string_view fn = "discounted_returns";
  detail::check_token_pair(fn, "token_rewards", token_rewards, mask);
  require_same_shape(fn, "returns", returns, "mask", mask);
  if (!(gamma >= 0.0 && gamma <= 1.0)) detail::fail_value(fn, "gamma", gamma, "must be in [0, 1]");
  for (std::size_t b = 0; b < mask.rows(); ++b) {
    double c = 0.0;
    for (std::size_t t = mask.row_size(b); t-- > 0;) {
      const double g = static_cast<double>(token_rewards(b, t)) + gamma * c;
      returns(b, t) = static_cast<U>(g);
      c = mask(b, t) != M(0) ? g : 0.0;
    }
  }
}

//! REINFORCE++: returns and whitened advantages (advantages may alias returns' storage only if
//! the caller does not need the returns).
template <class T, class M, class U>
void reinforce_pp_advantages(token_view<const T> token_rewards, token_view<const M> mask, double gamma,
                             token_view<U> returns, token_view<U> advantages, const whiten_config& cfg = {}) {
  constexpr std::string_view fn = "reinforce_pp_advantages";
  detail::check_token_pair(fn, "token_rewards", token_rewards, mask);
  require_same_shape(fn, "advantages", advantages, "mask", mask);
  require_same_shape(fn, "returns", returns, "mask", mask);
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b) n += row_tokens(mask, b);
  if (n < (cfg.unbiased ? 2u : 1u)) detail::fail_value(fn, "mask", n, "whitening needs at least 2 valid tokens");
  if (!(gamma >= 0.0 && gamma <= 1.0)) detail::fail_value(fn, "gamma", gamma, "must be in [0, 1]");
  if (!(cfg.eps > 0) || !std::isfinite(cfg.eps)) detail::fail_value(fn, "config.eps", cfg.eps, "must be finite and > 0");
  discounted_returns(token_rewards, mask, gamma, returns);
  masked_whiten(token_view<const U>(returns), mask, advantages, cfg);
}

//! REINFORCE++-baseline: group-mean-subtracted scores broadcast over valid tokens, then whitened.
template <class T, class M, class U>
void reinforce_pp_baseline_advantages(std::span<const T> scores, const group_layout& groups, token_view<const M> mask,
                                      token_view<U> advantages, const whiten_config& cfg = {}) {
  constexpr std::string_view fn = "reinforce_pp_baseline_advantages";
  validate_layout(fn, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  require_same_size(fn, "scores", scores.size(), "mask rows", mask.rows());
  require_same_size(fn, "groups", groups.responses(), "scores", scores.size());
  require_same_shape(fn, "advantages", advantages, "mask", mask);
  require_all_finite(fn, "scores", vector_view<const T>(scores));
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b) n += row_tokens(mask, b);
  if (n < (cfg.unbiased ? 2u : 1u)) detail::fail_value(fn, "mask", n, "whitening needs at least 2 valid tokens");
  if (!(cfg.eps > 0) || !std::isfinite(cfg.eps)) detail::fail_value(fn, "config.eps", cfg.eps, "must be finite and > 0");
  std::vector<double> centered(scores.size());
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    const double mu = mem.size() == 1 ? 0.0 : two_pass_moments(mem.size(), [&](std::size_t k) {
                                                 return scores[mem[k]];
                                               }).mean;
    for (auto i : mem) centered[i] = static_cast<double>(scores[i]) - mu;
  }
  for (std::size_t b = 0; b < mask.rows(); ++b)
    for (std::size_t t = 0; t < mask.row_size(b); ++t)
      advantages(b, t) = mask(b, t) != M(0) ? static_cast<U>(centered[b]) : U(0);
  masked_whiten(token_view<const U>(advantages), mask, advantages, cfg);
}

ULORL_NAMESPACE_END
