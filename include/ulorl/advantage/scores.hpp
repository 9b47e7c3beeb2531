// ulorl/advantage/scores.hpp — per-response scalar scores from token-level rewards:
// s_i = Σ_t R[i, t] over every position of row i (verl's convention: the mask is not applied, so a
// trainer that places the verifier's reward at the last response token gets exactly that reward).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! out[i] = Σ_t token_rewards(i, t), summed in double. Throws on non-finite rewards or a size
//! mismatch before writing.
template <class T, class U>
void response_scores(token_view<const T> token_rewards, std::span<U> out) {
  constexpr std::string_view fn = "response_scores";
  validate_layout(fn, "token_rewards", token_rewards);
  if (token_rewards.rows() == 0) detail::fail(fn, "token_rewards", "empty batch: at least one response is required");
  require_same_size(fn, "out", out.size(), "token_rewards rows", token_rewards.rows());
  require_all_finite(fn, "token_rewards", token_rewards);
  for (std::size_t b = 0; b < token_rewards.rows(); ++b) {
    const auto row = token_rewards.row(b);
    double s = 0.0;
    for (std::size_t t = 0; t < row.size(); ++t) s += static_cast<double>(row[t]);
    out[b] = static_cast<U>(s);
  }
}

ULORL_NAMESPACE_END
