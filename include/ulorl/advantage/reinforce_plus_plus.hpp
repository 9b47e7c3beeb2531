// ulorl/advantage/reinforce_plus_plus.hpp — REINFORCE++ (Hu 2025) token advantages:
//   returns   G[i,t] = R[i,t] + gamma · c_i, scanned from t = T-1 down with c_i = G[i,t] · m[i,t]
//             (the running return resets after EOS: masked positions do not carry it);
//   whitening over the whole batch's valid tokens, N = Σ m:
//             mu = Σ G m / N,  v = Σ (G - mu)^2 m / (N - 1),  adv = (G - mu) / sqrt(v + eps) · m;
//   REINFORCE++-baseline: X[i,t] = a_i (a group advantage of the scores; s_i - mu_g with mu = 0 for
//             a singleton by default), then whitened.
// Matches verl's `compute_reinforce_plus_plus_outcome_advantage` and `..._baseline_...`; with a
// biased variance floored at eps (sqrt(max(v, eps))) and the output left unmasked it is NeMo-RL's
// `ReinforcePlusPlusAdvantageEstimator` (ulorl/presets/nemo_rl.hpp). Statistics are two-pass in
// double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! How eps enters the whitening divisor.
enum class whiten_eps { add_to_variance, floor_variance };

struct whiten_config {
  double eps = 1e-8;     //!< added to the variance, or its floor (eps_at)
  bool unbiased = true;  //!< N-1 (verl) or N (NeMo-RL)
  bool shift_mean = true;
  whiten_eps eps_at = whiten_eps::add_to_variance;  //!< sqrt(v + eps) (verl) or sqrt(max(v, eps)) (NeMo-RL)
  //! true: masked positions get 0; false: every position gets (x - mu) / D, masked ones included
  //! (NeMo-RL). The statistics always use the valid tokens only.
  bool mask_output = true;
};

namespace detail {
//! Checks x and its mask; returns the mask, an absent one as x's all-valid mask.
template <class T, class M>
[[nodiscard]] token_view<const M> require_token_pair(std::string_view fn, std::string_view arg, token_view<const T> x,
                                                     token_view<const M> mask) {
  if (mask.empty()) validate_layout(fn, arg, x);
  mask = mask_or_all_valid(mask, x);
  validate_layout(fn, "mask", mask);
  require_same_shape(fn, arg, x, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, arg, x);
  return mask;
}
}  // namespace detail

//! out = (x - mu) / sqrt(v + eps) · m over the valid tokens of the whole batch (out may alias x).
//! Needs N >= 2 valid tokens (N >= 1 when biased). An absent mask (empty view): every token of x valid.
template <class T, class M, class U>
void masked_whiten(token_view<const T> x, token_view<const M> mask, token_view<U> out, const whiten_config& cfg = {}) {
  constexpr std::string_view fn = "masked_whiten";
  mask = detail::require_token_pair(fn, "x", x, mask);
  require_same_shape(fn, "out", out, "mask", mask);
  require_known(fn, "config.eps_at", cfg.eps_at, whiten_eps::add_to_variance, whiten_eps::floor_variance);
  // eps > 0: a batch of constant values would otherwise divide by zero.
  require_divisor(fn, "config.eps", cfg.eps);
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b) n += row_tokens(mask, b);
  if (n < (cfg.unbiased ? 2u : 1u))
    detail::fail_value(fn, "mask", n, "whitening needs at least 2 valid tokens in the batch (count shown)");
  // Mean and variance of the valid tokens (visited_moments: scaled, so no finite input overflows
  // the sums or the squares). Values up to 2^500 take the plain formula; larger ones are whitened
  // in the moments' scale 2^e, where neither x - mu ({1e308, -1e308}) nor the variance overflows.
  const moments mo = visited_moments([&](auto&& f) {
    for (std::size_t b = 0; b < x.rows(); ++b)
      for (std::size_t t = 0; t < x.row_size(b); ++t)
        if (mask(b, t) != M(0)) f(x(b, t));
  });
  const bool scaled = mo.exponent > 500;
  const int e = scaled ? mo.exponent : 0;
  const double var = scaled ? mo.scaled_variance(cfg.unbiased) : mo.variance(cfg.unbiased);
  const double eps = std::ldexp(cfg.eps, -2 * e);
  const double inv = 1.0 / std::sqrt(cfg.eps_at == whiten_eps::add_to_variance ? var + eps : std::max(var, eps));
  const double shift = cfg.shift_mean ? (scaled ? mo.scaled_mean : mo.mean) : 0.0;
  const auto value = [&](std::size_t b, std::size_t t) {
    return (std::ldexp(static_cast<double>(x(b, t)), -e) - shift) * inv;
  };
  // Without the mean's shift, x / std of a tiny variance can exceed U's range: an error, before
  // anything is written.
  for (std::size_t b = 0; b < x.rows(); ++b)
    for (std::size_t t = 0; t < x.row_size(b); ++t)
      if (mask(b, t) != M(0) || !cfg.mask_output)
        require_result_in_range<U>(fn, "out", static_cast<std::int64_t>(out.flat_index(b, t)), value(b, t));
  for (std::size_t b = 0; b < x.rows(); ++b)
    for (std::size_t t = 0; t < x.row_size(b); ++t)
      out(b, t) = mask(b, t) != M(0) || !cfg.mask_output ? static_cast<U>(value(b, t)) : U(0);
}

//! How the return scan treats masked positions: `reset_after_eos` (verl b178a3cd, the header
//! comment: a masked position gets R + gamma c and resets c to 0); `skip_masked` (verl 1dda039b,
//! multi-turn observation spans: a masked position gets 0, drops its reward and carries c through
//! unchanged, so G[i,t] = R[i,t] + gamma · G at the next valid position).
enum class return_scan { reset_after_eos, skip_masked };

//! Discounted returns (see the header comment and return_scan). With reset_after_eos `returns` is
//! not masked. An absent mask (empty view): every token of token_rewards valid.
template <class T, class M, class U>
void discounted_returns(token_view<const T> token_rewards, token_view<const M> mask, token_view<U> returns,
                        double gamma, return_scan scan = return_scan::reset_after_eos) {
  constexpr std::string_view fn = "discounted_returns";
  mask = detail::require_token_pair(fn, "token_rewards", token_rewards, mask);
  require_same_shape(fn, "returns", returns, "mask", mask);
  if (!(gamma >= 0.0 && gamma <= 1.0)) detail::fail_value(fn, "gamma", gamma, "must be in [0, 1]");
  require_known(fn, "scan", scan, return_scan::reset_after_eos, return_scan::skip_masked);
  const bool skip = scan == return_scan::skip_masked;
  // A return beyond U's range (a discounted sum of large rewards) is an error, found before
  // anything is written.
  const auto each = [&](auto&& emit) {
    for (std::size_t b = 0; b < mask.rows(); ++b) {
      double c = 0.0;
      for (std::size_t t = mask.row_size(b); t-- > 0;) {
        const bool valid = mask(b, t) != M(0);
        const double g = skip && !valid ? 0.0 : static_cast<double>(token_rewards(b, t)) + gamma * c;
        emit(b, t, g);
        if (valid)
          c = g;
        else if (!skip)
          c = 0.0;
      }
    }
  };
  each([&](std::size_t b, std::size_t t, double g) {
    require_result_in_range<U>(fn, "returns", static_cast<std::int64_t>(returns.flat_index(b, t)), g);
  });
  each([&](std::size_t b, std::size_t t, double g) { returns(b, t) = static_cast<U>(g); });
}

namespace detail {
//! Token whitening's minimum: at least 2 valid tokens of `mask` (unbiased variance), else 1.
template <class M>
void require_whiten_tokens(std::string_view fn, token_view<const M> mask, const whiten_config& w) {
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b) n += row_tokens(mask, b);
  if (n < (w.unbiased ? 2u : 1u))
    detail::fail_value(
        fn, "mask", n,
        w.unbiased ? "whitening needs at least 2 valid tokens" : "whitening needs at least 1 valid token");
}
//! The values of `v` row by row: what a function that writes `v` before a later check can fail
//! puts back on that failure (restore_tokens), so that nothing is written on error.
template <class U>
[[nodiscard]] std::vector<U> saved_tokens(token_view<U> v) {
  std::vector<U> out;
  for (std::size_t b = 0; b < v.rows(); ++b)
    for (std::size_t t = 0; t < v.row_size(b); ++t) out.push_back(v(b, t));
  return out;
}
template <class U>
void restore_tokens(token_view<U> v, const std::vector<U>& saved) noexcept {
  std::size_t i = 0;
  for (std::size_t b = 0; b < v.rows(); ++b)
    for (std::size_t t = 0; t < v.row_size(b); ++t) v(b, t) = saved[i++];
}
}  // namespace detail

//! REINFORCE++: returns and whitened advantages (advantages may alias returns' storage only if
//! the caller does not need the returns). An absent mask (empty view): every token of token_rewards valid.
template <class T, class M, class U>
void reinforce_plus_plus_advantages(token_view<const T> token_rewards, token_view<const M> mask, token_view<U> returns,
                                    token_view<U> advantages, double gamma, const whiten_config& cfg = {},
                                    return_scan scan = return_scan::reset_after_eos) {
  constexpr std::string_view fn = "reinforce_plus_plus_advantages";
  mask = detail::require_token_pair(fn, "token_rewards", token_rewards, mask);
  require_same_shape(fn, "advantages", advantages, "mask", mask);
  require_same_shape(fn, "returns", returns, "mask", mask);
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b) n += row_tokens(mask, b);
  if (n < (cfg.unbiased ? 2u : 1u)) detail::fail_value(fn, "mask", n, "whitening needs at least 2 valid tokens");
  if (!(gamma >= 0.0 && gamma <= 1.0)) detail::fail_value(fn, "gamma", gamma, "must be in [0, 1]");
  require_divisor(fn, "config.eps", cfg.eps);
  require_known(fn, "config.eps_at", cfg.eps_at, whiten_eps::add_to_variance, whiten_eps::floor_variance);
  // The whitened values are range-checked only once the returns exist: on that error the returns
  // get their previous values back (masked_whiten checks before it writes the advantages).
  const std::vector<U> before = detail::saved_tokens(returns);
  require_known(fn, "scan", scan, return_scan::reset_after_eos, return_scan::skip_masked);
  discounted_returns(token_rewards, mask, returns, gamma, scan);
  try {
    masked_whiten(token_view<const U>(returns), mask, advantages, cfg);
  } catch (...) {
    detail::restore_tokens(returns, before);
    throw;
  }
}

//! REINFORCE++-baseline: per-response advantages a_i = group_advantages(scores, `group`) written
//! to every position of row i, then whitened with `whiten`. The default is verl's (a_i = s_i - mu_g,
//! mu = 0 for a singleton; unbiased, eps added, masked output). An absent mask (empty view): every
//! token of advantages' layout valid.
struct reinforce_plus_plus_baseline_config {
  group_advantage_config group{
      .baseline = baseline_kind::group_mean, .scale = scale_kind::none, .singleton = singleton_rule::identity};
  whiten_config whiten{};
};

template <class T, class M, class U>
void reinforce_plus_plus_baseline_advantages(std::span<const T> scores, const group_layout& groups,
                                             token_view<const M> mask, token_view<U> advantages,
                                             const reinforce_plus_plus_baseline_config& cfg) {
  constexpr std::string_view fn = "reinforce_plus_plus_baseline_advantages";
  if (mask.empty()) validate_layout(fn, "advantages", advantages);
  mask = mask_or_all_valid(mask, advantages);
  validate_layout(fn, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  require_same_size(fn, "scores", scores.size(), "mask rows", mask.rows());
  require_same_size(fn, "groups", groups.responses(), "scores", scores.size());
  require_same_shape(fn, "advantages", advantages, "mask", mask);
  require_all_finite(fn, "scores", vector_view<const T>(scores));
  require_known(fn, "config.whiten.eps_at", cfg.whiten.eps_at, whiten_eps::add_to_variance, whiten_eps::floor_variance);
  detail::require_whiten_tokens(fn, mask, cfg.whiten);
  require_divisor(fn, "config.whiten.eps", cfg.whiten.eps);
  // group_advantages validates its configuration and may reject a score before anything is written.
  std::vector<double> in(scores.begin(), scores.end()), a(scores.size());
  group_advantages(std::span<const double>(in), groups, std::span<double>(a), cfg.group);
  // Whitened in place: on a range error of the whitened values, the previous values come back.
  const std::vector<U> before = detail::saved_tokens(advantages);
  for (std::size_t b = 0; b < mask.rows(); ++b)
    for (std::size_t t = 0; t < mask.row_size(b); ++t) advantages(b, t) = static_cast<U>(a[b]);
  try {
    masked_whiten(token_view<const U>(advantages), mask, advantages, cfg.whiten);
  } catch (...) {
    detail::restore_tokens(advantages, before);
    throw;
  }
}

//! verl's REINFORCE++-baseline: (s_i - mu_g) (mu = 0 for a singleton), whitened with `cfg`.
template <class T, class M, class U>
void reinforce_plus_plus_baseline_advantages(std::span<const T> scores, const group_layout& groups,
                                             token_view<const M> mask, token_view<U> advantages,
                                             const whiten_config& cfg = {}) {
  reinforce_plus_plus_baseline_advantages(scores, groups, mask, advantages,
                                          reinforce_plus_plus_baseline_config{.whiten = cfg});
}

ULORL_NAMESPACE_END
