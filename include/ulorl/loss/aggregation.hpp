// ulorl/loss/aggregation.hpp — reducing per-token losses to one scalar, partition-exact.
//
// Every mode is  loss = scale * sum_b sum_t L[b,t] m[b,t] / D_b  with
//   token_mean               D_b = N            (global valid-token count)
//   seq_mean_token_sum       D_b = S            (global count of sequences)
//   seq_mean_token_mean      D_b = S * n_b      (n_b: the row's own tokens; rows are never split)
//   seq_mean_token_sum_norm  D_b = C            (verl's loss_scale_factor; Dr. GRPO: C = max length)
//   constant                 D_b = C            (Dr. GRPO / TRL dr_grpo: C = B * max_completion_length)
// The denominators N, S, C describe the WHOLE global batch of one optimizer step: count them once
// (`count_batch` per micro-batch, summed - the host all-reduces across ranks), build the
// `agg_normalizer` once and pass it to every micro-batch call. Then the sum of the micro-batch
// losses and gradients over any split into micro-batches and ranks equals the full-batch loss and
// gradient exactly (in real arithmetic; 1e-12 relative in float64). `scale` is the host's
// reduction convention: 1 when gradients are summed, the data-parallel size when DDP averages them
// (verl and OpenRLHF multiply by dp_size). The peers' local normalisers (each micro-batch divides
// by its own count) are available only through the presets (ulorl/presets/<framework>.hpp), for
// compatibility.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

enum class agg_mode { token_mean, seq_mean_token_sum, seq_mean_token_mean, seq_mean_token_sum_norm, constant };
//! The modes' names ({name, mode}; value_of_name parses them).
inline constexpr std::array<std::pair<std::string_view, agg_mode>, 5> agg_mode_names{
    {{"token_mean", agg_mode::token_mean},
     {"seq_mean_token_sum", agg_mode::seq_mean_token_sum},
     {"seq_mean_token_mean", agg_mode::seq_mean_token_mean},
     {"seq_mean_token_sum_norm", agg_mode::seq_mean_token_sum_norm},
     {"constant", agg_mode::constant}}};

//! Token and sequence counts of (part of) a batch. Counts of disjoint parts add up.
struct batch_counts {
  double tokens = 0;     //!< valid tokens N
  double sequences = 0;  //!< rows with at least one valid token
  double rows = 0;       //!< all rows B
  constexpr batch_counts& operator+=(const batch_counts& o) noexcept {
    tokens += o.tokens, sequences += o.sequences, rows += o.rows;
    return *this;
  }
  friend constexpr batch_counts operator+(batch_counts a, const batch_counts& b) noexcept { return a += b; }
};

//! Counts one micro-batch's mask (validated: layout and 0/1 values). An empty view has no rows: to
//! count a batch without a mask (every token valid), pass its tokens too (the overload below).
template <class M>
[[nodiscard]] batch_counts count_batch(token_view<const M> mask) {
  constexpr std::string_view fn = "count_batch";
  validate_layout(fn, "mask", mask);
  require_binary_mask(fn, "mask", mask);
  batch_counts c;
  c.rows = static_cast<double>(mask.rows());
  for (std::size_t b = 0; b < mask.rows(); ++b) {
    const auto n = row_tokens(mask, b);
    c.tokens += static_cast<double>(n);
    c.sequences += n > 0 ? 1.0 : 0.0;
  }
  return c;
}
//! Counts the mask of a micro-batch whose tokens are `tokens` (e.g. its log_prob): an absent mask
//! (empty view) counts every token of that layout as valid; a given one must have its shape.
template <class M, class U>
[[nodiscard]] batch_counts count_batch(token_view<const M> mask, const token_view<U>& tokens) {
  constexpr std::string_view fn = "count_batch";
  validate_layout(fn, "tokens", tokens);
  mask = mask_or_all_valid(mask, tokens);
  require_same_shape(fn, "mask", mask, "tokens", tokens);
  return count_batch(mask);
}

//! The step's normaliser: the mode, its denominator (N, S or C above) and the reduction scale.
struct agg_normalizer {
  agg_mode mode = agg_mode::token_mean;
  double denominator = 0.0;
  double scale = 1.0;
};

//! Builds the normaliser of a global batch. `constant` is C for seq_mean_token_sum_norm / constant.
[[nodiscard]] inline agg_normalizer global_normalizer(agg_mode mode, const batch_counts& global, double constant = 0.0,
                                                      double scale = 1.0) noexcept {
  double d = 0.0;
  switch (mode) {
    case agg_mode::token_mean: d = global.tokens; break;
    case agg_mode::seq_mean_token_sum:
    case agg_mode::seq_mean_token_mean: d = global.sequences; break;
    case agg_mode::seq_mean_token_sum_norm:
    case agg_mode::constant: d = constant; break;
  }
  return {mode, d, scale};
}

//! Throws when the normaliser is zero (e.g. zero valid tokens), negative or not finite.
inline void validate_normalizer(std::string_view fn, const agg_normalizer& n) {
  switch (n.mode) {
    case agg_mode::token_mean:
    case agg_mode::seq_mean_token_sum:
    case agg_mode::seq_mean_token_mean:
    case agg_mode::seq_mean_token_sum_norm:
    case agg_mode::constant: break;
    default: detail::fail_value(fn, "normalizer.mode", static_cast<int>(n.mode), "not an agg_mode");
  }
  if (!(n.denominator > 0.0) || !std::isfinite(n.denominator))
    detail::fail_value(fn, "normalizer.denominator", n.denominator,
                       "must be finite and > 0 (a normaliser of zero tokens or sequences)");
  require_divisor(fn, "normalizer.denominator", n.denominator);
  require_finite(fn, "normalizer.scale", n.scale);
  if (!std::isfinite(n.scale / n.denominator))
    detail::fail_value(fn, "normalizer.scale", n.scale, "scale / denominator overflows the double range");
}

//! Weight of every valid token of a row with n_b valid tokens: d loss / d L[b,t].
[[nodiscard]] ULORL_HD constexpr double row_weight(const agg_normalizer& n, std::size_t row_tokens) noexcept {
  if (n.mode == agg_mode::seq_mean_token_mean)
    return row_tokens > 0 ? n.scale / (n.denominator * static_cast<double>(row_tokens)) : 0.0;
  return n.scale / n.denominator;
}

//! loss = scale * sum L m / D_b; writes d loss / d L into `grad` (0 on masked tokens; `grad` may be
//! empty). An absent mask (empty view): every token of loss_mat valid. Validates every input before
//! writing; a loss or a row weight beyond T's range is an error (nothing written). A row's sum
//! that overflows double is recomputed as the sum of the weighted terms.
template <class T, class M>
[[nodiscard]] double agg_loss(token_view<const T> loss_mat, token_view<const M> mask, token_view<T> grad,
                              const agg_normalizer& norm) {
  constexpr std::string_view fn = "agg_loss";
  validate_layout(fn, "loss_mat", loss_mat);
  mask = mask_or_all_valid(mask, loss_mat);
  require_same_shape(fn, "mask", mask, "loss_mat", loss_mat);
  if (!grad.empty()) require_same_shape(fn, "grad", grad, "loss_mat", loss_mat);
  require_binary_mask(fn, "mask", mask);
  validate_normalizer(fn, norm);
  require_all_finite(fn, "loss_mat", loss_mat);
  double loss = 0;
  for (std::size_t b = 0; b < loss_mat.rows(); ++b) {
    const std::size_t n = row_tokens(mask, b);
    if (n == 0) continue;
    const double w = row_weight(norm, n);
    if (!grad.empty()) require_result_in_range<T>(fn, "grad", -1, w, "the weight of row " + std::to_string(b));
    double s = 0;
    for (std::size_t t = 0; t < loss_mat.row_size(b); ++t) s += mask(b, t) != M(0) ? static_cast<double>(loss_mat(b, t)) : 0.0;
    double ws = w * s;
    if (!std::isfinite(ws)) {
      ws = 0;
      for (std::size_t t = 0; t < loss_mat.row_size(b); ++t)
        ws += mask(b, t) != M(0) ? w * static_cast<double>(loss_mat(b, t)) : 0.0;
    }
    loss += ws;
  }
  require_result_in_range<T>(fn, "loss", -1, loss);
  if (!grad.empty())
    for (std::size_t b = 0; b < loss_mat.rows(); ++b) {
      const T w = static_cast<T>(row_weight(norm, row_tokens(mask, b)));
      for (std::size_t t = 0; t < loss_mat.row_size(b); ++t) grad(b, t) = mask(b, t) != M(0) ? w : T(0);
    }
  return loss;
}

//! The loss alone (no gradient).
template <class T, class M>
[[nodiscard]] double agg_loss(token_view<const T> loss_mat, token_view<const M> mask, const agg_normalizer& norm) {
  return agg_loss(loss_mat, mask, token_view<T>{}, norm);
}

ULORL_NAMESPACE_END
