// ulorl/presets/nemo_rl.hpp — NeMo-RL's semantics as named parameter sets, under NeMo-RL's config
// keys (NVIDIA-NeMo/RL 7ea279abfbeb):
//
//   advantages  GRPO (leave-one-out baseline and pool std, eps 1e-6, scaling skipped when the std
//               is 0, mask not applied), GDPO, REINFORCE++ (reinforce_plus_plus.hpp)
//   rollout     truncated_importance_sampling_type tis / icepop / seq-mask-tis, token or sequence
//   correction  level, and its logged metrics with the global normalisers
//   loss        ClippedPGLossFn (PPO / dual clip, force_on_policy_ratio, disable_ppo_ratio, CISPO,
//               GSPO, IS correction, the reference KL with its weight, the positive-example NLL,
//               token or sequence loss), its logged ratios, and the ProRL v2 / v2.1 settings
//
// Parameter sets of the advantage and loss areas (the reference KL is weighted_kl_loss,
// loss/weighted_kl.hpp), never second copies of their algorithms. NeMo-RL normalises by the step's
// global counts (global_counts), so its losses are partition-exact. Mirrored by
// python/ulorl/presets/nemo_rl.py; docs/presets/nemo_rl.md maps NeMo-RL's functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <utility>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/multi_reward.hpp"
#include "ulorl/advantage/reinforce_plus_plus.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/dispatch.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/rollout_correction/compute.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
#include "ulorl/loss/weighted_kl.hpp"
#include "ulorl/presets/detail.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::nemo_rl {

// ---- advantages -----------------------------------------------------------------------------------

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
[[nodiscard]] constexpr reinforce_plus_plus_baseline_config reinforce_plus_plus_advantage(
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

// ---- rollout correction ---------------------------------------------------------------------------

//! ClippedPGLossFn's importance-sampling options.
struct rollout_correction_options {
  std::optional<rollout_correction::is_weighting>
      truncated_importance_sampling_type{};                     //!< tis / icepop / seq-mask-tis; absent: raw weights
  std::optional<double> truncated_importance_sampling_ratio{};  //!< hi
  std::optional<double> truncated_importance_sampling_ratio_min{};  //!< lo
  bool sequence_level_importance_ratios = false;
};

//! NeMo-RL's semantics: w = exp(x) (token) or exp(sum_t x m) (sequence, on the whole row), computed
//! at every position, +inf mapped to 0; tis clamp(w, lo or 0, hi), icepop w [lo <= w <= hi],
//! seq-mask-tis w [lo <= exp(mean_t x m) <= hi] (an empty row's ratio is 1).
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  constexpr std::string_view fn = "presets::nemo_rl::rollout_correction";
  const auto& type = o.truncated_importance_sampling_type;
  const auto& hi = o.truncated_importance_sampling_ratio;
  const auto& lo = o.truncated_importance_sampling_ratio_min;
  config c{.importance = {.level = o.sequence_level_importance_ratios ? is_level::sequence : is_level::token,
                          .weighting = is_weighting::truncate,
                          .lower = 0.0,
                          .upper = unbounded,
                          .log_ratio_clamp = unbounded,
                          .overflow = ratio_overflow::zero,
                          .masked = masked_positions::as_valid,
                          .empty_rows = empty_row_gate::ratio_one}};
  if (!type) {
    if (hi)
      ulorl::detail::fail_value(fn, "truncated_importance_sampling_ratio", *hi,
                                "set without truncated_importance_sampling_type");
    if (lo)
      ulorl::detail::fail_value(fn, "truncated_importance_sampling_ratio_min", *lo,
                                "set without truncated_importance_sampling_type");
  } else {
    require_known(fn, "truncated_importance_sampling_type", *type, is_weighting::truncate, is_weighting::mask,
                  is_weighting::geometric_gate);
    if (!hi)
      ulorl::detail::fail(fn, "truncated_importance_sampling_ratio",
                          "required with truncated_importance_sampling_type");
    require_positive(fn, "truncated_importance_sampling_ratio", *hi);
    if (lo) require_non_negative(fn, "truncated_importance_sampling_ratio_min", *lo);
    if (lo && *lo > *hi)
      ulorl::detail::fail_value(fn, "truncated_importance_sampling_ratio_min", *lo,
                                "exceeds truncated_importance_sampling_ratio");
    if (*type != is_weighting::truncate && !lo)
      ulorl::detail::fail(fn, "truncated_importance_sampling_ratio_min", "required by icepop and seq-mask-tis");
    if (*type == is_weighting::geometric_gate && o.sequence_level_importance_ratios)
      ulorl::detail::fail(fn, "sequence_level_importance_ratios", "seq-mask-tis works on token-level ratios");
    c.importance.weighting = *type, c.importance.upper = *hi, c.importance.lower = lo.value_or(0.0);
  }
  validate(fn, c);
  return c;
}

//! NeMo-RL's global normalisers of a loss call, `global_valid_toks` and `global_valid_seqs` (the
//! step's valid tokens and sequences over every micro-batch and rank); absent: this batch's own.
struct global_counts {
  std::optional<double> global_valid_toks{};  //!< Gt; absent: this batch's N
  std::optional<double> global_valid_seqs{};  //!< Gs; absent: this batch's B
};
//! Each given count is finite and >= 0, and a non-zero one a divisor (require_divisor: 5e-324 is not).
inline void validate(std::string_view fn, const global_counts& g) {
  for (const auto& [name, v] :
       {std::pair<std::string_view, const std::optional<double>*>{"global_valid_toks", &g.global_valid_toks},
        std::pair<std::string_view, const std::optional<double>*>{"global_valid_seqs", &g.global_valid_seqs}})
    if (*v) {
      require_non_negative(fn, name, **v);
      if (**v != 0.0) require_divisor(fn, name, **v);
    }
}

//! NeMo-RL's logged metrics, with its global normalisers (global_counts).
struct rollout_correction_metrics {
  //! Token level: sum w m / Gt; sequence level: S * sum_b w_b / Gs, S = sum_b sample_mask_b (NeMo's
  //! masked mean broadcasts the [B, 1] weights against the [B] sample mask; w_b sums over all B rows).
  double sampling_importance_ratio = 0;
  //! Out-of-bounds fraction: seq-mask-tis rows / Gs, otherwise tokens / Gt (0 without a type).
  double is_oob_ratio = 0;
};
//! `num_valid_samples` is the micro-batch's S = sum_b sample_mask_b (absent: B, every row a sample).
[[nodiscard]] inline rollout_correction_metrics rollout_correction_logged(
    const rollout_correction::metrics& m, const rollout_correction_options& o, const global_counts& g = {},
    std::optional<double> num_valid_samples = std::nullopt) {
  constexpr std::string_view fn = "presets::nemo_rl::rollout_correction_logged";
  validate(fn, g);
  const auto& s = m.totals;
  if (num_valid_samples) {
    require_non_negative(fn, "num_valid_samples", *num_valid_samples);
    if (*num_valid_samples > s.rows)
      ulorl::detail::fail_value(fn, "num_valid_samples", *num_valid_samples, "must not exceed the batch's rows");
  }
  const double gt = g.global_valid_toks.value_or(s.tokens), gs = g.global_valid_seqs.value_or(s.rows);
  auto per = [](double a, double d) { return d > 0 ? a / d : 0.0; };
  rollout_correction_metrics r;
  r.sampling_importance_ratio = o.sequence_level_importance_ratios
                                    ? per(num_valid_samples.value_or(s.rows) * s.unit_sum, gs)
                                    : per(s.weight_sum, gt);
  if (o.truncated_importance_sampling_type)
    r.is_oob_ratio = *o.truncated_importance_sampling_type == rollout_correction::is_weighting::geometric_gate
                         ? per(s.out_of_bounds_rows, gs)
                         : per(s.out_of_bounds_tokens, gt);
  return r;
}

// ---- policy loss ----------------------------------------------------------------------------------

//! The KL options' defaults (calculate_kl's and ClippedPGLossConfig's), written once for kl_options
//! and clipped_pg_loss_options.
namespace defaults {
inline constexpr kl_estimator reference_policy_kl_type = kl_estimator::k3;
inline constexpr double kl_input_clamp_value = 20.0;
inline constexpr double kl_output_clamp_value = 10.0;
}  // namespace defaults

//! `reference_policy_kl_type` k1 / k2 / k3 with optional input and output clamps (absent: none).
struct kl_options {
  kl_estimator reference_policy_kl_type = defaults::reference_policy_kl_type;
  std::optional<double> kl_input_clamp_value = defaults::kl_input_clamp_value;
  std::optional<double> kl_output_clamp_value = defaults::kl_output_clamp_value;
};
//! The names of `reference_policy_kl_type` (parsed by kl_type_from_name, printed by name_in).
inline constexpr presets::detail::name_entry<kl_estimator> reference_policy_kl_type_names[] = {
    {"k1", kl_estimator::k1}, {"k2", kl_estimator::k2}, {"k3", kl_estimator::k3}};
[[nodiscard]] inline kl_estimator kl_type_from_name(std::string_view name) {
  return presets::detail::parse("presets::nemo_rl::kl_type_from_name", "reference_policy_kl_type", name,
                                reference_policy_kl_type_names);
}
//! NeMo-RL's names of `truncated_importance_sampling_type` (rollout_correction::is_weighting_from_name
//! parses them with the other frameworks' names).
inline constexpr presets::detail::name_entry<rollout_correction::is_weighting>
    truncated_importance_sampling_type_names[] = {{"tis", rollout_correction::is_weighting::truncate},
                                                  {"icepop", rollout_correction::is_weighting::mask},
                                                  {"seq-mask-tis", rollout_correction::is_weighting::geometric_gate}};
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  presets::detail::require_estimator("presets::nemo_rl::kl", "reference_policy_kl_type", o.reference_policy_kl_type,
                                     o.reference_policy_kl_type != kl_estimator::abs);
  return {.estimator = o.reference_policy_kl_type,
          .input_clamp = o.kl_input_clamp_value.value_or(no_limit),
          .output_clamp = o.kl_output_clamp_value.value_or(no_limit)};
}

//! ClippedPGLossFn's options, named as NeMo-RL's `loss_fn` config keys, with the defaults of NeMo-RL's
//! ClippedPGLossConfig (reference_policy_kl_penalty 0.01 as in grpo_math_1B.yaml). use_kl_in_reward is
//! the caller's: it sets reference_policy_kl_penalty to 0.
//!
//! One step is composed of the existing pieces (docs/presets/nemo_rl.md):
//!  * w = rollout_correction::apply(rollout_correction(o)) on (prev, rollout_log_prob), prev =
//!    log_prob under force_on_policy_ratio, else old_log_prob; policy_loss weights u = w when
//!    use_importance_sampling_correction;
//!  * actor = policy_loss(objective(o), old_log_prob := prev, normalizer(o, ...)), kl_coef = 0;
//!  * kl = weighted_kl_loss(..., reference_policy_kl(o), normalizer(o, ...)) added to the loss and the
//!    gradient (same normaliser).
struct clipped_pg_loss_options {
  double ratio_clip_min = 0.2;
  double ratio_clip_max = 0.2;
  std::optional<double> ratio_clip_c{};  //!< dual clip (> 1); absent: none
  bool token_level_loss = true;  //!< token-mean over global_valid_toks; false: mean of row means over global_valid_seqs
  bool force_on_policy_ratio = false;  //!< prev := log_prob: ratio 1 with derivative 1
  bool disable_ppo_ratio = false;      //!< ratio := log_prob (REINFORCE); ignored under force_on_policy_ratio
  bool use_importance_sampling_correction = false;
  std::optional<rollout_correction::is_weighting>
      truncated_importance_sampling_type{};  //!< tis / icepop / seq-mask-tis
  std::optional<double> truncated_importance_sampling_ratio{};
  std::optional<double> truncated_importance_sampling_ratio_min{};
  double reference_policy_kl_penalty = 0.01;  //!< beta; 0: no KL term
  kl_estimator reference_policy_kl_type = defaults::reference_policy_kl_type;
  std::optional<double> kl_input_clamp_value = defaults::kl_input_clamp_value;
  std::optional<double> kl_output_clamp_value = defaults::kl_output_clamp_value;
  bool use_on_policy_kl_approximation =
      false;  //!< KL weight exp(logp - rollout_log_prob) instead of exp(logp - sg(logp))
  //! GSPO: the row's ratio exp(mean_t (logp - prev) m) with the gradient through the mean, and the IS
  //! weights per row; needs token_level_loss false. Ignored by the objective under
  //! force_on_policy_ratio or disable_ppo_ratio (NeMo-RL's ratio is then theirs).
  bool sequence_level_importance_ratios = false;
  //! CISPO (MiniMax-M1): -A sg(clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max)) logp; token
  //! level, without a dual clip, disable_ppo_ratio, force_on_policy_ratio or sequence-level ratios.
  bool use_cispo = false;
  //! VAPO: w times the token-mean NLL of the valid tokens of rows with reward > 0 (positive_example_nll); <= 0: none.
  double positive_example_nll_weight = 0.0;
};

//! f(name, field&) for every option, by NeMo-RL's config keys (the Python options and the encoding
//! an operator takes are this table).
template <class C, class F>
  requires ulorl::detail::record_of<C, clipped_pg_loss_options>
constexpr void visit_fields(C& c, F&& f) {
  f("ratio_clip_min", c.ratio_clip_min), f("ratio_clip_max", c.ratio_clip_max), f("ratio_clip_c", c.ratio_clip_c);
  f("token_level_loss", c.token_level_loss), f("force_on_policy_ratio", c.force_on_policy_ratio);
  f("disable_ppo_ratio", c.disable_ppo_ratio);
  f("use_importance_sampling_correction", c.use_importance_sampling_correction);
  f("truncated_importance_sampling_type", c.truncated_importance_sampling_type);
  f("truncated_importance_sampling_ratio", c.truncated_importance_sampling_ratio);
  f("truncated_importance_sampling_ratio_min", c.truncated_importance_sampling_ratio_min);
  f("reference_policy_kl_penalty", c.reference_policy_kl_penalty);
  f("reference_policy_kl_type", c.reference_policy_kl_type), f("kl_input_clamp_value", c.kl_input_clamp_value);
  f("kl_output_clamp_value", c.kl_output_clamp_value);
  f("use_on_policy_kl_approximation", c.use_on_policy_kl_approximation);
  f("sequence_level_importance_ratios", c.sequence_level_importance_ratios), f("use_cispo", c.use_cispo);
  f("positive_example_nll_weight", c.positive_example_nll_weight);
}

//! Throws ulorl::error for what NeMo-RL asserts (a truncation type without
//! use_importance_sampling_correction, ratio_clip_c <= 1), the truncation rules of
//! rollout_correction(), and disable_ppo_ratio with ratio_clip_c (not modelled).
inline void validate(const clipped_pg_loss_options& o) {
  constexpr std::string_view fn = "presets::nemo_rl::validate";
  require_not_nan(fn, "ratio_clip_min", o.ratio_clip_min);
  require_not_nan(fn, "ratio_clip_max", o.ratio_clip_max);
  require_not_nan(fn, "ratio_clip_c", o.ratio_clip_c);
  require_not_nan(fn, "truncated_importance_sampling_ratio", o.truncated_importance_sampling_ratio);
  require_not_nan(fn, "truncated_importance_sampling_ratio_min", o.truncated_importance_sampling_ratio_min);
  require_not_nan(fn, "kl_input_clamp_value", o.kl_input_clamp_value);
  require_not_nan(fn, "kl_output_clamp_value", o.kl_output_clamp_value);
  if (o.ratio_clip_c && !(*o.ratio_clip_c > 1.0 && std::isfinite(*o.ratio_clip_c)))
    ulorl::detail::fail_value(fn, "ratio_clip_c", *o.ratio_clip_c, "must be finite and > 1 (dual clip)");
  if (o.truncated_importance_sampling_type) {
    if (name_in(truncated_importance_sampling_type_names, *o.truncated_importance_sampling_type).empty())
      ulorl::detail::fail_value(fn, "truncated_importance_sampling_type",
                                static_cast<int>(*o.truncated_importance_sampling_type),
                                "is no type NeMo-RL names (tis, icepop, seq-mask-tis)");
    if (!o.use_importance_sampling_correction)
      ulorl::detail::fail(fn, "truncated_importance_sampling_type", "needs use_importance_sampling_correction");
  }
  if (o.sequence_level_importance_ratios && o.token_level_loss)
    ulorl::detail::fail(fn, "sequence_level_importance_ratios", "is exclusive with token_level_loss");
  if (o.use_cispo) {
    if (o.disable_ppo_ratio) ulorl::detail::fail(fn, "disable_ppo_ratio", "is incompatible with use_cispo");
    if (o.force_on_policy_ratio) ulorl::detail::fail(fn, "force_on_policy_ratio", "is incompatible with use_cispo");
    if (o.sequence_level_importance_ratios)
      ulorl::detail::fail(fn, "sequence_level_importance_ratios", "is incompatible with use_cispo");
    if (o.ratio_clip_c)
      ulorl::detail::fail_value(fn, "ratio_clip_c", *o.ratio_clip_c, "is incompatible with use_cispo");
    if (!o.token_level_loss) ulorl::detail::fail(fn, "token_level_loss", "use_cispo requires token_level_loss");
  }
  require_finite(fn, "positive_example_nll_weight", o.positive_example_nll_weight);
  if (o.disable_ppo_ratio && !o.force_on_policy_ratio && o.ratio_clip_c)
    ulorl::detail::fail(fn, "ratio_clip_c", "disable_ppo_ratio with a dual clip is not modelled");
  require_finite(fn, "reference_policy_kl_penalty", o.reference_policy_kl_penalty);
  presets::detail::require_estimator(fn, "reference_policy_kl_type", o.reference_policy_kl_type,
                                     o.reference_policy_kl_type != kl_estimator::abs);
  if (o.kl_input_clamp_value && !(*o.kl_input_clamp_value > 0.0))
    ulorl::detail::fail_value(fn, "kl_input_clamp_value", *o.kl_input_clamp_value, "must be > 0");
  if (o.kl_output_clamp_value && !(*o.kl_output_clamp_value > 0.0))
    ulorl::detail::fail_value(fn, "kl_output_clamp_value", *o.kl_output_clamp_value, "must be > 0");
}

//! The objective of the actor loss: PPO clip (ratio_clip_min / max) on the unclamped ratio, with
//! the dual clip ratio_clip_c when given; policy_gradient (-A logp) under disable_ppo_ratio; cispo
//! with the same bounds under use_cispo; gspo (the row's ratio, unbounded, gradient through the
//! mean) under sequence_level_importance_ratios, unless force_on_policy_ratio or disable_ppo_ratio.
[[nodiscard]] inline objective_config objective(const clipped_pg_loss_options& o) {
  validate(o);
  if (o.disable_ppo_ratio && !o.force_on_policy_ratio)
    return {.kind = objective_kind::policy_gradient, .log_ratio_clamp = no_limit};
  objective_config c{.kind = objective_kind::ppo_clip,
                     .eps_low = o.ratio_clip_min,
                     .eps_high = o.ratio_clip_max,
                     .dual_clip = o.ratio_clip_c.value_or(0.0),
                     .log_ratio_clamp = no_limit};
  if (o.use_cispo) {
    c.kind = objective_kind::cispo;
  } else if (o.sequence_level_importance_ratios && !o.force_on_policy_ratio) {
    c.kind = objective_kind::gspo, c.gspo.seq_log_ratio_max = no_limit,
    c.gspo.seq_gradient = sequence_gradient::through_mean;
  }
  return c;
}

//! The importance weights' configuration (rollout_correction(rollout_correction_options) above), per
//! token or (sequence_level_importance_ratios) per row.
[[nodiscard]] inline rollout_correction::config rollout_correction(const clipped_pg_loss_options& o) {
  validate(o);
  return rollout_correction(
      rollout_correction_options{.truncated_importance_sampling_type = o.truncated_importance_sampling_type,
                                 .truncated_importance_sampling_ratio = o.truncated_importance_sampling_ratio,
                                 .truncated_importance_sampling_ratio_min = o.truncated_importance_sampling_ratio_min,
                                 .sequence_level_importance_ratios = o.sequence_level_importance_ratios});
}

//! VAPO's positive-example NLL term (positive_example_nll_weight w): aggregate logp over the valid
//! tokens of the rows with reward > 0 with the returned normaliser, -w Σ logp / n over their count
//! n. Absent when w <= 0 or n is 0 (no term). Validates `o` first.
[[nodiscard]] inline std::optional<agg_normalizer> positive_example_nll(const clipped_pg_loss_options& o,
                                                                        double positive_tokens) {
  validate(o);
  require_non_negative("presets::nemo_rl::positive_example_nll", "positive_tokens", positive_tokens);
  if (!(o.positive_example_nll_weight > 0.0) || positive_tokens == 0.0) return std::nullopt;
  return agg_normalizer{agg_mode::token_mean, positive_tokens, -o.positive_example_nll_weight};
}

//! The actor's (and the KL's) normaliser: token-mean over g.global_valid_toks (absent: this batch's
//! N) or the mean of row means over g.global_valid_seqs (absent: this batch's B).
[[nodiscard]] inline agg_normalizer normalizer(const clipped_pg_loss_options& o, const global_counts& g,
                                               const batch_counts& local) {
  validate("presets::nemo_rl::normalizer", g);
  if (o.token_level_loss) return {agg_mode::token_mean, g.global_valid_toks.value_or(local.tokens), 1.0};
  return {agg_mode::seq_mean_token_mean, g.global_valid_seqs.value_or(local.rows), 1.0};
}

//! The reference-KL term of ClippedPGLossFn as weighted_kl_loss's configuration (loss/weighted_kl.hpp,
//! whose weight multiplies before the output clamp and whose derivative enters the gradient):
//! β = reference_policy_kl_penalty, the estimator reference_policy_kl_type with the clamps
//! kl_input_clamp_value / kl_output_clamp_value (absent: none), and the weight exp(logp - sg(logp))
//! or, with use_on_policy_kl_approximation, exp(logp - rollout_log_prob). Validates `o` first.
[[nodiscard]] inline weighted_kl_config reference_policy_kl(const clipped_pg_loss_options& o) {
  validate(o);
  return {.coef = o.reference_policy_kl_penalty,
          .estimator = o.reference_policy_kl_type,
          .input_clamp = o.kl_input_clamp_value.value_or(no_limit),
          .output_clamp = o.kl_output_clamp_value.value_or(no_limit),
          .weight = o.use_on_policy_kl_approximation ? kl_importance_weight::rollout_policy
                                                     : kl_importance_weight::current_policy};
}

//! NeMo-RL's logged ratios: probs_ratio = Σ ratio m / Gt and probs_ratio_clamped = Σ r̄ m / Gt, with
//! ratio = exp(logp - prev), r̄ = clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max) (1 and 1 under
//! force_on_policy_ratio; logp and logp under disable_ppo_ratio). `prev` is old_log_prob (ignored
//! under force_on_policy_ratio); Gt = g.global_valid_toks (absent: N). An absent mask (empty view):
//! every token valid.
struct ratio_metrics {
  double probs_ratio = 0, probs_ratio_clamped = 0;
};
//! f(name, field&) for each logged ratio, by NeMo-RL's metric names.
template <class C, class F>
  requires ulorl::detail::record_of<C, ratio_metrics>
constexpr void visit_fields(C& c, F&& f) {
  f("probs_ratio", c.probs_ratio), f("probs_ratio_clamped", c.probs_ratio_clamped);
}
template <class T, class M>
[[nodiscard]] ratio_metrics logged_ratios(token_view<const T> log_prob, token_view<const T> prev,
                                          token_view<const M> mask, const clipped_pg_loss_options& o,
                                          const global_counts& g = {}) {
  constexpr std::string_view fn = "presets::nemo_rl::logged_ratios";
  validate(o);
  validate(fn, g);
  validate_layout(fn, "log_prob", log_prob);
  mask = mask_or_all_valid(mask, log_prob);
  require_same_shape(fn, "old_log_prob", prev, "log_prob", log_prob);
  require_same_shape(fn, "mask", mask, "log_prob", log_prob);
  double n = 0, sr = 0, sc = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
      if (mask(b, t) == M(0)) continue;
      const double lp = static_cast<double>(log_prob(b, t));
      double r = 1.0, rc = 1.0;
      if (!o.force_on_policy_ratio) {
        if (o.disable_ppo_ratio) {
          r = rc = lp;
        } else {
          r = std::exp(lp - static_cast<double>(prev(b, t)));
          rc = std::clamp(r, 1.0 - o.ratio_clip_min, 1.0 + o.ratio_clip_max);
        }
      }
      n += 1, sr += r, sc += rc;
    }
  const double gt = g.global_valid_toks.value_or(n);
  return {gt > 0 ? sr / gt : 0.0, gt > 0 ? sc / gt : 0.0};
}

//! ProRL v2 (NeMo-RL examples/configs/prorlv2.v2.yaml on grpo_math_1B.yaml): clip-higher 0.2 / 0.27,
//! token-level loss, IcePop importance weights in [0.5, 5], k2 reference KL with β = 1e-4 and clamps
//! 20 / 10. Its advantages: advantage presets nemo_rl reinforce_plus_plus with minus_baseline.
[[nodiscard]] inline clipped_pg_loss_options prorl_v2() {
  return {.ratio_clip_min = 0.2,
          .ratio_clip_max = 0.27,
          .ratio_clip_c = std::nullopt,
          .token_level_loss = true,
          .use_importance_sampling_correction = true,
          .truncated_importance_sampling_type = rollout_correction::is_weighting::mask,
          .truncated_importance_sampling_ratio = 5.0,
          .truncated_importance_sampling_ratio_min = 0.5,
          .reference_policy_kl_penalty = 1e-4,
          .reference_policy_kl_type = kl_estimator::k2,
          .kl_input_clamp_value = 20.0,
          .kl_output_clamp_value = 10.0};
}
//! ProRL v2.1 (prorlv2_1_moe.v2.yaml): ProRL v2 with force_on_policy_ratio and seq-mask-tis in
//! [0.999, 1.002].
[[nodiscard]] inline clipped_pg_loss_options prorl_v2_1() {
  clipped_pg_loss_options o = prorl_v2();
  o.force_on_policy_ratio = true;
  o.truncated_importance_sampling_type = rollout_correction::is_weighting::geometric_gate;
  o.truncated_importance_sampling_ratio = 1.002;
  o.truncated_importance_sampling_ratio_min = 0.999;
  return o;
}

}  // namespace presets::nemo_rl

template <>
inline constexpr std::string_view record_name<presets::nemo_rl::clipped_pg_loss_options> =
    "nemo_rl_clipped_pg_loss_options";
template <>
inline constexpr std::string_view record_name<presets::nemo_rl::ratio_metrics> = "nemo_rl_ratio_metrics";
ULORL_NAMESPACE_END
