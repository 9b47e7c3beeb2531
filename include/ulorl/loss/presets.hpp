// ulorl/loss/presets.hpp — the frameworks' policy-loss semantics as named parameter sets.
//
//   verl      compute_policy_loss_{vanilla,gspo,cispo,geo_mean,sapo,gpg}, kl_penalty, agg_loss
//             (volcengine/verl b178a3cd56f5; "+" KL names as fixed by PR #6058); dppo_tv, dppo_kl,
//             dro, kl_cov, clip_cov (verl-project/verl 1dda039b) with their batch passes
//             (dppo_weights, kl_cov_selection, clip_cov_weights)
//   openrlhf  PolicyLoss (ppo / gspo, dual clip, vLLM IS correction), compute_approx_kl,
//             token/sequence-level loss (OpenRLHF 3c3be6234e0c)
//   nemo_rl   ClippedPGLossFn (PPO / dual clip, force_on_policy_ratio, disable_ppo_ratio, IS
//             correction, the reference KL with its weight, token or sequence loss) and the
//             ProRL v2 / v2.1 settings (NVIDIA-NeMo/RL 7ea279abfbeb)
//   trl       GRPOTrainer._compute_loss: loss_type grpo / bnpo / dr_grpo / dapo / cispo / sapo /
//             luspo / vespo, epsilon(_high), delta, beta, importance_sampling_level (token /
//             sequence / sequence_token), use_bias_correction_kl, the entropy bonus's normaliser
//             (TRL f2cd57710ae3; docs/losses.md §13)
//
// Presets only choose parameters (and, where a framework genuinely differs, a named variant such
// as the sequence-ratio gradient); the algorithms are those of objectives.hpp, kl.hpp and
// aggregation.hpp. Each preset function takes one options struct whose fields carry the
// framework's option names and defaults (designated initialisers:
// `verl::objective({.loss_mode = verl::loss_mode_kind::vanilla, .clip_ratio_high = 0.28})`); a
// framework's string option is an enum here, and `*_from_name` parses the framework's spelling
// (for configuration files and bindings) and rejects an unknown one. The frameworks' *local* normalisers (a micro-batch divides by its own counts
// unless the caller passes the global ones) are reproduced here for compatibility; they are
// partition-exact only when the global counts are passed. docs/losses.md compares every formula.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/rollout_correction/presets.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets {

namespace detail_presets {
template <class E>
struct name_entry {
  std::string_view name;
  E value;
};
//! The value of `name` in `table`; an unknown name throws ulorl::error listing the known ones.
template <class E, std::size_t N>
[[nodiscard]] E parse(std::string_view fn, std::string_view arg, std::string_view name, const name_entry<E> (&table)[N]) {
  return value_of_name(fn, arg, name, table);
}
//! The subset of KL estimators a framework offers.
inline void require_estimator(std::string_view fn, std::string_view arg, kl_estimator e, bool offered) {
  require_known(fn, arg, e, kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3);
  if (!offered) detail::fail_value(fn, arg, static_cast<int>(e), "this framework does not offer that estimator");
}
}  // namespace detail_presets

// ---- verl -----------------------------------------------------------------------------------------
namespace verl {

//! `actor.policy_loss.loss_mode`. dppo_tv, dppo_kl, dro, kl_cov, clip_cov: verl-project/verl 1dda039b.
enum class loss_mode_kind { vanilla, gspo, cispo, geo_mean, sapo, gpg, dppo_tv, dppo_kl, dro, kl_cov, clip_cov };
[[nodiscard]] inline loss_mode_kind loss_mode_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<loss_mode_kind> table[] = {
      {"vanilla", loss_mode_kind::vanilla}, {"gspo", loss_mode_kind::gspo},       {"cispo", loss_mode_kind::cispo},
      {"geo_mean", loss_mode_kind::geo_mean}, {"sapo", loss_mode_kind::sapo},     {"gpg", loss_mode_kind::gpg},
      {"dppo_tv", loss_mode_kind::dppo_tv}, {"dppo_kl", loss_mode_kind::dppo_kl}, {"dro", loss_mode_kind::dro},
      {"kl_cov", loss_mode_kind::kl_cov},   {"clip_cov", loss_mode_kind::clip_cov}};
  return detail_presets::parse("presets::verl::loss_mode_from_name", "loss_mode", name, table);
}
namespace detail_verl {
inline void require_loss_mode(std::string_view fn, loss_mode_kind m) {
  require_known(fn, "loss_mode", m, loss_mode_kind::vanilla, loss_mode_kind::gspo, loss_mode_kind::cispo,
                loss_mode_kind::geo_mean, loss_mode_kind::sapo, loss_mode_kind::gpg, loss_mode_kind::dppo_tv,
                loss_mode_kind::dppo_kl, loss_mode_kind::dro, loss_mode_kind::kl_cov, loss_mode_kind::clip_cov);
}
}  // namespace detail_verl

//! The policy-loss options of verl's actor config (defaults: verl's).
struct objective_options {
  loss_mode_kind loss_mode = loss_mode_kind::vanilla;
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;  //!< dual clip (vanilla; must be > 1); dppo_*: the cap of the detached ratio (> 0)
  double tau_pos = 1.0;       //!< sapo
  double tau_neg = 1.05;      //!< sapo
  std::optional<double> dro_beta{};  //!< dro: beta of the x^2 / 2 penalty (required, > 0)
  double kl_cov_ratio = 0.0002;      //!< kl_cov: fraction of the valid tokens penalised (> 0)
  double ppo_kl_coef = 0.1;          //!< kl_cov: coefficient of |x| on the selected tokens (>= 0)
  double clip_cov_ratio = 0.0002;    //!< clip_cov: fraction of the valid tokens whose gradient is dropped (> 0)
  double clip_cov_lb = 1.0;          //!< clip_cov: candidates have clip_cov_lb < cov < clip_cov_ub
  double clip_cov_ub = 5.0;
};

//! vanilla (PPO clip-higher + dual clip c), gspo, cispo, geo_mean, sapo, gpg. Ratios clamp log r to
//! +-20 (gspo: sequence log-ratio <= 10, own-token gradient). The 1dda039b modes:
//!  * dppo_tv, dppo_kl: policy_gradient; the detached factor min(r, c) v and the rollout weights
//!    are the `weights` input that dppo_weights() writes;
//!  * dro: penalized_pg with g = logp, c_sq = dro_beta (no log-ratio clamp);
//!  * kl_cov: penalized_pg with g = r (no clamp) and c_abs = ppo_kl_coef: the objective of the tokens
//!    kl_cov_selection() selects; the others take the same objective with abs_penalty = 0;
//!  * clip_cov: ppo_clip without dual clip or clamp; clip_cov_weights() writes w (1 - selection).
[[nodiscard]] inline objective_config objective(const objective_options& o) {
  constexpr const char* fn = "presets::verl::objective";
  detail_verl::require_loss_mode(fn, o.loss_mode);
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
      if (!(o.clip_ratio_c > 1.0)) detail::fail_value(fn, "clip_ratio_c", o.clip_ratio_c, "must be > 1 (dual clip)");
      c.kind = objective_kind::ppo_clip, c.dual_clip = o.clip_ratio_c;
      break;
    case loss_mode_kind::gspo:
      c.kind = objective_kind::gspo, c.seq_log_ratio_max = 10.0, c.seq_gradient = sequence_gradient::own_token;
      break;
    case loss_mode_kind::cispo: c.kind = objective_kind::cispo; break;
    case loss_mode_kind::geo_mean: c.kind = objective_kind::gmpo; break;
    case loss_mode_kind::sapo: c.kind = objective_kind::sapo, c.tau_pos = o.tau_pos, c.tau_neg = o.tau_neg; break;
    case loss_mode_kind::gpg: c.kind = objective_kind::policy_gradient; break;
    case loss_mode_kind::dppo_tv:
    case loss_mode_kind::dppo_kl:
      if (!(o.clip_ratio_c > 0.0 && std::isfinite(o.clip_ratio_c)))
        detail::fail_value(fn, "clip_ratio_c", o.clip_ratio_c, "must be finite and > 0 (the cap of the detached ratio)");
      c.kind = objective_kind::policy_gradient;
      break;
    case loss_mode_kind::dro:
      if (!o.dro_beta) detail::fail(fn, "dro_beta", "dro needs dro_beta (> 0)");
      if (!(*o.dro_beta > 0.0 && std::isfinite(*o.dro_beta))) detail::fail_value(fn, "dro_beta", *o.dro_beta, "must be finite and > 0");
      c.kind = objective_kind::penalized_pg, c.surrogate = pg_surrogate::log_prob, c.square_penalty = *o.dro_beta;
      c.log_ratio_clamp = no_limit;
      break;
    case loss_mode_kind::kl_cov:
      if (!(o.kl_cov_ratio > 0.0 && std::isfinite(o.kl_cov_ratio))) detail::fail_value(fn, "kl_cov_ratio", o.kl_cov_ratio, "must be finite and > 0");
      if (!(o.ppo_kl_coef >= 0.0 && std::isfinite(o.ppo_kl_coef))) detail::fail_value(fn, "ppo_kl_coef", o.ppo_kl_coef, "must be finite and >= 0");
      c.kind = objective_kind::penalized_pg, c.surrogate = pg_surrogate::ratio, c.abs_penalty = o.ppo_kl_coef;
      c.log_ratio_clamp = no_limit;
      break;
    case loss_mode_kind::clip_cov:
      if (!(o.clip_cov_ratio > 0.0 && std::isfinite(o.clip_cov_ratio)))
        detail::fail_value(fn, "clip_cov_ratio", o.clip_cov_ratio, "must be finite and > 0");
      if (!std::isfinite(o.clip_cov_lb)) detail::fail_value(fn, "clip_cov_lb", o.clip_cov_lb, "must be finite");
      if (!std::isfinite(o.clip_cov_ub)) detail::fail_value(fn, "clip_cov_ub", o.clip_cov_ub, "must be finite");
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
  static constexpr detail_presets::name_entry<kl_estimator> table[] = {
      {"kl", kl_estimator::k1},  {"k1", kl_estimator::k1},         {"abs", kl_estimator::abs},
      {"mse", kl_estimator::k2}, {"k2", kl_estimator::k2},         {"low_var_kl", kl_estimator::k3},
      {"k3", kl_estimator::k3}};
  std::string_view base = name;
  const bool plus = !base.empty() && base.back() == '+';
  if (plus) base.remove_suffix(1);
  if (plus && base.empty()) base = name;  // "+" alone: reported as the name given
  return {.kl_penalty = detail_presets::parse("presets::verl::kl_penalty_from_name", "kl_penalty", base, table),
          .straight_through = plus};
}
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  detail_presets::require_estimator("presets::verl::kl", "kl_penalty", o.kl_penalty, true);
  kl_config c{.estimator = o.kl_penalty, .straight_through = o.straight_through};
  if (o.kl_penalty == kl_estimator::k3) c.input_clamp = 20.0, c.output_clamp = 10.0;
  return c;
}

//! `loss_agg_mode` names; verl's "token-sum" (the masked sum times dp_size) is agg_mode::constant
//! with the constant 1.
[[nodiscard]] inline agg_mode loss_agg_mode_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<agg_mode> table[] = {
      {"token-mean", agg_mode::token_mean},
      {"token-sum", agg_mode::constant},
      {"seq-mean-token-sum", agg_mode::seq_mean_token_sum},
      {"seq-mean-token-mean", agg_mode::seq_mean_token_mean},
      {"seq-mean-token-sum-norm", agg_mode::seq_mean_token_sum_norm}};
  return detail_presets::parse("presets::verl::loss_agg_mode_from_name", "loss_agg_mode", name, table);
}

//! verl `agg_loss`'s options. Absent optionals take this batch's own counts (verl's local default).
struct normalizer_options {
  agg_mode loss_agg_mode = agg_mode::token_mean;
  double dp_size = 1.0;
  std::optional<double> batch_num_tokens{};   //!< token-mean; absent: this batch's N
  std::optional<double> global_batch_size{};  //!< seq modes; absent: this batch's non-empty rows
  std::optional<double> loss_scale_factor{};  //!< seq-mean-token-sum-norm; absent: `padded_length`
  std::size_t padded_length = 0;            //!< T of the padded batch
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
    case agg_mode::token_mean: return {o.loss_agg_mode, o.batch_num_tokens.value_or(local.tokens), o.dp_size};
    case agg_mode::seq_mean_token_sum:
    case agg_mode::seq_mean_token_mean:
      return {o.loss_agg_mode, o.global_batch_size.value_or(local.sequences), o.dp_size};
    case agg_mode::seq_mean_token_sum_norm: {
      const double horizon = o.loss_scale_factor.value_or(static_cast<double>(o.padded_length));
      if (!o.sum_norm_per_sequence) return {o.loss_agg_mode, horizon, 1.0};
      return {o.loss_agg_mode, o.global_batch_size.value_or(local.sequences) * horizon, o.dp_size};
    }
    case agg_mode::constant: return {o.loss_agg_mode, 1.0, o.dp_size};
  }
  return {};
}

//! The normaliser a `loss_mode` actually uses: gspo and sapo force seq-mean-token-mean; geo_mean
//! averages its per-sequence losses over the batch's rows and ignores every agg option.
[[nodiscard]] inline agg_normalizer policy_normalizer(loss_mode_kind loss_mode, normalizer_options o,
                                                      const batch_counts& local) {
  detail_verl::require_loss_mode("presets::verl::policy_normalizer", loss_mode);
  if (loss_mode == loss_mode_kind::geo_mean) return {agg_mode::seq_mean_token_sum, local.rows, 1.0};
  if (loss_mode == loss_mode_kind::gspo || loss_mode == loss_mode_kind::sapo)
    o.loss_agg_mode = agg_mode::seq_mean_token_mean;
  return normalizer(o, local);
}

//! verl's metrics of a loss mode: pg_clipfrac, ppo_kl, pg_clipfrac_lower.
struct policy_metrics {
  double pg_clipfrac, ppo_kl, pg_clipfrac_lower;
};
//! What the batch passes of dppo_*, kl_cov and clip_cov count (the metrics policy_loss cannot see).
struct mode_stats {
  double pg_clipfrac = 0;        //!< dppo_*: mean (1 - v); clip_cov: mean selection
  double pg_clipfrac_lower = 0;  //!< dppo_*: mean [r > c] v
  double ppo_kl = 0;             //!< kl_cov: mean |x|
};
//! `stats`: what dppo_weights / kl_cov_selection / clip_cov_weights returned (the other modes ignore it).
[[nodiscard]] inline policy_metrics metrics(loss_mode_kind loss_mode, const loss_metrics& m, const mode_stats& stats = {}) {
  detail_verl::require_loss_mode("presets::verl::metrics", loss_mode);
  switch (loss_mode) {
    case loss_mode_kind::dppo_tv:
    case loss_mode_kind::dppo_kl: return {stats.pg_clipfrac, m.approx_kl_k1_clamped(), stats.pg_clipfrac_lower};
    case loss_mode_kind::dro: return {0.0, m.approx_kl_k1(), 0.0};
    case loss_mode_kind::kl_cov: return {0.0, stats.ppo_kl, 0.0};
    case loss_mode_kind::clip_cov: return {stats.pg_clipfrac, m.approx_kl_k1(), 0.0};
    case loss_mode_kind::vanilla: return {m.clip_fraction(), m.approx_kl_k1_clamped(), m.dual_clip_fraction()};
    case loss_mode_kind::gspo: return {m.clip_fraction(), m.approx_kl_k1(), 0.0};
    case loss_mode_kind::cispo: return {m.clip_fraction(), m.approx_kl_k1_clamped(), 0.0};
    case loss_mode_kind::geo_mean: return {m.clip_high_fraction(), m.approx_kl_k1(), m.clip_low_fraction()};
    case loss_mode_kind::sapo:
    case loss_mode_kind::gpg: return {0.0, m.approx_kl_k1_clamped(), 0.0};
  }
  return {};
}

// ---- the batch passes of dppo_*, kl_cov and clip_cov ------------------------------------------------
// They write what policy_loss reads (a weight, a selection): the objectives stay those of
// objectives.hpp. All validate every input before writing; `rollout_is_weights` may be empty (1),
// and so may `mask` (every token of log_prob valid).

namespace detail_verl {
//! Validates the batch; returns the mask, an absent one as log_prob's all-valid mask.
template <class T, class M>
[[nodiscard]] token_view<const M> require_batch(std::string_view fn, token_view<const T> old_log_prob, token_view<const T> log_prob,
                                                token_view<const T> advantages, token_view<const M> mask,
                                                token_view<const T> rollout_is_weights) {
  validate_layout(fn, "log_prob", log_prob);
  mask = mask_or_all_valid(mask, log_prob);
  require_same_shape(fn, "old_log_prob", old_log_prob, "log_prob", log_prob);
  require_same_shape(fn, "advantages", advantages, "log_prob", log_prob);
  require_same_shape(fn, "mask", mask, "log_prob", log_prob);
  if (!rollout_is_weights.empty()) require_same_shape(fn, "rollout_is_weights", rollout_is_weights, "log_prob", log_prob);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "log_prob", log_prob);
  require_all_finite(fn, "old_log_prob", old_log_prob);
  require_all_finite(fn, "advantages", advantages);
  if (!rollout_is_weights.empty()) require_all_finite(fn, "rollout_is_weights", rollout_is_weights);
  return mask;
}
template <class T>
[[nodiscard]] double weight_at(token_view<const T> w, std::size_t b, std::size_t t) {
  return w.empty() ? 1.0 : static_cast<double>(w(b, t));
}
[[nodiscard]] inline double mean_of(double sum, double n) noexcept { return n > 0 ? sum / n : 0.0; }
}  // namespace detail_verl

//! DPPO Binary-TV / Binary-KL (verl dppo_tv / dppo_kl): writes weights = w min(r, c) v, the detached
//! factor of ℓ = -A min(r, c) logp v w (objective(): policy_gradient). r = exp(clamp(x, -20, 20)),
//! p = exp(logp), p0 = exp(old); v = [A > 0 ? v+ : v-] with, for TV, v+ = [p - p0 <= δh],
//! v- = [p - p0 >= -δl]; for KL, D = p0 (old - logp) + (1 - p0) log((1 - p0 + 1e-8) / (1 - p + 1e-8)),
//! v+ = [D <= δh or p <= p0], v- = [D <= δl or p >= p0]; δl, δh = clip_ratio_low / high (>= 0).
//! Returns pg_clipfrac = mean (1 - v) and pg_clipfrac_lower = mean [r > c] v over the valid tokens.
template <class T, class M>
mode_stats dppo_weights(token_view<const T> old_log_prob, token_view<const T> log_prob, token_view<const T> advantages,
                        token_view<const M> mask, token_view<const T> rollout_is_weights, token_view<T> weights,
                        const objective_options& o) {
  constexpr std::string_view fn = "presets::verl::dppo_weights";
  detail_verl::require_loss_mode(fn, o.loss_mode);
  if (o.loss_mode != loss_mode_kind::dppo_tv && o.loss_mode != loss_mode_kind::dppo_kl)
    detail::fail_value(fn, "loss_mode", static_cast<int>(o.loss_mode), "must be dppo_tv or dppo_kl");
  (void)objective(o);
  if (!(o.clip_ratio_low >= 0.0 && std::isfinite(o.clip_ratio_low)))
    detail::fail_value(fn, "clip_ratio_low", o.clip_ratio_low, "must be finite and >= 0 (a divergence threshold)");
  if (!(o.clip_ratio_high >= 0.0 && std::isfinite(o.clip_ratio_high)))
    detail::fail_value(fn, "clip_ratio_high", o.clip_ratio_high, "must be finite and >= 0 (a divergence threshold)");
  mask = detail_verl::require_batch(fn, old_log_prob, log_prob, advantages, mask, rollout_is_weights);
  require_same_shape(fn, "weights", weights, "log_prob", log_prob);
  const bool tv = o.loss_mode == loss_mode_kind::dppo_tv;
  const double c = o.clip_ratio_c, dl = o.clip_ratio_low, dh = o.clip_ratio_high;
  double n = 0, outside = 0, capped = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
      const double lp = static_cast<double>(log_prob(b, t)), old = static_cast<double>(old_log_prob(b, t));
      const double r = std::exp(std::clamp(lp - old, -20.0, 20.0));
      const double p = std::exp(lp), p0 = std::exp(old);
      bool keep_pos, keep_neg;
      if (tv) {
        keep_pos = p - p0 <= dh, keep_neg = p - p0 >= -dl;
      } else {
        const double d = p0 * (old - lp) + (1.0 - p0) * std::log((1.0 - p0 + 1e-8) / (1.0 - p + 1e-8));
        keep_pos = d <= dh || p <= p0, keep_neg = d <= dl || p >= p0;
      }
      const bool v = advantages(b, t) > T(0) ? keep_pos : keep_neg;
      const double wt = detail_verl::weight_at(rollout_is_weights, b, t) * std::min(r, c) * (v ? 1.0 : 0.0);
      weights(b, t) = static_cast<T>(wt);
      if (mask(b, t) != M(0)) n += 1, outside += v ? 0.0 : 1.0, capped += (r > c && v) ? 1.0 : 0.0;
    }
  return {detail_verl::mean_of(outside, n), detail_verl::mean_of(capped, n), 0.0};
}

//! KL-Cov's token selection (verl kl_cov): over the n valid tokens, c = (A - mean A)(logp - mean logp);
//! the k = max(1, floor(n kl_cov_ratio)) tokens of largest c (at most n; none when n = 0; ties by
//! position) get selected = 1, every other position 0. Those tokens take objective(o), the others
//! the same objective with abs_penalty = 0 (policy_loss with weights w selected and w (1 - selected),
//! one normaliser). The selection depends on the whole batch passed in (verl: the micro-batch).
//! Returns ppo_kl = mean |x| over the valid tokens.
template <class T, class M>
mode_stats kl_cov_selection(token_view<const T> old_log_prob, token_view<const T> log_prob, token_view<const T> advantages,
                            token_view<const M> mask, token_view<T> selected, const objective_options& o) {
  constexpr std::string_view fn = "presets::verl::kl_cov_selection";
  detail_verl::require_loss_mode(fn, o.loss_mode);
  if (o.loss_mode != loss_mode_kind::kl_cov) detail::fail_value(fn, "loss_mode", static_cast<int>(o.loss_mode), "must be kl_cov");
  (void)objective(o);
  mask = detail_verl::require_batch(fn, old_log_prob, log_prob, advantages, mask, token_view<const T>{});
  require_same_shape(fn, "selected", selected, "log_prob", log_prob);
  struct token {
    std::size_t b, t;
    double cov;
  };
  std::vector<token> valid;
  double sa = 0, sl = 0, sx = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
      if (mask(b, t) != M(0)) {
        valid.push_back({b, t, 0.0});
        sa += static_cast<double>(advantages(b, t)), sl += static_cast<double>(log_prob(b, t));
        sx += std::fabs(static_cast<double>(log_prob(b, t)) - static_cast<double>(old_log_prob(b, t)));
      }
  const double n = static_cast<double>(valid.size());
  const double ma = detail_verl::mean_of(sa, n), ml = detail_verl::mean_of(sl, n);
  for (auto& v : valid)
    v.cov = (static_cast<double>(advantages(v.b, v.t)) - ma) * (static_cast<double>(log_prob(v.b, v.t)) - ml);
  std::size_t k = 0;
  if (!valid.empty()) {
    const double want = std::floor(n * o.kl_cov_ratio);
    k = want < 1.0 ? 1 : (want >= n ? valid.size() : static_cast<std::size_t>(want));
  }
  std::stable_sort(valid.begin(), valid.end(), [](const token& a, const token& b) { return a.cov > b.cov; });
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) selected(b, t) = T(0);
  for (std::size_t i = 0; i < k; ++i) selected(valid[i].b, valid[i].t) = T(1);
  return {0.0, 0.0, detail_verl::mean_of(sx, n)};
}

//! Clip-Cov (verl clip_cov): checks the caller's draw `clip_cov_selection` (verl draws it with
//! torch.randperm among the candidates) and writes weights = w (1 - selection), so that objective(o)
//! (ppo_clip, unclamped ratio) drops the selected tokens' loss and gradient. Candidates: valid, not
//! clipped (not -A clamp(r, 1-εl, 1+εh) > -A r, r = exp(x)), and clip_cov_lb < cov < clip_cov_ub with
//! cov = (A - mean A)(logp - mean logp) over the N valid tokens. The selection must be 0/1, mark only
//! candidates, and exactly min(max(floor(clip_cov_ratio N), 1), #candidates) of them.
//! Returns pg_clipfrac = mean selection over the valid tokens.
template <class T, class M, class S>
mode_stats clip_cov_weights(token_view<const T> old_log_prob, token_view<const T> log_prob, token_view<const T> advantages,
                            token_view<const M> mask, token_view<const S> clip_cov_selection,
                            token_view<const T> rollout_is_weights, token_view<T> weights, const objective_options& o) {
  constexpr std::string_view fn = "presets::verl::clip_cov_weights";
  detail_verl::require_loss_mode(fn, o.loss_mode);
  if (o.loss_mode != loss_mode_kind::clip_cov) detail::fail_value(fn, "loss_mode", static_cast<int>(o.loss_mode), "must be clip_cov");
  const objective_config oc = objective(o);
  validate_objective(fn, oc);
  mask = detail_verl::require_batch(fn, old_log_prob, log_prob, advantages, mask, rollout_is_weights);
  require_same_shape(fn, "clip_cov_selection", clip_cov_selection, "log_prob", log_prob);
  require_same_shape(fn, "weights", weights, "log_prob", log_prob);
  require_binary_mask(fn, "clip_cov_selection", clip_cov_selection);
  double n = 0, sa = 0, sl = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
      if (mask(b, t) != M(0)) n += 1, sa += static_cast<double>(advantages(b, t)), sl += static_cast<double>(log_prob(b, t));
  const double ma = detail_verl::mean_of(sa, n), ml = detail_verl::mean_of(sl, n);
  const double lo = 1.0 - o.clip_ratio_low, hi = 1.0 + o.clip_ratio_high;
  double candidates = 0, marked = 0;
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
      const double lp = static_cast<double>(log_prob(b, t)), a = static_cast<double>(advantages(b, t));
      const double r = std::exp(lp - static_cast<double>(old_log_prob(b, t)));
      const bool clipped = -a * std::clamp(r, lo, hi) > -a * r;
      const double cov = (a - ma) * (lp - ml);
      const bool candidate = mask(b, t) != M(0) && !clipped && o.clip_cov_lb < cov && cov < o.clip_cov_ub;
      const bool sel = clip_cov_selection(b, t) != S(0);
      if (sel && !candidate)
        detail::fail_at(fn, "clip_cov_selection", static_cast<std::int64_t>(clip_cov_selection.flat_index(b, t)), 1,
                        "marks a token that is not a candidate (valid, not clipped, clip_cov_lb < cov < clip_cov_ub)");
      candidates += candidate ? 1.0 : 0.0, marked += sel ? 1.0 : 0.0;
    }
  const double clip_num = std::max(std::floor(o.clip_cov_ratio * n), 1.0);
  const double want = std::min(clip_num, candidates);
  if (marked != want)
    detail::fail_value(fn, "clip_cov_selection", marked,
                       "must mark exactly min(max(floor(clip_cov_ratio N), 1), #candidates) = " + std::to_string(static_cast<long long>(want)) +
                           " tokens");
  for (std::size_t b = 0; b < log_prob.rows(); ++b)
    for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
      weights(b, t) = static_cast<T>(clip_cov_selection(b, t) != S(0) ? 0.0 : detail_verl::weight_at(rollout_is_weights, b, t));
  return {detail_verl::mean_of(marked, n), 0.0, 0.0};
}


}  // namespace verl

// ---- OpenRLHF -------------------------------------------------------------------------------------
namespace openrlhf {

//! `policy_loss_type`.
enum class policy_loss_kind { ppo, gspo };
[[nodiscard]] inline policy_loss_kind policy_loss_type_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<policy_loss_kind> table[] = {{"ppo", policy_loss_kind::ppo},
                                                                           {"gspo", policy_loss_kind::gspo}};
  return detail_presets::parse("presets::openrlhf::policy_loss_type_from_name", "policy_loss_type", name, table);
}

struct objective_options {
  policy_loss_kind policy_loss_type = policy_loss_kind::ppo;
  double clip_eps_low = 0.2;
  double clip_eps_high = 0.2;
  std::optional<double> dual_clip{};  //!< c > 1 for negative advantages; absent: none
  //! vLLM importance-sampling correction (its type and thresholds: rollout_correction_options,
  //! ulorl/loss/rollout_correction/presets.hpp); see vllm_is_correction().
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
    case policy_loss_kind::ppo: c.kind = objective_kind::ppo_clip; break;
    case policy_loss_kind::gspo:
      c.kind = objective_kind::gspo, c.seq_log_ratio_max = no_limit, c.seq_gradient = sequence_gradient::through_mean;
      break;
  }
  if (o.dual_clip) {
    if (!(*o.dual_clip > 1.0)) detail::fail_value(fn, "dual_clip", *o.dual_clip, "must be > 1");
    c.dual_clip = *o.dual_clip;
  }
  return c;
}

//! `kl_estimator` k1 / k2 / k3, every estimator clamped to +-10 (zero gradient outside).
struct kl_options {
  ulorl::kl_estimator kl_estimator = ulorl::kl_estimator::k1;
};
[[nodiscard]] inline kl_estimator kl_estimator_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<ulorl::kl_estimator> table[] = {
      {"k1", ulorl::kl_estimator::k1}, {"k2", ulorl::kl_estimator::k2}, {"k3", ulorl::kl_estimator::k3}};
  return detail_presets::parse("presets::openrlhf::kl_estimator_from_name", "kl_estimator", name, table);
}
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  detail_presets::require_estimator("presets::openrlhf::kl", "kl_estimator", o.kl_estimator,
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

}  // namespace openrlhf

// ---- NeMo-RL --------------------------------------------------------------------------------------
namespace nemo_rl {

//! `reference_policy_kl_type` k1 / k2 / k3 with optional input and output clamps.
struct kl_options {
  kl_estimator reference_policy_kl_type = kl_estimator::k3;
  std::optional<double> kl_input_clamp_value{};
  std::optional<double> kl_output_clamp_value{};
};
[[nodiscard]] inline kl_estimator kl_type_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<kl_estimator> table[] = {
      {"k1", kl_estimator::k1}, {"k2", kl_estimator::k2}, {"k3", kl_estimator::k3}};
  return detail_presets::parse("presets::nemo_rl::kl_type_from_name", "reference_policy_kl_type", name, table);
}
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  detail_presets::require_estimator("presets::nemo_rl::kl", "reference_policy_kl_type", o.reference_policy_kl_type,
                                    o.reference_policy_kl_type != kl_estimator::abs);
  return {.estimator = o.reference_policy_kl_type,
          .input_clamp = o.kl_input_clamp_value.value_or(no_limit),
          .output_clamp = o.kl_output_clamp_value.value_or(no_limit)};
}

//! ClippedPGLossFn's options, named as NeMo-RL's `loss_fn` config keys (defaults: NeMo-RL's; its
//! config files set reference_policy_kl_penalty, 0.01 in grpo_math_1B.yaml). Not modelled (left at
//! NeMo's false / 0): sequence_level_importance_ratios, use_cispo, positive_example_nll_weight,
//! use_kl_in_reward.
//!
//! One step is composed of the existing pieces (docs/losses.md §13):
//!  * w = rollout_correction::apply(rollout_correction(o)) on (prev, rollout_log_prob), prev =
//!    log_prob under force_on_policy_ratio, else old_log_prob; policy_loss weights u = w when
//!    use_importance_sampling_correction;
//!  * actor = policy_loss(objective(o), old_log_prob := prev, normalizer(o, ...)), kl_coef = 0;
//!  * kl = kl_penalty_term(..., o, normalizer(o, ...)) added to the loss and the gradient (same normaliser).
struct clipped_pg_loss_options {
  double ratio_clip_min = 0.2;
  double ratio_clip_max = 0.2;
  std::optional<double> ratio_clip_c{};  //!< dual clip (> 1); absent: none
  bool token_level_loss = true;          //!< token-mean over global_valid_toks; false: mean of row means over global_valid_seqs
  bool force_on_policy_ratio = false;    //!< prev := log_prob: ratio 1 with derivative 1
  bool disable_ppo_ratio = false;        //!< ratio := log_prob (REINFORCE); ignored under force_on_policy_ratio
  bool use_importance_sampling_correction = false;
  std::optional<rollout_correction::is_weighting> truncated_importance_sampling_type{};  //!< tis / icepop / seq-mask-tis
  std::optional<double> truncated_importance_sampling_ratio{};
  std::optional<double> truncated_importance_sampling_ratio_min{};
  double reference_policy_kl_penalty = 0.01;  //!< beta; 0: no KL term
  kl_estimator reference_policy_kl_type = kl_estimator::k3;
  std::optional<double> kl_input_clamp_value = 20.0;
  std::optional<double> kl_output_clamp_value = 10.0;
  bool use_on_policy_kl_approximation = false;  //!< KL weight exp(logp - rollout_log_prob) instead of exp(logp - sg(logp))
};

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
    detail::fail_value(fn, "ratio_clip_c", *o.ratio_clip_c, "must be finite and > 1 (dual clip)");
  if (o.truncated_importance_sampling_type && !o.use_importance_sampling_correction)
    detail::fail(fn, "truncated_importance_sampling_type", "needs use_importance_sampling_correction");
  if (o.disable_ppo_ratio && !o.force_on_policy_ratio && o.ratio_clip_c)
    detail::fail(fn, "ratio_clip_c", "disable_ppo_ratio with a dual clip is not modelled");
  require_finite(fn, "reference_policy_kl_penalty", o.reference_policy_kl_penalty);
  detail_presets::require_estimator(fn, "reference_policy_kl_type", o.reference_policy_kl_type,
                                    o.reference_policy_kl_type != kl_estimator::abs);
  if (o.kl_input_clamp_value && !(*o.kl_input_clamp_value > 0.0))
    detail::fail_value(fn, "kl_input_clamp_value", *o.kl_input_clamp_value, "must be > 0");
  if (o.kl_output_clamp_value && !(*o.kl_output_clamp_value > 0.0))
    detail::fail_value(fn, "kl_output_clamp_value", *o.kl_output_clamp_value, "must be > 0");
}

//! The objective of the actor loss: PPO clip (ratio_clip_min / max) on the unclamped ratio, with
//! the dual clip ratio_clip_c when given, or policy_gradient (-A logp) under disable_ppo_ratio.
[[nodiscard]] inline objective_config objective(const clipped_pg_loss_options& o) {
  validate(o);
  if (o.disable_ppo_ratio && !o.force_on_policy_ratio) return {.kind = objective_kind::policy_gradient, .log_ratio_clamp = no_limit};
  return {.kind = objective_kind::ppo_clip, .eps_low = o.ratio_clip_min, .eps_high = o.ratio_clip_max,
          .dual_clip = o.ratio_clip_c.value_or(0.0), .log_ratio_clamp = no_limit};
}

//! The importance weights' configuration (rollout_correction/presets.hpp), token level.
[[nodiscard]] inline rollout_correction::config rollout_correction(const clipped_pg_loss_options& o) {
  validate(o);
  return rollout_correction(rollout_correction_options{
      .truncated_importance_sampling_type = o.truncated_importance_sampling_type,
      .truncated_importance_sampling_ratio = o.truncated_importance_sampling_ratio,
      .truncated_importance_sampling_ratio_min = o.truncated_importance_sampling_ratio_min});
}

//! The actor's (and the KL's) normaliser: token-mean over g.global_valid_toks (absent: this batch's
//! N) or the mean of row means over g.global_valid_seqs (absent: this batch's B).
[[nodiscard]] inline agg_normalizer normalizer(const clipped_pg_loss_options& o, const global_counts& g,
                                               const batch_counts& local) {
  validate("presets::nemo_rl::normalizer", g);
  if (o.token_level_loss) return {agg_mode::token_mean, g.global_valid_toks.value_or(local.tokens), 1.0};
  return {agg_mode::seq_mean_token_mean, g.global_valid_seqs.value_or(local.rows), 1.0};
}

//! NeMo-RL's reference-KL term, which policy_loss's KL term does not express (the weight multiplies
//! before the output clamp, and its derivative enters the gradient): with λ = clamp(ref - logp,
//! ±kl_input_clamp_value), κ the estimator of kl.hpp at λ, ω = exp(logp - sg(logp)) (value 1,
//! derivative 1) or, with use_on_policy_kl_approximation, exp(logp - rollout_log_prob) (derivative
//! ω), K = clamp(ω κ, ±kl_output_clamp_value); d K / d logp = ω' κ + ω dκ/dlogp, 0 where either
//! clamp is active. Returns kl = β Σ_b ω_b Σ_t K m (ω_b the row weight of `norm`) and adds its
//! gradient β ω_b dK to grad_log_prob on the valid tokens. `rollout_log_prob` is read only with
//! the on-policy approximation, which rejects an overflowing exp(logp - rollout_log_prob) (NeMo's
//! gradient there is 0 · inf = NaN). An absent mask (empty view): every token valid. Validates
//! before writing.
template <class T, class M>
double kl_penalty_term(token_view<const T> log_prob, token_view<const T> ref_log_prob, token_view<const T> rollout_log_prob,
                       token_view<const M> mask, token_view<T> grad_log_prob, const clipped_pg_loss_options& o,
                       const agg_normalizer& norm) {
  constexpr std::string_view fn = "presets::nemo_rl::kl_penalty_term";
  validate(o);
  validate_layout(fn, "log_prob", log_prob);
  mask = mask_or_all_valid(mask, log_prob);
  require_same_shape(fn, "ref_log_prob", ref_log_prob, "log_prob", log_prob);
  require_same_shape(fn, "mask", mask, "log_prob", log_prob);
  require_same_shape(fn, "grad_log_prob", grad_log_prob, "log_prob", log_prob);
  const bool on_policy = o.use_on_policy_kl_approximation;
  if (on_policy || !rollout_log_prob.empty()) require_same_shape(fn, "rollout_log_prob", rollout_log_prob, "log_prob", log_prob);
  validate_normalizer(fn, norm);
  require_binary_mask(fn, "mask", mask);
  require_all_finite(fn, "log_prob", log_prob);
  require_all_finite(fn, "ref_log_prob", ref_log_prob);
  if (on_policy) {
    require_all_finite(fn, "rollout_log_prob", rollout_log_prob);
    for (std::size_t b = 0; b < log_prob.rows(); ++b)
      for (std::size_t t = 0; t < log_prob.row_size(b); ++t)
        if (!std::isfinite(std::exp(static_cast<double>(log_prob(b, t)) - static_cast<double>(rollout_log_prob(b, t)))))
          detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(rollout_log_prob.flat_index(b, t)), rollout_log_prob(b, t),
                          "exp(log_prob - rollout_log_prob) overflows (use_on_policy_kl_approximation)");
  }
  const double beta = o.reference_policy_kl_penalty;
  if (beta == 0.0) return 0.0;
  const double in = o.kl_input_clamp_value.value_or(no_limit), out = o.kl_output_clamp_value.value_or(no_limit);
  const kl_params<double> kp = make_kl_params<double>({.estimator = o.reference_policy_kl_type, .input_clamp = in});
  // Two passes over the same terms: the first checks every new gradient value and the penalty
  // against T's range (an error names the first beyond it, nothing written), the second writes.
  const auto each = [&](auto&& emit) {
    double total = 0;
    for (std::size_t b = 0; b < log_prob.rows(); ++b) {
      const double wb = row_weight(norm, row_tokens(mask, b));
      double row = 0;
      for (std::size_t t = 0; t < log_prob.row_size(b); ++t) {
        if (mask(b, t) == M(0)) continue;
        const double lp = static_cast<double>(log_prob(b, t)), ref = static_cast<double>(ref_log_prob(b, t));
        const kl_value<double> k = kl_term(lp, ref, kp);  // κ at the clamped λ, dκ/dlogp (0 where clamped)
        const bool in_clamped = std::fabs(ref - lp) > in;
        const double omega = on_policy ? std::exp(lp - static_cast<double>(rollout_log_prob(b, t))) : 1.0;
        const double domega = in_clamped ? 0.0 : omega;
        const double raw = omega * k.value;
        const double kv = std::clamp(raw, -out, out);
        const double dk = (-out <= raw && raw <= out) ? domega * k.value + omega * k.grad : 0.0;
        row += kv;
        emit(b, t, static_cast<double>(grad_log_prob(b, t)) + beta * wb * dk);
      }
      total += row == 0.0 ? 0.0 : wb * row;
    }
    return beta * total;
  };
  const double kl = each([&](std::size_t b, std::size_t t, double g) {
    require_result_in_range<T>(fn, "grad_log_prob", static_cast<std::int64_t>(grad_log_prob.flat_index(b, t)), g);
  });
  require_result_in_range<T>(fn, "kl_penalty", -1, kl);
  (void)each([&](std::size_t b, std::size_t t, double g) { grad_log_prob(b, t) = static_cast<T>(g); });
  return kl;
}

//! NeMo-RL's logged ratios: probs_ratio = Σ ratio m / Gt and probs_ratio_clamped = Σ r̄ m / Gt, with
//! ratio = exp(logp - prev), r̄ = clamp(ratio, 1 - ratio_clip_min, 1 + ratio_clip_max) (1 and 1 under
//! force_on_policy_ratio; logp and logp under disable_ppo_ratio). `prev` is old_log_prob (ignored
//! under force_on_policy_ratio); Gt = g.global_valid_toks (absent: N). An absent mask (empty view):
//! every token valid.
struct ratio_metrics {
  double probs_ratio = 0, probs_ratio_clamped = 0;
};
template <class T, class M>
[[nodiscard]] ratio_metrics logged_ratios(token_view<const T> log_prob, token_view<const T> prev, token_view<const M> mask,
                                          const clipped_pg_loss_options& o, const global_counts& g = {}) {
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

}  // namespace nemo_rl

// ---- TRL ------------------------------------------------------------------------------------------
namespace trl {

//! `importance_sampling_level`.
//! `sequence_token` is GSPO-token (`trl.experimental.gspo_token`): the sequence ratio with the
//! gradient to each token itself.
enum class importance_sampling_kind { token, sequence, sequence_token };
[[nodiscard]] inline importance_sampling_kind importance_sampling_level_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<importance_sampling_kind> table[] = {
      {"token", importance_sampling_kind::token},
      {"sequence", importance_sampling_kind::sequence},
      {"sequence_token", importance_sampling_kind::sequence_token}};
  return detail_presets::parse("presets::trl::importance_sampling_level_from_name", "importance_sampling_level", name,
                               table);
}

//! `loss_type`.
enum class loss_type_kind { grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo };
[[nodiscard]] inline loss_type_kind loss_type_from_name(std::string_view name) {
  static constexpr detail_presets::name_entry<loss_type_kind> table[] = {
      {"grpo", loss_type_kind::grpo},   {"bnpo", loss_type_kind::bnpo}, {"dr_grpo", loss_type_kind::dr_grpo},
      {"dapo", loss_type_kind::dapo},   {"cispo", loss_type_kind::cispo}, {"sapo", loss_type_kind::sapo},
      {"luspo", loss_type_kind::luspo}, {"vespo", loss_type_kind::vespo}};
  return detail_presets::parse("presets::trl::loss_type_from_name", "loss_type", name, table);
}
namespace detail_trl {
inline void require_loss_type(std::string_view fn, loss_type_kind t) {
  require_known(fn, "loss_type", t, loss_type_kind::grpo, loss_type_kind::bnpo, loss_type_kind::dr_grpo,
                loss_type_kind::dapo, loss_type_kind::cispo, loss_type_kind::sapo, loss_type_kind::luspo,
                loss_type_kind::vespo);
}
inline void require_level(std::string_view fn, importance_sampling_kind l) {
  require_known(fn, "importance_sampling_level", l, importance_sampling_kind::token, importance_sampling_kind::sequence,
                importance_sampling_kind::sequence_token);
}
}  // namespace detail_trl

struct objective_options {
  double epsilon = 0.2;
  std::optional<double> epsilon_high{};  //!< absent: epsilon (cispo: the cap of the ratio itself)
  std::optional<double> delta{};         //!< upper cap of the ratio (two-sided GRPO); absent: none
  importance_sampling_kind importance_sampling_level = importance_sampling_kind::token;
  loss_type_kind loss_type = loss_type_kind::dapo;  //!< TRL's GRPOConfig default, as normalizer_options'
  double sapo_temperature_pos = 1.0;
  double sapo_temperature_neg = 1.05;
};

//! GRPOTrainer's objective of a token. grpo / bnpo / dr_grpo / dapo / luspo: importance weight
//! exp(w) (no clamp) clipped to [1 - epsilon, 1 + epsilon_high], optional delta cap; the sequence
//! level is gspo (gradient through the mean), sequence_token (GSPO-token) gspo with the own-token
//! gradient, delta capping the row's ratio as in TRL's GSPO-token trainer.
//! cispo: -sg(min(r, epsilon_high)) A logp (cispo with lo = 0, hi = epsilon_high >= 0; no delta);
//! sapo: the sapo temperatures; vespo: the policy gradient (its weight phi_b: vespo.hpp). For cispo
//! and sapo the configuration is the token-level one: at the sequence level the caller gives the
//! sequence log-ratio as each token's log-ratio (docs/losses.md §13). sequence_token admits only
//! grpo / bnpo / dr_grpo / dapo.
[[nodiscard]] inline objective_config objective(const objective_options& o) {
  constexpr const char* fn = "presets::trl::objective";
  detail_trl::require_level(fn, o.importance_sampling_level);
  require_not_nan(fn, "epsilon", o.epsilon);
  require_not_nan(fn, "epsilon_high", o.epsilon_high);
  require_not_nan(fn, "delta", o.delta);
  require_not_nan(fn, "sapo_temperature_pos", o.sapo_temperature_pos);
  require_not_nan(fn, "sapo_temperature_neg", o.sapo_temperature_neg);
  detail_trl::require_loss_type(fn, o.loss_type);
  const auto level = o.importance_sampling_level;
  objective_config c{.eps_low = o.epsilon, .eps_high = o.epsilon_high.value_or(o.epsilon), .delta = o.delta.value_or(0.0),
                     .log_ratio_clamp = no_limit, .seq_log_ratio_max = no_limit,
                     .seq_gradient = sequence_gradient::through_mean};
  switch (o.loss_type) {
    case loss_type_kind::grpo:
    case loss_type_kind::bnpo:
    case loss_type_kind::dr_grpo:
    case loss_type_kind::dapo:
    case loss_type_kind::luspo:
      if (level == importance_sampling_kind::sequence_token && o.loss_type == loss_type_kind::luspo)
        detail::fail(fn, "loss_type", "sequence_token supports loss_type grpo / bnpo / dr_grpo / dapo only");
      c.kind = level == importance_sampling_kind::token ? objective_kind::ppo_clip : objective_kind::gspo;
      if (level == importance_sampling_kind::sequence_token) c.seq_gradient = sequence_gradient::own_token;
      return c;
    case loss_type_kind::cispo:
    case loss_type_kind::sapo:
    case loss_type_kind::vespo: break;
  }
  if (level == importance_sampling_kind::sequence_token)
    detail::fail(fn, "loss_type", "sequence_token supports loss_type grpo / bnpo / dr_grpo / dapo only");
  c.delta = 0.0;
  switch (o.loss_type) {
    case loss_type_kind::cispo: {
      const double cap = o.epsilon_high.value_or(o.epsilon);
      if (!(cap >= 0.0)) detail::fail_value(fn, "epsilon_high", cap, "cispo: the ratio cap must be >= 0");
      c.kind = objective_kind::cispo, c.eps_low = 1.0, c.eps_high = cap - 1.0;
      break;
    }
    case loss_type_kind::sapo:
      c.kind = objective_kind::sapo, c.tau_pos = o.sapo_temperature_pos, c.tau_neg = o.sapo_temperature_neg;
      break;
    case loss_type_kind::vespo: c.kind = objective_kind::policy_gradient; break;
    case loss_type_kind::grpo:
    case loss_type_kind::bnpo:
    case loss_type_kind::dr_grpo:
    case loss_type_kind::dapo:
    case loss_type_kind::luspo: break;  // returned above
  }
  return c;
}

//! beta * k3 (unclamped); with use_bias_correction_kl the estimate is multiplied by the ratio.
struct kl_options {
  bool use_bias_correction_kl = false;
};
[[nodiscard]] inline kl_config kl(const kl_options& o) {
  return {.estimator = kl_estimator::k3, .importance_weighted = o.use_bias_correction_kl};
}


struct normalizer_options {
  loss_type_kind loss_type = loss_type_kind::dapo;
  importance_sampling_kind importance_sampling_level = importance_sampling_kind::token;  //!< luspo
  std::size_t padded_length = 0;             //!< luspo at token level: T of the padded batch
  double max_completion_length = 256;        //!< dr_grpo
  double gradient_accumulation_steps = 1;    //!< grpo, bnpo, dr_grpo
  std::optional<double> num_items_in_batch{};  //!< dapo; absent: this batch's N
  double num_processes = 1;                  //!< dapo
};

//! loss_type normalisers: grpo, sapo (1/B) sum_b mean_t / GA; bnpo sum / max(N, 1) / GA;
//! dr_grpo sum / (B max_completion_length) / GA; dapo, cispo, vespo sum / (max(num_items_in_batch,
//! 1) / P). luspo weighs row b by n_b: sequence level sum_b l_b n_b / B / GA (constant B over the
//! valid tokens); token level sum_bt l[b,t] n_b / (B T) / GA over every position, padding included
//! (constant B T: pass an all-ones mask and n_b in `weights`, docs/losses.md §13).
[[nodiscard]] inline agg_normalizer normalizer(const normalizer_options& o, const batch_counts& local) {
  constexpr const char* fn = "presets::trl::normalizer";
  detail_trl::require_loss_type(fn, o.loss_type);
  require_not_nan(fn, "max_completion_length", o.max_completion_length);
  require_not_nan(fn, "gradient_accumulation_steps", o.gradient_accumulation_steps);
  require_not_nan(fn, "num_items_in_batch", o.num_items_in_batch);
  require_not_nan(fn, "num_processes", o.num_processes);
  detail_trl::require_level(fn, o.importance_sampling_level);
  const double ga = o.gradient_accumulation_steps;
  switch (o.loss_type) {
    case loss_type_kind::luspo:
      if (o.importance_sampling_level == importance_sampling_kind::sequence) return {agg_mode::constant, local.rows, 1.0 / ga};
      return {agg_mode::constant, local.rows * static_cast<double>(o.padded_length), 1.0 / ga};
    case loss_type_kind::sapo:
    case loss_type_kind::grpo: return {agg_mode::seq_mean_token_mean, local.rows, 1.0 / ga};
    case loss_type_kind::bnpo: return {agg_mode::token_mean, local.tokens > 1 ? local.tokens : 1.0, 1.0 / ga};
    case loss_type_kind::dr_grpo: return {agg_mode::constant, local.rows * o.max_completion_length, 1.0 / ga};
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
[[nodiscard]] inline clip_metrics clip_ratios(const loss_metrics& m, importance_sampling_kind importance_sampling_level) {
  detail_trl::require_level("presets::trl::clip_ratios", importance_sampling_level);
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
  detail_trl::require_loss_type(fn, o.loss_type);
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

}  // namespace trl
}  // namespace presets
ULORL_NAMESPACE_END
