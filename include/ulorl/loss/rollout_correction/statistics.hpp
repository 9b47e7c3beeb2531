// ulorl/loss/rollout_correction/statistics.hpp — the rollout correction's sums over a batch
// (rollout_correction::apply and the policy loss's in-pass correction return them; finalize() in
// compute.hpp turns them into metrics). C++17, so that policy_loss_types.hpp stays includable by
// the CUDA kernels.
#pragma once

#include <algorithm>
#include <limits>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN
namespace rollout_correction {

//! Sums over a batch (or a part of one) from which finalize() computes every metric. Partition
//! rule: add the fields, except `*_max` (max) and `*_min` (min); operator+= does exactly that.
struct statistics {
  double rows = 0;           //!< B
  double tokens = 0;         //!< N
  double nonempty_rows = 0;  //!< rows with a valid token
  // importance weights (before batch normalisation)
  double weight_sum = 0;            //!< sum w m
  double capped_weight_sum = 0;     //!< sum min(w, upper) m
  double capped_weight_sq_sum = 0;  //!< sum min(w, upper)^2 m
  double row_mean_weight_sum = 0;   //!< sum over non-empty rows of (sum_t w m / n_b)
  //! The weight units: valid tokens (token level) or every row (sequence level).
  double unit_count = 0, unit_sum = 0;
  double unit_min = std::numeric_limits<double>::infinity(), unit_max = -std::numeric_limits<double>::infinity();
  double out_of_bounds_tokens = 0;  //!< valid tokens whose ratio (or row gate / row ratio) is outside [lower, upper]
  double out_of_bounds_rows = 0;    //!< rows whose sequence ratio or gate is outside [lower, upper] (empty rows included)
  // rejection sampling
  double rejected_tokens = 0;  //!< sum (1 - keep) m
  double rejected_rows = 0;    //!< rows with a rejected valid token
  // diagnostics
  double log_ratio_sum = 0;      //!< sum x m
  double abs_log_ratio_sum = 0;  //!< sum |x| m
  double abs_log_ratio_max = 0;  //!< max |x| over valid tokens (0 if none)
  //! sum (exp(x) - x - 1) m, times 2^-64: a term can be ~8e307 (exp saturates), and three of them
  //! would overflow an unscaled sum (finalize scales the mean back).
  double k3_sum = 0;
  double chi2_token_sum = 0;     //!< sum exp(2 x^) m
  double chi2_seq_sum = 0;       //!< sum over rows of exp(2 clamp(sum_t x m))
  double training_ppl_sum = 0, training_log_ppl_sum = 0;  //!< sum over rows of exp(-mu_o), -mu_o
  double rollout_ppl_sum = 0, rollout_log_ppl_sum = 0;    //!< sum over rows of exp(-mu_r), -mu_r
  double log_ppl_diff_sum = 0, log_ppl_abs_diff_sum = 0, ppl_ratio_sum = 0;  //!< sums of delta, |delta|, exp(delta)
  double log_ppl_diff_max = -std::numeric_limits<double>::infinity();
  double log_ppl_diff_min = std::numeric_limits<double>::infinity();

  statistics& operator+=(const statistics& o) noexcept {
    rows += o.rows, tokens += o.tokens, nonempty_rows += o.nonempty_rows;
    weight_sum += o.weight_sum, capped_weight_sum += o.capped_weight_sum, capped_weight_sq_sum += o.capped_weight_sq_sum;
    row_mean_weight_sum += o.row_mean_weight_sum;
    unit_count += o.unit_count, unit_sum += o.unit_sum;
    unit_min = std::min(unit_min, o.unit_min), unit_max = std::max(unit_max, o.unit_max);
    out_of_bounds_tokens += o.out_of_bounds_tokens, out_of_bounds_rows += o.out_of_bounds_rows;
    rejected_tokens += o.rejected_tokens, rejected_rows += o.rejected_rows;
    log_ratio_sum += o.log_ratio_sum, abs_log_ratio_sum += o.abs_log_ratio_sum;
    abs_log_ratio_max = std::max(abs_log_ratio_max, o.abs_log_ratio_max);
    k3_sum += o.k3_sum, chi2_token_sum += o.chi2_token_sum, chi2_seq_sum += o.chi2_seq_sum;
    training_ppl_sum += o.training_ppl_sum, training_log_ppl_sum += o.training_log_ppl_sum;
    rollout_ppl_sum += o.rollout_ppl_sum, rollout_log_ppl_sum += o.rollout_log_ppl_sum;
    log_ppl_diff_sum += o.log_ppl_diff_sum, log_ppl_abs_diff_sum += o.log_ppl_abs_diff_sum, ppl_ratio_sum += o.ppl_ratio_sum;
    log_ppl_diff_max = std::max(log_ppl_diff_max, o.log_ppl_diff_max);
    log_ppl_diff_min = std::min(log_ppl_diff_min, o.log_ppl_diff_min);
    return *this;
  }
  friend statistics operator+(statistics a, const statistics& b) noexcept { return a += b; }
};

}  // namespace rollout_correction
ULORL_NAMESPACE_END
