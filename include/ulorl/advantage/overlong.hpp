// ulorl/advantage/overlong.hpp — reward shaping for responses that run long.
//   DAPO soft overlong punishment (Yu et al. 2025, Eq. 13; verl's DAPO reward manager):
//     penalty(L) = min(-(L - (L_max - L_cache)) / L_cache · factor, 0), no lower bound
//     (L > L_max gives less than -factor);
//   TRL's `get_soft_overlong_punishment`: 0 for L <= L_max - c, (L_max - c - L) / c inside the
//     cache window, -1 beyond L_max;
//   UloRL's rule (Du et al. 2025): a truncated response (hit L_max without EOS) is incorrect —
//     its reward is replaced by the incorrect-answer reward.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

struct dapo_overlong_config {
  double max_length = 0;      //!< L_max (tokens)
  double buffer_length = 0;   //!< L_cache: the soft window before L_max, > 0 and <= L_max
  double penalty_factor = 1;  //!< >= 0
};

//! One response's DAPO penalty (<= 0).
ULORL_HD constexpr double dapo_overlong_penalty(double length, const dapo_overlong_config& c) noexcept {
  const double p = -(length - (c.max_length - c.buffer_length)) / c.buffer_length * c.penalty_factor;
  return p < 0.0 ? p : 0.0;
}

struct soft_overlong_config {
  double max_length = 0;    //!< L_max
  double cache_length = 0;  //!< c >= 0, <= L_max
};

ULORL_HD constexpr double soft_overlong_penalty(double length, const soft_overlong_config& c) noexcept {
  const double start = c.max_length - c.cache_length;
  if (length <= start) return 0.0;
  if (length <= c.max_length) return (start - length) / c.cache_length;
  return -1.0;
}

namespace detail {
template <class L>
void require_lengths(std::string_view fn, std::span<const L> lengths) {
  if (lengths.empty()) fail(fn, "lengths", "empty batch: at least one response is required");
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (!(lengths[i] >= L(0)) || !std::isfinite(static_cast<double>(lengths[i])))
      fail_at(fn, "lengths", static_cast<std::int64_t>(i), lengths[i], "must be finite and >= 0");
}
}  // namespace detail

//! penalties[i] = dapo_overlong_penalty(lengths[i]); add them to the scores (see overlong_shaped).
template <class L, class T>
void dapo_overlong_penalties(std::span<const L> lengths, std::span<T> penalties, const dapo_overlong_config& cfg) {
  constexpr std::string_view fn = "dapo_overlong_penalties";
  detail::require_lengths(fn, lengths);
  require_same_size(fn, "penalties", penalties.size(), "lengths", lengths.size());
  require_divisor(fn, "config.buffer_length", cfg.buffer_length);
  if (!std::isfinite(cfg.max_length) || cfg.max_length < cfg.buffer_length)
    detail::fail_value(fn, "config.max_length", cfg.max_length, "must be finite and >= buffer_length");
  if (!(cfg.penalty_factor >= 0) || !std::isfinite(cfg.penalty_factor))
    detail::fail_value(fn, "config.penalty_factor", cfg.penalty_factor, "must be finite and >= 0");
  // A penalty beyond T's range (a large penalty_factor) is an error, found before anything is written.
  for (std::size_t i = 0; i < lengths.size(); ++i)
    require_result_in_range<T>(fn, "penalties", static_cast<std::int64_t>(i), dapo_overlong_penalty(static_cast<double>(lengths[i]), cfg));
  for (std::size_t i = 0; i < lengths.size(); ++i)
    penalties[i] = static_cast<T>(dapo_overlong_penalty(static_cast<double>(lengths[i]), cfg));
}

template <class L, class T>
void soft_overlong_penalties(std::span<const L> lengths, std::span<T> penalties, const soft_overlong_config& cfg) {
  constexpr std::string_view fn = "soft_overlong_penalties";
  detail::require_lengths(fn, lengths);
  require_same_size(fn, "penalties", penalties.size(), "lengths", lengths.size());
  if (!(cfg.cache_length >= 0) || !std::isfinite(cfg.cache_length))
    detail::fail_value(fn, "config.cache_length", cfg.cache_length, "must be finite and >= 0");
  if (cfg.cache_length != 0.0) require_divisor(fn, "config.cache_length", cfg.cache_length);
  if (!std::isfinite(cfg.max_length) || cfg.max_length < cfg.cache_length)
    detail::fail_value(fn, "config.max_length", cfg.max_length, "must be finite and >= cache_length");
  for (std::size_t i = 0; i < lengths.size(); ++i)
    penalties[i] = static_cast<T>(soft_overlong_penalty(static_cast<double>(lengths[i]), cfg));
}

//! UloRL: scores[i] = incorrect_reward wherever truncated[i] != 0 (in place). Returns how many.
template <class T, class F>
std::size_t truncated_as_incorrect(std::span<T> scores, std::span<const F> truncated, double incorrect_reward = 0.0) {
  constexpr std::string_view fn = "truncated_as_incorrect";
  require_same_size(fn, "truncated", truncated.size(), "scores", scores.size());
  require_finite(fn, "incorrect_reward", incorrect_reward);
  std::size_t n = 0;
  for (std::size_t i = 0; i < scores.size(); ++i)
    if (truncated[i] != F(0)) {
      scores[i] = static_cast<T>(incorrect_reward);
      ++n;
    }
  return n;
}

ULORL_NAMESPACE_END
