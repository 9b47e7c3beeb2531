// ulorl/presets/liger.hpp — Liger-Kernel's fused linear GRPO loss (`LigerFusedLinearGRPOLoss`,
// liger_kernel.chunked_loss; linkedin/Liger-Kernel ead96b6) under its constructor's argument names:
// what those arguments make of ulorl's loss from hidden states (the chunked fused linear head,
// logits/linear_head.hpp, which never holds the [N, V] logits).
//
//   grpo, bnpo, dr_grpo, dapo   one fused pass: PPO clip on the unclamped token ratio (delta cap),
//                               or at the sequence level GSPO with the gradient through the mean
//   cispo, sapo                 one fused pass, token level: Liger's cap min(r, epsilon_high) /
//                               SAPO's temperatures
//   luspo, vespo                TRL's loss (presets::trl::grpo_loss) on the log-probs the head
//                               computes and differentiates
//
// with β k3 against the reference (times the ratio with use_bias_correction_kl; none without
// use_ref_model) and Liger's normalisers: grpo, sapo the mean of row means over B; bnpo the valid
// tokens (at least 1); dr_grpo B · max_completion_length; dapo, cispo (and luspo / vespo through
// TRL's num_items_in_batch) max(num_items_in_batch / world size, 1), num_items_in_batch defaulting
// to the valid tokens summed over the process group. Mirrored by python/ulorl/presets/liger.py,
// which builds its fused pass from fused_linear_grpo(); docs/presets/liger.md maps Liger's calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"
#include "ulorl/presets/detail.hpp"
#include "ulorl/presets/trl.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::liger {

//! `loss_type`: TRL's names (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo).
using loss_type_kind = trl::loss_type_kind;
//! `importance_sampling_level`: token or sequence (Liger has no sequence_token).
using importance_sampling_kind = trl::importance_sampling_kind;

//! The names of `importance_sampling_level`: TRL's but sequence_token.
inline constexpr presets::detail::name_entry<importance_sampling_kind> importance_sampling_level_names[] = {
    {"token", importance_sampling_kind::token}, {"sequence", importance_sampling_kind::sequence}};

[[nodiscard]] inline loss_type_kind loss_type_from_name(std::string_view name) {
  return presets::detail::parse("presets::liger::loss_type_from_name", "loss_type", name, trl::loss_type_names);
}
[[nodiscard]] inline importance_sampling_kind importance_sampling_level_from_name(std::string_view name) {
  return presets::detail::parse("presets::liger::importance_sampling_level_from_name", "importance_sampling_level",
                                name, importance_sampling_level_names);
}

//! LigerFusedLinearGRPOLoss's constructor arguments that shape the loss, with Liger's defaults
//! (`compiled` and `chunk_size` change nothing here: the head sizes its own chunks; `temperature`
//! divides the logits, the head's own option). Where Liger takes TRL's defaults (loss type, level,
//! the SAPO temperatures, VESPO's parameters) they are TRL's (trl::defaults); beta and the epsilons
//! are Liger's own.
struct fused_linear_grpo_options {
  double beta = 0.04;
  bool use_ref_model = true;  //!< false: no KL term (Liger compares the policy with itself)
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;  //!< cispo: the cap of the ratio itself (> 0)
  loss_type_kind loss_type = trl::defaults::loss_type;
  std::optional<double> max_completion_length{};  //!< required by dr_grpo
  importance_sampling_kind importance_sampling_level = trl::defaults::importance_sampling_level;
  double sapo_temperature_pos = trl::defaults::sapo_temperature_pos;
  double sapo_temperature_neg = trl::defaults::sapo_temperature_neg;
  double temperature = 1.0;
  std::optional<double> delta{};  //!< upper cap of the ratio; absent: none
  bool use_bias_correction_kl = trl::defaults::use_bias_correction_kl;
  double vespo_k_pos = trl::defaults::vespo_k_pos;
  double vespo_lambda_pos = trl::defaults::vespo_lambda_pos;
  double vespo_k_neg = trl::defaults::vespo_k_neg;
  double vespo_lambda_neg = trl::defaults::vespo_lambda_neg;
};

//! f(name, field&) for every option, by Liger's constructor names (core/fields.hpp: the Python
//! options are this table).
template <class C, class F>
  requires ulorl::detail::record_of<C, fused_linear_grpo_options>
constexpr void visit_fields(C& c, F&& f) {
  f("beta", c.beta), f("use_ref_model", c.use_ref_model), f("epsilon_low", c.epsilon_low);
  f("epsilon_high", c.epsilon_high), f("loss_type", c.loss_type), f("max_completion_length", c.max_completion_length);
  f("importance_sampling_level", c.importance_sampling_level), f("sapo_temperature_pos", c.sapo_temperature_pos);
  f("sapo_temperature_neg", c.sapo_temperature_neg), f("temperature", c.temperature), f("delta", c.delta);
  f("use_bias_correction_kl", c.use_bias_correction_kl), f("vespo_k_pos", c.vespo_k_pos);
  f("vespo_lambda_pos", c.vespo_lambda_pos), f("vespo_k_neg", c.vespo_k_neg), f("vespo_lambda_neg", c.vespo_lambda_neg);
}

//! Throws ulorl::error for what Liger rejects at the call: an unknown loss type or level, the
//! sequence level with cispo, sapo or vespo, dr_grpo without max_completion_length, and a cispo cap
//! epsilon_high <= 0.
inline void validate(const fused_linear_grpo_options& o) {
  using L = loss_type_kind;
  constexpr std::string_view fn = "presets::liger::validate";
  require_known(fn, "loss_type", o.loss_type, L::grpo, L::bnpo, L::dr_grpo, L::dapo, L::cispo, L::sapo, L::luspo,
                L::vespo);
  require_known(fn, "importance_sampling_level", o.importance_sampling_level, importance_sampling_kind::token,
                importance_sampling_kind::sequence);
  const char* token_only = o.loss_type == L::cispo   ? "cispo"
                           : o.loss_type == L::sapo  ? "sapo"
                           : o.loss_type == L::vespo ? "vespo"
                                                     : nullptr;
  if (o.importance_sampling_level == importance_sampling_kind::sequence && token_only)
    ulorl::detail::fail(fn, "importance_sampling_level",
                        std::string("Sequence-level importance sampling is not supported for loss_type='") +
                            token_only + "'. Use importance_sampling_level='token' instead.");
  if (o.loss_type == L::dr_grpo && !o.max_completion_length)
    ulorl::detail::fail(fn, "max_completion_length", "required for loss_type 'dr_grpo'");
  if (o.loss_type == L::cispo && !(o.epsilon_high > 0.0))
    ulorl::detail::fail_value(fn, "epsilon_high", o.epsilon_high, "the cispo cap must be > 0");
}

//! Whether the loss type divides by num_items_in_batch (dapo, cispo, luspo, vespo), which the caller
//! then counts (summed over the process group when Liger's argument is absent).
[[nodiscard]] inline bool uses_num_items(const fused_linear_grpo_options& o) noexcept {
  using L = loss_type_kind;
  return o.loss_type == L::dapo || o.loss_type == L::cispo || o.loss_type == L::luspo || o.loss_type == L::vespo;
}

//! Liger's divisor of dapo / cispo / vespo: max(num_items_in_batch / world_size, 1).
[[nodiscard]] inline double dapo_denominator(double num_items_in_batch, double world_size) noexcept {
  return std::max(num_items_in_batch / world_size, 1.0);
}

//! What a call runs. fused: one pass of the fused head with `config`, whose inputs are adjusted for
//! Liger's cispo cap c < 1 (the ratio measured against old + log c, the term multiplied by c, the
//! importance-weighted KL's ratio then carrying 1/c: its coefficient and logged mean times c).
//! Otherwise (luspo, vespo): presets::trl::grpo_loss with `trl_options` on the head's log-probs.
struct fused_linear_grpo_plan {
  bool fused = true;
  policy_loss_config config{};
  double old_log_prob_shift = 0.0;  //!< added to old_per_token_logps
  double weight_scale = 1.0;        //!< multiplies the policy term's weights (an absent weight is 1)
  double kl_mean_scale = 1.0;       //!< policy_loss's kl mean times this is Liger's logged kl
  trl::grpo_loss_options trl_options{};
};

//! The plan of a call on a batch with counts `local`: `num_items_in_batch` is the count the dapo-style
//! normalisers divide (Liger's argument, else the valid tokens summed over the `world_size`
//! processes; absent: this batch's valid tokens). Validates `o` first.
[[nodiscard]] inline fused_linear_grpo_plan fused_linear_grpo(const fused_linear_grpo_options& o,
                                                              const batch_counts& local,
                                                              std::optional<double> num_items_in_batch = std::nullopt,
                                                              double world_size = 1.0) {
  using L = loss_type_kind;
  constexpr std::string_view fn = "presets::liger::fused_linear_grpo";
  validate(o);
  require_divisor(fn, "world_size", world_size);
  if (num_items_in_batch) require_finite(fn, "num_items_in_batch", *num_items_in_batch);
  const bool kl_on = o.beta != 0.0 && o.use_ref_model;
  const double items = dapo_denominator(num_items_in_batch.value_or(local.tokens), world_size);
  fused_linear_grpo_plan p;
  if (o.loss_type == L::luspo || o.loss_type == L::vespo) {
    p.fused = false;
    p.trl_options = {.loss_type = o.loss_type,
                     .epsilon = o.epsilon_low,
                     .epsilon_high = o.epsilon_high,
                     .delta = o.delta,
                     .beta = kl_on ? o.beta : 0.0,
                     .importance_sampling_level = o.importance_sampling_level,
                     .use_bias_correction_kl = o.use_bias_correction_kl,
                     .max_completion_length = o.max_completion_length.value_or(trl::defaults::max_completion_length),
                     .num_items_in_batch = items,
                     .vespo_k_pos = o.vespo_k_pos,
                     .vespo_lambda_pos = o.vespo_lambda_pos,
                     .vespo_k_neg = o.vespo_k_neg,
                     .vespo_lambda_neg = o.vespo_lambda_neg};
    return p;
  }
  policy_loss_config& c = p.config;
  c.kl = {.estimator = kl_estimator::k3, .importance_weighted = o.use_bias_correction_kl};
  c.kl_coef = kl_on ? o.beta : 0.0;
  objective_config& obj = c.objective;
  obj.log_ratio_clamp = no_limit;
  switch (o.loss_type) {
    case L::sapo:
      obj.kind = objective_kind::sapo, obj.sapo.tau_pos = o.sapo_temperature_pos,
      obj.sapo.tau_neg = o.sapo_temperature_neg;
      break;
    case L::cispo: {
      // min(r, c) is ulorl's cispo clamp(r, 1 - eps_low, 1 + eps_high) with eps_low = 1 (no floor).
      const double cap = o.epsilon_high;
      obj.kind = objective_kind::cispo, obj.eps_low = 1.0, obj.eps_high = std::max(cap - 1.0, 0.0);
      if (cap < 1.0) {
        p.old_log_prob_shift = std::log(cap), p.weight_scale = cap;
        if (o.use_bias_correction_kl) p.kl_mean_scale = cap, c.kl_coef *= cap;
      }
      break;
    }
    default:
      obj.kind = o.importance_sampling_level == importance_sampling_kind::sequence ? objective_kind::gspo
                                                                                   : objective_kind::ppo_clip;
      obj.eps_low = o.epsilon_low, obj.eps_high = o.epsilon_high, obj.delta = o.delta.value_or(0.0);
      if (obj.kind == objective_kind::gspo)
        obj.gspo.seq_gradient = sequence_gradient::through_mean, obj.gspo.seq_log_ratio_max = no_limit;
      break;
  }
  switch (o.loss_type) {
    case L::grpo:
    case L::sapo:
      c.normalizer = {agg_mode::seq_mean_token_mean, local.rows, 1.0};
      break;
    case L::bnpo:
      c.normalizer = {agg_mode::token_mean, std::max(local.tokens, 1.0), 1.0};
      break;
    case L::dr_grpo:
      c.normalizer = {agg_mode::constant, local.rows * *o.max_completion_length, 1.0};
      break;
    default:
      c.normalizer = {agg_mode::token_mean, items, 1.0};
      break;
  }
  return p;
}

}  // namespace presets::liger
ULORL_NAMESPACE_END
