// ulorl/advantage/pass_at_k.hpp — GRPO-style Pass@k advantages (Chen et al. 2025, "Pass@k training
// for adaptively balancing exploration and exploitation", arXiv 2503.19595): per group only the best
// response learns, by how much it beats the runner-up,
//   a_i = (s_max - s_second) / (std_g + eps)   for i the group's best response (first on a tie),
//   a_j = 0                                     for every other member,
// with s_second the second largest score (= s_max on a tie for the maximum, so a tie gives 0) and
// std_g the unbiased standard deviation of the group's scores (without `scale_by_std`, no division).
// A group of fewer than 2 responses is an error. Matches verl's `compute_grpo_passk_outcome_advantage`
// (verl-project/verl 1dda039b; its scores are the rows' reward sums, response_scores, and the result is
// broadcast onto the mask, broadcast_to_tokens).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ulorl/advantage/baselines.hpp"
#include "ulorl/advantage/groups.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"

ULORL_NAMESPACE_BEGIN

struct pass_at_k_config {
  double eps = 1e-6;         //!< added to the group's std; finite and >= 0
  bool scale_by_std = true;  //!< divide by std_g + eps (verl's norm_adv_by_std_in_grpo)
};

template <class T>
void pass_at_k_advantages(std::span<const T> scores, const group_layout& groups, std::span<T> out,
                          const pass_at_k_config& cfg = {}) {
  constexpr std::string_view fn = "pass_at_k_advantages";
  detail::validate_scores(fn, scores, groups, out.size());
  require_non_negative(fn, "config.eps", cfg.eps);
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    if (mem.size() < 2)
      detail::fail_at(fn, "groups", static_cast<std::int64_t>(mem[0]), mem.size(),
                      "Pass@k needs at least 2 responses per group (this response's group size shown)");
  }
  // The best member and its advantage. In the moments' scale 2^e neither the gap ({max, -max}) nor
  // the std overflows, and the ratio does not depend on e; unscaled, the gap may exceed T (an error).
  const auto best = [&](std::span<const std::uint32_t> mem, std::size_t& at) {
    std::size_t top = 0, second = 1;
    if (scores[mem[1]] > scores[mem[0]]) top = 1, second = 0;
    for (std::size_t k = 2; k < mem.size(); ++k) {
      if (scores[mem[k]] > scores[mem[top]])
        second = top, top = k;
      else if (scores[mem[k]] > scores[mem[second]])
        second = k;
    }
    at = mem[top];
    const moments m = two_pass_moments(mem.size(), [&](std::size_t k) { return scores[mem[k]]; });
    const double gap = std::ldexp(static_cast<double>(scores[mem[top]]), -m.exponent) -
                       std::ldexp(static_cast<double>(scores[mem[second]]), -m.exponent);
    if (gap == 0.0) return 0.0;
    if (!cfg.scale_by_std) return std::ldexp(gap, m.exponent);
    return gap / (m.scaled_stddev(true) + std::ldexp(cfg.eps, -m.exponent));
  };
  for (std::size_t g = 0; g < groups.count(); ++g) {
    std::size_t at = 0;
    const double a = best(groups.members(g), at);
    require_result_in_range<T>(fn, "out", static_cast<std::int64_t>(at), a);
  }
  for (std::size_t g = 0; g < groups.count(); ++g) {
    const auto mem = groups.members(g);
    std::size_t at = 0;
    const double a = best(mem, at);
    for (auto i : mem) out[i] = T(0);
    out[at] = static_cast<T>(a);
  }
}

ULORL_NAMESPACE_END
