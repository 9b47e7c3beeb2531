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
// Statistics are two-pass in double, scaled by a power of two (core/numerics.hpp), so that any
// finite scores give exact advantages (a std or M2 beyond the double range included, e.g. {max,
// -max}); an advantage that itself exceeds the score type's range is an error. The leave-one-out
// std removes one element from the group's deviations and falls back to an explicit two-pass over
// the pool when that would cancel. See docs/advantages.md for the frameworks side by side.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
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
  require_known(fn, "config.baseline", cfg.baseline, baseline_kind::group_mean, baseline_kind::leave_one_out,
                baseline_kind::none);
  require_known(fn, "config.scale", cfg.scale, scale_kind::none, scale_kind::group_std, scale_kind::leave_one_out_std,
                scale_kind::batch_std);
  require_known(fn, "config.std", cfg.std, std_estimator::unbiased, std_estimator::biased);
  require_known(fn, "config.eps_at", cfg.eps_at, eps_placement::add_to_std, eps_placement::add_to_variance);
  require_known(fn, "config.singleton", cfg.singleton, singleton_rule::zero, singleton_rule::identity,
                singleton_rule::reject);
  require_known(fn, "config.zero_std", cfg.zero_std, zero_std_rule::divide, zero_std_rule::skip);
  if (cfg.scale == scale_kind::none) return;
  if (!std::isfinite(cfg.eps)) fail_value(fn, "config.eps", cfg.eps, "must be finite");
  if (cfg.zero_std == zero_std_rule::skip) {
    if (cfg.eps < 0) fail_value(fn, "config.eps", cfg.eps, "must be >= 0");
  } else if (cfg.eps <= 0) {
    fail_value(fn, "config.eps", cfg.eps, "must be > 0: it divides when a group's std is 0");
  }
  if (cfg.eps != 0.0) require_divisor(fn, "config.eps", cfg.eps);
}

//! A double m · 2^e: the group statistics keep their power-of-two scale apart, so that a std or
//! an M2 beyond the double range ({max, -max}) still gives the representable advantage.
struct scaled_double {
  double m = 0.0;
  int e = 0;
};

//! The std of the pool "group without member k" (unbiased: n - 2, biased: n - 1 divisor), robustly:
//! the group's scaled M2 minus member k's share d_k^2 n / (n - 1) while that loses at most one bit
//! (the difference keeps over half of M2), else an explicit two-pass over the pool. The shares sum
//! to M2 n / (n - 1) <= 2 M2, so at most three members of a group take the O(n) pass: O(n) per group.
template <class T>
scaled_double leave_one_out_std(std::span<const T> scores, std::span<const std::uint32_t> members, std::size_t k,
                                const moments& group, bool unbiased) {
  const std::size_t pool = members.size() - 1;
  if (pool < (unbiased ? 2u : 1u)) return {};
  const double div = static_cast<double>(unbiased ? pool - 1 : pool);
  const double n = static_cast<double>(members.size());
  const double d = group.scaled_deviation(static_cast<double>(scores[members[k]]));
  const double m2 = group.scaled_m2 - d * d * n / (n - 1.0);
  // Removing a member that carries much of the group's spread cancels: the rounding error of M2
  // (a few ulps of M2) would grow by M2 / m2 in the pool's M2, so recompute its deviations then.
  if (m2 > 0.5 * group.scaled_m2) return {std::sqrt(m2 / div), group.exponent};
  const auto p = two_pass_moments(pool, [&](std::size_t j) {
    return static_cast<double>(scores[members[j < k ? j : j + 1]]);
  });
  return {p.scaled_stddev(unbiased), p.exponent};
}

//! centered / D with D = sigma + eps or sqrt(sigma^2 + eps), all in scaled form; the result is
//! inf where it exceeds the double range. sigma is scaled by 2^sigma.e only where eps is
//! comparable to or below it, so ldexp(eps, ...) cannot overflow.
inline double scaled_quotient(scaled_double centered, scaled_double sigma, double eps, eps_placement at) {
  const int eps_e = eps > 0.0 ? std::ilogb(eps) : std::numeric_limits<int>::min();
  scaled_double den;
  if (sigma.m == 0.0) {
    den = {at == eps_placement::add_to_std ? eps : std::sqrt(eps), 0};
  } else if (at == eps_placement::add_to_std) {
    den = sigma.e >= eps_e ? scaled_double{sigma.m + std::ldexp(eps, -sigma.e), sigma.e}
                           : scaled_double{std::ldexp(sigma.m, sigma.e) + eps, 0};
  } else if (2 * sigma.e >= eps_e) {
    den = {std::sqrt(sigma.m * sigma.m + std::ldexp(eps, -2 * sigma.e)), sigma.e};
  } else {
    const double sg = std::ldexp(sigma.m, sigma.e);
    den = {std::sqrt(sg * sg + eps), 0};
  }
  // Mantissas normalised to [0.5, 1): their quotient lies in (0.5, 2) and the exponents carry the
  // range, so only the final ldexp can overflow (to inf) or underflow (to a subnormal or 0).
  int ce = 0, de = 0;
  const double cm = std::frexp(centered.m, &ce), dm = std::frexp(den.m, &de);
  return std::ldexp(cm / dm, centered.e + ce - den.e - de);
}

}  // namespace detail

//! Per-response advantages. `scores[i]` is response i's scalar reward, `groups` its prompt groups;
//! writes `out[i]` (may alias `scores`). Throws ulorl::error before writing on: size mismatch,
//! non-finite scores, a singleton group under singleton_rule::reject, eps <= 0 where it divides, an
//! advantage beyond the range of T (e.g. s - mean = 4/3 max for {max, -max, -max} without scaling).
//! Allocates one double per response for the results.
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
  const auto finish = [&](detail::scaled_double centered, detail::scaled_double sigma) {
    if (cfg.scale == scale_kind::none || (sigma.m == 0.0 && cfg.zero_std == zero_std_rule::skip))
      return std::ldexp(centered.m, centered.e);
    return detail::scaled_quotient(centered, sigma, cfg.eps, cfg.eps_at);
  };
  moments batch;
  if (cfg.scale == scale_kind::batch_std)
    batch = two_pass_moments(scores.size(), [&](std::size_t i) { return scores[i]; });
  const detail::scaled_double batch_sigma{batch.scaled_stddev(unbiased), batch.exponent};

  // Every advantage is computed before any is written: an unrepresentable one throws with `out`
  // untouched, and `out` may alias `scores`.
  std::vector<double> results(scores.size());
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto members = groups.members(g);
    const std::size_t n = members.size();
    const auto value = [&](std::size_t k) { return static_cast<double>(scores[members[k]]); };
    if (n == 1) {
      const double s = value(0);
      // singleton_rule::zero: a lone response carries no group-relative signal.
      double a = 0.0;
      if (cfg.singleton == singleton_rule::identity) a = finish({s, 0}, {1.0, 0});
      results[members[0]] = a;
      continue;
    }
    const moments m = two_pass_moments(n, value);
    const detail::scaled_double group_sigma{m.scaled_stddev(unbiased), m.exponent};
    const double dn = static_cast<double>(n);
    for (std::size_t k = 0; k < n; ++k) {
      // s - b in scaled form: s - mean, or for the leave-one-out baseline
      // s - (mean + (mean - s) / (n - 1)) = (s - mean) n / (n - 1).
      detail::scaled_double centered{value(k), 0};
      if (cfg.baseline == baseline_kind::group_mean) centered = {m.scaled_deviation(value(k)), m.exponent};
      if (cfg.baseline == baseline_kind::leave_one_out)
        centered = {m.scaled_deviation(value(k)) * (dn / (dn - 1.0)), m.exponent};
      detail::scaled_double sigma;
      switch (cfg.scale) {
        case scale_kind::none: break;
        case scale_kind::group_std: sigma = group_sigma; break;
        case scale_kind::batch_std: sigma = batch_sigma; break;
        case scale_kind::leave_one_out_std: sigma = detail::leave_one_out_std(scores, members, k, m, unbiased); break;
      }
      results[members[k]] = finish(centered, sigma);
    }
  }
  for (std::size_t i = 0; i < scores.size(); ++i)
    if (!(std::fabs(results[i]) <= static_cast<double>(std::numeric_limits<T>::max())))  // no UB cast to T
      detail::fail_at(fn, "scores", static_cast<std::int64_t>(i), scores[i],
                      std::string("its advantage (s - b) / D is not representable in ") +
                          (std::is_same_v<T, float> ? "float" : std::is_same_v<T, double> ? "double" : "the score type") +
                          " (it exceeds the largest finite value)");
  for (std::size_t i = 0; i < scores.size(); ++i) out[i] = static_cast<T>(results[i]);
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
