// ulorl/advantage/presets.hpp — the frameworks' GRPO-family advantages as named parameter sets of
// `group_advantages` + `broadcast_to_tokens` (never second copies of the algorithm). Each preset
// pins what that framework does (snapshots listed in docs/advantages.md):
//   verl         unbiased std, eps 1e-6 added to std, singleton s/(1+eps), mask applied
//   TRL          unbiased std (group or batch), eps 1e-4, G = 1 gives 0, mask applied
//   OpenRLHF     unbiased std, eps 1e-9, G = 1 rejected, advantages fill up to the last valid token
//   NeMo-RL      leave-one-out baseline and pool std, eps 1e-6, scaling skipped when std is 0,
//                mask not applied
//   Open-Instruct biased std, eps 1e-8
// and the estimators built from other pieces: verl GDPO and the optimal token baseline
// (multi_reward.hpp, optimal_token_baseline.hpp), TRL multi-objective aggregation, NeMo-RL GDPO and
// REINFORCE++ (reinforce_pp.hpp). A preset with options takes an options struct whose fields carry
// the framework's option names: `presets::verl::grpo_advantage({.norm_adv_by_std_in_grpo = false})`.
#pragma once

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/multi_reward.hpp"
#include "ulorl/advantage/optimal_token_baseline.hpp"
#include "ulorl/advantage/reinforce_pp.hpp"
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
//! verl `compute_grpo_outcome_advantage` options (`epsilon`, `norm_adv_by_std_in_grpo`).
struct grpo_options {
  double epsilon = 1e-6;
  bool norm_adv_by_std_in_grpo = true;  //!< false: Dr. GRPO (no division by the std)
};
//! verl `compute_grpo_outcome_advantage` (norm_adv_by_std_in_grpo = false is Dr. GRPO).
[[nodiscard]] constexpr advantage_preset grpo_advantage(const grpo_options& o = {}) noexcept {
  return {{.baseline = baseline_kind::group_mean,
           .scale = o.norm_adv_by_std_in_grpo ? scale_kind::group_std : scale_kind::none,
           .std = std_estimator::unbiased,
           .eps = o.epsilon,
           .singleton = singleton_rule::identity},
          {.placement = token_placement::masked, .allow_empty_rows = true}};
}
//! verl `compute_rloo_outcome_advantage`: s_i - mean of the others; a singleton keeps its score.
[[nodiscard]] constexpr advantage_preset rloo_advantage() noexcept {
  return {{.baseline = baseline_kind::leave_one_out, .scale = scale_kind::none, .singleton = singleton_rule::identity},
          {.placement = token_placement::masked, .allow_empty_rows = true}};
}

//! verl `compute_gdpo_outcome_advantage` options: GRPO's (algorithm config names).
using gdpo_options = grpo_options;
//! verl GDPO: each reward component's `grpo_advantage({epsilon, norm_adv_by_std_in_grpo})`, their
//! weighted sum placed on the valid tokens, whitened over the batch (REINFORCE++'s unbiased
//! whitening, eps 1e-8 added to the variance).
[[nodiscard]] constexpr multi_reward_config gdpo_advantage(const gdpo_options& o = {}) noexcept {
  const advantage_preset grpo = grpo_advantage(o);
  return {.aggregation = reward_aggregation::normalize_then_sum,
          .group = grpo.group,
          .final_norm = final_normalization::tokens,
          .whiten = {.eps = 1e-8, .unbiased = true},
          .broadcast = grpo.broadcast};
}

//! verl optimal-token-baseline options (`handle_zero_tail`, `epsilon`).
struct optimal_token_baseline_options {
  bool handle_zero_tail = true;
  double epsilon = 1e-8;
};
//! verl `optimal_token_baseline`: baselines shared by the tokens at the same position.
[[nodiscard]] constexpr optimal_token_baseline_config optimal_token_baseline_advantage(
    const optimal_token_baseline_options& o = {}) noexcept {
  return {.align = token_alignment::position, .handle_zero_tail = o.handle_zero_tail, .eps = o.epsilon};
}
//! verl `tir_optimal_token_baseline`: baselines shared by each response's j-th valid token.
[[nodiscard]] constexpr optimal_token_baseline_config tir_optimal_token_baseline_advantage(
    const optimal_token_baseline_options& o = {}) noexcept {
  return {.align = token_alignment::valid_token, .handle_zero_tail = o.handle_zero_tail, .eps = o.epsilon};
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

enum class multi_objective_aggregation { sum_then_normalize, normalize_then_sum };
//! TRL GRPOConfig options of several reward functions.
struct multi_reward_options {
  trl::scale_rewards scale_rewards = trl::scale_rewards::group;  //!< used by sum_then_normalize only
  trl::multi_objective_aggregation multi_objective_aggregation = trl::multi_objective_aggregation::sum_then_normalize;
};
//! TRL advantages from reward components (reward_weights are the call's weights):
//! sum_then_normalize: `advantage(scale_rewards)` of Σ_k w_k r_k; normalize_then_sum (GDPO): each
//! component's `advantage(group)`, the weighted sum normalised over the batch, (a - mean)/(std + 1e-4)
//! (unbiased; 0 for a batch of one). Throws ulorl::error on an unknown enum.
[[nodiscard]] constexpr multi_reward_config multi_reward_advantage(const multi_reward_options& o = {}) {
  require_known("presets::trl::multi_reward_advantage", "multi_objective_aggregation", o.multi_objective_aggregation,
                trl::multi_objective_aggregation::sum_then_normalize, trl::multi_objective_aggregation::normalize_then_sum);
  const advantage_preset scaled = advantage(o.scale_rewards);
  if (o.multi_objective_aggregation == trl::multi_objective_aggregation::sum_then_normalize)
    return {.aggregation = reward_aggregation::sum_then_normalize, .group = scaled.group, .broadcast = scaled.broadcast};
  const advantage_preset group = advantage(trl::scale_rewards::group);
  return {.aggregation = reward_aggregation::normalize_then_sum,
          .group = group.group,
          .final_norm = final_normalization::responses,
          .batch = group.group,
          .broadcast = group.broadcast};
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
//! NeMo-RL GRPO options (`use_leave_one_out_baseline`, `normalize_rewards`).
struct grpo_options {
  bool use_leave_one_out_baseline = true;
  bool normalize_rewards = true;
};
//! NeMo-RL GRPO, groups by id, mask not applied.
[[nodiscard]] constexpr advantage_preset advantage(const grpo_options& o = {}) noexcept {
  return {{.baseline = o.use_leave_one_out_baseline ? baseline_kind::leave_one_out : baseline_kind::group_mean,
           .scale = !o.normalize_rewards           ? scale_kind::none
                    : o.use_leave_one_out_baseline ? scale_kind::leave_one_out_std
                                                   : scale_kind::group_std,
           .std = std_estimator::unbiased,
           .eps = 1e-6,
           .singleton = singleton_rule::zero,
           .zero_std = zero_std_rule::skip},
          {.placement = token_placement::every_position, .allow_empty_rows = true}};
}

//! NeMo-RL GDPO options: GRPO's (`use_leave_one_out_baseline`, `normalize_rewards`).
using gdpo_options = grpo_options;
//! NeMo-RL GDPO: each component's `advantage({...})`, their weighted sum (at least 2 components)
//! normalised over the batch, (a - mean)/std when std > 0 (unbiased, no epsilon) else a - mean;
//! every position.
[[nodiscard]] constexpr multi_reward_config gdpo_advantage(const gdpo_options& o = {}) noexcept {
  const advantage_preset grpo = advantage(o);
  return {.aggregation = reward_aggregation::normalize_then_sum,
          .group = grpo.group,
          .final_norm = final_normalization::responses,
          .batch = {.baseline = baseline_kind::group_mean,
                    .scale = scale_kind::group_std,
                    .std = std_estimator::unbiased,
                    .eps = 0.0,
                    .singleton = singleton_rule::zero,
                    .zero_std = zero_std_rule::skip},
          .broadcast = grpo.broadcast,
          .min_components = 2};
}

//! NeMo-RL REINFORCE++ options.
struct reinforce_plus_plus_options {
  bool minus_baseline = true;
};
//! NeMo-RL `ReinforcePlusPlusAdvantageEstimator`: a_i = s_i - mu_g (group mean with i; 0 for a
//! singleton) or s_i, at every position, whitened with the biased variance floored at 1e-8, masked
//! positions included in the output.
[[nodiscard]] constexpr reinforce_pp_baseline_config reinforce_plus_plus_advantage(
    const reinforce_plus_plus_options& o = {}) noexcept {
  return {.group = {.baseline = o.minus_baseline ? baseline_kind::group_mean : baseline_kind::none,
                    .scale = scale_kind::none,
                    .singleton = o.minus_baseline ? singleton_rule::zero : singleton_rule::identity},
          .whiten = {.eps = 1e-8,
                     .unbiased = false,
                     .shift_mean = true,
                     .eps_at = whiten_eps::floor_variance,
                     .mask_output = false}};
}
}  // namespace nemo_rl

namespace open_instruct {
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
}  // namespace open_instruct

}  // namespace presets

ULORL_NAMESPACE_END
