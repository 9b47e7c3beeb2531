// ulorl/presets/trl.hpp — TRL's semantics under TRL's option names (huggingface/trl f2cd57710ae3):
//
//   advantages  GRPOTrainer's (unbiased std of the group or the batch, eps 1e-4, a group of one
//               gives 0, mask applied; scale_rewards) and multi-objective aggregation
//   loss        GRPOTrainer._compute_loss: loss_type grpo / bnpo / dr_grpo / dapo / cispo / sapo /
//               luspo / vespo, epsilon(_high), delta, beta, importance_sampling_level (token /
//               sequence / sequence_token), use_bias_correction_kl, the entropy bonus's normaliser;
//               grpo_loss composes them in one call (and `trl.experimental.gspo_token`)
//   rollout     vllm_importance_sampling_mode token_truncate / token_mask / sequence_truncate /
//   correction  sequence_mask with clip_min / clip_max
//   masks and   off_policy_mask_threshold (masking/off_policy.hpp), use_adaptive_entropy
//   control     (control/entropy_controller.hpp)
//
// GRPOConfig's defaults are written once (namespace defaults) and every options struct takes them
// from there. Presets only choose parameters of the advantage, loss, masking and control areas
// (and, where TRL genuinely differs, a named variant); TRL's *local* normalisers (a micro-batch
// divides by its own counts unless the caller passes the global ones) are reproduced for
// compatibility. Mirrored by python/ulorl/presets/trl.py; docs/presets/trl.md maps TRL's functions
// and gives every formula of its loss types and masks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/multi_reward.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/control/entropy_controller.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/entropy.hpp"
#include "ulorl/loss/fields.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss.hpp"
#include "ulorl/loss/rollout_correction/compute.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
#include "ulorl/loss/vespo.hpp"
#include "ulorl/masking/entropy_quantile.hpp"
#include "ulorl/masking/off_policy.hpp"
#include "ulorl/presets/detail.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::trl {

// ---- option names and GRPOConfig's defaults -------------------------------------------------------
//! `importance_sampling_level`.
//! `sequence_token` is GSPO-token (`trl.experimental.gspo_token`): the sequence ratio with the
//! gradient to each token itself.
enum class importance_sampling_kind { token, sequence, sequence_token };
//! The names of `importance_sampling_level` (parsed by importance_sampling_level_from_name, printed by name_in).
inline constexpr presets::detail::name_entry<importance_sampling_kind> importance_sampling_level_names[] = {
    {"token", importance_sampling_kind::token},
    {"sequence", importance_sampling_kind::sequence},
    {"sequence_token", importance_sampling_kind::sequence_token}};
[[nodiscard]] inline importance_sampling_kind importance_sampling_level_from_name(std::string_view name) {
  return presets::detail::parse("presets::trl::importance_sampling_level_from_name", "importance_sampling_level", name,
                                importance_sampling_level_names);
}

//! `loss_type`.
enum class loss_type_kind { grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo };
//! The names of `loss_type` (parsed by loss_type_from_name, printed by name_in).
inline constexpr presets::detail::name_entry<loss_type_kind> loss_type_names[] = {
    {"grpo", loss_type_kind::grpo},   {"bnpo", loss_type_kind::bnpo},   {"dr_grpo", loss_type_kind::dr_grpo},
    {"dapo", loss_type_kind::dapo},   {"cispo", loss_type_kind::cispo}, {"sapo", loss_type_kind::sapo},
    {"luspo", loss_type_kind::luspo}, {"vespo", loss_type_kind::vespo}};
[[nodiscard]] inline loss_type_kind loss_type_from_name(std::string_view name) {
  return presets::detail::parse("presets::trl::loss_type_from_name", "loss_type", name, loss_type_names);
}

//! `scale_rewards`.
enum class scale_rewards { group, batch, none };

//! GRPOConfig's defaults (TRL f2cd5771), written once: every options struct below takes them from
//! here (num_processes: a single process).
namespace defaults {
inline constexpr loss_type_kind loss_type = loss_type_kind::dapo;
inline constexpr double epsilon = 0.2;
inline constexpr importance_sampling_kind importance_sampling_level = importance_sampling_kind::token;
inline constexpr double sapo_temperature_pos = sapo_parameters{}.tau_pos;
inline constexpr double sapo_temperature_neg = sapo_parameters{}.tau_neg;
inline constexpr double vespo_k_pos = 2.0;
inline constexpr double vespo_lambda_pos = 3.0;
inline constexpr double vespo_k_neg = 3.0;
inline constexpr double vespo_lambda_neg = 2.0;
inline constexpr double max_completion_length = 512;
inline constexpr double gradient_accumulation_steps = 1;
inline constexpr double num_processes = 1;
inline constexpr bool use_bias_correction_kl = false;
inline constexpr double entropy_coef = 0.0;
inline constexpr trl::scale_rewards scale_rewards = trl::scale_rewards::group;
}  // namespace defaults

namespace detail {
inline void require_loss_type(std::string_view fn, loss_type_kind t) {
  require_known(fn, "loss_type", t, loss_type_kind::grpo, loss_type_kind::bnpo, loss_type_kind::dr_grpo,
                loss_type_kind::dapo, loss_type_kind::cispo, loss_type_kind::sapo, loss_type_kind::luspo,
                loss_type_kind::vespo);
}
inline void require_level(std::string_view fn, importance_sampling_kind l) {
  require_known(fn, "importance_sampling_level", l, importance_sampling_kind::token, importance_sampling_kind::sequence,
                importance_sampling_kind::sequence_token);
}
}  // namespace detail

// ---- advantages -----------------------------------------------------------------------------------

//! TRL GRPOTrainer advantages (`scale_rewards`), contiguous groups of num_generations. Throws
//! ulorl::error on an unknown `scale`.
[[nodiscard]] constexpr advantage_preset advantage(scale_rewards scale = defaults::scale_rewards) {
  require_known("presets::trl::advantage", "scale", scale, scale_rewards::group, scale_rewards::batch,
                scale_rewards::none);
  advantage_preset p{{.baseline = baseline_kind::group_mean,
                      .scale = scale_kind::group_std,
                      .std = std_estimator::unbiased,
                      .eps = 1e-4,
                      .singleton = singleton_rule::zero},
                     {.placement = token_placement::masked, .allow_empty_rows = true}};
  switch (scale) {
    case scale_rewards::group:
      break;
    case scale_rewards::batch:
      p.group.scale = scale_kind::batch_std;
      break;
    case scale_rewards::none:
      p.group.scale = scale_kind::none;
      break;
  }
  return p;
}

enum class multi_objective_aggregation { sum_then_normalize, normalize_then_sum };
//! TRL GRPOConfig options of several reward functions.
struct multi_reward_options {
  trl::scale_rewards scale_rewards = defaults::scale_rewards;  //!< used by sum_then_normalize only
  trl::multi_objective_aggregation multi_objective_aggregation = trl::multi_objective_aggregation::sum_then_normalize;
};
//! TRL advantages from reward components (reward_weights are the call's weights):
//! sum_then_normalize: `advantage(scale_rewards)` of Σ_k w_k r_k; normalize_then_sum (GDPO): each
//! component's `advantage(group)`, the weighted sum normalised over the batch, (a - mean)/(std + 1e-4)
//! (unbiased; 0 for a batch of one). Throws ulorl::error on an unknown enum.
[[nodiscard]] constexpr multi_reward_config multi_reward_advantage(const multi_reward_options& o = {}) {
  require_known("presets::trl::multi_reward_advantage", "multi_objective_aggregation", o.multi_objective_aggregation,
                trl::multi_objective_aggregation::sum_then_normalize,
                trl::multi_objective_aggregation::normalize_then_sum);
  const advantage_preset scaled = advantage(o.scale_rewards);
  if (o.multi_objective_aggregation == trl::multi_objective_aggregation::sum_then_normalize)
    return {
        .aggregation = reward_aggregation::sum_then_normalize, .group = scaled.group, .broadcast = scaled.broadcast};
  const advantage_preset group = advantage(trl::scale_rewards::group);
  return {.aggregation = reward_aggregation::normalize_then_sum,
          .group = group.group,
          .final_norm = final_normalization::responses,
          .batch = group.group,
          .broadcast = group.broadcast};
}

// ---- policy loss ----------------------------------------------------------------------------------

//! The objective's options (defaults: GRPOConfig's).
struct objective_options {
  double epsilon = defaults::epsilon;
  std::optional<double> epsilon_high{};  //!< absent: epsilon (cispo: the cap of the ratio itself)
  std::optional<double> delta{};         //!< upper cap of the ratio (two-sided GRPO); absent: none
  importance_sampling_kind importance_sampling_level = defaults::importance_sampling_level;
  loss_type_kind loss_type = defaults::loss_type;
  double sapo_temperature_pos = defaults::sapo_temperature_pos;
  double sapo_temperature_neg = defaults::sapo_temperature_neg;
};

//! GRPOTrainer's objective of a token. grpo / bnpo / dr_grpo / dapo / luspo: importance weight
//! exp(w) (no clamp) clipped to [1 - epsilon, 1 + epsilon_high], optional delta cap; the sequence
//! level is gspo (gradient through the mean), sequence_token (GSPO-token) gspo with the own-token
//! gradient, delta capping the row's ratio as in TRL's GSPO-token trainer.
//! cispo: -sg(min(r, epsilon_high)) A logp (cispo with lo = 0, hi = epsilon_high >= 0; no delta);
//! sapo: the sapo temperatures; vespo: the policy gradient (its weight phi_b: vespo.hpp). For cispo
//! and sapo the configuration is the token-level one: at the sequence level the caller gives the
//! sequence log-ratio as each token's log-ratio (docs/presets/trl.md). sequence_token admits only
//! grpo / bnpo / dr_grpo / dapo.
[[nodiscard]] inline objective_config objective(const objective_options& o) {
  constexpr const char* fn = "presets::trl::objective";
  detail::require_level(fn, o.importance_sampling_level);
  require_not_nan(fn, "epsilon", o.epsilon);
  require_not_nan(fn, "epsilon_high", o.epsilon_high);
  require_not_nan(fn, "delta", o.delta);
  require_not_nan(fn, "sapo_temperature_pos", o.sapo_temperature_pos);
  require_not_nan(fn, "sapo_temperature_neg", o.sapo_temperature_neg);
  detail::require_loss_type(fn, o.loss_type);
  const auto level = o.importance_sampling_level;
  objective_config c{.eps_low = o.epsilon,
                     .eps_high = o.epsilon_high.value_or(o.epsilon),
                     .delta = o.delta.value_or(0.0),
                     .log_ratio_clamp = no_limit,
                     .gspo = {.seq_log_ratio_max = no_limit, .seq_gradient = sequence_gradient::through_mean}};
  switch (o.loss_type) {
    case loss_type_kind::grpo:
    case loss_type_kind::bnpo:
    case loss_type_kind::dr_grpo:
    case loss_type_kind::dapo:
    case loss_type_kind::luspo:
      if (level == importance_sampling_kind::sequence_token && o.loss_type == loss_type_kind::luspo)
        ulorl::detail::fail(fn, "loss_type", "sequence_token supports loss_type grpo / bnpo / dr_grpo / dapo only");
      c.kind = level == importance_sampling_kind::token ? objective_kind::ppo_clip : objective_kind::gspo;
      if (level == importance_sampling_kind::sequence_token) c.gspo.seq_gradient = sequence_gradient::own_token;
      return c;
    case loss_type_kind::cispo:
    case loss_type_kind::sapo:
    case loss_type_kind::vespo:
      break;
  }
  if (level == importance_sampling_kind::sequence_token)
    ulorl::detail::fail(fn, "loss_type", "sequence_token supports loss_type grpo / bnpo / dr_grpo / dapo only");
  c.delta = 0.0;
  switch (o.loss_type) {
    case loss_type_kind::cispo: {
      const double cap = o.epsilon_high.value_or(o.epsilon);
      if (!(cap >= 0.0)) ulorl::detail::fail_value(fn, "epsilon_high", cap, "cispo: the ratio cap must be >= 0");
      c.kind = level == importance_sampling_kind::sequence ? objective_kind::sequence_cispo : objective_kind::cispo;
      c.eps_low = 1.0, c.eps_high = cap - 1.0;
      break;
    }
    case loss_type_kind::sapo:
      c.kind = level == importance_sampling_kind::sequence ? objective_kind::sequence_sapo : objective_kind::sapo;
      c.sapo.tau_pos = o.sapo_temperature_pos, c.sapo.tau_neg = o.sapo_temperature_neg;
      break;
    case loss_type_kind::vespo:
      c.kind = objective_kind::policy_gradient;
      break;
    case loss_type_kind::grpo:
    case loss_type_kind::bnpo:
    case loss_type_kind::dr_grpo:
    case loss_type_kind::dapo:
    case loss_type_kind::luspo:
      break;  // returned above
  }
  return c;
}

//! beta * k3 (unclamped); with use_bias_correction_kl the estimate is multiplied by the ratio.
struct kl_options {
  bool use_bias_correction_kl = defaults::use_bias_correction_kl;
};
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  return {.estimator = kl_estimator::k3, .importance_weighted = o.use_bias_correction_kl};
}

//! The normalisers' options (defaults: GRPOConfig's; num_processes: a single process).
struct normalizer_options {
  loss_type_kind loss_type = defaults::loss_type;
  importance_sampling_kind importance_sampling_level = defaults::importance_sampling_level;  //!< luspo
  std::size_t padded_length = 0;                                   //!< luspo at token level: T of the padded batch
  double max_completion_length = defaults::max_completion_length;  //!< dr_grpo
  double gradient_accumulation_steps = defaults::gradient_accumulation_steps;  //!< grpo, bnpo, dr_grpo
  std::optional<double> num_items_in_batch{};                                  //!< dapo; absent: this batch's N
  double num_processes = defaults::num_processes;                              //!< dapo
};

//! loss_type normalisers: grpo, sapo (1/B) sum_b mean_t / GA; bnpo sum / max(N, 1) / GA;
//! dr_grpo sum / (B max_completion_length) / GA; dapo, cispo, vespo sum / (max(num_items_in_batch,
//! 1) / P). luspo weighs row b by n_b: sequence level sum_b l_b n_b / B / GA (constant B over the
//! valid tokens); token level sum_bt l[b,t] n_b / (B T) / GA over every position, padding included
//! (constant B T: pass an all-ones mask and n_b in `weights`, docs/presets/trl.md).
[[nodiscard]] inline agg_normalizer normalizer(const normalizer_options& o, const batch_counts& local) {
  constexpr const char* fn = "presets::trl::normalizer";
  detail::require_loss_type(fn, o.loss_type);
  require_not_nan(fn, "max_completion_length", o.max_completion_length);
  require_not_nan(fn, "gradient_accumulation_steps", o.gradient_accumulation_steps);
  require_not_nan(fn, "num_items_in_batch", o.num_items_in_batch);
  require_not_nan(fn, "num_processes", o.num_processes);
  detail::require_level(fn, o.importance_sampling_level);
  const double ga = o.gradient_accumulation_steps;
  switch (o.loss_type) {
    case loss_type_kind::luspo:
      if (o.importance_sampling_level == importance_sampling_kind::sequence)
        return {agg_mode::constant, local.rows, 1.0 / ga};
      return {agg_mode::constant, local.rows * static_cast<double>(o.padded_length), 1.0 / ga};
    case loss_type_kind::sapo:
    case loss_type_kind::grpo:
      return {agg_mode::seq_mean_token_mean, local.rows, 1.0 / ga};
    case loss_type_kind::bnpo:
      return {agg_mode::token_mean, local.tokens > 1 ? local.tokens : 1.0, 1.0 / ga};
    case loss_type_kind::dr_grpo:
      return {agg_mode::constant, local.rows * o.max_completion_length, 1.0 / ga};
    case loss_type_kind::cispo:
    case loss_type_kind::vespo:
    case loss_type_kind::dapo: {
      const double items = o.num_items_in_batch.value_or(local.tokens);
      return {agg_mode::token_mean, (items > 1 ? items : 1.0) / o.num_processes, 1.0};
    }
  }
  return {};
}

//! TRL's logged clip ratios: masked token means, except that a sequence-level ratio (one column)
//! is averaged over all rows ignoring the mask.
struct clip_metrics {
  double low_mean, high_mean, region_mean;
};
[[nodiscard]] inline clip_metrics clip_ratios(const loss_metrics& m,
                                              importance_sampling_kind importance_sampling_level) {
  detail::require_level("presets::trl::clip_ratios", importance_sampling_level);
  if (importance_sampling_level == importance_sampling_kind::sequence) {
    const double b = m.rows > 0 ? m.rows : 1.0;
    return {m.seq_clipped_low / b, m.seq_clipped_high / b, m.seq_clipped_region / b};
  }
  return {m.clip_low_fraction(), m.clip_high_fraction(), m.clip_region_fraction()};
}

//! The entropy bonus's normaliser (`entropy_coef`): dapo / cispo / vespo divide by
//! max(num_items_in_batch, 1) / P (absent: this batch's N), the others by max(sum m_e, 1) * GA, with
//! m_e = m E the tokens the bonus covers (`entropy_tokens`). Use with entropy_loss(H, m_e, grad, coef, ...).
[[nodiscard]] inline agg_normalizer entropy_normalizer(const normalizer_options& o, const batch_counts& local,
                                                       double entropy_tokens) {
  constexpr const char* fn = "presets::trl::entropy_normalizer";
  detail::require_loss_type(fn, o.loss_type);
  switch (o.loss_type) {
    case loss_type_kind::cispo:
    case loss_type_kind::vespo:
    case loss_type_kind::dapo: {
      const double items = o.num_items_in_batch.value_or(local.tokens);
      return {agg_mode::token_mean, (items > 1 ? items : 1.0) / o.num_processes, 1.0};
    }
    case loss_type_kind::grpo:
    case loss_type_kind::bnpo:
    case loss_type_kind::dr_grpo:
    case loss_type_kind::sapo:
    case loss_type_kind::luspo:
      return {agg_mode::token_mean, entropy_tokens > 1 ? entropy_tokens : 1.0, 1.0 / o.gradient_accumulation_steps};
  }
  return {};
}

// ---- rollout correction ---------------------------------------------------------------------------

//! `vllm_importance_sampling_mode`.
enum class importance_sampling_mode { token_truncate, token_mask, sequence_truncate, sequence_mask };

//! "token_truncate", "token_mask", "sequence_truncate", "sequence_mask".
[[nodiscard]] inline importance_sampling_mode importance_sampling_mode_from_name(
    std::string_view name, std::string_view argument = "vllm_importance_sampling_mode") {
  using M = importance_sampling_mode;
  return rollout_correction::detail::from_name<M, 4>("presets::trl::importance_sampling_mode_from_name", argument, name,
                                                     {{{"token_truncate", M::token_truncate},
                                                       {"token_mask", M::token_mask},
                                                       {"sequence_truncate", M::sequence_truncate},
                                                       {"sequence_mask", M::sequence_mask}}});
}

//! GRPOConfig's vLLM importance-sampling options.
struct rollout_correction_options {
  importance_sampling_mode vllm_importance_sampling_mode = importance_sampling_mode::sequence_mask;
  std::optional<double> vllm_importance_sampling_clip_min{};
  std::optional<double> vllm_importance_sampling_clip_max = 3.0;
};

//! TRL's semantics: r = exp(L) unclamped (an overflow is +inf), truncate = clamp(r, min, max) with
//! absent bounds absent, mask = 0 outside; masked positions hold the weight of L = 0 (token modes)
//! or the row's (sequence modes). Rejected: min >= max, a truncate mode without bounds.
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  using M = importance_sampling_mode;
  constexpr std::string_view fn = "presets::trl::rollout_correction";
  const M mode = o.vllm_importance_sampling_mode;
  require_known(fn, "vllm_importance_sampling_mode", mode, M::token_truncate, M::token_mask, M::sequence_truncate,
                M::sequence_mask);
  const auto& lo = o.vllm_importance_sampling_clip_min;
  const auto& hi = o.vllm_importance_sampling_clip_max;
  if (lo) require_non_negative(fn, "vllm_importance_sampling_clip_min", *lo);
  if (hi) require_positive(fn, "vllm_importance_sampling_clip_max", *hi);
  if (lo && hi && !(*lo < *hi))
    ulorl::detail::fail_value(fn, "vllm_importance_sampling_clip_min", *lo,
                              "must be < vllm_importance_sampling_clip_max");
  const bool truncate = mode == M::token_truncate || mode == M::sequence_truncate;
  if (truncate && !lo && !hi)
    ulorl::detail::fail(fn, "vllm_importance_sampling_clip_max", "a *_truncate mode needs clip_min or clip_max");
  config c{
      .importance = {.level = mode == M::token_truncate || mode == M::token_mask ? is_level::token : is_level::sequence,
                     .weighting = truncate ? is_weighting::truncate : is_weighting::mask,
                     .lower = lo.value_or(0.0),
                     .upper = hi.value_or(unbounded),
                     .log_ratio_clamp = unbounded,
                     .overflow = ratio_overflow::infinity,
                     .masked = masked_positions::neutral}};
  validate(fn, c);
  return c;
}

// ---- masks and the adaptive entropy bonus --------------------------------------------------------

//! TRL GRPOTrainer `off_policy_mask_threshold` (`get_off_policy_mask`): one advantage per
//! completion; keep the row iff A_b >= 0 or kl_b <= threshold. TRL has no default threshold.
[[nodiscard]] constexpr off_policy_mask_config off_policy_mask(double off_policy_mask_threshold) noexcept {
  return {.delta = off_policy_mask_threshold, .advantage = off_policy_advantage_level::sequence};
}

//! TRL GRPOConfig's adaptive entropy fields, under TRL's names and with its defaults.
struct adaptive_entropy_params {
  double entropy_coef = defaults::entropy_coef;  //!< initial coefficient c
  double entropy_target = 0.2;                   //!< target mean token entropy (nats)
  double entropy_coef_delta = 0.005;             //!< step of c per optimizer step
  double entropy_coef_min = 0.0;                 //!< lower bound of c
  double entropy_coef_max = 1.0;                 //!< upper bound of c
};
//! TRL `use_adaptive_entropy` (golden README §4.11): each optimizer step applies
//! alpha = c · [H_prev <= target] (H_prev = +inf before the first step: bonus()), then
//! update(H) sets c <- min(c + delta, max) if H <= target, else c <- max(c - delta, min).
//! The step rule with step_up = step_down = delta, no dead band, raise_at_target and a gate on
//! the last update's entropy. An entropy_coef outside [min, max] is accepted, as TRL does: each
//! update bounds only the side it moves towards. The controller's checks apply (every value in
//! [0, 1e6], entropy_coef in [-1e6, 1e6]).
[[nodiscard]] constexpr entropy_controller_config adaptive_entropy(const adaptive_entropy_params& p = {}) noexcept {
  return {.rule = entropy_control_rule::step,
          .target_entropy = p.entropy_target,
          .init_coef = p.entropy_coef,
          .step_up = p.entropy_coef_delta,
          .step_down = p.entropy_coef_delta,
          .gain = 0.0,
          .tolerance = 0.0,
          .min_coef = p.entropy_coef_min,
          .max_coef = p.entropy_coef_max,
          .gate_above_target = true,
          .gate_source = entropy_gate_source::last_update,
          .raise_at_target = true};
}

// ---- GRPOTrainer._compute_loss in one call ------------------------------------------------------
//
//   ω      = logp − old per token, or ω_b = Σ_t (logp − old) m / max(n_b, 1) (sequence levels)
//   p      = the loss type's policy term of exp(ω) (objective())
//   p     ← p · keep_b · E · q          (vespo: p · keep_b · E · φ_b; the factors are detached)
//   ℓ      = p + β κ,  κ = k3 of ref (times exp(ω) with use_bias_correction_kl: TRL's undetached
//            ratio, the token's or the row's, whose gradient then reaches every valid token)
//   loss   = the loss type's aggregation of ℓ (normalizer()) − coef · TRL's entropy mean
//
// keep is the off-policy sequence mask (masking/off_policy.hpp), E the top-entropy mask
// (masking/entropy_quantile.hpp), q the vLLM importance-sampling ratio, φ VESPO's weight
// (loss/vespo.hpp). Sequence-level cispo and sapo are the objectives sequence_cispo and
// sequence_sapo (loss/objectives.hpp: the token objective on exp(ω_b), the gradient through the
// mean). Sequence-level vespo's KL term is added after policy_loss, with the sequence ratio
// exp(ω_b) as the bias correction's weight. luspo weighs row b
// by n_b: at the token level over every position, padding included (an all-ones mask), its KL term
// likewise (at both levels); its clip metrics are those of the valid tokens. GSPO-token
// (sequence_token) is the clipped surrogate on exp(ω_b) with each token's own gradient, delta
// included. docs/presets/trl.md gives every formula.
//
// Scratch: the call allocates its intermediate arrays (std::vector): [B, T] arrays of T for the
// broadcast advantages and, as the options need them, the product of the multipliers, the
// off-policy and top-entropy masks, the element-wise KL and its
// gradient, and a gradient for luspo's metric pass; [B] doubles for row counts, ω_b and φ_b; the
// valid entropies for the quantile.

//! One micro-batch, TRL's tensors by TRL's names. Every token view is padded [B, T] with
//! per_token_logps' shape; optional views are empty when absent.
template <class T, class M = T>
struct grpo_loss_inputs {
  token_view<const T> per_token_logps{};
  token_view<const T> old_per_token_logps{};
  token_view<const M> completion_mask{};           //!< 0/1; absent: every token valid
  std::span<const T> advantages{};                 //!< one per completion [B]
  token_view<const T> ref_per_token_logps{};       //!< required when beta != 0
  token_view<const T> sampling_per_token_logps{};  //!< the off-policy mask's behaviour log-probs; absent: old
  token_view<const T> entropies{};  //!< >= 0; required when top_entropy_quantile < 1 or entropy_coef != 0
  token_view<const T> importance_sampling_ratio{};  //!< the vLLM IS ratio, [B, T] or [B, 1], >= 0 (vespo: [B, T])
};

//! GRPOConfig's loss options by TRL's names, with TRL's defaults.
struct grpo_loss_options {
  loss_type_kind loss_type = defaults::loss_type;
  double epsilon = defaults::epsilon;
  std::optional<double> epsilon_high{};  //!< absent: epsilon
  std::optional<double> delta{};         //!< upper cap of the ratio; absent: none
  double beta = 0.0;
  importance_sampling_kind importance_sampling_level = defaults::importance_sampling_level;
  bool use_bias_correction_kl = defaults::use_bias_correction_kl;
  double max_completion_length = defaults::max_completion_length;  //!< dr_grpo's normaliser
  double gradient_accumulation_steps = defaults::gradient_accumulation_steps;
  std::optional<double> num_items_in_batch{};  //!< dapo / cispo / vespo; absent: this batch's valid tokens
  double num_processes = defaults::num_processes;
  double sapo_temperature_pos = defaults::sapo_temperature_pos;
  double sapo_temperature_neg = defaults::sapo_temperature_neg;
  double vespo_k_pos = defaults::vespo_k_pos;
  double vespo_lambda_pos = defaults::vespo_lambda_pos;
  double vespo_k_neg = defaults::vespo_k_neg;
  double vespo_lambda_neg = defaults::vespo_lambda_neg;
  std::optional<double> off_policy_mask_threshold{};  //!< absent: no off-policy mask
  double top_entropy_quantile = 1.0;
  double entropy_coef = defaults::entropy_coef;  //!< the coefficient applied this step (adaptive_entropy)
  //! ulorl's, not TRL's: false skips the scans of the mask (0/1) and of per_token_logps,
  //! old_per_token_logps, advantages and ref_per_token_logps (finite), here and in policy_loss
  //! (policy_loss_config::check_values). The entropies and the IS ratio are always checked, and the
  //! masks' and VESPO's functions check what they read.
  bool check_values = true;
};

//! The gradients, written in place (padded [B, T], per_token_logps' shape). They must not overlap
//! each other or any input.
template <class T>
struct grpo_loss_outputs {
  token_view<T> grad_per_token_logps{};  //!< required; 0 on masked tokens except for luspo at the token level
  token_view<T> grad_entropies{};        //!< required when entropy_coef != 0; given otherwise: zeros
};

//! The loss, its parts, policy_loss's metrics and the metrics TRL logs for this configuration
//! (each optional is present exactly when TRL logs it).
struct grpo_loss_result {
  double loss = 0;          //!< pg_loss + kl_loss + entropy_loss
  double pg_loss = 0;       //!< the aggregated policy term
  double kl_loss = 0;       //!< the aggregated beta * KL term
  double entropy_loss = 0;  //!< the entropy bonus, -coef * TRL's entropy mean
  //! policy_loss's metrics over the valid tokens (kl_sum: the KL estimate's sum over them).
  loss_metrics metrics{};
  std::optional<double> clip_ratio_low_mean{};     //!< clip_ratio/low_mean: grpo, bnpo, dr_grpo, dapo, luspo
  std::optional<double> clip_ratio_high_mean{};    //!< clip_ratio/high_mean
  std::optional<double> clip_ratio_region_mean{};  //!< clip_ratio/region_mean
  std::optional<double> cispo_clip_ratio{};        //!< cispo
  std::optional<double> vespo_phi_seq_mean{};      //!< vespo
  std::optional<double> entropy_mean{};            //!< entropies given
  std::optional<double> kl_mean{};                 //!< beta != 0
};

//! f(name, field&) for every option of grpo_loss, by GRPOConfig's names (core/fields.hpp: the
//! operator's `float[] config`, the Python options).
template <class C, class F>
  requires ulorl::detail::record_of<C, grpo_loss_options>
constexpr void visit_fields(C& c, F&& f) {
  f("loss_type", c.loss_type), f("epsilon", c.epsilon), f("epsilon_high", c.epsilon_high), f("delta", c.delta);
  f("beta", c.beta), f("importance_sampling_level", c.importance_sampling_level);
  f("use_bias_correction_kl", c.use_bias_correction_kl), f("max_completion_length", c.max_completion_length);
  f("gradient_accumulation_steps", c.gradient_accumulation_steps), f("num_items_in_batch", c.num_items_in_batch);
  f("num_processes", c.num_processes), f("sapo_temperature_pos", c.sapo_temperature_pos);
  f("sapo_temperature_neg", c.sapo_temperature_neg), f("vespo_k_pos", c.vespo_k_pos);
  f("vespo_lambda_pos", c.vespo_lambda_pos), f("vespo_k_neg", c.vespo_k_neg), f("vespo_lambda_neg", c.vespo_lambda_neg);
  f("off_policy_mask_threshold", c.off_policy_mask_threshold), f("top_entropy_quantile", c.top_entropy_quantile);
  f("entropy_coef", c.entropy_coef), f("check_values", c.check_values);
}
//! f(name, field&) for every field of grpo_loss's result: the loss parts, policy_loss's metrics'
//! sums (loss/fields.hpp's names), then TRL's logged metrics (absent where TRL logs none).
template <class R, class F>
  requires ulorl::detail::record_of<R, grpo_loss_result>
constexpr void visit_fields(R& r, F&& f) {
  f("loss", r.loss), f("pg_loss", r.pg_loss), f("kl_loss", r.kl_loss), f("entropy_loss", r.entropy_loss);
  visit_fields(r.metrics, f);
  f("clip_ratio/low_mean", r.clip_ratio_low_mean), f("clip_ratio/high_mean", r.clip_ratio_high_mean);
  f("clip_ratio/region_mean", r.clip_ratio_region_mean), f("cispo_clip_ratio", r.cispo_clip_ratio);
  f("vespo_phi_seq_mean", r.vespo_phi_seq_mean), f("entropy", r.entropy_mean), f("kl", r.kl_mean);
}

namespace detail {
//! A padded [rows, cols] view of scratch `v` (a std::vector, const for a view of const T).
template <class T, class V>
[[nodiscard]] token_view<T> padded_scratch(V& v, std::size_t rows, std::size_t cols) {
  return token_view<T>::padded(matrix_view<T>(v.data(), rows, cols));
}
//! Every element finite and >= 0 (TRL's entropies and importance ratios).
template <class T>
void require_finite_non_negative(std::string_view fn, std::string_view arg, const token_view<const T>& v) {
  require_all_finite(fn, arg, v);
  for (std::size_t b = 0; b < v.rows(); ++b)
    for (std::size_t t = 0; t < v.row_size(b); ++t)
      if (v(b, t) < T(0))
        ulorl::detail::fail_at(fn, arg, static_cast<std::int64_t>(v.flat_index(b, t)), v(b, t), "must be >= 0");
}
}  // namespace detail

// The entry point instantiates policy_loss's ISA-dependent kernels: it and its steps are tagged
// like them (core/simd.hpp).
// The steps of grpo_loss, in the order it runs them. Each reports an error under grpo_loss's name.
namespace detail {
inline namespace ULORL_ISA {

inline constexpr std::string_view fn = "presets::trl::grpo_loss";

//! What the options select: the objective and the paths of the loss type and level.
struct plan {
  loss_type_kind loss_type;
  importance_sampling_kind level;
  objective_config objective;
  bool seq = false;           //!< sequence level (not GSPO-token)
  bool luspo = false;         //!< rows weighed by n_b
  bool luspo_tokens = false;  //!< luspo at the token level: every position, padding included
  bool vespo = false;         //!< VESPO's weight φ_b instead of the ratio
  //! The KL term is added after policy_loss where its weights differ from the objective's (luspo) or
  //! where the objective has no ratio (sequence-level vespo).
  bool separate_kl = false;
};

//! Checks the options (sequence_token with use_bias_correction_kl or an entropy bonus, which TRL's
//! GSPO-token trainer does not have; top_entropy_quantile outside [0, 1]; the objective's own) and
//! returns what they select.
[[nodiscard]] inline plan plan_of(const grpo_loss_options& o) {
  using LT = loss_type_kind;
  using IS = importance_sampling_kind;
  detail::require_loss_type(fn, o.loss_type);
  detail::require_level(fn, o.importance_sampling_level);
  plan p{.loss_type = o.loss_type,
         .level = o.importance_sampling_level,
         .objective = trl::objective({.epsilon = o.epsilon,
                                      .epsilon_high = o.epsilon_high,
                                      .delta = o.delta,
                                      .importance_sampling_level = o.importance_sampling_level,
                                      .loss_type = o.loss_type,
                                      .sapo_temperature_pos = o.sapo_temperature_pos,
                                      .sapo_temperature_neg = o.sapo_temperature_neg})};
  p.seq = p.level == IS::sequence;
  p.luspo = p.loss_type == LT::luspo;
  p.luspo_tokens = p.luspo && !p.seq;
  p.vespo = p.loss_type == LT::vespo;
  p.separate_kl = p.luspo || (p.seq && p.vespo);

  const double rho = o.top_entropy_quantile;
  require_finite(fn, "beta", o.beta);
  require_finite(fn, "entropy_coef", o.entropy_coef);
  if (!(rho >= 0.0 && rho <= 1.0)) ulorl::detail::fail_value(fn, "top_entropy_quantile", rho, "must be in [0, 1]");
  if (p.level == IS::sequence_token) {
    if (o.use_bias_correction_kl)
      ulorl::detail::fail(fn, "use_bias_correction_kl", "sequence_token (GSPO-token) has no bias-corrected KL");
    if (o.entropy_coef != 0.0)
      ulorl::detail::fail(fn, "entropy_coef", "sequence_token (GSPO-token) has no entropy bonus");
  }
  if (o.off_policy_mask_threshold) require_finite(fn, "off_policy_mask_threshold", *o.off_policy_mask_threshold);
  require_divisor(fn, "gradient_accumulation_steps", o.gradient_accumulation_steps);
  require_divisor(fn, "num_processes", o.num_processes);
  if (p.loss_type == LT::dr_grpo) require_divisor(fn, "max_completion_length", o.max_completion_length);
  if (o.num_items_in_batch) require_finite(fn, "num_items_in_batch", *o.num_items_in_batch);
  return p;
}

//! Checks the padded layout and the shapes, the inputs the options require and the outputs;
//! returns the completion mask (absent: every token valid).
template <class T, class M>
[[nodiscard]] token_view<const M> require_shapes(const grpo_loss_inputs<T, M>& in, const grpo_loss_outputs<T>& out,
                                                 const grpo_loss_options& o, const plan& p) {
  const token_view<const T>& lp = in.per_token_logps;
  if (lp.kind() != layout::padded) ulorl::detail::fail(fn, "per_token_logps", "must be the padded layout [B, T]");
  if (lp.rows() == 0)
    ulorl::detail::fail(fn, "per_token_logps", "empty batch (B = 0): at least one completion is required");
  const std::size_t B = lp.rows(), Tn = lp.cols();
  const token_view<const M> mask = mask_or_all_valid(in.completion_mask, lp);
  require_same_shape(fn, "old_per_token_logps", in.old_per_token_logps, "per_token_logps", lp);
  require_same_shape(fn, "completion_mask", mask, "per_token_logps", lp);
  require_same_size(fn, "advantages", in.advantages.size(), "per_token_logps rows", B);
  if (o.beta != 0.0 && in.ref_per_token_logps.empty())
    ulorl::detail::fail(fn, "ref_per_token_logps", "required when beta != 0");
  if (!in.ref_per_token_logps.empty())
    require_same_shape(fn, "ref_per_token_logps", in.ref_per_token_logps, "per_token_logps", lp);
  if (!in.sampling_per_token_logps.empty())
    require_same_shape(fn, "sampling_per_token_logps", in.sampling_per_token_logps, "per_token_logps", lp);
  if ((o.top_entropy_quantile < 1.0 || o.entropy_coef != 0.0) && in.entropies.empty())
    ulorl::detail::fail(fn, "entropies", "required when top_entropy_quantile < 1 or entropy_coef != 0");
  if (!in.entropies.empty()) require_same_shape(fn, "entropies", in.entropies, "per_token_logps", lp);
  const token_view<const T>& q = in.importance_sampling_ratio;
  if (!q.empty()) {
    if (q.kind() != layout::padded)
      ulorl::detail::fail(fn, "importance_sampling_ratio", "must be the padded layout [B, T] or [B, 1]");
    require_same_size(fn, "importance_sampling_ratio rows", q.rows(), "per_token_logps rows", B);
    if (q.cols() != Tn && q.cols() != 1)
      ulorl::detail::fail_value(fn, "importance_sampling_ratio", static_cast<double>(q.cols()),
                                "must have T columns or 1");
    if (p.vespo && q.cols() != Tn)
      ulorl::detail::fail(fn, "importance_sampling_ratio", "vespo needs a token-level ratio [B, T]");
  }
  const token_view<T>& grad = out.grad_per_token_logps;
  if (grad.empty()) ulorl::detail::fail(fn, "grad_per_token_logps", "required");
  require_same_shape(fn, "grad_per_token_logps", grad, "per_token_logps", lp);
  ulorl::detail::require_distinct_tokens(fn, "grad_per_token_logps", grad);
  if (o.entropy_coef != 0.0 && out.grad_entropies.empty())
    ulorl::detail::fail(fn, "grad_entropies", "required when entropy_coef != 0");
  if (!out.grad_entropies.empty()) {
    require_same_shape(fn, "grad_entropies", out.grad_entropies, "per_token_logps", lp);
    ulorl::detail::require_distinct_tokens(fn, "grad_entropies", out.grad_entropies);
    ulorl::detail::require_disjoint_tokens(fn, "grad_entropies", out.grad_entropies, "grad_per_token_logps", grad);
  }
  return mask;
}

//! Checks the values: with check_values the mask (0/1), the log-probs and advantages the loss
//! reads (finite); always the entropies and the IS ratio (finite, >= 0).
template <class T, class M>
void require_values(const grpo_loss_inputs<T, M>& in, token_view<const M> mask, const grpo_loss_options& o) {
  if (o.check_values) {
    require_binary_mask(fn, "completion_mask", mask);
    require_all_finite(fn, "per_token_logps", in.per_token_logps);
    require_all_finite(fn, "old_per_token_logps", in.old_per_token_logps);
    for (std::size_t b = 0; b < in.advantages.size(); ++b)
      if (!std::isfinite(static_cast<double>(in.advantages[b])))
        ulorl::detail::fail_at(fn, "advantages", static_cast<std::int64_t>(b), in.advantages[b], "must be finite");
    if (o.beta != 0.0) require_all_finite(fn, "ref_per_token_logps", in.ref_per_token_logps);
    if (!in.sampling_per_token_logps.empty() && o.off_policy_mask_threshold)
      require_all_finite(fn, "sampling_per_token_logps", in.sampling_per_token_logps);
  }
  if (!in.entropies.empty()) detail::require_finite_non_negative(fn, "entropies", in.entropies);
  if (!in.importance_sampling_ratio.empty())
    detail::require_finite_non_negative(fn, "importance_sampling_ratio", in.importance_sampling_ratio);
}

//! Each row's valid tokens n_b and sequence log-ratio ω_b = Σ_t (logp − old) m / max(n_b, 1).
struct row_ratios {
  std::vector<double> nrow, omega;
};
template <class T, class M>
[[nodiscard]] row_ratios row_log_ratios(token_view<const T> lp, token_view<const T> old, token_view<const M> mask) {
  const std::size_t B = lp.rows(), Tn = lp.cols();
  row_ratios r{std::vector<double>(B, 0.0), std::vector<double>(B, 0.0)};
  for (std::size_t b = 0; b < B; ++b) {
    double s = 0;
    for (std::size_t t = 0; t < Tn; ++t)
      if (mask(b, t) != M(0)) s += static_cast<double>(lp(b, t)) - static_cast<double>(old(b, t)), r.nrow[b] += 1;
    r.omega[b] = s / (r.nrow[b] > 0 ? r.nrow[b] : 1.0);
  }
  return r;
}

//! The detached factors of the policy term: the off-policy mask keep, the top-entropy mask E, and
//! the IS ratio q or (vespo) VESPO's φ_b; at(b, t) is their product.
template <class T>
struct multipliers {
  std::vector<T> keep{}, emask{};  //!< [B, T] when used
  std::vector<double> phi{};       //!< [B] (vespo)
  token_view<const T> q{};
  std::size_t cols = 0;
  bool vespo = false;
  bool any = false;  //!< some factor applies
  [[nodiscard]] double at(std::size_t b, std::size_t t) const {
    double w = 1.0;
    if (!keep.empty()) w *= static_cast<double>(keep[b * cols + t]);
    if (!emask.empty()) w *= static_cast<double>(emask[b * cols + t]);
    if (vespo)
      w *= phi[b];
    else if (!q.empty())
      w *= static_cast<double>(q(b, q.cols() == 1 ? 0 : t));
    return w;
  }
};
template <class T, class M>
[[nodiscard]] multipliers<T> policy_multipliers(const grpo_loss_inputs<T, M>& in, token_view<const M> mask,
                                                const grpo_loss_options& o, const plan& p) {
  const token_view<const T>& lp = in.per_token_logps;
  const std::size_t B = lp.rows(), Tn = lp.cols(), BT = B * Tn;
  multipliers<T> m{.q = in.importance_sampling_ratio, .cols = Tn, .vespo = p.vespo};
  if (o.off_policy_mask_threshold) {
    m.keep.assign(BT, T(0));
    const bool has_sampling = !in.sampling_per_token_logps.empty();
    const off_policy_mask_inputs<T, M, T> oin{
        lp, has_sampling ? in.sampling_per_token_logps : in.old_per_token_logps, mask, {}, in.advantages};
    (void)::ulorl::off_policy_mask(oin, detail::padded_scratch<T>(m.keep, B, Tn),
                                   trl::off_policy_mask(*o.off_policy_mask_threshold));
  }
  if (o.top_entropy_quantile < 1.0) {
    m.emask.assign(BT, T(0));
    std::vector<double> sorted(entropy_quantile_workspace(mask));
    (void)::ulorl::top_entropy_mask(in.entropies, mask, detail::padded_scratch<T>(m.emask, B, Tn),
                                    entropy_quantile_config{.quantile = o.top_entropy_quantile},
                                    std::span<double>(sorted));
  }
  if (p.vespo) {
    m.phi.assign(B, 0.0);
    ::ulorl::vespo_weights(
        vespo_inputs<T, M>{lp, in.old_per_token_logps, mask, in.advantages, in.importance_sampling_ratio}, m.phi,
        {.k_pos = o.vespo_k_pos,
         .lambda_pos = o.vespo_lambda_pos,
         .k_neg = o.vespo_k_neg,
         .lambda_neg = o.vespo_lambda_neg});
  }
  m.any = o.off_policy_mask_threshold || o.top_entropy_quantile < 1.0 || p.vespo || !m.q.empty();
  return m;
}

//! policy_loss's weights [B, T]: the multipliers, and luspo's row weight n_b (token level: n_b times
//! the multiplier at every position; sequence level: the row's mean multiplier over its positions,
//! the row's loss being one value). Empty when neither applies.
template <class T>
[[nodiscard]] std::vector<T> policy_weights(const multipliers<T>& m, const row_ratios& rows, const plan& p,
                                            std::size_t B, std::size_t Tn) {
  std::vector<T> weights;
  if (!m.any && !p.luspo) return weights;
  weights.resize(B * Tn);
  for (std::size_t b = 0; b < B; ++b) {
    double mean = 0;
    if (p.luspo && p.seq) {
      for (std::size_t t = 0; t < Tn; ++t) mean += m.at(b, t);
      mean /= static_cast<double>(Tn);
    }
    for (std::size_t t = 0; t < Tn; ++t)
      weights[b * Tn + t] = static_cast<T>(!p.luspo ? m.at(b, t) : p.seq ? mean : rows.nrow[b] * m.at(b, t));
  }
  return weights;
}

//! The advantage of each completion at every position of its row [B, T].
template <class T>
[[nodiscard]] std::vector<T> token_advantages(std::span<const T> advantages, std::size_t Tn) {
  const std::size_t B = advantages.size();
  std::vector<T> adv(B * Tn);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < Tn; ++t) adv[b * Tn + t] = advantages[b];
  return adv;
}

//! The normalisers' options of this call (normalizer(), entropy_normalizer()).
[[nodiscard]] inline normalizer_options normalizer_options_of(const grpo_loss_options& o, const plan& p,
                                                              std::size_t Tn) {
  return {.loss_type = p.loss_type,
          .importance_sampling_level = p.level,
          .padded_length = Tn,
          .max_completion_length = o.max_completion_length,
          .gradient_accumulation_steps = o.gradient_accumulation_steps,
          .num_items_in_batch = o.num_items_in_batch,
          .num_processes = o.num_processes};
}

//! policy_loss's configuration: the objective, k3 (bias-corrected on request) with β unless the KL
//! term is added separately, the loss type's normaliser.
[[nodiscard]] inline policy_loss_config policy_config(const grpo_loss_options& o, const plan& p,
                                                      const normalizer_options& nopt, const batch_counts& counts) {
  policy_loss_config cfg;
  cfg.objective = p.objective;
  cfg.kl = trl::kl({.use_bias_correction_kl = o.use_bias_correction_kl});
  cfg.kl_coef = p.separate_kl ? 0.0 : o.beta;
  cfg.normalizer = trl::normalizer(nopt, counts);
  cfg.check_values = o.check_values;
  return cfg;
}

//! luspo at the token level runs over every position: its clip metrics are those of the valid
//! tokens, from a pass over them with the multipliers alone (into scratch, before any write).
template <class T, class M, class Exec>
[[nodiscard]] loss_metrics luspo_valid_metrics(const policy_loss_inputs<T, M>& pin, token_view<const M> mask,
                                               const multipliers<T>& m, const policy_loss_config& cfg,
                                               const Exec& exec) {
  const std::size_t B = pin.log_prob.rows(), Tn = pin.log_prob.cols();
  std::vector<T> factors, scratch_grad(B * Tn);
  policy_loss_inputs<T, M> valid_only = pin;
  valid_only.mask = mask;
  valid_only.weights = {};
  if (m.any) {
    factors.resize(B * Tn);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < Tn; ++t) factors[b * Tn + t] = static_cast<T>(m.at(b, t));
    valid_only.weights = detail::padded_scratch<const T>(factors, B, Tn);
  }
  policy_loss_config mcfg = cfg;
  mcfg.kl_coef = 0.0;
  return ::ulorl::policy_loss(valid_only, detail::padded_scratch<T>(scratch_grad, B, Tn), token_view<T>{}, mcfg, exec)
      .metrics;
}

//! The element-wise k3 and its gradient [B, T] of the separately added KL term (before any write).
template <class T>
struct kl_terms {
  std::vector<T> value, grad;
};
template <class T>
[[nodiscard]] kl_terms<T> separate_kl_terms(token_view<const T> lp, token_view<const T> ref) {
  const std::size_t B = lp.rows(), Tn = lp.cols();
  kl_terms<T> k{std::vector<T>(B * Tn), std::vector<T>(B * Tn)};
  ::ulorl::kl_penalty<T>(lp, ref, detail::padded_scratch<T>(k.value, B, Tn), detail::padded_scratch<T>(k.grad, B, Tn),
                         trl::kl({}));
  return k;
}

//! The entropy bonus's normaliser over the tokens the bonus covers (the top-entropy mask's, or the
//! valid ones), checked before any write.
template <class T>
[[nodiscard]] agg_normalizer bonus_normalizer(const normalizer_options& nopt, const batch_counts& counts,
                                              const multipliers<T>& m, std::size_t B, std::size_t Tn) {
  const double bonus_tokens =
      m.emask.empty() ? counts.tokens : count_batch(detail::padded_scratch<const T>(m.emask, B, Tn)).tokens;
  const agg_normalizer norm = trl::entropy_normalizer(nopt, counts, bonus_tokens);
  validate_normalizer(fn, norm);
  return norm;
}

//! Adds the separate KL term to the gradient and returns {β-weighted aggregated KL, the estimate's
//! sum over the valid tokens}. k3 per token; luspo: over every position with weight n_b / (B T GA);
//! else as the objective. use_bias_correction_kl: k3 times the ratio iw, exp(logp − old) at the
//! token level (luspo), else exp(ω_b), whose gradient reaches the row's valid tokens through the
//! mean (1/n_b each).
struct kl_sums {
  double loss = 0, valid_sum = 0;
};
template <class T, class M>
kl_sums add_separate_kl(token_view<T> grad, token_view<const T> lp, token_view<const T> old, token_view<const M> mask,
                        const row_ratios& rows, const kl_terms<T>& k, const agg_normalizer& norm,
                        const grpo_loss_options& o, const plan& p) {
  const std::size_t B = lp.rows(), Tn = lp.cols(), BT = B * Tn;
  const bool bias = o.use_bias_correction_kl;
  const double beta = o.beta;
  kl_sums s;
  for (std::size_t b = 0; b < B; ++b) {
    const double row_w = p.luspo ? rows.nrow[b] / (static_cast<double>(BT) * o.gradient_accumulation_steps)
                                 : row_weight(norm, static_cast<std::size_t>(rows.nrow[b]));
    const double row_ratio = bias && p.seq ? std::exp(rows.omega[b]) : 1.0;
    double to_mean = 0;  // d loss / d ω_b
    for (std::size_t t = 0; t < Tn; ++t) {
      const bool valid = mask(b, t) != M(0);
      if (!p.luspo && !valid) continue;
      const double iw =
          bias && !p.seq ? std::exp(static_cast<double>(lp(b, t)) - static_cast<double>(old(b, t))) : row_ratio;
      const double c = row_w * beta, kv = static_cast<double>(k.value[b * Tn + t]) * iw;
      double g = c * static_cast<double>(k.grad[b * Tn + t]) * iw;
      if (bias && p.seq)
        to_mean += c * kv;
      else if (bias)
        g += c * kv;
      s.loss += c * kv;
      grad(b, t) = static_cast<T>(static_cast<double>(grad(b, t)) + g);
      s.valid_sum += valid ? kv : 0.0;
    }
    if (to_mean != 0.0 && rows.nrow[b] > 0)
      for (std::size_t t = 0; t < Tn; ++t)
        if (mask(b, t) != M(0)) grad(b, t) = static_cast<T>(static_cast<double>(grad(b, t)) + to_mean / rows.nrow[b]);
  }
  return s;
}

//! The entropy bonus -coef · TRL's entropy mean over the tokens it covers, its gradient written to
//! grad_entropies; without a bonus, given grad_entropies are zeros.
template <class T, class M>
[[nodiscard]] double entropy_bonus(const grpo_loss_inputs<T, M>& in, const grpo_loss_outputs<T>& out,
                                   token_view<const M> mask, const multipliers<T>& m, double coef,
                                   const std::optional<agg_normalizer>& norm) {
  if (coef != 0.0) {
    const std::size_t B = in.per_token_logps.rows(), Tn = in.per_token_logps.cols();
    return m.emask.empty() ? ::ulorl::entropy_loss(in.entropies, mask, out.grad_entropies, coef, *norm)
                           : ::ulorl::entropy_loss(in.entropies, detail::padded_scratch<const T>(m.emask, B, Tn),
                                                   out.grad_entropies, coef, *norm);
  }
  for (std::size_t b = 0; b < out.grad_entropies.rows(); ++b)
    for (std::size_t t = 0; t < out.grad_entropies.row_size(b); ++t) out.grad_entropies(b, t) = T(0);
  return 0.0;
}

// TRL's metrics: a single-column quantity (sequence level, or T = 1) is averaged over all B rows,
// ignoring the mask. At T = 1 below the sequence level, the masked rows' own flags and KL join the
// valid tokens' (policy_loss counts valid tokens only); a masked row's ratio is exp(logp − old) at
// the token level and exp(ω_b) = 1 for GSPO-token (no valid token: ω_b = 0).

//! A masked row's ratio at T = 1 (see above).
template <class T>
[[nodiscard]] double masked_row_ratio(token_view<const T> lp, token_view<const T> old, const row_ratios& rows,
                                      const plan& p, std::size_t b) {
  return p.level == importance_sampling_kind::token
             ? std::exp(static_cast<double>(lp(b, 0)) - static_cast<double>(old(b, 0)))
             : std::exp(rows.omega[b]);
}

//! The clip metrics TRL logs for the loss type (clip_ratio/*, cispo_clip_ratio) and vespo's
//! phi_seq_mean, into r.
template <class T, class M>
void logged_clip_metrics(grpo_loss_result& r, const grpo_loss_inputs<T, M>& in, token_view<const M> mask,
                         const row_ratios& rows, const multipliers<T>& m, const plan& p) {
  using LT = loss_type_kind;
  const token_view<const T>& lp = in.per_token_logps;
  const std::size_t B = lp.rows();
  const bool single_token_column = lp.cols() == 1 && !p.seq;
  const double rows_d = static_cast<double>(B);
  const objective_config& obj = p.objective;
  switch (p.loss_type) {
    case LT::grpo:
    case LT::bnpo:
    case LT::dr_grpo:
    case LT::dapo:
    case LT::luspo: {
      clip_metrics clip = clip_ratios(r.metrics, p.level);
      if (single_token_column) {
        double low = r.metrics.clipped_low, high = r.metrics.clipped_high;
        for (std::size_t b = 0; b < B; ++b) {
          if (mask(b, 0) != M(0)) continue;
          double c1 = masked_row_ratio(lp, in.old_per_token_logps, rows, p, b);
          if (obj.delta > 0.0) c1 = std::min(c1, obj.delta);
          low += (c1 < 1.0 - obj.eps_low && in.advantages[b] < T(0)) ? 1.0 : 0.0;
          high += (c1 > 1.0 + obj.eps_high && in.advantages[b] > T(0)) ? 1.0 : 0.0;
        }
        clip = {low / rows_d, high / rows_d, (low + high) / rows_d};
      }
      r.clip_ratio_low_mean = clip.low_mean;
      r.clip_ratio_high_mean = clip.high_mean;
      r.clip_ratio_region_mean = clip.region_mean;
      break;
    }
    case LT::cispo: {
      const double cap = 1.0 + obj.eps_high;
      if (p.seq) {
        double n = 0;
        for (std::size_t b = 0; b < B; ++b) n += (std::exp(rows.omega[b]) > cap && in.advantages[b] > T(0)) ? 1.0 : 0.0;
        r.cispo_clip_ratio = n / rows_d;
      } else if (single_token_column) {
        double n = r.metrics.clipped_high;
        for (std::size_t b = 0; b < B; ++b)
          if (mask(b, 0) == M(0))
            n +=
                (masked_row_ratio(lp, in.old_per_token_logps, rows, p, b) > cap && in.advantages[b] > T(0)) ? 1.0 : 0.0;
        r.cispo_clip_ratio = n / rows_d;
      } else {
        r.cispo_clip_ratio = r.metrics.clip_high_fraction();
      }
      break;
    }
    case LT::vespo: {
      double s = 0;
      for (double v : m.phi) s += v;
      r.vespo_phi_seq_mean = s / static_cast<double>(B);
      break;
    }
    case LT::sapo:
      break;
  }
}

//! TRL's entropy mean: over the valid tokens, or over every row at T = 1.
template <class T, class M>
[[nodiscard]] double logged_entropy_mean(token_view<const T> entropies, token_view<const M> mask,
                                         const batch_counts& counts) {
  const std::size_t B = entropies.rows(), Tn = entropies.cols();
  const bool single = Tn == 1;
  double s = 0;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < Tn; ++t)
      s += (single || mask(b, t) != M(0)) ? static_cast<double>(entropies(b, t)) : 0.0;
  return single ? s / static_cast<double>(B) : (counts.tokens > 0 ? s / counts.tokens : 0.0);
}

//! TRL's KL mean: k3 (times the bias correction's ratio) over the valid tokens, or at T = 1 over
//! every row (a masked row's sequence ratio is exp(0) = 1). The valid tokens' estimate is the
//! separate KL term's sum `separate_sum` when it ran, else policy_loss's metrics `pl`.
template <class T, class M>
[[nodiscard]] double logged_kl_mean(const grpo_loss_inputs<T, M>& in, token_view<const M> mask, const row_ratios& rows,
                                    const plan& p, const grpo_loss_options& o, const batch_counts& counts,
                                    const loss_metrics& pl, std::optional<double> separate_sum) {
  const token_view<const T>& lp = in.per_token_logps;
  if (lp.cols() != 1) return !separate_sum ? pl.kl_mean() : (counts.tokens > 0 ? *separate_sum / counts.tokens : 0.0);
  const std::size_t B = lp.rows();
  double s = separate_sum ? *separate_sum : pl.kl_sum;
  for (std::size_t b = 0; b < B; ++b) {
    if (mask(b, 0) != M(0)) continue;
    const double d = static_cast<double>(in.ref_per_token_logps(b, 0)) - static_cast<double>(lp(b, 0));
    const double k = std::expm1(d) - d;
    s += o.use_bias_correction_kl ? k * (p.seq ? 1.0 : masked_row_ratio(lp, in.old_per_token_logps, rows, p, b)) : k;
  }
  return s / static_cast<double>(B);
}

//! The terms added after policy_loss (the separate KL's gradient, the sequence spread, the entropy
//! bonus) are checked as policy_loss checks its own: a result beyond its type's range is an error
//! naming it, and the gradient outputs are then set to 0.
template <class T>
void require_results_in_range(const grpo_loss_result& r, const token_view<T>& grad,
                              const token_view<T>& grad_entropies) {
  const auto fail = [&](std::string_view what, std::int64_t at, double value, bool in_t) {
    for (const token_view<T>* v : {&grad, &grad_entropies})
      for (std::size_t b = 0; b < v->rows(); ++b)
        for (std::size_t t = 0; t < v->row_size(b); ++t) (*v)(b, t) = T(0);
    if (in_t) require_result_in_range<T>(fn, what, at, value, "the gradient outputs are set to 0");
    require_result_in_range<double>(fn, what, at, value, "the gradient outputs are set to 0");
  };
  for (const auto& [name, v] : {std::pair<std::string_view, const token_view<T>*>{"grad_per_token_logps", &grad},
                                std::pair<std::string_view, const token_view<T>*>{"grad_entropies", &grad_entropies}})
    for (std::size_t b = 0; b < v->rows(); ++b)
      for (std::size_t t = 0; t < v->row_size(b); ++t)
        if (!std::isfinite((*v)(b, t)))
          fail(name, static_cast<std::int64_t>(v->flat_index(b, t)), static_cast<double>((*v)(b, t)), true);
  const double max_t = static_cast<double>(std::numeric_limits<T>::max());
  for (const auto& [name, value] :
       {std::pair<std::string_view, double>{"kl_loss", r.kl_loss}, {"entropy_loss", r.entropy_loss}, {"loss", r.loss}})
    if (!(std::fabs(value) <= max_t)) fail(name, -1, value, true);
  for (const auto& [name, value] : {std::pair<std::string_view, double>{"kl_mean", r.kl_mean.value_or(0.0)},
                                    {"entropy_mean", r.entropy_mean.value_or(0.0)},
                                    {"vespo_phi_seq_mean", r.vespo_phi_seq_mean.value_or(0.0)}})
    if (!std::isfinite(value)) fail(name, -1, value, false);
}

}  // namespace ULORL_ISA
}  // namespace detail

inline namespace ULORL_ISA {

//! TRL's loss of one micro-batch (the composition above): writes d loss / d per_token_logps and,
//! when given, d loss / d entropies; returns the loss, its parts and the metrics. Everything is
//! validated before anything is written (ulorl::error naming the function, the argument and the
//! index): the options (sequence_token with use_bias_correction_kl or an entropy bonus, which
//! TRL's GSPO-token trainer does not have; top_entropy_quantile outside [0, 1]), the padded layout
//! and the shapes, the required inputs and outputs, the values. `exec` runs policy_loss's rows (the
//! results are the same bits for every executor).
template <class T, class M, class Exec>
[[nodiscard]] grpo_loss_result grpo_loss(const grpo_loss_inputs<T, M>& in, const grpo_loss_outputs<T>& out,
                                         const grpo_loss_options& o, const Exec& exec) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "presets::trl::grpo_loss: T must be float or double");
  namespace G = detail;
  // Checks, then what needs scratch only, before the first write to the outputs.
  const G::plan p = G::plan_of(o);
  const token_view<const M> mask = G::require_shapes(in, out, o, p);
  G::require_values(in, mask, o);
  const token_view<const T>& lp = in.per_token_logps;
  const token_view<const T>& old = in.old_per_token_logps;
  const token_view<T>& grad = out.grad_per_token_logps;
  const std::size_t B = lp.rows(), Tn = lp.cols();
  const batch_counts counts = count_batch(mask);
  const G::row_ratios rows = G::row_log_ratios(lp, old, mask);
  const G::multipliers<T> mult = G::policy_multipliers(in, mask, o, p);
  const std::vector<T> weights = G::policy_weights(mult, rows, p, B, Tn);
  const std::vector<T> adv = G::token_advantages(in.advantages, Tn);
  policy_loss_inputs<T, M> pin{lp, old, detail::padded_scratch<const T>(adv, B, Tn),
                               p.luspo_tokens ? token_view<const M>{} : mask};  // luspo tokens: every position
  pin.ref_log_prob = in.ref_per_token_logps;
  if (!weights.empty()) pin.weights = detail::padded_scratch<const T>(weights, B, Tn);
  const normalizer_options nopt = G::normalizer_options_of(o, p, Tn);
  const policy_loss_config cfg = G::policy_config(o, p, nopt, counts);
  std::optional<loss_metrics> luspo_metrics;
  if (p.luspo_tokens) luspo_metrics = G::luspo_valid_metrics(pin, mask, mult, cfg, exec);
  const G::kl_terms<T> kl =
      p.separate_kl && o.beta != 0.0 ? G::separate_kl_terms(lp, in.ref_per_token_logps) : G::kl_terms<T>{};
  std::optional<agg_normalizer> entropy_norm;
  if (o.entropy_coef != 0.0) entropy_norm = G::bonus_normalizer(nopt, counts, mult, B, Tn);

  // The loss (policy_loss validates its configuration before writing), then the terms added to it.
  const policy_loss_result res = ::ulorl::policy_loss(pin, grad, token_view<T>{}, cfg, exec);
  grpo_loss_result r;
  r.pg_loss = res.pg_loss;
  r.kl_loss = res.kl_loss;
  r.metrics = luspo_metrics ? *luspo_metrics : res.metrics;
  std::optional<double> separate_kl_sum;  // the separate KL estimate's sum over the valid tokens
  if (!kl.value.empty()) {
    const G::kl_sums s = G::add_separate_kl(grad, lp, old, mask, rows, kl, cfg.normalizer, o, p);
    r.kl_loss += s.loss;
    r.metrics.kl_sum = s.valid_sum;
    separate_kl_sum = s.valid_sum;
  }
  r.entropy_loss = G::entropy_bonus(in, out, mask, mult, o.entropy_coef, entropy_norm);
  r.loss = r.pg_loss + r.kl_loss + r.entropy_loss;

  // The metrics TRL logs, then the check of what was added after policy_loss.
  G::logged_clip_metrics(r, in, mask, rows, mult, p);
  if (!in.entropies.empty()) r.entropy_mean = G::logged_entropy_mean(in.entropies, mask, counts);
  if (o.beta != 0.0) r.kl_mean = G::logged_kl_mean(in, mask, rows, p, o, counts, res.metrics, separate_kl_sum);
  if (cfg.check_values) G::require_results_in_range(r, grad, out.grad_entropies);
  return r;
}

//! As above on the calling thread.
template <class T, class M>
[[nodiscard]] grpo_loss_result grpo_loss(const grpo_loss_inputs<T, M>& in, const grpo_loss_outputs<T>& out,
                                         const grpo_loss_options& o) {
  return grpo_loss(in, out, o, sequential_executor{});
}

}  // namespace ULORL_ISA

}  // namespace presets::trl

template <>
inline constexpr std::string_view record_name<presets::trl::grpo_loss_options> = "trl_grpo_loss_options";
template <>
inline constexpr std::string_view record_name<presets::trl::grpo_loss_result> = "trl_grpo_loss_result";
ULORL_NAMESPACE_END
