// ulorl/loss/policy_loss_types.hpp — the types of the fused policy loss (ulorl/loss/policy_loss.hpp):
// its inputs, configuration and result, and the parameters of one token's loss in the element type.
#pragma once

#include <cmath>
#include <optional>
#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
#include "ulorl/loss/rollout_correction/statistics.hpp"

ULORL_NAMESPACE_BEGIN

//! Inputs of one micro-batch. All views share log_prob's shape; optional views are empty when absent.
template <class T, class M = T>
struct policy_loss_inputs {
  token_view<const T> log_prob;
  token_view<const T> old_log_prob;
  token_view<const T> advantages;
  //! 0/1 response mask; absent (empty): every token of log_prob's layout is valid (padded: all
  //! B x T, packed: every token inside the offsets), the same bits as an all-ones mask.
  token_view<const M> mask{};
  token_view<const T> ref_log_prob{};  //!< required when kl_coef != 0
  token_view<const T> weights{};       //!< rollout-correction weights (detached); absent: 1
  token_view<const T> entropy{};       //!< required when entropy_coef != 0
  //! The inference engine's log-prob of each sampled token: required with policy_loss_config::rollout,
  //! rejected without it.
  token_view<const T> rollout_log_prob{};
};

struct policy_loss_config {
  objective_config objective{};
  kl_config kl{};
  double kl_coef = 0.0;       //!< beta of the KL loss term; 0: no term (ref_log_prob unused)
  double entropy_coef = 0.0;  //!< entropy bonus coefficient; 0: no term
  //! The step's normaliser (global_normalizer). For gmpo the denominator is the number of sequences
  //! (the loss is a mean over rows) and the mode only weighs the KL / entropy terms.
  agg_normalizer normalizer{};
  //! true (default): every token value is scanned before anything is computed; a NaN/Inf input or
  //! a mask value other than 0/1 throws ulorl::error naming the argument and index, and no output
  //! is written; a result beyond its type's range (a token's objective, KL value or gradient in T,
  //! a loss beyond T, a metric sum beyond double) throws after the pass, naming it, and the
  //! gradient outputs are then set to 0. false: for inputs the caller trusts, those scans and the
  //! results' check are skipped (one extra read of every input)
  //! are skipped; shapes, layouts and the configuration are still checked. A NaN/Inf then flows
  //! into the loss (and into the gradient as far as torch's clamp rule lets it: a NaN argument is
  //! outside every clamp, so clamped terms pass no gradient), and any non-zero mask value counts as
  //! a valid token.
  bool check_values = true;
  //! Rollout correction inside the loss pass (ulorl/loss/rollout_correction.hpp, from
  //! inputs::old_log_prob, inputs::rollout_log_prob and the mask): each row's importance weights
  //! and keep-mask are computed as rollout_correction::apply computes them and used as the
  //! `weights` (times inputs::weights when given) and the mask of that row, without writing them
  //! to memory; policy_loss_result::rollout returns the statistics (finalize() gives the metrics).
  //! The loss is the same bits as apply() followed by the loss on its outputs. Two settings need
  //! the whole batch first, from a statistics pass (rollout_correction::accumulate without
  //! outputs, summed over parts): the normaliser of a configuration with rejection sampling counts
  //! the kept tokens (tokens - rejected_tokens), and importance.batch_normalize takes its divisor
  //! as rollout_batch_norm_factor (finalize()'s batch_norm_factor). The weights must be finite in
  //! T by construction (a finite importance.upper, or a log-ratio clamp whose exp is finite):
  //! configurations that can overflow are rejected here and run through apply(). The call
  //! allocates one scratch block (weights and keep-mask of about 65,536 tokens, or of its longest
  //! row), also on the sequential executor.
  std::optional<rollout_correction::config> rollout{};
  //! The divisor of the weights: required with rollout->importance.batch_normalize, rejected otherwise.
  std::optional<double> rollout_batch_norm_factor{};
};

struct policy_loss_result {
  double loss = 0;          //!< pg_loss + kl_loss + entropy_loss
  double pg_loss = 0;       //!< aggregated objective
  double kl_loss = 0;       //!< aggregated kl_coef * kl
  double entropy_loss = 0;  //!< aggregated -entropy_coef * H
  loss_metrics metrics{};
  //! With policy_loss_config::rollout: the rollout correction's statistics of this micro-batch
  //! (sum them over parts with operator+=, then rollout_correction::finalize).
  rollout_correction::statistics rollout{};
  //! Rows whose written gradient holds a NaN or an infinity: possible only with check_values =
  //! false (with it, a non-finite result is an error and the call returns nothing).
  double nonfinite_grad_rows = 0;
};

namespace detail {
//! `in` with an absent mask as the all-valid mask of log_prob's tokens (mask_or_all_valid).
template <class T, class M>
[[nodiscard]] constexpr policy_loss_inputs<T, M> with_all_valid_mask(policy_loss_inputs<T, M> in) noexcept {
  in.mask = mask_or_all_valid(in.mask, in.log_prob);
  return in;
}
}  // namespace detail

//! The parameters of one token's loss in the element type T (P: the objective's parameters).
template <class T, class P = objective_params<T>>
struct token_loss_params {
  P objective;
  kl_params<T> kl;
  T kl_coef;
  T entropy_coef;
};
template <class T>
[[nodiscard]] constexpr token_loss_params<T> make_token_loss_params(const policy_loss_config& c) noexcept {
  return {make_objective_params<T>(c.objective), make_kl_params<T>(c.kl), static_cast<T>(c.kl_coef),
          static_cast<T>(c.entropy_coef)};
}

namespace detail {
//! The configuration's scalars as kernels in value type T run them (the CPU's policy_loss and the
//! CUDA loss): the KL clamps, finite coefficients that T neither rounds to 0 (the term would vanish)
//! nor overflows, and the normaliser. Throws ulorl::error naming the argument.
template <class T>
void validate_loss_scalars(std::string_view fn, const policy_loss_config& cfg) {
  // Every floating field, also those the objective does not read (an unused NaN is a caller's bug).
  visit_fields(cfg.objective, [fn](std::string_view name, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>) require_not_nan(fn, name, v);
  });
  require_not_nan(fn, "kl_input_clamp", cfg.kl.input_clamp),
      require_not_nan(fn, "kl_output_clamp", cfg.kl.output_clamp);
  validate_kl_clamps(fn, cfg.kl);
  const auto coefficient = [fn](std::string_view arg, double c) {
    require_finite(fn, arg, c);
    const T in_t = static_cast<T>(c);
    if (c != 0.0 && in_t == T(0))
      fail_value(fn, arg, c, "is not 0 but rounds to 0 in the value type (the term would vanish)");
    if (!std::isfinite(in_t)) fail_value(fn, arg, c, "overflows the value type");
  };
  coefficient("kl_coef", cfg.kl_coef);
  coefficient("entropy_coef", cfg.entropy_coef);
  validate_normalizer(fn, cfg.normalizer);
  if (cfg.objective.kind == objective_kind::sapo) {  // 4 / tau in T
    require_divisor<T>(fn, "tau_pos", cfg.objective.sapo.tau_pos);
    require_divisor<T>(fn, "tau_neg", cfg.objective.sapo.tau_neg);
  }
}
}  // namespace detail

//! One token's contribution before the aggregation weight (policy_token_loss).
template <class T>
struct token_loss {
  T loss;               //!< weight * objective + kl_coef * kl - entropy_coef * H
  T pg;                 //!< weight * objective
  T kl;                 //!< KL estimate (importance-weighted when configured)
  T dlogp;              //!< d loss / d logp
  T dentropy;           //!< d loss / d H
  T ratio;              //!< importance ratio (after the log-ratio clamp)
  T log_ratio_clamped;  //!< clamp(logp - old)
  unsigned flags;       //!< token_flag bits
};

ULORL_NAMESPACE_END
