// ulorl/advantage/group_advantage.hpp — group-relative advantages of the GRPO family, one general
// formula with every knob the frameworks disagree on made explicit:
//
//   a_i = (s_i - b_i) / D_i,   D_i = sigma_i + eps  (or sqrt(sigma_i^2 + eps)),
//
//   b_i:     group mean (GRPO, Shao et al. 2024), leave-one-out mean (RLOO, Ahmadian et al. 2024;
//            NeMo-RL's default) or 0;
//   sigma_i: none (Dr. GRPO, Liu et al. 2025: a_i = s_i - b_i), the group std, the std of the
//            leave-one-out pool, or the std of the whole batch (TRL scale_rewards="batch"); biased
//            (n) or unbiased (n-1);
//   singletons (a group of one response): 0, the "identity" rule (b = 0, sigma = 1: verl), or an
//            error (OpenRLHF, whose code divides by zero);
//   a zero sigma: divide by eps anyway (verl, TRL: gives 0 when s_i = b_i) or skip scaling (NeMo-RL).
//
// Statistics are two-pass in double; the leave-one-out std removes one element from the group's
// deviations and falls back to an explicit two-pass over the pool when that would cancel. See
// docs/advantages.md for the frameworks side by side.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"

ULORL_NAMESPACE_BEGIN

enum class baseline_kind { group_mean, leave_one_out, none };
enum class scale_kind { none, group_std, leave_one_out_std, batch_std };
enum class std_estimator { unbiased, biased };
enum class eps_placement { add_to_std, add_to_variance };
enum class singleton_rule { zero, identity, reject };
enum class zero_std_rule { divide, skip };

struct group_advantage_config {
  baseline_kind baseline = baseline_kind::group_mean;
  scale_kind scale = scale_kind::group_std;
  std_estimator std = std_estimator::unbiased;
  double eps = 1e-6;                                 //!< must be > 0 whenever it can be a divisor
  eps_placement eps_at = eps_placement::add_to_std;  //!< (s-b)/(sigma+eps) or (s-b)/sqrt(sigma^2+eps)
  singleton_rule singleton = singleton_rule::zero;
  zero_std_rule zero_std = zero_std_rule::divide;
};

namespace detail {

inline void validate_group_advantage_config(std::string_view fn, const group_advantage_config& cfg) {
  if (cfg.scale == scale_kind::none) return;
  if (!std::isfinite(cfg.eps)) fail_value(fn, "config.eps", cfg.eps, "must be finite");
  if (cfg.zero_std == zero_std_rule::skip) {
    if (cfg.eps < 0) fail_value(fn, "config.eps", cfg.eps, "must be >= 0");
  } else if (cfg.eps <= 0) {
    fail_value(fn, "config.eps", cfg.eps, "must be > 0: it divides when a group's std is 0");
  }
}

//! Σ_{j in pool} (s_j - mean_pool)^2 for the pool "group without member k", robustly.
template <class T>
double leave_one_out_m2(std::span<const T> scores, std::span<const std::uint32_t> members, std::size_t k,
                        const moments& group) {
  const double n = static_cast<double>(members.size());
  const double d = static_cast<double>(scores[members[k]]) - group.mean;
  const double m2 = group.m2 - d * d * n / (n - 1.0);
  // Removing an element that carries almost all of the group's spread cancels catastrophically;
  // then recompute the pool's deviations directly (O(n), rare).
  if (m2 > 1e-6 * group.m2) return m2;
  const auto pool = two_pass_moments(members.size() - 1, [&](std::size_t j) {
    return static_cast<double>(scores[members[j < k ? j : j + 1]]);
  });
  return pool.m2;
}

}  // namespace detail

//! Per-response advantages. `scores[i]` is response i's scalar reward, `groups` its prompt groups;
//! writes `out[i]` (may alias `scores`). Throws ulorl::error before writing on: size mismatch,
//! non-finite scores, a singleton group under singleton_rule::reject, eps <= 0 where it divides.
template <class T>
void group_advantages(std::span<const T> scores, const group_layout& groups, std::span<T> out,
                      const group_advantage_config& cfg = {}) {
  constexpr std::string_view fn = "group_advantages";
  if (scores.empty()) detail::fail(fn, "scores", "empty batch: at least one response is required");
  require_same_size(fn, "groups", groups.responses(), "scores", scores.size());
  require_same_size(fn, "out", out.size(), "scores", scores.size());
  for (std::size_t i = 0; i < scores.size(); ++i)
    if (!std::isfinite(static_cast<double>(scores[i])))
      detail::fail_at(fn, "scores", static_cast<std::int64_t>(i), scores[i], "must be finite");
  detail::validate_group_advantage_config(fn, cfg);
  if (cfg.singleton == singleton_rule::reject)
    for (std::size_t g = 0; g < groups.count(); ++g)
      if (groups.group_size(g) == 1)
        detail::fail_at(fn, "groups", static_cast<std::int64_t>(groups.members(g)[0]), 1,
                        "response is alone in its group (group size 1) and singleton_rule::reject is set");

  const bool unbiased = cfg.std == std_estimator::unbiased;
  const auto denom = [&](double sigma) {
    return cfg.eps_at == eps_placement::add_to_std ? sigma + cfg.eps : std::sqrt(sigma * sigma + cfg.eps);
  };
  const auto finish = [&](double centered, double sigma) {
    if (cfg.scale == scale_kind::none) return centered;
    if (sigma == 0.0 && cfg.zero_std == zero_std_rule::skip) return centered;
    return centered / denom(sigma);
  };
  double batch_sigma = 0.0;
  if (cfg.scale == scale_kind::batch_std)
    batch_sigma = two_pass_moments(scores.size(), [&](std::size_t i) { return scores[i]; }).stddev(unbiased);

  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto members = groups.members(g);
    const std::size_t n = members.size();
    const auto value = [&](std::size_t k) { return static_cast<double>(scores[members[k]]); };
    if (n == 1) {
      const double s = value(0);
      // singleton_rule::zero: a lone response carries no group-relative signal.
      double a = 0.0;
      if (cfg.singleton == singleton_rule::identity) a = cfg.scale == scale_kind::none ? s : s / denom(1.0);
      out[members[0]] = static_cast<T>(a);
      continue;
    }
    const moments m = two_pass_moments(n, value);
    const double group_sigma = m.stddev(unbiased);
    // Compute every member's advantage before writing, since out may alias scores.
    double results_small[64];
    std::vector<double> results_big;
    double* results = results_small;
    if (n > 64) {
      results_big.resize(n);
      results = results_big.data();
    }
    const double dn = static_cast<double>(n);
    for (std::size_t k = 0; k < n; ++k) {
      const double s = value(k);
      double b = 0.0;
      if (cfg.baseline == baseline_kind::group_mean) b = m.mean;
      if (cfg.baseline == baseline_kind::leave_one_out) b = m.mean + (m.mean - s) / (dn - 1.0);
      double sigma = 0.0;
      switch (cfg.scale) {
        case scale_kind::none: break;
        case scale_kind::group_std: sigma = group_sigma; break;
        case scale_kind::batch_std: sigma = batch_sigma; break;
        case scale_kind::leave_one_out_std: {
          const std::size_t pool = n - 1;
          if (pool >= (unbiased ? 2u : 1u))
            sigma = std::sqrt(detail::leave_one_out_m2(scores, members, k, m) /
                              static_cast<double>(unbiased ? pool - 1 : pool));
          break;
        }
      }
      results[k] = finish(s - b, sigma);
    }
    for (std::size_t k = 0; k < n; ++k) out[members[k]] = static_cast<T>(results[k]);
  }
}

//! Convenience overloads: groups from ids, or contiguous groups of a fixed size.
template <class T, class I>
void group_advantages(std::span<const T> scores, std::span<const I> group_ids, std::span<T> out,
                      const group_advantage_config& cfg = {}) {
  if (scores.empty()) detail::fail("group_advantages", "scores", "empty batch: at least one response is required");
  require_same_size("group_advantages", "group_ids", group_ids.size(), "scores", scores.size());
  group_advantages(scores, group_layout::from_ids(group_ids, "group_advantages"), out, cfg);
}
template <class T>
void group_advantages(std::span<const T> scores, std::size_t group_size, std::span<T> out,
                      const group_advantage_config& cfg = {}) {
  group_advantages(scores, group_layout::fixed(scores.size(), group_size, "group_advantages"), out, cfg);
}

ULORL_NAMESPACE_END
