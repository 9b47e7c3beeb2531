// ulorl/loss/metrics.hpp — the metrics trainers log for a policy loss, computed in the same pass as
// the loss: clip fractions (total / low / high / dual), approximate KL between old and new policy
// (k1 = mean(old - logp) and k3), ratio min / mean / max, reference-KL mean, entropy mean, token and
// sequence counts. Everything is kept as sums and counts, so metrics of micro-batches and ranks
// `merge` exactly into the metrics of the whole batch; the accessors divide at the end.
// Naming: verl pg_clipfrac = clip_fraction(), pg_clipfrac_lower = dual_clip_fraction(), ppo_kl =
// approx_kl_k1(); OpenRLHF clip_ratio = clip_fraction(); TRL clip_ratio/low_mean, high_mean,
// region_mean = clip_low_fraction(), clip_high_fraction(), clip_region_fraction().
#pragma once

#include <limits>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

struct loss_metrics {
  double tokens = 0;               //!< valid tokens
  double sequences = 0;            //!< rows with at least one valid token
  double rows = 0;                 //!< rows seen
  double clipped = 0;              //!< valid tokens whose clipped branch was selected
  double clipped_low = 0;          //!< ... ratio < 1 - eps_low and A < 0
  double clipped_high = 0;         //!< ... ratio > 1 + eps_high and A > 0
  double dual_clipped = 0;         //!< ... dual-clip bound selected
  double neg_log_ratio = 0;        //!< sum (old - logp), unclamped: k1 of old vs new
  double neg_log_ratio_clamped = 0;//!< sum (old - clamp(logp - old)): verl's ppo_kl for clamped objectives
  double approx_kl_k3 = 0;         //!< sum (r - 1) - clamp(x): k3 of KL(old || new), tokens drawn from old
  double ratio_sum = 0;
  double ratio_min = std::numeric_limits<double>::infinity();
  double ratio_max = -std::numeric_limits<double>::infinity();
  double kl_sum = 0;               //!< sum of the reference-KL estimate (after clamps / weighting)
  double entropy_sum = 0;
  // Sequence-level objectives (gspo, gmpo): rows (all rows, masked or not) flagged low / high.
  double seq_clipped_low = 0;
  double seq_clipped_high = 0;
  double seq_clipped_region = 0;

  constexpr loss_metrics& merge(const loss_metrics& o) noexcept {
    tokens += o.tokens, sequences += o.sequences, rows += o.rows;
    clipped += o.clipped, clipped_low += o.clipped_low, clipped_high += o.clipped_high;
    dual_clipped += o.dual_clipped;
    neg_log_ratio += o.neg_log_ratio, neg_log_ratio_clamped += o.neg_log_ratio_clamped;
    approx_kl_k3 += o.approx_kl_k3;
    ratio_sum += o.ratio_sum;
    ratio_min = o.ratio_min < ratio_min ? o.ratio_min : ratio_min;
    ratio_max = o.ratio_max > ratio_max ? o.ratio_max : ratio_max;
    kl_sum += o.kl_sum, entropy_sum += o.entropy_sum;
    seq_clipped_low += o.seq_clipped_low, seq_clipped_high += o.seq_clipped_high;
    seq_clipped_region += o.seq_clipped_region;
    return *this;
  }

  //! Masked means (0 without valid tokens, as verl's masked_mean over integer counts).
  [[nodiscard]] constexpr double per_token(double s) const noexcept { return tokens > 0 ? s / tokens : 0.0; }
  [[nodiscard]] constexpr double clip_fraction() const noexcept { return per_token(clipped); }
  [[nodiscard]] constexpr double clip_low_fraction() const noexcept { return per_token(clipped_low); }
  [[nodiscard]] constexpr double clip_high_fraction() const noexcept { return per_token(clipped_high); }
  [[nodiscard]] constexpr double clip_region_fraction() const noexcept { return per_token(clipped_low + clipped_high); }
  [[nodiscard]] constexpr double dual_clip_fraction() const noexcept { return per_token(dual_clipped); }
  [[nodiscard]] constexpr double approx_kl_k1() const noexcept { return per_token(neg_log_ratio); }
  [[nodiscard]] constexpr double approx_kl_k1_clamped() const noexcept { return per_token(neg_log_ratio_clamped); }
  [[nodiscard]] constexpr double approx_kl_k3_mean() const noexcept { return per_token(approx_kl_k3); }
  [[nodiscard]] constexpr double ratio_mean() const noexcept { return per_token(ratio_sum); }
  [[nodiscard]] constexpr double kl_mean() const noexcept { return per_token(kl_sum); }
  [[nodiscard]] constexpr double entropy_mean() const noexcept { return per_token(entropy_sum); }
};

ULORL_NAMESPACE_END
