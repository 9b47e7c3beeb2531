// ulorl/loss/presets.hpp — the frameworks' policy-loss semantics as named parameter sets.
//
//   verl      compute_policy_loss_{vanilla,gspo,cispo,geo_mean,sapo,gpg}, kl_penalty, agg_loss
//             (volcengine/verl b178a3cd56f5; "+" KL names as fixed by PR #6058)
//   openrlhf  PolicyLoss (ppo / gspo, dual clip), compute_approx_kl, token/sequence-level loss
//             (OpenRLHF 3c3be6234e0c)
//   nemo_rl   ClippedPGLossFn's KL (input / output clamps), token-mean over the global batch
//             (NVIDIA-NeMo/RL 7ea279abfbeb)
//   trl       GRPOTrainer._compute_loss: loss_type grpo / bnpo / dr_grpo / dapo, epsilon(_high),
//             delta, beta, importance_sampling_level, use_bias_correction_kl (TRL f2cd57710ae3)
//
// Presets only choose parameters (and, where a framework genuinely differs, a named variant such
// as the sequence-ratio gradient); the algorithms are those of objectives.hpp, kl.hpp and
// aggregation.hpp. The frameworks' *local* normalisers (a micro-batch divides by its own counts
// unless the caller passes the global ones) are reproduced here for compatibility; they are
// partition-exact only when the global counts are passed. docs/losses.md compares every formula.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets {

namespace detail_presets {
[[noreturn]] inline void unknown(std::string_view fn, std::string_view arg, std::string_view name) {
  detail::fail(fn, arg, "unknown name '" + std::string(name) + "'");
}
}  // namespace detail_presets

// ---- verl -----------------------------------------------------------------------------------------
namespace verl {

//! `actor.policy_loss.loss_mode`: vanilla (PPO clip-higher + dual clip c), gspo, cispo, geo_mean,
//! sapo, gpg. Ratios clamp log r to +-20 (gspo: sequence log-ratio <= 10, own-token gradient).
[[nodiscard]] inline objective_config objective(std::string_view loss_mode, double clip_ratio_low, double clip_ratio_high,
                                                double clip_ratio_c = 3.0, double tau_pos = 1.0, double tau_neg = 1.05) {
  objective_config c{.eps_low = clip_ratio_low, .eps_high = clip_ratio_high, .log_ratio_clamp = 20.0};
  if (loss_mode == "vanilla") c.kind = objective_kind::ppo_clip, c.dual_clip = clip_ratio_c;
  else if (loss_mode == "gspo") c.kind = objective_kind::gspo, c.seq_log_ratio_max = 10.0,
                                c.seq_gradient = sequence_gradient::own_token;
  else if (loss_mode == "cispo") c.kind = objective_kind::cispo;
  else if (loss_mode == "geo_mean") c.kind = objective_kind::gmpo;
  else if (loss_mode == "sapo") c.kind = objective_kind::sapo, c.tau_pos = tau_pos, c.tau_neg = tau_neg;
  else if (loss_mode == "gpg") c.kind = objective_kind::policy_gradient;
  else detail_presets::unknown("presets::verl::objective", "loss_mode", loss_mode);
  if (loss_mode == "vanilla" && !(clip_ratio_c > 1.0))
    detail::fail_value("presets::verl::objective", "clip_ratio_c", clip_ratio_c, "must be > 1 (dual clip)");
  return c;
}

//! `kl_penalty` names: kl/k1, abs, mse/k2, low_var_kl/k3 (clamps: |ref - logp| <= 20, |kl| <= 10);
//! a trailing "+" keeps the value and uses the straight-through k2 gradient.
[[nodiscard]] inline kl_config kl(std::string_view name) {
  kl_config c{};
  std::string_view base = name;
  if (!base.empty() && base.back() == '+') c.straight_through = true, base.remove_suffix(1);
  if (base == "kl" || base == "k1") c.estimator = kl_estimator::k1;
  else if (base == "abs") c.estimator = kl_estimator::abs;
  else if (base == "mse" || base == "k2") c.estimator = kl_estimator::k2;
  else if (base == "low_var_kl" || base == "k3") c.estimator = kl_estimator::k3, c.input_clamp = 20.0, c.output_clamp = 10.0;
  else detail_presets::unknown("presets::verl::kl", "kl_penalty", name);
  return c;
}

//! `loss_agg_mode` names.
[[nodiscard]] inline agg_mode agg_mode_from_name(std::string_view name) {
  if (name == "token-mean") return agg_mode::token_mean;
  if (name == "seq-mean-token-sum") return agg_mode::seq_mean_token_sum;
  if (name == "seq-mean-token-mean") return agg_mode::seq_mean_token_mean;
  if (name == "seq-mean-token-sum-norm") return agg_mode::seq_mean_token_sum_norm;
  detail_presets::unknown("presets::verl::agg_mode_from_name", "loss_agg_mode", name);
}

//! verl `agg_loss`'s normaliser: token-mean divides by `batch_num_tokens` (default: this batch's N),
//! the seq modes by `global_batch_size` (default: this batch's non-empty rows), both times
//! `dp_size`; seq-mean-token-sum-norm by `loss_scale_factor` (default: the padded length T).
[[nodiscard]] inline agg_normalizer normalizer(agg_mode mode, const batch_counts& local, double dp_size,
                                               std::optional<double> batch_num_tokens,
                                               std::optional<double> global_batch_size,
                                               std::optional<double> loss_scale_factor, std::size_t padded_length) {
  switch (mode) {
    case agg_mode::token_mean: return {mode, batch_num_tokens.value_or(local.tokens), dp_size};
    case agg_mode::seq_mean_token_sum:
    case agg_mode::seq_mean_token_mean: return {mode, global_batch_size.value_or(local.sequences), dp_size};
    case agg_mode::seq_mean_token_sum_norm:
    case agg_mode::constant:
      return {mode, loss_scale_factor.value_or(static_cast<double>(padded_length)), 1.0};
  }
  return {};
}

//! The normaliser a `loss_mode` actually uses: gspo and sapo force seq-mean-token-mean; geo_mean
//! averages its per-sequence losses over the batch's rows and ignores every agg parameter.
[[nodiscard]] inline agg_normalizer policy_normalizer(std::string_view loss_mode, agg_mode mode, const batch_counts& local,
                                                      double dp_size, std::optional<double> batch_num_tokens,
                                                      std::optional<double> global_batch_size,
                                                      std::optional<double> loss_scale_factor, std::size_t padded_length) {
  if (loss_mode == "geo_mean") return {agg_mode::seq_mean_token_sum, local.rows, 1.0};
  if (loss_mode == "gspo" || loss_mode == "sapo") mode = agg_mode::seq_mean_token_mean;
  return normalizer(mode, local, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor, padded_length);
}

//! verl's metrics of a loss mode: pg_clipfrac, ppo_kl, pg_clipfrac_lower.
struct policy_metrics {
  double pg_clipfrac, ppo_kl, pg_clipfrac_lower;
};
[[nodiscard]] inline policy_metrics metrics(std::string_view loss_mode, const loss_metrics& m) {
  if (loss_mode == "vanilla") return {m.clip_fraction(), m.approx_kl_k1_clamped(), m.dual_clip_fraction()};
  if (loss_mode == "gspo") return {m.clip_fraction(), m.approx_kl_k1(), 0.0};
  if (loss_mode == "cispo") return {m.clip_fraction(), m.approx_kl_k1_clamped(), 0.0};
  if (loss_mode == "geo_mean") return {m.clip_high_fraction(), m.approx_kl_k1(), m.clip_low_fraction()};
  if (loss_mode == "sapo") return {0.0, m.approx_kl_k1_clamped(), 0.0};
  return {0.0, m.approx_kl_k1_clamped(), 0.0};
}

}  // namespace verl

// ---- OpenRLHF -------------------------------------------------------------------------------------
namespace openrlhf {

//! `policy_loss_type` ppo (log r clamped to +-20) or gspo (sequence ratio exp(mean log r), no clamp,
//! gradient through the mean); optional dual clip c > 1 for negative advantages.
[[nodiscard]] inline objective_config objective(std::string_view policy_loss_type, double clip_eps_low,
                                                double clip_eps_high, std::optional<double> dual_clip = std::nullopt) {
  objective_config c{.eps_low = clip_eps_low, .eps_high = clip_eps_high, .log_ratio_clamp = 20.0};
  if (policy_loss_type == "ppo") c.kind = objective_kind::ppo_clip;
  else if (policy_loss_type == "gspo") c.kind = objective_kind::gspo, c.seq_log_ratio_max = no_limit,
                                       c.seq_gradient = sequence_gradient::through_mean;
  else detail_presets::unknown("presets::openrlhf::objective", "policy_loss_type", policy_loss_type);
  if (dual_clip) {
    if (!(*dual_clip > 1.0)) detail::fail_value("presets::openrlhf::objective", "dual_clip", *dual_clip, "must be > 1");
    c.dual_clip = *dual_clip;
  }
  return c;
}

//! `kl_estimator` k1 / k2 / k3, every estimator clamped to +-10 (zero gradient outside).
[[nodiscard]] inline kl_config kl(std::string_view estimator) {
  kl_config c{.output_clamp = 10.0};
  if (estimator == "k1") c.estimator = kl_estimator::k1;
  else if (estimator == "k2") c.estimator = kl_estimator::k2;
  else if (estimator == "k3") c.estimator = kl_estimator::k3;
  else detail_presets::unknown("presets::openrlhf::kl", "kl_estimator", estimator);
  return c;
}

//! Token-level: sum / N (local) or sum / batch_num_tokens * dp_size. Sequence-level: mean of row
//! means over the local non-empty rows, or over global_batch_size * dp_size.
[[nodiscard]] inline agg_normalizer normalizer(bool token_level_loss, const batch_counts& local, double dp_size,
                                               std::optional<double> batch_num_tokens,
                                               std::optional<double> global_batch_size) {
  if (token_level_loss)
    return batch_num_tokens ? agg_normalizer{agg_mode::token_mean, *batch_num_tokens, dp_size}
                            : agg_normalizer{agg_mode::token_mean, local.tokens, 1.0};
  return global_batch_size ? agg_normalizer{agg_mode::seq_mean_token_mean, *global_batch_size, dp_size}
                           : agg_normalizer{agg_mode::seq_mean_token_mean, local.sequences, 1.0};
}

//! The normaliser a `policy_loss_type` actually uses: gspo forces the sequence-level loss
//! (token_level_loss = false) whatever the caller asked for.
[[nodiscard]] inline agg_normalizer policy_normalizer(std::string_view policy_loss_type, bool token_level_loss,
                                                      const batch_counts& local, double dp_size,
                                                      std::optional<double> batch_num_tokens,
                                                      std::optional<double> global_batch_size) {
  if (policy_loss_type != "ppo" && policy_loss_type != "gspo")
    detail_presets::unknown("presets::openrlhf::policy_normalizer", "policy_loss_type", policy_loss_type);
  return normalizer(policy_loss_type == "gspo" ? false : token_level_loss, local, dp_size, batch_num_tokens, global_batch_size);
}

}  // namespace openrlhf

// ---- NeMo-RL --------------------------------------------------------------------------------------
namespace nemo_rl {

//! `reference_policy_kl_type` k1 / k2 / k3 with optional input and output clamps.
[[nodiscard]] inline kl_config kl(std::string_view kl_type, std::optional<double> input_clamp_value,
                                  std::optional<double> output_clamp_value) {
  kl_config c{.input_clamp = input_clamp_value.value_or(no_limit), .output_clamp = output_clamp_value.value_or(no_limit)};
  if (kl_type == "k1") c.estimator = kl_estimator::k1;
  else if (kl_type == "k2") c.estimator = kl_estimator::k2;
  else if (kl_type == "k3") c.estimator = kl_estimator::k3;
  else detail_presets::unknown("presets::nemo_rl::kl", "kl_type", kl_type);
  return c;
}

//! ClippedPGLossFn: PPO clip (ratio_clip_min / max) with optional dual clip, unclamped log-ratio;
//! token-mean over the global batch's valid tokens (natively partition-exact).
[[nodiscard]] inline objective_config objective(double ratio_clip_min, double ratio_clip_max,
                                                std::optional<double> ratio_clip_c = std::nullopt) {
  return {.kind = objective_kind::ppo_clip, .eps_low = ratio_clip_min, .eps_high = ratio_clip_max,
          .dual_clip = ratio_clip_c.value_or(0.0), .log_ratio_clamp = no_limit};
}

}  // namespace nemo_rl

// ---- TRL ------------------------------------------------------------------------------------------
namespace trl {

//! GRPOTrainer: token- or sequence-level importance weight exp(w) (no clamp), clip to
//! [1 - epsilon, 1 + epsilon_high] (epsilon_high defaults to epsilon), optional delta cap.
[[nodiscard]] inline objective_config objective(double epsilon, std::optional<double> epsilon_high,
                                                std::optional<double> delta, std::string_view importance_sampling_level) {
  objective_config c{.eps_low = epsilon, .eps_high = epsilon_high.value_or(epsilon), .delta = delta.value_or(0.0),
                     .log_ratio_clamp = no_limit, .seq_log_ratio_max = no_limit,
                     .seq_gradient = sequence_gradient::through_mean};
  if (importance_sampling_level == "token") c.kind = objective_kind::ppo_clip;
  else if (importance_sampling_level == "sequence") c.kind = objective_kind::gspo;
  else detail_presets::unknown("presets::trl::objective", "importance_sampling_level", importance_sampling_level);
  return c;
}

//! beta * k3 (unclamped); with use_bias_correction_kl the estimate is multiplied by the ratio.
[[nodiscard]] inline kl_config kl(bool use_bias_correction_kl) {
  return {.estimator = kl_estimator::k3, .importance_weighted = use_bias_correction_kl};
}

//! loss_type normalisers: grpo (1/B) sum_b mean_t / GA; bnpo sum / max(N, 1) / GA;
//! dr_grpo sum / (B max_completion_length) / GA; dapo sum / (max(num_items_in_batch, 1) / P).
[[nodiscard]] inline agg_normalizer normalizer(std::string_view loss_type, const batch_counts& local,
                                               double max_completion_length, double gradient_accumulation_steps,
                                               std::optional<double> num_items_in_batch, double num_processes) {
  const double ga = gradient_accumulation_steps;
  if (loss_type == "grpo") return {agg_mode::seq_mean_token_mean, local.rows, 1.0 / ga};
  if (loss_type == "bnpo") return {agg_mode::token_mean, local.tokens > 1 ? local.tokens : 1.0, 1.0 / ga};
  if (loss_type == "dr_grpo") return {agg_mode::constant, local.rows * max_completion_length, 1.0 / ga};
  if (loss_type == "dapo") {
    const double items = num_items_in_batch.value_or(local.tokens);
    return {agg_mode::token_mean, (items > 1 ? items : 1.0) / num_processes, 1.0};
  }
  detail_presets::unknown("presets::trl::normalizer", "loss_type", loss_type);
}

//! TRL's logged clip ratios: masked token means, except that a sequence-level ratio (one column)
//! is averaged over all rows ignoring the mask.
struct clip_metrics {
  double low_mean, high_mean, region_mean;
};
[[nodiscard]] inline clip_metrics clip_ratios(const loss_metrics& m, std::string_view importance_sampling_level) {
  if (importance_sampling_level == "sequence") {
    const double b = m.rows > 0 ? m.rows : 1.0;
    return {m.seq_clipped_low / b, m.seq_clipped_high / b, m.seq_clipped_region / b};
  }
  return {m.clip_low_fraction(), m.clip_high_fraction(), m.clip_region_fraction()};
}

}  // namespace trl
}  // namespace presets
ULORL_NAMESPACE_END
