// ulorl/presets/open_instruct.hpp — Open-Instruct's GRPO advantages under its option name
// `advantage_normalization_type`: standard (biased std, eps 1e-8) or centered (the group mean
// only), as a parameter set of group_advantages + broadcast_to_tokens (mask applied).
#pragma once

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::open_instruct {

//! `advantage_normalization_type`.
enum class advantage_normalization { standard, centered };
//! Open-Instruct options.
struct advantage_options {
  advantage_normalization advantage_normalization_type = advantage_normalization::standard;
};
//! Open-Instruct: `standard` (biased std, eps 1e-8) or `centered` (mean only). Throws ulorl::error on
//! an unknown advantage_normalization_type.
[[nodiscard]] constexpr advantage_preset advantage(const advantage_options& o = {}) {
  require_known("presets::open_instruct::advantage", "advantage_normalization_type", o.advantage_normalization_type,
                advantage_normalization::standard, advantage_normalization::centered);
  return {{.baseline = baseline_kind::group_mean,
           .scale = o.advantage_normalization_type == advantage_normalization::standard ? scale_kind::group_std
                                                                                        : scale_kind::none,
           .std = std_estimator::biased,
           .eps = 1e-8,
           .singleton = singleton_rule::zero},
          {.placement = token_placement::masked, .allow_empty_rows = true}};
}

}  // namespace presets::open_instruct
ULORL_NAMESPACE_END
