// ulorl/loss/fields.hpp — the field tables (core/fields.hpp) of the policy loss's configuration
// (policy_loss_config, kl_config, agg_normalizer), result (policy_loss_result) and token-selection
// passes (dppo_config, kl_cov_config, clip_cov_config, token_selection_stats), the records the
// loss operators carry: `float[]` in, one float64 tensor out. The rollout correction's tables are
// beside its structs (rollout_correction/config.hpp, statistics.hpp). A member added to the result
// and not to its table fails a size check at compile time; the configuration's round trip is tested.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/loss/policy_loss_types.hpp"
#include "ulorl/loss/token_selection.hpp"
#include "ulorl/loss/weighted_kl.hpp"

ULORL_NAMESPACE_BEGIN

namespace rollout_correction {

//! f(name, field&) for every field of a rollout correction configuration (core/fields.hpp); a
//! rejection chain is its size and then all `capacity` criteria (the unused ones too), so the table
//! has a fixed length.
template <class C, class F>
  requires ulorl::detail::record_of<C, config>
constexpr void visit_fields(C& c, F&& f) {
  auto& is = c.importance;
  f("importance.level", is.level), f("importance.weighting", is.weighting), f("importance.lower", is.lower);
  f("importance.upper", is.upper), f("importance.log_ratio_clamp", is.log_ratio_clamp);
  f("importance.overflow", is.overflow), f("importance.masked", is.masked), f("importance.empty_rows", is.empty_rows);
  f("importance.batch_normalize", is.batch_normalize);
  auto& rs = c.rejection;
  bounded_count<ulorl::detail::like_const<C, std::size_t>, rejection_chain::capacity> size{rs.chain.size};
  f("rejection.chain.size", size);
  for (auto& k : rs.chain.criteria) {
    f("rejection.chain.statistic", k.statistic), f("rejection.chain.estimator", k.estimator);
    f("rejection.chain.lower", k.lower), f("rejection.chain.upper", k.upper);
  }
  f("rejection.log_ratio_clamp", rs.log_ratio_clamp);
  f("diagnostic_log_ratio_clamp", c.diagnostic_log_ratio_clamp), f("reject_empty_batch", c.reject_empty_batch);
  f("require_effective_sample_size", c.require_effective_sample_size);
}

//! f(name, double&) for every field of statistics (core/fields.hpp), in memory order.
template <class S, class F>
  requires ulorl::detail::record_of<S, statistics>
constexpr void visit_fields(S& s, F&& f) {
  f("rows", s.rows), f("tokens", s.tokens), f("nonempty_rows", s.nonempty_rows);
  f("weight_sum", s.weight_sum), f("capped_weight_sum", s.capped_weight_sum);
  f("capped_weight_sq_sum", s.capped_weight_sq_sum), f("row_mean_weight_sum", s.row_mean_weight_sum);
  f("unit_count", s.unit_count), f("unit_sum", s.unit_sum), f("unit_min", s.unit_min);
  f("unit_max", s.unit_max), f("out_of_bounds_tokens", s.out_of_bounds_tokens);
  f("out_of_bounds_rows", s.out_of_bounds_rows), f("rejected_tokens", s.rejected_tokens);
  f("rejected_rows", s.rejected_rows), f("log_ratio_sum", s.log_ratio_sum);
  f("abs_log_ratio_sum", s.abs_log_ratio_sum), f("abs_log_ratio_max", s.abs_log_ratio_max);
  f("k3_sum", s.k3_sum), f("chi2_token_sum", s.chi2_token_sum), f("chi2_seq_sum", s.chi2_seq_sum);
  f("training_ppl_sum", s.training_ppl_sum), f("training_log_ppl_sum", s.training_log_ppl_sum);
  f("rollout_ppl_sum", s.rollout_ppl_sum), f("rollout_log_ppl_sum", s.rollout_log_ppl_sum);
  f("log_ppl_diff_sum", s.log_ppl_diff_sum), f("log_ppl_abs_diff_sum", s.log_ppl_abs_diff_sum);
  f("ppl_ratio_sum", s.ppl_ratio_sum), f("log_ppl_diff_max", s.log_ppl_diff_max);
  f("log_ppl_diff_min", s.log_ppl_diff_min);
}

}  // namespace rollout_correction

//! f(name, field&) for every field of a KL configuration (the names policy_loss_config's table uses).
template <class C, class F>
  requires ulorl::detail::record_of<C, kl_config>
constexpr void visit_fields(C& c, F&& f) {
  f("kl_estimator", c.estimator), f("kl_straight_through", c.straight_through);
  f("kl_input_clamp", c.input_clamp), f("kl_output_clamp", c.output_clamp);
  f("kl_importance_weighted", c.importance_weighted);
}

//! f(name, field&) for every field of the importance-weighted KL term's configuration
//! (loss/weighted_kl.hpp).
template <class C, class F>
  requires ulorl::detail::record_of<C, weighted_kl_config>
constexpr void visit_fields(C& c, F&& f) {
  f("coef", c.coef), f("estimator", c.estimator), f("input_clamp", c.input_clamp);
  f("output_clamp", c.output_clamp), f("weight", c.weight);
}

//! f(name, field&) for every field of the token-selection passes' configurations and statistics
//! (loss/token_selection.hpp).
template <class C, class F>
  requires ulorl::detail::record_of<C, dppo_config>
constexpr void visit_fields(C& c, F&& f) {
  f("divergence", c.divergence), f("delta_low", c.delta_low), f("delta_high", c.delta_high);
  f("ratio_cap", c.ratio_cap);
}
template <class C, class F>
  requires ulorl::detail::record_of<C, kl_cov_config>
constexpr void visit_fields(C& c, F&& f) { f("fraction", c.fraction); }
template <class C, class F>
  requires ulorl::detail::record_of<C, clip_cov_config>
constexpr void visit_fields(C& c, F&& f) {
  f("eps_low", c.eps_low), f("eps_high", c.eps_high), f("fraction", c.fraction);
  f("cov_lower", c.cov_lower), f("cov_upper", c.cov_upper);
}
template <class S, class F>
  requires ulorl::detail::record_of<S, token_selection_stats>
constexpr void visit_fields(S& s, F&& f) {
  f("dropped_fraction", s.dropped_fraction), f("capped_fraction", s.capped_fraction);
  f("mean_abs_log_ratio", s.mean_abs_log_ratio);
}

//! f(name, field&) for every field of a batch's counts (loss/aggregation.hpp).
template <class C, class F>
  requires ulorl::detail::record_of<C, batch_counts>
constexpr void visit_fields(C& c, F&& f) { f("tokens", c.tokens), f("sequences", c.sequences), f("rows", c.rows); }

//! f(name, field&) for every field of an aggregation normaliser.
template <class C, class F>
  requires ulorl::detail::record_of<C, agg_normalizer>
constexpr void visit_fields(C& c, F&& f) {
  f("agg_mode", c.mode), f("denominator", c.denominator), f("scale", c.scale);
}

//! f(name, field&) for every field of a policy_loss_config, in a fixed order. Fields are double,
//! bool, an enum, std::size_t (a count) or std::optional of a double or of a rollout correction
//! configuration (visited as a whole: f(name, std::optional<rollout_correction::config>&)).
template <class C, class F>
  requires ulorl::detail::record_of<C, policy_loss_config>
constexpr void visit_fields(C& c, F&& f) {
  visit_fields(c.objective, f);
  visit_fields(c.kl, f);
  f("kl_coef", c.kl_coef), f("entropy_coef", c.entropy_coef);
  visit_fields(c.normalizer, f);
  f("check_values", c.check_values);
  f("rollout", c.rollout), f("rollout_batch_norm_factor", c.rollout_batch_norm_factor);
}

//! f(name, field&) for every field of the loss metrics' sums (loss/metrics.hpp).
template <class M, class F>
  requires ulorl::detail::record_of<M, loss_metrics>
constexpr void visit_fields(M& m, F&& f) {
  f("tokens", m.tokens), f("sequences", m.sequences), f("rows", m.rows), f("clipped", m.clipped);
  f("clipped_low", m.clipped_low), f("clipped_high", m.clipped_high), f("dual_clipped", m.dual_clipped);
  f("neg_log_ratio", m.neg_log_ratio), f("neg_log_ratio_clamped", m.neg_log_ratio_clamped);
  f("approx_kl_k3_sum", m.approx_kl_k3), f("ratio_sum", m.ratio_sum), f("ratio_min", m.ratio_min);
  f("ratio_max", m.ratio_max), f("kl_sum", m.kl_sum), f("entropy_sum", m.entropy_sum);
  f("seq_clipped_low", m.seq_clipped_low), f("seq_clipped_high", m.seq_clipped_high);
  f("seq_clipped_region", m.seq_clipped_region);
}

//! f(name, field&) for every field of a policy_loss_result (doubles, and the rollout correction's
//! statistics, visited whole): the loss and its parts, the loss metrics' sums, the statistics
//! ("rollout.*") and nonfinite_grad_rows.
template <class R, class F>
  requires ulorl::detail::record_of<R, policy_loss_result>
constexpr void visit_fields(R& r, F&& f) {
  f("loss", r.loss), f("pg_loss", r.pg_loss), f("kl_loss", r.kl_loss), f("entropy_loss", r.entropy_loss);
  visit_fields(r.metrics, f);
  f("rollout", r.rollout);
  f("nonfinite_grad_rows", r.nonfinite_grad_rows);
}

template <>
inline constexpr std::string_view record_name<policy_loss_config> = "policy_loss_config";
template <>
inline constexpr std::string_view record_name<kl_config> = "kl_config";
template <>
inline constexpr std::string_view record_name<agg_normalizer> = "agg_normalizer";
template <>
inline constexpr std::string_view record_name<batch_counts> = "batch_counts";
template <>
inline constexpr std::string_view record_name<policy_loss_result> = "policy_loss_result";
template <>
inline constexpr std::string_view record_name<rollout_correction::config> = "rollout_correction_config";
template <>
inline constexpr std::string_view record_name<rollout_correction::statistics> = "rollout_correction_statistics";
template <>
inline constexpr std::string_view record_name<weighted_kl_config> = "weighted_kl_config";
template <>
inline constexpr std::string_view record_name<dppo_config> = "dppo_config";
template <>
inline constexpr std::string_view record_name<kl_cov_config> = "kl_cov_config";
template <>
inline constexpr std::string_view record_name<clip_cov_config> = "clip_cov_config";
template <>
inline constexpr std::string_view record_name<token_selection_stats> = "token_selection_stats";

//! Number of doubles of an encoded policy_loss_config.
inline constexpr std::size_t encoded_config_size = encoded_size_of<policy_loss_config>;
//! Number of doubles of an encoded policy_loss_result.
inline constexpr std::size_t encoded_result_size = encoded_size_of<policy_loss_result>;
// policy_loss_result holds doubles only: a member missing from its table changes its size.
static_assert(sizeof(policy_loss_result) == encoded_result_size * sizeof(double),
              "policy_loss_result and its visit_fields differ: add the new member to the table");

//! The result as encoded_result_size doubles, in visit_fields' order (`out` holds that many).
inline void encode_result(const policy_loss_result& r, std::span<double> out) noexcept { encode_fields_into(r, out); }

//! The inverse of encode_result (`in` holds encoded_result_size doubles).
[[nodiscard]] inline policy_loss_result decode_result(std::span<const double> in) {
  return decode_fields<policy_loss_result>("decode_result", "result", in);
}

ULORL_NAMESPACE_END
