// ulorl/loss/fields.hpp — the field tables of the policy loss's configuration and result, and
// their flat encoding as arrays of doubles (the form an operator schema carries: `float[]` in,
// one float64 tensor out).
//   visit_config_fields(cfg, f)   f(name, field&) for every scalar field of a policy_loss_config
//   visit_result_fields(res, f)   f(name, double&) for every number of a policy_loss_result
//   encode_config / decode_config, encode_result / decode_result
// Each table is the only list of its struct's fields outside the struct: the encodings, the
// operators' schemas and the Python surface are derived from them. A member added to the result
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
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN

namespace detail {
template <class S, class T>
using like_const = std::conditional_t<std::is_const_v<S>, const T, T>;
template <class S, class T>
concept config_of = std::is_same_v<std::remove_const_t<S>, T>;
}  // namespace detail

//! f(name, field&) for every field of a rollout correction configuration; a rejection chain is its
//! size and then all `capacity` criteria (the unused ones too), so the table has a fixed length.
template <class C, class F>
  requires detail::config_of<C, rollout_correction::config>
constexpr void visit_config_fields(C& c, F&& f) {
  auto& is = c.importance;
  f("importance.level", is.level), f("importance.weighting", is.weighting), f("importance.lower", is.lower);
  f("importance.upper", is.upper), f("importance.log_ratio_clamp", is.log_ratio_clamp);
  f("importance.overflow", is.overflow), f("importance.masked", is.masked), f("importance.empty_rows", is.empty_rows);
  f("importance.batch_normalize", is.batch_normalize);
  auto& rs = c.rejection;
  f("rejection.chain.size", rs.chain.size);
  for (auto& k : rs.chain.criteria) {
    f("rejection.chain.statistic", k.statistic), f("rejection.chain.estimator", k.estimator);
    f("rejection.chain.lower", k.lower), f("rejection.chain.upper", k.upper);
  }
  f("rejection.log_ratio_clamp", rs.log_ratio_clamp);
  f("diagnostic_log_ratio_clamp", c.diagnostic_log_ratio_clamp), f("reject_empty_batch", c.reject_empty_batch);
  f("require_effective_sample_size", c.require_effective_sample_size);
}

//! f(name, field&) for every field of a KL configuration (the names policy_loss_config's table uses).
template <class C, class F>
  requires detail::config_of<C, kl_config>
constexpr void visit_config_fields(C& c, F&& f) {
  f("kl_estimator", c.estimator), f("kl_straight_through", c.straight_through);
  f("kl_input_clamp", c.input_clamp), f("kl_output_clamp", c.output_clamp);
  f("kl_importance_weighted", c.importance_weighted);
}

//! f(name, field&) for every field of an aggregation normaliser.
template <class C, class F>
  requires detail::config_of<C, agg_normalizer>
constexpr void visit_config_fields(C& c, F&& f) {
  f("agg_mode", c.mode), f("denominator", c.denominator), f("scale", c.scale);
}

//! f(name, field&) for every field of a policy_loss_config, in a fixed order. Fields are double,
//! bool, an enum, std::size_t (a count) or std::optional of a double or of a rollout correction
//! configuration (visited as a whole: f(name, std::optional<rollout_correction::config>&)).
template <class C, class F>
  requires detail::config_of<C, policy_loss_config>
constexpr void visit_config_fields(C& c, F&& f) {
  auto& o = c.objective;
  f("objective", o.kind), f("eps_low", o.eps_low), f("eps_high", o.eps_high), f("dual_clip", o.dual_clip);
  f("delta", o.delta), f("log_ratio_clamp", o.log_ratio_clamp), f("seq_log_ratio_max", o.seq_log_ratio_max);
  f("seq_gradient", o.seq_gradient), f("tau_pos", o.tau_pos), f("tau_neg", o.tau_neg), f("surrogate", o.surrogate);
  f("abs_penalty", o.abs_penalty), f("square_penalty", o.square_penalty);
  visit_config_fields(c.kl, f);
  f("kl_coef", c.kl_coef), f("entropy_coef", c.entropy_coef);
  visit_config_fields(c.normalizer, f);
  f("check_values", c.check_values);
  f("rollout", c.rollout), f("rollout_batch_norm_factor", c.rollout_batch_norm_factor);
}

//! f(name, double&) for every number of a policy_loss_result: the loss and its parts, the loss
//! metrics' sums, the rollout correction's statistics ("rollout.*") and nonfinite_grad_rows.
template <class R, class F>
  requires detail::config_of<R, policy_loss_result>
constexpr void visit_result_fields(R& r, F&& f) {
  f("loss", r.loss), f("pg_loss", r.pg_loss), f("kl_loss", r.kl_loss), f("entropy_loss", r.entropy_loss);
  auto& m = r.metrics;
  f("tokens", m.tokens), f("sequences", m.sequences), f("rows", m.rows), f("clipped", m.clipped);
  f("clipped_low", m.clipped_low), f("clipped_high", m.clipped_high), f("dual_clipped", m.dual_clipped);
  f("neg_log_ratio", m.neg_log_ratio), f("neg_log_ratio_clamped", m.neg_log_ratio_clamped);
  f("approx_kl_k3_sum", m.approx_kl_k3), f("ratio_sum", m.ratio_sum), f("ratio_min", m.ratio_min);
  f("ratio_max", m.ratio_max), f("kl_sum", m.kl_sum), f("entropy_sum", m.entropy_sum);
  f("seq_clipped_low", m.seq_clipped_low), f("seq_clipped_high", m.seq_clipped_high);
  f("seq_clipped_region", m.seq_clipped_region);
  auto& s = r.rollout;
  f("rollout.rows", s.rows), f("rollout.tokens", s.tokens), f("rollout.nonempty_rows", s.nonempty_rows);
  f("rollout.weight_sum", s.weight_sum), f("rollout.capped_weight_sum", s.capped_weight_sum);
  f("rollout.capped_weight_sq_sum", s.capped_weight_sq_sum), f("rollout.row_mean_weight_sum", s.row_mean_weight_sum);
  f("rollout.unit_count", s.unit_count), f("rollout.unit_sum", s.unit_sum), f("rollout.unit_min", s.unit_min);
  f("rollout.unit_max", s.unit_max), f("rollout.out_of_bounds_tokens", s.out_of_bounds_tokens);
  f("rollout.out_of_bounds_rows", s.out_of_bounds_rows), f("rollout.rejected_tokens", s.rejected_tokens);
  f("rollout.rejected_rows", s.rejected_rows), f("rollout.log_ratio_sum", s.log_ratio_sum);
  f("rollout.abs_log_ratio_sum", s.abs_log_ratio_sum), f("rollout.abs_log_ratio_max", s.abs_log_ratio_max);
  f("rollout.k3_sum", s.k3_sum), f("rollout.chi2_token_sum", s.chi2_token_sum), f("rollout.chi2_seq_sum", s.chi2_seq_sum);
  f("rollout.training_ppl_sum", s.training_ppl_sum), f("rollout.training_log_ppl_sum", s.training_log_ppl_sum);
  f("rollout.rollout_ppl_sum", s.rollout_ppl_sum), f("rollout.rollout_log_ppl_sum", s.rollout_log_ppl_sum);
  f("rollout.log_ppl_diff_sum", s.log_ppl_diff_sum), f("rollout.log_ppl_abs_diff_sum", s.log_ppl_abs_diff_sum);
  f("rollout.ppl_ratio_sum", s.ppl_ratio_sum), f("rollout.log_ppl_diff_max", s.log_ppl_diff_max);
  f("rollout.log_ppl_diff_min", s.log_ppl_diff_min);
  f("nonfinite_grad_rows", r.nonfinite_grad_rows);
}

namespace detail {

//! The configuration's type name, for errors.
template <class C>
constexpr std::string_view config_name() {
  if constexpr (std::is_same_v<C, policy_loss_config>) return "policy_loss_config";
  else if constexpr (std::is_same_v<C, kl_config>) return "kl_config";
  else {
    static_assert(std::is_same_v<C, agg_normalizer>);
    return "agg_normalizer";
  }
}

//! Number of doubles a field takes in the flat encoding.
template <class X>
constexpr std::size_t encoded_width() {
  if constexpr (std::is_same_v<X, std::optional<rollout_correction::config>>) {
    std::size_t n = 1;  // present?
    rollout_correction::config c{};
    visit_config_fields(c, [&](std::string_view, auto& x) { n += encoded_width<std::remove_cvref_t<decltype(x)>>(); });
    return n;
  } else if constexpr (std::is_same_v<X, std::optional<double>>) {
    return 2;  // present?, value
  } else {
    return 1;
  }
}

template <class C>
constexpr std::size_t encoded_size() {
  std::size_t n = 0;
  C c{};
  if constexpr (std::is_same_v<C, policy_loss_result>)
    visit_result_fields(c, [&](std::string_view, double&) { ++n; });
  else
    visit_config_fields(c, [&](std::string_view, auto& x) { n += encoded_width<std::remove_cvref_t<decltype(x)>>(); });
  return n;
}

template <class X>
void encode_field(std::vector<double>& out, const X& x) {
  if constexpr (std::is_same_v<X, std::optional<rollout_correction::config>>) {
    out.push_back(x ? 1.0 : 0.0);
    const rollout_correction::config c = x.value_or(rollout_correction::config{});
    visit_config_fields(c, [&](std::string_view, const auto& y) { encode_field(out, y); });
  } else if constexpr (std::is_same_v<X, std::optional<double>>) {
    out.push_back(x ? 1.0 : 0.0);
    out.push_back(x.value_or(0.0));
  } else if constexpr (std::is_enum_v<X>) {
    out.push_back(static_cast<double>(static_cast<std::int64_t>(x)));
  } else {
    out.push_back(static_cast<double>(x));
  }
}

//! Reads field `prefix` + `name` from `in` at `pos` (advancing it): an enum is an integer value (the
//! configuration's validation then rejects the values no name has), a count an integer within its
//! capacity, a bool 0 or 1. The field's full name is formed only for an error.
template <class X>
void decode_field(std::string_view fn, std::string_view arg, std::string_view prefix, std::string_view name,
                  std::span<const double> in, std::size_t& pos, X& x) {
  const auto next = [&] { return in[pos++]; };
  const auto integer = [&](double v, double hi) {
    if (!(v >= 0 && v <= hi && v == std::floor(v)))
      fail_value(fn, arg, v,
                 "field '" + std::string(prefix) + std::string(name) + "' (index " + std::to_string(pos - 1) +
                     ") must be an integer in [0, " + std::to_string(static_cast<std::int64_t>(hi)) + "]");
    return static_cast<std::int64_t>(v);
  };
  if constexpr (std::is_same_v<X, std::optional<rollout_correction::config>>) {
    const bool present = integer(next(), 1) != 0;
    rollout_correction::config c{};
    visit_config_fields(c, [&](std::string_view sub, auto& y) { decode_field(fn, arg, "rollout.", sub, in, pos, y); });
    x = present ? std::optional(c) : std::nullopt;
  } else if constexpr (std::is_same_v<X, std::optional<double>>) {
    const bool present = integer(next(), 1) != 0;
    const double v = next();
    x = present ? std::optional(v) : std::nullopt;
  } else if constexpr (std::is_same_v<X, bool>) {
    x = integer(next(), 1) != 0;
  } else if constexpr (std::is_enum_v<X>) {
    x = static_cast<X>(integer(next(), 1 << 30));
  } else if constexpr (std::is_same_v<X, std::size_t>) {  // the only count: a rejection chain's size
    x = static_cast<std::size_t>(integer(next(), static_cast<double>(rollout_correction::rejection_chain::capacity)));
  } else {
    static_assert(std::is_same_v<X, double>);
    x = next();
  }
}

}  // namespace detail

//! Number of doubles of encode_config's array of a policy_loss_config.
inline constexpr std::size_t encoded_config_size = detail::encoded_size<policy_loss_config>();
//! Number of doubles of encode_result's array.
inline constexpr std::size_t encoded_result_size = detail::encoded_size<policy_loss_result>();
// policy_loss_result holds doubles only: a member missing from visit_result_fields changes its size.
static_assert(sizeof(policy_loss_result) == encoded_result_size * sizeof(double),
              "policy_loss_result and visit_result_fields differ: add the new member to the table");

//! The names visit_config_fields (S = policy_loss_config) or visit_result_fields (S =
//! policy_loss_result) gives, in order.
template <class S>
[[nodiscard]] std::vector<std::string> field_names() {
  std::vector<std::string> names;
  S s{};
  const auto add = [&](std::string_view name, auto&) { names.emplace_back(name); };
  if constexpr (std::is_same_v<S, policy_loss_result>) visit_result_fields(s, add);
  else visit_config_fields(s, add);
  return names;
}

//! Number of doubles of encode_config's array for a configuration C (policy_loss_config, kl_config,
//! agg_normalizer).
template <class C>
inline constexpr std::size_t encoded_size_of = detail::encoded_size<C>();

//! The configuration as encoded_size_of<C> doubles, in visit_config_fields' order: numbers as they
//! are, enums as their values, bools 0 / 1, an optional as 0 / 1 and then its value's fields.
template <class C>
[[nodiscard]] std::vector<double> encode_config(const C& cfg) {
  std::vector<double> out;
  out.reserve(encoded_size_of<C>);
  visit_config_fields(cfg, [&](std::string_view, const auto& x) { detail::encode_field(out, x); });
  return out;
}

//! The inverse of encode_config; a wrong length, a bool other than 0 / 1 or a non-integral enum or
//! count throws ulorl::error naming `fn`, `arg`, the field and its index. Values are not otherwise
//! checked here: the function given the configuration validates it.
template <class C = policy_loss_config>
[[nodiscard]] C decode_config(std::string_view fn, std::string_view arg, std::span<const double> in) {
  if (in.size() != encoded_size_of<C>)
    detail::fail(fn, arg,
                 "has " + std::to_string(in.size()) + " values but an encoded " + std::string(detail::config_name<C>()) +
                     " has " +
                     std::to_string(encoded_size_of<C>) + " (encode_config)");
  C cfg;
  std::size_t pos = 0;
  visit_config_fields(cfg, [&](std::string_view name, auto& x) { detail::decode_field(fn, arg, "", name, in, pos, x); });
  return cfg;
}

//! The result as encoded_result_size doubles, in visit_result_fields' order.
inline void encode_result(const policy_loss_result& r, std::span<double> out) noexcept {
  std::size_t i = 0;
  visit_result_fields(r, [&](std::string_view, const double& x) { out[i++] = x; });
}

//! The inverse of encode_result (`in` holds encoded_result_size doubles).
[[nodiscard]] inline policy_loss_result decode_result(std::span<const double> in) noexcept {
  policy_loss_result r;
  std::size_t i = 0;
  visit_result_fields(r, [&](std::string_view, double& x) { x = in[i++]; });
  return r;
}

ULORL_NAMESPACE_END
