// ulorl/advantage/dynamic_sampling.hpp — DAPO's dynamic sampling filter (Yu et al. 2025, §3.2):
// drop prompt groups whose responses all received the same reward (all correct or all wrong: zero
// advantage, zero gradient), and optionally groups whose mean accuracy falls outside a window
// [min_accuracy, max_accuracy]. Returns a per-response keep mask and counts, so the host can
// over-sample and refill the batch.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"

ULORL_NAMESPACE_BEGIN

struct dynamic_sampling_config {
  bool drop_zero_variance = true;  //!< drop groups whose metric values are all equal
  double min_accuracy = 0.0;       //!< keep groups with min_accuracy <= mean metric <= max_accuracy
  double max_accuracy = 1.0;
  //! Ignore the window (keep any mean). DAPO itself filters only on zero variance.
  bool use_window = false;
};

struct dynamic_sampling_result {
  std::size_t groups = 0;
  std::size_t kept_groups = 0;
  std::size_t zero_variance_groups = 0;  //!< dropped: all values equal
  std::size_t outside_window_groups = 0; //!< dropped: mean outside the window (and not zero-variance)
  std::size_t kept_responses = 0;
};

//! `metric[i]` is what defines accuracy (a 0/1 correctness or the reward itself). Writes
//! keep[i] = 1 for responses of kept groups, 0 otherwise.
template <class T, class K>
[[nodiscard]] dynamic_sampling_result dynamic_sampling_filter(std::span<const T> metric, const group_layout& groups,
                                                              std::span<K> keep, const dynamic_sampling_config& cfg = {}) {
  constexpr std::string_view fn = "dynamic_sampling_filter";
  if (metric.empty()) detail::fail(fn, "metric", "empty batch: at least one response is required");
  require_same_size(fn, "groups", groups.responses(), "metric", metric.size());
  require_same_size(fn, "keep", keep.size(), "metric", metric.size());
  for (std::size_t i = 0; i < metric.size(); ++i)
    if (!std::isfinite(static_cast<double>(metric[i])))
      detail::fail_at(fn, "metric", static_cast<std::int64_t>(i), metric[i], "must be finite");
  if (cfg.use_window) {
    if (!std::isfinite(cfg.min_accuracy)) detail::fail_value(fn, "config.min_accuracy", cfg.min_accuracy, "must be finite");
    if (!std::isfinite(cfg.max_accuracy) || cfg.max_accuracy < cfg.min_accuracy)
      detail::fail_value(fn, "config.max_accuracy", cfg.max_accuracy, "must be finite and >= min_accuracy");
  }
  dynamic_sampling_result r;
  r.groups = groups.count();
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    bool all_equal = true;
    for (auto i : mem) all_equal = all_equal && metric[i] == metric[mem[0]];
    // Scaled (two_pass_moments): a sum of finite values such as 1.7e308 + 1.7e308 would overflow.
    const double mean = two_pass_moments(mem.size(), [&](std::size_t k) { return metric[mem[k]]; }).mean;
    bool kept = true;
    if (cfg.drop_zero_variance && all_equal) {
      kept = false;
      ++r.zero_variance_groups;
    } else if (cfg.use_window && !(mean >= cfg.min_accuracy && mean <= cfg.max_accuracy)) {
      kept = false;
      ++r.outside_window_groups;
    }
    if (kept) {
      ++r.kept_groups;
      r.kept_responses += mem.size();
    }
    for (auto i : mem) keep[i] = kept ? K(1) : K(0);
  }
  return r;
}

ULORL_NAMESPACE_END
