// ulorl/presets/openrlhf.hpp — OpenRLHF's semantics as named parameter sets, under OpenRLHF's option
// names (OpenRLHF 3c3be6234e0c):
//
//   advantages  group_norm (unbiased std, eps 1e-9, a group of one rejected), rloo, dr_grpo; the
//               advantages fill the row up to its last valid token
//   loss        PolicyLoss (ppo / gspo, dual clip, vLLM IS correction), compute_approx_kl (every
//               estimator clamped to +-10), token- or sequence-level loss with OpenRLHF's local
//               normaliser unless the global counts are passed
//   rollout     vllm_is_correction_type tis / icepop / seq-mask-tis with vllm_is_truncated_threshold
//   correction
//
// Parameter sets of the advantage and loss areas, never second copies of their algorithms.
// Mirrored by python/ulorl/presets/openrlhf.py; docs/presets/openrlhf.md maps OpenRLHF's functions.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/rollout_correction/compute.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
#include "ulorl/presets/detail.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::openrlhf {

// ---- advantages -----------------------------------------------------------------------------------

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
    case advantage_estimator::group_norm:
      break;
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

// ---- policy loss ----------------------------------------------------------------------------------

//! `policy_loss_type`.
enum class policy_loss_kind { ppo, gspo };
[[nodiscard]] inline policy_loss_kind policy_loss_type_from_name(std::string_view name) {
  static constexpr presets::detail::name_entry<policy_loss_kind> table[] = {{"ppo", policy_loss_kind::ppo},
                                                                            {"gspo", policy_loss_kind::gspo}};
  return presets::detail::parse("presets::openrlhf::policy_loss_type_from_name", "policy_loss_type", name, table);
}

struct objective_options {
  policy_loss_kind policy_loss_type = policy_loss_kind::ppo;
  double clip_eps_low = 0.2;
  double clip_eps_high = 0.2;
  std::optional<double> dual_clip{};  //!< c > 1 for negative advantages; absent: none
  //! vLLM importance-sampling correction (its type and thresholds: rollout_correction_options
  //! below); see vllm_is_correction().
  bool enable_vllm_is_correction = false;
};

//! What enable_vllm_is_correction changes in the loss of a policy_loss_type.
struct vllm_is_plan {
  //! ppo: the objective is multiplied by rollout_correction(rollout_correction_options) weights of
  //! (old_log_prob, rollout_log_prob) (policy_loss_inputs::weights).
  bool weights = false;
  //! gspo: no weights; the sequence log-ratio is taken against the rollout policy,
  //! s_b = sum_t (logp - rollout_log_prob) m / max(n_b, 1) (pass rollout_log_prob as old_log_prob).
  bool ratio_against_rollout = false;
};
[[nodiscard]] inline vllm_is_plan vllm_is_correction(const objective_options& o) {
  require_known("presets::openrlhf::vllm_is_correction", "policy_loss_type", o.policy_loss_type, policy_loss_kind::ppo,
                policy_loss_kind::gspo);
  if (!o.enable_vllm_is_correction) return {};
  return {.weights = o.policy_loss_type == policy_loss_kind::ppo,
          .ratio_against_rollout = o.policy_loss_type == policy_loss_kind::gspo};
}

//! ppo (log r clamped to +-20) or gspo (sequence ratio exp(mean log r), no clamp, gradient
//! through the mean); optional dual clip.
[[nodiscard]] inline objective_config objective(const objective_options& o) {
  constexpr const char* fn = "presets::openrlhf::objective";
  require_known(fn, "policy_loss_type", o.policy_loss_type, policy_loss_kind::ppo, policy_loss_kind::gspo);
  require_not_nan(fn, "clip_eps_low", o.clip_eps_low);
  require_not_nan(fn, "clip_eps_high", o.clip_eps_high);
  require_not_nan(fn, "dual_clip", o.dual_clip);
  objective_config c{.eps_low = o.clip_eps_low, .eps_high = o.clip_eps_high, .log_ratio_clamp = 20.0};
  switch (o.policy_loss_type) {
    case policy_loss_kind::ppo:
      c.kind = objective_kind::ppo_clip;
      break;
    case policy_loss_kind::gspo:
      c.kind = objective_kind::gspo, c.gspo.seq_log_ratio_max = no_limit,
      c.gspo.seq_gradient = sequence_gradient::through_mean;
      break;
  }
  if (o.dual_clip) {
    if (!(*o.dual_clip > 1.0)) ulorl::detail::fail_value(fn, "dual_clip", *o.dual_clip, "must be > 1");
    c.dual_clip = *o.dual_clip;
  }
  return c;
}

//! `kl_estimator` k1 / k2 / k3, every estimator clamped to +-10 (zero gradient outside).
struct kl_options {
  ulorl::kl_estimator kl_estimator = ulorl::kl_estimator::k1;
};
[[nodiscard]] inline kl_estimator kl_estimator_from_name(std::string_view name) {
  static constexpr presets::detail::name_entry<ulorl::kl_estimator> table[] = {
      {"k1", ulorl::kl_estimator::k1}, {"k2", ulorl::kl_estimator::k2}, {"k3", ulorl::kl_estimator::k3}};
  return presets::detail::parse("presets::openrlhf::kl_estimator_from_name", "kl_estimator", name, table);
}
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  presets::detail::require_estimator("presets::openrlhf::kl", "kl_estimator", o.kl_estimator,
                                     o.kl_estimator != ulorl::kl_estimator::abs);
  return {.estimator = o.kl_estimator, .output_clamp = 10.0};
}

//! The loss-aggregation options. Absent optionals: this batch's own counts, without `dp_size`.
struct normalizer_options {
  bool token_level_loss = true;
  double dp_size = 1.0;
  std::optional<double> batch_num_tokens{};   //!< token-level
  std::optional<double> global_batch_size{};  //!< sequence-level
};

//! Token-level: sum / N (local) or sum / batch_num_tokens * dp_size. Sequence-level: mean of row
//! means over the local non-empty rows, or over global_batch_size * dp_size.
[[nodiscard]] inline agg_normalizer normalizer(const normalizer_options& o, const batch_counts& local) {
  require_not_nan("presets::openrlhf::normalizer", "dp_size", o.dp_size);
  require_not_nan("presets::openrlhf::normalizer", "batch_num_tokens", o.batch_num_tokens);
  require_not_nan("presets::openrlhf::normalizer", "global_batch_size", o.global_batch_size);
  if (o.token_level_loss)
    return o.batch_num_tokens ? agg_normalizer{agg_mode::token_mean, *o.batch_num_tokens, o.dp_size}
                              : agg_normalizer{agg_mode::token_mean, local.tokens, 1.0};
  return o.global_batch_size ? agg_normalizer{agg_mode::seq_mean_token_mean, *o.global_batch_size, o.dp_size}
                             : agg_normalizer{agg_mode::seq_mean_token_mean, local.sequences, 1.0};
}

//! The normaliser a `policy_loss_type` actually uses: gspo forces the sequence-level loss
//! (token_level_loss = false) whatever the caller asked for.
[[nodiscard]] inline agg_normalizer policy_normalizer(policy_loss_kind policy_loss_type, normalizer_options o,
                                                      const batch_counts& local) {
  require_known("presets::openrlhf::policy_normalizer", "policy_loss_type", policy_loss_type, policy_loss_kind::ppo,
                policy_loss_kind::gspo);
  if (policy_loss_type == policy_loss_kind::gspo) o.token_level_loss = false;
  return normalizer(o, local);
}

// ---- rollout correction ---------------------------------------------------------------------------

//! `--algo.advantage.is_correction_type` options (vLLM importance-sampling correction).
struct rollout_correction_options {
  rollout_correction::is_weighting vllm_is_correction_type =
      rollout_correction::is_weighting::truncate;                  //!< tis / icepop / seq-mask-tis
  std::array<double, 2> vllm_is_truncated_threshold = {0.5, 5.0};  //!< [lo, hi]
};

//! OpenRLHF's semantics: e = exp(x) unclamped at every position (masked ones included); tis
//! clamp(e, lo, hi); icepop e * [lo <= e <= hi]; seq-mask-tis e * [lo <= exp(mean_t x m) <= hi], raw
//! token weights, empty rows dropped. Masks multiply, so an overflowing e that is masked is NaN and
//! rejected; an empty batch is rejected (vllm_kl is 0/0).
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  constexpr std::string_view fn = "presets::openrlhf::rollout_correction";
  require_known(fn, "vllm_is_correction_type", o.vllm_is_correction_type, is_weighting::truncate, is_weighting::mask,
                is_weighting::geometric_gate);
  const auto [lo, hi] = o.vllm_is_truncated_threshold;
  require_non_negative(fn, "vllm_is_truncated_threshold", lo);
  require_positive(fn, "vllm_is_truncated_threshold", hi);
  if (!(lo <= hi))
    ulorl::detail::fail_value(fn, "vllm_is_truncated_threshold", lo, "the lower bound exceeds the upper bound");
  config c{.importance = {.level = is_level::token,
                          .weighting = o.vllm_is_correction_type,
                          .lower = lo,
                          .upper = hi,
                          .log_ratio_clamp = unbounded,
                          .overflow = ratio_overflow::nan_when_masked,
                          .masked = masked_positions::as_valid,
                          .empty_rows = empty_row_gate::drop},
           .reject_empty_batch = true};
  validate(fn, c);
  return c;
}

}  // namespace presets::openrlhf
ULORL_NAMESPACE_END
