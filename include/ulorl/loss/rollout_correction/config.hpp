// ulorl/loss/rollout_correction/config.hpp — the typed configuration of the rollout correction
// (ulorl/loss/rollout_correction.hpp): importance-sampling level and weighting, rejection-sampling
// criteria and their chain, batch normalisation, and the few framework behaviours that differ
// (value at masked positions, exp overflow, empty rows). One `*_from_name` parser per enum reads
// config files; validate() rejects every inconsistent setting with ulorl::error naming the field.
//
// With x = old_log_prob - rollout_log_prob (the trainer's and the inference engine's log-prob of the
// sampled token), the importance ratio is rho = exp(clamp(L, -c, c)), L = x (token level) or
// L_b = sum_t x m (sequence level), and the weight is
//   truncate (TIS):        w = min(max(rho, lower), upper)
//   mask (IcePop / MIS):   w = rho if lower <= rho <= upper else 0
//   geometric_gate (seq-mask-tis, token level): w = rho_t if lower <= exp(mean_t x m) <= upper else 0
// Rejection sampling keeps a token iff every criterion of the chain keeps it (verl rollout_rs).
// docs/rollout_correction.md compares each formula with verl, TRL, OpenRLHF and NeMo-RL.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN
namespace rollout_correction {

//! An absent bound.
inline constexpr double unbounded = std::numeric_limits<double>::infinity();

//! Granularity of the importance ratio.
enum class is_level {
  none,      //!< no importance weights (weights are 1)
  token,     //!< rho_t = exp(x_t)
  sequence,  //!< rho_b = exp(sum_t x m), on every token of the row
};
//! How the ratio becomes a weight.
enum class is_weighting {
  truncate,        //!< TIS: clamp(rho, lower, upper)
  mask,            //!< IcePop / MIS: rho inside [lower, upper], else 0
  geometric_gate,  //!< seq-mask-tis: the raw token ratio if the row's geometric-mean ratio is inside [lower, upper], else 0
};
//! The weight written at masked positions (the loss ignores them; the frameworks differ).
enum class masked_positions {
  zero,      //!< 0 (verl)
  neutral,   //!< token level: the weight of a log-ratio of 0; sequence level: the row's weight (TRL)
  as_valid,  //!< computed from that position's own log-ratio like a valid one; sequence level: the row's weight (OpenRLHF, NeMo-RL)
};
//! What an overflowing ratio exp(L) = +inf becomes (only without a log-ratio clamp).
enum class ratio_overflow {
  infinity,         //!< +inf: truncation to a finite upper bound gives the bound, masking gives 0 (TRL)
  zero,             //!< 0 before the weighting (NeMo-RL's nan_to_num)
  nan_when_masked,  //!< masking multiplies by the keep flag: inf * 0 is NaN, so an overflowing ratio is rejected unless truncated (OpenRLHF)
};
//! geometric_gate: the gate of a row without valid tokens.
enum class empty_row_gate {
  drop,       //!< never kept (OpenRLHF: 0 / 0)
  ratio_one,  //!< its geometric-mean ratio is 1 (NeMo-RL)
};
//! Rejection sampling: the statistic a criterion thresholds.
enum class rs_statistic {
  token,          //!< the token's own value
  sequence_sum,   //!< sum over the row's valid tokens
  sequence_mean,  //!< mean over the row's valid tokens (0 for an empty row)
  sequence_max,   //!< max over the row's valid tokens (0 for an empty row); k2 / k3 only
};
//! Rejection sampling: the divergence estimate of one token, with x^ = clamp(x, -c, c) (kl.hpp's
//! estimators with u = x^): k1 = -x^, k2 = x^2 / 2, k3 = exp(x^) - 1 - x^.
enum class rs_estimator { k1, k2, k3 };

namespace detail {
template <class E, std::size_t N>
[[nodiscard]] E from_name(std::string_view fn, std::string_view argument, std::string_view name,
                          const std::array<std::pair<std::string_view, E>, N>& table) {
  return value_of_name(fn, argument, name, table);
}
}  // namespace detail

//! "none", "token", "sequence".
[[nodiscard]] inline is_level is_level_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<is_level, 3>(
      "rollout_correction::is_level_from_name", argument, name,
      {{{"none", is_level::none}, {"token", is_level::token}, {"sequence", is_level::sequence}}});
}
//! "truncate" / "tis", "mask" / "icepop", "geometric_gate" / "seq-mask-tis" (OpenRLHF's and
//! NeMo-RL's names are accepted).
[[nodiscard]] inline is_weighting is_weighting_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<is_weighting, 6>(
      "rollout_correction::is_weighting_from_name", argument, name,
      {{{"truncate", is_weighting::truncate}, {"tis", is_weighting::truncate}, {"mask", is_weighting::mask},
        {"icepop", is_weighting::mask}, {"geometric_gate", is_weighting::geometric_gate},
        {"seq-mask-tis", is_weighting::geometric_gate}}});
}
//! "zero", "neutral", "as_valid".
[[nodiscard]] inline masked_positions masked_positions_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<masked_positions, 3>(
      "rollout_correction::masked_positions_from_name", argument, name,
      {{{"zero", masked_positions::zero}, {"neutral", masked_positions::neutral}, {"as_valid", masked_positions::as_valid}}});
}
//! "infinity", "zero", "nan_when_masked".
[[nodiscard]] inline ratio_overflow ratio_overflow_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<ratio_overflow, 3>(
      "rollout_correction::ratio_overflow_from_name", argument, name,
      {{{"infinity", ratio_overflow::infinity}, {"zero", ratio_overflow::zero},
        {"nan_when_masked", ratio_overflow::nan_when_masked}}});
}
//! "drop", "ratio_one".
[[nodiscard]] inline empty_row_gate empty_row_gate_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<empty_row_gate, 2>("rollout_correction::empty_row_gate_from_name", argument, name,
                                                 {{{"drop", empty_row_gate::drop}, {"ratio_one", empty_row_gate::ratio_one}}});
}
//! "token", "seq_sum", "seq_mean", "seq_max" (verl's prefixes of its rollout_rs options).
[[nodiscard]] inline rs_statistic rs_statistic_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<rs_statistic, 4>(
      "rollout_correction::rs_statistic_from_name", argument, name,
      {{{"token", rs_statistic::token}, {"seq_sum", rs_statistic::sequence_sum}, {"seq_mean", rs_statistic::sequence_mean},
        {"seq_max", rs_statistic::sequence_max}}});
}
//! "k1", "k2", "k3".
[[nodiscard]] inline rs_estimator rs_estimator_from_name(std::string_view name, std::string_view argument = "name") {
  return detail::from_name<rs_estimator, 3>("rollout_correction::rs_estimator_from_name", argument, name,
                                               {{{"k1", rs_estimator::k1}, {"k2", rs_estimator::k2}, {"k3", rs_estimator::k3}}});
}

//! Importance-sampling weights. The defaults are verl's token-level TIS with threshold 2.
struct importance_sampling_config {
  is_level level = is_level::token;
  is_weighting weighting = is_weighting::truncate;
  double lower = 0.0;             //!< lower bound (>= 0; 0: none, ratios are >= 0)
  double upper = 2.0;             //!< upper bound (> 0; `unbounded`: none)
  double log_ratio_clamp = 20.0;  //!< L clamped to [-c, c] before exp (> 0; `unbounded`: none). Sequence level: after the sum
  ratio_overflow overflow = ratio_overflow::infinity;
  masked_positions masked = masked_positions::zero;
  empty_row_gate empty_rows = empty_row_gate::drop;  //!< geometric_gate only
  //! Divide every weight by the batch's mean weight mu (token level: sum w m / N; sequence level:
  //! the mean over non-empty rows of the row means), when mu > 1e-8. Partition-exact through
  //! accumulate() + finalize() + normalize_weights(). No effect at level none.
  bool batch_normalize = false;
};

//! One rejection criterion: its statistic of its estimator, and the kept range.
//! k1 (a log-ratio): kept iff log(lower) <= stat <= log(upper), with 0 < lower <= upper finite.
//! k2, k3 (>= 0): kept iff stat <= upper, upper > 0 finite; lower must be 0.
struct rejection_criterion {
  rs_statistic statistic = rs_statistic::token;
  rs_estimator estimator = rs_estimator::k2;
  double lower = 0.0;
  double upper = unbounded;
  friend constexpr bool operator==(const rejection_criterion& a, const rejection_criterion& b) noexcept {
    return a.statistic == b.statistic && a.estimator == b.estimator && a.lower == b.lower && a.upper == b.upper;
  }
  friend constexpr bool operator!=(const rejection_criterion& a, const rejection_criterion& b) noexcept { return !(a == b); }
};

//! The criteria of a rejection chain (at most one per statistic and estimator): a token is kept
//! iff every criterion keeps it. Fixed capacity, no allocation.
struct rejection_chain {
  static constexpr std::size_t capacity = 12;
  std::array<rejection_criterion, capacity> criteria{};
  std::size_t size = 0;

  [[nodiscard]] constexpr bool empty() const noexcept { return size == 0; }
  [[nodiscard]] constexpr const rejection_criterion* begin() const noexcept { return criteria.data(); }
  [[nodiscard]] constexpr const rejection_criterion* end() const noexcept { return criteria.data() + size; }
  //! Appends a criterion; throws ulorl::error when the chain is full.
  constexpr void push_back(const rejection_criterion& c) {
    if (size == capacity) ulorl::detail::fail_value("rollout_correction::rejection_chain::push_back", "size", size, "the chain is full");
    criteria[size++] = c;
  }
};

struct rejection_config {
  rejection_chain chain{};        //!< empty: no rejection sampling (the keep-mask is the mask)
  double log_ratio_clamp = 20.0;  //!< c of x^ = clamp(x, -c, c) in the estimators (> 0; `unbounded`: none)
};

//! The whole rollout correction.
struct config {
  importance_sampling_config importance{};
  rejection_config rejection{};
  //! c of the chi-square diagnostics: chi2_token = mean exp(2 clamp(x, -c, c)) - 1, chi2_seq likewise on row sums.
  double diagnostic_log_ratio_clamp = 20.0;
  //! Reject a batch without any valid token (verl, OpenRLHF raise; the others report zeros).
  bool reject_empty_batch = false;
  //! With importance weights, reject a batch whose weights are all 0: its effective sample size is
  //! 1 / 0 (verl raises). Without it, the metric is +inf.
  bool require_effective_sample_size = false;
};

namespace detail {
inline void require_clamp(std::string_view fn, std::string_view arg, double c) {
  if (!(c > 0)) ulorl::detail::fail_value(fn, arg, c, "must be > 0 (unbounded: no clamp)");
}
}  // namespace detail

//! Throws ulorl::error naming the field (as "importance.upper", "rejection.chain.upper"[i], ...) for
//! an unknown enum value or an inconsistent setting.
inline void validate(std::string_view fn, const config& c) {
  const auto& is = c.importance;
  require_known(fn, "importance.level", is.level, is_level::none, is_level::token, is_level::sequence);
  require_known(fn, "importance.weighting", is.weighting, is_weighting::truncate, is_weighting::mask, is_weighting::geometric_gate);
  require_known(fn, "importance.overflow", is.overflow, ratio_overflow::infinity, ratio_overflow::zero, ratio_overflow::nan_when_masked);
  require_known(fn, "importance.masked", is.masked, masked_positions::zero, masked_positions::neutral, masked_positions::as_valid);
  require_known(fn, "importance.empty_rows", is.empty_rows, empty_row_gate::drop, empty_row_gate::ratio_one);
  require_non_negative(fn, "importance.lower", is.lower);
  if (!(is.upper > 0)) ulorl::detail::fail_value(fn, "importance.upper", is.upper, "must be > 0 (unbounded: no upper bound)");
  if (!(is.lower <= is.upper)) ulorl::detail::fail_value(fn, "importance.lower", is.lower, "must be <= importance.upper");
  detail::require_clamp(fn, "importance.log_ratio_clamp", is.log_ratio_clamp);
  if (is.level == is_level::sequence && is.weighting == is_weighting::geometric_gate)
    ulorl::detail::fail(fn, "importance.weighting", "geometric_gate weighs token ratios: it needs importance.level token");
  detail::require_clamp(fn, "rejection.log_ratio_clamp", c.rejection.log_ratio_clamp);
  detail::require_clamp(fn, "diagnostic_log_ratio_clamp", c.diagnostic_log_ratio_clamp);
  const auto& chain = c.rejection.chain;
  if (chain.size > rejection_chain::capacity)
    ulorl::detail::fail_value(fn, "rejection.chain.size", chain.size, "exceeds the capacity " + std::to_string(rejection_chain::capacity));
  for (std::size_t i = 0; i < chain.size; ++i) {
    const auto& r = chain.criteria[i];
    const auto at = static_cast<std::int64_t>(i);
    require_known_at(fn, "rejection.chain.statistic", at, r.statistic, rs_statistic::token, rs_statistic::sequence_sum,
                     rs_statistic::sequence_mean, rs_statistic::sequence_max);
    require_known_at(fn, "rejection.chain.estimator", at, r.estimator, rs_estimator::k1, rs_estimator::k2, rs_estimator::k3);
    if (r.estimator == rs_estimator::k1) {
      if (r.statistic == rs_statistic::sequence_max)
        ulorl::detail::fail_at(fn, "rejection.chain.estimator", at, "k1", "sequence_max takes k2 or k3 (k1 is signed)");
      if (!(r.lower > 0) || !std::isfinite(r.lower))
        ulorl::detail::fail_at(fn, "rejection.chain.lower", at, r.lower, "k1 needs a finite lower ratio bound > 0");
      if (!std::isfinite(r.upper)) ulorl::detail::fail_at(fn, "rejection.chain.upper", at, r.upper, "must be finite");
      if (!(r.lower <= r.upper)) ulorl::detail::fail_at(fn, "rejection.chain.lower", at, r.lower, "must be <= upper");
    } else {
      if (!(r.upper > 0) || !std::isfinite(r.upper))
        ulorl::detail::fail_at(fn, "rejection.chain.upper", at, r.upper, "must be finite and > 0");
      if (r.lower != 0) ulorl::detail::fail_at(fn, "rejection.chain.lower", at, r.lower, "k2 / k3 take an upper bound only (lower must be 0)");
    }
    for (std::size_t j = 0; j < i; ++j)
      if (chain.criteria[j].statistic == r.statistic && chain.criteria[j].estimator == r.estimator)
        ulorl::detail::fail_at(fn, "rejection.chain", at, static_cast<long long>(j), "repeats the criterion at this index");
  }
}

}  // namespace rollout_correction
ULORL_NAMESPACE_END
