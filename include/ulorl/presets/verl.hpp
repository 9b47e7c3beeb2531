// ulorl/presets/verl.hpp — verl's semantics as named parameter sets, under verl's option names:
//
//   advantages  compute_grpo_outcome_advantage (unbiased std, eps 1e-6 added to std, singleton
//               s/(1+eps), mask applied; norm_adv_by_std_in_grpo = false is Dr. GRPO), RLOO, GDPO and
//               the optimal token baseline (multi_reward.hpp, optimal_token_baseline.hpp)
//   loss        compute_policy_loss_{vanilla,gspo,cispo,geo_mean,sapo,gpg}, kl_penalty, agg_loss
//               (volcengine/verl b178a3cd56f5; "+" KL names as fixed by PR #6058); dppo_tv, dppo_kl,
//               dro, kl_cov, clip_cov (verl-project/verl 1dda039b) with their token selections
//               (loss/token_selection.hpp)
//   rollout     rollout_corr_helper: rollout_is token / sequence, TIS ("u") or IcePop ("l_u"),
//   correction  rollout_is_batch_normalize, rollout_rs chains (verl-project/verl 1dda039b)
//
// Presets only choose parameters (and, where verl genuinely differs, a named variant such as the
// sequence-ratio gradient); the algorithms are those of the advantage and loss areas. Each preset
// function takes one options struct whose fields carry verl's option names and defaults
// (designated initialisers: `verl::objective({.loss_mode = verl::loss_mode_kind::vanilla,
// .clip_ratio_high = 0.28})`); a string option is an enum here, and `*_from_name` parses verl's
// spelling (for configuration files and bindings) and rejects an unknown one; the parsers of verl's
// string options (rollout_is_threshold "l_u", rollout_rs "a,b" with rollout_rs_threshold "x,y")
// read config files. verl's *local* normaliser (a micro-batch divides by its own counts unless the
// caller passes the global ones) is reproduced for compatibility; it is partition-exact only when the
// global counts are passed. Mirrored by python/ulorl/presets/verl.py; docs/presets/verl.md maps
// verl's functions, docs/losses.md and docs/advantages.md compare every formula.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/multi_reward.hpp"
#include "ulorl/advantage/optimal_token_baseline.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/rollout_correction/compute.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
#include "ulorl/loss/token_selection.hpp"
#include "ulorl/presets/detail.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::verl {

// ---- advantages -----------------------------------------------------------------------------------

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

// ---- policy loss ----------------------------------------------------------------------------------

//! `actor.policy_loss.loss_mode`. dppo_tv, dppo_kl, dro, kl_cov, clip_cov: verl-project/verl 1dda039b.
enum class loss_mode_kind { vanilla, gspo, cispo, geo_mean, sapo, gpg, dppo_tv, dppo_kl, dro, kl_cov, clip_cov };
[[nodiscard]] inline loss_mode_kind loss_mode_from_name(std::string_view name) {
  static constexpr presets::detail::name_entry<loss_mode_kind> table[] = {
      {"vanilla", loss_mode_kind::vanilla},   {"gspo", loss_mode_kind::gspo},        {"cispo", loss_mode_kind::cispo},
      {"geo_mean", loss_mode_kind::geo_mean}, {"sapo", loss_mode_kind::sapo},        {"gpg", loss_mode_kind::gpg},
      {"dppo_tv", loss_mode_kind::dppo_tv},   {"dppo_kl", loss_mode_kind::dppo_kl},  {"dro", loss_mode_kind::dro},
      {"kl_cov", loss_mode_kind::kl_cov},     {"clip_cov", loss_mode_kind::clip_cov}};
  return presets::detail::parse("presets::verl::loss_mode_from_name", "loss_mode", name, table);
}
namespace detail {
inline void require_loss_mode(std::string_view fn, loss_mode_kind m) {
  require_known(fn, "loss_mode", m, loss_mode_kind::vanilla, loss_mode_kind::gspo, loss_mode_kind::cispo,
                loss_mode_kind::geo_mean, loss_mode_kind::sapo, loss_mode_kind::gpg, loss_mode_kind::dppo_tv,
                loss_mode_kind::dppo_kl, loss_mode_kind::dro, loss_mode_kind::kl_cov, loss_mode_kind::clip_cov);
}
}  // namespace detail

//! The policy-loss options of verl's actor config (defaults: verl's).
struct objective_options {
  loss_mode_kind loss_mode = loss_mode_kind::vanilla;
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;  //!< dual clip (vanilla; must be > 1); dppo_*: the cap of the detached ratio (> 0)
  double tau_pos = sapo_parameters{}.tau_pos;  //!< sapo
  double tau_neg = sapo_parameters{}.tau_neg;  //!< sapo
  std::optional<double> dro_beta{};            //!< dro: beta of the x^2 / 2 penalty (required, > 0)
  double kl_cov_ratio = 0.0002;                //!< kl_cov: fraction of the valid tokens penalised (> 0)
  double ppo_kl_coef = 0.1;                    //!< kl_cov: coefficient of |x| on the selected tokens (>= 0)
  double clip_cov_ratio = 0.0002;  //!< clip_cov: fraction of the valid tokens whose gradient is dropped (> 0)
  double clip_cov_lb = 1.0;        //!< clip_cov: candidates have clip_cov_lb < cov < clip_cov_ub
  double clip_cov_ub = 5.0;
};

//! vanilla (PPO clip-higher + dual clip c), gspo, cispo, geo_mean, sapo, gpg. Ratios clamp log r to
//! +-20 (gspo: sequence log-ratio <= 10, own-token gradient). The 1dda039b modes:
//!  * dppo_tv, dppo_kl: policy_gradient; the detached factor min(r, c) v and the rollout weights
//!    are the `weights` input that dppo_weights(dppo(o)) writes;
//!  * dro: penalized_pg with g = logp, c_sq = dro_beta (no log-ratio clamp);
//!  * kl_cov: penalized_pg with g = r (no clamp) and c_abs = ppo_kl_coef: the objective of the tokens
//!    kl_cov_selection(kl_cov(o)) selects; the others take the same objective with abs_penalty = 0;
//!  * clip_cov: ppo_clip without dual clip or clamp; clip_cov_weights(clip_cov(o)) writes w (1 - selection).
[[nodiscard]] inline objective_config objective(const objective_options& o) {
  constexpr const char* fn = "presets::verl::objective";
  detail::require_loss_mode(fn, o.loss_mode);
  require_not_nan(fn, "clip_ratio_low", o.clip_ratio_low);
  require_not_nan(fn, "clip_ratio_high", o.clip_ratio_high);
  require_not_nan(fn, "clip_ratio_c", o.clip_ratio_c);
  require_not_nan(fn, "tau_pos", o.tau_pos);
  require_not_nan(fn, "tau_neg", o.tau_neg);
  require_not_nan(fn, "dro_beta", o.dro_beta);
  require_not_nan(fn, "kl_cov_ratio", o.kl_cov_ratio);
  require_not_nan(fn, "ppo_kl_coef", o.ppo_kl_coef);
  require_not_nan(fn, "clip_cov_ratio", o.clip_cov_ratio);
  require_not_nan(fn, "clip_cov_lb", o.clip_cov_lb);
  require_not_nan(fn, "clip_cov_ub", o.clip_cov_ub);
  objective_config c{.eps_low = o.clip_ratio_low, .eps_high = o.clip_ratio_high, .log_ratio_clamp = 20.0};
  switch (o.loss_mode) {
    case loss_mode_kind::vanilla:
      if (!(o.clip_ratio_c > 1.0))
        ulorl::detail::fail_value(fn, "clip_ratio_c", o.clip_ratio_c, "must be > 1 (dual clip)");
      c.kind = objective_kind::ppo_clip, c.dual_clip = o.clip_ratio_c;
      break;
    case loss_mode_kind::gspo:
      c.kind = objective_kind::gspo, c.gspo.seq_log_ratio_max = 10.0,
      c.gspo.seq_gradient = sequence_gradient::own_token;
      break;
    case loss_mode_kind::cispo:
      c.kind = objective_kind::cispo;
      break;
    case loss_mode_kind::geo_mean:
      c.kind = objective_kind::gmpo;
      break;
    case loss_mode_kind::sapo:
      c.kind = objective_kind::sapo, c.sapo.tau_pos = o.tau_pos, c.sapo.tau_neg = o.tau_neg;
      break;
    case loss_mode_kind::gpg:
      c.kind = objective_kind::policy_gradient;
      break;
    case loss_mode_kind::dppo_tv:
    case loss_mode_kind::dppo_kl:
      if (!(o.clip_ratio_c > 0.0 && std::isfinite(o.clip_ratio_c)))
        ulorl::detail::fail_value(fn, "clip_ratio_c", o.clip_ratio_c,
                                  "must be finite and > 0 (the cap of the detached ratio)");
      c.kind = objective_kind::policy_gradient;
      break;
    case loss_mode_kind::dro:
      if (!o.dro_beta) ulorl::detail::fail(fn, "dro_beta", "dro needs dro_beta (> 0)");
      if (!(*o.dro_beta > 0.0 && std::isfinite(*o.dro_beta)))
        ulorl::detail::fail_value(fn, "dro_beta", *o.dro_beta, "must be finite and > 0");
      c.kind = objective_kind::penalized_pg, c.penalized_pg.surrogate = pg_surrogate::log_prob,
      c.penalized_pg.square_penalty = *o.dro_beta;
      c.log_ratio_clamp = no_limit;
      break;
    case loss_mode_kind::kl_cov:
      if (!(o.kl_cov_ratio > 0.0 && std::isfinite(o.kl_cov_ratio)))
        ulorl::detail::fail_value(fn, "kl_cov_ratio", o.kl_cov_ratio, "must be finite and > 0");
      if (!(o.ppo_kl_coef >= 0.0 && std::isfinite(o.ppo_kl_coef)))
        ulorl::detail::fail_value(fn, "ppo_kl_coef", o.ppo_kl_coef, "must be finite and >= 0");
      c.kind = objective_kind::penalized_pg, c.penalized_pg.surrogate = pg_surrogate::ratio,
      c.penalized_pg.abs_penalty = o.ppo_kl_coef;
      c.log_ratio_clamp = no_limit;
      break;
    case loss_mode_kind::clip_cov:
      if (!(o.clip_cov_ratio > 0.0 && std::isfinite(o.clip_cov_ratio)))
        ulorl::detail::fail_value(fn, "clip_cov_ratio", o.clip_cov_ratio, "must be finite and > 0");
      if (!std::isfinite(o.clip_cov_lb)) ulorl::detail::fail_value(fn, "clip_cov_lb", o.clip_cov_lb, "must be finite");
      if (!std::isfinite(o.clip_cov_ub)) ulorl::detail::fail_value(fn, "clip_cov_ub", o.clip_cov_ub, "must be finite");
      c.kind = objective_kind::ppo_clip, c.log_ratio_clamp = no_limit;
      break;
  }
  return c;
}

//! `kl_penalty`: k1 ("kl"), abs, k2 ("mse"), k3 ("low_var_kl": clamps |ref - logp| <= 20,
//! |kl| <= 10); `straight_through` (a trailing "+" in verl's name) keeps the value and uses the
//! straight-through k2 gradient.
struct kl_options {
  kl_estimator kl_penalty = kl_estimator::k1;
  bool straight_through = false;
};
[[nodiscard]] inline kl_options kl_penalty_from_name(std::string_view name) {
  static constexpr presets::detail::name_entry<kl_estimator> table[] = {
      {"kl", kl_estimator::k1}, {"k1", kl_estimator::k1},         {"abs", kl_estimator::abs}, {"mse", kl_estimator::k2},
      {"k2", kl_estimator::k2}, {"low_var_kl", kl_estimator::k3}, {"k3", kl_estimator::k3}};
  std::string_view base = name;
  const bool plus = !base.empty() && base.back() == '+';
  if (plus) base.remove_suffix(1);
  if (plus && base.empty()) base = name;  // "+" alone: reported as the name given
  return {.kl_penalty = presets::detail::parse("presets::verl::kl_penalty_from_name", "kl_penalty", base, table),
          .straight_through = plus};
}
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  presets::detail::require_estimator("presets::verl::kl", "kl_penalty", o.kl_penalty, true);
  kl_config c{.estimator = o.kl_penalty, .straight_through = o.straight_through};
  if (o.kl_penalty == kl_estimator::k3) c.input_clamp = 20.0, c.output_clamp = 10.0;
  return c;
}

//! `loss_agg_mode` names; verl's "token-sum" (the masked sum times dp_size) is agg_mode::constant
//! with the constant 1.
[[nodiscard]] inline agg_mode loss_agg_mode_from_name(std::string_view name) {
  static constexpr presets::detail::name_entry<agg_mode> table[] = {
      {"token-mean", agg_mode::token_mean},
      {"token-sum", agg_mode::constant},
      {"seq-mean-token-sum", agg_mode::seq_mean_token_sum},
      {"seq-mean-token-mean", agg_mode::seq_mean_token_mean},
      {"seq-mean-token-sum-norm", agg_mode::seq_mean_token_sum_norm}};
  return presets::detail::parse("presets::verl::loss_agg_mode_from_name", "loss_agg_mode", name, table);
}

//! verl `agg_loss`'s options. Absent optionals take this batch's own counts (verl's local default).
struct normalizer_options {
  agg_mode loss_agg_mode = agg_mode::token_mean;
  double dp_size = 1.0;
  std::optional<double> batch_num_tokens{};   //!< token-mean; absent: this batch's N
  std::optional<double> global_batch_size{};  //!< seq modes; absent: this batch's non-empty rows
  std::optional<double> loss_scale_factor{};  //!< seq-mean-token-sum-norm; absent: `padded_length`
  std::size_t padded_length = 0;              //!< T of the padded batch
  //! seq-mean-token-sum-norm: true (verl 1dda039b) divides the sequence sum by global_batch_size
  //! times loss_scale_factor and multiplies by dp_size; false (verl b178a3cd) divides by
  //! loss_scale_factor alone.
  bool sum_norm_per_sequence = true;
};

//! verl `agg_loss`'s normaliser: token-mean divides by `batch_num_tokens`, the seq modes by
//! `global_batch_size`, all times `dp_size`; seq-mean-token-sum-norm by `global_batch_size` times
//! `loss_scale_factor` (see sum_norm_per_sequence); token-sum (constant) by 1, times `dp_size`.
[[nodiscard]] inline agg_normalizer normalizer(const normalizer_options& o, const batch_counts& local) {
  require_known("presets::verl::normalizer", "loss_agg_mode", o.loss_agg_mode, agg_mode::token_mean,
                agg_mode::seq_mean_token_sum, agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum_norm,
                agg_mode::constant);
  require_not_nan("presets::verl::normalizer", "dp_size", o.dp_size);
  require_not_nan("presets::verl::normalizer", "batch_num_tokens", o.batch_num_tokens);
  require_not_nan("presets::verl::normalizer", "global_batch_size", o.global_batch_size);
  require_not_nan("presets::verl::normalizer", "loss_scale_factor", o.loss_scale_factor);
  switch (o.loss_agg_mode) {
    case agg_mode::token_mean:
      return {o.loss_agg_mode, o.batch_num_tokens.value_or(local.tokens), o.dp_size};
    case agg_mode::seq_mean_token_sum:
    case agg_mode::seq_mean_token_mean:
      return {o.loss_agg_mode, o.global_batch_size.value_or(local.sequences), o.dp_size};
    case agg_mode::seq_mean_token_sum_norm: {
      const double horizon = o.loss_scale_factor.value_or(static_cast<double>(o.padded_length));
      if (!o.sum_norm_per_sequence) return {o.loss_agg_mode, horizon, 1.0};
      return {o.loss_agg_mode, o.global_batch_size.value_or(local.sequences) * horizon, o.dp_size};
    }
    case agg_mode::constant:
      return {o.loss_agg_mode, 1.0, o.dp_size};
  }
  return {};
}

//! The normaliser a `loss_mode` actually uses: gspo and sapo force seq-mean-token-mean; geo_mean
//! averages its per-sequence losses over the batch's rows and ignores every agg option.
[[nodiscard]] inline agg_normalizer policy_normalizer(loss_mode_kind loss_mode, normalizer_options o,
                                                      const batch_counts& local) {
  detail::require_loss_mode("presets::verl::policy_normalizer", loss_mode);
  if (loss_mode == loss_mode_kind::geo_mean) return {agg_mode::seq_mean_token_sum, local.rows, 1.0};
  if (loss_mode == loss_mode_kind::gspo || loss_mode == loss_mode_kind::sapo)
    o.loss_agg_mode = agg_mode::seq_mean_token_mean;
  return normalizer(o, local);
}

//! verl's metrics of a loss mode: pg_clipfrac, ppo_kl, pg_clipfrac_lower.
struct policy_metrics {
  double pg_clipfrac, ppo_kl, pg_clipfrac_lower;
};
//! `stats`: what dppo_weights / kl_cov_selection / clip_cov_weights (loss/token_selection.hpp) returned
//! for dppo_*, kl_cov and clip_cov (the other modes ignore it).
[[nodiscard]] inline policy_metrics metrics(loss_mode_kind loss_mode, const loss_metrics& m,
                                            const token_selection_stats& stats = {}) {
  detail::require_loss_mode("presets::verl::metrics", loss_mode);
  switch (loss_mode) {
    case loss_mode_kind::dppo_tv:
    case loss_mode_kind::dppo_kl:
      return {stats.dropped_fraction, m.approx_kl_k1_clamped(), stats.capped_fraction};
    case loss_mode_kind::dro:
      return {0.0, m.approx_kl_k1(), 0.0};
    case loss_mode_kind::kl_cov:
      return {0.0, stats.mean_abs_log_ratio, 0.0};
    case loss_mode_kind::clip_cov:
      return {stats.dropped_fraction, m.approx_kl_k1(), 0.0};
    case loss_mode_kind::vanilla:
      return {m.clip_fraction(), m.approx_kl_k1_clamped(), m.dual_clip_fraction()};
    case loss_mode_kind::gspo:
      return {m.clip_fraction(), m.approx_kl_k1(), 0.0};
    case loss_mode_kind::cispo:
      return {m.clip_fraction(), m.approx_kl_k1_clamped(), 0.0};
    case loss_mode_kind::geo_mean:
      return {m.clip_high_fraction(), m.approx_kl_k1(), m.clip_low_fraction()};
    case loss_mode_kind::sapo:
    case loss_mode_kind::gpg:
      return {0.0, m.approx_kl_k1_clamped(), 0.0};
  }
  return {};
}

// ---- the token selections of dppo_*, kl_cov and clip_cov ------------------------------------------
// dppo_weights, kl_cov_selection and clip_cov_weights (loss/token_selection.hpp) write the weight or
// the selection that policy_loss reads; these map verl's options to their configurations, checking
// the options under verl's names first.

namespace detail {
//! `o` is valid for objective() and its loss_mode is `a` or `b`.
inline void require_mode(std::string_view fn, const objective_options& o, loss_mode_kind a, loss_mode_kind b,
                         std::string_view what) {
  require_loss_mode(fn, o.loss_mode);
  if (o.loss_mode != a && o.loss_mode != b)
    ulorl::detail::fail_value(fn, "loss_mode", static_cast<int>(o.loss_mode), what);
  (void)objective(o);
}
}  // namespace detail

//! dppo_tv / dppo_kl (DPPO Binary-TV / Binary-KL): the trust region of dppo_weights, δl, δh =
//! clip_ratio_low / high (finite, >= 0) and the ratio cap c = clip_ratio_c.
[[nodiscard]] inline dppo_config dppo(const objective_options& o) {
  constexpr std::string_view fn = "presets::verl::dppo";
  detail::require_mode(fn, o, loss_mode_kind::dppo_tv, loss_mode_kind::dppo_kl, "must be dppo_tv or dppo_kl");
  if (!(o.clip_ratio_low >= 0.0 && std::isfinite(o.clip_ratio_low)))
    ulorl::detail::fail_value(fn, "clip_ratio_low", o.clip_ratio_low,
                              "must be finite and >= 0 (a divergence threshold)");
  if (!(o.clip_ratio_high >= 0.0 && std::isfinite(o.clip_ratio_high)))
    ulorl::detail::fail_value(fn, "clip_ratio_high", o.clip_ratio_high,
                              "must be finite and >= 0 (a divergence threshold)");
  return {.divergence =
              o.loss_mode == loss_mode_kind::dppo_tv ? dppo_divergence::total_variation : dppo_divergence::binary_kl,
          .delta_low = o.clip_ratio_low,
          .delta_high = o.clip_ratio_high,
          .ratio_cap = o.clip_ratio_c};
}

//! kl_cov: kl_cov_selection's fraction, kl_cov_ratio. The selected tokens take objective(o), the
//! others the same objective with abs_penalty = 0 (one normaliser).
[[nodiscard]] inline kl_cov_config kl_cov(const objective_options& o) {
  detail::require_mode("presets::verl::kl_cov", o, loss_mode_kind::kl_cov, loss_mode_kind::kl_cov, "must be kl_cov");
  return {.fraction = o.kl_cov_ratio};
}

//! clip_cov: clip_cov_weights' candidates (the clip band clip_ratio_low / high, clip_cov_lb < cov <
//! clip_cov_ub) and share clip_cov_ratio; verl draws the selection with torch.randperm among them.
[[nodiscard]] inline clip_cov_config clip_cov(const objective_options& o) {
  detail::require_mode("presets::verl::clip_cov", o, loss_mode_kind::clip_cov, loss_mode_kind::clip_cov,
                       "must be clip_cov");
  return {.eps_low = o.clip_ratio_low,
          .eps_high = o.clip_ratio_high,
          .fraction = o.clip_cov_ratio,
          .cov_lower = o.clip_cov_lb,
          .cov_upper = o.clip_cov_ub};
}

// ---- rollout correction ---------------------------------------------------------------------------

//! `rollout_is_threshold`: an upper bound u (TIS), or bounds lower_upper (IcePop).
struct is_threshold {
  double upper = 2.0;
  std::optional<double> lower{};
};

//! verl's `rollout_is_threshold` string: "u" or "l_u"; rejected: empty or unparsable text, u <= 0,
//! l <= 0, l > u.
[[nodiscard]] inline is_threshold parse_rollout_is_threshold(std::string_view text) {
  constexpr std::string_view fn = "presets::verl::parse_rollout_is_threshold", arg = "rollout_is_threshold";
  const auto parts = presets::detail::split(text, '_');
  if (parts.size() > 2) ulorl::detail::fail(fn, arg, "'" + std::string(text) + "' is neither \"u\" nor \"l_u\"");
  std::array<double, 2> v{};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto x = presets::detail::number(parts[i]);
    if (!x) ulorl::detail::fail(fn, arg, "'" + std::string(text) + "' is not a number nor \"l_u\"");
    v[i] = *x;
  }
  is_threshold th;
  if (parts.size() == 2)
    th.lower = v[0], th.upper = v[1];
  else
    th.upper = v[0];
  if (!(th.upper > 0)) ulorl::detail::fail_value(fn, arg, th.upper, "the upper bound must be > 0");
  if (th.lower && !(*th.lower > 0)) ulorl::detail::fail_value(fn, arg, *th.lower, "the lower bound must be > 0");
  if (th.lower && *th.lower > th.upper)
    ulorl::detail::fail_value(fn, arg, *th.lower, "the lower bound exceeds the upper bound");
  return th;
}

//! verl's `rollout_rs` options ("token_k1, seq_mean_k3": split on ',', whitespace stripped, empty
//! items and repeats dropped, the first kept) with `rollout_rs_threshold` (one value for every
//! option or one per option, comma-separated; k1 options take "l_u" or "u" meaning l = 1/u, the
//! others one u > 0).
[[nodiscard]] inline rollout_correction::rejection_chain parse_rollout_rs(
    std::string_view rollout_rs, std::optional<std::string_view> rollout_rs_threshold) {
  constexpr std::string_view fn = "presets::verl::parse_rollout_rs";
  static constexpr std::array<std::string_view, 11> known = {"token_k1",    "token_k2",   "token_k3",    "seq_sum_k1",
                                                             "seq_sum_k2",  "seq_sum_k3", "seq_mean_k1", "seq_mean_k2",
                                                             "seq_mean_k3", "seq_max_k2", "seq_max_k3"};
  std::vector<std::string_view> names;
  for (auto item : presets::detail::split(rollout_rs, ',')) {
    item = presets::detail::strip(item);
    if (item.empty()) continue;
    bool is_known = false;
    for (auto k : known) is_known = is_known || k == item;
    if (!is_known) {
      std::string what = "unknown option '" + std::string(item) + "' (known:";
      const char* sep = " ";
      for (auto k : known) what += sep + std::string(k), sep = ", ";
      ulorl::detail::fail(fn, "rollout_rs", what + ")");
    }
    bool repeat = false;
    for (auto n : names) repeat = repeat || n == item;
    if (!repeat) names.push_back(item);
  }
  if (names.empty()) ulorl::detail::fail(fn, "rollout_rs", "no option in '" + std::string(rollout_rs) + "'");
  if (!rollout_rs_threshold) ulorl::detail::fail(fn, "rollout_rs_threshold", "required with rollout_rs");
  auto values = presets::detail::split(*rollout_rs_threshold, ',');
  if (values.size() != 1 && values.size() != names.size())
    ulorl::detail::fail(
        fn, "rollout_rs_threshold",
        std::to_string(values.size()) + " thresholds for " + std::to_string(names.size()) + " rollout_rs options");
  rollout_correction::rejection_chain chain;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string_view name = names[i], text = values.size() == 1 ? values[0] : values[i];
    const std::size_t cut = name.rfind('_');
    rollout_correction::rejection_criterion c{
        .statistic = rollout_correction::rs_statistic_from_name(name.substr(0, cut), "rollout_rs"),
        .estimator = rollout_correction::rs_estimator_from_name(name.substr(cut + 1), "rollout_rs")};
    const auto parts = presets::detail::split(text, '_');
    auto bad = [&](const std::string& why) {
      ulorl::detail::fail(fn, "rollout_rs_threshold",
                          "'" + std::string(text) + "' for " + std::string(name) + ": " + why);
    };
    if (c.estimator == rollout_correction::rs_estimator::k1) {
      if (parts.size() > 2) bad("k1 takes \"l_u\" or \"u\"");
      const auto a = presets::detail::number(parts[0]);
      const auto u = presets::detail::number(parts.back());
      if (!a || !u) bad("not a number");
      c.upper = *u;
      c.lower = parts.size() == 2 ? *a : 1.0 / *u;
      if (!(c.lower > 0 && c.lower <= c.upper) || !std::isfinite(c.lower)) bad("needs 0 < lower <= upper");
    } else {
      if (parts.size() != 1) bad("takes a single upper bound");
      const auto u = presets::detail::number(parts[0]);
      if (!u) bad("not a number");
      if (!(*u > 0)) bad("the upper bound must be > 0");
      c.upper = *u;
    }
    chain.push_back(c);
  }
  return chain;
}
//! The same with a numeric `rollout_rs_threshold` (verl reads its Python str).
[[nodiscard]] inline rollout_correction::rejection_chain parse_rollout_rs(std::string_view rollout_rs,
                                                                          double rollout_rs_threshold) {
  const std::string text = presets::detail::text_of(rollout_rs_threshold);
  return parse_rollout_rs(rollout_rs, std::optional<std::string_view>(text));
}

//! verl `algorithm.rollout_correction` options. `rollout_is` none (null) disables the weights, as
//! does a null threshold.
struct rollout_correction_options {
  rollout_correction::is_level rollout_is = rollout_correction::is_level::none;
  std::optional<is_threshold> rollout_is_threshold = is_threshold{};
  bool rollout_is_batch_normalize = false;
  rollout_correction::rejection_chain rollout_rs{};  //!< empty: no rejection sampling
};

//! verl's semantics: log-ratios clamped to +-20 (after the sum at sequence level), TIS without a
//! lower bound or IcePop, 0 at masked positions, RS estimators on the clamped log-ratio; an empty
//! batch and an all-zero weight batch (its ESS metric is 1/0) are rejected.
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  constexpr std::string_view fn = "presets::verl::rollout_correction";
  require_known(fn, "rollout_is", o.rollout_is, is_level::none, is_level::token, is_level::sequence);
  config c{.importance = {.level = o.rollout_is_threshold ? o.rollout_is : is_level::none,
                          .log_ratio_clamp = 20.0,
                          .overflow = ratio_overflow::infinity,
                          .masked = masked_positions::zero,
                          .batch_normalize = o.rollout_is_batch_normalize},
           .rejection = {.chain = o.rollout_rs, .log_ratio_clamp = 20.0},
           .diagnostic_log_ratio_clamp = 20.0,
           .reject_empty_batch = true,
           .require_effective_sample_size = true};
  if (c.importance.level != is_level::none) {
    const auto& th = *o.rollout_is_threshold;
    if (!(th.upper > 0) || !std::isfinite(th.upper))
      ulorl::detail::fail_value(fn, "rollout_is_threshold", th.upper, "the upper bound must be finite and > 0");
    if (th.lower) {
      if (!(*th.lower > 0))
        ulorl::detail::fail_value(fn, "rollout_is_threshold", *th.lower, "the lower bound must be > 0");
      if (*th.lower > th.upper)
        ulorl::detail::fail_value(fn, "rollout_is_threshold", *th.lower, "the lower bound exceeds the upper bound");
      c.importance.weighting = is_weighting::mask, c.importance.lower = *th.lower;
    } else {
      c.importance.weighting = is_weighting::truncate, c.importance.lower = 0.0;
    }
    c.importance.upper = th.upper;
  }
  validate(fn, c);
  return c;
}

}  // namespace presets::verl
ULORL_NAMESPACE_END
