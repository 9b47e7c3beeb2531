// ulorl/loss/rollout_correction/compute.hpp — the rollout correction over a ragged batch: per-token
// importance weights, the rejection-sampling keep-mask, and the mismatch diagnostics.
//
//   x = old_log_prob - rollout_log_prob, m the response mask, N = sum m, B rows, n_b = sum_t m.
//   weights[b,t]  the importance weight (config.hpp: level, weighting, bounds), detached
//   mask[b,t]     m[b,t] * prod_criteria keep (rejection sampling; m without criteria)
//   diagnostics   kl = sum (-x) m / N, k3_kl = sum (exp(x) - x - 1) m / N, chi-square of the token /
//                 sequence ratios, training / rollout perplexities of the row-mean log-probs and their
//                 differences (verl rollout_corr_helper), weight min / mean / max (TRL), effective
//                 sample size, out-of-bounds fractions (NeMo-RL), rejected fractions (verl).
//
// The outputs match ulorl::policy_loss's inputs: `weights` is policy_loss_inputs::weights (the
// per-token factor of the objective), `mask` is policy_loss_inputs::mask (rejected tokens leave
// the loss and its normaliser).
//
// Two-phase use (micro-batches, data-parallel ranks): accumulate() per part writes that part's
// weights (not batch-normalised) and mask and returns its `statistics`; sum the statistics over all
// parts (operator+=, or an all-reduce of its fields: sums, plus max / min for the *_max / *_min
// fields); finalize() the sum into `metrics`; normalize_weights() each part's weights by
// metrics.batch_norm_factor. The result is the one-shot apply() on the whole batch: every metric
// and the normaliser are functions of the summed statistics only.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"

ULORL_NAMESPACE_BEGIN
namespace rollout_correction {

//! The inputs: all views share old_log_prob's shape (padded [B, T] or packed with offsets).
template <class T, class M = T>
struct inputs {
  token_view<const T> old_log_prob;      //!< the trainer's log-prob of the sampled token
  token_view<const T> rollout_log_prob;  //!< the inference engine's log-prob of the same token
  token_view<const M> mask{};            //!< 0/1 response mask; empty: every token valid
};

//! The outputs, each of old_log_prob's shape; an empty view is not written.
template <class T, class M = T>
struct outputs {
  token_view<T> weights{};  //!< importance weights at every position (1 at level none)
  //! keep-mask m * keep (0/1). May be the memory of inputs::mask (in place).
  token_view<M> mask{};
};

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
  double k3_sum = 0;             //!< sum (exp(x) - x - 1) m
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

//! The diagnostics of a batch. A mean over no tokens (rows) is 0; importance metrics are 0 at
//! level none. Means over tokens divide by N, means over rows by B (empty rows included).
struct metrics {
  double tokens = 0, rows = 0;
  // importance weights (before batch normalisation)
  double weight_mean = 0;              //!< sum w m / N (verl rollout_is_mean)
  double effective_sample_size = 0;    //!< 1 / (sum z^2 m / N), z = w~ / (sum w~ m / N + 1e-8), w~ = min(w, upper); +inf if every w is 0
  double batch_norm_factor = 1;        //!< mu when batch_normalize and mu > 1e-8, else 1: the divisor of the weights
  double unit_weight_mean = 0, unit_weight_min = 0, unit_weight_max = 0;  //!< over the weight units (TRL importance_sampling_ratio_*)
  double out_of_bounds_token_fraction = 0;  //!< out_of_bounds_tokens / N
  double out_of_bounds_row_fraction = 0;    //!< out_of_bounds_rows / B
  // rejection sampling
  double rejected_token_fraction = 0;  //!< verl rollout_rs_masked_fraction
  double rejected_row_fraction = 0;    //!< verl rollout_rs_seq_masked_fraction
  // diagnostics
  double kl = 0;     //!< sum (rollout - old) m / N
  double k3_kl = 0;  //!< sum (exp(x) - x - 1) m / N (no clamp; exp saturates near 8e307)
  double chi2_token = 0, chi2_seq = 0;
  double training_ppl = 0, training_log_ppl = 0, rollout_ppl = 0, rollout_log_ppl = 0;
  double log_ppl_diff = 0, log_ppl_abs_diff = 0, log_ppl_diff_max = 0, log_ppl_diff_min = 0, ppl_ratio = 0;
  double abs_log_ratio_mean = 0, abs_log_ratio_max = 0;  //!< of |x| over valid tokens (TRL sampling_logp_difference_*)
  statistics totals{};  //!< the statistics these metrics were computed from
};

namespace detail_rc {

[[nodiscard]] inline double per(double num, double den) noexcept { return den > 0 ? num / den : 0.0; }

[[nodiscard]] constexpr kl_estimator kl_estimator_of(rs_estimator e) noexcept {
  return e == rs_estimator::k1 ? kl_estimator::k1 : e == rs_estimator::k2 ? kl_estimator::k2 : kl_estimator::k3;
}

//! rho = exp(clamp(L)), then the overflow rule.
[[nodiscard]] inline double ratio(double log_ratio, const importance_sampling_config& c) noexcept {
  const double rho = std::exp(clamp(log_ratio, -c.log_ratio_clamp, c.log_ratio_clamp));
  return (c.overflow == ratio_overflow::zero && rho == std::numeric_limits<double>::infinity()) ? 0.0 : rho;
}
//! The weight of a ratio that a mask or gate drops: 0, or rho * 0 (NaN for an overflowed rho).
[[nodiscard]] inline double dropped(double rho, const importance_sampling_config& c) noexcept {
  return c.overflow == ratio_overflow::nan_when_masked ? rho * 0.0 : 0.0;
}
[[nodiscard]] inline bool inside(double rho, const importance_sampling_config& c) noexcept {
  return c.lower <= rho && rho <= c.upper;
}
//! truncate / mask (geometric_gate applies its row gate to the raw ratio instead).
[[nodiscard]] inline double weigh(double rho, const importance_sampling_config& c) noexcept {
  if (c.weighting == is_weighting::truncate) return std::min(std::max(rho, c.lower), c.upper);
  if (c.weighting == is_weighting::mask) return inside(rho, c) ? rho : dropped(rho, c);
  return rho;
}

//! A criterion with its estimator's parameters and its kept range in the statistic's units.
struct criterion_plan {
  rejection_criterion criterion;
  kl_params<double> estimator;
  double lo, hi;
  [[nodiscard]] bool keeps(double stat) const noexcept { return lo <= stat && stat <= hi; }
  //! The estimate at one token (kl.hpp with ref = old, logp = rollout: u = clamp(x)).
  [[nodiscard]] double value(double old_lp, double rollout_lp) const noexcept {
    return kl_term(rollout_lp, old_lp, estimator).value;
  }
};
struct chain_plan {
  std::array<criterion_plan, rejection_chain::capacity> items{};
  std::size_t size = 0;
};
[[nodiscard]] inline chain_plan plan_chain(const rejection_config& r) {
  chain_plan p;
  for (const auto& c : r.chain) {
    const bool k1 = c.estimator == rs_estimator::k1;
    p.items[p.size++] = {c, make_kl_params<double>({.estimator = kl_estimator_of(c.estimator), .input_clamp = r.log_ratio_clamp}),
                         k1 ? std::log(c.lower) : -std::numeric_limits<double>::infinity(),
                         k1 ? std::log(c.upper) : c.upper};
  }
  return p;
}

//! The values of the inputs: finite log-probs, a finite difference at every token and a finite
//! sum of the differences in every row.
template <class T, class M>
void validate_values(std::string_view fn, const inputs<T, M>& in) {
  require_all_finite(fn, "old_log_prob", in.old_log_prob);
  require_all_finite(fn, "rollout_log_prob", in.rollout_log_prob);
  for (std::size_t b = 0; b < in.old_log_prob.rows(); ++b) {
    const auto o = in.old_log_prob.row(b), r = in.rollout_log_prob.row(b);
    double sum = 0;
    for (std::size_t t = 0; t < o.size(); ++t) {
      const double x = static_cast<double>(o[t]) - static_cast<double>(r[t]);
      if (!std::isfinite(x))
        detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(in.rollout_log_prob.flat_index(b, t)), r[t],
                        "old_log_prob - rollout_log_prob overflows");
      if (in.mask.empty() || in.mask(b, t) != M(0)) sum += x;
    }
    if (!std::isfinite(sum))
      detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(in.rollout_log_prob.flat_index(b, 0)), sum,
                      "the row's sum of old_log_prob - rollout_log_prob overflows (row " + std::to_string(b) + ")");
  }
}

template <class T, class M>
void validate_call(std::string_view fn, const inputs<T, M>& in, const config& c, const outputs<T, M>& out) {
  validate(fn, c);
  validate_layout(fn, "old_log_prob", in.old_log_prob);
  require_same_shape(fn, "rollout_log_prob", in.rollout_log_prob, "old_log_prob", in.old_log_prob);
  if (!in.mask.empty()) {
    require_same_shape(fn, "mask", in.mask, "old_log_prob", in.old_log_prob);
    require_binary_mask(fn, "mask", in.mask);
  }
  if (!out.weights.empty()) require_same_shape(fn, "outputs.weights", out.weights, "old_log_prob", in.old_log_prob);
  if (!out.mask.empty()) require_same_shape(fn, "outputs.mask", out.mask, "old_log_prob", in.old_log_prob);
  validate_values(fn, in);
}

//! The largest weight `is` can give (+inf: unbounded), and whether a dropped weight can be NaN
//! (ratio_overflow::nan_when_masked with a ratio that can overflow).
struct weight_bound {
  double max;
  bool nan_possible;
};
[[nodiscard]] inline weight_bound bound_of(const importance_sampling_config& is) noexcept {
  if (is.level == is_level::none) return {1.0, false};
  const double e = std::exp(is.log_ratio_clamp);  // +inf for an unbounded clamp
  // ratio_overflow::zero maps an overflowed ratio to 0: the others are finite doubles.
  const double rho_max = is.overflow == ratio_overflow::zero && !std::isfinite(e) ? std::numeric_limits<double>::max() : e;
  const bool can_overflow = !std::isfinite(rho_max);
  if (is.weighting == is_weighting::truncate) return {std::min(is.upper, std::max(rho_max, is.lower)), false};
  const bool nan = is.overflow == ratio_overflow::nan_when_masked && can_overflow;
  if (is.weighting == is_weighting::mask) return {std::min(is.upper, rho_max), nan};
  return {rho_max, nan};  // geometric_gate passes the raw ratio
}

template <class T>
[[nodiscard]] bool representable(double w) noexcept {
  return std::isfinite(static_cast<double>(static_cast<T>(w)));
}

//! Row b of the pass over the batch: its statistics into `st` (a fresh statistics per row: the
//! batch's are the rows' folded in row order, the same bits for every way the rows are split).
//! With Diag, the diagnostics (k3, chi-square, perplexities); with Write, the row's weights
//! (divided by `divisor`) into `w` and its keep-mask into `m` (either may be empty: not written).
//! Throws on a weight that is not finite in T (before anything is written when a pass without
//! Write ran first). Returns the largest weight of any position of the row.
template <bool Diag, bool Write, class T, class M>
double scan_row(std::string_view fn, const inputs<T, M>& in, const config& c, const chain_plan& chain, std::size_t b,
                double divisor, statistics& st, vector_view<T> w_out, vector_view<M> m_out) {
  const auto& is = c.importance;
  const bool has_is = is.level != is_level::none;
  const double dc = c.diagnostic_log_ratio_clamp;
  const auto k3_plain = make_kl_params<double>({.estimator = kl_estimator::k3});
  std::array<double, rejection_chain::capacity> acc{};
  double weight_max = 0;
  auto reject_weight = [&](std::size_t t, double w) {
    detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(in.rollout_log_prob.flat_index(b, t)),
                    t < in.rollout_log_prob.row_size(b) ? static_cast<double>(in.rollout_log_prob(b, t)) : 0.0,
                    "the importance weight (" + std::to_string(w) +
                        ") is not finite in the element type: exp(old_log_prob - rollout_log_prob) overflows and the "
                        "configuration neither bounds, clamps nor zeroes it");
  };
  const auto o = in.old_log_prob.row(b), r = in.rollout_log_prob.row(b);
  const std::size_t len = o.size();
  auto valid = [&](std::size_t t) { return in.mask.empty() || in.mask(b, t) != M(0); };
  // Row sums, diagnostics and the sequence criteria's statistics.
  double n = 0, sx = 0, so = 0, sr = 0;
  for (std::size_t i = 0; i < chain.size; ++i)
    acc[i] = chain.items[i].criterion.statistic == rs_statistic::sequence_max ? -std::numeric_limits<double>::infinity() : 0.0;
  for (std::size_t t = 0; t < len; ++t) {
    if (!valid(t)) continue;
    const double ol = static_cast<double>(o[t]), rl = static_cast<double>(r[t]), x = ol - rl;
    n += 1, sx += x;
    if constexpr (Diag) {
      so += ol, sr += rl;
      st.abs_log_ratio_sum += std::fabs(x);
      st.abs_log_ratio_max = std::max(st.abs_log_ratio_max, std::fabs(x));
      st.k3_sum += kl_term(rl, ol, k3_plain).value;
      st.chi2_token_sum += std::exp(2 * clamp(x, -dc, dc));
    }
    for (std::size_t i = 0; i < chain.size; ++i) {
      const auto s = chain.items[i].criterion.statistic;
      if (s == rs_statistic::token) continue;
      const double v = chain.items[i].value(ol, rl);
      acc[i] = s == rs_statistic::sequence_max ? std::max(acc[i], v) : acc[i] + v;
    }
  }
  st.rows += 1, st.tokens += n, st.nonempty_rows += n > 0 ? 1 : 0, st.log_ratio_sum += sx;
  if constexpr (Diag) {
    st.chi2_seq_sum += std::exp(2 * clamp(sx, -dc, dc));
    const double mo = n > 0 ? so / n : 0.0, mr = n > 0 ? sr / n : 0.0, delta = mr - mo;
    st.training_ppl_sum += std::exp(-mo), st.training_log_ppl_sum += -mo;
    st.rollout_ppl_sum += std::exp(-mr), st.rollout_log_ppl_sum += -mr;
    st.log_ppl_diff_sum += delta, st.log_ppl_abs_diff_sum += std::fabs(delta), st.ppl_ratio_sum += std::exp(delta);
    st.log_ppl_diff_max = std::max(st.log_ppl_diff_max, delta), st.log_ppl_diff_min = std::min(st.log_ppl_diff_min, delta);
  }
  bool seq_keep = true;
  for (std::size_t i = 0; i < chain.size; ++i) {
    const auto s = chain.items[i].criterion.statistic;
    if (s == rs_statistic::token) continue;
    const double stat = s == rs_statistic::sequence_sum ? acc[i] : n > 0 ? (s == rs_statistic::sequence_mean ? acc[i] / n : acc[i]) : 0.0;
    seq_keep = seq_keep && chain.items[i].keeps(stat);
  }
  // The row's ratio (sequence level) or gate (geometric_gate).
  double row_weight = 1;
  bool gate = true;
  if (has_is && is.level == is_level::sequence) {
    const double rho = ratio(sx, is);
    row_weight = weigh(rho, is);
    if (!representable<T>(row_weight)) reject_weight(0, row_weight);
    const bool oob = !inside(rho, is);
    st.out_of_bounds_rows += oob ? 1 : 0, st.out_of_bounds_tokens += oob ? n : 0;
    st.unit_count += 1, st.unit_sum += row_weight;
    st.unit_min = std::min(st.unit_min, row_weight), st.unit_max = std::max(st.unit_max, row_weight);
  } else if (has_is && is.weighting == is_weighting::geometric_gate) {
    gate = n > 0 ? inside(std::exp(sx / n), is) : is.empty_rows == empty_row_gate::ratio_one && inside(1.0, is);
    st.out_of_bounds_rows += gate ? 0 : 1, st.out_of_bounds_tokens += gate ? 0 : n;
  }
  // Weights and keep-mask.
  double row_weight_sum = 0;
  bool row_rejected = false;
  for (std::size_t t = 0; t < len; ++t) {
    const bool v = valid(t);
    const double ol = static_cast<double>(o[t]), rl = static_cast<double>(r[t]);
    double w = 1;
    if (has_is) {
      if (!v && is.masked == masked_positions::zero) {
        w = 0;
      } else if (is.level == is_level::sequence) {
        w = row_weight;
      } else {
        const double rho = ratio(!v && is.masked == masked_positions::neutral ? 0.0 : ol - rl, is);
        if (is.weighting == is_weighting::geometric_gate) {
          w = gate ? rho : dropped(rho, is);
        } else {
          w = weigh(rho, is);
          if (v) st.out_of_bounds_tokens += inside(rho, is) ? 0 : 1;
        }
        if (!representable<T>(w)) reject_weight(t, w);
        if (v) {
          st.unit_count += 1, st.unit_sum += w;
          st.unit_min = std::min(st.unit_min, w), st.unit_max = std::max(st.unit_max, w);
        }
      }
      if (v) {
        const double wc = std::min(w, is.upper);
        st.weight_sum += w, st.capped_weight_sum += wc, st.capped_weight_sq_sum += wc * wc;
        row_weight_sum += w;
      }
      weight_max = std::max(weight_max, w);
    }
    bool keep = seq_keep;
    if (v)
      for (std::size_t i = 0; i < chain.size && keep; ++i)
        if (chain.items[i].criterion.statistic == rs_statistic::token) keep = chain.items[i].keeps(chain.items[i].value(ol, rl));
    if (v && !keep) st.rejected_tokens += 1, row_rejected = true;
    if constexpr (Write) {
      if (!w_out.empty()) w_out[t] = static_cast<T>(w / divisor);
      if (!m_out.empty()) m_out[t] = v && keep ? M(1) : M(0);
    }
  }
  st.rejected_rows += row_rejected ? 1 : 0;
  if (has_is && n > 0) st.row_mean_weight_sum += row_weight_sum / n;
  return weight_max;
}

//! Every row (scan_row), the rows' statistics folded in row order into `st`.
template <bool Diag, bool Write, class T, class M>
double scan(std::string_view fn, const inputs<T, M>& in, const config& c, const outputs<T, M>& out, double divisor,
            statistics& st) {
  const chain_plan chain = plan_chain(c.rejection);
  double weight_max = 0;
  for (std::size_t b = 0; b < in.old_log_prob.rows(); ++b) {
    statistics row;
    const double m = scan_row<Diag, Write>(fn, in, c, chain, b, divisor, row, out.weights.empty() ? vector_view<T>() : out.weights.row(b),
                                           out.mask.empty() ? vector_view<M>() : out.mask.row(b));
    st += row;
    weight_max = std::max(weight_max, m);
  }
  return weight_max;
}

inline metrics finalize_in(std::string_view fn, const statistics& s, const config& c) {
  validate(fn, c);
  if (c.reject_empty_batch && !(s.tokens > 0)) detail::fail(fn, "mask", "no valid token in the batch");
  metrics m;
  m.totals = s, m.tokens = s.tokens, m.rows = s.rows;
  const auto& is = c.importance;
  if (is.level != is_level::none) {
    m.weight_mean = per(s.weight_sum, s.tokens);
    if (s.tokens > 0) {
      if (s.capped_weight_sq_sum > 0) {
        // 1 / (sum z^2 m / N) with z = w~ / (mean w~ + 1e-8), the epsilon of verl's metric.
        const double d = s.capped_weight_sum / s.tokens + 1e-8;
        m.effective_sample_size = d * d * s.tokens / s.capped_weight_sq_sum;
      } else {
        if (c.require_effective_sample_size)
          detail::fail(fn, "weights", "every importance weight is 0: the effective sample size 1 / 0 is undefined");
        m.effective_sample_size = std::numeric_limits<double>::infinity();
      }
    }
    if (s.unit_count > 0)
      m.unit_weight_mean = s.unit_sum / s.unit_count, m.unit_weight_min = s.unit_min, m.unit_weight_max = s.unit_max;
    m.out_of_bounds_token_fraction = per(s.out_of_bounds_tokens, s.tokens);
    m.out_of_bounds_row_fraction = per(s.out_of_bounds_rows, s.rows);
    if (is.batch_normalize) {
      const double mu = is.level == is_level::token ? per(s.weight_sum, s.tokens)
                                                    : s.row_mean_weight_sum / std::max(s.nonempty_rows, 1e-8);
      if (mu > 1e-8) m.batch_norm_factor = mu;
    }
  }
  m.rejected_token_fraction = per(s.rejected_tokens, s.tokens);
  m.rejected_row_fraction = per(s.rejected_rows, s.rows);
  m.kl = per(-s.log_ratio_sum, s.tokens);
  m.k3_kl = per(s.k3_sum, s.tokens);
  m.chi2_token = s.tokens > 0 ? s.chi2_token_sum / s.tokens - 1 : 0.0;
  m.chi2_seq = s.rows > 0 ? s.chi2_seq_sum / s.rows - 1 : 0.0;
  m.training_ppl = per(s.training_ppl_sum, s.rows), m.training_log_ppl = per(s.training_log_ppl_sum, s.rows);
  m.rollout_ppl = per(s.rollout_ppl_sum, s.rows), m.rollout_log_ppl = per(s.rollout_log_ppl_sum, s.rows);
  m.log_ppl_diff = per(s.log_ppl_diff_sum, s.rows), m.log_ppl_abs_diff = per(s.log_ppl_abs_diff_sum, s.rows);
  m.ppl_ratio = per(s.ppl_ratio_sum, s.rows);
  if (s.rows > 0) m.log_ppl_diff_max = s.log_ppl_diff_max, m.log_ppl_diff_min = s.log_ppl_diff_min;
  m.abs_log_ratio_mean = per(s.abs_log_ratio_sum, s.tokens), m.abs_log_ratio_max = s.abs_log_ratio_max;
  return m;
}

}  // namespace detail_rc

//! Phase 1 of the two-phase use: validates everything, then writes this part's weights (not
//! batch-normalised) and keep-mask and returns its statistics. Nothing is written on error.
template <class T, class M>
[[nodiscard]] statistics accumulate(const inputs<T, M>& in, const config& c, const outputs<T, M>& out) {
  constexpr std::string_view fn = "rollout_correction::accumulate";
  detail_rc::validate_call(fn, in, c, out);
  statistics st, again;
  (void)detail_rc::scan<true, false>(fn, in, c, out, 1.0, st);
  if (!out.weights.empty() || !out.mask.empty()) (void)detail_rc::scan<false, true>(fn, in, c, out, 1.0, again);
  return st;
}

//! Phase 2: the metrics of summed statistics (and the batch-normalisation divisor). Throws for an
//! empty batch (config::reject_empty_batch) or all-zero weights (config::require_effective_sample_size).
[[nodiscard]] inline metrics finalize(const statistics& total, const config& c) {
  return detail_rc::finalize_in("rollout_correction::finalize", total, c);
}

//! Phase 3: divides every weight of a part by m.batch_norm_factor (nothing to do when it is 1).
//! Throws, writing nothing, if a divided weight would not be finite in T.
template <class T>
void normalize_weights(token_view<T> weights, const metrics& m) {
  constexpr std::string_view fn = "rollout_correction::normalize_weights";
  validate_layout(fn, "weights", weights);
  const double f = m.batch_norm_factor;
  if (!(f > 0) || !std::isfinite(f)) detail::fail_value(fn, "batch_norm_factor", f, "must be finite and > 0");
  if (f == 1) return;
  for (std::size_t b = 0; b < weights.rows(); ++b) {
    const auto w = weights.row(b);
    for (std::size_t t = 0; t < w.size(); ++t)
      if (!detail_rc::representable<std::remove_cv_t<T>>(static_cast<double>(w[t]) / f))
        detail::fail_at(fn, "weights", static_cast<std::int64_t>(weights.flat_index(b, t)), w[t], "weight / batch_norm_factor overflows");
  }
  for (std::size_t b = 0; b < weights.rows(); ++b) {
    const auto w = weights.row(b);
    for (std::size_t t = 0; t < w.size(); ++t) w[t] = static_cast<std::remove_cv_t<T>>(static_cast<double>(w[t]) / f);
  }
}

//! The whole batch in one call: weights (batch-normalised when configured), keep-mask and metrics.
//! Validates everything and computes the metrics before writing: nothing is written on error.
template <class T, class M>
metrics apply(const inputs<T, M>& in, const config& c, const outputs<T, M>& out) {
  constexpr std::string_view fn = "rollout_correction::apply";
  detail_rc::validate_call(fn, in, c, out);
  statistics st, again;
  const double weight_max = detail_rc::scan<true, false>(fn, in, c, out, 1.0, st);
  const metrics m = detail_rc::finalize_in(fn, st, c);
  if (!detail_rc::representable<T>(weight_max / m.batch_norm_factor))
    detail::fail_value(fn, "batch_norm_factor", m.batch_norm_factor, "the largest weight divided by it overflows");
  if (!out.weights.empty() || !out.mask.empty()) (void)detail_rc::scan<false, true>(fn, in, c, out, m.batch_norm_factor, again);
  return m;
}

}  // namespace rollout_correction
ULORL_NAMESPACE_END
