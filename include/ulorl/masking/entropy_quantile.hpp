// ulorl/masking/entropy_quantile.hpp — the top-entropy-quantile token mask ("Beyond the 80/20 rule",
// Wang et al. 2025; TRL `GRPOTrainer.get_high_entropy_mask`, `top_entropy_quantile`): only the
// highest-entropy share rho of the valid tokens keeps its policy-gradient term.
//   v_0 <= ... <= v_{n-1}   the entropies of the n valid tokens of the batch, sorted
//   pos   = (1 - rho)(n - 1)
//   theta = v_floor(pos) + (pos - floor(pos)) (v_ceil(pos) - v_floor(pos))   (torch.quantile, linear)
//   E[b,t] = [m[b,t] = 1 and H[b,t] >= theta]                                  (n = 0: E = 0)
// rho = 1 keeps every valid token, rho = 0 only the maximum (and its ties). The quantile is taken
// over the whole batch passed in (TRL: the local batch); multiply E into policy_loss's `weights`
// (TRL multiplies it into the per-token policy loss; the KL term and the normaliser are unchanged).
// Scratch: the caller passes a buffer of at least `entropy_quantile_workspace(mask)` doubles (the
// number of valid tokens); nothing is allocated.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! The share of the valid tokens kept (TRL `top_entropy_quantile`, in [0, 1]).
struct entropy_quantile_config {
  double quantile = 1.0;
};

//! The doubles of scratch entropy_quantile_threshold / top_entropy_mask need: the valid tokens.
template <class M>
[[nodiscard]] std::size_t entropy_quantile_workspace(token_view<const M> mask) noexcept {
  std::size_t n = 0;
  for (std::size_t b = 0; b < mask.rows(); ++b)
    for (std::size_t t = 0; t < mask.row_size(b); ++t) n += mask(b, t) != M(0) ? 1u : 0u;
  return n;
}
//! As above for the tokens of `entropy`: an absent mask (empty view) counts every token of its layout.
template <class M, class T>
[[nodiscard]] std::size_t entropy_quantile_workspace(token_view<const M> mask, const token_view<T>& entropy) noexcept {
  return entropy_quantile_workspace(mask_or_all_valid(mask, entropy));
}

namespace detail {
template <class T, class M>
void validate_entropy_quantile(std::string_view fn, token_view<const T> entropy, token_view<const M> mask,
                               const entropy_quantile_config& cfg, std::span<double> scratch) {
  if (!(cfg.quantile >= 0.0 && cfg.quantile <= 1.0))
    detail::fail_value(fn, "quantile", cfg.quantile, "must be in [0, 1]");
  validate_layout(fn, "entropy", entropy);
  mask = mask_or_all_valid(mask, entropy);
  require_same_shape(fn, "mask", mask, "entropy", entropy);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "entropy", entropy);
  for (std::size_t b = 0; b < entropy.rows(); ++b)
    for (std::size_t t = 0; t < entropy.row_size(b); ++t)
      if (mask(b, t) != M(0) && entropy(b, t) < T(0))
        detail::fail_at(fn, "entropy", static_cast<std::int64_t>(entropy.flat_index(b, t)), entropy(b, t),
                        "must be >= 0 (an entropy)");
  const std::size_t need = entropy_quantile_workspace(mask);
  if (scratch.size() < need)
    detail::fail_value(fn, "scratch", static_cast<double>(scratch.size()),
                       "must hold at least entropy_quantile_workspace(mask) doubles");
}
//! theta of validated inputs; `scratch` receives the valid entropies. n = 0: +inf (no token kept).
template <class T, class M>
[[nodiscard]] double entropy_threshold_of(token_view<const T> entropy, token_view<const M> mask, double rho,
                                          std::span<double> scratch) {
  std::size_t n = 0;
  for (std::size_t b = 0; b < entropy.rows(); ++b)
    for (std::size_t t = 0; t < entropy.row_size(b); ++t)
      if (mask(b, t) != M(0)) scratch[n++] = static_cast<double>(entropy(b, t));
  if (n == 0) return std::numeric_limits<double>::infinity();
  const double pos = (1.0 - rho) * static_cast<double>(n - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, n - 1);
  const auto first = scratch.begin(), last = scratch.begin() + static_cast<std::ptrdiff_t>(n);
  std::nth_element(first, first + static_cast<std::ptrdiff_t>(lo), last);
  const double vlo = scratch[lo];
  // The next order statistic is the minimum of the upper part.
  const double vhi = hi == lo ? vlo : *std::min_element(first + static_cast<std::ptrdiff_t>(hi), last);
  return vlo + (pos - static_cast<double>(lo)) * (vhi - vlo);
}
}  // namespace detail

//! theta: the (1 - quantile) linear quantile of the valid tokens' entropies (+inf without valid
//! tokens). Validates first: quantile in [0, 1], equal shapes, 0/1 mask, finite entropies, valid
//! entropies >= 0, scratch large enough. Both layouts; an absent mask (empty view): every token valid.
template <class T, class M>
[[nodiscard]] double entropy_quantile_threshold(token_view<const T> entropy, token_view<const M> mask,
                                                const entropy_quantile_config& cfg, std::span<double> scratch) {
  static_assert(std::is_floating_point_v<T>, "entropies must be float or double");
  constexpr std::string_view fn = "entropy_quantile_threshold";
  detail::validate_entropy_quantile(fn, entropy, mask, cfg, scratch);
  return detail::entropy_threshold_of(entropy, mask_or_all_valid(mask, entropy), cfg.quantile, scratch);
}

//! Writes E[b,t] = [m = 1 and H >= theta] into `keep` (entropy's shape, either layout) and returns
//! theta. Nothing is written when validation fails (see entropy_quantile_threshold).
template <class T, class M, class O>
double top_entropy_mask(token_view<const T> entropy, token_view<const M> mask, token_view<O> keep,
                        const entropy_quantile_config& cfg, std::span<double> scratch) {
  static_assert(std::is_floating_point_v<T>, "entropies must be float or double");
  static_assert(!std::is_const_v<O>, "keep must be writable");
  constexpr std::string_view fn = "top_entropy_mask";
  detail::validate_entropy_quantile(fn, entropy, mask, cfg, scratch);
  mask = mask_or_all_valid(mask, entropy);
  validate_layout(fn, "keep", keep);
  require_same_shape(fn, "keep", keep, "entropy", entropy);
  const double theta = detail::entropy_threshold_of(entropy, mask, cfg.quantile, scratch);
  for (std::size_t b = 0; b < entropy.rows(); ++b)
    for (std::size_t t = 0; t < entropy.row_size(b); ++t)
      keep(b, t) = (mask(b, t) != M(0) && static_cast<double>(entropy(b, t)) >= theta) ? O(1) : O(0);
  return theta;
}

ULORL_NAMESPACE_END
