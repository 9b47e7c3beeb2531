// ulorl/loss/entropy.hpp — the entropy bonus: loss term -coef * H per token, d loss / d H = -coef.
// verl `entropy_coeff`, OpenRLHF `entropy_loss_coef`: the term is aggregated with the same
// normaliser as the policy loss (see aggregation.hpp). The per-token entropy itself comes from the
// logits (ulorl/logits/); its gradient d loss / d H goes back there.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN

template <class T>
struct entropy_value {
  T value;  //!< -coef * H
  T grad;   //!< d value / d H = -coef
};

//! One token's entropy term.
template <class T>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr entropy_value<T> entropy_term(T entropy, T coef) noexcept {
  return {-coef * entropy, -coef};
}

//! Aggregated entropy bonus: sum_bt w_bt (-coef H_bt) m_bt with the aggregation weights of `norm`;
//! writes d loss / d H into `grad_entropy` (0 on masked tokens). An absent mask (empty view): every
//! token of `entropy` valid. Validates before writing: a loss or a gradient beyond T's range is an
//! error (nothing written).
template <class T, class M>
[[nodiscard]] double entropy_loss(token_view<const T> entropy, token_view<const M> mask, token_view<T> grad_entropy,
                                  double coef, const agg_normalizer& norm) {
  constexpr std::string_view fn = "entropy_loss";
  validate_layout(fn, "entropy", entropy);
  mask = mask_or_all_valid(mask, entropy);
  require_same_shape(fn, "mask", mask, "entropy", entropy);
  require_same_shape(fn, "grad_entropy", grad_entropy, "entropy", entropy);
  require_binary_mask(fn, "mask", mask);
  require_finite(fn, "coef", coef);
  validate_normalizer(fn, norm);
  require_all_finite(fn, "entropy", entropy);
  double loss = 0;
  for (std::size_t b = 0; b < entropy.rows(); ++b) {
    const std::size_t n = row_tokens(mask, b);
    if (n == 0) continue;
    const double w = row_weight(norm, n);
    require_result_in_range<T>(fn, "grad_entropy", -1, w * -coef, "the gradient of row " + std::to_string(b));
    for (std::size_t t = 0; t < entropy.row_size(b); ++t) {
      const bool valid = mask(b, t) != M(0);
      const auto e = entropy_term(static_cast<double>(entropy(b, t)), coef);
      loss += valid ? w * e.value : 0.0;
    }
  }
  require_result_in_range<T>(fn, "loss", -1, loss);
  for (std::size_t b = 0; b < entropy.rows(); ++b) {
    const double w = row_weight(norm, row_tokens(mask, b));
    for (std::size_t t = 0; t < entropy.row_size(b); ++t)
      grad_entropy(b, t) = mask(b, t) != M(0) ? static_cast<T>(w * entropy_term(static_cast<double>(entropy(b, t)), coef).grad) : T(0);
  }
  return loss;
}

ULORL_NAMESPACE_END
