// ulorl/advantage/baselines.hpp — group advantages with baselines other than the plain mean:
//   GPG (Chu et al. 2025, "GPG: a simple and strong RL baseline"):
//       a_i = alpha · (s_i - mu_g) / f_norm,  alpha = B / max(#{i : s_i != 0}, 1)  (mu = 0 for a
//       singleton), matching verl's `compute_gpg_outcome_advantage`;
//   OPO (Hao et al. 2025, optimal-baseline on-policy RL): a length-weighted baseline
//       b_g = Σ_g L_j s_j / Σ_g L_j (b = 0 for a singleton), a_i = s_i - b_g, with L_j the number of
//       valid tokens of response j (verl's `compute_opo_outcome_advantage`).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"

ULORL_NAMESPACE_BEGIN

namespace detail {
template <class T>
void validate_scores(std::string_view fn, std::span<const T> scores, const group_layout& groups, std::size_t out_size) {
  if (scores.empty()) fail(fn, "scores", "empty batch: at least one response is required");
  require_same_size(fn, "groups", groups.responses(), "scores", scores.size());
  require_same_size(fn, "out", out_size, "scores", scores.size());
  for (std::size_t i = 0; i < scores.size(); ++i)
    if (!std::isfinite(static_cast<double>(scores[i])))
      fail_at(fn, "scores", static_cast<std::int64_t>(i), scores[i], "must be finite");
}
}  // namespace detail

struct gpg_config {
  double f_norm = 1.0;  //!< must be finite and != 0
};

template <class T>
void gpg_advantages(std::span<const T> scores, const group_layout& groups, std::span<T> out,
                    const gpg_config& cfg = {}) {
  constexpr std::string_view fn = "gpg_advantages";
  detail::validate_scores(fn, scores, groups, out.size());
  require_divisor(fn, "config.f_norm", cfg.f_norm, /*signed_ok=*/true);
  std::size_t nonzero = 0;
  for (auto s : scores) nonzero += s != T(0);
  const double alpha = static_cast<double>(scores.size()) / static_cast<double>(nonzero > 0 ? nonzero : 1);
  // alpha (s - mu) / f_norm from the scaled deviation (s - mu) / 2^e, which cannot overflow
  // ({max, -max}); a value beyond T's range is an error, found before anything is written.
  const auto each = [&](auto&& emit) {
    for (std::size_t g = 0; g < groups.count(); ++g) {
      const auto mem = groups.members(g);
      const moments m = two_pass_moments(mem.size(), [&](std::size_t k) { return scores[mem[k]]; });
      for (auto i : mem)
        emit(i, mem.size() == 1
                    ? alpha * static_cast<double>(scores[i]) / cfg.f_norm
                    : std::ldexp(alpha * m.scaled_deviation(static_cast<double>(scores[i])) / cfg.f_norm, m.exponent));
    }
  };
  each([&](std::size_t i, double a) { require_result_in_range<T>(fn, "out", static_cast<std::int64_t>(i), a); });
  each([&](std::size_t i, double a) { out[i] = static_cast<T>(a); });
}

//! `lengths[i]` is response i's valid-token count (any non-negative arithmetic type).
template <class T, class L>
void opo_advantages(std::span<const T> scores, std::span<const L> lengths, const group_layout& groups,
                    std::span<T> out) {
  constexpr std::string_view fn = "opo_advantages";
  detail::validate_scores(fn, scores, groups, out.size());
  require_same_size(fn, "lengths", lengths.size(), "scores", scores.size());
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (!(lengths[i] >= L(0)) || !std::isfinite(static_cast<double>(lengths[i])))
      detail::fail_at(fn, "lengths", static_cast<std::int64_t>(i), lengths[i], "must be finite and >= 0");
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    if (mem.size() < 2) continue;
    double total = 0.0;
    for (auto i : mem) total += static_cast<double>(lengths[i]);
    if (total <= 0.0)
      detail::fail_at(fn, "lengths", static_cast<std::int64_t>(mem[0]), lengths[mem[0]],
                      "every response of this group has length 0: the length-weighted baseline is undefined");
  }
  // The length-weighted mean; where Σ l s overflows, as Σ (l / Σ l) s (weights summing to 1).
  const auto baseline = [&](const auto& mem) {
    if (mem.size() < 2) return 0.0;
    double num = 0.0, den = 0.0;
    for (auto i : mem) {
      num += static_cast<double>(lengths[i]) * static_cast<double>(scores[i]);
      den += static_cast<double>(lengths[i]);
    }
    double b = num / den;
    if (!std::isfinite(b)) {
      b = 0.0;
      for (auto i : mem) b += static_cast<double>(lengths[i]) / den * static_cast<double>(scores[i]);
    }
    return b;
  };
  // A value s - b beyond T's range is an error, found before anything is written.
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    const double b = baseline(mem);
    for (auto i : mem)
      require_result_in_range<T>(fn, "out", static_cast<std::int64_t>(i), static_cast<double>(scores[i]) - b);
  }
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    const double b = baseline(mem);
    for (auto i : mem) out[i] = static_cast<T>(static_cast<double>(scores[i]) - b);
  }
}

ULORL_NAMESPACE_END
