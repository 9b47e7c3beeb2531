// ulorl/advantage/presets.hpp — the frameworks' GRPO-family advantages as named parameter sets of
// `group_advantages` + `broadcast_to_tokens` (never second copies of the algorithm). Each preset
// pins what that framework does (snapshots listed in docs/advantages.md):
//   verl         unbiased std, eps 1e-6 added to std, singleton s/(1+eps), mask applied
//   TRL          unbiased std (group or batch), eps 1e-4, G = 1 gives 0, mask applied
//   OpenRLHF     unbiased std, eps 1e-9, G = 1 rejected, advantages fill up to the last valid token
//   NeMo-RL      leave-one-out baseline and pool std, eps 1e-6, scaling skipped when std is 0,
//                mask not applied
//   Open-Instruct biased std, eps 1e-8
#pragma once

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! A preset: how per-response advantages are computed and how they reach the tokens.
struct advantage_preset {
  group_advantage_config group;
  broadcast_config broadcast;
};

namespace presets {

namespace verl {
//! verl `compute_grpo_outcome_advantage` (norm_adv_by_std = false is Dr. GRPO).
[[nodiscard]] constexpr advantage_preset grpo_advantage(double epsilon = 1e-6, bool norm_adv_by_std = true) noexcept {
  return {{.baseline = baseline_kind::group_mean,
           .scale = norm_adv_by_std ? scale_kind::group_std : scale_kind::none,
           .std = std_estimator::unbiased,
           .eps = epsilon,
           .singleton = singleton_rule::identity},
          {.placement = token_placement::masked, .allow_empty_rows = true}};
}
//! verl `compute_rloo_outcome_advantage`: s_i - mean of the others; a singleton keeps its score.
[[nodiscard]] constexpr advantage_preset rloo_advantage() noexcept {
  return {{.baseline = baseline_kind::leave_one_out, .scale = scale_kind::none, .singleton = singleton_rule::identity},
          {.placement = token_placement::masked, .allow_empty_rows = true}};
}
}  // namespace verl

namespace trl {
enum class scale_rewards { group, batch, none };
//! TRL GRPOTrainer advantages (`scale_rewards`), contiguous groups of num_generations. Throws
//! ulorl::error on an unknown `scale`.
[[nodiscard]] constexpr advantage_preset advantage(scale_rewards scale = scale_rewards::group) {
  require_known("presets::trl::advantage", "scale", scale, scale_rewards::group, scale_rewards::batch,
                scale_rewards::none);
  advantage_preset p{{.baseline = baseline_kind::group_mean,
                      .scale = scale_kind::group_std,
                      .std = std_estimator::unbiased,
                      .eps = 1e-4,
                      .singleton = singleton_rule::zero},
                     {.placement = token_placement::masked, .allow_empty_rows = true}};
  switch (scale) {
    case scale_rewards::group: break;
    case scale_rewards::batch: p.group.scale = scale_kind::batch_std; break;
    case scale_rewards::none: p.group.scale = scale_kind::none; break;
  }
  return p;
}
}  // namespace trl

namespace openrlhf {
enum class advantage_estimator { group_norm, rloo, dr_grpo };
//! OpenRLHF advantages for n_samples_per_prompt contiguous groups. Throws ulorl::error on an
//! unknown estimator.
[[nodiscard]] constexpr advantage_preset advantage(advantage_estimator e) {
  require_known("presets::openrlhf::advantage", "estimator", e, advantage_estimator::group_norm,
                advantage_estimator::rloo, advantage_estimator::dr_grpo);
  advantage_preset p{{.baseline = baseline_kind::group_mean,
                      .scale = scale_kind::group_std,
                      .std = std_estimator::unbiased,
                      .eps = 1e-9,
                      .singleton = singleton_rule::reject},
                     {.placement = token_placement::through_last, .allow_empty_rows = true}};
  switch (e) {
    case advantage_estimator::group_norm: break;
    case advantage_estimator::rloo:
      p.group.baseline = baseline_kind::leave_one_out;
      p.group.scale = scale_kind::none;
      break;
    case advantage_estimator::dr_grpo:
      p.group.scale = scale_kind::none;
      p.group.singleton = singleton_rule::zero;
      break;
  }
  return p;
}
}  // namespace openrlhf

namespace nemo_rl {
//! NeMo-RL GRPO (use_leave_one_out_baseline, normalize_rewards), groups by id, mask not applied.
[[nodiscard]] constexpr advantage_preset advantage(bool leave_one_out = true, bool normalize = true) noexcept {
  return {{.baseline = leave_one_out ? baseline_kind::leave_one_out : baseline_kind::group_mean,
           .scale = !normalize ? scale_kind::none
                    : leave_one_out ? scale_kind::leave_one_out_std
                                    : scale_kind::group_std,
           .std = std_estimator::unbiased,
           .eps = 1e-6,
           .singleton = singleton_rule::zero,
           .zero_std = zero_std_rule::skip},
          {.placement = token_placement::every_position, .allow_empty_rows = true}};
}
}  // namespace nemo_rl

namespace open_instruct {
//! Open-Instruct: `standard` (biased std, eps 1e-8) or `centered` (mean only).
[[nodiscard]] constexpr advantage_preset advantage(bool standard = true) noexcept {
  return {{.baseline = baseline_kind::group_mean,
           .scale = standard ? scale_kind::group_std : scale_kind::none,
           .std = std_estimator::biased,
           .eps = 1e-8,
           .singleton = singleton_rule::zero},
          {.placement = token_placement::masked, .allow_empty_rows = true}};
}
}  // namespace open_instruct

}  // namespace presets

ULORL_NAMESPACE_END
